"""bulk_tcp: goodput (receiver's in-order ACKs after the bottleneck), retransmissions and
startup dynamics (sender side of the bottleneck), all from captures; cwnd from the sender's
tcp_probe (or SIFTR) recording.

Its flows are its sender's data connections, never iperf3's control connection: the ports its
sender's report names (the record's ``client_json``: iperf3's, or the socket sender's,
hostside/traffic/bulk_socket.py), else, from the packets, every connection to the server's port
(iperf3: but the first, its control connection, opened before any data connection). They are
read from each capture's flow kernels (analysis.captures.Seen.flows), which the trial's other
bulk_tcp generators share: one data pass and one ACK pass per capture.

Startup figures. Bytes acknowledged in order, at the capture before the bottleneck (the
senders' side): per flow from its own SYN (``delivered_bytes``, slow-start exit); summed over
the trial's bulk_tcp generators from the trial's first data SYN (``acked_since_first_syn``) and
from T0, the launch (``acked_since_t0``, labelled so: it includes iperf3's set-up). Bytes that
passed the capture after the bottleneck in sequence (new payload contiguous from each flow's
first byte: what reached the receivers, in order) from the trial's first data SYN
(``transferred_since_first_syn``: the paper's useful data, the startup table's; it needs the
capture of that SYN and the one after the bottleneck on one clock). share_first_syn gives every
generator that origin once every capture is read."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from analysis.captures import Captures, Seen, Want, bottleneck_hop, pair_key
from analysis.families.startup import LATE_WINDOW_S
from analysis.lazy import pd
from analysis.metrics import RETRANSMISSION_COLUMNS, goodput_frame
from analysis.pcap import int_to_ip, ip_to_int
from analysis.siftr import read_siftr
from analysis.startup import Flows, at_step, delivered_rows, loss_counts, loss_event_rows
from analysis.tcp_probe import congestion_events, epoch_counts, read_tcp_probe
from analysis.tcpflows import acked, goodput, goodput_queries, in_sequence
from core.link_rules import ETHERNET_HEADER
from core.units import parse_duration_ns, parse_offset_ns

CUTOFFS_S = (1, 5, 10, 20, 30)
LATE_WINDOW_NS = LATE_WINDOW_S * 10**9  # Figs. 7 and 8 of seed 001: after the late joiner's SYN
DEFAULT_RTO_MIN_NS = 200_000_000  # Linux TCP_RTO_MIN
KEY = ["src", "dst", "sport", "dport"]
TCP_PROBE = "tcp_probe.txt"  # hostside/recorders/tcp_probe.py's output in the sender's dir
SIFTR_LOG = "siftr.log"  # a FreeBSD sender's SIFTR log (net.inet.siftr.logfile) in its dir


def tool_of(gen: dict[str, Any]) -> str:
    """The program that sent its data: iperf3 or socket (trials before the choice: iperf3)."""
    return gen.get("tool") or gen["spec"].get("tool") or "iperf3"


def data_ports(client_json: Path, tool: str = "iperf3") -> set[int] | None:
    """Local ports of the sender's data connections as its report names them (iperf3's control
    connection carries no bulk data); None when it left no report (both write it at their end:
    a killed one leaves none)."""
    try:
        report = json.loads(client_json.read_text())
    except ValueError:
        return None
    if tool == "socket":
        return {f["local_port"] for f in report.get("flows", []) if f.get("local_port")}
    return {c["local_port"] for c in report.get("start", {}).get("connected", [])}


class Analysis:
    """One bulk_tcp generator's analysis, capture by capture (see analysis/trial.py)."""

    def __init__(
        self,
        trial_dir: Path,
        record: dict[str, Any],
        name: str,
        gen: dict[str, Any],
        caps: Captures,
    ) -> None:
        self.trial_dir, self.record, self.name, self.gen = trial_dir, record, name, gen
        hops, hop = gen["path"]["hops"], bottleneck_hop(gen)
        self.before, self.after = caps.before(hops, hop), caps.after(hops, hop)
        self.clock_before = caps.clock(self.before) if self.before else None
        self.clock_after = caps.clock(self.after) if self.after else None
        client, self.tool = trial_dir / gen["client_json"], tool_of(gen)
        self.ports = data_ports(client, self.tool) if client.exists() else None
        self.t0 = record["times"]["t0_ns"]
        self.start = self.t0 + gen["start_ns"]
        # The first bulk_tcp sender's launch: no data SYN of the trial comes before it.
        bulk = [g["start_ns"] for g in record["traffic"].values() if g["type"] == "bulk_tcp"]
        self.launch = self.t0 + min(bulk)
        # A late joiner (a bulk_tcp generator launched after the first): the paper's Figs. 7
        # and 8 count what every sender passed in the LATE_WINDOW after its data SYN.
        self.joins_late = max(bulk) > min(bulk)
        self.first_syn: tuple[int, bool] | None = None  # its flows' earliest start, a SYN?
        self.origin: tuple[int, bool] | None = None  # the trial's: share_first_syn's
        self.origin_clock: str | None = None  # the clock of the capture that saw it
        self.late_origin: tuple[int, bool] | None = None  # the late joiner's first data SYN
        self.end = self.start + gen["duration_ns"]
        self.warmup = parse_offset_ns(record["parameters"]["warmup"])
        self.duration = parse_duration_ns(record["parameters"]["duration"])
        self.cutoffs = np.array([int(c * 1e9) for c in CUTOFFS_S], np.int64)
        self.since_t0 = [int(c) for c in self.cutoffs if c <= self.duration]
        self.rate = (gen["path"].get("bottleneck") or {}).get("rate_bps")
        self.out: dict[str, Any] = {
            "type": "bulk_tcp",
            "capture_before": self.before,
            "capture_after": self.after,
            "data_connections_from": f"{self.tool} report" if self.ports else "packets",
        }
        self.after_side = self.before_side = None  # take()'s figures of either capture
        self.table: pd.DataFrame | None = None  # its flows' (finish)

    def wants(self) -> dict[str, Want]:
        pair = {pair_key(self.gen["src"], self.gen["dst"])} if self.rate else set()
        out = {}
        if self.after:
            out[self.after] = Want()
        if self.before:  # ip_len of its data packets: the payload capacity
            out[self.before] = Want(matched=pair, times={self.t0 + c for c in self.since_t0})
        return out

    def _mine(self, seen: Seen) -> np.ndarray:
        """Its directions: TCP between its two hosts, on its sender's data ports; without them,
        every connection to its server port (iperf3: but the first, its control connection)."""
        pair = {ip_to_int(self.gen["src"]), ip_to_int(self.gen["dst"])}
        tcp = seen.mask(proto=6, src=pair, dst=pair)
        if self.ports:
            return tcp & (seen.mask(sport=self.ports) | seen.mask(dport=self.ports))
        port = self.gen["port"]
        mine = tcp & (seen.mask(sport=port) | seen.mask(dport=port))
        if self.tool == "socket":  # no control connection
            return mine
        opened = np.flatnonzero(tcp & seen.mask(src=ip_to_int(self.gen["src"]), dport=port))
        if len(opened):
            control = opened[np.argmin(seen.directions["first"][opened])]
            mine[control] = False
            back = seen.directions["reverse"][control]
            if back >= 0:
                mine[back] = False
        return mine

    def _flows(self, seen: Seen) -> Flows:
        """The capture's flows restricted to this generator's, its packets' latest time as
        the capture's end."""
        mine = self._mine(seen)
        own = seen.flows
        last = seen.last_ns(mine)
        return dataclasses.replace(
            own, flows=own.flows[mine[own.flows]], end_ns=-1 if last is None else last
        )

    def ask(self, seen: Seen) -> None:
        f = self._flows(seen)
        if seen.point == self.after:
            if self.record.get("status") != "complete" and f.end_ns >= 0:
                # Stopped early (interrupted, failed): the window ends where its packets end.
                self.end = min(self.end, f.end_ns)
                self.out["window_cut_at_s"] = (self.end - self.t0) / 1e9
            data = f.data
            self.steady = goodput_queries(
                f.queries, data, f.flows, self.start + self.warmup, self.end
            )
            self.lifetime = goodput_queries(f.queries, data, f.flows)
        if seen.point == self.before:
            f.add_delivered(f"{self.name}.delivered", self.cutoffs)
            f.add_exit(f"{self.name}.exit")
            f.queries.add(f"{self.name}.t0", f.flows, self.t0)
            for c in self.since_t0:
                f.queries.add(f"{self.name}.t0+{c}", f.flows, self.t0 + c)
            starts = f.starts()
            if len(f.flows):
                first = int(np.argmin(starts["start_ns"]))
                self.first_syn = (int(starts["start_ns"][first]), bool(starts["syn_seen"][first]))
                # The trial's first data SYN lies between the launch and its own: every time
                # the bytes delivered by it + c can take, for each cut-off c.
                for c in self.cutoffs:
                    f.add_steps(f"{self.name}.syn+{c}", self.launch + c, self.first_syn[0] + c)

    def take(self, seen: Seen) -> None:
        """Its flows' figures of this capture, as arrays (the frames are made in finish)."""
        f = self._flows(seen)
        d, ends = f.data, f.ends()
        if seen.point == self.after:
            self.after_side = {
                "ends": ends,
                "steady": goodput(f.queries, d, self.steady),
                "lifetime": goodput(f.queries, d, self.lifetime),
                **self._passed(f, ends, seen.end_ns),
                "capture_end_ns": seen.end_ns,
            }
        if seen.point == self.before:
            configured = self.record.get("host_settings", {}).get(self.gen["from"], {})
            rto_min = configured.get("rto_min")
            events = f.losses(parse_duration_ns(rto_min) if rto_min else DEFAULT_RTO_MIN_NS)
            counts = (d.packets, d.retransmitted, d.retransmitted_bytes)
            self.before_side = {
                "ends": ends,
                "retrans": {
                    k: v[f.flows] for k, v in zip(RETRANSMISSION_COLUMNS, counts, strict=True)
                },
                "events": events,
                "counted": loss_counts(events, len(f.flows)),
                "starts": f.starts(),
                "end_ns": f.end_ns,
                "exits": f.slow_start(f"{self.name}.exit"),
                "delivered": f.delivered(f"{self.name}.delivered"),
                "since_t0": {f"{c // 10**9}s": self._since_t0(f, c) for c in self.since_t0},
                "steps": {c: f.steps(f"{self.name}.syn+{c}") for c in self.cutoffs if len(f.flows)},
                "capture_end_ns": seen.end_ns,
                "capacity": self._capacity(seen) if self.rate else None,
            }

    def _passed(self, f: Flows, ends: dict[str, np.ndarray], end_ns: int) -> dict[str, Any]:
        """The bytes its data directions passed this capture in sequence, summed, at each time
        they grew (the in-sequence pass), up to its flows' first SYN here + the last cut-off:
        the trial's first data SYN comes no later (the SYN passes this capture after the one
        before the bottleneck), so every count from it lies within. With a late joiner, to the
        capture's end: its data SYN, known once every capture is read, may come later."""
        data = f.flows[ends["src"] == ip_to_int(self.gen["src"])]
        if not len(data):
            return {"passed": (np.zeros(0, np.int64),) * 2, "horizon_ns": -1}
        horizon = int(f.starts()["start_ns"][np.isin(f.flows, data)].min() + self.cutoffs[-1])
        if self.joins_late:
            horizon = max(horizon, end_ns)
        mine = np.zeros(f.p.directions, bool)
        mine[data] = True
        moved = in_sequence(f.p, f.data, mine, horizon)
        times, total = moved["ts"], np.cumsum(moved["bytes"])
        return {"passed": (times, total), "horizon_ns": min(horizon, end_ns)}

    def _goodput(self) -> tuple[pd.DataFrame, dict[str, Any]]:
        """Its flows' goodput in the steady window and over their lifetime, and the summary's
        figures of them."""
        side = self.after_side
        ends = side["ends"]
        steady_ok = self.end > self.start + self.warmup
        steady = goodput_frame(ends, *side["steady"])
        if not steady_ok:  # it never reached its steady state: no steady figures at all
            steady = steady.assign(bytes=0, seconds=0.0, goodput_bps=np.nan)
        lifetime = goodput_frame(ends, *side["lifetime"])
        names = ("bytes", "seconds", "goodput_bps")
        flows = steady.rename(columns={c: f"steady_{c}" for c in names}).merge(
            lifetime.rename(columns={c: f"lifetime_{c}" for c in names}), on=KEY, how="outer"
        )
        window = [(self.start + self.warmup - self.t0) / 1e9, (self.end - self.t0) / 1e9]
        return flows, {
            **self._transferred(side),
            "flows_seen": len(flows),
            "goodput_kBps": float(flows.steady_goodput_bps.sum() / 8000) if steady_ok else None,
            "steady_window_s": window if steady_ok else None,
            "goodput_kBps_lifetime": float(flows.lifetime_goodput_bps.sum() / 8000),
            "flow_goodput_kBps": [float(v) for v in flows.steady_goodput_bps / 8000],
        }

    def _sender_side(self) -> tuple[dict[str, pd.DataFrame], dict]:
        """Its flows' retransmissions, losses, slow-start exits and bytes delivered by each
        cut-off (frames of a row per flow), and the summary's figures of them."""
        side = self.before_side
        ends, starts = side["ends"], side["starts"]
        retrans = pd.DataFrame({**ends, **side["retrans"]})
        losses = pd.DataFrame({**ends, "start_ns": starts["start_ns"], **side["counted"]})
        timeouts = loss_event_rows(ends, side["events"])
        exits = pd.DataFrame({**ends, **side["exits"]})
        delivered = delivered_rows(ends, starts, side["end_ns"], self.cutoffs, side["delivered"])
        covered = delivered.groupby("cutoff_ns").covered.all()
        frames = {"retrans": retrans, "losses": losses, "exits": exits, "delivered": delivered}
        return frames, {
            "retransmitted_packets": int(retrans.retransmitted_packets.sum()),
            "timeouts": int(losses.timeouts.sum()),
            "timeout_idle_ms": [
                float(v) / 1e6 for v in timeouts[timeouts.kind == "timeout"].idle_ns
            ],
            "fast_retransmits": int(losses.fast_retransmits.sum()),
            "slow_start_exit_s": [None if np.isnan(v) else float(v) / 1e9 for v in exits.exit_ns],
            "start_offsets_s": [float(v - self.t0) / 1e9 for v in losses.start_ns],
            "delivered_bytes": {
                f"{c // 10**9}s": int(delivered[delivered.cutoff_ns == c].bytes.sum())
                for c in self.cutoffs
                if covered.get(c, False)
            },
            "first_data_syn_s": None if self.first_syn is None else self._after_t0(self.first_syn),
            "first_data_syn_seen": None if self.first_syn is None else self.first_syn[1],
            # Acknowledged from the trial's first data SYN (the family sums them).
            "acked_since_first_syn": self._since_first_syn(side),
            # From T0, the launch: with iperf3's set-up before the data SYN (labelled so).
            "acked_since_t0": side["since_t0"],
            "payload_capacity_bps": side["capacity"],
        }

    def _after_t0(self, at: tuple[int, bool]) -> float:
        return (at[0] - self.t0) / 1e9

    def _since_first_syn(self, side: dict[str, Any]) -> dict[str, int]:
        """Bytes its flows delivered from the trial's first data SYN to it + c, per cut-off c
        the capture before the bottleneck covers (a generator without data flows: 0)."""
        if self.origin is None:
            return {}
        out = {}
        for c in self.cutoffs:
            at = self.origin[0] + c
            if at > side["capture_end_ns"]:
                continue
            got = at_step(side["steps"][c], at) if c in side["steps"] else 0
            if got is not None:  # None: a SYN before the launch (clocks apart)
                out[f"{c // 10**9}s"] = got
        return out

    def _transferred(self, side: dict[str, Any]) -> dict[str, Any]:
        """Bytes its flows passed the capture after the bottleneck in sequence from the
        trial's first data SYN to it + c, per cut-off c that capture covers (a generator
        without data flows there: 0); why not, where the two captures do not share a clock."""
        if self.origin is None:
            return {}
        if self.origin_clock != self.clock_after:
            return {
                "transferred_skipped": f"the first data SYN's capture (clock "
                f"{self.origin_clock}) and {self.after} (clock {self.clock_after}) do not share "
                "a clock"
            }
        times, total = side["passed"]

        def by(at: int) -> int | None:
            """Bytes passed by `at`, where the in-sequence pass covers it."""
            if at <= side["horizon_ns"] or (not len(times) and at <= side["capture_end_ns"]):
                i = int(np.searchsorted(times, at, side="right"))
                return int(total[i - 1]) if i else 0
            return None

        out = {}
        for c in self.cutoffs:
            if (got := by(self.origin[0] + c)) is not None:
                out[f"{c // 10**9}s"] = got
        figures: dict[str, Any] = {"transferred_since_first_syn": out}
        if self.late_origin is not None:
            start, end = self.late_origin[0], self.late_origin[0] + LATE_WINDOW_NS
            if (a := by(start)) is not None and (b := by(end)) is not None:
                figures["transferred_in_late_window"] = b - a
        return figures

    def _flow_table(self) -> pd.DataFrame:
        """A row per flow: its goodput (the capture after the bottleneck) and its sender's
        side (the capture before it), merged on the flows' ends; the summary's figures (made
        once)."""
        if self.table is not None:
            return self.table
        flows = pd.DataFrame(columns=KEY)
        if self.after_side is not None:
            flows, figures = self._goodput()
            self.out.update(figures)
        if self.before_side is not None:
            frames, figures = self._sender_side()
            retrans, losses = frames["retrans"], frames["losses"]
            flows = flows.merge(retrans, on=KEY, how="outer") if len(flows.columns) > 4 else retrans
            flows = flows.merge(
                losses[[*KEY, "start_ns", "timeouts", "timeout_idle_ns", "fast_retransmits"]],
                on=KEY,
                how="left",
            ).merge(frames["exits"][[*KEY, "exit_ns"]], on=KEY, how="left")
            wide = frames["delivered"].pivot_table(
                index=KEY, columns="cutoff_ns", values="bytes", aggfunc="first"
            )
            wide.columns = [f"delivered_{c // 10**9}s" for c in wide.columns]
            flows = flows.merge(wide.reset_index(), on=KEY, how="left")
            self.out.update(figures)
        self.table = flows
        return flows

    def _since_t0(self, f: Flows, c: int) -> int:
        """Bytes acked in order from T0 to T0 + c, counted as in a capture cut at T0 + c (its
        flows, their base and FIN as far as it goes: the data pass's state then)."""
        at = int(np.searchsorted(f.data.at["ts"], self.t0 + c))
        base, fin = (f.data.at[k][at][f.flows] for k in ("base", "fin"))
        has = f.data.at["has"][at][f.flows]
        q, lo, hi = f.queries, f"{self.name}.t0", f"{self.name}.t0+{c}"
        a_lo = acked(q.answers.highest[q.where[lo]], q.answers.highest_seen[q.where[lo]], base, fin)
        a_hi = acked(q.answers.highest[q.where[hi]], q.answers.highest_seen[q.where[hi]], base, fin)
        return int(np.maximum(a_hi - a_lo, 0)[has].sum())

    def _capacity(self, seen: Seen) -> float:
        """What the bottleneck can carry as TCP payload: its rate times payload / frame of the
        first full-size segment the sender sent (the shaper counts Ethernet frames)."""
        data = self._mine(seen) & seen.mask(src=ip_to_int(self.gen["src"]))
        if not seen.directions["matched"][data].all():
            raise ValueError(f"{self.name}: its data packets were not kept with their IP length")
        largest = {k: v[data] for k, v in seen.largest.items()}
        most = largest["payload_len"].max(initial=0)
        if most <= 0:
            return float("nan")
        full = largest["payload_len"] == most
        first = np.argmin(np.where(full, largest["row"], np.iinfo(np.int64).max))
        return self.rate * int(most) / (int(largest["ip_len"][first]) + ETHERNET_HEADER)

    def cwnd_job(self) -> Callable[[], tuple[pd.DataFrame, pd.DataFrame]] | None:
        """sender_state of its flows (a function of no argument, which the caller may run
        ahead, in a thread of its own); None without a recording of the sender or flows."""
        flows = self._flow_table()
        sender_dir = self.trial_dir / self.gen.get("sender", self.gen["from"])
        # Linux senders record tcp:tcp_probe; FreeBSD senders a SIFTR log (the same table).
        probe = next(
            (p for p in (sender_dir / TCP_PROBE, sender_dir / SIFTR_LOG) if p.exists()),
            sender_dir / TCP_PROBE,
        )
        if not (probe.exists() and len(flows)):
            return None
        return functools.partial(sender_state, probe, flows, self.gen)

    def finish(self, cwnd: Future | None = None) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
        """Its summary and tables; ``cwnd``: cwnd_job's, run ahead (else run here)."""
        flows, out = self._flow_table(), self.out
        tables = {"flows": flows.assign(generator=self.name)}
        job = self.cwnd_job() if cwnd is None else None
        if cwnd is not None or job is not None:
            table, _ = cwnd.result() if cwnd is not None else job()
            tables["cwnd"] = table.assign(generator=self.name)
            out.update(cwnd_events=len(table), congestion_epochs=epoch_counts(table, flows.sport))
        return out, tables


def share_first_syn(analyses: Iterable[Any]) -> None:
    """Give every bulk_tcp analysis the trial's first data SYN: the earliest start of any of
    their data flows (each seen at the capture before its bottleneck, read one at a time), the
    origin of the startup table, and the late joiner's (the generator launched last, after the
    first), the origin of the window every sender's bytes are counted in for Figs. 7 and 8.
    Call it once every capture is read, before finish."""
    bulk = [a for a in analyses if isinstance(a, Analysis)]
    seen = [a for a in bulk if a.first_syn is not None]
    first = min(seen, key=lambda a: a.first_syn[0]) if seen else None
    # The late joiner: the generator launched last, when it was launched after the first.
    late = max(bulk, key=lambda a: a.start) if bulk else None
    late_syn = late.first_syn if late is not None and late.joins_late else None
    for a in bulk:
        a.origin = None if first is None else first.first_syn
        a.origin_clock = None if first is None else first.clock_before
        same_clock = late is not None and late.clock_before == a.clock_after
        a.late_origin = late_syn if same_clock else None


def sender_state(
    probe: Path, flows: pd.DataFrame, gen: dict[str, Any]
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """cwnd/ssthresh/srtt of this generator's data flows from the sender's tcp_probe recording
    (its sockets only: src is the sender), and the congestion epochs (ssthresh reductions)."""
    data = flows[flows.src == ip_to_int(gen["src"])][KEY]
    wanted = data.assign(src=[int_to_ip(v) for v in data.src], dst=[int_to_ip(v) for v in data.dst])
    if probe.name == SIFTR_LOG:
        from analysis.tcp_probe import for_flows

        cwnd = for_flows(read_siftr(probe), wanted)
    else:
        cwnd = read_tcp_probe(probe, flows=wanted, categorical=True)
    return cwnd, congestion_events(cwnd)
