// A PD outlives its memory regions (ibv_dealloc_pd would fail with EBUSY).
use evchan_core::verbs::{Context, Pd};

fn main() -> Result<(), evchan_core::verbs::Error> {
    let ctx = Context::open_first()?;
    let pd = Pd::new(&ctx)?;
    let mr = pd.reg_mr(vec![0u8; 64])?;
    drop(pd);
    println!("{}", mr.lkey());
    Ok(())
}
