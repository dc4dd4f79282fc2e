// After a migrate, the id belongs to the new channel: the old handle is gone...
use evchan_core::{cm::PortSpace, CmId, EventChannel};

fn main() -> evchan_core::Result<()> {
    let old = EventChannel::new()?;
    let new = EventChannel::new()?;
    let id = CmId::new(&old, PortSpace::Tcp)?;
    let moved = id.migrate(&new)?;
    let _ = id.key();
    drop(moved);
    Ok(())
}
