// Only a request handed over by a CONNECT_REQUEST can be answered, datagram or not.
use evchan_core::cm::{state::Connecting, ConnParam};
use evchan_core::CmId;

fn answer_twice(id: CmId<'_, Connecting>) {
    let _ = id.accept_datagram(&ConnParam::new());
}

fn main() {}
