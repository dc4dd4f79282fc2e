#!/bin/busybox sh
# /init of evchan's soft-RoCE VM (built into the initramfs by cargo-rxe's runner).
#
# It loads the RDMA modules, mounts the host's root filesystem read-only through 9p, chroots
# into it and runs the job script the runner wrote into the writable share. The job's exit
# status goes into that share; the console only carries markers and the job's output.
/bin/busybox --install -s /bin
export PATH=/bin

fail() {
    echo "@@evchan-vm-error $*"
    poweroff -f
}

mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
# Keep the console for the job: only emergencies from the kernel from here on.
echo 1 >/proc/sys/kernel/printk

for m in $(cat /modules.list); do
    insmod "/modules/$m.ko" || fail "insmod $m failed"
done

# Kernel command line: evchan.share=<host path of the writable share> evchan.role=<a|b|single>
for arg in $(cat /proc/cmdline); do
    case "$arg" in
        evchan.share=*) share="${arg#evchan.share=}" ;;
        evchan.role=*) role="${arg#evchan.role=}" ;;
    esac
done
[ -n "$share" ] || fail "no evchan.share= on the kernel command line"

mkdir -p /newroot
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostroot /newroot ||
    fail "cannot mount the host filesystem (9p)"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share "/newroot$share" ||
    fail "cannot mount the result share at $share"
# A fresh, writable tmpfs on each scratch directory (tmpfs.list). The paths of keep.list (each
# under one of them: a checkout under /tmp, the share) are bound aside first, while the host's
# view of them is still in sight (before /dev's devtmpfs hides /dev/shm), then back into the
# tmpfs: they stay what the host has, read-only like the rest of it (the share stays writable).
mkdir -p /keep
i=0
while read -r k; do
    [ -n "$k" ] || continue
    i=$((i + 1))
    mkdir -p "/keep/$i"
    mount -o rbind "/newroot$k" "/keep/$i" || fail "cannot keep $k visible in the guest"
    echo "$k" >"/keep/$i.path"
done <"/newroot$share/keep.list"
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
while read -r d; do
    [ -n "$d" ] || continue
    mkdir -p "/newroot$d" 2>/dev/null
    mount -t tmpfs tmpfs "/newroot$d" || fail "cannot mount a tmpfs on $d"
    n=0
    while [ $n -lt $i ]; do
        n=$((n + 1))
        k="$(cat "/keep/$n.path")"
        case "$k" in "$d"/*) ;; *) continue ;; esac
        mkdir -p "/newroot$k" && mount -o rbind "/keep/$n" "/newroot$k" ||
            fail "cannot keep $k visible under the tmpfs on $d"
    done
done <"/newroot$share/tmpfs.list"

echo "@@evchan-vm-begin"
chroot /newroot /bin/sh "$share/guest.sh" "$role"
echo $? >"/newroot$share/rc.$role.tmp"
mv "/newroot$share/rc.$role.tmp" "/newroot$share/rc.$role"
echo "@@evchan-vm-end"
umount "/newroot$share"
poweroff -f
