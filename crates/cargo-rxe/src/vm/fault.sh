#!/bin/sh
# rxe-fault ACTION [VM] — inside a VM of `cargo rxe run` (also as evchan-vm-fault): asks the runner on the host
# for a fault and waits until it is done. The runner answers each request with a line, `ok` or
# `error: WHY`; this exits 0 on `ok`, 1 otherwise (2: no answer within 1200 polls of 50 ms).
#
#   rxe-fault       link off|on [a|b]   qemu's `set_link n0 off|on` (two VMs): both ends of the
#                                       wire, or only VM a's / VM b's
#   rxe-fault       stop|cont a|b       SIGSTOP / SIGCONT of that VM's qemu (a hung host)
#   rxe-fault       kill a|b            SIGKILL of that VM's qemu (a dead host); its missing exit
#                                       status does not fail the run
#
# The protocol, for programs that rather write files: in the share (this script's grandparent
# directory; also $EVCHAN_VM_SHARE), write the request line to fault.req.NAME (atomically:
# write another name, then rename); the runner removes it, acts, and writes its answer to
# fault.ack.NAME.
share="${EVCHAN_VM_SHARE:-$(dirname "$(dirname "$0")")}"
[ $# -gt 0 ] || { echo "usage: rxe-fault link off|on [a|b] | stop|cont|kill a|b" >&2; exit 2; }
name="${EVCHAN_VM_ROLE:-x}.$$.$(date +%s%N)"
printf '%s\n' "$*" >"$share/.fault.$name"
mv "$share/.fault.$name" "$share/fault.req.$name"
polls=0
until [ -e "$share/fault.ack.$name" ]; do
    polls=$((polls + 1))
    if [ $polls -gt 1200 ]; then
        echo "rxe-fault: no answer from the runner within 1200 polls (60 s or more) to: $*" >&2
        exit 2
    fi
    sleep 0.05
done
answer="$(cat "$share/fault.ack.$name")"
rm -f "$share/fault.ack.$name"
echo "rxe-fault: $*: $answer" >&2
[ "$answer" = ok ]
