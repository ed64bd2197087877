#!/usr/bin/env bash
# Build (or find in the cache) the VM rack's image: a Debian 12 root tree made with debootstrap
# from Debian's packages, with Debian's stock kernel (linux-image-amd64), as an ext4 disk image
# plus the kernel and initrd to boot it with. The cache key is the sha256 of the recipe (this
# script, the VM's init and the package list): the image is rebuilt only when one changes.
# Usage: build-image.sh CACHE_DIR [MIRROR]. Prints one JSON line: {"dir", "hash", "built", "seconds"}.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${1:?cache directory}
mirror=${2:-http://deb.debian.org/debian}
suite=bookworm
recipe=("$here/build-image.sh" "$here/trialbed-init" "$here/image-packages.txt")
# NetfilterQueue for the VM's Python 3.11 (Debian has no package of it): the project's own build,
# from its pinned PyPI release, in the controller's venv (the same Debian 12 and Python 3.11).
nfq=${TRIALBED_NETFILTERQUEUE:-$here/../../../../.venv/lib/python3.11/site-packages/netfilterqueue}
nfq_version=$(cat "$nfq/_version.py" 2>/dev/null || echo none)
hash=$( { cat "${recipe[@]}"; echo "$suite $mirror $nfq_version"; } | sha256sum | cut -c1-16)
dir=$cache/$hash
mkdir -p "$cache"
chmod 0755 "$cache"
start=$(date +%s.%N)
# One build at a time per cache (two checkouts may ask at once).
exec 9>"$cache/.lock"
flock 9
if [ -f "$dir/done" ]; then
  printf '{"dir": "%s", "hash": "%s", "built": false, "seconds": 0}\n' "$dir" "$hash"
  exit 0
fi
work=$(mktemp -d "$cache/.build-$hash.XXXXXX")
trap 'umount -R "$work/root" 2>/dev/null || true; rm -rf "$work"' EXIT
root=$work/root
packages=$(grep -v '^#' "$here/image-packages.txt" | xargs | tr ' ' ',')
echo "build-image: debootstrap $suite (minbase + $packages) from $mirror" >&2
# No service may start while packages install (sshd would start in the host's namespace).
mkdir -p "$root/usr/sbin"
printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
chmod +x "$root/usr/sbin/policy-rc.d"
debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" \
  > "$work/debootstrap.log" 2>&1 || { tail -30 "$work/debootstrap.log" >&2; exit 1; }
rm -f "$root/usr/sbin/policy-rc.d"
# Host keys come with each boot (the seed disk), never with the shared image.
rm -f "$root"/etc/ssh/ssh_host_*
install -m 0755 "$here/trialbed-init" "$root/sbin/trialbed-init"
if [ -d "$nfq" ]; then
  mkdir -p "$root/usr/local/lib/python3.11/dist-packages"
  cp -r "$nfq" "$root/usr/local/lib/python3.11/dist-packages/"
  rm -rf "$root/usr/local/lib/python3.11/dist-packages/netfilterqueue/__pycache__"
else
  echo "build-image: no NetfilterQueue at $nfq (make setup builds it): the VM has no edge marker" >&2
fi
echo trialbed-vm > "$root/etc/hostname"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
mkdir -p "$work/out"
cp -L "$root/vmlinuz" "$work/out/vmlinuz"
cp -L "$root/initrd.img" "$work/out/initrd.img"
ls "$root/lib/modules" > "$work/out/kernel-release"
# (stdout carries only the JSON line: mke2fs says "Creating regular file" there)
mke2fs -q -t ext4 -L trialbed-root -d "$root" "$work/out/root.raw" 2G >&2
printf '%s\n' "$hash" > "$work/out/recipe.sha256"
date -u +%Y-%m-%dT%H:%M:%SZ > "$work/out/done"
chmod 0644 "$work"/out/*
rm -rf "$dir"
mv "$work/out" "$dir"
chmod 0755 "$dir"
end=$(date +%s.%N)
printf '{"dir": "%s", "hash": "%s", "built": true, "seconds": %.1f}\n' "$dir" "$hash" \
  "$(echo "$end - $start" | bc 2>/dev/null || python3 -c "print($end-$start)")"
