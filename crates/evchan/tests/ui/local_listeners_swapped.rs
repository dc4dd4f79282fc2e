// Two local listeners of nested futures swapped: the outer would accept on the inner's
// listening id after the inner future dropped it.
async fn swap() -> Result<(), evchan::Error> {
    let addr = "169.254.77.1:7471".parse().unwrap();
    evchan::local::listen(addr, evchan::Config::new(), async |outer| {
        evchan::local::listen(addr, evchan::Config::new(), async |inner| {
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
