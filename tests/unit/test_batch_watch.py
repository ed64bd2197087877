"""The controller's view of a running batch (trials/batch_watch.py): each event a worker writes
is printed as it comes, and the workers' exit codes decide the batch's."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from core.layout import BATCH_META, BatchDir
from trials.batch import Batch
from trials.batch_watch import watch

# A worker as the controller sees it: a process that writes events.jsonl, then exits.
WORKER = """
import json, sys, time
time.sleep(0.3)
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"time": "T", "event": "start", "trial": "t1", "rack": "A"}) + "\\n")
time.sleep(1.2)
sys.exit(int(sys.argv[2]))
"""


def batch_of_one(tmp_path: Path) -> Batch:
    path = tmp_path / "batch"
    (path / "trials").mkdir(parents=True)
    meta = {"trials": [{"name": "t1", "id": "x", "duration_s": 6}]}
    (path / BATCH_META).write_text(json.dumps(meta))
    return Batch(path)


def follow(tmp_path: Path, code: int) -> tuple[int, str, str]:
    batch = batch_of_one(tmp_path)
    events = str(BatchDir(batch.path).events)
    proc = subprocess.Popen([sys.executable, "-c", WORKER, events, str(code)])
    out, err = io.StringIO(), io.StringIO()
    consoles = [Console(file=f, width=200, force_terminal=False) for f in (out, err)]
    done = watch(batch, [("A", proc)], 1, 1, consoles[0], 10, consoles[1])
    return done, out.getvalue(), err.getvalue()


def test_each_event_is_printed_as_it_comes(tmp_path):
    done, out, err = follow(tmp_path, 0)
    assert done == 0
    assert "T A: start t1" in out + err


def test_a_worker_that_failed_is_named_with_its_code(tmp_path):
    done, _, err = follow(tmp_path, 3)
    assert done == 3
    assert "worker A exited 3" in err
