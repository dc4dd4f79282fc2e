// A READ from a registered buffer takes the region until its completion: its bytes cannot be
// looked at while the device may write them.
use evchan_core::verbs::{OwnedMr, QpHandle, RemoteBuf, RemoteRead};

fn read(qp: &QpHandle, mr: OwnedMr<Vec<u8>>, from: &RemoteBuf<RemoteRead>) {
    let posted = qp.post_read_mr(mr, 64, from, 0);
    let bytes: &[u8] = mr.mr().as_slice();
    println!("{bytes:?} {posted:?}");
}

fn main() {}
