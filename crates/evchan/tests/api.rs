//! What holds without a device: the handles' auto traits, configuration checks, the
//! no-device error.
#![forbid(unsafe_code)]

use evchan::{Config, Connection, Error, Incoming, Listener, RecvHalf, SendHalf, Stream};

fn send_static<T: Send + 'static>() {}
fn sync<T: Sync>() {}

#[test]
fn handles_are_send_and_static() {
    send_static::<Connection>();
    send_static::<SendHalf>();
    send_static::<RecvHalf>();
    send_static::<Listener>();
    send_static::<Incoming>();
    send_static::<Stream>();
    send_static::<Error>();
    sync::<Listener>();
    sync::<SendHalf>();
    sync::<Error>();
    send_static::<evchan::remote::Exposed<evchan::remote::RemoteReadWrite>>();
    send_static::<evchan::remote::Revoked>();
}

fn send_future<F: std::future::Future + Send>(_: F) {}

/// The one-sided operations' futures are `Send` (for `tokio::spawn`); never polled here.
#[allow(dead_code)]
fn one_sided_futures_are_send(
    c: &Connection,
    d: &evchan::remote::RemoteBuf<evchan::remote::RemoteReadWrite>,
    a: &evchan::remote::RemoteBuf<evchan::remote::RemoteAtomic>,
) {
    send_future(c.write(d, 0, [1u8]));
    send_future(c.read(d, 0, 1));
    send_future(c.fetch_add(a, 0, 1));
    send_future(c.compare_swap(a, 0, 1, 2));
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn bad_configuration_is_a_typed_error() {
    let rt = runtime();
    let addr = "169.254.77.1:7471".parse().unwrap();
    for config in [
        Config::new().shards(0),
        Config::new().recv_depth(0),
        Config::new().send_depth(1 << 20),
        Config::new().max_message(0),
        Config::new().backlog(0),
        Config::new().max_connections(0),
        Config::new().retry_count(7),
        Config::new().keepalive(Some(std::time::Duration::ZERO)),
    ] {
        let e = rt
            .block_on(Connection::builder().config(config.clone()).connect(addr))
            .unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{config:?}: {e}");
        let e = rt.block_on(Listener::bind(addr, config)).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
    }
}

#[test]
fn oversized_private_data_is_refused_before_anything() {
    let rt = runtime();
    let e = rt
        .block_on(
            Connection::builder()
                .private_data(vec![0u8; evchan::MAX_CONNECT_PRIVATE_DATA + 1])
                .connect("169.254.77.1:7471".parse().unwrap()),
        )
        .unwrap_err();
    assert!(
        matches!(e, Error::PrivateDataTooLong { len: 41, max: 40 }),
        "{e}"
    );
}

/// Without a device (this machine, natively), connecting fails with the no-device error,
/// whose message says how to get one, and so does its `Debug` (what a `main` returning the
/// error prints). Skipped where a device exists.
#[test]
fn no_device_says_how_to_get_one() {
    if evchan_core::device::probe().is_ok() {
        eprintln!("skipping no_device_says_how_to_get_one: this machine has an RDMA device");
        return;
    }
    let rt = runtime();
    let e = rt
        .block_on(Connection::connect("169.254.77.1:7471".parse().unwrap()))
        .unwrap_err();
    assert!(matches!(e, Error::NoDevice(_)), "{e}");
    let message = e.to_string();
    assert!(message.contains("rdma link add"), "{message}");
    let debug = format!("{e:?}");
    assert!(
        debug.starts_with(&message) && debug.contains("caused by: "),
        "{debug}"
    );
    let io: std::io::Error = e.into();
    assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
}
