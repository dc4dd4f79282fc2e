// The CQs of an id's QP (`create_qp_with`) outlive the id, in whatever state it moves on to:
// `ibv_destroy_cq` would fail with EBUSY, and the QP would complete into freed memory.
use evchan_core::cm::{state::RouteResolved, ConnParam};
use evchan_core::verbs::{CompChannel, Cq, Pd, QpInit};
use evchan_core::CmId;

fn connect(id: CmId<'_, RouteResolved>) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = id.context()?;
    let pd = Pd::new(&ctx)?;
    let channel = CompChannel::new(&ctx)?;
    let cq = Cq::new(&channel, 16)?;
    let mut id = id;
    id.create_qp_with(&pd, &cq, &cq, &QpInit::new())?;
    let id = id.connect(&ConnParam::new()).map_err(|e| e.error)?;
    drop(cq);
    println!("{:?}", id.qp_num());
    Ok(())
}

fn main() {
    let _ = connect;
}
