"""A constant-bit-rate UDP stream (seed 000's VoIP-like flow): a pcap of fixed-size IP
packets at a fixed interval; and what any pcap replayed from a rack host needs: its frames
written (write_pcap), the sender's interface and next hop (next_hop), and the rack's addresses
and MACs put in (rewrite_for_rack).

The file is generated with placeholder addresses, then rewritten with tcprewrite for the
rack's addresses and MACs, and replayed in real time with tcpreplay. Every payload starts
with the packet's sequence number, so that a packet can be matched between two captures
even after its IP ID has wrapped.
"""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import numpy as np

from core.command import and_then, command
from core.link_rules import ETHERNET_HEADER
from core.rack import Rack

TEMPLATE_SRC = "198.18.255.1"
TEMPLATE_DST = "198.18.255.2"


def write_stream_template(
    path: Path, *, packets: int, ip_bytes: int, interval_ns: int, port: int, dscp: int = 0
) -> None:
    """Write `packets` UDP packets of `ip_bytes` IP bytes, `interval_ns` apart, with the given
    DSCP (nanosecond pcap)."""
    if ip_bytes < 28 + 8:
        raise ValueError(
            "a stream packet needs at least 36 IP bytes (headers and a sequence number)"
        )
    frame = bytearray(ETHERNET_HEADER + ip_bytes)
    frame[12:14] = b"\x08\x00"
    src = bytes(map(int, TEMPLATE_SRC.split(".")))
    dst = bytes(map(int, TEMPLATE_DST.split(".")))
    # IPv4 header (checksum filled in by tcprewrite --fixcsum) and UDP header.
    frame[14:34] = struct.pack(
        "!BBHHHBBH4s4s", 0x45, dscp << 2, ip_bytes, 0, 0, 64, 17, 0, src, dst
    )
    frame[34:42] = struct.pack("!HHHH", port, port, ip_bytes - 20, 0)

    seq = np.arange(packets, dtype=np.uint64)
    frames = np.tile(np.frombuffer(bytes(frame), dtype=np.uint8), (packets, 1))
    frames[:, 18:20] = (seq % 65536).astype(">u2").view(np.uint8).reshape(-1, 2)  # IP ID
    frames[:, 42:50] = seq.astype(">u8").view(np.uint8).reshape(-1, 8)  # sequence number
    write_pcap(path, frames, seq * np.uint64(interval_ns))


def write_pcap(path: Path, frames: np.ndarray, ts_ns: np.ndarray) -> None:
    """Write equal-length Ethernet frames (rows of uint8) at times `ts_ns` (nanosecond pcap)."""
    rec = np.zeros(
        len(frames),
        dtype=[
            ("sec", "<u4"),
            ("nsec", "<u4"),
            ("incl", "<u4"),
            ("orig", "<u4"),
            ("frame", "u1", frames.shape[1]),
        ],
    )
    rec["sec"] = ts_ns // 10**9
    rec["nsec"] = ts_ns % 10**9
    rec["incl"] = rec["orig"] = frames.shape[1]
    rec["frame"] = frames
    header = struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1)
    with path.open("wb") as out:
        out.write(header)
        out.write(rec.tobytes())


def next_hop(rack: Rack, sender: str, dst: str) -> tuple[str, str, str]:
    """(interface, its MAC, the next hop's MAC) of host `sender`'s route to address `dst`, as
    its kernel picks it."""
    # The route and the interfaces' addresses in one round trip (two JSON lines).
    route_and_links = and_then(
        command("ip", "-j", "route", "get", dst), command("ip", "-j", "link", "show")
    )
    route_json, links_json = rack.run(sender, route_and_links).splitlines()[:2]
    route = json.loads(route_json)[0]
    gateway, iface = route.get("gateway", dst), route["dev"]
    src_mac = {link["ifname"]: link.get("address") for link in json.loads(links_json)}[iface]
    found = rack.interface_with_address(gateway)
    if found is None:
        raise RuntimeError(f"no inventory host owns {sender}'s next hop {gateway}")
    owner, owner_if = found
    hop_mac = rack.run(owner.name, command("cat", f"/sys/class/net/{owner_if}/address"))
    return iface, src_mac, hop_mac.strip()


def rewrite_for_rack(
    template: Path, out: Path, *, src_ip: str, dst_ip: str, src_mac: str, next_hop_mac: str
) -> None:
    """Point the template at the rack: addresses, the sender's MAC and its next hop's MAC."""
    subprocess.run(
        [
            "tcprewrite",
            f"--infile={template}",
            f"--outfile={out}",
            f"--srcipmap={TEMPLATE_SRC}/32:{src_ip}/32",
            f"--dstipmap={TEMPLATE_DST}/32:{dst_ip}/32",
            f"--enet-smac={src_mac}",
            f"--enet-dmac={next_hop_mac}",
            "--fixcsum",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
