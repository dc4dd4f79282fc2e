// Nor by its explicit destroy.
use evchan_core::verbs::{CompChannel, Context, Cq};

fn main() -> Result<(), evchan_core::verbs::Error> {
    let ctx = Context::open_first()?;
    let channel = CompChannel::new(&ctx)?;
    let cq = Cq::new(&channel, 16)?;
    channel.destroy()?;
    cq.req_notify(false)?;
    Ok(())
}
