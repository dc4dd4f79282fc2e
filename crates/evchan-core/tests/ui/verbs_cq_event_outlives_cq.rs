// A CqEvent cannot outlive its Cq (ibv_destroy_cq would wait for its ack forever).
use evchan_core::verbs::{CompChannel, Context, Cq};

fn main() -> Result<(), evchan_core::verbs::Error> {
    let ctx = Context::open_first()?;
    let channel = CompChannel::new(&ctx)?;
    let event = {
        let cq = Cq::new(&channel, 16)?;
        channel.get_cq_event(&[&cq])?
    };
    event.ack();
    Ok(())
}
