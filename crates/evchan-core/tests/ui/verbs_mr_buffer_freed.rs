// A registered buffer cannot be freed while its memory region lives.
use evchan_core::verbs::{Context, Pd};

fn main() -> Result<(), evchan_core::verbs::Error> {
    let ctx = Context::open_first()?;
    let pd = Pd::new(&ctx)?;
    let mut buf = vec![0u8; 64];
    let mr = pd.reg_mr(buf.as_mut_slice())?;
    drop(buf);
    println!("{}", mr.lkey());
    Ok(())
}
