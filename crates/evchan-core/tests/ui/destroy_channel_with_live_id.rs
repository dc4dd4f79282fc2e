// Nor destroyed explicitly.
use evchan_core::{cm::PortSpace, CmId, EventChannel};

fn main() -> evchan_core::Result<()> {
    let channel = EventChannel::new()?;
    let id = CmId::new(&channel, PortSpace::Udp)?;
    channel.destroy();
    let _ = id.key();
    Ok(())
}
