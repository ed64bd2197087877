"""Preflight: ask every host of the selected trials what it has, read-only, and refuse what it
cannot run faithfully. The checks are the rows of checks.CHECKS: reachability over SSH (with
what to check when it fails), interfaces with their addresses, each end's route to the other
out of its experiment interface through the rack's next hop, a FreeBSD router's kernel tick
(kern.hz), link speed, congestion controls and their module parameters, tools, SIFTR, queue
disciplines, the RIO implementation asked for (trials/preflight/rio.py), rates beyond what the
rack carries, packets/s beyond what its edge markers carry, free disk for the captures the
trials will write (on the hosts and under the results directory), and the clock offset between
hosts whose captures are compared (one declared clock domain). This module gives the names
other modules use."""

from trials.preflight.checks import CHECKS, freebsd_qdisc_problems
from trials.preflight.disk import capture_bytes
from trials.preflight.facts import (
    QDISC_MODULES,
    STATIC_FACTS,
    available,
    host_facts,
    kernel_modules,
    qdiscs_available,
    runs_freebsd,
)
from trials.preflight.reach import reachability
from trials.preflight.run import preflight

__all__ = [
    "CHECKS",
    "QDISC_MODULES",
    "STATIC_FACTS",
    "available",
    "capture_bytes",
    "freebsd_qdisc_problems",
    "host_facts",
    "kernel_modules",
    "preflight",
    "qdiscs_available",
    "reachability",
    "runs_freebsd",
]
