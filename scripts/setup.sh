#!/usr/bin/env bash
# Installs everything the controller (and, on the virtual rack, every host) needs.
# Idempotent: a second run installs nothing and takes a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages: traffic tools, capture, SSH for the rack hosts, tc/nftables/iptables,
# the headers NetfilterQueue builds against, and qemu + debootstrap for the VM rack (RACK=vm).
apt_packages=(
  iperf3 tcpreplay tcpdump openssh-server openssh-client nftables iptables iproute2
  ethtool kmod util-linux procps python3 python3-venv python3-dev build-essential
  csh tcsh  # the runner's commands are tested under the login shells a lab host may have
  libnetfilter-queue-dev libnetfilter-queue1 git make
  tcptrace tshark  # make bench compares the analysis with them
  chromium  # the report test opens the HTML page headless (no console errors, a screenshot)
  qemu-system-x86 qemu-utils debootstrap e2fsprogs  # the VM rack (RACK=vm)
  clang bpftool libbpf-dev  # congestion controls the kernel lacks, as BPF (hostside/bpf_cc)
)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  # Never let the package's own sshd start in the root namespace.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Controller virtualenv: the lock (requirements.txt, every package pinned with its hashes,
# generated from pyproject.toml by `make lock`), then this project itself, which puts the
# `trialbed` command in .venv/bin. Rebuilt only when the lock or pyproject.toml changes.
stamp=.venv/.requirements.sha256
want=$(sha256sum requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ ! -x .venv/bin/trialbed ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing the Python environment (.venv)"
  [ -x .venv/bin/python ] || /usr/bin/python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q --require-hashes -r requirements.txt
  .venv/bin/pip install -q --no-deps -e .
  echo "$want" > "$stamp"
fi

# ansible.cfg names the mitogen strategy by this stable path (the package sits under the
# venv's python version). Its real path: a .venv that is a link to another checkout's must not
# leave a path through this checkout in that venv.
strategy=$(.venv/bin/python -c 'import ansible_mitogen, os; print(os.path.realpath(os.path.dirname(ansible_mitogen.__file__)))')/plugins/strategy
[ "$(readlink .venv/ansible-strategy 2>/dev/null)" = "$strategy" ] || ln -sfn "$strategy" .venv/ansible-strategy

# Ansible collections: the pinned `ansible` package ships them; install from Galaxy only
# when a required version is missing (a lab controller with Galaxy access).
.venv/bin/python -m trials.collections requirements.yml || \
  .venv/bin/ansible-galaxy collection install -r requirements.yml

# The directory where batches and trials lock their racks (trials/batch.py LOCK_DIR), shared by
# every user of this controller: made now and at each boot (/run is emptied), writable by all
# and sticky, as /tmp. Root only; a controller set up without root names TRIALBED_LOCK_DIR.
if [ "$(id -u)" = 0 ]; then
  tmpfiles=/etc/tmpfiles.d/trialbed.conf
  want_tmpfiles='d /run/trialbed/locks 1777 root root -'
  if [ -d /etc/tmpfiles.d ] && [ "$(cat "$tmpfiles" 2>/dev/null)" != "$want_tmpfiles" ]; then
    echo "$want_tmpfiles" > "$tmpfiles"
  fi
  install -d -m 0755 /run/trialbed
  [ "$(stat -c %a /run/trialbed/locks 2>/dev/null)" = 1777 ] || install -d -m 1777 /run/trialbed/locks
fi
