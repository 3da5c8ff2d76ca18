#!/usr/bin/env bash
# The fresh-machine check: a minimal Debian 12 root made with debootstrap, a clean clone of this repository
# (its committed HEAD) and ../shared copied into it, and the README's two commands run there exactly as
# written: ./scripts/train.sh (shortened by the overrides given, steps=20 by default), then ./scripts/test.sh.
# A package that only this machine has cannot hide a missing install step there.
#   usage: sudo scripts/check-fresh.sh [key=value ...]     (run as root: debootstrap, mounts, chroot)
#   MESHTRAIN_FRESH_DIR: where the root is made (default /var/tmp/meshtrain-fresh; replaced each run)
# The root reaches Debian's packages through this machine's own apt sources (copied into it). Exit status:
# that of the two commands; the log is MESHTRAIN_FRESH_DIR.log.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
root=${MESHTRAIN_FRESH_DIR:-/var/tmp/meshtrain-fresh}
overrides=("$@")
[ ${#overrides[@]} -gt 0 ] || overrides=(steps=20)

if [ "$(id -u)" -ne 0 ]; then
  echo "check-fresh: run as root (debootstrap and chroot need it)" >&2
  exit 2
fi
if ! command -v debootstrap >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
fi
# The Debian mirror this machine's apt uses (deb822 sources first, then the one-line format).
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $3 ~ /^bookworm/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
if [ -z "$mirror" ]; then
  echo "check-fresh: no Debian bookworm mirror in /etc/apt/sources.list(.d): pass one as MESHTRAIN_FRESH_MIRROR" >&2
  exit 2
fi
mirror=${MESHTRAIN_FRESH_MIRROR:-$mirror}

# Every mount under the root, deepest first: dev, sys and proc that this script binds, and any a previous
# run's commands left behind (mpirun's run/netns), which would make the root impossible to remove.
unmount_all() {
  local point
  awk -v root="$root/" 'index($2, root) == 1 {print $2}' /proc/mounts | sort -r | while read -r point; do
    umount -l "$point" 2>/dev/null || true
  done
  return 0
}
trap unmount_all EXIT
unmount_all
rm -rf "$root"
echo "check-fresh: debootstrap --variant=minbase bookworm $root"
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 ||
  { tail -20 "$root.debootstrap.log"; exit 1; }
# This machine's way to the package registries, as any machine here has it: apt's sources and settings, pip's
# settings, the certificate authorities they trust (a machine may reach PyPI through a proxy with its own
# CA), and name resolution. Nothing else of this machine is copied.
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  rm -f "$root/etc/apt/sources.list"
  cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/"
fi
cp /etc/apt/apt.conf.d/99* "$root/etc/apt/apt.conf.d/" 2>/dev/null || true
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$root/etc/pip.conf"
mkdir -p "$root/usr/local/share/ca-certificates" "$root/etc/ssl/certs"
cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
[ -f /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
cp /etc/resolv.conf "$root/etc/resolv.conf"

mkdir -p "$root/work"
git clone --quiet "$repo" "$root/work/meshtrain"
if [ -d "$repo/../shared" ]; then cp -a "$repo/../shared" "$root/work/shared"; fi
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"

quoted=$(printf ' %q' "${overrides[@]}")
echo "check-fresh: in $root: ./scripts/train.sh${quoted} && ./scripts/test.sh (log: $root.log)"
start=$(date +%s)
status=0
chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  LANG=C.UTF-8 /bin/bash -c "cd /work/meshtrain && ./scripts/train.sh${quoted} && ./scripts/test.sh" \
  >"$root.log" 2>&1 || status=$?
tail -25 "$root.log"
echo "check-fresh: exit status $status after $(($(date +%s) - start)) s"
exit $status
