// A listening id cannot be migrated: a CONNECT_REQUEST queued for it would be lost (the kernel
// leaves the new connection's context on the old channel's file).
use evchan_core::{cm::PortSpace, CmId, EventChannel};

fn main() -> evchan_core::Result<()> {
    let old = EventChannel::new()?;
    let new = EventChannel::new()?;
    let listener = CmId::new(&old, PortSpace::Tcp)?.listen(8)?;
    let moved = listener.migrate(&new)?;
    drop(moved);
    Ok(())
}
