"""Detached processes on rack hosts (servers, senders, captures, the delay line), started,
signalled and stopped through the one helper every rack host has (`trialbed-daemon`, linked
into <trialbed_dir>/bin by the remote_daemons role, which ships it in hostside/daemon/): each
has NAME.pid and NAME.log in its host's trial directory, unless a call names another directory."""

from __future__ import annotations

import json
from dataclasses import dataclass

from core.command import Command, built, command
from core.rack import Rack, RackError

# How long a daemon may take to say it is ready (the wait ends as soon as it does): a Python
# server, tcpdump or the tcp_probe recorder took over 5 s (the helper's own default) on the
# VM rack under TCG with a loaded 2-core host, which failed the trial.
READY_TIMEOUT_S = 30.0


@dataclass
class Daemons:
    rack: Rack
    remote: dict[str, str]  # host -> remote trial directory

    def _helper(
        self,
        host: str,
        action: str,
        name: str,
        *args: str,
        directory: str | None = None,
        program: Command | None = None,
    ) -> Command:
        """The helper's `action` on daemon `name`; with `program`, the command it runs."""
        helper = f"{self.rack.host(host).workdir}/bin/trialbed-daemon"
        where = directory or self.remote[host]
        words = [helper, action, name, *args, "--dir", where]
        if program is not None:
            words += ["--", "sh", "-c", built(program).exec_text()]
        return command(*words)

    def spawn(
        self,
        host: str,
        name: str,
        program: Command,
        start_at: float | None = None,
        ready: str | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
    ) -> None:
        """Start the command `program` detached in the host's trial directory; with
        `start_at`, it first sleeps until that absolute time (one clock on the virtual rack;
        NTP/PTP-disciplined clocks on a physical one); with `ready`, return only once its log
        shows that text (one round trip instead of a start and a wait_for_log)."""
        at = ("--at", repr(start_at)) if start_at is not None else ()
        wait = ("--ready", ready) if ready else ()
        if ready:
            wait += ("--timeout", f"{ready_timeout_s:g}")
        self.rack.run(host, self._helper(host, "start", name, *at, *wait, program=program))

    def running(self, host: str, name: str) -> bool:
        try:
            answer = json.loads(self.check(host, [name], READY_TIMEOUT_S, logs=False))
        except (RackError, ValueError):
            return False
        return answer["daemons"][name]["state"] == "running"

    def check(self, host: str, names: list[str], timeout_s: float, logs: bool = True) -> str:
        """The watch's check: JSON with the free bytes of the host's trial directory and
        each daemon's state (running, ended, absent); RackError if the host does not answer
        within `timeout_s`. Asked of trialbed-check (sh, a few ms of CPU), which hands over to
        trialbed-daemon where it cannot answer alone (without `logs`, only where it has no
        /proc)."""
        check = f"{self.rack.host(host).workdir}/bin/trialbed-check"
        words = [check, *([] if logs else ["--states"]), self.remote[host], *names]
        return self.rack.run(host, command(*words), timeout=timeout_s)

    def wait_for_log(self, host: str, name: str, text: str, timeout_s: float = 5.0) -> None:
        """Wait until the daemon's log contains `text` (e.g. tcpdump's 'listening on')."""
        self.rack.run(host, self._helper(host, "wait-log", name, text, "--timeout", str(timeout_s)))

    def signal(
        self,
        host: str,
        name: str,
        sig: str,
        directory: str | None = None,
        wait_file: str | None = None,
    ) -> None:
        """Send `sig`; with `wait_file`, that file is removed first and waited for."""
        wait = ("--wait-file", wait_file) if wait_file else ()
        self.rack.run(host, self._helper(host, "signal", name, sig, *wait, directory=directory))

    def stop_all(self, host: str, names: list[str], drain: list[str] | tuple = ()) -> None:
        """Stop several daemons of a host at once: each NAME or NAME:SIG is signalled before
        any is waited for (up to 5 s, then killed). `drain`: tcpdumps among them let catch up
        with what their filter passed first (up to 5 s), since SIGINT drops the rest."""
        if names:
            flags = [w for name in drain for w in ("--drain", name)]
            self.rack.run(host, self._helper(host, "stop", *names, *flags), check=False)

    def stop(self, host: str, name: str, sig: str = "TERM") -> None:
        """Signal the daemon, wait up to 5 s for it to end, then kill it."""
        self.stop_all(host, [f"{name}:{sig}"])
