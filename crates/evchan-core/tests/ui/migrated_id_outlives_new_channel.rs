// ...and the migrated id borrows the new channel (the old one may go, the new one may not).
use evchan_core::{cm::PortSpace, CmId, EventChannel};

fn main() -> evchan_core::Result<()> {
    let old = EventChannel::new()?;
    let new = EventChannel::new()?;
    let id = CmId::new(&old, PortSpace::Tcp)?;
    let moved = id.migrate(&new)?;
    drop(old);
    drop(new);
    let _ = moved.key();
    Ok(())
}
