// A descriptor's access is in its type: a read-only grant cannot be written.
use evchan_core::verbs::{Mr, QpHandle, RemoteBuf, RemoteRead, Slot, SlotPool};

fn write(qp: &QpHandle, mr: &Mr<'_, SlotPool>, slot: Slot, grant: &RemoteBuf<RemoteRead>) {
    let _ = qp.post_write_slot(mr, slot, grant, 0, None);
}

fn main() {}
