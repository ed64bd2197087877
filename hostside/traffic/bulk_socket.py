#!/usr/bin/env python3
"""A bulk transfer that sends from connect, as an FTP or HTTP client's does (standard library
only, no project imports): the bulk_tcp generator's `tool: socket` starts it from the host's
shipped hostside/ folder, in the trial's directory, through trialbed-daemon. Unlike iperf3
there is no control connection and no set-up exchange: each flow's first data segment leaves
right after the handshake's last ACK, one round trip after its SYN.

  bulk_socket.py receiver --bind ADDR --port PORT --out REPORT.json
      accepts TCP connections and reads each to its end (EOF), discarding the bytes, then
      closes it. Logs "ready" once it listens. On SIGTERM or SIGINT it writes REPORT.json:
      {"program", "version", "role": "receiver", "connections": [{"peer", "peer_port",
       "accepted_ns", "first_byte_ns", "last_byte_ns", "eof_ns", "bytes"}], "cpu_s"}.

  bulk_socket.py sender --bind ADDR --connect ADDR --port PORT --flows N
                        (--duration-s S | --bytes B) [--start-at EPOCH_S] [--cc NAME]
                        [--tos TOS] [--pacing-rate BYTES_PER_S] --out REPORT.json
      waits until --start-at (default: now), opens N connections from ADDR at once (each
      socket's options set before its SYN: TCP_CONGESTION, IP_TOS, SO_MAX_PACING_RATE) and
      writes to each as soon as it is connected: until the duration ends (then closes them;
      the kernel sends what their buffers hold), or B bytes in all (split evenly, the first
      flows taking the remainder; each is then shut down and the sender waits for the
      receiver to close it: the transfer's end). On SIGTERM it stops where it is. Then it
      writes REPORT.json: {"program", "version", "role": "sender", "start_ns", "end_ns",
      "settings", "flows": [{"flow", "local_port", "connect_ns", "connected_ns",
      "first_send_ns", "last_send_ns", "closed_ns", "bytes_sent", "bytes_wanted", "cc",
      "mss", "status": done|open|error, "error"}], "cpu_s", "error"}; exit status 1 if a flow
      failed.

Times are CLOCK_REALTIME ns (the captures' clock). One thread and a selector: a write of up to
256 KiB per ready socket; measured on loopback: tests/bench/bench_bulk_socket.py.
"""

import argparse
import errno
import json
import os
import resource
import selectors
import signal
import socket
import sys
import time

PROGRAM, VERSION = "bulk_socket", 1
CHUNK = 256 * 1024
PAYLOAD = memoryview(bytes(CHUNK))
LINUX = sys.platform.startswith("linux")
# Socket options by number where Python's socket module does not name them (Linux values).
TCP_CONGESTION = getattr(socket, "TCP_CONGESTION", 13 if LINUX else None)
SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47 if LINUX else None)


def log(msg):
    print(f"bulk_socket: {msg}", file=sys.stderr, flush=True)


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return {"user": round(r.ru_utime, 6), "system": round(r.ru_stime, 6)}


def write_report(path, report):
    with open(path + ".tmp", "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)


def stop_on_signals():
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    return stop


class Connection:
    """One accepted connection, as the receiver counts it."""

    def __init__(self, sock, peer):
        self.sock, self.peer = sock, peer
        self.accepted_ns, self.first_ns, self.last_ns, self.eof_ns = (
            time.time_ns(),
            None,
            None,
            None,
        )
        self.bytes = 0

    def row(self):
        return {
            "peer": self.peer[0],
            "peer_port": self.peer[1],
            "accepted_ns": self.accepted_ns,
            "first_byte_ns": self.first_ns,
            "last_byte_ns": self.last_ns,
            "eof_ns": self.eof_ns,
            "bytes": self.bytes,
        }


def receive(args):
    stop = stop_on_signals()
    sel = selectors.DefaultSelector()
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((args.bind, args.port))
    lsock.listen(1024)
    lsock.setblocking(False)
    sel.register(lsock, selectors.EVENT_READ)
    buf = bytearray(CHUNK)
    conns = []
    log(f"ready: listening on {args.bind}:{args.port}")
    while not stop:
        for key, _ in sel.select(timeout=0.5):
            if key.fileobj is lsock:
                try:
                    sock, peer = lsock.accept()
                except BlockingIOError:
                    continue
                sock.setblocking(False)
                conns.append(Connection(sock, peer))
                sel.register(sock, selectors.EVENT_READ, conns[-1])
                continue
            c = key.data
            try:
                n = c.sock.recv_into(buf)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                n = 0  # reset: the end of this connection
            if n:
                now = time.time_ns()
                c.first_ns = c.first_ns or now
                c.last_ns, c.bytes = now, c.bytes + n
                continue
            c.eof_ns = time.time_ns()
            sel.unregister(c.sock)
            c.sock.close()
    report = {"program": PROGRAM, "version": VERSION, "role": "receiver"}
    report |= {"connections": [c.row() for c in conns], "cpu_s": cpu_s()}
    write_report(args.out, report)
    log(f"stopped: {len(conns)} connections, {sum(c.bytes for c in conns)} bytes")


class Flow:
    """One connection of the sender."""

    def __init__(self, index, wanted):
        self.index, self.wanted = index, wanted  # wanted: bytes to send, None: until the end
        self.sock = self.port = None
        self.connect_ns = self.connected_ns = self.first_ns = self.last_ns = None
        self.closed_ns = None
        self.sent, self.status, self.error = 0, "open", None
        self.shut, self.cc, self.mss = False, None, None

    def row(self):
        return {
            "flow": self.index,
            "local_port": self.port,
            "connect_ns": self.connect_ns,
            "connected_ns": self.connected_ns,
            "first_send_ns": self.first_ns,
            "last_send_ns": self.last_ns,
            "closed_ns": self.closed_ns,
            "bytes_sent": self.sent,
            "bytes_wanted": self.wanted,
            "cc": self.cc,
            "mss": self.mss,
            "status": self.status,
            "error": self.error,
        }


def configure(sock, args):
    """The socket's options, before its SYN (the window scale and CC are chosen then)."""
    if args.cc:
        if TCP_CONGESTION is None:
            raise OSError(errno.ENOPROTOOPT, "TCP_CONGESTION is not known on this system")
        sock.setsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, args.cc.encode())
    if args.tos is not None:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, args.tos)
    if args.pacing_rate is not None:
        if SO_MAX_PACING_RATE is None:
            raise OSError(errno.ENOPROTOOPT, "SO_MAX_PACING_RATE is Linux's")
        sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, args.pacing_rate)


def shares(total, flows):
    """Bytes per flow: `total` split evenly, the first flows taking the remainder."""
    return [total // flows + (i < total % flows) for i in range(flows)]


def open_flow(flow, args, sel):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    flow.sock = s
    try:
        configure(s, args)
        s.setblocking(False)
        s.bind((args.bind, 0))
        flow.port = s.getsockname()[1]
        flow.connect_ns = time.time_ns()
        err = s.connect_ex((args.connect, args.port))
        if err not in (0, errno.EINPROGRESS):
            raise OSError(err, os.strerror(err))
    except OSError as exc:
        fail(flow, exc, sel)
        return
    sel.register(s, selectors.EVENT_WRITE, flow)


def fail(flow, exc, sel):
    flow.status, flow.error = "error", exc.strerror or str(exc)
    close(flow, sel)


def close(flow, sel):
    if flow.sock.fileno() < 0:
        return
    if flow.sock in sel.get_map():  # (a mapping keyed by file objects and descriptors)
        sel.unregister(flow.sock)
    flow.sock.close()
    flow.closed_ns = time.time_ns()


def connected(flow):
    """Its connection's outcome, once its socket is first writable."""
    err = flow.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err:
        raise OSError(err, os.strerror(err))
    flow.connected_ns = time.time_ns()
    if TCP_CONGESTION is not None:  # the congestion control the kernel took
        name = flow.sock.getsockopt(socket.IPPROTO_TCP, TCP_CONGESTION, 16)
        flow.cc = name.rstrip(b"\0").decode()
    flow.mss = flow.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)


def step(flow, sel):
    """What a ready socket allows: the connection's outcome, a write, or the receiver's
    close after the flow's last byte (bytes mode)."""
    s = flow.sock
    if flow.connected_ns is None:
        connected(flow)
    if flow.shut:
        if not s.recv(CHUNK):  # the receiver read everything and closed
            flow.status = "done"
            close(flow, sel)
        return
    left = CHUNK if flow.wanted is None else flow.wanted - flow.sent
    if left > 0:
        n = s.send(PAYLOAD[: min(left, CHUNK)])
        now = time.time_ns()
        flow.first_ns = flow.first_ns or now
        flow.last_ns, flow.sent = now, flow.sent + n
    if flow.wanted is not None and flow.sent >= flow.wanted:
        s.shutdown(socket.SHUT_WR)
        flow.shut = True
        sel.modify(s, selectors.EVENT_READ, flow)


def send(args):
    stop = stop_on_signals()
    start_ns = time.time_ns() if args.start_at is None else int(args.start_at * 1e9)
    while not stop and (wait_ns := start_ns - time.time_ns()) > 0:
        time.sleep(min(wait_ns / 1e9, 0.5))
    end_ns = None if args.duration_s is None else start_ns + int(args.duration_s * 1e9)
    wanted = [None] * args.flows if args.bytes is None else shares(args.bytes, args.flows)
    flows, sel = [Flow(i, w) for i, w in enumerate(wanted)], selectors.DefaultSelector()
    if not stop:
        for flow in flows:
            open_flow(flow, args, sel)
        log(f"started: {args.flows} flows to {args.connect}:{args.port}")
    while not stop and sel.get_map():
        now = time.time_ns()
        if end_ns is not None and now >= end_ns:
            break
        timeout = 0.5 if end_ns is None else min(0.5, (end_ns - now) / 1e9)
        for key, _ in sel.select(timeout=timeout):
            try:
                step(key.data, sel)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                fail(key.data, exc, sel)
    for flow in flows:  # those still open: the duration ended, or a signal came
        if flow.status != "open" or flow.sock is None:
            continue
        if end_ns is not None and not stop:
            flow.status = "done" if flow.connected_ns is not None else "error"
            flow.error = None if flow.connected_ns is not None else "not connected by the end"
        close(flow, sel)
    settings = {k: getattr(args, k) for k in ("flows", "bytes", "duration_s", "cc", "tos")}
    settings["pacing_rate"] = args.pacing_rate
    report = {"program": PROGRAM, "version": VERSION, "role": "sender"}
    report |= {"start_ns": start_ns, "end_ns": time.time_ns(), "settings": settings}
    report |= {"flows": [f.row() for f in flows], "cpu_s": cpu_s()}
    failed = [f for f in flows if f.status == "error"]
    report["error"] = f"{len(failed)} of {len(flows)} flows failed" if failed else None
    write_report(args.out, report)
    log(f"finished: {sum(f.sent for f in flows)} bytes on {len(flows)} flows, {len(failed)} failed")
    return 1 if failed else 0


def main(argv=None):
    p = argparse.ArgumentParser(prog=PROGRAM)
    sub = p.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("receiver")
    r.add_argument("--bind", required=True)
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--out", required=True)
    s = sub.add_parser("sender")
    s.add_argument("--bind", required=True)
    s.add_argument("--connect", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--flows", type=int, default=1)
    length = s.add_mutually_exclusive_group(required=True)
    length.add_argument("--duration-s", type=float)
    length.add_argument("--bytes", type=int)
    s.add_argument("--start-at", type=float, help="epoch seconds at which to connect")
    s.add_argument("--cc")
    s.add_argument("--tos", type=int, help="the whole ToS byte (DSCP << 2)")
    s.add_argument("--pacing-rate", type=int, help="SO_MAX_PACING_RATE, bytes per second")
    s.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.mode == "sender" and not 1 <= args.flows <= (args.bytes or args.flows):
        p.error("--flows must be at least 1, and --bytes at least one per flow")
    return receive(args) if args.mode == "receiver" else send(args)


if __name__ == "__main__":
    sys.exit(main())
