//! Native tests of the verbs layer: what happens without an RDMA device (this machine and
//! CI), and argument checks that need no device.
#![forbid(unsafe_code)]

use evchan_core::verbs::{Context, DeviceList, Error};

#[test]
fn no_device_is_its_own_error_with_advice() {
    match DeviceList::new() {
        Ok(list) if !list.is_empty() => {
            eprintln!("a device exists here; checking DeviceNotFound instead");
            match Context::open("no-such-device-evchan") {
                Err(Error::DeviceNotFound(name)) => assert_eq!(name, "no-such-device-evchan"),
                other => panic!("expected DeviceNotFound, got {other:?}"),
            }
        }
        Ok(_) | Err(Error::NoDevice) => {
            let err = Context::open_first().unwrap_err();
            assert!(matches!(err, Error::NoDevice), "{err:?}");
            let msg = err.to_string();
            assert!(
                msg.contains("rdma link add") && msg.contains("cargo xtask vm"),
                "{msg}"
            );
            assert!(matches!(Context::open("rxe0"), Err(Error::NoDevice)));
            let io: std::io::Error = err.into();
            assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        }
        Err(other) => panic!("ibv_get_device_list failed oddly: {other:?}"),
    }
}

#[test]
fn handles_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    use evchan_core::verbs::*;
    send_sync::<DeviceList>();
    send_sync::<Context>();
    send_sync::<Pd<'static>>();
    send_sync::<CompChannel<'static>>();
    send_sync::<Cq<'static>>();
    send_sync::<CqEvent<'static>>();
    send_sync::<Mr<'static, Vec<u8>>>();
    send_sync::<Qp<'static>>();
    send_sync::<Posted<'static, Vec<u8>>>();
    send_sync::<AsyncEvent<'static>>();
    send_sync::<WorkCompletion>();
    send_sync::<Error>();
}
