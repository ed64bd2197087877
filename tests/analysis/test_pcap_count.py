"""collect.pcap_count against a capture tcpdump wrote of packets sent here, and against the
same file cut short as a full disk leaves it."""

from __future__ import annotations

import select
import shutil
import socket
import subprocess
import time

import pytest

from analysis.pcap import read_pcap
from collect.pcap_count import pcap_packets


def test_counts_what_tcpdump_wrote_and_not_a_record_cut_short(tmp_path):
    if shutil.which("tcpdump") is None:
        pytest.skip("tcpdump is missing")
    path = tmp_path / "lo.pcap"
    port = 39000 + int(time.time()) % 1000
    dump = subprocess.Popen(
        ["tcpdump", "-i", "lo", "-n", "-w", str(path), "-s", "200",
         "--time-stamp-precision=nano", "-U", f"udp and dst port {port}"],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert dump.stderr is not None
        ready, _, _ = select.select([dump.stderr], [], [], 10)
        assert ready, "tcpdump said nothing in 10 s"
        assert "listening on" in dump.stderr.readline()  # said once its socket is open
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for i in range(500):
                s.sendto(b"x" * (50 + i % 300), ("127.0.0.1", port))
        deadline = time.monotonic() + 10  # until it wrote them all (-U: each as it reads it)
        while pcap_packets(path) < 500 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        dump.terminate()
        said = dump.communicate(timeout=10)[1]
    captured = int(next(w.split()[0] for w in said.splitlines() if "captured" in w))
    assert captured > 400  # (the kernel may drop a few from a full buffer)
    assert pcap_packets(path) == len(read_pcap(path)) == captured
    # The file as a full disk leaves it: the last record cut short.
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(path.read_bytes()[:-10])
    assert pcap_packets(cut) == captured - 1
    cut.write_bytes(path.read_bytes()[:24])
    assert pcap_packets(cut) == 0
