// The safe posts take owned buffers only: a borrowed one could be freed after a
// `mem::forget` of the Posted while the device still writes into it.
use evchan_core::verbs::{CompChannel, Context, Cq, Pd, Qp, QpCaps};

fn main() -> Result<(), evchan_core::verbs::Error> {
    let ctx = Context::open_first()?;
    let pd = Pd::new(&ctx)?;
    let channel = CompChannel::new(&ctx)?;
    let cq = Cq::new(&channel, 16)?;
    let qp = Qp::new_rc(&pd, &cq, &cq, QpCaps::default())?;
    let mut array = [0u8; 64];
    let mr = pd.reg_mr(&mut array[..])?;
    let posted = qp.post_recv(mr, 0..64);
    std::mem::forget(posted);
    Ok(())
}
