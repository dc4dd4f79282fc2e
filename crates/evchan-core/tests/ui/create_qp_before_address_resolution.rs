// An id has no device, and so no QP, before address resolution.
use evchan_core::cm::PortSpace;
use evchan_core::verbs::QpInit;
use evchan_core::{CmId, EventChannel};

fn main() -> evchan_core::Result<()> {
    let channel = EventChannel::new()?;
    let mut id = CmId::new(&channel, PortSpace::Tcp)?;
    id.create_qp(&QpInit::new())?;
    Ok(())
}
