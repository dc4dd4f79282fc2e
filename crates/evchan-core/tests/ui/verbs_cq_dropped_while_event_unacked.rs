// Nor can the Cq be dropped while one of its events is unacked.
use evchan_core::verbs::{CompChannel, Context, Cq};

fn main() -> Result<(), evchan_core::verbs::Error> {
    let ctx = Context::open_first()?;
    let channel = CompChannel::new(&ctx)?;
    let cq = Cq::new(&channel, 16)?;
    let event = channel.get_cq_event(&[&cq])?;
    drop(cq);
    event.ack();
    Ok(())
}
