"""`trialbed validate-htcp` (make validate-htcp): H-TCP's two implementations, the kernel's
tcp_htcp module and hostside/bpf_cc's BPF one, run as one batch of experiments/htcp_validation.yml
(its factor hosts.all.cc_implementation: module, bpf; N repetitions of each), then compared
(analysis/implementations.py): the table, and exit 1 when a metric disagrees. A rack whose
kernel lacks the module is refused before anything runs. The command is trials/validation.py's
(validate-rio's too); here are the names its tests read."""

from __future__ import annotations

import argparse

from trials import validation

VALIDATION = validation.VALIDATIONS["validate-htcp"]
EXPERIMENT = VALIDATION.experiment
DEFAULT_REPETITIONS = validation.DEFAULT_REPETITIONS


def this_kernel_has_htcp() -> bool:
    """Whether this machine's kernel has its own H-TCP (the namespace rack shares it)."""
    return validation.this_kernel_has(VALIDATION.module)


def refusal(args: argparse.Namespace) -> str | None:
    """Why this rack cannot compare the two (None: it may; a lab rack's preflight decides)."""
    return validation.refusal(VALIDATION, args)
