"""`ipfw pipe show` samples of a FreeBSD dummynet router (hostside/recorders/ipfw_sampler.py, JSON
lines with ipfw's text), read into the table analysis.tc_samples reads from a Linux router:
one row per sample and pipe with ts_ns, spread_ns, dev, kind ("dummynet"), handle (the pipe
number), parent, bytes, packets, drops, overlimits, requeues, backlog (queued bytes) and qlen
(queued packets). analysis.tc_samples.leaf_samples and compare_with_samples take it as is.

A rio link (two RED queues, IN and OUT, on the link's pipe; the pipe's own queue stays empty)
is sampled with `ipfw queue show IN OUT` (the sample's "rio" and "queue_text"): its "dummynet"
row (handle: the pipe) then holds the two queues' counters summed, backlog and qlen included
(the link's occupancy: both queues wait for the same pipe), and two more rows of kinds
"dummynet_rio_in" and "dummynet_rio_out" (handle: the queue, parent: the pipe) hold each
queue's own; leaf_samples leaves those out (not LEAF_KINDS), rio_queue_samples reads them.

The text is the one sbin/ipfw/dummynet.c's list_pipes() prints (FreeBSD 8.2 onwards), per pipe:

    10001:   1.000 Mbit/s   25 ms burst 0                       <- "%05d: %s %4d ms burst %s"
    q141073  58 KB 0 flows (1 buckets) sched 75537 weight 0 lmax 0 pri 0 droptail
     sched 75537 type FIFO flags 0x0 0 buckets 1 active
    BKT Prot ___Source IP/port____ ____Dest. IP/port____ Tot_pkt/bytes Pkt/Byte Drp
      0 ip           0.0.0.0/0             0.0.0.0/0     7489  10803048 21 31500  0

A flow line (list_flow) ends with five counters: total packets and bytes through the flow,
packets and bytes queued now, and packets dropped. A pipe without a mask has one flow; with
a mask, one per masked 5-tuple, summed here. No flow line (no packet yet): zeros.

`ipfw queue show N M` (parse_queue_show; the runner's snapshots of the two queues of a rio
link on a FreeBSD router) prints flowsets alone, no link line: per queue the line of
print_flowset_parms() without a pending link line, "q%05d %s%s %d flows (%d buckets) sched %d
weight %d lmax %d pri %d %s" (queue size "%3d sl." in slots, or "%d B" / "%d KB"; RED's
parameters on the next line, "\\n\\t %cRED w_q %f min_th %d max_th %d max_p %f"), then that
flowset's flows (list_flow, as above; print_header()'s column line once, before the first flow
of the whole listing):

    q10001  50 sl. 1 flows (1 buckets) sched 10001 weight 1 lmax 0 pri 0
    \\t  RED w_q 0.001190 min_th 9 max_th 27 max_p 0.099991
    BKT Prot ___Source IP/port____ ____Dest. IP/port____ Tot_pkt/bytes Pkt/Byte Drp
      0 ip           0.0.0.0/0             0.0.0.0/0     2771  4156500  3 4500  66

A queue's counters are its dn_queue's (sys/netpfil/ipfw/ip_dn_io.c dn_enqueue): every packet
that arrived (dropped or not) in the totals, every drop (RED's, or the queue full) in Drp.
"""

from __future__ import annotations

from pathlib import Path

from analysis.lazy import pd
from analysis.tc_samples import SAMPLE_COUNTERS, sample_records
from core.ipfw_text import FLOW_LINE as _FLOW
from core.ipfw_text import FLOWSET_LINE as _FLOWSET
from core.ipfw_text import LINK_LINE as _LINK

__all__ = [
    "parse_pipe_show",
    "parse_queue_show",
    "pipe_drops",
    "read_ipfw_samples",
    "rio_queue_counters",
    "rio_queue_deltas",
    "rio_queue_samples",
    "with_rio_queues",
]

KIND = "dummynet"
# The rows of a rio link's IN and OUT queues (beside its "dummynet" row, their sum).
RIO_KINDS = {"in": "dummynet_rio_in", "out": "dummynet_rio_out"}
_COLUMNS = ["ts_ns", "spread_ns", "dev", "kind", "handle", "parent", *SAMPLE_COUNTERS]


def parse_pipe_show(text: str) -> dict[int, dict[str, int]]:
    """{pipe number: {packets, bytes, qlen, backlog, drops, delay_ms}} from one `ipfw pipe
    show` output; counters summed over the pipe's flows."""
    pipes: dict[int, dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        link = _LINK.match(line)
        if link:
            current = pipes.setdefault(
                int(link[1]),
                {"packets": 0, "bytes": 0, "qlen": 0, "backlog": 0, "drops": 0},
            )
            current["delay_ms"] = int(link[2])
            continue
        flow = _FLOW.match(line)
        if current is not None and flow and not line.lstrip().startswith(("q", "BKT")):
            tot_pkts, tot_bytes, pkts, queued_bytes, drops = (int(v) for v in flow.groups())
            current["packets"] += tot_pkts
            current["bytes"] += tot_bytes
            current["qlen"] += pkts
            current["backlog"] += queued_bytes
            current["drops"] += drops
    return pipes


QUEUE_COUNTERS = ("packets", "bytes", "qlen", "backlog", "drops")


def parse_queue_show(text: str) -> dict[int, dict[str, int]]:
    """{queue (flowset) number: {packets, bytes, qlen, backlog, drops}} from one `ipfw queue
    show` output; counters summed over the flowset's flows, zeros for a flowset without one."""
    queues: dict[int, dict[str, int]] = {}
    current = None
    for line in text.splitlines():
        if _LINK.match(line):  # a pipe's block (`ipfw pipe show`): not a queue's flows
            current = None
            continue
        flowset = _FLOWSET.match(line)
        if flowset:
            current = queues.setdefault(int(flowset[1]), dict.fromkeys(QUEUE_COUNTERS, 0))
            continue
        flow = _FLOW.match(line)
        if current is not None and flow and not line.lstrip().startswith(("q", "BKT")):
            for key, value in zip(QUEUE_COUNTERS, (int(v) for v in flow.groups()), strict=True):
                current[key] += value
    return queues


def rio_queue_counters(snapshot: str) -> dict[str, dict[str, int]] | None:
    """The IN and OUT queues' counters ({"in": {...}, "out": {...}}) in one of the runner's
    snapshots of a rio link on a FreeBSD router: a line `## queues in=<number> out=<number>`,
    then `ipfw queue show`. None without that line or when either queue is not listed."""
    header = snapshot.split("\n", 1)[0]
    if not header.startswith("## queues "):
        return None
    numbers = dict(spec.split("=", 1) for spec in header.split()[2:] if "=" in spec)
    listed = parse_queue_show(snapshot)
    try:
        return {p: listed[int(numbers[p])] for p in ("in", "out")}
    except (KeyError, ValueError):
        return None


def rio_queue_deltas(host_dir: str | Path, iface: str) -> dict[str, dict[str, int]] | None:
    """What the IN and OUT queues of `iface`'s rio link counted during the trial (packets,
    bytes, drops: the runner's ipfw_queues_<iface>_after.txt minus _before.txt); None when
    either snapshot is missing or lacks a queue."""
    files = [Path(host_dir) / f"ipfw_queues_{iface}_{t}.txt" for t in ("before", "after")]
    before, after = (rio_queue_counters(f.read_text()) if f.exists() else None for f in files)
    if before is None or after is None:
        return None
    return {
        p: {k: after[p][k] - before[p][k] for k in ("packets", "bytes", "drops")}
        for p in ("in", "out")
    }


def pipe_drops(snapshot: str, iface: str) -> int:
    """The drop counter of `iface`'s pipe in one of the runner's snapshots of a FreeBSD router:
    a line `## pipes <iface>=<number> ...`, then `ipfw pipe show`. 0 when the pipe is not
    there (not shaped, or no packet yet)."""
    header = snapshot.split("\n", 1)[0]
    specs = header.removeprefix("## pipes ").split() if header.startswith("## pipes ") else []
    numbers = dict(spec.split("=", 1) for spec in specs if "=" in spec)
    if iface not in numbers:
        return 0
    return parse_pipe_show(snapshot).get(int(numbers[iface]), {}).get("drops", 0)


def _row(rec: dict, dev: str, kind: str, handle: str, parent: str, counters: dict) -> dict:
    return {
        "ts_ns": rec["ts_ns"],
        "spread_ns": rec["spread_ns"],
        "dev": dev,
        "kind": kind,
        "handle": handle,
        "parent": parent,
        "overlimits": 0,
        "requeues": 0,
        **{c: counters[c] for c in ("bytes", "packets", "drops", "backlog", "qlen")},
    }


def _rio_rows(rec: dict) -> list[dict]:
    """The rows of a sample's rio links (its "rio" map, its `ipfw queue show` text): per link
    its "dummynet" row (both queues summed) and one per queue. A link whose two queues are not
    both listed gives no row (a queue missing is not an empty one)."""
    rows = []
    listed = parse_queue_show(rec.get("queue_text") or "")
    for dev, numbers in (rec.get("rio") or {}).items():
        try:
            queues = {p: listed[int(numbers[p])] for p in RIO_KINDS}
        except (KeyError, TypeError, ValueError):
            continue
        pipe = str(numbers.get("pipe", ""))
        total = {k: queues["in"][k] + queues["out"][k] for k in QUEUE_COUNTERS}
        rows.append(_row(rec, dev, KIND, pipe, "", total))
        for p, kind in RIO_KINDS.items():
            rows.append(_row(rec, dev, kind, str(numbers[p]), pipe, queues[p]))
    return rows


def read_ipfw_samples(path: str | Path) -> pd.DataFrame:
    """One row per sample and pipe, in the columns of analysis.tc_samples.read_tc_samples (dev
    from the sampler's map of pipe numbers to egress interfaces); a rio link's row sums its IN
    and OUT queues, which have a row each too (RIO_KINDS). A last line cut short (sampler
    killed mid-write) is ignored."""
    rows = []
    for rec in sample_records(path):
        devs, rio = rec.get("devs", {}), rec.get("rio") or {}
        for number, counters in parse_pipe_show(rec.get("text") or "").items():
            dev = devs.get(str(number))
            if dev is None or dev in rio:
                continue  # a pipe the sampler was not asked for; a rio link's (its queues')
            rows.append(_row(rec, dev, KIND, str(number), "", counters))
        rows += _rio_rows(rec)
    df = pd.DataFrame(rows, columns=_COLUMNS)
    return df.astype({c: "int64" for c in ("ts_ns", "spread_ns", *SAMPLE_COUNTERS)})


RIO_COLUMNS = [f"tc_{p}_{k}" for p in RIO_KINDS for k in ("packets", "bytes", "drops")]


def rio_queue_samples(samples: pd.DataFrame, dev: str) -> pd.DataFrame:
    """A rio link's queues sample by sample, in time order: ts_ns, then per queue (in, out) the
    packets and bytes queued (tc_in_packets, tc_in_bytes, ...: qlen and backlog, as
    compare_with_samples names the leaf's) and its drop counter (tc_in_drops, ...). No row
    when `dev` is not a rio link's."""
    parts = []
    for p, kind in RIO_KINDS.items():
        rows = samples[(samples["dev"] == dev) & (samples["kind"] == kind)]
        rows = rows.sort_values("ts_ns", kind="stable").reset_index(drop=True)
        names = {"qlen": f"tc_{p}_packets", "backlog": f"tc_{p}_bytes", "drops": f"tc_{p}_drops"}
        parts.append(rows[["ts_ns", *names]].rename(columns=names))
    first, second = parts
    if len(first) != len(second) or not (first["ts_ns"] == second["ts_ns"]).all():
        return pd.DataFrame(columns=["ts_ns", *RIO_COLUMNS]).astype("int64")
    return pd.concat([first, second.drop(columns="ts_ns")], axis=1)[["ts_ns", *RIO_COLUMNS]]


def with_rio_queues(cmp: pd.DataFrame, samples: pd.DataFrame, dev: str) -> pd.DataFrame:
    """compare_with_samples' table of `dev` (one row per sample of its leaf, in time order)
    with, for a rio link, each queue's occupancy and drops beside the link's (tc_packets and
    tc_bytes are their sums): RIO_COLUMNS, drops counted from the first sample as tc_drops is.
    Unchanged for any other link."""
    rio = rio_queue_samples(samples, dev)
    if rio.empty or len(rio) != len(cmp) or not (rio["ts_ns"].to_numpy() == cmp["ts_ns"]).all():
        return cmp
    out = cmp.copy()
    for col in RIO_COLUMNS:
        values = rio[col].to_numpy()
        out[col] = values - values[0] if col.endswith("_drops") else values
    return out
