// The id that creates its QP on the caller's objects must be dropped before them, also when a
// panic unwinds: objects declared after the id's binding would be dropped first.
use evchan_core::cm::state::RouteResolved;
use evchan_core::verbs::{CompChannel, Cq, Pd, QpInit};
use evchan_core::CmId;

fn connect(mut id: CmId<'_, RouteResolved>) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = id.context()?;
    let pd = Pd::new(&ctx)?;
    let channel = CompChannel::new(&ctx)?;
    let cq = Cq::new(&channel, 16)?;
    id.create_qp_with(&pd, &cq, &cq, &QpInit::new())?;
    Ok(())
}

fn main() {
    let _ = connect;
}
