//! The runtime behind every listener and connection: shard threads that own the rdma_cm event
//! channels and every id, and drive the control path (connect, accept, migrate, disconnect,
//! device removal, keepalive timers). A connection's messages do not pass through them: its
//! data path ([`crate::wire`]) is shared with its halves, which post and reap from their own
//! tasks.
//!
//! evchan-core's ids borrow their event channel. Here that stays true: one thread
//! (`evchan-rt`) opens librdmacm's context of every device and a PD on each (the owned style,
//! shared with the connections' memory regions), and per shard an event channel; then, inside
//! [`std::thread::scope`], it starts one thread per shard that borrows them. A shard thread
//! runs a current-thread tokio runtime that drives its event channel through `AsyncFd` and
//! owns its ids; ids accepted on one shard are migrated (`rdma_migrate_id`) to another and sent
//! there, which scoped threads allow without `'static`. Users talk to shards through channels
//! and to a connection's data path through its `Arc`, so every handle is `Send + 'static` and
//! the crate has no `unsafe`.
//!
//! When the last handle of a runtime is gone, each shard finishes closing its connections, the
//! scope ends, and the resources go in the order librdmacm and libibverbs need: every
//! connection's QP (with its id), CQ and memory regions first, then the shards' completion
//! channels, the PDs, the contexts, and the event channels.

mod conn;
mod half_open;
pub(crate) mod qp_events;
pub(crate) mod removal;
mod shard;
pub(crate) mod trim;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::sync::{mpsc, oneshot};

use evchan_core::verbs::{Context, OwnedPd};
use evchan_core::EventChannel;

use crate::config::Config;
use crate::error::{Error, Lost, Result};
use crate::proto::Peer;
use crate::wire::Wire;

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
    // Boxed, as is `Listen`: the rare, large requests would make every command (a close
    // included) about four times as large.
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
    /// Close: `FIN` (once every message sent before completed), then disconnect, then release
    /// everything; `reply` when done.
    Close {
        conn: ConnId,
        reply: Option<oneshot::Sender<()>>,
    },
    /// A device was removed: the shard fails everything it has and ends (see `removal`).
    DeviceRemoved,
    /// The runtime thread trimmed the allocator: the shard gives its thread's malloc arena's
    /// free top back too (`trim::nudge_arena`).
    NudgeArena,
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

/// An established connection, handed from its shard to the user.
#[derive(Debug)]
pub(crate) struct Established {
    pub(crate) conn: ConnId,
    pub(crate) shard: ShardRef,
    pub(crate) wire: Arc<Wire>,
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

    /// Why the shard no longer answers: a device removal retired it, or its thread is gone,
    /// or else this side closed.
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

/// What makes two runtimes different: their number of shards.
type RuntimeKey = usize;

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
        // A runtime whose shards are gone (a shard that failed to start) is not handed out
        // again.
        all.retain(|(_, w)| w.upgrade().is_some_and(|rt| rt.running()));
        let key = config.shards;
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

    fn start(shards: RuntimeKey) -> Result<Arc<Runtime>> {
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..shards).map(|_| mpsc::unbounded_channel()).unzip();
        let rt = Arc::new(Runtime {
            shards: txs,
            next_shard: std::sync::atomic::AtomicUsize::new(0),
            next_conn: std::sync::atomic::AtomicU64::new(1),
            removal: Arc::default(),
        });
        let weak = Arc::downgrade(&rt);
        let removal = rt.removal.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("evchan-rt".into())
            .spawn(move || {
                let mut trimmer = trim::Trimmer::new();
                run(rxs, &weak, &ready_tx, &removal, &mut trimmer);
                removal::let_go(&removal);
                if let Some(t) = trimmer {
                    t.at_end();
                }
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

/// The runtime thread: opens everything, runs the shards in a scope, then closes everything.
fn run(
    rxs: Vec<mpsc::UnboundedReceiver<Cmd>>,
    rt: &Weak<Runtime>,
    ready: &std::sync::mpsc::Sender<Result<()>>,
    removal: &Arc<removal::Removal>,
    trimmer: &mut Option<trim::Trimmer>,
) {
    // Declaration order is the reverse of drop order: event channels last (their ids are gone
    // by then), PDs before their contexts (which the PDs hold too).
    let channels: Vec<EventChannel> = match (0..rxs.len()).map(|_| EventChannel::new()).collect() {
        Ok(c) => c,
        Err(e) => return drop(ready.send(Err(e.into()))),
    };
    let (names, pds) = match open_devices() {
        Ok(d) => d,
        Err(e) => return drop(ready.send(Err(e))),
    };
    if ready.send(Ok(())).is_err() {
        return;
    }
    let trims = trimmer.is_some();
    let (peer_txs, peer_rxs): (Vec<_>, Vec<_>) =
        (0..rxs.len()).map(|_| mpsc::unbounded_channel()).unzip();
    std::thread::scope(|scope| {
        let mut threads = Vec::new();
        for (k, (rx, peer_rx)) in rxs.into_iter().zip(peer_rxs).enumerate() {
            let env = shard::Env {
                index: k,
                channels: &channels,
                names: &names,
                pds: &pds,
                rt: rt.clone(),
                peers: peer_txs.clone(),
                removal: Arc::clone(removal),
            };
            let spawned = std::thread::Builder::new()
                .name(format!("evchan-shard-{k}"))
                .spawn_scoped(scope, move || {
                    shard::run(env, rx, peer_rx);
                    if trims {
                        trim::nudge_arena();
                    }
                });
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => tracing::error!("evchan: cannot start shard {k}: {e}"),
            }
        }
        drop(peer_txs);
        let contexts: Vec<&Context> = pds.iter().map(|pd| &**pd.context()).collect();
        removal::watch(&threads, &names, &contexts, rt, removal, trimmer);
    });
    removal.opened(&names);
    // Every connection's objects went with it (the shards released them all). Dropped now:
    // the PDs, then the contexts they held, then the event channels. After a device removal,
    // `Runtime::start`'s thread then waits for librdmacm to close its own context of the
    // device (`removal::let_go`).
    drop(pds);
}

/// librdmacm's context of every device it lists, by name, each with a PD on it.
fn open_devices() -> Result<(Vec<String>, Vec<OwnedPd>)> {
    let mut names = Vec::new();
    let mut pds = Vec::new();
    for ctx in Context::rdma_cm_devices()? {
        names.push(ctx.name());
        pds.push(OwnedPd::new(Arc::new(ctx))?);
    }
    Ok((names, pds))
}
