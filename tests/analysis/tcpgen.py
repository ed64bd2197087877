"""Synthetic trial captures with real TCP dynamics, written vectorized (millions of packets in
seconds): a capture before a bottleneck router and one after it, on one clock.

Each TCP flow: SYN / SYN-ACK / ACK handshake, MSS-sized data segments with the timestamp
option, an ISN near 2**32 so that sequence numbers wrap, random losses at the bottleneck
(the original is in the capture before the router, not in the one after), a duplicate ACK
for every segment after it and a fast retransmission about an RTT later, delayed ACKs
(every second in-order segment; immediate ACKs for out-of-order segments and for the one
that fills the hole), FIN and its ACK. With ``iperf3``, each flow is an iperf3 data
connection: its sender opens a control connection to the same server port first (cookie,
parameters, the server's CREATE_STREAMS: three round trips), the data SYN follows, and the
control connection stays open through the transfer (TEST_START and TEST_RUNNING two round trips
after the data SYN, when the data begins; the results exchanged after its FIN), as iperf3's
client does (the data connection's 37-byte cookie is left out). With ``socket``, each flow's
sender writes from connect, as hostside/traffic/bulk_socket.py does: no control connection, its
first data segment one round trip after its SYN, right after the handshake's last ACK. A UDP
constant-bit-rate stream shares the bottleneck. One-way delay = propagation + a queue that
wanders. By default each flow and the UDP stream has a queue of its own (each one FIFO:
departures in its arrival order, but flows overtake one another, which tests of reordered
departures need); ``shared_queue`` gives them one FIFO queue, as at a real bottleneck router:
the capture after it lists every crossing packet in the order the capture before it did.

The generator knows the truth for every flow (``Truth``): unique bytes, retransmitted packets
and bytes, its launch and data SYN, the bytes its ACKs acknowledge in order as they reach the
sender, the bytes in order past the capture after the router, UDP packets lost.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MSS = 1448
SNAPLEN = 96
T0_NS = 1_763_700_000 * 10**9
TCP_HDR = 32  # 20 + NOP NOP timestamps
_ETH = bytes.fromhex("020000000002020000000001") + b"\x08\x00"
SYN, ACK, PSH, FIN = 0x02, 0x10, 0x08, 0x01


@dataclass
class Truth:
    """What the generator put in the captures, per TCP flow and for the UDP stream."""

    flows: list[dict] = field(default_factory=list)  # src, dst, sport, dport, bytes, retx...
    udp: tuple[int, int] = (0, 0)  # the UDP stream's src and dst
    udp_sent: int = 0
    udp_lost: int = 0
    before_packets: int = 0
    after_packets: int = 0
    # Every packet through the bottleneck's queue: when it entered (capture time before the
    # router plus the link's delay), when it left (-1: dropped) and its frame's bytes.
    queue_parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    # Per TCP flow: when its ACKs reach the sender (the capture before the router), with
    # their values, and when it sent its retransmissions.
    acks_at_sender: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    retransmitted_at: list[np.ndarray] = field(default_factory=list)
    # Per TCP flow: when its ACKs reach the sender and the bytes each acknowledges in order.
    acked_at_sender: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    # Per TCP flow: when each data segment passed the capture after the router, and the bytes
    # in order (contiguous from the first) after it: the receiver's in-order point.
    in_order_after: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)

    def acked_by(self, t_ns: int, flows: list[int] | None = None) -> int:
        """Bytes every TCP flow's receiver (or those of ``flows``, by index) had acknowledged in
        order, as the capture before the router sees it, by t_ns (ACKs at t_ns count)."""
        got = 0
        for f, (at, acked) in enumerate(self.acked_at_sender):
            if flows is not None and f not in flows:
                continue
            seen = acked[at <= t_ns]
            got += int(seen.max()) if len(seen) else 0
        return got

    def passed_by(self, t_ns: int, flows: list[int] | None = None) -> int:
        """Bytes of every TCP flow (or of ``flows``, by index) that had passed the capture
        after the router in order (contiguous from each flow's first byte) by t_ns."""
        got = 0
        for f, (at, point) in enumerate(self.in_order_after):
            if flows is None or f in flows:
                seen = point[at <= t_ns]
                got += int(seen.max()) if len(seen) else 0
        return got

    def queue(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(entered, left or -1, frame bytes) of every packet through the queue, by entry."""
        entered, left, frame = (np.concatenate(c) for c in zip(*self.queue_parts, strict=True))
        order = np.argsort(entered, kind="stable")
        return entered[order], left[order], frame[order]

    @property
    def crossing(self) -> list[int]:
        """src << 32 | dst of every direction that sends through the bottleneck (the TCP
        flows' data, the UDP stream), as a trial's record names its generators' ends."""
        ends = [(f["src"], f["dst"]) for f in self.flows] + [self.udp]
        return [src << 32 | dst for src, dst in ends]


@dataclass
class _Packets:
    """Column arrays of packets of one kind; concatenated and sorted by time at the end."""

    cols: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def add(self, **arrays) -> None:
        arrays.setdefault("proto", 6)
        n = len(arrays["ts"])
        for k, v in arrays.items():
            self.cols.setdefault(k, []).append(np.broadcast_to(v, (n,)).astype(np.int64))

    def frame(self) -> dict[str, np.ndarray]:
        out = {k: np.concatenate(v) for k, v in self.cols.items()}
        order = np.argsort(out["ts"], kind="stable")
        return {k: v[order] for k, v in out.items()}


def _addr(a: str) -> int:
    return int.from_bytes(bytes(int(x) for x in a.split(".")), "big")


def _flow(
    rng: np.random.Generator,
    f: int,
    segments: int,
    loss: float,
    gap_ns: int,
    delay_ns: int,
    before: _Packets,
    after: _Packets,
    truth: Truth,
    queue_at=None,
    iperf3: bool = False,
    launch: int | None = None,
    socket: bool = False,
) -> None:
    src, dst = _addr(f"198.18.1.{10 + f}"), _addr(f"198.18.2.{10 + f}")
    sport, dport = 40000 + f, 5201
    isn = int(2**32 - rng.integers(1, 60_000_000))  # wraps early in the transfer
    risn = int(rng.integers(0, 2**32))
    launch = T0_NS + f * 7_000_000 if launch is None else launch
    rev = delay_ns // 2  # receiver -> router -> sender, no queue on the way back
    rtt = delay_ns + rev  # the round trip of an empty queue, as the sender side sees it
    # iperf3's data SYN comes three round trips after its control connection's SYN; its data
    # begins two round trips after the data SYN (here 3 * delay_ns = 2 * rtt: the same).
    start = launch + (_CONTROL_RTTS * rtt if iperf3 else 0)
    # The handshake's SYN-ACK and last ACK at the sender side, after the SYN: a socket
    # sender's data leaves as the SYN-ACK is in, right behind that ACK.
    synack, handshake = (rtt - 2, rtt - 1) if socket else (delay_ns, 2 * delay_ns)

    # The third duplicate ACK reaches the sender about an RTT after the segment after the
    # loss: the fast retransmission goes out `window` segments after the lost one.
    window = max(4, int(2 * (delay_ns + 20_000_000) // gap_ns))
    # Losses: at most one outstanding (spaced by more than a window), none near the end.
    lost = np.flatnonzero(rng.random(segments) < loss)
    lost = lost[lost < segments - window - 4]
    if len(lost):
        spaced = [int(lost[0])]
        for j in lost[1:]:  # a few thousand at most
            if j - spaced[-1] > window + 8:
                spaced.append(int(j))
        lost = np.array(spaced, dtype=np.int64)
    # Send order: every segment once, and each lost one again `window` segments later.
    seg = np.r_[np.arange(segments), lost]
    key = np.r_[np.arange(segments) * 2.0, (lost + window) * 2.0 + 1]
    order = np.argsort(key, kind="stable")
    seg = seg[order]
    retx = order >= segments
    n = len(seg)
    first = start + (rtt if socket else 3 * delay_ns)
    t_send = first + np.arange(n, dtype=np.int64) * gap_ns
    t_send += rng.integers(0, gap_ns // 4, n)
    dropped = np.zeros(n, dtype=bool)
    dropped[np.flatnonzero(~retx)[np.isin(seg[~retx], lost)]] = True
    if queue_at is None:  # this flow's own queue: a slow random walk in [0, 40 ms]
        walk = np.cumsum(rng.normal(0, 20_000, n)).astype(np.int64)
        queue = np.abs((walk + 20_000_000) % 80_000_000 - 40_000_000)
        t_router = np.maximum.accumulate(t_send + delay_ns + queue)
        t_router += np.arange(n)  # strictly increasing
    else:  # the shared queue: departures stay in arrival order across flows
        t_router = t_send + delay_ns + queue_at(t_send)

    # Receiver: ACK value after each arrival (send order minus drops).
    arrived = ~dropped
    a_seg, a_retx, t_arr = seg[arrived], retx[arrived], t_router[arrived]
    # Between the arrival of j + 1 and that of j's retransmission, segment j is missing
    # (holes never overlap: the next loss is >= 8 segments on, after the retransmission).
    originals = np.flatnonzero(~a_retx)
    first = originals[np.searchsorted(a_seg[originals], lost)]
    fill = np.flatnonzero(a_retx)  # retransmissions arrive in the order of their losses
    mark = np.zeros(len(a_seg) + 1, dtype=np.int64)
    np.add.at(mark, first, 1)
    np.add.at(mark, fill, -1)
    inside = np.cumsum(mark[:-1]) > 0
    hole = np.full(len(a_seg), -1, dtype=np.int64)  # a flow without losses has no hole
    if len(lost):
        which = np.maximum(np.cumsum(np.isin(np.arange(len(a_seg)), first)) - 1, 0)
        hole = np.where(inside, lost[which], -1)
    in_order = hole < 0
    filled = a_retx  # the retransmission fills the hole: all that arrived since is acked
    ack_seg = np.where(in_order, np.maximum.accumulate(a_seg) + 1, hole)
    # Delayed ACK: every second in-order segment; immediate when out of order or filling.
    count = np.cumsum(in_order & ~filled)
    send_ack = (~in_order) | filled | ((count % 2) == 0) & in_order
    send_ack[-1] = True
    t_ack = t_arr[send_ack] + 40_000  # receiver turnaround
    ack_val = (isn + 1 + ack_seg[send_ack] * MSS) % 2**32

    frame = np.full(n, 14 + 20 + TCP_HDR + MSS, dtype=np.int64)
    truth.queue_parts.append((t_send + delay_ns, np.where(dropped, -1, t_router), frame))
    truth.acks_at_sender.append((t_ack + rev, ack_val))
    truth.retransmitted_at.append(t_send[retx])
    seq = (isn + 1 + seg * MSS) % 2**32
    ip_id = np.arange(n) + 1
    ts_val = (t_send // 1_000_000) % 2**32
    data = {"src": src, "dst": dst, "sport": sport, "dport": dport, "seq": seq}
    data |= {"ack": risn + 1, "flags": ACK | PSH, "plen": MSS, "ip_id": ip_id, "tsv": ts_val}
    before.add(ts=t_send, **data)
    after.add(ts=t_router[arrived], **{k: v[arrived] if np.ndim(v) else v for k, v in data.items()})
    m = len(t_ack)
    acks = {"src": dst, "dst": src, "sport": dport, "dport": sport, "seq": risn + 1}
    acks |= {"ack": ack_val, "flags": ACK, "plen": 0, "ip_id": np.arange(m) + 1, "tsv": t_ack}
    after.add(ts=t_ack + 1000, **acks)
    before.add(ts=t_ack + rev, **acks)

    # Handshake and teardown, seen on both sides.
    end_seq = (isn + 1 + segments * MSS) % 2**32
    t_fin = max(t_send[-1], t_ack[-1] + rev) + 1_000_000
    ctl = [  # ts at the sender side, direction, seq, ack, flags
        (start, 0, isn, 0, SYN),
        (start + synack, 1, risn, isn + 1, SYN | ACK),
        (start + handshake, 0, isn + 1, risn + 1, ACK),
        (t_fin, 0, end_seq, risn + 1, FIN | ACK),
        (t_fin + delay_ns, 1, risn + 1, (end_seq + 1) % 2**32, FIN | ACK),
        (t_fin + 2 * delay_ns, 0, (end_seq + 1) % 2**32, risn + 2, ACK),
    ]
    for ts, back, s, a, fl in ctl:
        ends = (dst, src, dport, sport) if back else (src, dst, sport, dport)
        pk = dict(zip(("src", "dst", "sport", "dport"), ends, strict=True))
        pk |= {"seq": s, "ack": a % 2**32, "flags": fl, "plen": 0, "ip_id": 0, "tsv": 0}
        before.add(ts=np.array([ts]), **pk)
        after.add(ts=np.array([ts + (rev if back else delay_ns) // 2]), **pk)
    # In-order bytes acknowledged as the ACKs reach the sender (the FIN's ACK adds none).
    truth.acked_at_sender.append((t_ack + rev, ack_seg[send_ack] * MSS))
    truth.in_order_after.append((t_arr, ack_seg * MSS))
    control = {}
    if iperf3:
        control = _iperf3_control(
            f, src, dst, dport, launch, start, t_fin + 2 * delay_ns, rtt, delay_ns, before, after
        )
    truth.flows.append(
        {
            "src": src,
            "dst": dst,
            "sport": sport,
            "dport": dport,
            "bytes": segments * MSS,
            "retransmitted_packets": int(retx.sum()),
            "retransmitted_bytes": int(retx.sum()) * MSS,
            "data_packets": n,
            "launch_ns": launch,
            "syn_ns": start,
            "first_ack_ns": int(t_ack[0] + rev),
            "rtt_ns": rtt,
            **control,
        }
    )


_CONTROL_RTTS = 3  # iperf3: cookie, parameters, CREATE_STREAMS before the data SYN
_COOKIE, _PARAMS, _RESULTS = 37, 160, 400  # bytes of iperf3's control messages (about)


def _iperf3_control(
    f: int, src: int, dst: int, dport: int, launch: int, data_syn: int, data_done: int,
    rtt: int, delay_ns: int, before: _Packets, after: _Packets,
) -> dict:  # fmt: skip
    """iperf3's control connection of flow ``f`` (client src, server dst:dport), as its client
    drives it: connect at ``launch`` and send the cookie; the server's PARAM_EXCHANGE, the
    client's parameters; the server's CREATE_STREAMS, just before ``data_syn``; TEST_START
    and TEST_RUNNING two round trips after it; after ``data_done`` TEST_END, the results both
    ways, and both FINs. Every message is acknowledged (piggybacked or a pure ACK). Returns
    the connection's client port and its SYN time."""
    sport, cisn, sisn = 39000 + f, 1_000_000 + 17 * f, 2_000_000 + 29 * f
    c = s = 0  # bytes each side has sent after its SYN
    rows = []  # (ts at the sender side, from the server, seq, ack, flags, payload)

    def send(t: int, back: bool, n: int, flags: int = ACK | PSH) -> None:
        nonlocal c, s
        seq, ack = (sisn + 1 + s, cisn + 1 + c) if back else (cisn + 1 + c, sisn + 1 + s)
        rows.append((t, back, seq, ack, flags, n))
        if back:
            s += n
        else:
            c += n

    rows.append((launch, False, cisn, 0, SYN, 0))
    rows.append((launch + rtt, True, sisn, cisn + 1, SYN | ACK, 0))
    send(launch + rtt, False, 0, ACK)
    send(launch + rtt, False, _COOKIE)
    send(launch + 2 * rtt, True, 1)  # PARAM_EXCHANGE
    send(launch + 2 * rtt, False, _PARAMS)
    send(data_syn - 50_000, True, 1)  # CREATE_STREAMS
    send(data_syn - 10_000, False, 0, ACK)
    send(data_syn + 2 * rtt - 100_000, True, 2)  # TEST_START, TEST_RUNNING
    send(data_syn + 2 * rtt - 60_000, False, 0, ACK)
    send(data_done, False, 1)  # TEST_END
    send(data_done + rtt, True, 1)  # EXCHANGE_RESULTS
    send(data_done + rtt, False, _RESULTS)
    send(data_done + 2 * rtt, True, _RESULTS + 1)  # its results, DISPLAY_RESULTS
    send(data_done + 2 * rtt, False, 1)  # IPERF_DONE
    send(data_done + 2 * rtt + 1000, False, 0, FIN | ACK)
    rows.append((data_done + 3 * rtt, True, sisn + 1 + s, cisn + 2 + c, FIN | ACK, 0))
    rows.append((data_done + 3 * rtt, False, cisn + 2 + c, sisn + 2 + s, ACK, 0))
    for ts, back, seq, ack, flags, n in rows:
        ends = (dst, src, dport, sport) if back else (src, dst, sport, dport)
        pk = dict(zip(("src", "dst", "sport", "dport"), ends, strict=True))
        pk |= {"seq": seq % 2**32, "ack": ack % 2**32, "flags": flags, "plen": n}
        pk |= {"ip_id": 0, "tsv": 0}
        before.add(ts=np.array([ts]), **pk)
        after.add(ts=np.array([ts + (delay_ns // 2 if back else delay_ns) // 2]), **pk)
    return {"control_sport": sport, "control_syn_ns": launch}


def _udp(
    rng, packets: int, loss: float, delay_ns: int, before, after, truth, queue_at=None
) -> None:
    t = T0_NS + 5_000_000 + np.arange(packets, dtype=np.int64) * 1_000_000
    ok = rng.random(packets) >= loss
    if queue_at is None:
        queue = rng.integers(0, 5_000_000, packets)
        t_out = np.maximum.accumulate(t + delay_ns + queue) + np.arange(packets)
    else:
        t_out = t + delay_ns + queue_at(t)
    pk = {"src": _addr("198.18.1.99"), "dst": _addr("198.18.2.99"), "sport": 4000, "dport": 4001}
    pk |= {"seq": 0, "ack": 0, "flags": 0, "plen": 172, "ip_id": np.arange(packets) % 2**16}
    pk["tsv"] = np.arange(packets)  # a sequence number in the payload
    before.add(ts=t, proto=17, **pk)
    after.add(ts=t_out[ok], proto=17, **{k: v[ok] if np.ndim(v) else v for k, v in pk.items()})
    truth.udp_sent, truth.udp_lost = packets, int((~ok).sum())
    frame = np.full(packets, 14 + 20 + 8 + pk["plen"], dtype=np.int64)
    truth.queue_parts.append((t + delay_ns, np.where(ok, t_out, -1), frame))
    truth.udp = (pk["src"], pk["dst"])


def _shared_queue(rng: np.random.Generator, end_ns: int):
    """The queueing delay of one FIFO queue at each arrival time: a slow random walk in
    [0, 40 ms] on a 1 ms grid, linear in between. Its slope stays far below 1 (steps of about
    40 µs a ms), so arrival + delay grows with arrival: departures keep arrival order."""
    grid = np.arange(T0_NS, end_ns + 2_000_000, 1_000_000, dtype=np.int64)
    walk = np.cumsum(rng.normal(0, 40_000, len(grid)))
    level = np.abs((walk + 20_000_000) % 80_000_000 - 40_000_000)

    def queue_at(t: np.ndarray) -> np.ndarray:
        return np.interp(t, grid, level).astype(np.int64)

    return queue_at


def _records(p: dict[str, np.ndarray]) -> bytes:
    """Ethernet/IPv4/TCP-or-UDP records (snaplen 96, ns timestamps) of one block of packets."""
    n = len(p["ts"])
    tcp = p["proto"] == 6
    ip_len = 20 + np.where(tcp, TCP_HDR, 8) + p["plen"]
    wire = 14 + ip_len
    cap = np.minimum(wire, SNAPLEN)
    width = 16 + SNAPLEN
    rows = np.zeros((n, width), dtype=np.uint8)

    def put(col: int, values: np.ndarray, fmt: str, sel=slice(None)) -> None:
        size = np.dtype(fmt).itemsize
        v = np.broadcast_to(values, (n,))[sel]
        rows[sel, col : col + size] = v.astype(fmt).view(np.uint8).reshape(len(v), size)

    put(0, p["ts"] // 10**9, "<u4")
    put(4, p["ts"] % 10**9, "<u4")
    put(8, cap, "<u4")
    put(12, wire, "<u4")
    rows[:, 16:30] = np.frombuffer(_ETH, np.uint8)
    ip = 30
    rows[:, ip] = 0x45
    put(ip + 2, ip_len, ">u2")
    put(ip + 4, p["ip_id"] % 2**16, ">u2")
    rows[:, ip + 6] = 0x40  # DF
    rows[:, ip + 8] = 64
    rows[:, ip + 9] = p["proto"]
    put(ip + 12, p["src"], ">u4")
    put(ip + 16, p["dst"], ">u4")
    l4 = ip + 20
    put(l4, p["sport"], ">u2")
    put(l4 + 2, p["dport"], ">u2")
    put(l4 + 4, p["seq"] % 2**32, ">u4", tcp)
    put(l4 + 8, p["ack"] % 2**32, ">u4", tcp)
    rows[tcp, l4 + 12] = (TCP_HDR // 4) << 4
    rows[tcp, l4 + 13] = p["flags"][tcp]
    rows[tcp, l4 + 14 : l4 + 16] = 0xFF  # window
    rows[tcp, l4 + 20 : l4 + 24] = [1, 1, 8, 10]  # NOP NOP timestamps
    put(l4 + 24, p["tsv"] % 2**32, ">u4", tcp)
    udp = ~tcp
    put(l4 + 4, 8 + p["plen"], ">u2", udp)  # UDP length; checksum 0
    put(l4 + 12, p["tsv"] % 2**32, ">u4", udp)  # a sequence number in the payload head
    keep = np.arange(width)[None, :] < (16 + cap)[:, None]  # ACKs: 66-byte records
    return rows[keep].tobytes()


def _write(path: Path, p: dict[str, np.ndarray]) -> int:
    n = len(p["ts"])
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, SNAPLEN, 1))
        step = 250_000
        for i in range(0, n, step):
            f.write(_records({k: v[i : i + step] for k, v in p.items()}))
    return n


def generate(
    before_path: Path,
    after_path: Path,
    *,
    packets: int,
    flows: int = 8,
    loss: float = 0.0005,
    seed: int = 1,
    delay_ns: int = 25_000_000,
    duration_ns: int = 60 * 10**9,
    shared_queue: bool = False,
    iperf3: bool = False,
    launches_ns: list[int] | None = None,
    socket: bool = False,
) -> Truth:
    """Write the two captures; ``packets`` is the approximate count in the one before the
    router (data ~ 2/3, ACKs ~ 1/3, a UDP stream at 1 kpkt/s) over about ``duration_ns``;
    ``shared_queue``: one FIFO queue for every flow (else one per flow: see above);
    ``iperf3``: each flow an iperf3 data connection behind its control connection;
    ``socket``: each flow's sender writing from connect (see above);
    ``launches_ns``: when each flow's sender starts, after T0 (default: 7 ms apart)."""
    rng = np.random.default_rng(seed)
    before, after, truth = _Packets(), _Packets(), Truth()
    per_flow = max(int(packets * 0.66 / flows), 50)
    gap = max(int(duration_ns // per_flow), 2_000)
    ends = T0_NS + flows * 7_000_000 + 4 * delay_ns + 2 * per_flow * gap  # past every send
    ends += _CONTROL_RTTS * 2 * delay_ns if iperf3 else 0
    ends += max(launches_ns) if launches_ns else 0
    queue_at = _shared_queue(rng, ends) if shared_queue else None
    for f in range(flows):
        at = None if launches_ns is None else T0_NS + launches_ns[f]
        _flow(
            rng, f, per_flow, loss, gap, delay_ns, before, after, truth, queue_at, iperf3, at,
            socket,
        )  # fmt: skip
    duration_ms = int(per_flow * gap / 1e6) + 1
    _udp(rng, duration_ms, loss * 5, delay_ns, before, after, truth, queue_at)
    truth.before_packets = _write(before_path, before.frame())
    truth.after_packets = _write(after_path, after.frame())
    return truth
