"""The ipfw samples' two readers give the same table: all lines at once (pyarrow's JSON reader
and regular expressions over every line of ipfw's texts) and a line at a time (Python's re,
the reader of a file the first does not take). The texts are written with dummynet.c's
formats (tests/analysis/test_ipfw_samples.py, tests/unit/test_rio_freebsd.py)."""

import json
import random

import pandas as pd
import pytest

from analysis import ipfw_samples
from analysis.ipfw_samples import read_ipfw_samples
from analysis.tc_samples import whole_lines
from tests.analysis.test_ipfw_samples import pipe_block
from tests.unit.test_rio_freebsd import queue_show

RIO = {"pipe": 10002, "in": 10002, "out": 10004}


def counters(rng: random.Random) -> tuple:
    return tuple(rng.randint(0, 10**12) for _ in range(5))


def sample(rng: random.Random, k: int) -> dict:
    """One sampler line: pipes (some listed twice, some not asked for, masks of several
    flows, none yet), and for some lines rio links' queues (one sometimes not listed yet, a
    pipe's block after them)."""
    devs = rng.choice([{"10001": "em1", "10002": "em2"}, {"10001": "em1"}, {}])
    listed = rng.sample([10001, 10002, 10003, 10001], rng.randint(0, 4))
    text = "".join(
        pipe_block(nr, rng.randint(0, 99), [counters(rng) for _ in range(rng.randint(0, 3))])
        for nr in listed
    )
    line = {"ts_ns": 10**18 + k * 10**7, "spread_ns": rng.randint(0, 10**6), "devs": devs}
    line["text"] = text
    if rng.random() < 0.5:
        queues = queue_show(10002, 10004, 10002, counters(rng), rng.choice([(), counters(rng)]))
        if rng.random() < 0.2:
            queues = queues.split("q10004")[0]
        if rng.random() < 0.2:
            queues += pipe_block(10009, 5, [counters(rng)])
        rio = rng.choice([{"em2": RIO}, {"em3": {**RIO, "pipe": 10003}, "em2": RIO}])
        line |= {"rio": rio, "queue_text": queues}
    return line


@pytest.mark.parametrize("seed", range(12))
def test_both_readers_give_the_same_table(tmp_path, seed):
    rng = random.Random(seed)
    lines = [json.dumps(sample(rng, k)) for k in range(rng.randint(0, 40))]
    ending = rng.choice(["", '{"end": true, "samples": 9}\n', '{"ts_ns": 5'])
    path = tmp_path / "ipfw_samples.jsonl"
    path.write_text("".join(f"{x}\n" for x in lines) + ending)
    at_once = ipfw_samples._at_once(whole_lines(path))
    assert at_once is not None  # every line as the sampler writes it: read at once
    expected = ipfw_samples._line_by_line(path)
    pd.testing.assert_frame_equal(at_once, expected, check_exact=True)


def test_a_damaged_line_is_skipped_as_before(tmp_path):
    """A line that is not JSON (the disk full mid-trial): the file is read line by line, that
    line skipped, the others' rows as the file without it gives them at once."""
    rng = random.Random(7)
    lines = [json.dumps(sample(rng, k)) for k in range(8)]
    damaged, clean = tmp_path / "damaged.jsonl", tmp_path / "clean.jsonl"
    damaged.write_text("\n".join([*lines[:3], lines[3][:40], *lines[4:]]) + "\n")
    clean.write_text("\n".join([*lines[:3], *lines[4:]]) + "\n")
    assert ipfw_samples._at_once(whole_lines(damaged)) is None
    assert ipfw_samples._at_once(whole_lines(clean)) is not None
    pd.testing.assert_frame_equal(read_ipfw_samples(damaged), read_ipfw_samples(clean))
