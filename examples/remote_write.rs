//! One-sided RDMA on evchan: a target exposes memory and hands over its descriptor, an
//! initiator RDMA WRITEs into it and adds to a counter with an atomic, then the target revokes
//! the peer's access and reads its bytes as a plain slice. Both ends run in this process.
//!
//! ```text
//! remote_write [--addr IP:PORT]
//! ```
//!
//! Default address: 169.254.77.1:7473 (the soft-RoCE VM's); in the VM:
//! `cargo rxe run -- target/debug/examples/remote_write`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use evchan::remote::{RemoteAtomic, RemoteBuf, RemoteWrite};
use evchan::{Connection, Listener};

pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The target: exposes 4 KiB to write and a counter, sends their descriptors, waits for the
/// peer's word that it is done, then revokes.
async fn target(listener: Listener) -> Result<()> {
    let mut conn = listener.accept().await?.accept(&[]).await?;
    let page = conn.expose::<RemoteWrite>(4096)?;
    let counter = conn.expose::<RemoteAtomic>(8)?;
    counter.atomic_u64(0)?.store(100, Ordering::Relaxed);
    // 20 bytes each: address, length, rkey and access, in the documented wire form.
    conn.send(page.descriptor().to_bytes()).await?;
    conn.send(counter.descriptor().to_bytes()).await?;
    // No slice of the exposed bytes while the peer may write them: the "done" message comes
    // after its write completed, and only the revocation gives the bytes back.
    let done = conn.recv().await?.ok_or("the initiator left")?;
    assert_eq!(&done[..], b"done");
    let count = counter.atomic_u64(0)?.load(Ordering::Relaxed);
    let bytes = page.revoke()?;
    let text = std::str::from_utf8(&bytes[64..64 + 21])?;
    println!("target: the peer wrote {text:?} at offset 64; the counter is {count}");
    conn.close().await?;
    Ok(())
}

/// The initiator: decodes the descriptors (untrusted bytes, checked), writes, adds, says done.
async fn initiator(addr: SocketAddr) -> Result<()> {
    let mut conn = Connection::connect(addr).await?;
    let msg = conn.recv().await?.ok_or("no page descriptor")?;
    let page = RemoteBuf::<RemoteWrite>::from_bytes(&msg)?;
    let msg = conn.recv().await?.ok_or("no counter descriptor")?;
    let counter = RemoteBuf::<RemoteAtomic>::from_bytes(&msg)?;
    conn.write(&page, 64, b"hello, exposed memory").await?;
    let before = conn.fetch_add(&counter, 0, 5).await?;
    println!("initiator: wrote 21 bytes; the counter was {before}");
    // Outside the page: refused before anything is posted, and the connection goes on.
    let refused = conn.write(&page, 4090, b"too far").await.unwrap_err();
    println!("initiator: a write past the end: {refused}");
    conn.send("done").await?;
    assert_eq!(conn.recv().await?, None);
    conn.close().await?;
    Ok(())
}

/// Both ends on `addr`.
pub async fn run(addr: SocketAddr) -> Result<()> {
    let listener = Listener::bind(addr, evchan::Config::new()).await?;
    let target = tokio::spawn(target(listener));
    initiator(addr).await?;
    target.await?
}

fn main() -> ExitCode {
    let mut addr: SocketAddr = "169.254.77.1:7473".parse().expect("an address");
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match (flag.as_str(), args.next().map(|v| v.parse())) {
            ("--addr", Some(Ok(a))) => addr = a,
            _ => {
                eprintln!("usage: remote_write [--addr IP:PORT]");
                return ExitCode::from(2);
            }
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    match rt.map_err(Into::into).and_then(|rt| rt.block_on(run(addr))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("remote_write: {e}");
            ExitCode::FAILURE
        }
    }
}
