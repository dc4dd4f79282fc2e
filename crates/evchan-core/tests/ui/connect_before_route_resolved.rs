// connect needs a resolved route: here only the address is resolved.
use std::time::Duration;

use evchan_core::cm::{ConnParam, PortSpace};
use evchan_core::{CmId, EventChannel};

fn main() -> evchan_core::Result<()> {
    let channel = EventChannel::new()?;
    let id = CmId::new(&channel, PortSpace::Tcp)?.resolve_addr(
        None,
        ([169, 254, 77, 1], 7471).into(),
        Duration::from_secs(1),
    )?;
    let event = channel.get_event()?;
    let id = id.addr_resolved(&event)?;
    let _ = id.connect(&ConnParam::new());
    Ok(())
}
