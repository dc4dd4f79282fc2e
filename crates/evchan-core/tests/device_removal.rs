//! Device test: DEVICE_REMOVAL (the rxe link is deleted while ids live) and ADDR_ERROR (the VM's
//! address resolved while no RDMA device carries it), then the link is restored.
//!
//! Soft-RoCE cannot disassociate user contexts: deleting the link waits until every process that
//! opened the device (`/dev/infiniband/uverbs*`) has closed it. librdmacm opens a device lazily,
//! when it first processes an event or a query that names it; so this test checks for the
//! device in sysfs (not with `device::probe`, which opens it), and deletes the link while its
//! id's `ADDR_RESOLVED` is still unread in the channel: the kernel id is on the device, the
//! process has not opened it. This binary holds this one test only, since it takes the device
//! away for a moment.
#![forbid(unsafe_code)]

mod support;

use std::os::fd::AsFd;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use evchan_core::cm::{EventKind, PortSpace, Status};
use evchan_core::{CmId, EventChannel};
use support::*;

const DEVICE: &str = "rxe0";

/// Puts the rxe link back, whatever happened to the test.
struct RestoreLink;

impl Drop for RestoreLink {
    fn drop(&mut self) {
        if Path::new("/sys/class/infiniband").join(DEVICE).exists() {
            return;
        }
        let status = Command::new("rdma")
            .args(["link", "add", DEVICE, "type", "rxe", "netdev", VM_IF])
            .status();
        eprintln!("restored {DEVICE}: {status:?}");
    }
}

#[test]
fn device_removal_then_addr_error() {
    if !Path::new("/sys/class/infiniband").join(DEVICE).exists()
        || evchan_core::if_index(VM_IF).is_none()
    {
        skip(&format!(
            "no {DEVICE} on {VM_IF} (this test deletes and restores the VM's rxe link)"
        ));
        return;
    }
    let _restore = RestoreLink;
    let channel = EventChannel::new().unwrap();
    let id = CmId::new(&channel, PortSpace::Tcp)
        .unwrap()
        .resolve_addr(None, v4(port(1)), RESOLVE_TIMEOUT)
        .unwrap();
    // Readable: the kernel resolved the address and put the id on the device.
    assert!(evchan_sys::fd::poll_readable(channel.as_fd(), Some(EVENT_TIMEOUT)).unwrap());

    let mut delete = Command::new("rdma")
        .args(["link", "delete", DEVICE])
        .spawn()
        .unwrap();
    let deleted = tool::wait_for(&mut delete, Duration::from_secs(60), "rdma link delete");
    assert!(deleted.success(), "rdma link delete failed");

    // The id learns of the removal (after its address event, which librdmacm can no longer
    // complete against the device and so reports as it finds it).
    let mut kinds = Vec::new();
    loop {
        let ev = next_event(&channel, "DEVICE_REMOVAL");
        assert!(ev.is_for(&id), "{ev:?}");
        kinds.push(ev.kind());
        if ev.kind() == EventKind::DeviceRemoval {
            break;
        }
        assert!(kinds.len() < 3, "no DEVICE_REMOVAL: {kinds:?}");
    }
    eprintln!("events of the id on the removed device: {kinds:?}");
    drop(id);

    // The address still exists, but no RDMA device carries it any more.
    let id = CmId::new(&channel, PortSpace::Tcp)
        .unwrap()
        .resolve_addr(None, v4(port(2)), RESOLVE_TIMEOUT)
        .expect("rdma_resolve_addr starts; the failure comes as an event");
    let ev = next_event(&channel, "ADDR_ERROR");
    assert_eq!(ev.kind(), EventKind::AddrError, "{ev:?}");
    assert!(ev.raw_status() < 0, "{ev:?}");
    assert!(matches!(ev.status(), Status::Errno(e) if e > 0), "{ev:?}");
    let err = id.addr_resolved(&ev).unwrap_err();
    eprintln!("ADDR_ERROR: {}", err.error);
    drop(ev);
    drop(err);
    drop(channel);

    drop(_restore);
    assert!(
        Path::new("/sys/class/infiniband").join(DEVICE).exists(),
        "{DEVICE} not restored"
    );
    assert!(evchan_core::device::probe().is_ok());
}
