#!/usr/bin/env bash
# Runs a command inside a QEMU guest that has Soft-RoCE (rdma_rxe), so that
# the verbs provider is exercised for real on a machine without RDMA
# hardware or a kernel with RDMA support.
#
#   test/verbs-vm.sh COMMAND...     run COMMAND (a shell line) in the guest
#
# The guest boots Debian's own kernel under TCG, mounts the host's root
# read-only over 9p with a tmpfs overlay, chroots into it (host binaries
# run unchanged), brings up a veth pair va/vb with rxe0 on va and rxe1 on
# vb, and runs the command with 'ulimit -l unlimited'. The guest image is
# built once, from Debian packages, into $XPORT_VM_DIR (default:
# ./verbs-vm beside the build). Exit status: the command's, or 77 (skip)
# with the reason when this machine cannot run the guest.
set -u
dir=${XPORT_VM_DIR:-$PWD/verbs-vm}
skip() { echo "SKIP: verbs guest: $*"; exit 77; }

[ $# -ge 1 ] || { echo "usage: $0 COMMAND..." >&2; exit 2; }
for tool in qemu-system-x86_64 cpio depmod dpkg-deb apt-get; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (apt-get install qemu-system-x86 cpio kmod)"
done
busybox=$(command -v busybox)
[ -n "$busybox" ] && file -L "$busybox" 2>/dev/null | grep -q static ||
  { [ -x /bin/busybox ] && busybox=/bin/busybox; }
[ -n "$busybox" ] || skip "busybox is not installed (apt-get install busybox-static)"
ldd "$busybox" >/dev/null 2>&1 && skip "busybox is not static (apt-get install busybox-static)"

mkdir -p "$dir"
# ---- the kernel, from Debian's archive ---------------------------------
if [ ! -f "$dir/vmlinuz" ]; then
  rm -rf "$dir/dl" "$dir/root" && mkdir -p "$dir/dl" "$dir/root"
  (cd "$dir/dl" && apt-get download linux-image-amd64 >/dev/null 2>&1) ||
    skip "apt-get download linux-image-amd64 failed (no package archive?)"
  meta=$(ls "$dir"/dl/linux-image-amd64_*.deb | head -1)
  pkg=$(dpkg-deb -f "$meta" Depends | grep -o 'linux-image-[0-9][^ ,]*-amd64' | head -1)
  [ -n "$pkg" ] || skip "cannot tell which kernel linux-image-amd64 depends on"
  (cd "$dir/dl" && apt-get download "$pkg" >/dev/null 2>&1) || skip "apt-get download $pkg failed"
  dpkg-deb -x "$dir"/dl/"$pkg"_*.deb "$dir/root" || skip "cannot unpack $pkg"
  ver=${pkg#linux-image-}
  depmod -b "$dir/root" "$ver" || skip "depmod failed"
  echo "$ver" > "$dir/version"
  cp "$dir/root/boot/vmlinuz-$ver" "$dir/vmlinuz.tmp" && mv "$dir/vmlinuz.tmp" "$dir/vmlinuz"
fi
ver=$(cat "$dir/version")

# ---- the initramfs: busybox, the modules in dependency order, /init ------
# (rebuilt whenever this script changes)
stamp=$(md5sum "$0" | cut -d' ' -f1)
[ "$(cat "$dir/initrd.stamp" 2>/dev/null)" = "$stamp" ] || rm -f "$dir/initrd.cpio.gz"
if [ ! -f "$dir/initrd.cpio.gz" ]; then
  moddir="$dir/root/lib/modules/$ver"
  stage="$dir/initrd"
  rm -rf "$stage" && mkdir -p "$stage/bin" "$stage/lib/modules"
  cp "$busybox" "$stage/bin/busybox"
  declare -A seen=()
  order=()
  add() { # module name or path relative to $moddir
    local path=$1 line deps d
    [[ $path == */* ]] || path=$(grep -E "(^|/)$1\.ko(\.[a-z]+)?:" "$moddir/modules.dep" | head -1 | cut -d: -f1)
    [ -n "$path" ] || return 0 # built in
    [ -n "${seen[$path]:-}" ] && return 0
    seen[$path]=1
    line=$(grep -E "^$path:" "$moddir/modules.dep")
    deps=${line#*:}
    for d in $deps; do add "$d"; done
    order+=("$path")
  }
  for m in crc32_generic virtio_pci 9pnet 9pnet_virtio netfs fscache 9p overlay ib_core ib_uverbs \
    udp_tunnel ip6_udp_tunnel rdma_rxe iw_cm ib_cm configfs rdma_cm rdma_ucm veth; do
    add "$m"
  done
  : > "$stage/modules.order"
  for p in "${order[@]}"; do
    name=$(basename "$p")
    case $name in
      *.xz) xz -dc "$moddir/$p" > "$stage/lib/modules/${name%.xz}"; name=${name%.xz} ;;
      *.zst) zstd -qdc "$moddir/$p" > "$stage/lib/modules/${name%.zst}"; name=${name%.zst} ;;
      *) cp "$moddir/$p" "$stage/lib/modules/$name" ;;
    esac
    echo "$name" >> "$stage/modules.order"
  done
  cat > "$stage/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mkdir -p /proc /sys /dev /host /rw /newroot
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
cmd=$(sed -n 's/.*xport_cmd=\([^ ]*\).*/\1/p' /proc/cmdline)
for m in $(cat /modules.order); do insmod /lib/modules/$m 2>/dev/null || echo "guest: insmod $m failed"; done
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 host /host || echo "guest: 9p mount failed"
mount -t tmpfs tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/host,upperdir=/rw/upper,workdir=/rw/work /newroot ||
  echo "guest: overlay failed"
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
mkdir -p /newroot/dev/shm
mount -t tmpfs tmpfs /newroot/dev/shm
echo "$cmd" | base64 -d > /newroot/tmp/xport-guest.sh
chroot /newroot /bin/bash /tmp/xport-guest.sh
echo "xport-guest-exit=$?"
poweroff -f
INIT
  chmod +x "$stage/init"
  (cd "$stage" && find . | cpio -o -H newc 2>/dev/null | gzip -1) > "$dir/initrd.cpio.gz.tmp" &&
    mv "$dir/initrd.cpio.gz.tmp" "$dir/initrd.cpio.gz" && echo "$stamp" > "$dir/initrd.stamp"
fi

# ---- the guest's command: Soft-RoCE first, then the caller's line -------
script=$(cat <<EOF
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp
ip link set lo up
ip link add va type veth peer name vb
ip addr add 10.77.0.1/24 dev va
ip addr add 10.77.0.2/24 dev vb
ip link set va up
ip link set vb up
rdma link add rxe0 type rxe netdev va || echo "guest: rdma link add rxe0 failed"
rdma link add rxe1 type rxe netdev vb || echo "guest: rdma link add rxe1 failed"
ulimit -l unlimited
cd "$PWD"
$*
EOF
)
enc=$(printf '%s\n' "$script" | base64 -w0)
# The kernel keeps 2048 bytes of its command line; a longer one leaves the
# guest hung at boot, silently.
if [ ${#enc} -gt 1900 ]; then
  echo "verbs guest: the command is ${#enc} bytes in base64, more than the kernel command line holds"
  exit 1
fi
log="$dir/console.log"
accel=tcg
# A KVM guest hangs early in boot on this kind of machine; TCG is slow
# but works. XPORT_VM_ACCEL=kvm tries KVM where it is known to work.
[ -n "${XPORT_VM_ACCEL:-}" ] && accel=$XPORT_VM_ACCEL
# A guard against a hung guest, not a budget: the suites take about 25
# minutes under TCG (a killed target's operations end only when the
# emulated device gives up retrying them).
# In the background, and the console's reader too, so that this script,
# stopped however it is (make's timeout, ^C), stops the guest with it
# (timeout passes the TERM on): bash runs a trap only once the foreground
# command is done, and in wait at once.
: >"$log"
timeout "${XPORT_VM_TIMEOUT:-2700}" qemu-system-x86_64 -accel "$accel" -cpu max -smp 2 -m 3072 \
  -nographic -no-reboot -nic none -kernel "$dir/vmlinuz" -initrd "$dir/initrd.cpio.gz" \
  -append "console=ttyS0 quiet panic=-1 xport_cmd=$enc" \
  -virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap \
  </dev/null >"$log" 2>&1 &
vm=$!
trap 'kill "$vm" 2>/dev/null; wait "$vm" 2>/dev/null' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
tail -n +1 -f --pid="$vm" "$log" | grep -v -E '^\s*$|^\[' &
wait "$vm"
wait
status=$(sed -n 's/.*xport-guest-exit=\([0-9]*\).*/\1/p' "$log" | tail -1)
[ -n "$status" ] || { echo "verbs guest: no exit status (boot failed or timed out); see $log"; exit 1; }
exit "$status"
