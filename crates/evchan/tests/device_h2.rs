//! A real protocol stack over `evchan::Stream`: hyper's HTTP/2 client and server (h2's many
//! concurrent writers and its own flow control over evchan's credits), many requests at once
//! on one connection, against the kernel's rdma_cm and rxe (in the soft-RoCE VM). Run with
//! `--test-threads 1`.
#![forbid(unsafe_code)]

mod support;

use std::time::Duration;

use bytes::Bytes;
use evchan::{Config, Connection, Listener, Stream};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::{port, step, v4};

/// The server's answer: the request's body reversed, and its length in a header.
async fn reverse(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let mut body = req.into_body().collect().await?.to_bytes().to_vec();
    body.reverse();
    let len = body.len();
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    resp.headers_mut().insert("x-len", len.into());
    Ok(resp)
}

/// `total` requests, `concurrent` at a time, on one HTTP/2 connection over one evchan
/// connection of `config`; each body of up to 20 KiB (several messages, past h2's frames).
async fn h2_run(config: Config, port: u16, total: usize, concurrent: usize) {
    let listener = step("bind", Listener::bind(v4(port), config.clone()))
        .await
        .unwrap();
    let addr = listener.local_addr();
    let server = tokio::spawn(async move {
        let conn = listener.accept().await?.accept(b"h2").await?;
        let io = TokioIo::new(Stream::new(conn));
        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(io, hyper::service::service_fn(reverse))
            .await
            .map_err(std::io::Error::other)?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    });
    let conn = step(
        "connect",
        Connection::builder().config(config).connect(addr),
    )
    .await
    .unwrap();
    let io = TokioIo::new(Stream::new(conn));
    let (sender, driver) = step(
        "handshake",
        hyper::client::conn::http2::handshake(TokioExecutor::new(), io),
    )
    .await
    .unwrap();
    let driver = tokio::spawn(driver);
    let started = std::time::Instant::now();
    let mut next = 0usize;
    let mut running = tokio::task::JoinSet::new();
    while next < total || !running.is_empty() {
        while next < total && running.len() < concurrent {
            let mut sender = sender.clone();
            let i = next;
            next += 1;
            running.spawn(async move {
                let len = (i * 7919) % 20_000;
                let body: Vec<u8> = (0..len).map(|k| (k ^ i) as u8).collect();
                let req = Request::post(format!("http://evchan/{i}"))
                    .body(Full::new(Bytes::from(body.clone())))
                    .unwrap();
                let resp = sender.send_request(req).await?;
                assert_eq!(resp.status(), 200);
                assert_eq!(resp.headers()["x-len"], len.to_string().as_str());
                let got = resp.into_body().collect().await?.to_bytes();
                let mut want = body;
                want.reverse();
                assert_eq!(got.as_ref(), &want[..], "request {i}");
                Ok::<_, hyper::Error>(())
            });
        }
        let done = step("a response", running.join_next()).await.unwrap();
        done.unwrap().unwrap();
    }
    eprintln!(
        "{total} HTTP/2 requests, {concurrent} at a time, on one connection: {:?}",
        started.elapsed()
    );
    // The client goes: its connection closes, and the server's ends.
    drop(sender);
    step("client connection", driver).await.unwrap().unwrap();
    step("server", server).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_requests_at_once_over_one_stream() {
    require_device!();
    h2_run(Config::new(), port(0), 600, 64).await;
}

/// A small window: h2's writers wait for evchan's credits as much as for h2's own.
#[tokio::test]
async fn http2_over_a_window_of_two_messages() {
    require_device!();
    let config = Config::new().recv_depth(2).send_depth(2);
    h2_run(config, port(1), 200, 16).await;
    let busy = Config::new()
        .recv_depth(2)
        .busy_poll(Some(Duration::from_micros(200)));
    h2_run(busy, port(2), 100, 16).await;
}
