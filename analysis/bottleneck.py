"""A bottleneck's queue over a trial: every packet of the generators whose path crosses it,
seen before it and (forwarded) after it in the captures nearest to either side (one clock),
matched (analysis.match), and merged into the queue's events (analysis.queuemerge) a piece at
a time: each piece is written to queue.parquet and read by the figures (drops, queue-full
events, occupancy in the mid-trial window, transit) and by the comparison with the router's
own `tc -s` (or `ipfw pipe show`) samples and snapshots.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from analysis.captures import Captures, Seen, Want, bottleneck_hop, pair_key
from analysis.damaged import text_of
from analysis.ipfw_samples import pipe_drops, read_ipfw_samples, rio_queue_deltas, with_rio_queues
from analysis.lazy import pd
from analysis.match import match_rows, undecided
from analysis.metrics import drop_runs
from analysis.pcap import int_to_ip, ip_strings
from analysis.queue import EVENT_NAMES
from analysis.queuemerge import departure_rows, queue_pieces
from analysis.queuestats import AtTimes, Window
from analysis.stalls import lost_service_of
from analysis.tables import Tables
from analysis.tc_samples import LEAF_KINDS, compare_levels, leaf_samples, read_tc_samples
from analysis.traffic.cbr_udp import max_transit_ns
from core.link_rules import DEFAULT_QDISC, ETHERNET_HEADER, qdisc_of
from core.rio_bpf import drops as rio_bpf_drops
from core.units import parse_duration_ns, parse_offset_ns

__all__ = [
    "Bottleneck",
    "egress",
    "link_delay_ns",
    "queue_drops_counted",
    "queue_samples",
    "tc_cross_check",
    "tc_drops",
]

TC_SAMPLES = "tc_samples.jsonl"  # hostside/recorders/tc_sampler.py's output in the router's dir
IPFW_SAMPLES = "ipfw_samples.jsonl"  # hostside/recorders/ipfw_sampler.py's, on a FreeBSD router
QUEUE_WINDOW_NS = 60 * 10**9  # queue-full events are counted over 60 s mid-trial
_ENDS = ("src", "dst", "proto", "sport", "dport")


def tc_drops(tc_text: str, iface: str) -> int:
    """The drop counter of the leaf qdisc (LEAF_KINDS: drop-tail or an AQM) on `iface` from a
    `tc -s qdisc show` snapshot."""
    block = tc_text.split(f"## {iface}\n", 1)[-1].split("## ", 1)[0]
    for kind, dropped in re.findall(
        r"qdisc (\S+) .*?\n Sent \d+ bytes \d+ pkt \(dropped (\d+)", block
    ):
        if kind in LEAF_KINDS:
            return int(dropped)
    return 0


def egress(record: dict[str, Any], host: str, iface: str) -> dict[str, Any]:
    """What the trial configured on an egress interface ({} if nothing)."""
    for e in record["network"].get("egress", []):
        if e.get("host") == host and e.get("iface") == iface:
            return e
    return {}


def link_delay_ns(record: dict[str, Any], host: str, iface: str) -> int:
    """The delay configured on an egress interface (applied ahead of its shaper's queue)."""
    return parse_offset_ns(egress(record, host, iface).get("delay") or "0s")


def queue_samples(host_dir: Path) -> pd.DataFrame | None:
    """A router's samples of its queues during the trial, in read_tc_samples' columns: `tc -s`
    (Linux) or `ipfw pipe show` (a FreeBSD router's dummynet pipes; `ipfw queue show` of a rio
    link's two queues); None when it has none."""
    if (host_dir / TC_SAMPLES).exists():
        return read_tc_samples(host_dir / TC_SAMPLES)
    if (host_dir / IPFW_SAMPLES).exists():
        return read_ipfw_samples(host_dir / IPFW_SAMPLES)
    return None


def queue_drops_counted(host_dir: Path, iface: str) -> int | None:
    """Drops the router itself counted at `iface`'s queue during the trial (its snapshots after
    minus before: the leaf qdisc, or the dummynet pipe; for rio on a FreeBSD router its IN and
    OUT queues, which hold the packets instead of the pipe; for the BPF RIO, its drops before
    the qdisc as well as the bfifo's); None without snapshots."""
    if (rio := rio_queue_deltas(host_dir, iface)) is not None:
        return rio["in"]["drops"] + rio["out"]["drops"]
    before_the_qdisc = rio_bpf_drops(host_dir, iface) or 0
    for kind, drops in (("tc", tc_drops), ("ipfw", pipe_drops)):
        before, after = host_dir / f"{kind}_before.txt", host_dir / f"{kind}_after.txt"
        if before.exists() and after.exists():
            counted = drops(text_of(after), iface) - drops(text_of(before), iface)
            return counted + before_the_qdisc
    return None


def _cat(parts: list[dict[str, np.ndarray]], key: str, kind) -> np.ndarray:
    """The parts' column ``key`` one after the other (the part itself where there is one)."""
    if len(parts) == 1:
        return parts[0][key]
    return np.concatenate([p[key] for p in parts]) if parts else np.empty(0, kind)


class Bottleneck:
    """One link's queue (see the module docstring); ``ok`` is False when its traffic has no
    capture on both sides on one clock (then it has no figures)."""

    def __init__(self, trial_dir: Path, record: dict[str, Any], link: str, caps: Captures):
        self.trial_dir, self.record, self.link = trial_dir, record, link
        self.before, self.after, self.pairs = set(), set(), set()
        self.bottleneck, self.transit, self.ok = None, 0, True
        for gen in record["traffic"].values():
            b = gen["path"].get("bottleneck")
            if not b or b["link"] != link:
                continue
            hops, hop = gen["path"]["hops"], bottleneck_hop(gen)
            first, second = caps.before(hops, hop), caps.after(hops, hop)
            if not (first and second) or caps.clock(first) != caps.clock(second):
                self.ok = False
                break
            self.before.add(first)
            self.after.add(second)
            self.pairs.add(pair_key(gen["src"], gen["dst"]))
            self.bottleneck, self.transit = b, max(self.transit, max_transit_ns(gen))
        self.ok = self.ok and self.bottleneck is not None
        self.arriving: dict[str, dict[str, np.ndarray]] = {}
        self.departing: dict[str, dict[str, np.ndarray]] = {}
        self.ends: list[dict[str, np.ndarray]] = []  # the arriving packets' directions
        self.last: list[int] = []  # each capture after it: its latest time
        self.departures: tuple[np.ndarray, np.ndarray] | None = None
        self.matched: dict[str, np.ndarray] | None = None  # the arrivals, matched

    def wants(self) -> dict[str, Want]:
        if not self.ok:
            return {}
        return {n: Want(matched=set(self.pairs)) for n in self.before | self.after}

    def ask(self, seen: Seen) -> None:
        pass

    def take(self, seen: Seen) -> None:
        d = seen.directions
        mine = np.isin(d["src"].astype(np.uint64) << np.uint64(32) | d["dst"], list(self.pairs))
        matched = seen.cap.matched
        if mine[matched["direction"]].all():  # every matched packet is this queue's
            rows, pick = seen.matched_rows, lambda column: column  # (no copy of the columns)
        else:
            kept = seen.matched_of(mine)
            rows, pick = seen.matched_rows[kept], lambda column: column[kept]
        ts = seen.cap.ts_ns[rows]
        if seen.point in self.before:
            offset = sum(len(e["src"]) for e in self.ends)
            self.ends.append({k: d[k] for k in _ENDS})
            end = pick(matched["direction"])
            self.arriving[seen.point] = {
                "ts": ts,
                "key_hash": pick(matched["key_hash"]),
                "ip_len": pick(matched["ip_len"]),
                "end": end + np.asarray(offset, np.int32) if offset else end,
            }
        if seen.point in self.after:
            departing = {"ts": ts, "key_hash": pick(matched["key_hash"])}
            if len(seen.cap):
                self.last.append(seen.end_ns)
            self.departing[seen.point] = departing

    def settle(self, point: str) -> None:
        """Once the capture after the queue is let go: the packets matched, if every capture
        before it is read (the arrivals' keys then need not be held any longer)."""
        if point in self.after and len(self.after) == 1 and set(self.arriving) == self.before:
            self._match([self.departing.pop(point)])

    def _match(self, dep: list[dict[str, np.ndarray]]) -> None:
        """The arrivals (every capture before the queue) matched with the departures."""
        arr = [self.arriving[n] for n in sorted(self.before)]
        ts = _cat(arr, "ts", np.int64)
        dep_ts = _cat(dep, "ts", np.int64)
        ts_out = np.full(len(ts), -1, np.int64)
        departures = np.empty(0, np.int32)
        if len(ts) and len(dep_ts):
            ts_out, departures = match_rows(
                _cat(arr, "key_hash", np.uint64), ts, _cat(dep, "key_hash", np.uint64), dep_ts,
                max_delay_ns=self.transit,
            )  # fmt: skip
        self.matched = {
            "ts": ts, "ip_len": _cat(arr, "ip_len", np.uint16), "end": _cat(arr, "end", np.int32),
            "ts_out": ts_out, "departures": departures, "departing": len(dep_ts),
        }  # fmt: skip
        self.arriving = {}  # (their keys are matched: not held any longer)

    def finish(self, tables: Tables, keep_departures: bool) -> dict[str, Any]:
        """The link's figures; its events streamed into ``tables`` ("queue"), its comparison
        with the router's samples added ("queue_tc"); with ``keep_departures``, the
        departures' times and frame sizes kept (``departures``) for the lost service."""
        if self.matched is None:
            self._match([self.departing[n] for n in sorted(self.after)])
            self.departing = {}
        m, self.matched = self.matched, None
        ts, ip_len, end, ts_out, departures = (
            m[k] for k in ("ts", "ip_len", "end", "ts_out", "departures")
        )
        end_ns = max(self.last) if m["departing"] and self.last else 0
        del m
        # Packets still in transit when the capture after the router stopped are not drops.
        unknown = undecided(ts, ts_out >= 0, max_delay_ns=self.transit, end_ns=end_ns)
        if unknown.any():
            keep = np.flatnonzero(~unknown)
            departures = ((np.cumsum(~unknown) - 1)[departures]).astype(np.int32)
            ts, ts_out, ip_len, end = ts[keep], ts_out[keep], ip_len[keep], end[keep]
        fwd = ts_out >= 0
        host, iface = self.bottleneck["host"], self.bottleneck["iface"]
        qdisc = qdisc_of(self.bottleneck)
        t0 = self.record["times"]["t0_ns"]
        run_end = t0 + parse_duration_ns(self.record["parameters"]["duration"])
        if self.record.get("status") != "complete" and end_ns:
            run_end = max(t0, min(run_end, end_ns))  # stopped early: only what ran is judged
        mid = t0 + (run_end - t0) // 2
        window = (max(t0, mid - QUEUE_WINDOW_NS // 2), min(run_end, mid + QUEUE_WINDOW_NS // 2))
        full = drop_runs(ts, fwd, *window)
        host_dir = self.trial_dir / host
        samples = queue_samples(host_dir)
        leaf = leaf_samples(samples, iface) if samples is not None else None
        in_window = Window(*window)
        at = AtTimes(np.empty(0, np.int64) if leaf is None else leaf["ts_ns"].to_numpy(np.int64))
        ends = {k: np.concatenate([e[k] for e in self.ends]) for k in _ENDS} if self.ends else {}
        used = np.unique(end)  # every packet judged is an event: the table's addresses
        categories = {"event": len(EVENT_NAMES)}
        categories |= {k: len(np.unique(ends[k][used])) if ends else 0 for k in ("src", "dst")}
        pieces = _EventTables(self, ends, end)
        for piece in queue_pieces(
            ts, ts_out, ip_len, delay_ns=link_delay_ns(self.record, host, iface),
            max_delay_ns=self.transit, end_ns=end_ns, departures=departures,
            header_bytes=ETHERNET_HEADER, piece=1 << 17,
        ):  # fmt: skip
            args = (piece["ts_ns"], piece["event"], piece["packets"], piece["bytes"])
            in_window.add(*args)
            at.add(*args)
            tables.stream("queue", pieces(piece), categories)
        at.finish()
        del pieces
        transit = {
            # Capture to capture across the router (its queue, its link's delay, an edge
            # marker's time), mean over the packets forwarded in the window (seed 004's delay).
            "transit_mean_ms_in_window": transit_ms(ts, ts_out, window, "mean"),
            "transit_min_ms_in_window": transit_ms(ts, ts_out, window, "min"),
            # The least over the whole trial: the queue is empty at its start at least (a queue
            # that never drains in the window, e.g. RIO's IN min 160 at 3 Mbit/s, held 770 ms
            # there). Seed 004's delay is normalized by it.
            "transit_min_ms": transit_ms(ts, ts_out, (0, 2**63 - 1), "min"),
        }
        del ts, end
        if keep_departures:  # by (time, row), as the events list them
            self.departures = _departures(ts_out, ip_len, departures)
        del ts_out, ip_len, departures
        check: dict[str, Any] = {}
        if samples is not None:
            check, cmp = _tc_cross_check(at, leaf, samples, iface)
            tables.add("queue_tc", cmp.assign(link=self.link))
        return {
            "link": self.link,
            "at": f"{host}:{iface}",
            "captures_before": sorted(self.before),
            "captures_after": sorted(self.after),
            "queue_drops_capture": int((~fwd).sum()),
            "queue_undecided_at_end": int(unknown.sum()),
            "queue_drops_tc": queue_drops_counted(host_dir, iface),
            # Runs of drops: the queue full where it is drop-tail; an AQM drops before it is
            # full, so there they are its drop runs (the name says which: queue_drop_runs_are).
            "queue_qdisc": qdisc,
            "queue_drop_runs_are": "queue-full events"
            if qdisc == DEFAULT_QDISC
            else f"{qdisc} drop runs (early drops, not a full queue)",
            "queue_full_events": full["events"],
            "queue_full_events_per_min": full["events_per_minute"],
            "queue_window_s": (window[1] - window[0]) / 1e9,
            **transit,
            **{f"queue_{k}_in_window": v for k, v in in_window.result().items()},
            **check,
        }

    def lost_service(self, ts_in_ns, ts_out_ns, delay_ns: int, rate_bps: float) -> np.ndarray:
        """analysis.stalls.lost_service_ns of packets through this queue (its departures kept
        by finish)."""
        t, ip_len = self.departures
        frame = ip_len.astype(np.int64) + ETHERNET_HEADER
        return lost_service_of(t, frame, ts_in_ns, ts_out_ns, delay_ns, rate_bps)

    def _events(self, piece: dict[str, np.ndarray], ends, end: np.ndarray) -> pd.DataFrame:
        """A piece of the queue table (analysis.queue.queue_occupancy's columns and the
        link)."""
        which = end[piece["row"]]
        return pd.DataFrame(
            {
                "ts_ns": piece["ts_ns"],
                "event": pd.Categorical.from_codes(piece["event"], categories=list(EVENT_NAMES)),
                "frame_bytes": piece["frame_bytes"],
                "src": ip_strings(ends["src"][which] if ends else np.empty(0, np.uint32)),
                "dst": ip_strings(ends["dst"][which] if ends else np.empty(0, np.uint32)),
                **{k: ends[k][which] for k in ("proto", "sport", "dport")},
                "packets": piece["packets"],
                "bytes": piece["bytes"],
                "link": self.link,
            }
        )


class _EventTables:
    """The queue table's pieces as pyarrow tables: the first through pandas (_events: the
    table's types and pandas' metadata), the next made from the arrays directly, their
    addresses coded as ip_strings codes them (by first appearance in the piece)."""

    def __init__(self, queue: Bottleneck, ends: dict[str, np.ndarray], end: np.ndarray):
        self.queue, self.ends, self.end = queue, ends, end
        self.addresses = {}  # per column: each end's code, and the codes' dotted quads
        for c in ("src", "dst"):
            values = ends[c] if ends else np.empty(0, np.uint32)
            uniq, codes = np.unique(values, return_inverse=True)
            self.addresses[c] = (codes, np.array([int_to_ip(a) for a in uniq], dtype=object))
        self.schema = None

    def __call__(self, piece: dict[str, np.ndarray]):
        import pyarrow as pa

        if self.schema is None:
            table = pa.Table.from_pandas(
                self.queue._events(piece, self.ends, self.end), preserve_index=False
            )
            self.schema = table.schema
            return table
        which = self.end[piece["row"]]
        arrays = {
            "ts_ns": pa.array(piece["ts_ns"]),
            "event": pa.DictionaryArray.from_arrays(piece["event"], list(EVENT_NAMES)),
            "frame_bytes": pa.array(piece["frame_bytes"]),
            **{c: self._coded(c, which) for c in ("src", "dst")},
            **{k: pa.array(self.ends[k][which]) for k in ("proto", "sport", "dport")},
            "packets": pa.array(piece["packets"]),
            "bytes": pa.array(piece["bytes"]),
        }
        link = pa.scalar(self.queue.link, self.schema.field("link").type)
        arrays["link"] = pa.repeat(link, len(which))
        return pa.Table.from_arrays([arrays[f.name] for f in self.schema], schema=self.schema)

    def _coded(self, column: str, which: np.ndarray):
        """The addresses of the piece's packets, coded by first appearance in the piece."""
        import pyarrow as pa

        ends_code, names = self.addresses[column]
        codes = ends_code[which]
        first = np.full(len(names), len(codes), np.int64)
        _first_seen(codes, first)
        seen = np.flatnonzero(first < len(codes))
        seen = seen[np.argsort(first[seen], kind="stable")]
        number = np.empty(len(names), np.int32)
        number[seen] = np.arange(len(seen))
        kind = self.schema.field(column).type
        indices = pa.array(number[codes]).cast(kind.index_type)
        return pa.DictionaryArray.from_arrays(indices, pa.array(names[seen], kind.value_type))


@njit(cache=True, nogil=True)
def _first_seen(codes, first):
    """Each code's first row (``first`` holds more than any row for those not seen)."""
    for i in range(len(codes)):
        if first[codes[i]] > i:
            first[codes[i]] = i


def _departures(ts_out, ip_len, departures) -> tuple[np.ndarray, np.ndarray]:
    """The departures' times and IP lengths, by (time, row) as the queue's events list them
    (row order where that is time order: one FIFO)."""
    fwd = ts_out >= 0
    t = ts_out[fwd]
    if not (t[1:] < t[:-1]).any():
        return t, ip_len[fwd]
    rows = departure_rows(ts_out, departures)
    return ts_out[rows], ip_len[rows]


def transit_ms(ts, ts_out, window: tuple[int, int], how: str) -> float | None:
    """`how` (mean, min) of the capture-to-capture transit of the packets forwarded in the
    window, in ms (as pandas takes them of an int64 column)."""
    inside = (ts_out >= 0) & (ts >= window[0]) & (ts < window[1])
    if not inside.any():
        return None
    transit = ts_out[inside] - ts[inside]
    if how == "mean":
        return float(transit.sum(dtype=np.float64) / len(transit) / 1e6)
    return float(transit.min() / 1e6)


def tc_cross_check(
    queue: pd.DataFrame, samples: pd.DataFrame, iface: str
) -> tuple[dict, pd.DataFrame]:
    """:func:`_tc_cross_check` of a queue's whole table of events (queue_occupancy's)."""
    leaf = leaf_samples(samples, iface)
    at = AtTimes(leaf["ts_ns"].to_numpy(np.int64))
    codes = pd.Categorical(queue["event"], categories=list(EVENT_NAMES)).codes
    ts, packets, nbytes = (queue[c].to_numpy(np.int64) for c in ("ts_ns", "packets", "bytes"))
    at.add(ts, codes, packets, nbytes)
    at.finish()
    return _tc_cross_check(at, leaf, samples, iface)


def _tc_cross_check(
    at: AtTimes, leaf: pd.DataFrame, samples: pd.DataFrame, iface: str
) -> tuple[dict, pd.DataFrame]:
    """The reconstructed queue against the router's samples of the bottleneck's leaf qdisc (or
    dummynet pipe; a FreeBSD rio link's two queues summed, each one's in columns of its own:
    analysis.ipfw_samples.with_rio_queues), over the samples taken while the captures saw the
    queue's traffic."""
    cmp = with_rio_queues(compare_levels(leaf, at.packets, at.bytes, at.drops), samples, iface)
    if at.first_ns is not None:
        cmp = cmp[(cmp.ts_ns >= at.first_ns) & (cmp.ts_ns <= at.last_ns)]
    if cmp.empty:
        return {"tc_samples": 0}, cmp
    diff = cmp.diff_packets.abs()
    return {
        "tc_samples": len(cmp),
        "tc_sample_spread_ms": float(cmp.spread_ns.median() / 1e6),
        "tc_diff_packets_median": float(diff.median()),
        "tc_diff_packets_p99": float(diff.quantile(0.99)),
        "tc_diff_packets_max": int(diff.max()),
        "tc_drops": int(cmp.tc_drops.iloc[-1]),
        "capture_drops_same_span": int(cmp.drops.iloc[-1]),
    }, cmp
