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

import numpy as np

from analysis.damaged import text_of
from analysis.lazy import pd
from analysis.tc_samples import SAMPLE_COUNTERS, sample_records, whole_lines
from core.ipfw_text import FLOW, FLOW_LINE, FLOWSET, FLOWSET_HEAD, LINK, LINK_LINE

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
_LINK, _FLOW = LINK_LINE, FLOW_LINE


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


_FLOWSET = FLOWSET_HEAD
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
    before, after = (rio_queue_counters(text_of(f)) if f.exists() else None for f in files)
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
    """The rows of a sample's rio links (its "rio" map, its `ipfw queue show` text): per link,
    by name, its "dummynet" row (both queues summed) and one per queue. A link whose two
    queues are not both listed gives no row (a queue missing is not an empty one)."""
    rows = []
    listed = parse_queue_show(rec.get("queue_text") or "")
    for dev, numbers in sorted((rec.get("rio") or {}).items()):  # by name: _rio_parts' order
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
    killed mid-write) is ignored. The lines and ipfw's texts are read at once (_at_once:
    14 MB for three minutes of two pipes sampled every 10 ms); a file it does not take (a
    damaged line, text not as ipfw prints it) line by line, into the same rows."""
    table = _at_once(whole_lines(path))
    return table if table is not None else _line_by_line(path)


def _line_by_line(path: str | Path) -> pd.DataFrame:
    """read_ipfw_samples a line at a time (a damaged line skipped)."""
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


# FLOW's counters in a line FLOW matches: its last five fields (FLOW's five groups can only
# be those: each is a whole field, the last one ends the line).
_COUNTERS = FLOW[FLOW.index(r"\s(?P<packets>") :]
_SKIPPED = r"^[ \t]*(?:q|BKT)"  # a flowset or column line: never a flow's counters
_RIO_FIRST = 1 << 40  # the position of a sample's first rio row: past its pipes' rows


def _at_once(text: bytes) -> pd.DataFrame | None:
    """read_ipfw_samples' table of a file's lines (pyarrow's JSON reader, ipfw's texts by
    pyarrow's regular expressions over all their lines at once), or None when a line is not
    as the sampler writes it (the line by line reader then skips or reports it)."""
    import pyarrow as pa
    import pyarrow.json as pj

    fields = [("ts_ns", pa.int64()), ("spread_ns", pa.int64()), ("end", pa.bool_())]
    schema = pa.schema([*fields, ("text", pa.string()), ("queue_text", pa.string())])
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer")
    if not text or text.isspace():
        return _frame({})
    try:
        lines = pj.read_json(pa.BufferReader(text), parse_options=options)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    lines = lines.filter(pa.array(~lines["end"].fill_null(False).to_numpy(zero_copy_only=False)))
    if lines["ts_ns"].null_count or lines["spread_ns"].null_count:
        return None
    texts = {k: lines[k].combine_chunks().fill_null("") for k in ("text", "queue_text")}
    maps = {k: _names(lines, k) for k in ("devs", "rio")}
    if any(m is None for m in maps.values()) or not _plain(text):
        return None
    try:
        pipes = _blocks(texts["text"], LINK, None)
        queues = _blocks(texts["queue_text"], FLOWSET, LINK)
        parts = [*_pipe_rows(pipes, maps), *_rio_parts(queues, maps["rio"])]
    except (pa.ArrowInvalid, ValueError):  # a number beyond 64 bits, a rio map not of numbers
        return None
    rows = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.lexsort((rows.pop("position"), rows["sample"]))
    rows = {k: v[order] for k, v in rows.items()}
    sample = rows.pop("sample")
    rows |= {k: lines[k].to_numpy()[sample] for k in ("ts_ns", "spread_ns")}
    return _frame(rows)


def _frame(rows: dict) -> pd.DataFrame:
    """The table of read_ipfw_samples (types as the line by line reader's, empty or not)."""
    n = len(rows.get("ts_ns", ()))
    zeros = np.zeros(n, dtype=np.int64)
    rows = {"overlimits": zeros, "requeues": zeros, **rows}
    frame = pd.DataFrame({c: rows[c] for c in _COLUMNS} if n else [], columns=_COLUMNS)
    return frame.astype({c: "int64" for c in ("ts_ns", "spread_ns", *SAMPLE_COUNTERS)})


def _plain(text: bytes) -> bool:
    """Whether the JSON lines' strings hold ASCII only and no control character but tab and
    newline: no byte above 127 and no escape of another (what makes \\d, \\s and
    str.splitlines mean the same to RE2 and Python's re; a false alarm only costs time)."""
    if len(text) and np.frombuffer(text, dtype=np.uint8).max() > 127:
        return False
    return not any(e in text for e in (b"\\u", b"\\r", b"\\b", b"\\f"))


def _names(lines, key: str) -> dict[str, dict] | None:
    """The sampler's map ``key`` ("devs": pipe number -> interface; "rio": interface -> its
    pipe and queues) as {name: per-sample values (None where a sample has no such name)};
    None when it is not a map of strings (devs) or of maps of integers (rio)."""
    import pyarrow as pa

    if key not in lines.column_names:
        return {}
    column = lines[key].combine_chunks()
    if pa.types.is_null(column.type):
        return {}
    if not pa.types.is_struct(column.type):
        return None
    out = {}
    for field, values in zip(column.type, column.flatten(), strict=True):
        if key == "devs" and pa.types.is_string(values.type):
            out[field.name] = values.to_numpy(zero_copy_only=False)
        elif key == "rio" and pa.types.is_struct(values.type):
            numbers = {f.name: values.flatten()[i] for i, f in enumerate(values.type)}
            if not all(pa.types.is_integer(v.type) for v in numbers.values()):
                return None
            if {"in", "out"} - set(numbers) or any(
                v.null_count != values.null_count for v in numbers.values()
            ):
                return None  # a queue or the pipe missing where the link is named
            valid = values.is_valid().to_numpy(zero_copy_only=False)
            out[field.name] = {"valid": valid} | {
                k: v.fill_null(0).to_numpy().astype(np.int64) for k, v in numbers.items()
            }
        else:
            return None
    return out


def _blocks(texts, header: str, reset: str | None) -> dict[str, np.ndarray]:
    """Per sample, each pipe (header: LINK) or queue (FLOWSET) its text lists, in the order
    it first lists them, with its flows' counters summed (parse_pipe_show and
    parse_queue_show, over every sample's text at once): sample, number, position (its order
    in the sample) and QUEUE_COUNTERS. ``reset``: a line that ends a block without starting
    one (a pipe's line in `ipfw queue show`)."""
    import pyarrow.compute as pc

    lines = pc.split_pattern(texts, "\n")
    sample = pc.list_parent_indices(lines).to_numpy()
    flat = pc.list_flatten(lines)
    is_head = pc.match_substring_regex(flat, header).to_numpy(zero_copy_only=False)
    ends = is_head.copy()
    if reset is not None:
        ends |= pc.match_substring_regex(flat, reset).to_numpy(zero_copy_only=False)
    counted = pc.match_substring_regex(flat, FLOW).to_numpy(zero_copy_only=False) & ~ends
    candidates = np.flatnonzero(counted)
    lines_of = flat.filter(counted)
    skipped = pc.match_substring_regex(lines_of, _SKIPPED).to_numpy(zero_copy_only=False)
    counted[candidates[skipped]] = False
    candidates = candidates[~skipped]
    # The counters of the flow lines only, by _COUNTERS (RE2 extracts slowly from a line it
    # rejects, and slowly with FLOW's lazy middle).
    flow = pc.extract_regex(lines_of.filter(~skipped), _COUNTERS)
    # Each line's block: the last header or reset line at or before it, in its sample.
    at = np.maximum.accumulate(np.where(ends, np.arange(len(flat)), -1)) if len(flat) else ends
    inside = at >= 0
    counted[inside] &= is_head[at[inside]] & (sample[at[inside]] == sample[inside])
    counted &= inside
    heads = np.flatnonzero(is_head)
    if not len(heads):
        empty = np.zeros(0, dtype=np.int64)
        return dict.fromkeys(("sample", "number", "position", *QUEUE_COUNTERS), empty)
    head = pc.extract_regex(flat.filter(is_head), header)
    number = pc.cast(pc.struct_field(head, "number"), "int64").to_numpy()
    # A number listed twice in a sample is one block (setdefault): by first listing.
    pairs = np.stack([sample[heads], number])
    _, first, block_of = np.unique(pairs, axis=1, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    block_of = rank[block_of.reshape(-1)]
    firsts = np.sort(first)
    out = {
        "sample": sample[heads][firsts],
        "number": number[firsts],
        "position": np.arange(len(firsts), dtype=np.int64),
    }
    rows = np.flatnonzero(counted)
    block = block_of[np.searchsorted(heads, at[rows])]
    flows = flow.filter(np.isin(candidates, rows, assume_unique=True))
    for name in QUEUE_COUNTERS:
        summed = np.zeros(len(firsts), dtype=np.int64)
        np.add.at(summed, block, pc.cast(pc.struct_field(flows, name), "int64").to_numpy())
        out[name] = summed
    return out


def _pipe_rows(pipes: dict[str, np.ndarray], maps: dict) -> list[dict[str, np.ndarray]]:
    """The rows of the pipes the sampler was asked for (its "devs"), not a rio link's."""
    s = pipes["sample"]
    dev = np.full(len(s), None, dtype=object)
    for name in np.unique(pipes["number"]):
        at = pipes["number"] == name
        if str(name) in maps["devs"]:
            dev[at] = maps["devs"][str(name)][s[at]]
    keep = np.array([d is not None for d in dev], dtype=bool)
    for link, numbers in maps["rio"].items():
        keep &= ~((dev == link) & numbers["valid"][s])
    return [_rows(pipes, keep, dev[keep], KIND, pipes["number"][keep].astype(str), "")]


def _rio_parts(queues: dict[str, np.ndarray], rio: dict) -> list[dict[str, np.ndarray]]:
    """Per sample and rio link whose two queues its `ipfw queue show` lists: the link's row
    (both queues summed) and one per queue (_rio_rows, over every sample at once)."""
    key = queues["sample"] * (1 << 32) + queues["number"]
    if len(key) and (queues["number"].min() < 0 or queues["number"].max() >= 1 << 32):
        raise ValueError("a queue number beyond 32 bits")
    parts = []
    for k, (link, numbers) in enumerate(sorted(rio.items())):
        samples = np.flatnonzero(numbers["valid"])
        found = {}
        for p in RIO_KINDS:
            want = samples * (1 << 32) + numbers[p][samples]
            at = np.searchsorted(key, want) if len(key) else np.zeros(len(want), np.int64)
            hit = at < len(key)
            hit[hit] = key[at[hit]] == want[hit]
            found[p] = (at, hit)
        both = found["in"][1] & found["out"][1]
        s = samples[both]
        each = {p: found[p][0][both] for p in RIO_KINDS}
        pipe = numbers["pipe"][s].astype(str) if "pipe" in numbers else np.full(len(s), "")
        total = {"sample": s} | {
            c: queues[c][each["in"]] + queues[c][each["out"]] for c in QUEUE_COUNTERS
        }
        at = _RIO_FIRST + 3 * k  # a sample's rio rows after its pipes', link by link
        parts.append(_rows(total, None, link, KIND, pipe, "", at))
        for j, (p, kind) in enumerate(RIO_KINDS.items(), start=1):
            own = {"sample": s} | {c: queues[c][each[p]] for c in QUEUE_COUNTERS}
            handle = numbers[p][s].astype(str)
            parts.append(_rows(own, None, link, kind, handle, pipe, at + j))
    return parts


def _rows(block, keep, dev, kind, handle, parent, position=None) -> dict[str, np.ndarray]:
    n = len(block["sample"]) if keep is None else int(keep.sum())
    pick = (lambda v: v) if keep is None else (lambda v: v[keep])
    return {
        "sample": pick(block["sample"]),
        "position": pick(block["position"]) if position is None else np.full(n, position),
        "dev": np.broadcast_to(np.asarray(dev, dtype=object), n).copy(),
        "kind": np.full(n, kind, dtype=object),
        "handle": np.broadcast_to(np.asarray(handle, dtype=object), n).copy(),
        "parent": np.broadcast_to(np.asarray(parent, dtype=object), n).copy(),
        **{c: pick(block[c]) for c in QUEUE_COUNTERS},
    }
