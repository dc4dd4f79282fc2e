// A CQ outlives the QPs that use it (ibv_destroy_cq would fail with EBUSY).
use evchan_core::verbs::{CompChannel, Context, Cq, Pd, Qp, QpCaps};

fn main() -> Result<(), evchan_core::verbs::Error> {
    let ctx = Context::open_first()?;
    let pd = Pd::new(&ctx)?;
    let channel = CompChannel::new(&ctx)?;
    let cq = Cq::new(&channel, 16)?;
    let qp = Qp::new_rc(&pd, &cq, &cq, QpCaps::default())?;
    drop(cq);
    println!("{}", qp.qp_num());
    Ok(())
}
