"""Filters that turn a linux_router_links entry with qdisc rio into GRED's virtual queues and
the clsact filters that choose them, through core/rio.py (the code the experiment schema and
the runner use): the thresholds are given in packets and converted here, once, to bytes. For
kernels without GRED, the BPF RIO's load-time parameters and record (core/rio_bpf.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from ansible.errors import AnsibleFilterError

# The core of the checkout this plugin belongs to, ahead of any other on the path (an
# installed one may be another checkout's).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from core import link_rules, rio, rio_bpf


def rio_virtual_queues(link: dict) -> list[dict]:
    """IN (VQ 0) and OUT (VQ 1) in bytes, with their burst (GRED's EWMA weight) and prio."""
    try:
        return [vq.record() for vq in rio.virtual_queues(link.get("rio") or {}, link["buffer"])]
    except (rio.RioError, KeyError) as e:
        raise AnsibleFilterError(f"linux_router_links entry {link.get('iface')}: {e}") from e


def rio_filters(link: dict) -> list[dict]:
    """The ToS value/mask of every DSCP that is IN (a clsact egress flower filter each)."""
    try:
        return rio.tos_filters(link.get("rio") or {})
    except rio.RioError as e:
        raise AnsibleFilterError(f"linux_router_links entry {link.get('iface')}: {e}") from e


def rio_record(links: list[dict]) -> dict[str, list[dict]]:
    """Per rio interface: its virtual queues as applied (thresholds in packets and bytes, the
    mean packet size that converted them, w_q asked and used), for the applied record."""
    return {
        link["iface"]: rio_virtual_queues(link)
        for link in links
        if link_rules.qdisc_of(link) == "rio"
    }


def rio_links(links: list[dict]) -> list[dict]:
    """The links with qdisc rio (core/link_rules.py's default applies to those without one)."""
    return [link for link in links if link_rules.qdisc_of(link) == "rio"]


def rio_bpf_source_sha256(folder: str) -> str:
    """The BPF RIO's source digest (core/rio_bpf.source_sha256: its program and the header it
    includes), called on its folder under hostside/ ('bpf_tc/rio')."""
    if folder != rio_bpf.SOURCE.rsplit("/", 1)[0]:
        raise AnsibleFilterError(f"trialbed_rio_bpf_source_sha256: {folder!r} is not the BPF RIO")
    return rio_bpf.source_sha256()


def rio_bpf_params(link: dict) -> list[str]:
    """The BPF RIO's parameters for the link, as its loader takes them (NAME=VALUE)."""
    try:
        params = rio_bpf.from_link(link).program_params()
    except (rio.RioError, rio_bpf.RioBpfError, KeyError) as e:
        raise AnsibleFilterError(f"linux_router_links entry {link.get('iface')}: {e}") from e
    return [f"{name}={value}" for name, value in params.items()]


def rio_bpf_record(links: list[dict], source_sha256: str) -> dict[str, dict]:
    """Per rio interface: the BPF RIO as loaded (settings, parameters, the source's sha256)."""
    out = {}
    for link in rio_links(links):
        try:
            record = rio_bpf.from_link(link).record()
        except (rio.RioError, rio_bpf.RioBpfError, KeyError) as e:
            raise AnsibleFilterError(f"linux_router_links entry {link.get('iface')}: {e}") from e
        out[link["iface"]] = {**record, "source_sha256": source_sha256}
    return out


class FilterModule:
    def filters(self):
        return {
            "trialbed_rio_virtual_queues": rio_virtual_queues,
            "trialbed_rio_filters": rio_filters,
            "trialbed_rio_record": rio_record,
            "trialbed_rio_links": rio_links,
            "trialbed_rio_bpf_params": rio_bpf_params,
            "trialbed_rio_bpf_source_sha256": rio_bpf_source_sha256,
            "trialbed_rio_bpf_record": rio_bpf_record,
        }
