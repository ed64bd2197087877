"""The per-flow DiffServ markers of seed 004 (Neglia, Bianchi, Sottile): NM, APM, WPM, MPM.

Pure state machines, standard library only and no project imports: the edge router's
NFQUEUE program (edge_marker.py beside it) runs this very file, and the tests feed it
packet sequences with known markings.

A marker sees the packets of one direction of a TCP connection (a flow: the 5-tuple) at the
ingress edge and gives each a drop precedence, 1 (lowest drop) to 3; edge_marker.py writes
the DSCP the controller gives it for that precedence (AF<c><p> of the configured class c, from
core/dscp.py). Two-colour markers give IN = 1, OUT = 2; MPM gives
1 to WPM's protected packets, 3 to APM's probes, 2 to the rest.

Definitions (EXPERIMENTS.md §4, paper §III):

- State is created by a SYN. A flow first seen without a SYN (it began before the marker)
  starts there: that packet counts as new.
- Only packets with payload drive the state ("non-empty packets"). Packets without payload
  (SYN, SYN-ACK, pure ACKs, a bare FIN or RST) are IN (precedence 1) and change nothing but
  the flow's creation on SYN.
- A data packet is a retransmission when SN <= SN_h, sequence numbers compared modulo 2^32
  (a is after b when (a - b) mod 2^32 is in [1, 2^31)); else it is new. The paper numbers
  packets (ns-2); TCP numbers bytes, so the state keeps the end of the highest data sent
  (`snd_max`: ISN + 1 after the SYN, then max of seq + payload) and a packet is new when its
  seq is not before snd_max. For whole segments that is exactly SN > SN_h; a retransmission
  repacketized to start inside an earlier segment is still a retransmission.
- APM: new packet: L_IN += 1; IN while L_IN < A_IN, else OUT, L_IN := 0 and
  A_IN := 2 A_IN + 1. Retransmission: A_IN := α A_IN + (1 - α) L_IN, L_IN := 0, IN.
  A_0 = 7, α = 0.5. So a flow's first OUT packet is its 7th new data packet.
- WPM (the ingress-router variant, N_s = N_a = 5): the first N_s data packets of a flow are
  IN; a retransmission (the loss it reveals) makes itself and the next N_a - 1 data packets
  IN (N_a in all); every other data packet is OUT.
- MPM: WPM and APM both run, unchanged, on every packet; the colour is 1 if WPM protects
  the packet, else 3 if APM marks it OUT (a probe), else 2. (APM's state advances as it
  would alone even when WPM's protection wins over a probe: the paper merges the two
  schemes' decisions, not their states.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

SEQ_MOD = 1 << 32
HALF = 1 << 31
# TCP flags
FIN, SYN, RST, ACK = 0x01, 0x02, 0x04, 0x10

IN, OUT = 1, 2  # two-colour drop precedences
PROTECTED, NORMAL, PROBE = 1, 2, 3  # MPM's three colours


def seq_after(a: int, b: int) -> bool:
    """a comes after b in TCP sequence space (RFC 793 arithmetic, modulo 2^32)."""
    return 0 < (a - b) % SEQ_MOD < HALF


@dataclass
class ApmState:
    a_in: float
    l_in: int = 0

    def data(self, retransmission: bool, alpha: float) -> int:
        if retransmission:
            self.a_in = alpha * self.a_in + (1 - alpha) * self.l_in
            self.l_in = 0
            return IN
        self.l_in += 1
        if self.l_in < self.a_in:
            return IN
        self.l_in = 0
        self.a_in = 2 * self.a_in + 1
        return OUT


@dataclass
class WpmState:
    protect_left: int

    def data(self, retransmission: bool, n_a: int) -> int:
        if retransmission:
            self.protect_left = n_a
        if self.protect_left > 0:
            self.protect_left -= 1
            return IN
        return OUT


@dataclass
class Flow:
    """One flow's state: snd_max (shared by the machines it runs) and each machine's own."""

    snd_max: int
    last_ns: int
    apm: ApmState | None = None
    wpm: WpmState | None = None


@dataclass
class Marker:
    """A per-flow marker: `mark(key, seq, payload_len, flags, now_ns)` -> drop precedence.

    `key` is any hashable 5-tuple (src, dst, proto, sport, dport); `flags` the TCP flags
    byte. `counts[p]` counts the packets given precedence p; `retransmissions` the data
    packets taken for retransmissions; flows idle longer than `idle_ns` are forgotten by
    `expire` (a later packet starts a new flow as described in the module docstring)."""

    kind: str = "NM"
    a0: float = 7.0
    alpha: float = 0.5
    n_s: int = 5
    n_a: int = 5
    idle_ns: int = 120 * 10**9
    flows: dict = field(default_factory=dict)
    counts: dict = field(default_factory=lambda: {1: 0, 2: 0, 3: 0})
    retransmissions: int = 0
    control: int = 0

    KINDS = ("NM", "APM", "WPM", "MPM")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise ValueError(f"marker {self.kind!r}: allowed {', '.join(self.KINDS)}")
        if not 0 <= self.alpha < 1:
            raise ValueError(f"alpha {self.alpha}: allowed 0 <= alpha < 1")
        if self.a0 <= 0 or self.n_s < 0 or self.n_a < 0:
            raise ValueError("a0 must be > 0, n_s and n_a >= 0")

    def _new_flow(self, snd_max: int, now_ns: int) -> Flow:
        flow = Flow(snd_max=snd_max, last_ns=now_ns)
        if self.kind in ("APM", "MPM"):
            flow.apm = ApmState(a_in=self.a0)
        if self.kind in ("WPM", "MPM"):
            flow.wpm = WpmState(protect_left=self.n_s)
        return flow

    def mark(self, key: object, seq: int, payload_len: int, flags: int, now_ns: int = 0) -> int:
        p = self._mark(key, seq % SEQ_MOD, payload_len, flags, now_ns)
        self.counts[p] += 1
        return p

    def _mark(self, key: object, seq: int, payload_len: int, flags: int, now_ns: int) -> int:
        if self.kind == "NM":
            return IN
        flow = self.flows.get(key)
        if flags & SYN:
            # A SYN (or its retransmission, or a new connection on a reused 5-tuple) starts
            # the flow afresh: SN_h := ISN, the first data byte is ISN + 1.
            flow = self.flows[key] = self._new_flow((seq + 1) % SEQ_MOD, now_ns)
        if payload_len <= 0:
            self.control += 1
            if flow is not None:
                flow.last_ns = now_ns
            return IN
        if flow is None:
            flow = self.flows[key] = self._new_flow(seq, now_ns)
        flow.last_ns = now_ns
        retransmission = seq_after(flow.snd_max, seq)
        end = (seq + payload_len) % SEQ_MOD
        if retransmission:
            self.retransmissions += 1
        if seq_after(end, flow.snd_max):
            flow.snd_max = end
        apm = flow.apm.data(retransmission, self.alpha) if flow.apm else None
        wpm = flow.wpm.data(retransmission, self.n_a) if flow.wpm else None
        if self.kind == "APM":
            return apm  # type: ignore[return-value]
        if self.kind == "WPM":
            return wpm  # type: ignore[return-value]
        # MPM
        if wpm == IN:
            return PROTECTED
        return PROBE if apm == OUT else NORMAL

    def expire(self, now_ns: int) -> int:
        """Forget flows idle for longer than idle_ns; returns how many were forgotten."""
        old = [k for k, f in self.flows.items() if now_ns - f.last_ns > self.idle_ns]
        for k in old:
            del self.flows[k]
        return len(old)
