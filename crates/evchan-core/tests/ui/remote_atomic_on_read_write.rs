// Atomics need a grant of atomic access: a read-write one is not enough.
use evchan_core::verbs::{Mr, QpHandle, RemoteBuf, RemoteReadWrite, Slot, SlotPool};

fn add(qp: &QpHandle, mr: &Mr<'_, SlotPool>, slot: Slot, grant: &RemoteBuf<RemoteReadWrite>) {
    let _ = qp.post_fetch_add_slot(mr, slot, grant, 0, 1);
}

fn main() {}
