// An event is acked exactly once.
use evchan_core::EventChannel;

fn main() -> evchan_core::Result<()> {
    let channel = EventChannel::new()?;
    let event = channel.get_event()?;
    event.ack();
    event.ack();
    Ok(())
}
