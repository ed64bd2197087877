"""analysis.captures: a trial's frames go when its Captures goes."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

from analysis.captures import Captures

from .pcapgen import ethernet, ipv4, udp_datagram, write_pcap


def test_the_frames_go_with_their_captures_without_the_cycle_collector(tmp_path: Path) -> None:
    """Reading a capture makes no reference cycle: when the trial's Captures is dropped,
    its frames are freed at once (a cycle kept every frame of a trial until the cyclic
    collector ran, and a process analysing trials one after another grew by hundreds of MB
    per trial)."""
    (tmp_path / "h1").mkdir()
    frame = ethernet(ipv4("198.18.0.1", "198.18.0.2", 17, udp_datagram(5000, 5001, b"x" * 10)))
    write_pcap(tmp_path / "h1" / "sender.pcap", [(10**9, frame)])
    sites = {"sender": {"host": "h1", "iface": "eth0", "clock": "h1"}}
    record = {"network": {"captures": sites, "interfaces": {}}}
    gc.disable()
    try:
        caps = Captures(tmp_path, record)
        frame_read = weakref.ref(caps.packets("sender"))
        assert caps.packets("sender") is frame_read()  # read once
        held = weakref.ref(caps)
        del caps
        assert held() is None and frame_read() is None
    finally:
        gc.enable()
