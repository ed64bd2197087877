#!/bin/sh
# PID 1 of the VM rack, exec'd by the image's /sbin/trialbed-init from the boot's seed: no init
# system, only what the rack needs. Reads the rest of the seed (/run/seed: config.sh, the
# controller's authorized key, the VM's host key), joins the management bridge, loads the qdisc and TCP
# congestion-control modules, starts the VM's sshd, then reaps orphans (a daemon whose parent
# exited must not stay a zombie: `kill -0` would say it still runs).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
say() { echo "trialbed-init: $*" > /dev/console 2>/dev/null || true; }
mnt() { mountpoint -q "$2" 2>/dev/null || { mkdir -p "$2"; mount -t "$1" "$1" "$2"; }; }
mnt proc /proc
mnt sysfs /sys
mnt devtmpfs /dev
mnt tmpfs /tmp
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts 2>/dev/null
mount -t tmpfs tmpfs /dev/shm 2>/dev/null
mount -o remount,rw /
hostname trialbed-vm
mkdir -p /run/sshd /root/.ssh
. /run/seed/config.sh
ip link set lo up
# The NIC on the management network, by the MAC address the controller gave it.
nic=$(for d in /sys/class/net/*; do
        [ "$(cat "$d/address")" = "$VM_MAC" ] && basename "$d"; done)
ip link add "$VM_BRIDGE" type bridge
ip link set "$nic" master "$VM_BRIDGE"
ip link set "$nic" up
ip link set "$VM_BRIDGE" up
ip addr add "$VM_ADDRESS" dev "$VM_BRIDGE"
# Everything the experiments may name (modprobe -a: `modprobe a b` would pass b to a as a
# parameter). A module missing from this kernel is reported, not fatal.
for m in $VM_MODULES; do modprobe "$m" 2>/dev/null || say "no module $m"; done
# Namespaces may select any congestion control the kernel has.
cat /proc/sys/net/ipv4/tcp_available_congestion_control > /proc/sys/net/ipv4/tcp_allowed_congestion_control
install -m 0600 /run/seed/authorized_keys /root/.ssh/authorized_keys
install -m 0600 /run/seed/ssh_host_ed25519_key /run/sshd/ssh_host_ed25519_key
cat > /run/sshd/sshd_config <<EOC
ListenAddress ${VM_ADDRESS%/*}:22
HostKey /run/sshd/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
MaxStartups 64:30:128
MaxSessions 64
Subsystem sftp internal-sftp
EOC
/usr/sbin/sshd -f /run/sshd/sshd_config || say "sshd did not start"
say "ready: sshd on ${VM_ADDRESS%/*}, kernel $(uname -r)"
exec python3 -c '
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.5)
'
