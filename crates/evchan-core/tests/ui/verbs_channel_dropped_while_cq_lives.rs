// A CompChannel cannot be destroyed while a Cq created on it lives
// (ibv_destroy_comp_channel would fail with EBUSY).
use evchan_core::verbs::{CompChannel, Context, Cq};

fn main() -> Result<(), evchan_core::verbs::Error> {
    let ctx = Context::open_first()?;
    let channel = CompChannel::new(&ctx)?;
    let cq = Cq::new(&channel, 16)?;
    drop(channel);
    cq.req_notify(false)?;
    Ok(())
}
