"""SSH connections to rack hosts give up on a dead link within seconds (core.rack): the TCP
options set on the socket once Fabric opened it, read back from the kernel."""

from __future__ import annotations

import socket
from types import SimpleNamespace

from core import rack


def test_an_opened_connection_times_out_unacknowledged_data_and_idles_with_keepalives():
    """...and sends small messages without waiting (TCP_NODELAY)."""
    server = socket.create_server(("127.0.0.1", 0))
    sock = socket.create_connection(server.getsockname())
    transport = SimpleNamespace(sock=sock)
    conn = SimpleNamespace(client=SimpleNamespace(get_transport=lambda: transport))
    opened = []
    wrapped = rack._failing_fast(lambda: opened.append(True) or "result", conn)
    try:
        assert wrapped() == "result" and opened == [True]
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 15_000
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 5
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        sock.close()
        server.close()
    # Through a ProxyCommand the transport has no TCP socket: nothing to set, no error.
    transport.sock = object()
    assert wrapped() == "result"
