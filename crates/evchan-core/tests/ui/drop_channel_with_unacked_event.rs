// A channel cannot be dropped while an event read from it is unacked.
use evchan_core::EventChannel;

fn main() -> evchan_core::Result<()> {
    let channel = EventChannel::new()?;
    let event = channel.get_event()?;
    drop(channel);
    event.ack();
    Ok(())
}
