//! HTTP/2 over RDMA: hyper's client and server, unchanged, on `evchan::Stream`.
//!
//! ```text
//! http2 [--addr IP:PORT] [--requests N] [--concurrent C]
//! ```
//!
//! One process, both ends: a listener on `--addr` (default `169.254.77.1:7480`, the soft-RoCE
//! VM's address) serves HTTP/2 (each response is the request's body reversed), and a client
//! connects once and sends `--requests` POSTs (default 1000), `--concurrent` at a time (default
//! 64), on that one connection, then prints how long they took. Run it in the VM with
//! `cargo xtask vm -- target/debug/examples/http2`.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Instant;

use bytes::Bytes;
use evchan::{Config, Connection, Listener, Stream};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};

mod tools_support;
use tools_support::Cli;

const CLI: Cli = Cli {
    program: "http2",
    usage: "usage: http2 [--addr IP:PORT] [--requests N] [--concurrent C]",
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn main() -> ExitCode {
    let (mut addr, mut requests, mut concurrent) =
        (CLI.addr("--addr", "169.254.77.1:7480"), 1000, 64);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let Some(value) = it.next() else {
            CLI.error(format_args!("{flag} needs a value"));
        };
        match flag.as_str() {
            "--addr" => addr = CLI.peer("--addr", &value),
            "--requests" => requests = CLI.number("--requests", &value, 1..=10_000_000),
            "--concurrent" => concurrent = CLI.number("--concurrent", &value, 1..=10_000),
            _ => CLI.error(format_args!("unknown argument `{flag}`")),
        }
    }
    if !tools_support::device_present(CLI.program) {
        return ExitCode::SUCCESS;
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => tools_support::fail(CLI.program, format!("tokio: {e}")),
    };
    match rt.block_on(run(addr, requests, concurrent)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => tools_support::fail(CLI.program, e),
    }
}

async fn run(addr: SocketAddr, requests: usize, concurrent: usize) -> Result<(), BoxError> {
    let listener = Listener::bind(addr, Config::new()).await?;
    let server = tokio::spawn(async move {
        let conn = listener.accept().await?.accept(b"").await?;
        let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
            let mut body = req.into_body().collect().await?.to_bytes().to_vec();
            body.reverse();
            Ok::<_, hyper::Error>(Response::new(Full::new(Bytes::from(body))))
        });
        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(Stream::new(conn)), service)
            .await?;
        Ok::<_, BoxError>(())
    });

    let conn = Connection::connect(addr).await?;
    let io = TokioIo::new(Stream::new(conn));
    let (sender, driver) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
    let driver = tokio::spawn(driver);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    let mut next = 0;
    while next < requests || !tasks.is_empty() {
        while next < requests && tasks.len() < concurrent {
            let mut sender = sender.clone();
            let body = Bytes::from(format!("request {next}"));
            next += 1;
            tasks.spawn(async move {
                let resp = sender
                    .send_request(Request::post("http://evchan/").body(Full::new(body))?)
                    .await?;
                resp.into_body().collect().await?;
                Ok::<_, BoxError>(())
            });
        }
        if let Some(done) = tasks.join_next().await {
            done??;
        }
    }
    let elapsed = started.elapsed();
    println!(
        "{requests} HTTP/2 requests, {concurrent} at a time, over one RDMA connection: {elapsed:?} ({:.0} requests/s)",
        requests as f64 / elapsed.as_secs_f64()
    );
    drop(sender);
    driver.await??;
    server.await??;
    Ok(())
}
