// A registered buffer cannot be moved while its memory region lives.
use evchan_core::verbs::{Context, Pd};

fn main() -> Result<(), evchan_core::verbs::Error> {
    let ctx = Context::open_first()?;
    let pd = Pd::new(&ctx)?;
    let mut buf = Box::new([0u8; 64]);
    let mr = pd.reg_mr(&mut buf[..])?;
    let moved = buf;
    println!("{} {}", mr.lkey(), moved.len());
    Ok(())
}
