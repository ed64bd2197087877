"""A batch followed from the controller while its workers run it: each event as it comes, a
progress bar with the time left, Ctrl-C or SIGTERM passed on to the workers, and what a
worker that failed said last."""

from __future__ import annotations

import signal as sig
import time

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
from rich.progress import Progress as Bar

from trials.batch import Batch
from trials.batch_worker import progress

__all__ = ["watch"]


def watch(
    batch: Batch,
    workers: list,
    total: int,
    retries: int,
    out: Console,
    overhead: int,
    err: Console,
) -> int:
    """Follow events.jsonl until every worker has ended (progress on ``out``, each worker's
    error and its log's last lines on ``err``); Ctrl-C or SIGTERM stops the workers cleanly
    (they restore the network). Returns 0, or the first worker's error code. ``overhead``:
    seconds per trial beyond its traffic, for the ETA until trials have ended."""

    seen = sum(1 for _ in batch.events())
    durations: list[float] = []
    estimate = {t["name"]: t["duration_s"] + overhead for t in batch.meta["trials"]}

    def stop_workers(signum, _frame):
        for _, proc in workers:
            if proc.poll() is None:
                proc.send_signal(sig.SIGTERM)

    previous = {s: sig.signal(s, stop_workers) for s in (sig.SIGINT, sig.SIGTERM)}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    bar = Bar(*columns, TextColumn("{task.fields[eta]}"), console=out, disable=not out.is_terminal)
    try:
        with bar:
            task = bar.add_task("batch", total=total, eta="")
            while True:
                events = list(batch.events())
                for e in events[seen:]:
                    if e.get("event") == "done" and e.get("seconds"):
                        durations.append(e["seconds"])
                    line = f"{e['time']} {e.get('rack', '')}: {e['event']} {e.get('trial', '')}"
                    if e.get("error"):
                        line += f" ({e['error'][:300]})"
                    bar.console.print(escape(line), highlight=False)
                seen = len(events)
                p = progress(batch, retries)
                left = [n for n in estimate if not batch.done(n)]
                per = (sum(durations) / len(durations)) if durations else None
                eta_s = sum(per or estimate[n] for n in left) / max(1, len(workers))
                running = ", ".join(f"{r}: {n}" for r, n in p.running.items()) or "-"
                bar.update(
                    task,
                    completed=p.done + p.failed,
                    description=f"running {running}",
                    eta=f"ETA ~{eta_s / 60:.0f} min" if left else "",
                )
                if all(proc.poll() is not None for _, proc in workers):
                    break
                time.sleep(1.0)
    finally:
        for s, h in previous.items():
            sig.signal(s, h)
    codes = [proc.returncode for _, proc in workers]
    for (label, _), c in zip(workers, codes, strict=True):
        if c:
            log = batch.layout.worker_log(label)
            tail = log.read_text().strip().splitlines()[-5:] if log.exists() else []
            err.print(f"[red]worker {label} exited {c}[/]; {log}:")
            for line in tail:
                err.print(escape(line), highlight=False)
    return next((c for c in codes if c), 0)
