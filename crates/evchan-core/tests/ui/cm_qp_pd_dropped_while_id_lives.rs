// The PD of an id's QP (`create_qp_with`) outlives the id: `ibv_dealloc_pd` would fail with
// EBUSY while the QP uses it, and the id's `pd` would dangle.
use evchan_core::cm::state::Requested;
use evchan_core::verbs::{CompChannel, Cq, Pd, QpInit};
use evchan_core::CmId;

fn serve(id: CmId<'_, Requested>) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = id.context()?;
    let channel = CompChannel::new(&ctx)?;
    let cq = Cq::new(&channel, 16)?;
    let pd = Pd::new(&ctx)?;
    let mut id = id;
    id.create_qp_with(&pd, &cq, &cq, &QpInit::new())?;
    drop(pd);
    println!("{:?}", id.qp_num());
    Ok(())
}

fn main() {
    let _ = serve;
}
