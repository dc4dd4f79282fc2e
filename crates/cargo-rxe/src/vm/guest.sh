#!/bin/sh
# Runs inside the VM, chrooted into the host's filesystem, as `sh guest.sh ROLE`.
# ROLE: single (one VM, rxe0 on dummy0), a (server of two VMs), b (client of two VMs).
# The runner puts beside this file: env (exports), cwd (a path), and the job scripts
# job.single / job.a / job.b. All paths are the host's, so binaries built there run unchanged.
role="$1"
here="$(dirname "$0")"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root
ulimit -l unlimited

say() { echo "cargo-rxe[$role]: $*" >&2; }
# Whether fewer than $1 seconds passed since $start (wall clock: TCG makes loop counts slow).
within() { [ $(($(date +%s) - start)) -lt "$1" ]; }

# Addresses appear usable at once: no duplicate address detection on our private links.
echo 0 >/proc/sys/net/ipv6/conf/default/accept_dad
echo 0 >/proc/sys/net/ipv6/conf/all/accept_dad
ip link set lo up

case "$role" in
single)
    # the dummy module may already have made dummy0 (numdummies defaults to 1)
    ip link show dummy0 >/dev/null 2>&1 || ip link add dummy0 type dummy
    ip link set dummy0 address 02:00:00:00:00:01
    ip link set dummy0 up
    ip addr add 169.254.77.1/32 dev dummy0
    netdev=dummy0
    export EVCHAN_SELF=169.254.77.1 EVCHAN_SELF6=fe80::ff:fe00:1%dummy0
    export RXE_SELF="$EVCHAN_SELF" RXE_SELF6="$EVCHAN_SELF6"
    ;;
a | b)
    if [ "$role" = a ]; then mine=0a peer=0b; else mine=0b peer=0a; fi
    # eth0 existed before the default above changed: no DAD on it either.
    echo 0 >/proc/sys/net/ipv6/conf/eth0/accept_dad
    ip link set eth0 address "02:00:00:00:00:$mine"
    ip link set eth0 up
    netdev=eth0
    export EVCHAN_SELF="fe80::ff:fe00:$mine%eth0" EVCHAN_PEER="fe80::ff:fe00:$peer%eth0"
    export RXE_SELF="$EVCHAN_SELF" RXE_PEER="$EVCHAN_PEER"
    ;;
*)
    say "unknown role $role"
    exit 125
    ;;
esac

rdma link add rxe0 type rxe netdev "$netdev" || { say "rdma link add failed"; exit 125; }
start=$(date +%s)
until rdma link show rxe0/1 2>/dev/null | grep -q 'state ACTIVE'; do
    within 30 || { say "rxe0 not ACTIVE within 30 s"; rdma link show; exit 125; }
    sleep 0.1
done
# The link-local IPv6 address and its GID appear a moment after the link is up; a tentative
# address cannot be bound yet (EADDRNOTAVAIL), so wait until none is.
until ip -6 addr show dev "$netdev" | grep -q 'fe80::ff:fe00' &&
    [ -z "$(ip -6 addr show dev "$netdev" tentative)" ]; do
    within 30 || { say "no usable IPv6 link-local address on $netdev within 30 s"; exit 125; }
    sleep 0.1
done

. "$here/env"
# Fault hooks (`rxe-fault`, see fault.sh): the runner on the host carries them out.
export EVCHAN_VM_ROLE="$role" EVCHAN_VM_SHARE="$here" EVCHAN_VM_FAULT="$here/bin/evchan-vm-fault"
export RXE_ROLE="$role" CARGO_RXE=1
export PATH="$here/bin:$PATH"
cd "$(cat "$here/cwd")" || exit 125

case "$role" in
single)
    sh "$here/job.single"
    ;;
a)
    sh "$here/job.a" &
    server=$!
    # Ready once a cm_id listens (or the server already ended); then tell the client's VM.
    start=$(date +%s)
    until rdma resource show cm_id 2>/dev/null | grep -q 'state LISTEN'; do
        kill -0 "$server" 2>/dev/null || break
        within 60 || { say "the server did not listen within 60 s"; break; }
        sleep 0.1
    done
    : >"$here/ready"
    wait "$server"
    ;;
b)
    start=$(date +%s)
    until [ -e "$here/ready" ]; do
        within 120 || { say "the server VM was not ready within 120 s"; exit 125; }
        sleep 0.1
    done
    sh "$here/job.b"
    ;;
esac
