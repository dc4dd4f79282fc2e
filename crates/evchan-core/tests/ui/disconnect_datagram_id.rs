// A UDP id after its SIDR exchange has no connection: there is nothing to disconnect.
use evchan_core::cm::state::Datagram;
use evchan_core::CmId;

fn disconnect_datagram(id: CmId<'_, Datagram>) {
    let _ = id.disconnect();
}

fn main() {}
