"""`make test`'s pytest run: the VM rack's tests beside all the others, as two pytest
processes, so that the VM's emulated CPU (one core, mostly waited on) and the namespace
racks (under half a core on average, measured: 29 CPU-minutes in a 62-minute sequential
run) share the machine instead of taking turns. The racks do not meet: the VM rack has its
own prefix (tv-), management subnet and kernel. The VM part's output is printed when both
are done; the exit status fails if either failed.

Ctrl-C reaches both (they are in the terminal's process group), and each takes its own
racks down before it ends; this script waits for both."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
VM_TESTS = "tests/e2e/test_vm_rack.py"


def main(args: list[str]) -> int:
    pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    with tempfile.NamedTemporaryFile("w+", prefix="trialbed-vm-tests-", suffix=".log") as log:
        start = time.monotonic()
        vm = subprocess.Popen([*pytest, VM_TESTS, *args], cwd=PROJECT, stdout=log, stderr=log)
        rest = subprocess.Popen([*pytest, "--ignore", VM_TESTS, *args], cwd=PROJECT)
        # Ctrl-C: the children get it too; wait for their cleanup instead of leaving early.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        rest_rc = rest.wait()
        vm_rc = vm.wait()
        log.seek(0)
        print(f"\n===== {VM_TESTS}, run beside the others =====", flush=True)
        print(log.read(), flush=True)
        took = time.monotonic() - start
        print(f"pytest: others exit {rest_rc}, VM rack exit {vm_rc}; {took / 60:.1f} min in all")
    return 0 if rest_rc == vm_rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
