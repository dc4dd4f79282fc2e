// An event's private data is gone with its ack.
use evchan_core::EventChannel;

fn main() -> evchan_core::Result<()> {
    let channel = EventChannel::new()?;
    let event = channel.get_event()?;
    let data = event.private_data();
    event.ack();
    println!("{data:?}");
    Ok(())
}
