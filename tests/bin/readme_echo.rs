//! The README's async example as a program (its code is the README's block, verbatim):
//! `tests/readme_main.rs` runs it on a machine without an RDMA device and checks what its
//! `main` prints, the first error a newcomer meets.

use evchan::{Config, Connection, Listener};

#[tokio::main]
async fn main() -> Result<(), evchan::Error> {
    let addr = "169.254.77.1:7471".parse().unwrap();

    // Server: a task per connection; each message goes back until the peer closes.
    let listener = Listener::bind(addr, Config::new()).await?;
    tokio::spawn(async move {
        while let Ok(incoming) = listener.accept().await {
            tokio::spawn(async move {
                let mut conn = incoming.accept(b"").await?;
                while let Some(msg) = conn.recv().await? {
                    conn.send(msg).await?; // msg: Bytes over the receive buffer
                }
                Ok::<_, evchan::Error>(())
            });
        }
    });

    // Client
    let mut conn = Connection::connect(addr).await?;
    conn.send("ping").await?;
    assert_eq!(conn.recv().await?.as_deref(), Some(&b"ping"[..]));
    conn.close().await?; // Ok: all sent was delivered; then rdma_disconnect
    Ok(())
}
