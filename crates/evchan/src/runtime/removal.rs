//! Device removal: the runtime retires, so that the device can go.
//!
//! A device whose driver cannot disassociate user contexts (soft-RoCE among them) is only
//! unregistered once every process that opened it has closed it. A runtime holds, per device,
//! librdmacm's context and a PD for its whole life, each shard a completion channel per
//! device, and each connection its own QP, CQ and memory regions; so when a device goes, the
//! runtime retires as a whole. Two signs start it, whichever comes first:
//! - `RDMA_CM_EVENT_DEVICE_REMOVAL` on any id of a shard (rdma_cm's `cma_process_remove`,
//!   when the kernel removes rdma_cm's client from the device before the verbs client);
//! - the device's verbs node (`/sys/class/infiniband_verbs/uverbsN`) gone, seen by the
//!   runtime thread every [`WATCH_INTERVAL`] (when the verbs client goes first: see [`watch`]).
//!
//! Then:
//! 1. every runtime of the process is taken out of the registry (a new handle starts a fresh
//!    runtime that opens the devices present then) and each of its shards is told;
//! 2. each shard fails its listeners and connections with [`Lost::DeviceRemoved`] (pending
//!    `accept`, `recv`, `send`, connects and accepts in setup), destroys their ids and QPs
//!    and takes their CQs and memory regions from their data paths at once (no drain: the
//!    device is going; the handles still deliver what was received before), then ends, which
//!    releases its completion channels;
//! 3. the runtime thread drops the PDs and its references on
//!    librdmacm's contexts, then lists librdmacm's devices until the removed one is no longer
//!    listed: librdmacm closes a device's context only when it finds the device gone from
//!    the verbs device list (`sync_devices_list` in rdma-core's `librdmacm/cma.c`) while
//!    nothing of it is held ([`let_go`]). Until then, no new runtime starts (handles get
//!    `ConnectionLost(DeviceRemoved)`).
//!
//! librdmacm (rdma-core 44 to this day) returns `ENODEV` from that listing before it compares
//! anything when no device at all is left, so the context of the **last** device is never
//! closed: removing it waits until the process exits. Step 3 gives up after [`SWEEP_LIMIT`]
//! and says so in the log.
//!
//! [`Lost::DeviceRemoved`]: crate::Lost::DeviceRemoved

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use evchan_core::verbs::Context;

use super::{Cmd, Runtime, RUNTIMES};

/// How long the runtime thread waits for librdmacm to let go of a removed device.
pub(super) const SWEEP_LIMIT: Duration = Duration::from_secs(20);

/// Runtimes retired for a removal whose runtime thread has not finished step 3 yet: no new
/// runtime starts meanwhile (it would open the departing device again).
static RETIRING: AtomicUsize = AtomicUsize::new(0);

/// A runtime's removal state, shared by its handles, its shards and its runtime thread.
#[derive(Debug, Default)]
pub(crate) struct Removal {
    retired: AtomicBool,
    /// The runtime thread has reached step 3 (or had nothing to do): a retirement after that
    /// would never be let go of, so there is none. Set and read under `names`' lock.
    ended: AtomicBool,
    /// Names of the devices whose removal was seen.
    names: Mutex<Vec<String>>,
    /// Names of the devices the runtime opened.
    opened: Mutex<Vec<String>>,
}

impl Removal {
    pub(crate) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Notes the devices the runtime opened.
    pub(super) fn opened(&self, names: &[String]) {
        *self.opened.lock().unwrap_or_else(PoisonError::into_inner) = names.to_vec();
    }

    /// Notes the removal of `device` (when known) and marks the runtime retired; `true` the
    /// first time.
    pub(super) fn retire(&self, device: Option<&str>) -> bool {
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(name) = device {
            if !names.iter().any(|n| n == name) {
                names.push(name.to_owned());
            }
        }
        if self.ended.load(Ordering::Acquire) || self.retired.swap(true, Ordering::AcqRel) {
            return false;
        }
        RETIRING.fetch_add(1, Ordering::AcqRel);
        tracing::debug!(?device, "evchan: device removed; the runtime retires");
        true
    }
}

/// Whether a runtime retired for a removal is still letting go of the device.
pub(super) fn retiring() -> bool {
    RETIRING.load(Ordering::Acquire) > 0
}

impl Runtime {
    /// A shard saw `DEVICE_REMOVAL` (of `device`, when it knows which): every runtime of the
    /// process retires, and each of their shards is told.
    ///
    /// Every runtime is marked retired before any shard is told: a shard that fails its
    /// connections then cannot disconnect a peer of another runtime of this process that does
    /// not know yet (that one would report `Disconnected` instead of the removal).
    pub(super) fn device_removed(&self, device: Option<&str>) {
        let mine = self.removal.retire(device);
        let others: Vec<Arc<Runtime>> = RUNTIMES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .filter_map(|(_, w)| w.upgrade())
            .filter(|rt| rt.removal.retire(None))
            .collect();
        if mine {
            self.tell_shards(&|| Cmd::DeviceRemoved);
        }
        for rt in others {
            rt.tell_shards(&|| Cmd::DeviceRemoved);
        }
    }

    /// Sends `cmd()` to each of its shards (one that has ended does not need it).
    pub(super) fn tell_shards(&self, cmd: &dyn Fn() -> Cmd) {
        for shard in &self.shards {
            let _ = shard.send(cmd());
        }
    }
}

/// Step 3, on the runtime thread after everything of the runtime is dropped: lists
/// librdmacm's devices until one of the removed devices (or, when no name was seen, of those
/// the runtime opened) is no longer listed, at most [`SWEEP_LIMIT`].
pub(super) fn let_go(removal: &Removal) {
    let retired = {
        let _names = removal.names.lock().unwrap_or_else(PoisonError::into_inner);
        removal.ended.store(true, Ordering::Release);
        removal.is_retired()
    };
    if !retired {
        return;
    }
    let start = Instant::now();
    let removed = {
        let names = removal.names.lock().unwrap_or_else(PoisonError::into_inner);
        if names.is_empty() {
            removal
                .opened
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        } else {
            names.clone()
        }
    };
    while !sweep(&removed, start) {
        std::thread::sleep(SWEEP_PAUSE);
    }
    RETIRING.fetch_sub(1, Ordering::AcqRel);
}

/// The pause between two looks at librdmacm's device list in a sweep.
pub(crate) const SWEEP_PAUSE: Duration = Duration::from_millis(20);

/// One look at librdmacm's device list, which makes librdmacm close its context of a device
/// gone from the verbs device list when nothing of it is held: whether the sweep that began at
/// `start` is over (one of `removed` no longer listed; no device left at all, when librdmacm
/// keeps the context until the process exits; or [`SWEEP_LIMIT`] passed), each said in the log.
pub(crate) fn sweep(removed: &[String], start: Instant) -> bool {
    let listed: Vec<String> = match Context::rdma_cm_devices() {
        Ok(list) => list.iter().map(Context::name).collect(),
        Err(e) => {
            tracing::warn!(
                "evchan: no RDMA device left ({e}); librdmacm keeps the removed device's \
                 context open until the process exits"
            );
            return true;
        }
    };
    if removed.iter().any(|n| !listed.contains(n)) {
        tracing::debug!(?removed, elapsed = ?start.elapsed(), "librdmacm let go of the device");
        return true;
    }
    if start.elapsed() > SWEEP_LIMIT {
        tracing::warn!(
            ?removed,
            "evchan: the removed device is still listed after {SWEEP_LIMIT:?}"
        );
        return true;
    }
    false
}

/// How often the runtime thread looks for a device that lost its verbs device node.
pub(crate) const WATCH_INTERVAL: Duration = Duration::from_millis(50);

/// The runtime thread's watch while its shards run: a device of `opened` whose verbs device
/// node (`/sys/class/infiniband_verbs/uverbsN`) is gone is being removed, and the runtime
/// retires as on `DEVICE_REMOVAL`.
///
/// The kernel removes its RDMA clients from a device in the reverse order of their
/// registration (`disable_device` in `drivers/infiniband/core/device.c`). When `ib_uverbs` was
/// loaded after `rdma_cm` (as `modprobe rdma_ucm` does it: rdma_ucm needs both), the verbs
/// client goes first: `ib_uverbs_remove_one` deletes the device node, then, on a driver that
/// cannot disassociate user contexts (rxe), waits until every process closed the device, and
/// only after that does rdma_cm's `cma_process_remove` send `DEVICE_REMOVAL`. A process that
/// waited for that event would wait for ever; the device node's disappearance is the one
/// sign it gets.
///
/// Each turn also reads the devices' async events and routes the QP events to their
/// connections ([`qp_events`](super::qp_events)), and looks at the send pools' idle chunks
/// ([`crate::wire::trim_pools`]).
pub(super) fn watch<T>(
    shards: &[std::thread::ScopedJoinHandle<'_, T>],
    opened: &[String],
    contexts: &[&Context],
    rt: &std::sync::Weak<Runtime>,
    removal: &Removal,
    trimmer: &mut Option<super::trim::Trimmer>,
) {
    while !shards
        .iter()
        .all(std::thread::ScopedJoinHandle::is_finished)
    {
        std::thread::sleep(WATCH_INTERVAL);
        if trimmer.as_mut().is_some_and(super::trim::Trimmer::tick) {
            if let Some(rt) = rt.upgrade() {
                rt.tell_shards(&|| Cmd::NudgeArena);
            }
        }
        crate::wire::trim_pools();
        if removal.is_retired() {
            continue;
        }
        for (name, ctx) in opened.iter().zip(contexts) {
            super::qp_events::drain(name, ctx);
        }
        if let Some(gone) = node_gone(opened) {
            match rt.upgrade() {
                Some(rt) => rt.device_removed(Some(gone)),
                None => {
                    removal.retire(Some(gone));
                }
            }
        }
    }
}

/// One look of the watches: the first device of `opened` whose verbs device node is gone;
/// `None` when all are there or sysfs cannot be read.
pub(crate) fn node_gone(opened: &[String]) -> Option<&str> {
    let present = verbs_devices()?;
    let gone = opened.iter().find(|n| !present.contains(n))?;
    tracing::debug!(device = %gone, "the device's verbs node is gone");
    Some(gone)
}

/// The devices that have a verbs device node now (`/sys/class/infiniband_verbs/*/ibdev`);
/// `None` when sysfs cannot be read, wholly or in part: a process out of descriptors
/// (`EMFILE`) must not take a device it cannot look at for a device that is gone.
pub(crate) fn verbs_devices() -> Option<Vec<String>> {
    let dir = std::fs::read_dir("/sys/class/infiniband_verbs").ok()?;
    let mut names = Vec::new();
    for entry in dir {
        let entry = entry.ok()?;
        // Only the device nodes (`uverbsN`): beside them lies the file `abi_version`.
        if !entry.file_name().to_string_lossy().starts_with("uverbs") {
            continue;
        }
        match std::fs::read_to_string(entry.path().join("ibdev")) {
            Ok(s) => names.push(s.trim().to_owned()),
            // The node went between the listing and the read: that device is going.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // Anything else (EMFILE, ENOMEM): this look cannot tell.
            Err(_) => return None,
        }
    }
    Some(names)
}
