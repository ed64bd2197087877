"""Detached processes on rack hosts (servers, senders, captures), started and stopped through
one helper: each has a pid file and a log in its host's trial directory."""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass

from core.rack import Rack, RackError


@dataclass
class Daemons:
    rack: Rack
    remote: dict[str, str]  # host -> remote trial directory

    def _path(self, host: str, name: str, suffix: str) -> str:
        return shlex.quote(f"{self.remote[host]}/{name}.{suffix}")

    def spawn(self, host: str, name: str, command: str, start_at: float | None = None) -> None:
        """Start `command` detached in the host's trial directory; with `start_at`, it first
        sleeps until that absolute time (one clock on the virtual rack; NTP/PTP-disciplined
        clocks on a physical one)."""
        wait = ""
        if start_at is not None:
            wait = f"python3 -c 'import time; time.sleep(max(0, {start_at!r} - time.time()))'; "
        d = shlex.quote(self.remote[host])
        # Only the detached process may be backgrounded: anything else holding the SSH
        # channel's stdout would keep this call waiting.
        self.rack.run(
            host,
            f"cd {d} || exit 1; setsid sh -c {shlex.quote(wait + 'exec ' + command)} "
            f"> {name}.log 2>&1 < /dev/null & echo $! > {d}/{name}.pid",
        )

    def running(self, host: str, name: str) -> bool:
        pidfile = self._path(host, name, "pid")
        answer = self.rack.run(
            host, f"kill -0 $(cat {pidfile}) 2>/dev/null && echo yes || echo no", check=False
        )
        return answer.strip() == "yes"

    def wait_for_log(self, host: str, name: str, text: str, timeout_s: float = 5.0) -> None:
        """Wait until the daemon's log contains `text` (e.g. tcpdump's 'listening on')."""
        log = self._path(host, name, "log")
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.rack.run(host, f"grep -qF {shlex.quote(text)} {log} && echo yes", check=False):
                return
            if not self.running(host, name):
                break
            time.sleep(0.05)
        out = self.rack.run(host, f"tail -5 {log}", check=False).strip()
        raise RackError(f"{host}: {name} did not start ({text!r} not in its log): {out}")

    def stop(self, host: str, name: str, sig: str = "TERM") -> None:
        """Signal the daemon, wait up to 5 s for it to end, then kill it."""
        pidfile = self._path(host, name, "pid")
        self.rack.run(
            host,
            f"if [ -s {pidfile} ]; then pid=$(cat {pidfile}); "
            f"kill -{sig} $pid 2>/dev/null; for i in $(seq 50); do "
            f"kill -0 $pid 2>/dev/null || break; sleep 0.1; done; "
            f"kill -KILL $pid 2>/dev/null; rm -f {pidfile}; fi; true",
            check=False,
        )
