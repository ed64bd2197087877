"""A lab reaches some hosts only through another (a bastion, a jump host) or on another port;
the runner follows the inventory's ansible_ssh_common_args and ansible_port as Ansible does. On
the test rack, host B is reached through host A: B's sshd sees the session come from A's
management address (SSH_CONNECTION), for the runner and for Ansible alike; a wrong
ansible_port is where the runner knocks."""

from __future__ import annotations

import pytest
import yaml

from core.rack import Rack, RackError
from tests.e2e.conftest import ad_hoc
from trials.preflight import reachability

pytestmark = pytest.mark.rack


def client_of(rack: Rack, name: str) -> str:
    """The address B's sshd saw the session come from."""
    return rack.run(name, "echo $SSH_CONNECTION").split()[0]


def through_a(test_rack, tmp_path, how: str) -> list:
    """The test rack's inventory, with B reached through A by `how` (ProxyCommand or
    ProxyJump), A's key and known hosts for both hops."""
    a = Rack.load([test_rack.inventory]).host("A")
    key, known = a.vars["ansible_ssh_private_key_file"], a.vars["trialbed_known_hosts"]
    trust = f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes"
    if how == "ProxyCommand":
        proxy = f"ssh -i {key} {trust} -o IdentitiesOnly=yes -W %h:%p root@{a.address}"
        args = f"{trust} -o ProxyCommand='{proxy}'"
    else:
        args = f"{trust} -J root@{a.address}"
    overlay = tmp_path / f"{how}.yml"
    overlay.write_text(yaml.safe_dump({"all": {"hosts": {"B": {"ansible_ssh_common_args": args}}}}))
    return [test_rack.inventory, overlay]


def test_b_through_a_by_proxycommand_for_the_runner_and_ansible(test_rack, tmp_path):
    direct = Rack.load([test_rack.inventory])
    a_address = direct.host("A").address
    assert client_of(direct, "B") != a_address  # straight from the controller
    direct.close()
    inventories = through_a(test_rack, tmp_path, "ProxyCommand")
    rack = Rack.load(inventories)
    assert client_of(rack, "B") == a_address
    rack.close()
    done = ad_hoc(inventories, "B", "shell", "echo $SSH_CONNECTION")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1].split()[0] == a_address, done.stdout


def test_b_through_a_by_proxyjump_for_the_runner(test_rack, tmp_path):
    rack = Rack.load(through_a(test_rack, tmp_path, "ProxyJump"))
    assert client_of(rack, "B") == rack.host("A").address
    assert rack.run("B", "hostname").strip() == "B"
    rack.close()


def test_a_wrong_ansible_port_is_where_the_runner_knocks(test_rack, tmp_path):
    overlay = tmp_path / "port.yml"
    overlay.write_text(yaml.safe_dump({"all": {"hosts": {"C": {"ansible_port": 2}}}}))
    rack = Rack.load([test_rack.inventory, overlay])
    with pytest.raises(RackError) as exc:
        rack.run("C", "true")
    assert "port 2 " in str(exc.value)  # paramiko: Unable to connect to port 2 on <address>
    answered, problems = reachability(rack, ["C"])
    assert answered == [] and len(problems) == 1
    assert f"host C (root@{rack.host('C').address}:2) is unreachable over SSH" in problems[0]
    assert "its sshd listens (port 2: ansible_port)" in problems[0]
    rack.close()
