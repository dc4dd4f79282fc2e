//! The runtime behind every listener and connection: shard threads that own the rdma_cm event
//! channels, the completion channels and every id.
//!
//! evchan-core's types borrow: an id borrows its event channel, a QP its PD and CQ. Here that
//! stays true. One thread (`evchan-rt`) opens, per device, librdmacm's context and a PD, and per
//! shard an event channel and, per device, a completion channel and one CQ; then, inside
//! [`std::thread::scope`], it starts one thread per shard that borrows them. A shard thread runs
//! a current-thread tokio runtime that drives its channels through `AsyncFd` and owns its ids,
//! QPs and memory regions; ids accepted on one shard are migrated (`rdma_migrate_id`) to
//! another and sent there, which scoped threads allow without `'static`. Users talk to shards
//! through channels only, so every handle is `Send + 'static` and the crate has no `unsafe`.
//!
//! When the last handle of a runtime is gone, each shard finishes closing its connections, the
//! scope ends, and the resources go in the order librdmacm and libibverbs need: CQs, completion
//! channels, PDs, contexts, then event channels.

mod conn;
mod half_open;
pub(crate) mod removal;
mod shard;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, Semaphore};

use evchan_core::verbs::{CompChannel, Context, Cq, Pd};
use evchan_core::EventChannel;

use crate::config::Config;
use crate::error::{Error, Lost, Result};
use crate::proto::Peer;

/// The hasher of the shards' maps, whose keys are their own integers (connection numbers,
/// work request ids, id keys), never a peer's: FxHash's multiply-rotate, not SipHash, which
/// took a tenth of a shard's user-space instructions per round trip (callgrind of the async
/// ping-pong; docs/BENCHMARKS.md).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IntHasher(u64);

impl std::hash::Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A map with [`IntHasher`].
pub(crate) type IntMap<K, V> =
    std::collections::HashMap<K, V, std::hash::BuildHasherDefault<IntHasher>>;

/// A connection's number, unique within its runtime (ids' addresses are reused).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ConnId(pub(crate) u64);

/// What a user handle asks of a shard. Replies carry the user's handle itself, so that a
/// reply nobody receives (its future was dropped) closes what it stands for on drop.
#[derive(Debug)]
pub(crate) enum Cmd {
    // Boxed, as is `Listen`: every command is moved through the shard's channel, and these
    // two would make each of them, `Send` included, about four times as large.
    Connect(Box<ConnectCmd>),
    Listen(Box<ListenCmd>),
    CloseListener(ConnId),
    Accept {
        conn: ConnId,
        private_data: Vec<u8>,
        reply: oneshot::Sender<Result<crate::Connection>>,
    },
    Reject {
        conn: ConnId,
        private_data: Vec<u8>,
    },
    Send {
        conn: ConnId,
        data: Bytes,
    },
    /// The send half is gone or shut down: `FIN` after what is queued.
    Shutdown(ConnId),
    /// The receive half is gone: what arrives is dropped (and credited) at once.
    RecvDropped(ConnId),
    /// Close: `FIN`, then disconnect, then release everything; `reply` when done.
    Close {
        conn: ConnId,
        reply: Option<oneshot::Sender<()>>,
    },
    /// A device was removed: the shard fails everything it has and ends (see `removal`).
    DeviceRemoved,
}

/// [`Cmd::Connect`]'s request.
#[derive(Debug)]
pub(crate) struct ConnectCmd {
    pub(crate) conn: ConnId,
    pub(crate) addr: SocketAddr,
    pub(crate) config: Config,
    pub(crate) private_data: Vec<u8>,
    pub(crate) reply: oneshot::Sender<Result<crate::Connection>>,
}

/// [`Cmd::Listen`]'s request.
#[derive(Debug)]
pub(crate) struct ListenCmd {
    pub(crate) conn: ConnId,
    pub(crate) addr: SocketAddr,
    pub(crate) config: Config,
    pub(crate) reply: oneshot::Sender<Result<crate::Listener>>,
}

/// What arrives at a connection's receive half.
#[derive(Debug)]
pub(crate) enum Delivery {
    Data(Bytes),
    Fin,
    Lost(Lost),
}

/// State shared by a connection's halves and its shard.
#[derive(Debug)]
pub(crate) struct Shared {
    /// One permit per message that may be queued or in flight.
    pub(crate) permits: Arc<Semaphore>,
    /// Why sends fail, once the connection is over.
    pub(crate) end: Mutex<Option<SendEnd>>,
    /// A message sent on the connection was not delivered: it was still queued or in flight
    /// when the connection ended, or its send failed ([`Connection::close`]'s result).
    ///
    /// [`Connection::close`]: crate::Connection::close
    undelivered: std::sync::atomic::AtomicBool,
}

/// Why sends fail.
#[derive(Debug, Clone)]
pub(crate) enum SendEnd {
    PeerClosed,
    Lost(Lost),
}

impl Shared {
    pub(crate) fn new(permits: u32) -> Arc<Self> {
        Arc::new(Self {
            permits: Arc::new(Semaphore::new(permits as usize)),
            end: Mutex::new(None),
            undelivered: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Records that a message sent on the connection was not delivered.
    pub(crate) fn mark_undelivered(&self) {
        self.undelivered
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// What [`Connection::close`](crate::Connection::close) returns once its shard has
    /// released the connection (`released`), or once the shard is gone (`gone`: why).
    pub(crate) fn close_result(&self, released: bool, gone: Lost) -> Result<()> {
        let undelivered = self.undelivered.load(std::sync::atomic::Ordering::Acquire);
        let end = self
            .end
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match end {
            Some(SendEnd::Lost(why)) if why != Lost::Closed => Err(Error::ConnectionLost(why)),
            _ if !released => Err(Error::ConnectionLost(gone)),
            // Ended without a loss of its own, but something sent did not arrive: the peer
            // disconnected during the close, before what was queued went out.
            _ if undelivered => Err(Error::ConnectionLost(Lost::Disconnected)),
            _ => Ok(()),
        }
    }

    pub(crate) fn end(&self, why: SendEnd) {
        let mut end = self.end.lock().unwrap_or_else(PoisonError::into_inner);
        end.get_or_insert(why);
        self.permits.close();
    }

    pub(crate) fn permits_arc(&self) -> Arc<Semaphore> {
        self.permits.clone()
    }

    pub(crate) fn send_error(&self) -> Error {
        match self
            .end
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            Some(SendEnd::PeerClosed) => Error::PeerClosed,
            Some(SendEnd::Lost(l)) => Error::ConnectionLost(l),
            None => Error::ConnectionLost(Lost::Closed),
        }
    }
}

/// An established connection, handed from its shard to the user.
#[derive(Debug)]
pub(crate) struct Established {
    pub(crate) conn: ConnId,
    pub(crate) shard: ShardRef,
    pub(crate) inbox: mpsc::UnboundedReceiver<Delivery>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) local_addr: Option<SocketAddr>,
    pub(crate) peer_addr: Option<SocketAddr>,
    pub(crate) peer: Peer,
    pub(crate) max_send: usize,
}

/// A set of shard threads; shared by every handle made with the same shard count. The shards
/// run until the last `Arc` of it is gone (every handle holds one).
#[derive(Debug)]
pub(crate) struct Runtime {
    shards: Vec<mpsc::UnboundedSender<Cmd>>,
    next_shard: std::sync::atomic::AtomicUsize,
    next_conn: std::sync::atomic::AtomicU64,
    removal: Arc<removal::Removal>,
}

/// A handle's way to its shard: it keeps the whole runtime alive.
#[derive(Debug, Clone)]
pub(crate) struct ShardRef {
    rt: Arc<Runtime>,
    index: usize,
}

impl ShardRef {
    /// Sends `cmd` to the shard; `false` when the shard is gone (its thread failed).
    pub(crate) fn send(&self, cmd: Cmd) -> bool {
        self.rt.shards[self.index].send(cmd).is_ok()
    }

    /// Why the shard no longer answers: a device removal retired it, or it is gone (an
    /// in-task shard dropped with its tokio runtime), or else this side closed.
    pub(crate) fn lost(&self) -> Lost {
        if self.rt.removal.is_retired() {
            Lost::DeviceRemoved
        } else if self.rt.shards[self.index].is_closed() {
            Lost::Shutdown
        } else {
            Lost::Closed
        }
    }
}

/// What makes two runtimes different: shards, CQ entries, busy-poll window, and for an
/// in-task runtime ([`Config::in_task`]) the thread that started it.
type RuntimeKey = (
    usize,
    u32,
    Option<std::time::Duration>,
    Option<std::thread::ThreadId>,
);

static RUNTIMES: Mutex<Vec<(RuntimeKey, Weak<Runtime>)>> = Mutex::new(Vec::new());

impl Runtime {
    /// The running runtime of `config.shards` shards, or a new one.
    pub(crate) fn shared(config: &Config) -> Result<Arc<Runtime>> {
        config.validate()?;
        let mut all = RUNTIMES.lock().unwrap_or_else(PoisonError::into_inner);
        if removal::retiring() {
            // A runtime is letting go of a removed device; a new one would open it again.
            return Err(Error::ConnectionLost(Lost::DeviceRemoved));
        }
        // A runtime whose shards are gone (an in-task runtime whose tokio runtime shut down,
        // or a shard that failed to start) is not handed out again.
        all.retain(|(_, w)| w.upgrade().is_some_and(|rt| rt.running()));
        let key = if config.in_task {
            let thread = std::thread::current().id();
            (1, config.cq_entries, config.busy_poll, Some(thread))
        } else {
            (config.shards, config.cq_entries, config.busy_poll, None)
        };
        if let Some(rt) = all
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, w)| w.upgrade())
        {
            return Ok(rt);
        }
        let rt = Self::start(key)?;
        all.push((key, Arc::downgrade(&rt)));
        Ok(rt)
    }

    /// Whether every shard still takes commands.
    fn running(&self) -> bool {
        self.shards.iter().all(|s| !s.is_closed())
    }

    fn start((shards, cq_entries, busy_poll, in_task): RuntimeKey) -> Result<Arc<Runtime>> {
        let (txs, mut rxs): (Vec<_>, Vec<_>) =
            (0..shards).map(|_| mpsc::unbounded_channel()).unzip();
        let rt = Arc::new(Runtime {
            shards: txs,
            next_shard: std::sync::atomic::AtomicUsize::new(0),
            next_conn: std::sync::atomic::AtomicU64::new(1),
            removal: Arc::default(),
        });
        let weak = Arc::downgrade(&rt);
        if in_task.is_some() {
            let tokio = tokio::runtime::Handle::try_current().map_err(|_| {
                Error::Config(
                    "Config::in_task: connect or listen from within a tokio runtime".into(),
                )
            })?;
            probe_drivers()?;
            // What fails for lack of a device fails here, at once, with its own error.
            let channel = EventChannel::new()?;
            let devices = open_devices()?;
            let rx = rxs.pop().expect("one shard");
            let removal = rt.removal.clone();
            let names = devices.iter().map(|d| d.name.clone()).collect();
            tokio.spawn(removal::watch_in_task(weak.clone(), names));
            tokio.spawn(run_in_task(
                rx, weak, cq_entries, busy_poll, channel, devices, removal,
            ));
            return Ok(rt);
        }
        let removal = rt.removal.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("evchan-rt".into())
            .spawn(move || {
                run(rxs, &weak, cq_entries, busy_poll, &ready_tx, &removal);
                removal::let_go(&removal);
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(rt),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Io(std::io::Error::other(
                "the evchan runtime thread ended during startup",
            ))),
        }
    }

    /// A shard for a new id (round robin).
    pub(crate) fn pick(self: &Arc<Self>) -> ShardRef {
        let n = self
            .next_shard
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.shard(n % self.shards.len())
    }

    pub(crate) fn shard(self: &Arc<Self>, index: usize) -> ShardRef {
        ShardRef {
            rt: self.clone(),
            index,
        }
    }

    pub(crate) fn conn_id(&self) -> ConnId {
        ConnId(
            self.next_conn
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        )
    }
}

/// Per device: librdmacm's context and its name.
struct Device {
    ctx: Context,
    name: String,
}

/// The runtime thread: opens everything, runs the shards in a scope, then closes everything.
fn run(
    rxs: Vec<mpsc::UnboundedReceiver<Cmd>>,
    rt: &Weak<Runtime>,
    cq_entries: u32,
    busy_poll: Option<std::time::Duration>,
    ready: &std::sync::mpsc::Sender<Result<()>>,
    removal: &removal::Removal,
) {
    // Declaration order is the reverse of drop order: event channels last (their ids are gone
    // by then), CQs before their completion channels, PDs before their contexts.
    let channels: Vec<EventChannel> = match (0..rxs.len()).map(|_| EventChannel::new()).collect() {
        Ok(c) => c,
        Err(e) => return drop(ready.send(Err(e.into()))),
    };
    let devices = match open_devices() {
        Ok(d) => d,
        Err(e) => return drop(ready.send(Err(e))),
    };
    let (pds, comps) = match open_pds(&devices, rxs.len()) {
        Ok(x) => x,
        Err(e) => return drop(ready.send(Err(e))),
    };
    let cqs = match open_cqs(&comps, cq_entries) {
        Ok(c) => c,
        Err(e) => return drop(ready.send(Err(e))),
    };
    if ready.send(Ok(())).is_err() {
        return;
    }
    let names: Vec<String> = devices.iter().map(|d| d.name.clone()).collect();
    let (peer_txs, peer_rxs): (Vec<_>, Vec<_>) =
        (0..rxs.len()).map(|_| mpsc::unbounded_channel()).unzip();
    std::thread::scope(|scope| {
        let mut threads = Vec::new();
        for (k, ((rx, peer_rx), cqs)) in rxs.into_iter().zip(peer_rxs).zip(&cqs).enumerate() {
            let env = shard::Env {
                index: k,
                channels: &channels,
                names: &names,
                pds: &pds,
                comps: &comps[k],
                cqs,
                cq_entries,
                busy_poll,
                in_task: false,
                rt: rt.clone(),
                peers: peer_txs.clone(),
                removal,
            };
            let spawned = std::thread::Builder::new()
                .name(format!("evchan-shard-{k}"))
                .spawn_scoped(scope, move || shard::run(env, rx, peer_rx));
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => tracing::error!("evchan: cannot start shard {k}: {e}"),
            }
        }
        drop(peer_txs);
        removal::watch(&threads, &names, rt, removal);
    });
    removal.opened(&names);
    // Dropped in reverse declaration order: CQs, completion channels, PDs, contexts, event
    // channels. After a device removal, `Runtime::start`'s thread then waits for librdmacm to
    // close its own context of the device (`removal::let_go`).
}

/// Whether the current tokio runtime has the I/O and time drivers an in-task shard needs.
/// tokio panics when a descriptor is registered or a timer made without them; that panic
/// (printed by the panic hook) is caught here and becomes a configuration error, instead of
/// ending the shard's task later.
fn probe_drivers() -> Result<()> {
    let probe = std::panic::catch_unwind(|| {
        let (reader, _writer) = std::io::pipe()?;
        drop(evchan_core::Readable::new(std::os::fd::AsFd::as_fd(
            &reader,
        ))?);
        drop(tokio::time::sleep(std::time::Duration::ZERO));
        Ok::<_, std::io::Error>(())
    });
    match probe {
        Ok(done) => Ok(done?),
        Err(_) => Err(Error::Config(
            "Config::in_task needs a tokio runtime with its I/O and time drivers enabled \
             (Builder::enable_all)"
                .into(),
        )),
    }
}

/// librdmacm's context of every device it lists.
fn open_devices() -> Result<Vec<Device>> {
    Ok(Context::rdma_cm_devices()?
        .into_iter()
        .map(|ctx| Device {
            name: ctx.name(),
            ctx,
        })
        .collect())
}

/// Per device a PD, and per shard and device a completion channel.
fn open_pds(devices: &[Device], shards: usize) -> Result<(Vec<Pd<'_>>, Vec<Vec<CompChannel<'_>>>)> {
    let pds = devices
        .iter()
        .map(|d| Pd::new(&d.ctx))
        .collect::<std::result::Result<_, _>>()?;
    let comps = (0..shards)
        .map(|_| devices.iter().map(|d| CompChannel::new(&d.ctx)).collect())
        .collect::<std::result::Result<_, _>>()?;
    Ok((pds, comps))
}

/// Per shard and device a CQ on that shard's completion channel of the device.
fn open_cqs<'a>(comps: &'a [Vec<CompChannel<'_>>], entries: u32) -> Result<Vec<Vec<Cq<'a>>>> {
    Ok(comps
        .iter()
        .map(|per_dev| per_dev.iter().map(|c| Cq::new(c, entries)).collect())
        .collect::<std::result::Result<_, _>>()?)
}

/// An in-task runtime ([`Config::in_task`]): its one shard, as a task of the application's
/// runtime. It owns what a runtime thread owns otherwise, and drops it in the same order when
/// the shard ends (or when the application's runtime drops the task).
async fn run_in_task(
    rx: mpsc::UnboundedReceiver<Cmd>,
    rt: Weak<Runtime>,
    cq_entries: u32,
    busy_poll: Option<std::time::Duration>,
    channel: EventChannel,
    devices: Vec<Device>,
    removal: Arc<removal::Removal>,
) {
    // Declared first, dropped last: after everything below, however the task ends.
    let _let_go = LetGo(removal.clone());
    {
        // Dropped in reverse: CQs, completion channels, PDs, contexts, the event channel.
        let channels = [channel];
        let devices = devices;
        let names: Vec<String> = devices.iter().map(|d| d.name.clone()).collect();
        let (pds, comps) = match open_pds(&devices, 1) {
            Ok(x) => x,
            Err(e) => return tracing::error!("evchan: cannot start the in-task shard: {e}"),
        };
        let cqs = match open_cqs(&comps, cq_entries) {
            Ok(c) => c,
            Err(e) => return tracing::error!("evchan: cannot start the in-task shard: {e}"),
        };
        let (peer_tx, peer_rx) = mpsc::unbounded_channel();
        let env = shard::Env {
            index: 0,
            channels: &channels,
            names: &names,
            pds: &pds,
            comps: &comps[0],
            cqs: &cqs[0],
            cq_entries,
            busy_poll,
            in_task: true,
            rt,
            peers: vec![peer_tx],
            removal: &removal,
        };
        shard::serve(env, rx, peer_rx).await;
        removal.opened(&names);
    }
}

/// Step 3 of a removal ([`removal::let_go`]) for an in-task runtime, once everything of it is
/// dropped: also when the application's runtime drops the task midway, so that a retirement
/// never stays counted (which would keep every new runtime from starting). After a removal
/// the wait for librdmacm blocks, so it runs on a thread of its own, not on the application's.
struct LetGo(Arc<removal::Removal>);

impl Drop for LetGo {
    fn drop(&mut self) {
        let removal = self.0.clone();
        if !removal.is_retired() {
            return removal::let_go(&removal);
        }
        let spawned = std::thread::Builder::new()
            .name("evchan-let-go".into())
            .spawn(move || removal::let_go(&removal));
        if let Err(e) = spawned {
            // Rather block this thread than keep every new runtime from starting.
            tracing::error!("evchan: no thread to let go of a removed device ({e}); waiting here");
            removal::let_go(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost(r: Result<()>) -> Option<Lost> {
        match r {
            Ok(()) => None,
            Err(Error::ConnectionLost(why)) => Some(why),
            Err(e) => panic!("not a loss: {e:?}"),
        }
    }

    #[test]
    fn close_result_tells_a_clean_close_from_a_loss() {
        // Released after a clean close (the shard ends sends with `Closed`), or after the peer
        // closed first: clean unless something sent did not arrive.
        for end in [
            None,
            Some(SendEnd::Lost(Lost::Closed)),
            Some(SendEnd::PeerClosed),
        ] {
            let s = Shared::new(1);
            if let Some(end) = end.clone() {
                s.end(end);
            }
            assert_eq!(lost(s.close_result(true, Lost::Shutdown)), None, "{end:?}");
            s.mark_undelivered();
            assert_eq!(
                lost(s.close_result(true, Lost::Shutdown)),
                Some(Lost::Disconnected),
                "{end:?}, undelivered"
            );
        }
        // A loss before or during the close is reported with its cause, delivered or not.
        let s = Shared::new(1);
        s.end(SendEnd::Lost(Lost::DeviceRemoved));
        assert_eq!(
            lost(s.close_result(true, Lost::Shutdown)),
            Some(Lost::DeviceRemoved)
        );
        // The shard gone before it released the connection: the shard's cause.
        let s = Shared::new(1);
        assert_eq!(
            lost(s.close_result(false, Lost::Shutdown)),
            Some(Lost::Shutdown)
        );
    }
}
