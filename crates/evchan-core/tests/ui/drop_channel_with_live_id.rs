// A channel cannot be dropped while an id created on it lives.
use evchan_core::{cm::PortSpace, CmId, EventChannel};

fn main() -> evchan_core::Result<()> {
    let channel = EventChannel::new()?;
    let id = CmId::new(&channel, PortSpace::Tcp)?;
    drop(channel);
    drop(id);
    Ok(())
}
