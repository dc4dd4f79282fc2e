// Two local connections of nested futures swapped: the inner future would close the outer's
// connection, and the outer would close the inner's after its objects were dropped.
async fn swap() -> Result<(), evchan::Error> {
    let addr = "169.254.77.1:7471".parse().unwrap();
    evchan::local::connect(addr, evchan::Config::new(), b"", async |outer| {
        evchan::local::connect(addr, evchan::Config::new(), b"", async |inner| {
            std::mem::swap(outer, inner);
        })
        .await
    })
    .await??;
    Ok(())
}

fn main() {
    drop(swap());
}
