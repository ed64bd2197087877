#!/usr/bin/env python3
"""The web-like workload on rack hosts (standard library only, no project imports): the
web_poisson generator starts it from the host's shipped hostside/ folder, in the trial's
directory, through trialbed-daemon.

  web_flows.py server --bind ADDR --port PORT
      accepts TCP connections and reads each to its end (EOF), then closes it. Logs "ready"
      once it listens.

  web_flows.py client --schedule FILE --bind ADDR --connect ADDR --port PORT
                      --duration-s S [--start-at EPOCH_S] [--backlogged] --out FLOWS.jsonl
      FILE is JSON: {"t_ns": [...], "bytes": [...], "group": [...]}, start offsets from
      --start-at (the runner gives T0 + start and starts the client during the lead: under
      TCG the interpreter's own start took 8 s, which a client started at T0 took from its
      schedule; default: the client's start). It waits for that time; at each offset it opens a
      connection from ADDR, writes that many bytes, shuts its side down and waits for the
      server's close. With --backlogged, one more connection (flow id -1) writes from the
      start until the end of the duration. At the end of the duration (or SIGTERM) it stops,
      abandons the flows still open and writes one JSON line per flow to FLOWS.jsonl:
      {"flow", "group", "bytes", "sport", "sched_ns", "connect_ns", "done_ns", "sent",
       "status": done|open|error, "error"}; times are CLOCK_REALTIME ns (the captures' clock).
      The flow completion time itself is taken from the captures (analysis/traffic).

One thread and a selector: flows are a few packets each, arrivals tens per second.
"""

import argparse
import errno
import heapq
import json
import os
import selectors
import signal
import socket
import sys
import time

CHUNK = 65536
PAYLOAD = memoryview(b"\x5a" * CHUNK)


def log(msg):
    print(f"web_flows: {msg}", file=sys.stderr, flush=True)


def serve(args):
    sel = selectors.DefaultSelector()
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((args.bind, args.port))
    lsock.listen(1024)
    lsock.setblocking(False)
    sel.register(lsock, selectors.EVENT_READ)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    log(f"ready: listening on {args.bind}:{args.port}")
    connections, received = 0, 0
    while not stop:
        for key, _ in sel.select(timeout=0.5):
            if key.fileobj is lsock:
                try:
                    conn, _ = lsock.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ)
                connections += 1
                continue
            conn = key.fileobj
            try:
                data = conn.recv(CHUNK)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            received += len(data)
            if not data:
                sel.unregister(conn)
                conn.close()
    log(f"stopped: {connections} connections, {received} bytes")


class Flow:
    def __init__(self, fid, group, size, sched_ns):
        self.fid, self.group, self.size, self.sched_ns = fid, group, size, sched_ns
        self.sock, self.sport = None, None
        self.connect_ns = self.done_ns = None
        self.sent, self.status, self.error = 0, "open", None
        self.shut = False

    def row(self):
        return {
            "flow": self.fid,
            "group": self.group,
            "bytes": self.size,
            "sport": self.sport,
            "sched_ns": self.sched_ns,
            "connect_ns": self.connect_ns,
            "done_ns": self.done_ns,
            "sent": self.sent,
            "status": self.status,
            "error": self.error,
        }


def client(args):
    with open(args.schedule) as f:
        sched = json.load(f)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    start_ns = time.time_ns() if args.start_at is None else int(args.start_at * 1e9)
    while not stop and (wait_ns := start_ns - time.time_ns()) > 0:
        time.sleep(min(wait_ns / 1e9, 0.5))
    end_ns = start_ns + int(args.duration_s * 1e9)
    columns = zip(sched["t_ns"], sched["group"], sched["bytes"], strict=True)
    pending = [(start_ns + t, i, g, b) for i, (t, g, b) in enumerate(columns)]
    heapq.heapify(pending)
    flows, sel = [], selectors.DefaultSelector()

    def open_flow(flow):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setblocking(False)
        s.bind((args.bind, 0))
        flow.sock, flow.sport = s, s.getsockname()[1]
        flow.connect_ns = time.time_ns()
        flows.append(flow)
        err = s.connect_ex((args.connect, args.port))
        if err not in (0, errno.EINPROGRESS):
            flow.status, flow.error = "error", os.strerror(err)
            s.close()
            return
        sel.register(s, selectors.EVENT_WRITE, flow)

    if args.backlogged:
        open_flow(Flow(-1, 0, None, start_ns))
    log(f"started: {len(pending)} flows scheduled over {args.duration_s:g} s")
    while not stop:
        now = time.time_ns()
        # flows due first: a wake-up a little late must not drop one scheduled just before the
        # end (seen: a flow at 19.9985 s of 20 s never started when the loop woke at 20.0 s)
        while pending and pending[0][0] <= now and pending[0][0] < end_ns:
            at, i, g, b = heapq.heappop(pending)
            open_flow(Flow(i, g, b, at))
        if now >= end_ns:
            break
        wake = min(pending[0][0] if pending else end_ns, end_ns)
        timeout = max(0.0, (wake - time.time_ns()) / 1e9)
        for key, _ in sel.select(timeout=timeout):
            flow = key.data
            s = flow.sock
            try:
                if not flow.shut:
                    left = CHUNK if flow.size is None else flow.size - flow.sent
                    if left > 0:
                        flow.sent += s.send(PAYLOAD[: min(left, CHUNK)])
                    if flow.size is not None and flow.sent >= flow.size:
                        s.shutdown(socket.SHUT_WR)
                        flow.shut = True
                        sel.modify(s, selectors.EVENT_READ, flow)
                elif not s.recv(CHUNK):  # the server read everything and closed
                    flow.status, flow.done_ns = "done", time.time_ns()
                    sel.unregister(s)
                    s.close()
            except (BlockingIOError, InterruptedError):
                continue
            except OSError as exc:
                flow.status, flow.error = "error", exc.strerror or str(exc)
                sel.unregister(s)
                s.close()
    for flow in flows:
        if flow.status == "open":
            flow.sock.close()
    with open(args.out + ".tmp", "w") as f:
        for flow in flows:
            f.write(json.dumps(flow.row()) + "\n")
    os.replace(args.out + ".tmp", args.out)
    done = sum(f.status == "done" for f in flows)
    errors = sum(f.status == "error" for f in flows)
    log(f"finished: {len(flows)} flows, {done} done, {errors} errors, {len(pending)} not started")


def main(argv=None):
    p = argparse.ArgumentParser(prog="web_flows")
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("server")
    s.add_argument("--bind", required=True)
    s.add_argument("--port", type=int, required=True)
    c = sub.add_parser("client")
    c.add_argument("--schedule", required=True)
    c.add_argument("--bind", required=True)
    c.add_argument("--connect", required=True)
    c.add_argument("--port", type=int, required=True)
    c.add_argument("--duration-s", type=float, required=True)
    c.add_argument("--start-at", type=float, help="epoch seconds of the schedule's zero")
    c.add_argument("--backlogged", action="store_true")
    c.add_argument("--out", required=True)
    args = p.parse_args(argv)
    serve(args) if args.mode == "server" else client(args)


if __name__ == "__main__":
    main()
