//! Admission control on the device: a listener at `Config::max_connections` refuses a new
//! request with a typed busy reject, and its listener and connections carry on.

#[macro_use]
mod support;

use std::time::{Duration, Instant};

use evchan::{Busy, Config, Connection, Error, Listener};
use support::{port, step, v4};

/// Accepts every request and echoes each message, on tasks of its own.
async fn echo_server(listener: Listener) {
    while let Ok(incoming) = listener.accept().await {
        tokio::spawn(async move {
            let mut conn = incoming.accept(b"").await?;
            while let Some(msg) = conn.recv().await? {
                conn.send(msg).await?;
            }
            Ok::<_, Error>(())
        });
    }
}

async fn echo(conn: &mut Connection, text: &'static str) {
    step("send", conn.send(text)).await.unwrap();
    let back = step("recv", conn.recv()).await.unwrap().expect("a message");
    assert_eq!(&back[..], text.as_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_connections_rejects_typed_and_the_rest_carry_on() {
    require_device!();
    let addr = v4(port(1));
    let listener = Listener::bind(addr, Config::new().max_connections(2))
        .await
        .unwrap();
    let server = tokio::spawn(echo_server(listener));
    let mut a = step("connect a", Connection::connect(addr)).await.unwrap();
    let mut b = step("connect b", Connection::connect(addr)).await.unwrap();

    // The third, and a fourth: refused at once, typed, with the documented private data.
    for _ in 0..2 {
        let e = step("connect c", Connection::connect(addr))
            .await
            .expect_err("a third connection beyond max_connections(2)");
        match &e {
            Error::Rejected {
                reason,
                private_data,
                busy,
            } => {
                assert_eq!(reason.0, 28, "a consumer reject: {e}");
                assert_eq!(*busy, Some(Busy::Connections), "{e}");
                // What a plain librdmacm client reads in the REJECTED event.
                assert_eq!(private_data, b"evchan-busy:connections");
            }
            other => panic!("expected a busy reject, got {other:?}"),
        }
        assert!(e.to_string().contains("busy"), "{e}");
    }

    // The two admitted connections were not disturbed.
    echo(&mut a, "a still echoes").await;
    echo(&mut b, "b still echoes").await;

    // Once one is released, a new one is admitted (the release ends on the server's shard
    // after the disconnect: retried for a bounded while).
    step("close a", a.close()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut c = loop {
        match Connection::connect(addr).await {
            Ok(c) => break c,
            Err(Error::Rejected {
                busy: Some(Busy::Connections),
                ..
            }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("a connection after a release: {e}"),
        }
    };
    echo(&mut c, "c is admitted after a's release").await;
    echo(&mut b, "b echoes on").await;
    step("close b", b.close()).await.unwrap();
    step("close c", c.close()).await.unwrap();
    server.abort();
}
