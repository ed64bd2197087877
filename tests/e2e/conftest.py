"""Virtual racks of the tests' own (own namespaces, bridges, addresses and state), so that the
tests never disturb a rack the user has up; each is removed at the end of the session.

`test_rack` is the seed-000 dumbbell (prefix tt-, management 198.19.1.0/24), `chain_rack` the
seed-001 two-router chain (prefix tc-, management 198.19.2.0/24; its state below /tmp)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from core.layout import CATALOG
from core.rack import Rack

PROJECT = Path(__file__).resolve().parents[2]
TOPOLOGIES = PROJECT / "inventory/virtual/topologies"
OWNER_DIR = Path("/run/trialbed")
PREFIX = "tt-"
CHAIN_PREFIX = "tc-"
# The chain test racks carry four of the topology's eight pairs (see trim_chain).
CHAIN_PAIRS = 4


@dataclass
class TestRack:
    __test__ = False  # a helper, not a test class (test modules import it)

    topology: Path
    inventory: Path
    state_dir: Path
    prefix: str = PREFIX
    first_up: subprocess.CompletedProcess | None = None

    @staticmethod
    def playbook_command(playbook: str, *args: str) -> dict:
        """subprocess keyword arguments of `ansible-playbook playbooks/<playbook> ARGS`."""
        return {
            "args": [
                str(PROJECT / ".venv/bin/ansible-playbook"),
                str(PROJECT / "playbooks" / playbook),
                *args,
            ],
            "stdin": subprocess.DEVNULL,
            "text": True,
            "env": {
                **os.environ,
                "ANSIBLE_CONFIG": str(PROJECT / "ansible.cfg"),
                "ANSIBLE_NOCOLOR": "1",
            },
        }

    def playbook(self, playbook: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            **self.playbook_command(playbook, *args), capture_output=True, check=False
        )

    def start_playbook(self, playbook: str, *args: str, log: Path) -> subprocess.Popen:
        """`playbook` in the background, its output (stdout and stderr) into `log`."""
        with log.open("w") as out:
            return subprocess.Popen(
                **self.playbook_command(playbook, *args), stdout=out, stderr=subprocess.STDOUT
            )

    def rack_vars(self, state: str) -> list[str]:
        """rack.yml's extra variables for this rack in `state` (present or absent)."""
        return [
            "-e",
            f"virtual_rack_topology_file={self.topology}",
            "-e",
            f"virtual_rack_inventory_file={self.inventory}",
            "-e",
            f"virtual_rack_state_dir={self.state_dir}",
            "-e",
            f"virtual_rack_namespace_prefix={self.prefix}",
            "-e",
            f"virtual_rack_state={state}",
        ]

    def rack(self, state: str, *args: str) -> subprocess.CompletedProcess:
        return self.playbook("rack.yml", *self.rack_vars(state), *args)

    @property
    def owner_file(self) -> Path:
        return OWNER_DIR / f"{self.prefix}rack.json"


def recap(output: str) -> dict[str, dict[str, int]]:
    """PLAY RECAP lines as {host: {ok, changed, unreachable, failed}}."""
    pattern = re.compile(
        r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M
    )
    return {
        m[1]: {"ok": int(m[2]), "changed": int(m[3]), "unreachable": int(m[4]), "failed": int(m[5])}
        for m in pattern.finditer(output)
    }


def namespaces(prefix: str = PREFIX) -> list[str]:
    """Network namespaces whose name starts with `prefix`."""
    out = subprocess.run(["ip", "-j", "netns", "list"], capture_output=True, text=True).stdout
    return sorted(n["name"] for n in json.loads(out or "[]") if n["name"].startswith(prefix))


def rack_leftovers(prefix: str = PREFIX) -> list[str]:
    """Namespaces, links and the owner file of a test rack still present."""
    left = namespaces(prefix)
    links = json.loads(
        subprocess.run(["ip", "-j", "link", "show"], capture_output=True, text=True).stdout
    )
    left += [link["ifname"] for link in links if link["ifname"].startswith(prefix.rstrip("-"))]
    owner = OWNER_DIR / f"{prefix}rack.json"
    return [*left, str(owner)] if owner.exists() else left


def processes_mentioning(text: str) -> list[str]:
    """Command lines of running processes that contain `text` (e.g. the rack's state dir)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in args:
            found.append(args)
    return found


def own_topology(name: str, prefix: str, subnet: int, directory: Path) -> Path:
    """A copy of topologies/<name>.yml in `directory` (beside a copy of group_vars) with its
    own bridges (<prefix><segment>) and management subnet 198.19.<subnet>.0/24; the file keeps
    the topology's name as its stem."""
    topology = yaml.safe_load((TOPOLOGIES / f"{name}.yml").read_text())
    if name == "chain2":
        trim_chain(topology, CHAIN_PAIRS)
    topology["management"]["bridge"] = f"{prefix}mgmt"
    topology["management"]["controller"] = f"198.19.{subnet}.1/24"
    for segment in topology["segments"].values():
        segment["bridge"] = prefix + segment["bridge"].split("-", 1)[1]
    for host in topology["hosts"].values():
        host["mgmt"] = host["mgmt"].replace("198.19.0.", f"198.19.{subnet}.")
    directory.mkdir(parents=True, exist_ok=True)
    if not (directory / "group_vars").exists():
        shutil.copytree(PROJECT / "inventory/virtual/group_vars", directory / "group_vars")
    path = directory / f"{name}.yml"
    path.write_text(yaml.safe_dump(topology, sort_keys=False))
    return path


def trim_chain(topology: dict, pairs: int) -> None:
    """Keep the chain's first `pairs` sender/receiver pairs (S<i>, D<i>, their segments a<i>,
    b<i> and the routers' interfaces on them): no test needs more than four, and every
    namespace more costs each rack-up, teardown and status."""

    def beyond(name: str) -> bool:  # a<i>, b<i>, S<i>, D<i> with i > pairs
        return name[0] in "abSD" and name[1:].isdigit() and int(name[1:]) > pairs

    gone = {n for n in topology["segments"] if beyond(n)}
    topology["segments"] = {n: s for n, s in topology["segments"].items() if n not in gone}
    topology["hosts"] = {n: h for n, h in topology["hosts"].items() if not beyond(n)}
    for host in topology["hosts"].values():
        host["interfaces"] = {i: a for i, a in host["interfaces"].items() if i not in gone}


def state_dir(label: str) -> Path:
    """A test rack's state directory: its name ends in the test session's pid (see
    `remove_stale_test_rack`)."""
    return PROJECT / ".state" / f"test-{label}-{os.getpid()}"


def remove_stale_test_rack(rack: TestRack) -> None:
    """Take down the rack a killed test session left under `rack`'s prefix (its state
    directory names a pid that is gone), with the rack role of the checkout that built it:
    a rack owned by another checkout is only ever removed from there. A rack of a test session
    still running is left alone (its build then fails, naming the owner)."""
    owner = OWNER_DIR / f"{rack.prefix}rack.json"
    try:
        record = json.loads(owner.read_text())
    except (OSError, ValueError):
        return
    ended = re.search(r"-(\d+)$", Path(record.get("state_dir", "")).name)
    if not ended or Path(f"/proc/{ended[1]}").exists():
        return
    checkout = Path(record.get("project_dir", ""))
    if not (checkout / "playbooks/rack.yml").is_file():
        return
    topology = Path(record.get("topology_file", ""))
    stale = TestRack(
        topology=topology if topology.is_file() else rack.topology,
        inventory=Path(record.get("inventory") or rack.inventory),
        state_dir=Path(record["state_dir"]),
        prefix=rack.prefix,
    )
    print(f"taking down the rack a killed test session left: {record['state_dir']}")
    down = subprocess.run(
        [str(PROJECT / ".venv/bin/ansible-playbook"), str(checkout / "playbooks/rack.yml"),
         *stale.rack_vars("absent")],
        capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL,
        env={**os.environ, "ANSIBLE_CONFIG": str(checkout / "ansible.cfg")},
    )  # fmt: skip
    assert down.returncode == 0, down.stdout[-3000:] + down.stderr[-2000:]


def built_rack(
    tmp_path_factory, name: str, prefix: str, subnet: int, under: Path | None = None
) -> Iterator[TestRack]:
    """Build a test rack of topology `name`, yield it, take it down and check nothing of it
    is left (namespaces, links, owner file, processes). `under`: the state directory's parent
    (default: the project's .state)."""
    if os.geteuid() != 0:
        pytest.skip("the virtual rack needs root (network namespaces)")
    base = tmp_path_factory.mktemp(f"rack-{name}") / "inventory"
    rack = TestRack(
        topology=own_topology(name, prefix, subnet, base),
        inventory=base / "hosts.yml",
        state_dir=(under / f"state-{os.getpid()}")
        if under
        else state_dir(f"{prefix.rstrip('-')}-{name}"),
        prefix=prefix,
    )
    remove_stale_test_rack(rack)
    up = rack.rack("present")
    if up.returncode != 0:
        rack.rack("absent")  # leave nothing half-built behind
    assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-2000:]
    rack.first_up = up
    yield rack
    down = rack.rack("absent")
    assert down.returncode == 0, down.stdout[-3000:]
    assert rack_leftovers(prefix) == []
    assert processes_mentioning(str(rack.state_dir)) == []


@pytest.fixture(scope="session")
def test_rack(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the virtual rack needs root (network namespaces)")
    # As on a fresh machine, the initial namespace does not allow CUBIC: configure must add it
    # for the rack's namespaces, and rack-down must put the list back. The list is the
    # machine's: while other racks are up (another checkout's, a long batch's) it holds what
    # they need, so the test narrows it only on a machine with no rack recorded, and otherwise
    # checks that this rack gives back exactly the list it found.
    allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")
    shared = OWNER_DIR / "allowed_cc.json"
    original = allowed.read_text()
    if not shared.exists():
        allowed.write_text("reno")
    found = set(allowed.read_text().split())
    try:
        yield from built_rack(tmp_path_factory, "dumbbell", PREFIX, 1)
        others = json.loads(shared.read_text())["racks"] if shared.exists() else {}
        assert str(state_dir(f"{PREFIX.rstrip('-')}-dumbbell")) not in others
        assert set(allowed.read_text().split()) == found, others
    finally:
        allowed.write_text(original)


@pytest.fixture(scope="session")
def chain_rack(tmp_path_factory):
    # Its state (keys, sshd files, the hosts' trial directories) below /tmp, as in a checkout
    # under /tmp: every trial on it proves that the rack's sshd accepts keys there.
    yield from built_rack(
        tmp_path_factory, "chain2", CHAIN_PREFIX, 2, under=tmp_path_factory.mktemp("chain-rack")
    )


def only_batch(results: Path) -> Path:
    """The one batch a run wrote under `results` (beside it: the results catalog)."""
    (batch,) = [p for p in results.iterdir() if p.name != CATALOG]
    return batch


def trials_run(*args: str, inventory: Path, results: Path) -> list[str]:
    """The command line of `python -m trials run ARGS` on a test rack."""
    return [
        sys.executable,
        "-m",
        "trials",
        "run",
        *args,
        "-i",
        str(inventory),
        "--results",
        str(results),
    ]


def start_trials(*args: str, inventory: Path, results: Path) -> subprocess.Popen:
    """`python -m trials run ARGS` in the background (no stdin, output captured)."""
    return subprocess.Popen(
        trials_run(*args, inventory=inventory, results=results),
        cwd=PROJECT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )


def wait_for_daemon(proc: subprocess.Popen, rack: TestRack, host: str, daemon: str) -> None:
    """Wait until the running trial has started `daemon` on `host` (its pid file exists)."""
    trials = rack.state_dir / "hosts" / host / "work" / "trials"
    deadline = time.time() + 180
    while not list(trials.glob(f"*/*/{daemon}.pid")):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, f"{daemon} did not start on {host}"
        time.sleep(0.5)


# What a host's state is read from: everything configure.yml may change there.
STATE = r"""
sysctl -n net.ipv4.tcp_congestion_control net.ipv4.tcp_no_metrics_save net.ipv4.tcp_rmem \
  net.ipv4.tcp_wmem
for i in $(ls /sys/class/net); do
  echo "$i mtu $(cat /sys/class/net/$i/mtu)"
  ethtool -k $i | grep -E '^(tcp|generic)-(segmentation|receive)-offload:' || true
  tc qdisc show dev $i
done
ip -4 -d route show table all
iptables -t mangle -S
"""


def host_states(rack: Rack) -> dict[str, str]:
    return {h: rack.run(h, f"bash -c {shlex.quote(STATE)}") for h in rack.hosts}


def ad_hoc(inventories: list[Path], host: str, module: str, args: str):
    """`ansible HOST -m MODULE -a ARGS` on the inventories, with the project's ansible.cfg."""
    cmd = [str(PROJECT / ".venv/bin/ansible"), host, "-m", module, "-a", args]
    cmd += [word for inventory in inventories for word in ("-i", str(inventory))]
    env = {**os.environ, "ANSIBLE_CONFIG": str(PROJECT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        cmd, cwd=PROJECT, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
        timeout=120,
    )  # fmt: skip
