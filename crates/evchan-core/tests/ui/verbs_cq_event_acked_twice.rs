// A CqEvent is acked exactly once.
use evchan_core::verbs::{CompChannel, Context, Cq};

fn main() -> Result<(), evchan_core::verbs::Error> {
    let ctx = Context::open_first()?;
    let channel = CompChannel::new(&ctx)?;
    let cq = Cq::new(&channel, 16)?;
    let event = channel.get_cq_event(&[&cq])?;
    event.ack();
    event.ack();
    Ok(())
}
