// Registered buffers posted from the owned style are owned ('static): a borrowed one could be
// freed after a `mem::forget` of the PostedMr while the device still writes into it.
use evchan_core::verbs::{OwnedMr, OwnedPd, QpHandle, RemoteBuf, RemoteRead};

fn read(pd: &OwnedPd, qp: &QpHandle, from: &RemoteBuf<RemoteRead>) {
    let mut array = [0u8; 64];
    let mr = OwnedMr::new(pd, &mut array[..]).unwrap();
    std::mem::forget(qp.post_read_mr(mr, 64, from, 0));
}

fn main() {}
