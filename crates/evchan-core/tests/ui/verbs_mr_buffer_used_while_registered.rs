// ... nor written behind the region's back (the device may be reading it).
use evchan_core::verbs::{Context, Pd};

fn main() -> Result<(), evchan_core::verbs::Error> {
    let ctx = Context::open_first()?;
    let pd = Pd::new(&ctx)?;
    let mut array = [0u8; 64];
    let mr = pd.reg_mr(&mut array[..])?;
    array[0] = 1;
    println!("{}", mr.lkey());
    Ok(())
}
