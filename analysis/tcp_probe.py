"""cwnd, ssthresh and srtt of TCP senders from the ``tcp:tcp_probe`` tracepoint, as recorded by
hostside/recorders/tcp_probe.py (trace_pipe text; the kernel 6.x format is

    <task>-<pid> [cpu] flags <sec>.<usec>: tcp_probe: family=AF_INET src=A:p dest=B:q mark=0x0
    data_len=0 snd_nxt=0x.. snd_una=0x.. snd_cwnd=10 ssthresh=2147483647 snd_wnd=64512
    srtt=23 rcv_wnd=65160 sock_cookie=1003 [skbaddr=.. skaddr=..]

srtt in microseconds, cwnd and ssthresh in segments). An event is the sending socket's state
when an ACK (any segment) arrives; ``src`` is the socket's own address, so a data flow
src:sport -> dst:dport is followed by the events with that same src/dest.

A sender at 155 Mbit/s records about 2 000 events a second. Lines in the kernel's IPv4 format
are read by one compiled pass over the bytes (numba); any other line that names a tcp_probe
event (IPv6, a form the pass does not know) goes through the regular expression _EVENT, which
defines what is read: the pass takes only lines it reads exactly as _EVENT would.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from numba import njit

from analysis.lazy import pd
from analysis.pcap import int_to_ip, ip_strings, ip_to_int

__all__ = [
    "COLUMNS",
    "INFINITE_SSTHRESH",
    "congestion_events",
    "epoch_starts",
    "for_flows",
    "read_tcp_probe",
]

INFINITE_SSTHRESH = 2**31 - 1  # TCP_INFINITE_SSTHRESH: not yet set (slow start)
_HEADER = "# trialbed-tcp-probe "
_EVENT = re.compile(
    r"\s(?P<sec>\d+)\.(?P<usec>\d+): tcp_probe: family=(?P<family>\S+) "
    r"src=\[?(?P<src>[^\s\]]+?)\]?:(?P<sport>\d+) dest=\[?(?P<dst>[^\s\]]+?)\]?:(?P<dport>\d+) "
    r"mark=\S+ data_len=(?P<data_len>\d+) snd_nxt=(?:0x)?(?P<snd_nxt>[0-9a-f]+) "
    r"snd_una=(?:0x)?(?P<snd_una>[0-9a-f]+) snd_cwnd=(?P<snd_cwnd>\d+) "
    r"ssthresh=(?P<ssthresh>\d+) snd_wnd=(?P<snd_wnd>\d+) srtt=(?P<srtt_us>\d+) "
    r"rcv_wnd=(?P<rcv_wnd>\d+) sock_cookie=(?P<sock_cookie>[0-9a-f]+)"
)
COLUMNS: dict[str, str] = {
    "ts_ns": "int64",
    "src": "object",
    "sport": "uint16",
    "dst": "object",
    "dport": "uint16",
    "data_len": "uint16",
    "snd_nxt": "uint32",
    "snd_una": "uint32",
    "snd_cwnd": "uint32",
    "ssthresh": "uint32",
    "snd_wnd": "uint32",
    "srtt_us": "uint32",
    "rcv_wnd": "uint32",
    "sock_cookie": "uint64",
}
_HEX = ("snd_nxt", "snd_una", "sock_cookie")
CHUNK = 16 << 20  # bytes of a recording parsed at a time


def open_recording(path: Path, mode: str = "rt"):
    """A recording, gzipped (.gz) or not, as text ("rt") or bytes ("rb")."""
    return gzip.open(path, mode) if path.suffix == ".gz" else open(path, mode)


def read_tcp_probe(
    path: str | Path, flows: pd.DataFrame | None = None, categorical: bool = False
) -> pd.DataFrame:
    """All tcp_probe events of a recording, in file order, one row each (see COLUMNS); with
    ``flows``, only those of the flows' sockets, as :func:`for_flows` gives them; with
    ``categorical``, src and dst as analysis.pcap.ip_strings gives them (what a trial's
    tables hold: a code an event, not a string).

    ts_ns is CLOCK_REALTIME (the captures' clock): the trace clock plus the offset the
    recorder wrote in its header line (without a header, the trace timestamps as they are).
    Lines that are not tcp_probe events (comments, other events, a last line cut short)
    are skipped. The file is read CHUNK bytes at a time into one buffer (a recording is about
    as large as the captures of a high-rate trial); only the wanted events are kept.
    """
    keys = None if flows is None else [c for c in ("src", "dst", "sport", "dport") if c in flows]
    wanted = None if flows is None else flows[keys].drop_duplicates()
    parts, others, offset, room = [], [], None, []
    for data, line0 in _chunks(Path(path)):
        if offset is None:
            offset = _clock_offset(data[: 1 << 16].tobytes())
        fields, lines, left, n, n_left = _parse_chunk(data, room)
        keep = _of(fields[:n], wanted, keys)
        parts.append({**_typed(fields[:n][keep]), "_line": lines[:n][keep] + line0})
        if n_left:
            text = [data[a:b].tobytes().decode(errors="replace") for _, a, b in left[:n_left]]
            found = _regex_events(pd.Series(text, dtype=object), offset)
            at = left[:n_left, 0][found.index.to_numpy()] + line0
            others.append(found.reset_index(drop=True).assign(_line=at))
    del room
    typed = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    del parts
    where = typed.pop("_line")
    if flows is not None and not others:  # (IPv4 events only: filtered exactly above)
        order = _flow_order(typed, where)
        return _frame({k: v[order] for k, v in typed.items()}, offset or 0, categorical)
    events = _frame(typed, offset or 0)
    if others:
        more = pd.concat(others, ignore_index=True)
        events = pd.concat([events, more.drop(columns="_line")], ignore_index=True)
        where = np.r_[where, more["_line"].to_numpy()]
    events = events.iloc[np.argsort(where, kind="stable")].reset_index(drop=True)
    return events if flows is None else for_flows(events, flows)


def _flow_order(typed: dict[str, np.ndarray], lines: np.ndarray) -> np.ndarray:
    """The order for_flows gives events (by src, sport, dst, dport and time, the addresses as
    dotted-quad strings; then file order)."""
    order = np.argsort(lines, kind="stable")
    names = ("sec", "usec", "src", "sport", "dst", "dport")
    col = {name: typed[name][order] for name in names}
    ranks = {}
    for name in ("src", "dst"):  # a few addresses: their strings' order
        uniq, codes = np.unique(col[name], return_inverse=True)
        by_text = np.argsort([int_to_ip(int(a)) for a in uniq], kind="stable")
        ranks[name] = np.argsort(by_text)[codes]
    usec = col["sec"] * 10**6 + col["usec"]  # ts_ns's order
    keys = (usec, col["dport"], ranks["dst"], col["sport"], ranks["src"])
    return order[np.lexsort(keys)]


def _chunks(path: Path):
    """(the whole lines of a CHUNK of the file as a uint8 array, the number of its first
    line), one chunk after the other in one reused buffer; the last line even without its
    newline. The array is valid until the next chunk is read."""
    buf = np.empty(CHUNK, np.uint8)
    carry = line0 = 0
    with open_recording(path, "rb") as f:
        while True:
            if carry == len(buf):  # a line longer than the buffer: twice the room
                buf = np.concatenate((buf, np.empty(len(buf), np.uint8)))
            got = f.readinto(memoryview(buf)[carry:])
            size = carry + got
            end = _last_line_end(buf, size) if got else size
            if got and not end:
                carry = size
                continue
            yield buf[:end], line0
            line0 += _lines(buf, end)
            carry = size - end
            buf[:carry] = buf[end:size]
            if not got:
                return


@njit(cache=True, nogil=True)
def _last_line_end(b, size):
    """The offset after the last newline in b[:size] (0 if none)."""
    i = size
    while i > 0 and b[i - 1] != 10:
        i -= 1
    return i


@njit(cache=True, nogil=True)
def _lines(b, end):
    """The lines _parse counts in b[:end] (the last one even without its newline)."""
    n = 0
    for i in range(end):
        n += b[i] == 10
    return n + (end > 0 and b[end - 1] != 10)


def _parse_chunk(data: np.ndarray, room: list):
    """_parse of one chunk into the arrays of ``room`` (made there, for the next chunks too):
    (fields, line numbers, lines left over, events, left-over lines)."""
    rows = len(data) // (len(_MARKER) + 1) + 1  # each event: the marker and a newline
    if not room or len(room[1]) < rows:
        room[:] = [
            np.zeros((rows, len(_FIELDS)), np.uint64),
            np.empty(rows, np.int64),
            np.empty((rows, 3), np.int64),
        ]
    fields, lines, left = room
    n, n_left, _ = _parse(data, fields, lines, left)
    return fields, lines, left, n, n_left


def _of(fields: np.ndarray, wanted: pd.DataFrame | None, keys: list[str] | None) -> np.ndarray:
    """Which parsed events are of the wanted flows' sockets (all without flows)."""
    keep = np.ones(len(fields), bool) if wanted is None else np.zeros(len(fields), bool)
    if wanted is None:
        return keep
    col = {name: fields[:, _FIELDS.index(name)] for name in keys}
    for row in wanted.itertuples(index=False):  # a generator's few flows
        match = np.ones(len(fields), bool)
        for name, value in zip(keys, row, strict=True):
            if name in ("src", "dst"):
                try:
                    value = ip_to_int(value)
                except ValueError:  # not IPv4: no event the compiled pass reads is its
                    match[:] = False
                    break
            match &= col[name] == np.uint64(value)
        keep |= match
    return keep


def _clock_offset(raw: bytes) -> int:
    """realtime_minus_clock_ns of the recorder's header line, among the first five (0 if
    there is none)."""
    start = 0
    for _ in range(5):
        end = raw.find(b"\n", start)
        line = raw[start : end if end >= 0 else len(raw)].decode(errors="replace")
        if line.startswith(_HEADER):
            return int(json.loads(line[len(_HEADER) :])["realtime_minus_clock_ns"])
        if end < 0:
            return 0
        start = end + 1
    return 0


def _regex_events(lines: pd.Series, offset: int) -> pd.DataFrame:
    """COLUMNS of the lines _EVENT matches, indexed by their position in ``lines``."""
    parts = lines.str.extract(_EVENT).dropna(subset=["sock_cookie"])
    out = {}
    sec = parts["sec"].astype(np.int64).to_numpy()
    usec = parts["usec"].str.ljust(6, "0").str[:6].astype(np.int64).to_numpy()
    out["ts_ns"] = sec * 10**9 + usec * 1000 + offset
    for col, dtype in COLUMNS.items():
        if col == "ts_ns":
            continue
        values = parts[col]
        if col in _HEX:
            out[col] = np.array([int(v, 16) for v in values], dtype=dtype)
        elif dtype == "object":
            out[col] = values.to_numpy(dtype=object)
        else:
            out[col] = values.astype(np.int64).to_numpy().astype(dtype)
    return pd.DataFrame(out, columns=list(COLUMNS), index=parts.index)


_MARKER = np.frombuffer(b": tcp_probe: family=", np.uint8)
_SRC = np.frombuffer(b" src=", np.uint8)
_DEST = np.frombuffer(b" dest=", np.uint8)
_MARK = np.frombuffer(b" mark=", np.uint8)
_0X = np.frombuffer(b"0x", np.uint8)
# What the compiled pass reads of a line, in this order (usec: its first six digits).
_FIELDS = (
    "sec", "usec", "src", "sport", "dst", "dport", "data_len", "snd_nxt", "snd_una",
    "snd_cwnd", "ssthresh", "snd_wnd", "srtt_us", "rcv_wnd", "sock_cookie",
)  # fmt: skip
# The text before each field after mark=..., all in one array (_KEY_ENDS: where each ends),
# and each field's digits: hex (at most 8 or 16, as COLUMNS' dtype holds), else decimal (0).
_KEY_TEXT = [
    b" data_len=", b" snd_nxt=", b" snd_una=", b" snd_cwnd=", b" ssthresh=", b" snd_wnd=",
    b" srtt=", b" rcv_wnd=", b" sock_cookie=",
]  # fmt: skip
_KEYS = np.frombuffer(b"".join(_KEY_TEXT), np.uint8)
_KEY_ENDS = np.cumsum([len(k) for k in _KEY_TEXT])
_HEX_DIGITS = np.array([0, 8, 8, 0, 0, 0, 0, 0, 16])
_DECIMAL_DIGITS = 18  # int64 holds them (the regular expression's path converts to int64)


def _typed(fields: np.ndarray) -> dict[str, np.ndarray]:
    """The compiled pass's fields (a row per event) as COLUMNS' types (as the regular
    expression's path makes them: through int64, wrapping to the type), but for the time
    (sec and usec, as read) and the addresses (integers)."""
    col = dict(zip(_FIELDS, fields.T, strict=True))
    out = {"sec": col["sec"].astype(np.int64), "usec": col["usec"].astype(np.int64)}
    for name, dtype in COLUMNS.items():
        if name == "ts_ns":
            continue
        if dtype == "object":
            out[name] = col[name].astype(np.uint32)
        elif dtype == "uint64":
            out[name] = col[name].copy()
        else:
            out[name] = col[name].astype(np.int64).astype(dtype)
    return out


def _frame(typed: dict[str, np.ndarray], offset: int, categorical: bool = False) -> pd.DataFrame:
    """COLUMNS from _typed's columns: the time on CLOCK_REALTIME, dotted-quad addresses (as
    ip_strings' categoricals with ``categorical``)."""
    out = {"ts_ns": typed["sec"] * 10**9 + typed["usec"] * 1000 + offset}
    for name, dtype in COLUMNS.items():
        if name == "ts_ns":
            continue
        if dtype == "object" and categorical:
            out[name] = ip_strings(typed[name])
        elif dtype == "object":  # dotted quads: one string object per address
            codes, uniq = pd.factorize(typed[name])
            out[name] = np.array([int_to_ip(a) for a in uniq] or [""], dtype=object)[codes]
        else:
            out[name] = typed[name]
    return pd.DataFrame(out, columns=list(COLUMNS))


def _events(fields: np.ndarray, offset: int) -> pd.DataFrame:
    """COLUMNS from the compiled pass's fields (one row per event)."""
    return _frame(_typed(fields), offset)


@njit(cache=True, nogil=True, inline="always")
def _has(b, i, end, text):
    """Whether ``text`` is at b[i:end]."""
    if i + len(text) > end:
        return False
    for k in range(len(text)):  # noqa: SIM110 (a loop numba compiles; all() of a generator it does not)
        if b[i + k] != text[k]:
            return False
    return True


@njit(cache=True, nogil=True, inline="always")
def _token(b, i, end):
    """The end of the printable ASCII run at b[i:end] (what _EVENT's \\S+ takes of kernel
    text; any other byte ends it, and the line is left to the regular expression)."""
    while i < end and 33 <= b[i] <= 126:
        i += 1
    return i


@njit(cache=True, nogil=True, inline="always")
def _number(b, i, end, hex_, most):
    """(value, position after it) of the digits at b[i:end]: decimal, or lowercase hex; the
    position is -1 when there is none or more than ``most``."""
    value, k = np.uint64(0), i
    while k < end:
        c = b[k]
        if 48 <= c <= 57:
            d = c - 48
        elif hex_ and 97 <= c <= 102:
            d = c - 87
        else:
            break
        value = value * np.uint64(16 if hex_ else 10) + np.uint64(d)
        k += 1
    return value, (k if 0 < k - i <= most else -1)


@njit(cache=True, nogil=True, inline="always")
def _endpoint(b, i, end):
    """(IPv4 address, port, position after them) of "a.b.c.d:port" at b[i:end] as the
    kernel prints it (octets without leading zeros); position -1 otherwise."""
    addr = np.uint64(0)
    for part in range(4):
        if part:
            if i >= end or b[i] != 46:  # .
                return addr, addr, -1
            i += 1
        octet, k = _number(b, i, end, False, 3)
        if k < 0 or octet > 255 or (b[i] == 48 and k - i > 1):
            return addr, addr, -1
        addr = addr << np.uint64(8) | octet
        i = k
    if i >= end or b[i] != 58:  # :
        return addr, addr, -1
    port, k = _number(b, i + 1, end, False, _DECIMAL_DIGITS)
    return addr, port, k


@njit(cache=True, nogil=True)
def _event(b, start, m, end, out):
    """Read the event of the line from b[start] whose marker is at m into ``out`` (_FIELDS),
    reading no further than ``end`` (nor past the line's newline: no field reads one): the
    position after it, or -1 when the line is not in the form read here."""
    j = m  # backwards: <whitespace><sec>.<usec> right before the marker
    while j > start and 48 <= b[j - 1] <= 57:
        j -= 1
    usec_at = j
    if usec_at == m or j - 1 <= start or b[j - 1] != 46:  # .
        return -1
    j -= 1
    dot = j
    while j > start and 48 <= b[j - 1] <= 57:
        j -= 1
    if j in (dot, start) or dot - j > _DECIMAL_DIGITS:
        return -1
    c = b[j - 1]
    if not (c == 32 or c == 9 or c == 13 or c == 11 or c == 12):  # _EVENT's \s
        return -1
    out[0], _ = _number(b, j, dot, False, _DECIMAL_DIGITS)
    usec = np.uint64(0)
    for k in range(6):  # the first six digits, zeros after the last (ljust(6, "0")[:6])
        d = b[usec_at + k] - 48 if usec_at + k < m else 0
        usec = usec * np.uint64(10) + np.uint64(d)
    out[1] = usec
    i = m + len(_MARKER)  # forwards: family=<token> src=<a:p> dest=<a:p> mark=<token>
    i = _token(b, i, end)
    if i == m + len(_MARKER) or not _has(b, i, end, _SRC):
        return -1
    out[2], out[3], i = _endpoint(b, i + len(_SRC), end)
    if i < 0 or not _has(b, i, end, _DEST):
        return -1
    out[4], out[5], i = _endpoint(b, i + len(_DEST), end)
    if i < 0 or not _has(b, i, end, _MARK):
        return -1
    i += len(_MARK)
    token = i
    i = _token(b, i, end)
    if i == token:
        return -1
    begin = 0
    for f in range(len(_KEY_ENDS)):
        key = _KEYS[begin : _KEY_ENDS[f]]
        begin = _KEY_ENDS[f]
        if not _has(b, i, end, key):
            return -1
        i += len(key)
        hex_ = _HEX_DIGITS[f] > 0
        if hex_ and f < len(_KEY_ENDS) - 1 and _has(b, i, end, _0X):
            i += 2
        value, i = _number(b, i, end, hex_, _HEX_DIGITS[f] if hex_ else _DECIMAL_DIGITS)
        if i < 0:
            return -1
        out[6 + f] = value
    return i


@njit(cache=True, nogil=True)
def _parse(b, fields, line_of, left):
    """Every line of ``b`` with one tcp_probe marker in the form _event reads: its fields in
    ``fields`` and its line number in ``line_of``; a line with the marker in another form,
    or with two, goes to ``left`` (line number, first byte, end). Returns how many of each,
    and how many lines ``b`` holds. Each byte is read once: up to a line's marker, the event
    after it, then the rest of the line (a second marker there, and its end)."""
    n = n_left = line = 0
    pos, size = 0, len(b)
    while pos < size:
        i, m = pos, -1
        while i < size and b[i] != 10:  # up to the marker, or the line's end
            if b[i] == 58 and _has(b, i, size, _MARKER):  # ":"; the marker has no newline
                m = i
                break
            i += 1
        if m < 0:
            pos, line = i + 1, line + 1
            continue
        read = _event(b, pos, m, size, fields[n])
        i = read if read >= 0 else m + len(_MARKER)
        second = False
        while i < size and b[i] != 10:
            if b[i] == 58 and _has(b, i, size, _MARKER):
                second = True
            i += 1
        if read >= 0 and not second:
            line_of[n] = line
            n += 1
        else:
            left[n_left, 0], left[n_left, 1], left[n_left, 2] = line, pos, i
            n_left += 1
        pos, line = i + 1, line + 1
    return n, n_left, line


def for_flows(events: pd.DataFrame, flows: pd.DataFrame) -> pd.DataFrame:
    """The events of the sending sockets of ``flows`` (columns src, dst as dotted-quad strings,
    and optionally sport, dport), each tagged with its flow's row of ``flows`` columns; events
    are sorted by (flow, time)."""
    keys = [c for c in ("src", "dst", "sport", "dport") if c in flows.columns]
    flows = flows[keys].drop_duplicates().astype({k: events[k].dtype for k in keys})
    picked = events.merge(flows, on=keys, how="inner")
    return picked.sort_values(["src", "sport", "dst", "dport", "ts_ns"], kind="stable").reset_index(
        drop=True
    )


def congestion_events(events: pd.DataFrame) -> pd.DataFrame:
    """The events where a flow's ssthresh fell (a loss or ECN reduction, or HyStart leaving
    slow start; not the raises of an undo or of an application-limited period): one row per
    congestion epoch, with the cwnd just before and at it. ``events`` sorted by flow and time
    (as ``for_flows`` returns them). A loss whose ssthresh equals the last one's (a steady
    peak: CUBIC's 11 -> 7 again and again with 5 flows) does not show here: epoch_starts
    finds those too (in a 60 s CUBIC x5 trial 20-27 per flow where this finds 5-20)."""
    key = ["src", "sport", "dst", "dport"]
    same = np.ones(len(events), dtype=bool)
    for k in key:
        col = events[k]
        col = (
            col.cat.codes.to_numpy()
            if isinstance(col.dtype, pd.CategoricalDtype)
            else col.to_numpy()
        )
        same[1:] &= col[1:] == col[:-1]
    same[:1] = False  # (no event at all: a recording of none of its flows)
    ss = events["ssthresh"].to_numpy(np.int64)
    cwnd = events["snd_cwnd"].to_numpy(np.int64)
    prev_ss = np.r_[INFINITE_SSTHRESH, ss[:-1]]
    prev_cwnd = np.r_[0, cwnd[:-1]]
    change = same & (ss < prev_ss)
    out = events.loc[change, [*key, "ts_ns", "snd_cwnd", "ssthresh"]].copy()
    out.insert(out.columns.get_loc("snd_cwnd"), "cwnd_before", prev_cwnd[change])
    return out.reset_index(drop=True)


def epoch_starts(flow: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The samples (positions) of one flow's cwnd table (columns snd_cwnd, ssthresh, snd_nxt,
    snd_una, in time order) where a congestion epoch begins, and where its reduction ended
    (-1: not within the table). An epoch begins where ssthresh or cwnd falls once the last
    reduction is over (what was sent when it began is acked: Linux's recovery point), so a
    loss whose ssthresh equals the last one's (H-TCP at a steady peak: 48 -> 24, again and
    again) counts too, which ssthresh alone (congestion_events) does not show, and cwnd's
    further falls within one reduction (PRR) do not."""
    cwnd = flow.snd_cwnd.to_numpy(np.int64)
    ssthresh = flow.ssthresh.to_numpy(np.int64)
    nxt = flow.snd_nxt.to_numpy(np.int64)
    una = flow.snd_una.to_numpy(np.int64)
    fell = np.r_[False, (ssthresh[1:] < ssthresh[:-1]) | (cwnd[1:] < cwnd[:-1])]
    starts: list[int] = []
    for i in np.flatnonzero(fell):
        if not starts or (una[i] - nxt[starts[-1]]) % 2**32 < 2**31:
            starts.append(int(i))
    ended = np.full(len(starts), -1, dtype=np.int64)
    for k, i in enumerate(starts):
        passed = np.flatnonzero((una[i + 1 :] - nxt[i]) % 2**32 < 2**31)
        if len(passed):
            ended[k] = i + 1 + passed[0]
    return np.array(starts, dtype=np.int64), ended


def epoch_counts(cwnd: pd.DataFrame, sports: Iterable[int]) -> list[int]:
    """Congestion epochs of each flow (by its source port) in a cwnd table: epoch_starts, so a
    loss whose ssthresh equals the last one's counts too. A recording without sequence
    numbers (SIFTR: snd_nxt and snd_una are zero) cannot tell a new loss from a reduction's
    further steps: there the ssthresh reductions (congestion_events) count."""
    sports = list(sports)
    if cwnd.empty or not cwnd["snd_nxt"].to_numpy().any():
        events = congestion_events(cwnd)
        return [int((events.sport == p).sum()) for p in sports]
    port = cwnd["sport"].to_numpy()
    return [len(epoch_starts(cwnd[port == p])[0]) for p in sports]
