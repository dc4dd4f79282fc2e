// accept is for a passive id from a CONNECT_REQUEST, not for an active id.
use evchan_core::cm::{state::RouteResolved, ConnParam};
use evchan_core::CmId;

fn accept_active(id: CmId<'_, RouteResolved>) {
    let _ = id.accept(&ConnParam::new());
}

fn main() {}
