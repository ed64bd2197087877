"""Signals during a run of trials: SIGINT and SIGTERM become one clean stop; cleanup is not
cut short by a second one."""

from __future__ import annotations

import signal
from contextlib import contextmanager


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived; the runner cleans up and records the trial as interrupted.

    A BaseException, as KeyboardInterrupt is: the handler raises it wherever the main thread
    is, often inside an SSH call whose ``except Exception`` would turn it into a host error
    (a Ctrl-C during the watch's check read as "C stopped answering (SIGINT)", failing the
    trial instead of interrupting it)."""


@contextmanager
def interruptible():
    """Turn SIGTERM into the same clean stop as Ctrl-C."""

    def handler(signum, _frame):
        raise Interrupted(signal.Signals(signum).name)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextmanager
def ignore_signals():
    """Cleanup must not be cut short by a second Ctrl-C."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
