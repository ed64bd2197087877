"""Congestion controls a kernel lacks, provided as BPF programs (hostside/bpf_cc/<name>/,
registered by roles/testbed_host): whether a host can run a congestion control as the
implementation asked for (auto, module, bpf), and which implementation a trial ran with. Both
read a host's facts (hostside/probes/host_facts.py: cc_loaded, cc_modules, cc_params, kernel,
bpf_cc, bpf_cc_kernel)."""

from __future__ import annotations

from typing import Any

from core.layout import PROJECT_DIR
from core.link_rules import cc_kernel_name

BPF_CC_DIR = PROJECT_DIR / "hostside" / "bpf_cc"
# What building one needs on the host, by the facts' names -> the Debian package.
BUILD_TOOLS = {"clang": "clang", "cc": "gcc", "bpftool": "bpftool"}


def bpf_cc_names() -> list[str]:
    """The congestion controls hostside/bpf_cc/ has: a folder <name>/ with <name>.bpf.c (the role
    finds them by the same rule: roles/testbed_host/vars/main.yml)."""
    sources = BPF_CC_DIR.glob("*/*.bpf.c")
    return sorted(p.parent.name for p in sources if p.name == f"{p.parent.name}.bpf.c")


def kernel_has_own(facts: dict[str, Any], cc: str) -> bool:
    """Whether the host's kernel has its own `cc`: built in, a loaded module (not a BPF one
    that testbed_host registered under that name) or a module to load."""
    own_loaded = cc in facts.get("cc_loaded", []) and cc not in (facts.get("bpf_cc") or {})
    return own_loaded or cc in facts.get("cc_modules", [])


def bpf_cc_problem(facts: dict[str, Any], cc: str, implementation: str = "auto") -> str | None:
    """Why a host cannot run congestion control `cc` as `implementation` (auto, module, bpf:
    core/link_rules.py CC_IMPLEMENTATIONS), or None when it can. auto: the kernel has it (built
    in, loaded or registered), has its module, or can take it as a BPF program; module: the
    kernel's own; bpf: as a BPF program. Names every missing piece and where it comes from."""
    kernel = f"kernel {facts.get('kernel', '?')}"
    if implementation == "module":
        if kernel_has_own(facts, cc):
            return None
        return (
            f"cc_implementation module: this {kernel} has no {cc} of its own (neither built "
            f"in nor a module tcp_{cc}; it has: {', '.join(facts.get('cc_loaded', []))}). Use "
            f"cc_implementation auto or bpf, or a kernel with tcp_{cc} (the VM rack: RACK=vm)"
        )
    if implementation != "bpf" and (
        cc in facts.get("cc_loaded", []) or cc in facts.get("cc_modules", [])
    ):
        return None
    if cc not in bpf_cc_names():
        if implementation == "bpf":
            return (
                f"cc_implementation bpf: hostside/bpf_cc/ has no BPF implementation of {cc} "
                f"(it has: {', '.join(bpf_cc_names()) or 'none'})"
            )
        return (
            f"{cc} is neither in this {kernel} nor a module of it, and hostside/bpf_cc/ has no "
            f"BPF implementation of it (it has: {', '.join(bpf_cc_names()) or 'none'})"
        )
    why = (
        f"cc_implementation bpf asks for {cc} as a BPF program on this {kernel}"
        if implementation == "bpf"
        else f"{cc} is neither in this {kernel} nor a module of it"
    )
    support = facts.get("bpf_cc_kernel")
    if support is None:
        return (
            f"{why}, and whether the kernel can take "
            "it as a BPF program is unknown (no bpf_cc_kernel fact: not a Linux host?)"
        )
    missing = []
    if not support["btf"]:
        missing.append("BTF (/sys/kernel/btf/vmlinux: CONFIG_DEBUG_INFO_BTF)")
    if support["bpf_tcp_ca"] is False:
        missing.append("BPF congestion control (bpf_tcp_ca: CONFIG_BPF_JIT and Linux 5.6 or later)")
    if support["jit"] is False:
        missing.append("the BPF JIT (net.core.bpf_jit_enable=1)")
    if missing:
        return (
            f"{why}, and the kernel cannot take "
            f"it as a BPF program: it lacks {'; '.join(missing)}. Use a kernel with tcp_{cc} or "
            "with those (the VM rack: RACK=vm)"
        )
    tools = [pkg for name, pkg in BUILD_TOOLS.items() if not support["tools"].get(name)]
    if not support["libbpf_headers"]:
        tools.append("libbpf-dev")
    if tools:
        return (
            f"{why}; it can run as a BPF program, which is built on the host, but the host "
            f"lacks {', '.join(tools)} (Debian packages; the virtual rack: make setup; the VM "
            "rack: its image; a lab rack: testbed_host installs them with "
            "testbed_host_install_packages: true)"
        )
    return None


def bpf_cc_provenance(
    facts: dict[str, Any], cc: str, implementation: str | None = None
) -> dict[str, Any]:
    """Which implementation of `cc` a host ran, for the trial record: `bpf` (registered from
    hostside/bpf_cc/<cc>/, under the name the flows selected: the source's and the object's
    sha256, the parameters in force) or `module` (the kernel's own, built in or a module: its
    release and module parameters). `implementation`: what the host was asked for
    (hosts.<key>.cc_implementation; None: auto)."""
    name = cc_kernel_name(cc, implementation)
    record = facts.get("bpf_cc", {}).get(name)
    if record is None and implementation == "bpf":  # asked for, and not registered
        return {"cc": cc, "implementation": "unknown", "asked": "bpf", "registered_as": name}
    if record:
        return {
            "cc": cc,
            "implementation": "bpf",
            "asked": implementation or "auto",
            "registered_as": name,
            "source": f"hostside/bpf_cc/{cc}",
            "source_sha256": record["source_sha256"],
            "object_sha256": record["object_sha256"],
            "struct_ops_id": record["id"],
            "params": record["params"],
        }
    return {
        "cc": cc,
        "implementation": "module",
        "asked": implementation or "auto",
        "kernel": facts.get("kernel"),
        "params": facts.get("cc_params", {}).get(cc, {}),
    }
