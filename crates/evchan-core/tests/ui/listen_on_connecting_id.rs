// A connecting id cannot listen.
use evchan_core::cm::state::Connecting;
use evchan_core::CmId;

fn listen_connecting(id: CmId<'_, Connecting>) {
    let _ = id.listen(8);
}

fn main() {}
