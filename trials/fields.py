"""Field types of the experiment schema and of the traffic generators' specs: the one table of
ranges (every quantity with its unit, the range a rack can carry and why) and the identifiers
an experiment file may name. Validators, error messages and the generated schema docs
(scripts/schema_docs.py) all read the ranges from here.

Units are parsed once into integers (bit/s, bytes, ns) and written back in their shortest
exact form; booleans are never numbers; an identifier is refused, naming what is allowed,
when it could reach a shell or a file name as anything but itself.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, PlainSerializer, PlainValidator

from core.dscp import DSCP_NAMES, parse_dscp
from core.names import (
    ADDRESS_PATTERN,
    ADDRESS_RULE,
    INTERFACE_PATTERN,
    INTERFACE_RULE,
    is_address_or_dns_name,
)
from core.rio import MEAN_PACKET_RANGE
from core.units import (
    Buffer,
    format_duration,
    format_rate,
    parse_buffer,
    parse_bytes,
    parse_duration_ns,
    parse_offset_ns,
    parse_rate,
)

# Congestion controls Linux has (built in or as modules); whether a host has one is checked
# against the host itself by the preflight.
LINUX_CC = (
    "reno",
    "cubic",
    "htcp",
    "bbr",
    "bic",
    "dctcp",
    "highspeed",
    "hybla",
    "illinois",
    "lp",
    "nv",
    "scalable",
    "vegas",
    "veno",
    "westwood",
    "yeah",
    "cdg",
)
# A value longer than this is not a quantity, whatever it holds; it is refused before it is
# parsed and shown shortened in the message.
_LONGEST_QUANTITY = 64
_SHOWN_CHARS = 60


def shown(value: Any) -> str:
    """A value as a message shows it: YAML's words for booleans and null, long ones cut."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else f"{text[: _SHOWN_CHARS - 5]}...{text[-3:]}"


@dataclass(frozen=True)
class Allowed:
    """What a key allows, in words, where no Range or Identifier says it (for the docs)."""

    kind: str
    text: str


@dataclass(frozen=True)
class Range:
    """The values a key may take, in its base unit; `show` writes a bound as a file would,
    `kind` names the quantity (rate, duration, whole number)."""

    low: int | float
    high: int | float
    why: str
    show: Callable[[Any], str] = str
    open_low: bool = False
    open_high: bool = False
    kind: str = "whole number"

    def text(self) -> str:
        low, high = self.show(self.low), self.show(self.high)
        whole_numbers = isinstance(self.low, int) and isinstance(self.high, int)
        if whole_numbers and self.high == self.low + 1:
            return f"{low} or {high}"
        if self.open_low and self.open_high:
            return f"above {low} and below {high}"
        if self.open_low:
            return f"above {low}, up to {high}"
        if self.open_high:
            return f"{low} up to (not including) {high}"
        return f"{low} to {high}"

    def holds(self, value: float) -> bool:
        above = self.low < value if self.open_low else self.low <= value
        below = value < self.high if self.open_high else value <= self.high
        return above and below

    def check(self, value: Any, given: Any) -> Any:
        if not self.holds(value):
            raise ValueError(f"{shown(given)} is out of range; allowed: {self.text()}")
        return value


def whole(low: int, high: int, why: str, what: str = "") -> Any:
    """A whole number from low to high (no boolean, no text, no 3.0); `what` names the
    quantity in the message ('number of packets')."""
    limit = Range(low, high, why)

    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(
                f"{shown(value)} is not a {what or 'whole number'}; allowed: {limit.text()}"
            )
        if what and not limit.holds(value):
            raise ValueError(f"{shown(value)} is not a {what}; allowed: {limit.text()}")
        return limit.check(value, value)

    return Annotated[int, BeforeValidator(check), limit]


def real(
    low: float, high: float, why: str, *, open_low: bool = False, open_high: bool = False
) -> Any:
    """A finite number (whole or not) in the range."""
    limit = Range(float(low), float(high), why, lambda v: f"{v:g}", open_low, open_high, "number")

    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{shown(value)} is not a number; allowed: {limit.text()}")
        if not math.isfinite(value):
            raise ValueError(f"{shown(value)} is not a finite number; allowed: {limit.text()}")
        return limit.check(float(value), value)

    return Annotated[float, BeforeValidator(check), limit]


def quantity(
    parse: Callable[[object], int], serialize: Callable[[int], str], what: str, limit: Range
) -> Any:
    """A number with a unit ('1mbit', '20ms'), parsed to its base unit and range-checked;
    `serialize` writes it back (trial ids hash that form: keep it)."""
    limit = replace(limit, kind=what)

    def check(value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError(f"{shown(value)} is a boolean, not a {what}; allowed: {limit.text()}")
        if isinstance(value, str) and len(value) > _LONGEST_QUANTITY:
            raise ValueError(f"{shown(value)} is not a {what}; allowed: {limit.text()}")
        return limit.check(parse(value), value)

    return Annotated[int, BeforeValidator(check), PlainSerializer(serialize), limit]


def _bytes(n: int) -> str:
    return f"{n}B"


def _bytes_text(n: int) -> str:
    """A byte count as a file would write it, shortest exact form (150MB, 1kB, 1024B)."""
    for unit, factor in (("MB", 10**6), ("kB", 10**3)):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{unit}"
    return f"{n}B"


# -- the table of ranges -----------------------------------------------------------------------
# One row per kind of quantity. A range says what a rack can carry, not what a paper used; a
# rack that carries less (a FreeBSD router's dummynet, a host's link speed) is checked by
# preflight against the rack itself.

MAX_TRIAL_NS = 24 * 3600 * 10**9
_DAY = "a day: the longest trial a nightly schedule can hold"
_S = 10**9

LINK_RATE = Range(
    10_000, 100 * 10**9,
    "a full-size frame takes 1.2 s at 10kbit (slower starves every timer); 100 Gbit/s is the "
    "fastest Ethernet a rack host has", format_rate,
)  # fmt: skip
LINK_DELAY = Range(
    0, 10 * _S, "36 geostationary hops (about 270 ms each); the delay line holds rate x delay "
    "bytes", format_duration,
)  # fmt: skip
TRIAL_DURATION = Range(
    _S, MAX_TRIAL_NS, f"from 1s (starting the generators at T0 takes that long) to {_DAY}",
    format_duration,
)  # fmt: skip
TRAFFIC_DURATION = Range(
    10**6, MAX_TRIAL_NS, f"1ms to {_DAY}; it must also end within the trial", format_duration
)
START_OFFSET = Range(
    0, MAX_TRIAL_NS, f"0s to {_DAY}; it must also lie within the trial", format_duration
)
DRAIN = Range(
    0, 600 * _S, "the largest buffer at the lowest rate drains well within 10 minutes",
    format_duration,
)  # fmt: skip
TIMEOUT = Range(
    10**6, 120 * _S, "1ms (a timer tick) to 120s, TCP's largest retransmission timeout",
    format_duration,
)  # fmt: skip
PACKET_INTERVAL = Range(
    10**4, 10 * _S, "10us (100 000 packets a second, what tcpreplay keeps) to 10s",
    format_duration,
)  # fmt: skip
MTU = Range(68, 9000, "IPv4's smallest MTU (RFC 791) to a 9000-byte jumbo frame")
MEAN_PACKET = Range(
    *MEAN_PACKET_RANGE, "a minimum Ethernet frame to a jumbo packet (core/rio.py)", _bytes_text
)
MAX_QUEUE_PACKETS = 100_000
_QUEUE_WHY = (
    "100 000 full-size frames (150MB) at most: the kernel holds a queue in memory, and at "
    "1 Gbit/s that is over a second of queue"
)
BUFFER_BYTES = Range(1, 150 * 10**6, _QUEUE_WHY, _bytes_text, kind="buffer")
BUFFER_PACKETS = Range(1, MAX_QUEUE_PACKETS, _QUEUE_WHY, lambda n: f"{n}pkt", kind="buffer")
SOCKET_BUFFER = Range(
    1024, 1 << 28,
    "1024 B (below that TCP stalls) to 256 MiB, above any bandwidth-delay product of a rack",
    _bytes_text,
)  # fmt: skip
TRANSFER_BYTES = Range(1, 10**12, "1 B to 1 TB (a day at 100 Mbit/s)", _bytes_text)
MESSAGE_BYTES = Range(
    1, (1 << 31) - 1, "1 B to 2 GiB, what one transaction's 32-bit length holds", _bytes_text
)
MAX_SEED = 2**63 - 1
LOAD = Range(
    0.0, 1.0, "a fraction of the link rate: 0.64 or 64%", lambda v: f"{v:g}", True, kind="load"
)

LinkRate = quantity(parse_rate, format_rate, "rate", LINK_RATE)
LinkDelay = quantity(parse_offset_ns, format_duration, "one-way delay", LINK_DELAY)
TrialDuration = quantity(parse_duration_ns, format_duration, "duration", TRIAL_DURATION)
TrafficDuration = quantity(parse_duration_ns, format_duration, "duration", TRAFFIC_DURATION)
StartOffset = quantity(parse_offset_ns, format_duration, "time offset", START_OFFSET)
Drain = quantity(parse_offset_ns, format_duration, "duration", DRAIN)
Timeout = quantity(parse_duration_ns, format_duration, "timeout", TIMEOUT)
PacketInterval = quantity(parse_duration_ns, format_duration, "interval", PACKET_INTERVAL)
MeanPacket = quantity(parse_bytes, _bytes, "size in bytes", MEAN_PACKET)
SocketBuffer = quantity(parse_bytes, _bytes, "size in bytes", SOCKET_BUFFER)
TransferBytes = quantity(parse_bytes, _bytes, "size in bytes", TRANSFER_BYTES)
MessageBytes = quantity(parse_bytes, _bytes, "size in bytes", MESSAGE_BYTES)
Mtu = whole(int(MTU.low), int(MTU.high), MTU.why)
QueuePackets = whole(1, MAX_QUEUE_PACKETS, _QUEUE_WHY, "number of packets")
Flows = whole(1, 128, "iperf3 -P runs at most 128 parallel streams")
Pairs = whole(1, 64, "client/server pairs of one generator: 64 processes on each host")
Transactions = whole(1, 10**9, "transactions per pair: a 32-bit counter")
InitCwnd = whole(1, 1000, "ip route's initcwnd, in segments")
Repetitions = whole(1, 100, "runs of one factor combination")
Seed = whole(0, MAX_SEED, "a 63-bit seed (numpy's and Python's generators take it)")
Port = whole(1024, 65535, "unprivileged ports, so no system service is taken")
UdpPacketBytes = whole(36, 1500, "IP header, UDP header and the stream's 8-byte stamp, to MTU")
Snaplen = whole(96, 65535, "headers of TCP with options, to a whole IP packet")
AfClass = whole(1, 4, "RFC 2597's four AF classes")
ProtectedPackets = whole(0, 1000, "WPM's protected packets, per flow")
Probability = real(0, 1, "a probability", open_low=True)
QueueWeight = real(0, 1, "an EWMA weight", open_low=True, open_high=True)
FilterWeight = real(0, 1, "an EWMA weight", open_high=True)
InitialAllowance = real(0, MAX_QUEUE_PACKETS, "packets, as the queue thresholds", open_low=True)


def _buffer(value: Any) -> Buffer:
    if isinstance(value, bool) or (isinstance(value, str) and len(value) > _LONGEST_QUANTITY):
        raise ValueError(f"{shown(value)} is not a buffer size; write e.g. 60000B or 20pkt")
    buffer = parse_buffer(value)
    limit = BUFFER_PACKETS if buffer.packets else BUFFER_BYTES
    if not limit.holds(buffer.amount):
        raise ValueError(
            f"{shown(value)} is out of range; allowed: {BUFFER_BYTES.text()} or "
            f"{BUFFER_PACKETS.text()}"
        )
    return buffer


BufferSize = Annotated[
    Buffer, PlainValidator(_buffer), PlainSerializer(str), BUFFER_BYTES, BUFFER_PACKETS
]


# -- identifiers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Identifier:
    """What a name of one kind may be: a pattern and the rule in words."""

    what: str
    pattern: re.Pattern[str]
    rule: str
    check: Callable[[str], bool] = lambda _: True

    def __call__(self, value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"{shown(value)} is not {self.what}; {self.rule}")
        if not self.pattern.fullmatch(value) or not self.check(value):
            raise ValueError(f"{shown(value)} is not {self.what}; {self.rule}")
        return value


def identifier(what: str, pattern: str, rule: str, check: Callable[[str], bool] | None = None):
    ident = Identifier(what, re.compile(pattern), rule, check or (lambda _: True))
    return Annotated[str, BeforeValidator(ident), ident]


NAME_RULE = "a letter, then up to 31 letters, digits or _"
# Names of nodes, links, traffic, capture points, markers and rules: they become file names,
# daemon names and nftables comments on the hosts.
Name = identifier("a name", r"[A-Za-z][A-Za-z0-9_]{0,31}", NAME_RULE)
# hosts.<key>: all, senders, receivers, an inventory group or a node.
HostKey = identifier(
    "a node or group name", r"[A-Za-z_][A-Za-z0-9_]{0,63}", "a letter or _, then up to 63 "
    "letters, digits or _ (all, senders, receivers, an inventory group or a node)",
)  # fmt: skip
InventoryHost = identifier(
    "an IP address or a DNS name", ADDRESS_PATTERN, f"give the inventory host as {ADDRESS_RULE}",
    is_address_or_dns_name,
)  # fmt: skip
# The rule (core/names.py) that the inventory's interface names follow too.
InterfaceName = identifier("an interface name", INTERFACE_PATTERN, INTERFACE_RULE)
CcParamName = identifier(
    "a module parameter name", r"[A-Za-z_][A-Za-z0-9_]{0,63}",
    "a C identifier of up to 64 letters, digits or _, as in /sys/module/tcp_<cc>/parameters/",
)  # fmt: skip
CC_PARAM_INT = Range(-(2**31), 2**32 - 1, "a module parameter's int or uint")
_CC_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,+-]{0,63}")


def _cc_param_value(value: Any) -> int | str:
    allowed = (
        f"give a whole number ({CC_PARAM_INT.text()}) or a word of up to 64 letters, digits "
        "or _ . , + - (not starting with -)"
    )
    if isinstance(value, bool):
        raise ValueError(f"{shown(value)} is a boolean; {allowed}, e.g. 1 or 0")
    if isinstance(value, int):
        if not CC_PARAM_INT.holds(value):
            raise ValueError(f"{shown(value)} is out of range; {allowed}")
        return value
    if isinstance(value, str) and _CC_WORD.fullmatch(value):
        return value
    raise ValueError(f"{shown(value)} is not a module parameter value; {allowed}")


CcParamValue = Annotated[
    int | str,
    PlainValidator(_cc_param_value),
    Allowed(
        "whole number or word",
        f"{CC_PARAM_INT.text()}, or a word of up to 64 letters, digits or _ . , + -",
    ),
]


def _known_cc(value: Any) -> str:
    if not isinstance(value, str) or value not in LINUX_CC:
        raise ValueError(
            f"unknown congestion control {shown(value)}; allowed: {', '.join(LINUX_CC)}"
        )
    return value


CongestionControl = Annotated[
    str, BeforeValidator(_known_cc), Allowed("congestion control", ", ".join(LINUX_CC))
]


def _dscp(value: Any) -> int | str:
    names = ", ".join(DSCP_NAMES)
    if isinstance(value, bool):
        raise ValueError(f"{shown(value)} is a boolean, not a DSCP; give 0..63 or one of: {names}")
    if isinstance(value, str) and len(value) > _LONGEST_QUANTITY:
        raise ValueError(f"{shown(value)} is not a DSCP; give 0..63 or one of: {names}")
    parse_dscp(value)
    return value


# A DSCP as written (0..63 or a name: be, ef, af11..af43, cs0..cs7), kept as written.
Dscp = Annotated[
    int | str,
    PlainValidator(_dscp),
    Allowed("DSCP", f"0 to 63 or a name: {', '.join(DSCP_NAMES)}"),
]

# Control characters (C0 but tab and newline, C1), line and paragraph separators, and the
# bidirectional overrides that make text read other than it is.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def text(longest: int, *, lines: bool) -> Any:
    """Free text (a description): printable, at most `longest` characters."""

    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"{shown(value)} is not text; write it in quotes")
        if len(value) > longest:
            raise ValueError(f"{len(value)} characters; allowed: at most {longest}")
        bad = _CONTROL.search(value) or (None if lines else re.search(r"[\n\t]", value))
        if bad:
            raise ValueError(
                f"{shown(value)} holds the control character {bad[0]!r}; allowed: printable "
                f"text{', newlines and tabs' if lines else ' on one line'}"
            )
        return value

    rule = f"at most {longest} printable characters" + (" (lines, tabs)" if lines else "")
    return Annotated[str, BeforeValidator(check), Allowed("text", rule)]


Label = text(200, lines=False)
Description = text(10_000, lines=True)


class Strict(BaseModel):
    """Frozen, and every key it does not know is an error."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
