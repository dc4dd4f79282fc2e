// A local connection kept past its closure: its QP, CQ and memory are gone by then.
async fn escape() -> Result<(), evchan::Error> {
    let addr = "169.254.77.1:7471".parse().unwrap();
    let mut kept = None;
    evchan::local::connect(addr, evchan::Config::new(), b"", async |conn| {
        kept = Some(conn);
    })
    .await?;
    drop(kept);
    Ok(())
}

fn main() {
    drop(escape());
}
