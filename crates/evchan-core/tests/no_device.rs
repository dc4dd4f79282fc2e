//! Runs natively: on a machine without RDMA devices, creating a channel fails with the
//! `NoDevice` error that says how to get one; on one with a device, it succeeds. And the
//! interop tests' reason for a missing tool names its Debian package.
#![forbid(unsafe_code)]

mod support;

use std::path::Path;

use evchan_core::{Error, EventChannel};

fn host_has_rdma_device() -> bool {
    Path::new("/sys/class/infiniband")
        .read_dir()
        .is_ok_and(|mut entries| entries.next().is_some())
}

#[test]
fn create_event_channel_reports_no_device_or_succeeds() {
    let result = EventChannel::new();
    if host_has_rdma_device() {
        let channel = result.expect("a host with an RDMA device opens an event channel");
        assert!(!channel.is_nonblocking());
        assert!(evchan_core::device::probe().is_ok());
    } else {
        let err = result.expect_err("no /sys/class/infiniband entries, yet the channel opened");
        assert!(err.is_no_device(), "expected NoDevice, got {err:?}");
        assert!(matches!(err, Error::NoDevice(_)));
        assert_eq!(err.raw_os_error(), Some(libc::ENODEV));
        let msg = err.to_string();
        assert!(msg.contains("rdma_create_event_channel"), "{msg}");
        assert!(msg.contains("RDMA NIC"), "{msg}");
        assert!(
            msg.contains("rdma link add rxe0 type rxe netdev <iface>"),
            "{msg}"
        );
        assert!(msg.contains("cargo xtask vm -- <cmd>"), "{msg}");
        let probe = evchan_core::device::probe().expect_err("probe without a device");
        assert!(probe.is_no_device(), "{probe:?}");
        let io: std::io::Error = err.into();
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    }
}

/// A missing rdma-core tool is reported with the Debian package that has it (the interop
/// tests' skip reason). Here, not in `device_interop.rs`: device binaries hold device tests only.
#[test]
fn a_missing_tool_names_its_debian_package() {
    let err = support::tool::find("no-such-rdma-tool", "rdmacm-utils").unwrap_err();
    assert!(err.contains("`no-such-rdma-tool`"), "{err}");
    assert!(err.contains("apt-get install rdmacm-utils"), "{err}");
    assert!(support::tool::find("sh", "dash").is_ok());
}
