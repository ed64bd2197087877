#!/usr/bin/env python3
"""A controlled drop-tail run on a VM rack that is up, outside the trial runner (issue 7: why
the VM rack's drop-tail OWD p99 exceeds the link model), about a minute per run.

In the VM: R's `right` egress gets the router role's arrangement (root netem 25 ms, HTB 1 Mbit/s
child, 60 000-byte bfifo leaf); A sends one bulk TCP flow to C (iperf3) and B a 186-byte UDP
packet every 20 ms to D; R captures both sides. Optionally a `tc -s -j qdisc show` loop in R
every --sampler-ms (what the runner's tc_sampler does). Meanwhile it records:
- in the VM, a timer probe: a 5 ms sleep loop; every wake-up later than 2 ms (the guest not
  running on time);
- on the host, every 20 ms, the time each of qemu's threads ran and waited runnable for a
  host CPU (schedstat), and the machine's idle time: was qemu short of a host CPU?
Then it splits the UDP OWD as scripts/owd_excess.py does and lines the service gaps up with both.

    python scripts/vm_owd_probe.py OUT_DIR [--seconds 40] [--sampler-ms 0|100|10] [--cc cubic]
        [--qemu-nice N] [--label L]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent

GUEST = r"""
set -e
P={prefix}
S={seconds}
W=/root/probe; rm -rf $W; mkdir -p $W; cd $W
R="ip netns exec ${{P}}R"
$R tc qdisc del dev right root 2>/dev/null || true
$R tc qdisc add dev right root handle 1: netem delay 25ms limit 1000000
$R tc qdisc add dev right parent 1:1 handle 2: htb default 10
$R tc class add dev right parent 2: classid 2:10 htb rate 1mbit ceil 1mbit burst 1600b cburst 1600b
$R tc qdisc add dev right parent 2:10 handle 10: bfifo limit 60000
ip netns exec ${{P}}A sysctl -qw net.ipv4.tcp_congestion_control={cc}
pids=""
$R tcpdump -i left -n -s 128 -B 16384 --immediate-mode \
  -w $W/in.pcap 2>$W/in.log & pids="$pids $!"
$R tcpdump -i right -n -s 128 -B 16384 --immediate-mode \
  -w $W/out.pcap 2>$W/out.log & pids="$pids $!"
ip netns exec ${{P}}C iperf3 -s -1 >$W/iperf_s.log 2>&1 & srv=$!
ip netns exec ${{P}}D python3 -c '
import socket; s = socket.socket(2, 2); s.bind(("", 4000))
while True: s.recv(2000)' & pids="$pids $!"
python3 -c '
import json, sys, time
end = time.monotonic() + float(sys.argv[1]); ev = []
while time.monotonic() < end:
    t = time.monotonic(); time.sleep(0.005); late = time.monotonic() - t - 0.005
    if late > 0.002: ev.append([time.time_ns(), round(late * 1e3, 2)])
json.dump(ev, open("stalls.json", "w"))' $((S + 6)) & probe=$!
if [ {sampler_ms} -gt 0 ]; then
  $R sh -c 'while :; do tc -s -j qdisc show >/dev/null; sleep {sampler_s}; done' & pids="$pids $!"
fi
sleep 2
ip netns exec ${{P}}A iperf3 -c 198.18.2.13 -t $S -J >$W/iperf_c.json 2>&1 & cli=$!
ip netns exec ${{P}}B python3 -c '
import socket, sys, time
s = socket.socket(2, 2); n = int(sys.argv[1]) * 50; t = time.monotonic() + 1
for i in range(n):
    t += 0.02
    time.sleep(max(0, t - time.monotonic()))
    s.sendto(i.to_bytes(4, "big") + bytes(154), ("198.18.2.14", 4000))' $S & pids="$pids $!"
wait $cli; wait $probe
sleep 1
kill $pids 2>/dev/null || true; kill $srv 2>/dev/null || true
wait 2>/dev/null || true
$R tc -s qdisc show dev right > $W/tc.txt
$R tc qdisc del dev right root
"""


def qemu_pid(state_dir: Path) -> int:
    return int((state_dir / "vm" / "qemu.pid").read_text().split()[0])


def host_sampler(pid: int, stop: threading.Event, out: list) -> None:
    """Every 20 ms: for each of qemu's threads (by thread id), the time it ran and the time it was
    runnable but waited for a host CPU (schedstat, ns), and the machine's idle time (ms)."""
    tick = os.sysconf("SC_CLK_TCK")

    def threads() -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                run, wait, _ = map(int, (task / "schedstat").read_text().split())
            except (OSError, ValueError):
                continue
            found[task.name] = [run, wait]
        return found

    def idle() -> float:
        f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        return (int(f[3]) + int(f[4])) * 1000 / tick

    last = (time.time_ns(), threads(), idle())
    while not stop.wait(0.02):
        now = (time.time_ns(), threads(), idle())
        per = {
            name: [round((v[0] - last[1].get(name, [0, 0])[0]) / 1e6, 2),
                   round((v[1] - last[1].get(name, [0, 0])[1]) / 1e6, 2)]
            for name, v in now[1].items()
        }  # fmt: skip
        out.append([now[0], round((now[0] - last[0]) / 1e6, 1), per, round(now[2] - last[2], 1)])
        last = now


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seconds", type=int, default=40)
    ap.add_argument("--sampler-ms", type=int, default=0)
    ap.add_argument("--cc", default="cubic")
    ap.add_argument("--qemu-nice", type=int, default=None, help="renice qemu's threads first")
    ap.add_argument("--state-dir", type=Path, default=PROJECT / ".state/rack")
    args = ap.parse_args()
    state = args.state_dir
    rack = json.loads((state / "rack.json").read_text())
    vm = json.loads((state / "vm" / "rack_vm.json").read_text())
    address = vm["address"].split("/")[0]
    pid = qemu_pid(state)
    if args.qemu_nice is not None:
        for task in Path(f"/proc/{pid}/task").iterdir():
            os.setpriority(os.PRIO_PROCESS, int(task.name), args.qemu_nice)
    ssh = [
        "ssh", "-i", str(state / "id_ed25519"), "-o", f"UserKnownHostsFile={state}/vm/known_hosts",
        "-o", "StrictHostKeyChecking=yes", "-o", "IdentitiesOnly=yes", f"root@{address}",
    ]  # fmt: skip
    script = GUEST.format(
        prefix=rack["prefix"],
        seconds=args.seconds,
        cc=args.cc,
        sampler_ms=args.sampler_ms,
        sampler_s=args.sampler_ms / 1000,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    stop, host = threading.Event(), []
    sampler = threading.Thread(target=host_sampler, args=(pid, stop, host))
    sampler.start()
    try:
        subprocess.run([*ssh, "bash -s"], input=script, text=True, check=True)
    finally:
        stop.set()
        sampler.join()
    for name in ("in.pcap", "out.pcap", "stalls.json", "tc.txt", "iperf_c.json"):
        with (args.out / name).open("wb") as f:
            subprocess.run([*ssh, f"cat /root/probe/{name}"], stdout=f, check=True)
    (args.out / "host.json").write_text(json.dumps(host))
    (args.out / "args.json").write_text(json.dumps({k: str(v) for k, v in vars(args).items()}))
    summary = analyse(args.out)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


def analyse(out: Path) -> dict:
    done = subprocess.run(
        [
            sys.executable, str(PROJECT / "scripts/owd_excess.py"), "--json", "--pcaps",
            str(out / "in.pcap"), str(out / "out.pcap"),
        ],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    summary = json.loads(done.stdout)
    gaps = json.loads(
        subprocess.run(
            [
                sys.executable, str(PROJECT / "scripts/owd_excess.py"), "--gaps-json", "--pcaps",
                str(out / "in.pcap"), str(out / "out.pcap"),
            ],
            capture_output=True, text=True, check=True,
        ).stdout
    )  # fmt: skip
    stalls = json.loads((out / "stalls.json").read_text())
    host = json.loads((out / "host.json").read_text())
    # Each service gap over 20 ms: the guest's late wake-ups, and what qemu's threads did on
    # the host meanwhile: ran (ms), runnable but waiting for a CPU (ms), or neither (blocked).
    lined = []

    def during(start_ns: float, end_ns: float) -> dict[str, list[float]]:
        acc: dict[str, list[float]] = {}
        for h in host:
            if start_ns < h[0] <= end_ns + 20e6:
                for name, (run, wait) in h[2].items():
                    a = acc.setdefault(name, [0.0, 0.0])
                    a[0] += run
                    a[1] += wait
        return {k: [round(v[0], 1), round(v[1], 1)] for k, v in acc.items()}

    for end_ns, gap_ms in gaps:
        start_ns = end_ns - gap_ms * 1e6
        guest = [s for s in stalls if start_ns - 50e6 <= s[0] <= end_ns + 50e6]
        lined.append(
            {
                "gap_ms": gap_ms,
                "guest_late_ms": max((s[1] for s in guest), default=0),
                "host_idle_ms": round(sum(h[3] for h in host if start_ns < h[0] <= end_ns), 1),
                "qemu_threads_run_wait_ms": during(start_ns, end_ns),
            }
        )
    spans = sum(h[1] for h in host) or 1
    total: dict[str, list[float]] = {}
    for h in host:
        for name, (run, wait) in h[2].items():
            a = total.setdefault(name, [0.0, 0.0])
            a[0] += run
            a[1] += wait
    summary.update(
        guest_late_wakeups_over_2ms=len(stalls),
        guest_late_wakeups_over_20ms=sum(1 for s in stalls if s[1] > 20),
        guest_late_max_ms=max((s[1] for s in stalls), default=0),
        host_samples=len(host),
        host_samples_without_idle=sum(1 for h in host if h[3] < 1),
        qemu_threads_share_run_wait={
            k: [round(v[0] / spans, 2), round(v[1] / spans, 2)] for k, v in total.items()
        },
        gaps_over_20ms=lined,
    )
    return summary


if __name__ == "__main__":
    sys.exit(main())
