"""The programs that run on rack hosts (the project's hostside/ folder): which files are shipped
and their sha256, where the shipped copy is on a host, and the command lines that run them there.

Role remote_daemons copies the folder to <trialbed_dir>/hostside/ on every host, with a
SHA256SUMS file made here (filter trialbed_hostside_files); the runner starts each program from
there. Each trial's host facts (hostside/probes/host_facts.py) record the sha256 of every listed
file as it is on the host (record: hosts.<host>.hostside).

The two read-only probes (PROBES: a host's facts, `trials status`) are in the folder and shipped
with it too, but they also run where nothing may be shipped first (preflight reads only; a host
configure never reached): there their text, this folder's file with the core modules it
imports carried inside (core/program_source.py), goes over SSH as `python3 -c`. The
controller, as a host of its own rack, imports them from the folder (load_program).

How a trial records with the recorders (core.daemons.Daemons runs a command in the host's
trial directory, so the relative output names land there and are collected with the rest):

    # every router with a shaped egress, after the captures listen, before traffic:
    daemons.spawn(host, "tc_sampler", tc_sampler_command(dir, ifaces))   # -> tc_samples.jsonl
    # (a FreeBSD router: ipfw_sampler_command(dir, pipes, rio_queues=...) -> ipfw_samples.jsonl,
    #  its rio links' two queues included)
    # every Linux TCP sender, with the addresses of its flows' two ends:
    daemons.spawn(host, "tcp_probe", tcp_probe_command(dir, addrs, tag=trial_name),
                  ready="recording tcp_probe")                       # -> tcp_probe.txt
    ...  # traffic, drain
    daemons.stop_all(host, ["tc_sampler", "tcp_probe"])  # one round trip per host

where dir is remote_dir(the host's workdir). The analysis reads <trial>/<router
host>/tc_samples.jsonl (analysis.trial.TC_SAMPLES) and <trial>/<sender host>/tcp_probe.txt
(analysis.traffic.bulk_tcp.TCP_PROBE).
"""

from __future__ import annotations

# Standard library and core.command only: the roles' filter
# (playbooks/filter_plugins/trialbed_hostside.py) loads this file by its path.
import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from core.command import Command, command

# The folder on the controller, beside core/ (not core.rack's PROJECT_DIR: the roles' filter
# reads this module, and core.rack needs the SSH libraries).
SOURCE = Path(__file__).resolve().parents[1] / "hostside"
REMOTE_NAME = "hostside"  # <trialbed_dir>/hostside on every host (the host facts read it too)
SUMS = "SHA256SUMS"  # in the shipped folder: `sha256sum -c` reads it (the host facts too)

# The programs the runner starts, relative to the folder (the roles name the delay line, the
# daemon helper and the transaction generator's sources themselves).
RECORDERS = {
    "tc_sampler": "recorders/tc_sampler.py",
    "tcp_probe": "recorders/tcp_probe.py",
    "ipfw_sampler": "recorders/ipfw_sampler.py",
    "siftr": "recorders/siftr.py",
}
EDGE_MARKER = "markers/edge_marker.py"  # imports markers.py beside it
BPF_EDGE_MARKER = "markers/bpf_edge_marker.py"  # builds and loads bpf_tc/edge_marker/
BPF_TC_BUILD = "bpf_tc"  # <trialbed_dir>/bpf_tc/<sha256 of hostside/bpf_tc>/: what it built
WEB_FLOWS = "traffic/web_flows.py"
BULK_SOCKET = "traffic/bulk_socket.py"  # bulk_tcp's `tool: socket`: sends from connect
PROBES = {"host_facts": "probes/host_facts.py", "status": "probes/status_probe.py"}


def _shipped(relative: Path) -> bool:
    """Not what running a program here leaves beside it (Python's byte code, when a test
    imports one by path) nor an editor's hidden files."""
    hidden = any(p == "__pycache__" or p.startswith(".") for p in relative.parts)
    return not hidden and relative.suffix != ".pyc"


def shipped_files(root: Path = SOURCE) -> dict[str, str]:
    """Every file the folder ships, relative path -> sha256 of its bytes, in path order."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and _shipped(p.relative_to(root)))
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files
    }


def sums_text(files: dict[str, str]) -> str:
    """SHA256SUMS as sha256sum(1) writes it: '<sha256>  <path>' per line."""
    return "".join(f"{digest}  {path}\n" for path, digest in files.items())


def folder_files(folder: str, root: Path = SOURCE) -> dict[str, str]:
    """The files of one folder of what `root` ships (a program built from several sources),
    path relative to that folder -> sha256."""
    prefix = folder.rstrip("/") + "/"
    files = {
        path.removeprefix(prefix): digest
        for path, digest in shipped_files(root).items()
        if path.startswith(prefix)
    }
    if not files:
        raise ValueError(f"{root}: ships no file under {folder!r}")
    return files


def folder_sha256(folder: str, root: Path = SOURCE) -> str:
    """One sha256 for a folder's files: that of their SHA256SUMS lines (paths in the folder)."""
    return hashlib.sha256(sums_text(folder_files(folder, root)).encode()).hexdigest()


def remote_dir(workdir: str) -> str:
    """The shipped folder on a host whose trialbed_dir is `workdir`."""
    return f"{workdir}/{REMOTE_NAME}"


def stale(host: str, on_host: dict[str, str | None] | None, root: Path = SOURCE) -> list[str]:
    """What differs between a host's shipped files (its facts' `hostside`: path -> sha256 as
    on the host, None for a missing one) and the controller's, one line each, naming the fix."""
    fix = "run playbooks/configure.yml on it (role remote_daemons ships the folder)"
    if on_host is None:
        return [
            f"{host}: has no {REMOTE_NAME}/{SUMS} (the host programs were never shipped): {fix}"
        ]
    here = shipped_files(root)
    return [
        f"{host}: {REMOTE_NAME}/{path} "
        + ("is missing" if on_host.get(path) is None else "differs from the controller's")
        + f": {fix}"
        for path in sorted(here)
        if on_host.get(path) != here[path]
    ]


def load_program(path: str, root: Path = SOURCE) -> ModuleType:
    """hostside/`path` imported as a host runs it: a top-level module of its file's name, its
    folder importable while it loads (edge_marker.py imports the markers.py beside it). One
    module per file: loading it again returns the first."""
    file = root / path
    loaded = sys.modules.get(file.stem)
    if loaded is not None and getattr(loaded, "__file__", None) == str(file):
        return loaded
    spec = importlib.util.spec_from_file_location(file.stem, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[file.stem] = module  # before it runs: dataclasses look their module up
    sys.path.insert(0, str(file.parent))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[file.stem]
        raise
    finally:
        sys.path.remove(str(file.parent))
    return module


def program_command(
    hostside_dir: str, program: str, *args: str, python: str = "python3"
) -> Command:
    """`python3 <hostside_dir>/<program> ARGS...`, each word quoted for sh."""
    return command(python, f"{hostside_dir}/{program}", *args)


def tc_sampler_command(
    hostside_dir: str, devices: list[str], out: str = "tc_samples.jsonl", interval_ms: float = 10.0
) -> Command:
    """Samples `tc -s -j qdisc show` of `devices` every `interval_ms` into `out` (JSON lines)
    until SIGTERM/SIGINT."""
    args = ("--interval-ms", f"{interval_ms:g}", "--out", out, *devices)
    return program_command(hostside_dir, RECORDERS["tc_sampler"], *args)


def ipfw_sampler_command(
    hostside_dir: str,
    pipes: dict[str, int],
    out: str = "ipfw_samples.jsonl",
    interval_ms: float = 10.0,
    rio_queues: dict[str, dict[str, int]] | None = None,
) -> Command:
    """Samples `ipfw pipe show` of a FreeBSD router's pipes ({egress interface: pipe number},
    as freebsd_router numbers them) every `interval_ms` into `out` until SIGTERM/SIGINT. An
    interface in `rio_queues` ({interface: {"in": N, "out": M}}, qdisc rio: its packets wait
    in those two queues, not in the pipe's) is sampled with `ipfw queue show N M` instead,
    given as DEV=PIPE/IN,OUT."""
    rio_queues = rio_queues or {}
    specs = [
        f"{dev}={number}/{rio_queues[dev]['in']},{rio_queues[dev]['out']}"
        if dev in rio_queues
        else f"{dev}={number}"
        for dev, number in sorted(pipes.items())
    ]
    args = ("--interval-ms", f"{interval_ms:g}", "--out", out, *specs)
    return program_command(hostside_dir, RECORDERS["ipfw_sampler"], *args)


def tcp_probe_command(
    hostside_dir: str, addresses: list[str], out: str = "tcp_probe.txt", tag: str = ""
) -> Command:
    """Records the tcp:tcp_probe tracepoint for sockets with an address in `addresses` (its
    own tracefs instance, mounting tracefs if needed) into `out` until SIGTERM/SIGINT."""
    extra = ["--tag", tag] if tag else []
    return program_command(hostside_dir, RECORDERS["tcp_probe"], "--out", out, *extra, *addresses)


def siftr_command(hostside_dir: str, out: str = "siftr.log", port: int | None = None) -> Command:
    """Records SIFTR on a FreeBSD sender into `out` (every packet; only `port`'s flows if
    given) until SIGTERM/SIGINT; prints "recording siftr" once enabled."""
    extra = ["--port", str(port)] if port is not None else []
    return program_command(hostside_dir, RECORDERS["siftr"], "--out", out, *extra)
