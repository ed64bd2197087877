"""transaction: response time of every transaction (the client's own timing, one row each),
throughput of file transfers, and a cross-check of the client's times against a capture on
the path (first request packet to reply packet, one clock; EFT-SHORT over TCP from its SYN to
the server's FIN, its set-up and teardown counted as in the paper and as the client times it),
with what the capture says about how each file went out (data packets, partial segments, the
receiver's ACKs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from analysis.captures import Captures, Seen, Want
from analysis.lazy import pd
from analysis.pcap import ip_to_int

TCP_FIN, TCP_SYN, TCP_ACK = 0x01, 0x02, 0x10
UDP_HEADER = 20  # the reliable scheme's header (trials/generators/transaction.py)
UDP_REPLY_PAYLOAD = UDP_HEADER + 1  # REPLY: header and the 1-byte reply
CAPTURE_TRANSACTION_COLUMNS = ["local_port", "k", "cap_start_ns", "cap_end_ns"]


def read_client(path: Path) -> tuple[dict[str, str], pd.DataFrame]:
    """The client's `# key=value` header and its rows, with response_ns per transaction."""
    meta: dict[str, str] = {}
    with path.open() as f:
        for line in f:
            if not line.startswith("#"):
                break
            meta.update(w.split("=", 1) for w in line[1:].split() if "=" in w)
    rows = pd.read_csv(path, comment="#", dtype={"start_ns": "int64", "end_ns": "int64"})
    return meta, rows.assign(response_ns=rows.end_ns - rows.start_ns)


def response_stats(ns: pd.Series) -> dict[str, float]:
    ms = ns.to_numpy(dtype="float64") / 1e6
    if not len(ms):
        return {}
    return {
        "response_mean_ms": float(ms.mean()),
        "response_median_ms": float(np.median(ms)),
        "response_p99_ms": float(np.percentile(ms, 99)),
        "response_min_ms": float(ms.min()),
        "response_max_ms": float(ms.max()),
        "response_std_ms": float(ms.std()),
    }


def own_packets(frame: pd.DataFrame, gen: dict[str, Any]) -> pd.DataFrame:
    """The generator's packets in both directions (UDP pair i: server port + i)."""
    pair = {ip_to_int(gen["src"]), ip_to_int(gen["dst"])}
    mine = frame[(frame.proto == gen["proto"]) & frame.src.isin(pair) & frame.dst.isin(pair)]
    return mine[mine.sport.isin(_ports(gen)) | mine.dport.isin(_ports(gen))]


def _ports(gen: dict[str, Any]) -> np.ndarray:
    return np.arange(gen["port"], gen["port"] + (gen["pairs"] if gen["proto"] == 17 else 1))


def capture_transactions(packets: pd.DataFrame, gen: dict[str, Any]) -> pd.DataFrame:
    """Transactions as a capture sees them, per client port in time order: a reply (the
    server's first data, TCP; its REPLY datagram, UDP) ends one; it began with the first
    client packet after the previous reply. EFT-SHORT over TCP (a connection per transaction,
    which the server closes first) begins with its SYN and ends with the server's FIN: the
    paper counts set-up and teardown in each, and its client stops its clock on that FIN.
    A reply with no client packet since the previous one is a duplicate, not a transaction.
    Columns: local_port, k (its rank on that port), cap_start_ns, cap_end_ns."""
    client = ip_to_int(gen["src"])
    tcp = gen["proto"] == 6
    up = packets[packets.src == client]
    down = packets[packets.src != client]
    if tcp:
        # EFT-SHORT's transaction begins with its SYN; the long workloads' connection was set
        # up before the first transaction, so theirs begin with request data.
        short = gen["workload"] == "eft_short"
        syn = (up.tcp_flags & (TCP_SYN | TCP_ACK)) == TCP_SYN
        up = up[(up.payload_len > 0) | (syn & short)]
        ends = (down.tcp_flags & TCP_FIN) > 0 if short else down.payload_len > 0
        down = down[ends].drop_duplicates(["dport", "seq"])
    else:
        down = down[down.payload_len == UDP_REPLY_PAYLOAD]
    # Every port at once (EFT-SHORT has a port per transaction: a loop over ports cost 20 s
    # for 13 000 of them): a key that orders by port, then by time, so that one searchsorted
    # finds, for each reply, the first request on its port after the previous reply there.
    if up.empty or down.empty:
        return pd.DataFrame(columns=CAPTURE_TRANSACTION_COLUMNS)
    up_port, dn_port = up.sport.to_numpy(), down.dport.to_numpy()
    up_ts, dn_ts = up.ts_ns.to_numpy(), down.ts_ns.to_numpy()
    ports = np.unique(np.concatenate([up_port, dn_port]))
    times = np.unique(np.concatenate([up_ts, dn_ts]))
    span = len(times) + 1  # rank 0 stands for "before everything" on a port

    def key(port: np.ndarray, ts: np.ndarray) -> np.ndarray:
        return np.searchsorted(ports, port).astype(np.int64) * span + np.searchsorted(times, ts) + 1

    up_key = key(up_port, up_ts)
    by_key = np.argsort(up_key, kind="stable")
    start_key, start_ts, start_port = up_key[by_key], up_ts[by_key], up_port[by_key]
    order = np.argsort(dn_port, kind="stable")  # each port's replies in capture order
    end_port, end_ts = dn_port[order], dn_ts[order]
    first_of_port = np.concatenate(([True], end_port[1:] != end_port[:-1]))
    prev_key = key(end_port, np.concatenate((end_ts[:1], end_ts[:-1])))
    prev_key[first_of_port] = np.searchsorted(ports, end_port[first_of_port]) * span
    first = np.searchsorted(start_key, prev_key, side="right")  # first request after prev
    valid = first < len(start_key)
    valid[valid] &= start_port[first[valid]] == end_port[valid]
    first, end_ts, end_port = first[valid], end_ts[valid], end_port[valid]
    # A reply with no request between the previous reply and itself (a duplicate, or one
    # whose request the capture did not see) ends no transaction.
    ok = start_ts[first] < end_ts
    if not ok.any():
        return pd.DataFrame(columns=CAPTURE_TRANSACTION_COLUMNS)
    frame = pd.DataFrame(
        {
            "local_port": end_port[ok].astype(np.int64),
            "cap_start_ns": start_ts[first[ok]],
            "cap_end_ns": end_ts[ok],
        }
    ).sort_values("cap_start_ns", kind="stable", ignore_index=True)
    return frame.assign(k=frame.groupby("local_port").cumcount())


def cross_check(rows: pd.DataFrame, caps_tx: pd.DataFrame) -> pd.DataFrame:
    """The client's rows joined to the capture's transactions by (port, rank on the port);
    a pair counts only where the two overlap in time (a capture that missed a packet would
    otherwise shift every later pair)."""
    ok = rows[rows.ok == 1].sort_values("start_ns", kind="stable")
    ok = ok.assign(k=ok.groupby("local_port").cumcount())
    joined = ok.merge(caps_tx, on=["local_port", "k"], how="inner")
    overlap = (joined.cap_start_ns < joined.end_ns) & (joined.cap_end_ns > joined.start_ns)
    joined = joined[overlap]
    return joined.assign(
        cap_response_ns=joined.cap_end_ns - joined.cap_start_ns,
        excess_ns=joined.response_ns - (joined.cap_end_ns - joined.cap_start_ns),
    )


def transfer_packets(packets: pd.DataFrame, gen: dict[str, Any], tx: pd.DataFrame) -> dict:
    """FILETRANSF-LONG over TCP, per transfer seen in the capture: data packets from the
    client, those shorter than the largest (partial frames), pure ACKs from the server."""
    if gen["proto"] != 6 or tx.empty:
        return {}
    client = ip_to_int(gen["src"])
    data = packets[(packets.src == client) & (packets.payload_len > 0)]
    acks = packets[(packets.src != client) & (packets.payload_len == 0)]
    full = int(data.payload_len.max()) if len(data) else 0
    bounds = np.sort(tx.cap_start_ns.to_numpy())
    ends = tx.cap_end_ns.to_numpy()[np.argsort(tx.cap_start_ns.to_numpy())]

    def per_transfer(ts: np.ndarray) -> np.ndarray:
        i = np.searchsorted(bounds, ts, side="right") - 1
        inside = (i >= 0) & (ts <= ends[np.maximum(i, 0)])
        return np.bincount(i[inside], minlength=len(bounds))

    partial = data[data.payload_len < full]
    return {
        "largest_segment_bytes": full,
        "data_packets_per_transfer": float(per_transfer(data.ts_ns.to_numpy()).mean()),
        "partial_segments_per_transfer": float(per_transfer(partial.ts_ns.to_numpy()).mean()),
        "server_acks_per_transfer": float(per_transfer(acks.ts_ns.to_numpy()).mean()),
    }


def nearest_capture(caps: Captures, gen: dict[str, Any]) -> str | None:
    """The capture point on the path nearest to the client (its clock is the client's on the
    virtual rack; on a physical rack the inventory says whether they share one)."""
    pos = caps.positions(gen["path"]["hops"])
    return min(pos, key=pos.get) if pos else None  # type: ignore[arg-type]


class Analysis:
    """One transaction generator's analysis (see analysis/trial.py): the client's rows, and
    its packets at the capture point nearest to the client, as a small frame."""

    def __init__(
        self, trial_dir: Path, record: dict, name: str, gen: dict[str, Any], caps: Captures
    ) -> None:
        self.name, self.gen = name, gen
        self.path = trial_dir / gen["client_csv"]
        self.point = nearest_capture(caps, gen)
        self.packets = None

    def wants(self) -> dict[str, Want]:
        return {self.point: Want()} if self.point and self.path.exists() else {}

    def ask(self, seen: Seen) -> None:
        pass

    def take(self, seen: Seen) -> None:
        pair = {ip_to_int(self.gen["src"]), ip_to_int(self.gen["dst"])}
        mine = seen.mask(proto=self.gen["proto"], src=pair, dst=pair)
        ports = seen.mask(sport=_ports(self.gen)) | seen.mask(dport=_ports(self.gen))
        self.packets = seen.packets(mine & ports)

    def finish(self) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
        gen = self.gen
        out: dict[str, Any] = {
            "type": "transaction",
            "workload": gen["workload"],
            "protocol": gen["protocol"],
        }
        path = self.path
        if not path.exists():
            out["skipped"] = f"no client rows ({gen['client_csv']})"
            return out, {}
        meta, rows = read_client(path)
        good = rows[rows.ok == 1]
        out.update(
            transactions=len(rows),
            failed=int((rows.ok != 1).sum()),
            retransmissions=int(rows.retrans.sum()),
            kernel_sndbuf=int(meta.get("sndbuf", 0)),
            kernel_rcvbuf=int(meta.get("rcvbuf", 0)),
            mss=int(meta.get("mss", 0)),
            client_cpu_s=float(meta.get("user_s", 0)) + float(meta.get("sys_s", 0)),
            **response_stats(good.response_ns),
        )
        if len(good):
            span = (good.end_ns.max() - good.start_ns.min()) / 1e9
            out["transactions_per_s"] = len(good) / span if span > 0 else float("nan")
        if gen["workload"] == "filetransf_long" and len(good):
            mbps = good.bytes * 8 / good.response_ns * 1e3  # bit/ns -> Mbit/s
            out.update(
                throughput_mean_mbps=float(mbps.mean()),
                throughput_median_mbps=float(mbps.median()),
                # Every byte over the whole time the transfers took (pairs overlap).
                throughput_aggregate_mbps=float(
                    good.bytes.sum() * 8 / (good.end_ns.max() - good.start_ns.min()) * 1e3
                ),
            )
        tables = {"transactions": rows.assign(generator=self.name)}
        point = self.point
        if point is None:
            out["capture_check_skipped"] = "no capture point on the path"
            return out, tables
        packets = pd.DataFrame(self.packets, copy=False)
        caps_tx = capture_transactions(packets, gen)
        check = cross_check(rows, caps_tx)
        excess_us = check.excess_ns.to_numpy(dtype="float64") / 1e3
        out.update(
            capture_point=point,
            capture_transactions=len(caps_tx),
            capture_matched=len(check),
            capture_matched_share=len(check) / max(1, len(good)),
        )
        if len(check):
            out.update(
                capture_response_median_ms=float(check.cap_response_ns.median() / 1e6),
                client_excess_median_us=float(np.median(excess_us)),
                client_excess_p99_us=float(np.percentile(excess_us, 99)),
                client_excess_min_us=float(excess_us.min()),
            )
        if gen["workload"] == "filetransf_long":
            out.update(transfer_packets(packets, gen, caps_tx))
        tables["transaction_check"] = check[
            ["pair", "seq", "local_port", "response_ns", "cap_response_ns", "excess_ns"]
        ].assign(generator=self.name)
        return out, tables
