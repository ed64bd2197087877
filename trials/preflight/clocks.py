"""Whether the hosts that capture in one declared clock domain read the same time: each
host's offset from the controller's clock, read over SSH, against trialbed_max_clock_offset."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from core.command import script
from core.rack import Rack, RackError
from core.units import parse_duration_ns

CLOCK_SAMPLES = 5
DEFAULT_MAX_CLOCK_OFFSET = "1ms"
DEFAULT_CLOCK_READ = "date +%s%N"
# One read per line on its input; $1 is the read, a shell command of the inventory's.
_READ_LOOP = 'while read -r _; do eval "$1"; done'


def clock_offset(rack: Rack, name: str) -> tuple[int, int]:
    """The host's clock minus the controller's, and the uncertainty (half the round trip of the
    quickest of CLOCK_SAMPLES reads), in ns. The reads run in one shell loop over one SSH
    channel (a new command per read would cost an exec and a shell each: hundreds of ms on a
    loaded controller); the read is trialbed_clock_read (default `date +%s%N`), for a host
    whose clock is read otherwise."""
    read = str(rack.host(name).vars.get("trialbed_clock_read", DEFAULT_CLOCK_READ))
    conn = rack.connection(name)
    conn.open()
    loop = rack.host(name).login_command(script(_READ_LOOP, read))
    stdin, stdout, _ = conn.client.exec_command(loop, timeout=30)
    best: tuple[int, int] | None = None
    try:
        for _ in range(CLOCK_SAMPLES + 1):  # the first read waits for the shell to start
            sent = time.time_ns()
            stdin.write("\n")
            stdin.flush()
            line = stdout.readline()
            back = time.time_ns()
            try:
                remote = int(line.split()[0])
            except (IndexError, ValueError):
                raise RackError(
                    f"{name}: the clock read {read!r} (trialbed_clock_read) printed {line!r}, "
                    "not nanoseconds since the epoch"
                ) from None
            sample = (remote - (sent + back) // 2, (back - sent) // 2)
            if best is None or sample[1] < best[1]:
                best = sample
    finally:
        stdin.close()
    assert best is not None
    return best


def clock_problems(rack: Rack, clocks: dict[str, set[str]]) -> list[str]:
    """Hosts that capture in one declared clock domain must read the same time: one line per
    host whose offset from the domain's median host is beyond trialbed_max_clock_offset by
    more than the measurement's uncertainty."""
    text = str(rack.vars.get("trialbed_max_clock_offset", DEFAULT_MAX_CLOCK_OFFSET))
    limit = parse_duration_ns(text)
    problems = []
    for domain, members in sorted(clocks.items()):
        if len(members) < 2:
            continue
        names = sorted(members)
        with ThreadPoolExecutor(max_workers=len(names)) as pool:
            offsets = dict(
                zip(names, pool.map(lambda n: clock_offset(rack, n), names), strict=True)
            )
        by_offset = sorted(names, key=lambda n: offsets[n][0])
        ref = by_offset[(len(by_offset) - 1) // 2]
        ref_off, ref_unc = offsets[ref]
        for name in names:
            off, unc = offsets[name]
            diff, within = off - ref_off, unc + ref_unc
            if name != ref and abs(diff) - within > limit:
                problems.append(
                    f"hosts {ref} and {name} capture in clock domain {domain!r}, but {name}'s "
                    f"clock is {diff / 1e6:+.2f} ms off {ref}'s (\u00b1{within / 1e6:.2f} ms, "
                    f"read over SSH), beyond trialbed_max_clock_offset {text}: discipline both "
                    "to one clock (chrony against one server, or PTP with hardware timestamps), "
                    "or give them clock domains of their own (one-way delays between their "
                    "captures are then not computed)"
                )
    return problems
