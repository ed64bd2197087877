"""core/ssh_options.py: the runner reads a host's SSH settings from the inventory variables
Ansible's ssh connection reads (port, user, key, ansible_ssh_common_args / _extra_args), the
first value of an option winning as in ssh(1); what it cannot honour is refused naming the
host, the variable and what it takes. Nothing is contacted: Fabric's Connection is lazy."""

from __future__ import annotations

import subprocess
import time

import pytest
import yaml

from core.rack import Rack, RackError
from core.ssh_options import Hop, SshOptionError, ansible_host_key_checking, ssh_options

WHERE = "host A (hosts.yml)"


def test_the_virtual_racks_arguments_are_read_as_ansible_reads_them():
    options = ssh_options(
        {
            "ansible_user": "root",
            "ansible_ssh_private_key_file": "/state/id_ed25519",
            "ansible_ssh_common_args": "-o UserKnownHostsFile=/state/known_hosts\n"
            "-o StrictHostKeyChecking=yes -o IdentitiesOnly=yes",
        },
        "198.19.0.11",
        WHERE,
    )
    assert (options.port, options.user, options.key) == (None, "root", "/state/id_ed25519")
    assert (options.known_hosts, options.strict) == ("/state/known_hosts", "yes")
    assert options.jump == () and options.proxy_command is None


def test_of_two_variables_the_one_ansible_reads_last_wins():
    options = ssh_options(
        {"ansible_port": 22, "ansible_ssh_port": 2200, "ansible_user": "a", "ansible_ssh_user": "b",
         "ansible_private_key_file": "/k1", "ansible_ssh_private_key_file": "/k2"},
        "h", WHERE,
    )  # fmt: skip
    assert (options.port, options.user, options.key) == (2200, "b", "/k2")
    assert ssh_options({}, "h", WHERE).port is None  # ssh_config's, else 22


def test_an_option_given_with_a_space_keeps_the_equals_signs_of_its_value():
    command = "-o 'ProxyCommand ssh -o StrictHostKeyChecking=no -W %h:%p j'"
    options = ssh_options({"ansible_ssh_common_args": command}, "198.19.10.11", WHERE)
    assert options.proxy_command == "ssh -o StrictHostKeyChecking=no -W 198.19.10.11:22 j"
    assert ssh_options({"ansible_ssh_common_args": "-o 'Port = 2022'"}, "h", WHERE).port == 2022


def test_of_proxyjump_and_proxycommand_the_first_given_is_the_one():
    said = {"ansible_ssh_common_args": "-o ProxyCommand=none -J jump"}
    neither = ssh_options(said, "h", WHERE)
    assert neither.jump == () and neither.proxy_command is None
    said = {"ansible_ssh_common_args": "-J jump -o ProxyCommand='nc %h %p'"}
    assert ssh_options(said, "h", WHERE).jump == (Hop("jump"),)
    assert ssh_options(said, "h", WHERE).proxy_command is None


def test_ansible_port_wins_over_the_arguments_and_the_first_value_over_later_ones():
    assert (
        ssh_options({"ansible_port": 2222, "ansible_ssh_common_args": "-p 22"}, "h", WHERE).port
        == 2222
    )
    assert ssh_options({"ansible_ssh_common_args": "-p 2200 -o Port=2300"}, "h", WHERE).port == 2200
    common_then_extra = {
        "ansible_ssh_common_args": "-oPort=2300",
        "ansible_ssh_extra_args": "-o 'Port 2400' -l lab",
    }
    options = ssh_options(common_then_extra, "h", WHERE)
    assert (options.port, options.user) == (2300, "lab")
    assert ssh_options({"ansible_user": "ops", **common_then_extra}, "h", WHERE).user == "ops"


@pytest.mark.parametrize(
    ("args", "hops"),
    [
        ("-J jump", (Hop("jump"),)),
        ("-J lab@jump.example:2222", (Hop("jump.example", "lab", 2222),)),
        ("-o ProxyJump=ssh://lab@198.19.10.1:22,198.19.20.1",
         (Hop("198.19.10.1", "lab", 22), Hop("198.19.20.1"))),
        ("-o proxyjump=none", ()),  # case-insensitive names, as ssh(1)
    ],
)  # fmt: skip
def test_proxyjump_forms(args, hops):
    assert ssh_options({"ansible_ssh_common_args": args}, "h", WHERE).jump == hops


def test_proxycommand_tokens_are_expanded_with_the_hosts_own_values():
    options = ssh_options(
        {
            "ansible_port": 2022,
            "ansible_user": "lab",
            "ansible_ssh_common_args": "-o ProxyCommand='ssh -W %h:%p -l %r bastion # 100%%'",
        },
        "198.19.10.11",
        WHERE,
    )
    assert options.proxy_command == "ssh -W 198.19.10.11:2022 -l lab bastion # 100%"


@pytest.mark.parametrize(
    ("variables", "said"),
    [
        (
            {"ansible_ssh_common_args": "-o HostKeyAlias=r1"},
            "host A (hosts.yml): ansible_ssh_common_args: the runner cannot honour the ssh "
            "option 'HostKeyAlias'; it honours Port, User, IdentityFile, ProxyJump, "
            "ProxyCommand, UserKnownHostsFile, StrictHostKeyChecking and leaves ",
        ),
        (
            {"ansible_ssh_extra_args": "-F ~/.ssh/lab_config"},
            "host A (hosts.yml): ansible_ssh_extra_args: the runner cannot honour the ssh "
            "argument '-F'; it takes -o options, -p, -l, -i, -J and ",
        ),
        ({"ansible_port": "ssh"}, "host A (hosts.yml): port 'ssh' is not a number"),
        (
            {"ansible_ssh_common_args": "-J 'user@'"},
            "host A (hosts.yml): ProxyJump 'user@' is not [user@]host[:port]",
        ),
        (
            {"ansible_ssh_common_args": "-o UserKnownHostsFile={{ state }}/known_hosts"},
            "host A (hosts.yml): ansible_ssh_common_args is a template",
        ),
        ({"ansible_ssh_common_args": "-p"}, "ansible_ssh_common_args: -p without a value"),
    ],
)
def test_what_the_runner_cannot_honour_is_refused_naming_host_and_variable(variables, said):
    with pytest.raises(SshOptionError) as exc:
        ssh_options(variables, "198.19.10.11", WHERE)
    assert said in str(exc.value)


def test_the_rack_connects_by_port_jump_hosts_and_known_hosts_of_the_inventory(tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    (tmp_path / "hosts.yml").write_text(
        "all:\n  vars:\n    ansible_ssh_private_key_file: /keys/lab\n"
        "  hosts:\n"
        f"    A: {{ansible_host: 198.19.10.11, ansible_port: 2222,"
        f" ansible_ssh_common_args: '-o UserKnownHostsFile={known} -J ops@gw1:2200,gw2'}}\n"
        "    B: {ansible_ssh_common_args: '-o StrictHostKeyChecking=no'}\n"
    )  # fmt: skip
    rack = Rack.load([tmp_path / "hosts.yml"])
    conn = rack.connection("A")
    assert (conn.host, conn.port, conn.user) == ("198.19.10.11", 2222, "root")
    last = conn.gateway  # the hop next to A, reached through the first
    assert (last.host, last.port, last.user) == ("gw2", 22, "root")
    assert (last.gateway.host, last.gateway.port, last.gateway.user) == ("gw1", 2200, "ops")
    assert last.gateway.gateway is None
    for c in (conn, last, last.gateway):
        assert c.connect_kwargs["key_filename"] == ["/keys/lab"]
        assert type(c.client._policy).__name__ == "RejectPolicy"  # a known_hosts file given


def test_host_keys_are_refused_unless_the_inventory_says_otherwise(tmp_path):
    """trialbed_known_hosts refuses any key it lacks, whatever StrictHostKeyChecking says (as
    Ansible here, whose mitogen enforces host_key_checking); a UserKnownHostsFile refuses
    too, unless StrictHostKeyChecking is no or accept-new; the project's known hosts must
    exist (preflight names it), a UserKnownHostsFile need not (as for ssh)."""
    known = tmp_path / "known_hosts"
    known.write_text("")
    args = "ansible_ssh_common_args"
    hosts = {
        "A": {"trialbed_known_hosts": str(known), args: "-o StrictHostKeyChecking=no"},
        "B": {args: f"-o UserKnownHostsFile={known}"},
        "C": {args: f"-o UserKnownHostsFile={known} -o StrictHostKeyChecking=accept-new"},
        "D": {args: f"-o UserKnownHostsFile={tmp_path / 'none'}"},
        "E": {"trialbed_known_hosts": str(tmp_path / "none")},
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    rack = Rack.load([tmp_path / "hosts.yml"])

    def policy(name: str) -> str:
        return type(rack.connection(name).client._policy).__name__

    assert [policy(n) for n in "ABCD"] == [
        "RejectPolicy", "RejectPolicy", "AutoAddPolicy", "RejectPolicy",
    ]  # fmt: skip
    with pytest.raises(FileNotFoundError):
        rack.connection("E")


def test_proxycommand_runs_as_ssh_runs_it_and_ends_with_the_connection(tmp_path):
    """The command goes to /bin/sh as written (a pipe, `exec`, a literal % and ~ intact:
    Fabric's own would split it without a shell and expand %h and ~ again); closing the
    connection ends and reaps its process (it was left running, its pipes open)."""
    out = tmp_path / "ran"
    proxy = f"-o ProxyCommand='echo %h~%% | cat > {out}; exec cat'"
    a = {"ansible_host": "198.18.0.1", "ansible_ssh_common_args": proxy}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {"A": a}}}))
    rack = Rack.load([tmp_path / "hosts.yml"])
    conn = rack.connection("A")
    pipe = conn.open_gateway()  # the socket-like pipe paramiko would speak SSH over
    process = pipe.process
    for _ in range(100):
        if out.exists() and out.read_text():
            break
        time.sleep(0.05)
    assert out.read_text() == "198.18.0.1~%\n"
    assert process.poll() is None  # cat: the proxy stays until the connection ends
    rack.close()
    assert process.returncode is not None and process.stdout.closed


def test_a_rack_whose_host_asks_for_what_the_runner_cannot_do_is_refused_at_load(tmp_path):
    (tmp_path / "hosts.yml").write_text(
        "all:\n  hosts:\n    R: {ansible_ssh_common_args: '-o Ciphers=aes128-ctr'}\n"
    )
    with pytest.raises(RackError) as exc:
        Rack.load([tmp_path / "hosts.yml"])
    assert str(exc.value).startswith(
        f"host R ({tmp_path / 'hosts.yml'}): ansible_ssh_common_args: the runner cannot honour "
        "the ssh option 'Ciphers'"
    )


def test_without_known_hosts_settings_ssh_files_are_read_and_unknown_keys_refused(
    tmp_path, monkeypatch
):
    """With no trialbed_known_hosts and no UserKnownHostsFile, the runner trusts what ssh
    would (~/.ssh/known_hosts and the system's files, read and never written) and refuses an
    unknown key, as Ansible does (host_key_checking = True in ansible.cfg); host_key_checking
    off, in the host's variables or Ansible's environment, takes it (Fabric's default took
    every key, and read no file)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / "host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    line = "198.19.10.11 " + " ".join(key.with_suffix(".pub").read_text().split()[:2]) + "\n"
    line = (  # lines paramiko cannot read are passed over (its own load fails on them)
        "@cert-authority *.lab ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB\n"
        "@revoked 198.19.10.99 ssh-rsa AAAA\n" + line
    )
    (home / ".ssh" / "known_hosts").write_text(line)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("ANSIBLE_HOST_KEY_CHECKING", raising=False)
    monkeypatch.delenv("ANSIBLE_SSH_HOST_KEY_CHECKING", raising=False)
    args = "ansible_ssh_common_args"
    hosts = {
        "A": {"ansible_host": "198.19.10.11"},
        "B": {"ansible_host": "198.19.10.12", "ansible_host_key_checking": False},
        "C": {"ansible_host": "198.19.10.13", args: "-o StrictHostKeyChecking=no"},
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))

    def policies() -> list[str]:
        rack = Rack.load([tmp_path / "hosts.yml"])
        return [type(rack.connection(n).client._policy).__name__ for n in "ABC"]

    assert policies() == ["RejectPolicy", "AutoAddPolicy", "AutoAddPolicy"]
    conn = Rack.load([tmp_path / "hosts.yml"]).connection("A")
    assert "ssh-ed25519" in conn.client.get_host_keys().lookup("198.19.10.11")
    assert conn.client._host_keys_filename is None  # nothing paramiko would write back
    monkeypatch.setenv("ANSIBLE_HOST_KEY_CHECKING", "False")
    assert policies() == ["AutoAddPolicy", "AutoAddPolicy", "AutoAddPolicy"]
    # checking off: as mitogen, no known hosts file is read (a stale key would not refuse)
    off = Rack.load([tmp_path / "hosts.yml"]).connection("A").client.get_host_keys()
    assert off.lookup("198.19.10.11") is None
    assert (home / ".ssh" / "known_hosts").read_text() == line


def test_host_key_checking_reads_ansibles_environment_then_its_config(tmp_path, monkeypatch):
    """As `ansible-config dump` shows it: ANSIBLE_SSH_HOST_KEY_CHECKING over
    ANSIBLE_HOST_KEY_CHECKING, either over ansible.cfg ([ssh_connection] over [defaults],
    a ; comment ignored), True when nothing says."""
    for name in ("ANSIBLE_HOST_KEY_CHECKING", "ANSIBLE_SSH_HOST_KEY_CHECKING"):
        monkeypatch.delenv(name, raising=False)
    cfg = tmp_path / "ansible.cfg"
    assert ansible_host_key_checking(cfg) is True  # no file
    cfg.write_text("[defaults]\nhost_key_checking = False ; the lab's\n")
    assert ansible_host_key_checking(cfg) is False
    cfg.write_text(
        "[defaults]\nhost_key_checking = False\n[ssh_connection]\nhost_key_checking = yes\n"
    )
    assert ansible_host_key_checking(cfg) is True
    monkeypatch.setenv("ANSIBLE_HOST_KEY_CHECKING", "False")
    assert ansible_host_key_checking(cfg) is False
    monkeypatch.setenv("ANSIBLE_SSH_HOST_KEY_CHECKING", "True")
    assert ansible_host_key_checking(cfg) is True
