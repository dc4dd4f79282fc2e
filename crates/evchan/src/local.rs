//! A connection scoped to one future, with no shard: its event channel, id, QP, CQ and
//! memory are locals of the future that [`connect`] (or [`LocalListener::accept`]) returns,
//! and the application's closure posts and reaps on them from its own task.
//!
//! The [`Connection`](crate::Connection) API hands every message between the application's
//! task and a shard's task (or thread); here nothing is handed over: [`LocalConnection::send`]
//! posts from the caller's task and [`LocalConnection::recv`] polls the connection's own CQ.
//! The wire protocol is the same ([`proto`]: the handshake, credit flow control,
//! credit updates and the close message), so either side may be a `Connection` or a
//! [`Listener`](crate::Listener), or a plain librdmacm program (no flow control then, as with
//! `Connection`).
//!
//! ```no_run
//! use evchan::{local, Config};
//!
//! # async fn f() -> Result<(), evchan::Error> {
//! let addr = "169.254.77.1:7471".parse().unwrap();
//! // Server: one connection at a time, each echoed until the peer closes.
//! let server = local::listen(addr, Config::new(), async |listener| {
//!     listener
//!         .accept(b"", async |conn| {
//!             while let Some(msg) = conn.recv().await? {
//!                 conn.send(&msg).await?;
//!             }
//!             Ok::<_, evchan::Error>(())
//!         })
//!         .await
//! });
//! // Client (run it elsewhere, or in another task).
//! let reply = local::connect(addr, Config::new(), b"", async |conn| {
//!     conn.send(b"hello").await?;
//!     conn.recv().await
//! })
//! .await??;
//! assert_eq!(reply.as_deref(), Some(&b"hello"[..]));
//! # let _ = server;
//! # Ok(())
//! # }
//! ```
//!
//! # Trade-offs
//! - The connection cannot leave the closure: [`LocalConnection`] borrows the future's locals,
//!   so there is no `Send + 'static` handle to store or move to another task; one connection
//!   per call (one [`LocalListener::accept`] at a time per listener).
//! - Nothing reads the connection's rdma_cm events or completions while the closure does not
//!   await one of its methods: a `DISCONNECTED` is seen at the next `send`/`recv`. While one of
//!   them waits, it watches the CQ and the connection's event channel, so a `DISCONNECTED` or
//!   `DEVICE_REMOVAL` ends the wait with an error ([`Lost`]); it never waits for ever on a
//!   peer that disconnected. A peer that vanishes without a disconnect (a cut wire) is only
//!   noticed by a send's retries: there is **no keepalive** of this side's own (the peer's
//!   keepalives are accepted and confirmed).
//! - [`LocalConnection::recv`] **copies** a received message out of its registered slot into
//!   a new [`Bytes`] (an allocation and a memcpy of its length);
//!   [`LocalConnection::recv_with`] lends it where it lies to a closure instead. Either way
//!   the slot is posted again and its credit returned before the call returns, so a message
//!   cannot be kept without a copy.
//! - Waiting: with [`Config::busy_poll`]`(Some(window))` a wait polls the CQ, yielding to the
//!   runtime (`tokio::task::yield_now`) every 64 empty polls, for at least `window`; then (and without
//!   busy poll) it sleeps on the completion channel through the runtime's reactor
//!   (`evchan_core::verbs::AsyncWaiter`). [`Config::shards`],
//!   [`Config::in_task`], [`Config::cq_entries`], [`Config::backlog`] (but for the listen
//!   backlog) and [`Config::keepalive`] do not apply.
//! - Cancel safety: `send` and `recv` await only while waiting for completions or events,
//!   and every completion found is kept in the connection's state before they await again. A
//!   `recv` dropped before it returns loses no message (the next `recv` returns it); a `send`
//!   dropped before it returns sent nothing (it posts, and returns, without awaiting after).
//!   [`LocalListener::accept`] dropped while it waits for a request loses none (the next
//!   `accept` takes it); dropped once it took one, that connection is torn down (its peer
//!   sees it fail) — as are [`connect`]'s and [`listen`]'s objects when their futures are
//!   dropped, which always releases what they made.
//! - A protocol violation or a failed work request ends the connection ([`Lost`]); every later
//!   `send`/`recv` returns the same error. The disconnect itself is done once the closure
//!   returns.
//! - Device removal: a sleeping wait of `send`/`recv` also looks every 50 ms whether the
//!   connection's device still has its verbs device node (`/sys/class/infiniband_verbs`):
//!   rdma_cm sends `DEVICE_REMOVAL` only once the device's verbs users let go of it, so the
//!   node's going is the first sign. Either ends the wait with [`Lost::DeviceRemoved`]. A
//!   waiting [`LocalListener::accept`] looks the same way at every device that had a verbs
//!   node when [`listen`] began (the removal of any of them, even one the listener does not
//!   use, ends it, and every later one, with that error). Once its objects are gone, the
//!   future of [`connect`] (or of [`listen`], for the listener and its connections) lists
//!   librdmacm's devices until the removed one is gone from the list, at most 20 s, before it
//!   returns: librdmacm closes its own context of a removed device only then, and a device
//!   that cannot disassociate user contexts (soft-RoCE) is only unregistered once it is
//!   closed. A removal during the connection's setup is an error of the setup, without that
//!   wait.
//! - Close: when the closure returns, the connection sends its `FIN` after everything it sent
//!   and waits for its completion (for a plain librdmacm peer, for every send's), then
//!   disconnects and waits for `DISCONNECTED`; each wait at most 15 s and 2 s. Then every
//!   object goes, in the order librdmacm needs (QP with the id, then the memory regions, the
//!   CQ, the completion channel, the PD, the event channel).
//!
//! # Panics
//! The futures of [`connect`] and [`listen`] register descriptors with the current tokio
//! runtime: they must run in one with I/O and time enabled (as tokio's `AsyncFd`).

use std::collections::VecDeque;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;

use evchan_core::cm::state::{
    CanCreateQp, Connected, Connecting, Listening, Requested, RouteResolved,
};
use evchan_core::cm::{ConnParam, EventKind, PortSpace};
use evchan_core::verbs::{
    AsyncWaiter, CompChannel, Cq, Mr, Pd, PostedSlot, Slot, SlotPool, WcStatus, WorkCompletion,
};
use evchan_core::{CmEvent, CmId, EventChannel, Readable};

use crate::cm_map;
use crate::config::Config;
use crate::connection::{check_private_data, MAX_ACCEPT_PRIVATE_DATA, MAX_CONNECT_PRIVATE_DATA};
use crate::error::{Error, Lost, Result, Step};
use crate::proto::{self, Credits, Kind, Peer};
use crate::runtime::removal;

/// Busy poll: empty polls between two yields to the runtime.
const SPINS_PER_YIELD: u32 = 64;
/// The close's wait for the `FIN`'s (or the sends') completion.
const FIN_TIMEOUT: Duration = Duration::from_secs(15);
/// The close's wait for `DISCONNECTED` after `rdma_disconnect`.
const DISCONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The reject's private data for a request with a malformed handshake (as the shard's).
const BAD_HANDSHAKE: &[u8] = b"evchan: bad handshake";

/// Connects to `addr` with `private_data` (at most
/// [`MAX_CONNECT_PRIVATE_DATA`] bytes), runs `f` with the
/// connection, then closes it (see the [module](self)'s trade-offs) and returns what `f`
/// returned.
///
/// # Errors
/// Those of [`Connection::connect`](crate::Connection::connect) before `f` runs:
/// [`Error::Rejected`] (reason 8 when nobody listens), [`Error::TimedOut`],
/// [`Error::Resolve`], [`Error::Unreachable`], [`Error::Connect`], [`Error::Handshake`],
/// [`Error::PrivateDataTooLong`], [`Error::Config`], [`Error::NoDevice`] and the verbs' errors.
/// Once `f` ran, the result is `Ok` (the close's failures are not errors of `f`'s work: a
/// connection whose close did not finish is torn down all the same).
pub async fn connect<R>(
    addr: SocketAddr,
    config: Config,
    private_data: &[u8],
    f: impl AsyncFnOnce(&mut LocalConnection<'_>) -> R,
) -> Result<R> {
    config.validate()?;
    check_private_data(private_data, MAX_CONNECT_PRIVATE_DATA)?;
    let ch = EventChannel::new()?;
    let cm = ch.readable()?;
    let id = CmId::new(&ch, PortSpace::Tcp)?
        .resolve_addr(None, addr, config.addr_timeout)
        .map_err(|e| cm_map::resolve_failed(Step::Address, e.error))?;
    let deadline = Instant::now() + config.addr_timeout + Duration::from_secs(1);
    let ev = next_step(&ch, &cm, deadline, Step::Address, EventKind::AddrResolved).await?;
    let id = id.addr_resolved(&ev).map_err(|e| Error::from(e.error))?;
    drop(ev);
    let id = id
        .resolve_route(config.route_timeout)
        .map_err(|e| cm_map::resolve_failed(Step::Route, e.error))?;
    let deadline = Instant::now() + config.route_timeout + Duration::from_secs(1);
    let ev = next_step(&ch, &cm, deadline, Step::Route, EventKind::RouteResolved).await?;
    let id = id.route_resolved(&ev).map_err(|e| Error::from(e.error))?;
    drop(ev);
    let (out, removed) = run(&ch, &cm, id, &config, private_data, None, f).await?;
    drop(cm);
    drop(ch);
    if let Some(device) = removed {
        let_go(&[device]).await;
    }
    Ok(out)
}

/// Listens on `addr` (port 0: any free port, see [`LocalListener::local_addr`]) and runs `f`
/// with the listener; the listening id goes when `f` returns. Requests wait in the listen
/// backlog ([`Config::backlog`]) until [`LocalListener::accept`] takes them.
///
/// # Errors
/// [`Error::Config`], [`Error::NoDevice`], and `rdma_bind_addr` / `rdma_listen`'s errors
/// ([`Error::Core`]).
pub async fn listen<R>(
    addr: SocketAddr,
    config: Config,
    f: impl AsyncFnOnce(&mut LocalListener<'_>) -> R,
) -> Result<R> {
    config.validate()?;
    let ch = EventChannel::new()?;
    let cm = ch.readable()?;
    let backlog = i32::try_from(config.backlog).unwrap_or(i32::MAX);
    let id = CmId::new(&ch, PortSpace::Tcp)?
        .bind(addr)
        .map_err(|e| Error::from(e.error))?
        .listen(backlog)
        .map_err(|e| Error::from(e.error))?;
    // A listening id has no device of its own to name: a waiting accept watches every device
    // that has a verbs node now (read from sysfs: librdmacm's own listing would open every
    // device's context).
    let listed = removal::verbs_devices().unwrap_or_default();
    let mut listener = LocalListener {
        ch: &ch,
        cm: &cm,
        id: &id,
        config,
        listed,
        device: None,
        removed: false,
    };
    let out = f(&mut listener).await;
    let (listed, device, removed) = (
        std::mem::take(&mut listener.listed),
        listener.device.take(),
        listener.removed,
    );
    drop(listener);
    drop(id);
    drop(cm);
    drop(ch);
    if removed {
        let_go(&device.map_or(listed, |d| vec![d])).await;
    }
    Ok(out)
}

/// A listening id of [`listen`], lent to its closure.
#[derive(Debug)]
pub struct LocalListener<'a> {
    ch: &'a EventChannel,
    cm: &'a Readable<'a>,
    id: &'a CmId<'a, Listening>,
    config: Config,
    /// The devices with a verbs node when it began to listen (watched while `accept` waits).
    listed: Vec<String>,
    /// The device of the listener's connections, once one of them saw it removed.
    device: Option<String>,
    /// A `DEVICE_REMOVAL` came, to the listener or to one of its connections.
    removed: bool,
}

impl LocalListener<'_> {
    /// The address the listener is bound to (with the port chosen when it was 0).
    #[must_use]
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.local_addr()
    }

    /// Waits for the next connection request, accepts it with `private_data` (at most
    /// [`MAX_ACCEPT_PRIVATE_DATA`] bytes), runs `g` with the
    /// connection, closes it and returns what `g` returned. The request's id moves to an event
    /// channel of its own, and its verbs objects are locals of this future; requests that come
    /// meanwhile wait in the backlog for the next call.
    ///
    /// A request whose handshake is malformed is rejected (private data
    /// `evchan: bad handshake`, as a [`Listener`](crate::Listener) does) and the wait goes on.
    ///
    /// # Errors
    /// [`Error::PrivateDataTooLong`] before waiting; once a request was taken:
    /// [`Error::TimedOut`] (no `ESTABLISHED` within [`Config::connect_timeout`]),
    /// [`Error::ConnectionLost`], and the verbs' errors. The listener stays usable.
    pub async fn accept<R>(
        &mut self,
        private_data: &[u8],
        g: impl AsyncFnOnce(&mut LocalConnection<'_>) -> R,
    ) -> Result<R> {
        check_private_data(private_data, MAX_ACCEPT_PRIVATE_DATA)?;
        loop {
            if self.removed {
                return Err(Error::ConnectionLost(Lost::DeviceRemoved));
            }
            let next = tokio::select! {
                ev = next_event(self.ch, self.cm, None) => Some(ev?),
                () = tokio::time::sleep(removal::WATCH_INTERVAL) => None,
            };
            let Some(mut ev) = next else {
                // rdma_cm tells a removal only once the device's verbs users let go of it.
                self.removed = removal::node_gone(&self.listed).is_some();
                continue;
            };
            match ev.kind() {
                EventKind::ConnectRequest => {}
                EventKind::DeviceRemoval => {
                    self.removed = true;
                    continue;
                }
                _ => continue,
            }
            let Some(req) = ev.take_request() else {
                continue;
            };
            let decoded = proto::decode(ev.private_data());
            // Acked before the migrate, which waits for the acks of the id's events.
            drop(ev);
            let peer = match decoded {
                Ok(peer) => peer,
                Err(e) => {
                    tracing::debug!("request with a bad handshake rejected: {e}");
                    let _ = req.reject(BAD_HANDSHAKE);
                    continue;
                }
            };
            let ch = EventChannel::new()?;
            let cm = ch.readable()?;
            let id = req.migrate(&ch).map_err(|e| Error::from(e.error))?;
            let (out, removed) =
                run(&ch, &cm, id, &self.config, private_data, Some(peer), g).await?;
            if let Some(device) = removed {
                self.removed = true;
                self.device.get_or_insert(device);
            }
            return Ok(out);
        }
    }
}

/// The id states a connection's QP is made in, and how each starts the connection.
trait Start: CanCreateQp {
    fn start<'ch>(id: CmId<'ch, Self>, param: &ConnParam<'_>) -> Result<CmId<'ch, Connecting>>;
}

impl Start for RouteResolved {
    fn start<'ch>(id: CmId<'ch, Self>, param: &ConnParam<'_>) -> Result<CmId<'ch, Connecting>> {
        id.connect(param).map_err(|e| e.error.into())
    }
}

impl Start for Requested {
    fn start<'ch>(id: CmId<'ch, Self>, param: &ConnParam<'_>) -> Result<CmId<'ch, Connecting>> {
        id.accept(param).map_err(|e| e.error.into())
    }
}

/// Makes the connection's verbs objects as locals, its QP, posts its receives, connects or
/// accepts, waits for `ESTABLISHED`, runs `f` and closes: `f`'s result, and the device's name
/// when the connection saw it removed (`DEVICE_REMOVAL`). `request` is the peer's handshake
/// from its `CONNECT_REQUEST` (accepting side); the connecting side reads it from
/// `ESTABLISHED`.
async fn run<S: Start, R>(
    ch: &EventChannel,
    cm: &Readable<'_>,
    id: CmId<'_, S>,
    config: &Config,
    private_data: &[u8],
    request: Option<Peer>,
    f: impl AsyncFnOnce(&mut LocalConnection<'_>) -> R,
) -> Result<(R, Option<String>)> {
    let ctx = id.context()?;
    let pd = Pd::new(&ctx)?;
    let comp = CompChannel::new(&ctx)?;
    let cq = Cq::new(&comp, config.cq_cost())?;
    let waiter = comp.async_waiter()?;
    let cm_map::Pools {
        recv_mr,
        recv_slots,
        send_mr,
        free_data,
        free_ctrl,
    } = config.pools(|pool| Ok(pd.reg_mr(pool)?))?;
    let mine = config.handshake();
    // Rebound after the objects its QP borrows, so that it goes before them.
    let mut id = id;
    id.create_qp_with(&pd, &cq, &cq, &config.qp_init())?;
    let mut posted_recv = VecDeque::with_capacity(recv_slots.len());
    let posted_send = VecDeque::with_capacity(free_data.len() + free_ctrl.len());
    for slot in recv_slots {
        let p = id
            .post_recv_slot(&recv_mr, slot)
            .map_err(|e| Error::Verbs(e.error))?;
        posted_recv.push_back(p);
    }
    let wire = mine.encode(private_data);
    let deadline = Instant::now() + config.connect_timeout;
    let id = S::start(id, &cm_map::conn_param(&wire, config.retry_count))?;
    let ev = next_step(ch, cm, deadline, Step::Connect, EventKind::Established).await?;
    let peer = match request {
        Some(peer) => peer,
        None => proto::decode(ev.private_data())?,
    };
    let id = id.established(&ev).map_err(|e| Error::from(e.error))?;
    drop(ev);
    let (credits, max_send, peer_private_data) = match peer {
        Peer::Evchan(hs, user) => (
            Some(Credits::new(mine, hs)),
            config.max_message.min(hs.max_message),
            user,
        ),
        Peer::Plain(data) => (None, config.max_message, data),
    };
    let mut conn = LocalConnection {
        id,
        ch,
        cm,
        cq: &cq,
        waiter: &waiter,
        recv_mr: &recv_mr,
        send_mr: &send_mr,
        busy_poll: config.busy_poll,
        posted_recv,
        posted_send,
        free_data,
        free_ctrl,
        received: VecDeque::new(),
        credits,
        max_send: max_send as usize,
        max_recv: config.max_message,
        peer_private_data,
        sends_in_flight: 0,
        fin_wr: None,
        disconnected: false,
        lost: None,
        wcs: Vec::new(),
        device: ctx.name(),
        watch: Box::pin(tokio::time::sleep(removal::WATCH_INTERVAL)),
    };
    let out = f(&mut conn).await;
    let device = conn.device.clone();
    let removed = conn.close().await.then_some(device);
    Ok((out, removed))
}

/// What ended a sleeping wait.
enum Woke<C, G> {
    Comp(C),
    Cm(G),
    Watch,
}

/// What a posted work request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wr {
    Recv,
    Data,
    Ctrl,
}

/// A connection of [`connect`] or [`LocalListener::accept`], lent to their closure: it
/// borrows the future's locals (see the [module](self)'s trade-offs).
///
/// It cannot leave the closure:
///
/// ```compile_fail
/// # async fn f() -> Result<(), evchan::Error> {
/// let addr = "169.254.77.1:7471".parse().unwrap();
/// let mut kept = None;
/// evchan::local::connect(addr, evchan::Config::new(), b"", async |conn| {
///     kept = Some(conn); // error: borrowed data escapes the closure
/// })
/// .await?;
/// # Ok(())
/// # }
/// ```
///
/// Nor trade places with another one, whose objects live in another future (each connection's
/// lifetime is its own):
///
/// ```compile_fail
/// # async fn f() -> Result<(), evchan::Error> {
/// use evchan::{local, Config};
/// let addr = "169.254.77.1:7471".parse().unwrap();
/// local::connect(addr, Config::new(), b"", async |outer| {
///     local::connect(addr, Config::new(), b"", async |inner| {
///         std::mem::swap(outer, inner); // error: lifetime may not live long enough
///     })
///     .await
/// })
/// .await??;
/// # Ok(())
/// # }
/// ```
pub struct LocalConnection<'a> {
    id: CmId<'a, Connected>,
    ch: &'a EventChannel,
    cm: &'a Readable<'a>,
    cq: &'a Cq<'a>,
    waiter: &'a AsyncWaiter<'a, 'a>,
    recv_mr: &'a Mr<'a, SlotPool>,
    send_mr: &'a Mr<'a, SlotPool>,
    busy_poll: Option<Duration>,
    /// The posted receives and sends, each in the order posted: an RC QP completes each queue's
    /// work requests in that order, so a completion is its queue's first.
    posted_recv: VecDeque<PostedSlot>,
    posted_send: VecDeque<(PostedSlot, Wr)>,
    free_data: Vec<Slot>,
    free_ctrl: Vec<Slot>,
    /// Data messages received, not yet returned by `recv`.
    received: VecDeque<Slot>,
    /// `None` with a plain librdmacm peer.
    credits: Option<Credits>,
    max_send: usize,
    max_recv: u32,
    peer_private_data: Vec<u8>,
    sends_in_flight: usize,
    fin_wr: Option<u64>,
    /// `DISCONNECTED` (or `DEVICE_REMOVAL`) came.
    disconnected: bool,
    lost: Option<Lost>,
    wcs: Vec<WorkCompletion>,
    /// The connection's device, and the timer of the look at its verbs node while a wait
    /// sleeps: rdma_cm tells a removal only once the device's verbs users let go of it.
    device: String,
    watch: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl std::fmt::Debug for LocalConnection<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalConnection")
            .field("local_addr", &self.id.local_addr())
            .field("peer_addr", &self.id.peer_addr())
            .field("credits", &self.credits)
            .field("received", &self.received.len())
            .field("disconnected", &self.disconnected)
            .field("lost", &self.lost)
            .finish_non_exhaustive()
    }
}

impl LocalConnection<'_> {
    /// The private data the peer sent with its connect or accept (for a plain librdmacm
    /// peer, all of it, with RoCE's zero padding).
    #[must_use]
    pub fn peer_private_data(&self) -> &[u8] {
        &self.peer_private_data
    }

    /// The largest message [`send`](Self::send) takes (the smaller of this side's and the
    /// peer's maximum).
    #[must_use]
    pub fn max_message_size(&self) -> usize {
        self.max_send
    }

    /// Whether the peer speaks evchan's protocol (flow control, close message); `false` for
    /// a plain librdmacm program.
    #[must_use]
    pub fn is_evchan_peer(&self) -> bool {
        self.credits.is_some()
    }

    /// This side's address.
    #[must_use]
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.local_addr()
    }

    /// The peer's address.
    #[must_use]
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.id.peer_addr()
    }

    /// Posts `data` as one message, from this task: waits (reaping completions meanwhile) for
    /// a data credit of the peer and a free send slot, copies `data` into the slot and posts
    /// it. Returns once it is posted, not delivered. Cancel-safe: dropped before it returns,
    /// it sent nothing.
    ///
    /// # Errors
    /// [`Error::MessageTooLarge`] above [`max_message_size`](Self::max_message_size) (nothing
    /// is sent); [`Error::ConnectionLost`] once the connection ended ([`Lost::Disconnected`]
    /// when the peer disconnected, [`Error::PeerClosed`] when it had closed cleanly first).
    pub async fn send(&mut self, data: &[u8]) -> Result<()> {
        if data.len() > self.max_send {
            return Err(Error::MessageTooLarge {
                len: data.len(),
                max: self.max_send,
            });
        }
        loop {
            if let Some(why) = &self.lost {
                return Err(Error::ConnectionLost(why.clone()));
            }
            if self.disconnected {
                return Err(
                    if self.credits.as_ref().is_some_and(Credits::fin_received) {
                        Error::PeerClosed
                    } else {
                        Error::ConnectionLost(Lost::Disconnected)
                    },
                );
            }
            let credit = self.credits.as_ref().is_none_or(Credits::can_send_data);
            if credit && !self.free_data.is_empty() {
                let saved = self.credits.clone();
                let imm = self.credits.as_mut().and_then(Credits::send_data);
                let mut slot = self.free_data.pop().expect("checked");
                slot.copy_from(data)?;
                if self.post_send(slot, imm, Wr::Data).is_some() {
                    self.sends_in_flight += 1;
                    return Ok(());
                }
                // Not posted: the credit is not used (a failed post lost the connection, which
                // the loop's next turn reports).
                self.credits = saved;
                if self.lost.is_some() {
                    continue;
                }
            }
            self.wait().await?;
        }
    }

    /// The next message, copied out of its registered slot into a new [`Bytes`] (whose receive
    /// is posted again and whose credit goes back to the peer before this returns): as
    /// [`recv_with`](Self::recv_with)`(Bytes::copy_from_slice)`. `None` once the peer closed
    /// (its `FIN`; for a plain librdmacm peer, its disconnect) and every message before it was
    /// returned. Cancel-safe: dropped before it returns, it loses nothing.
    ///
    /// # Errors
    /// [`Error::ConnectionLost`]: the peer disconnected without closing
    /// ([`Lost::Disconnected`]), broke the protocol ([`Lost::Protocol`]), a work request
    /// failed, or the device was removed.
    pub async fn recv(&mut self) -> Result<Option<Bytes>> {
        self.recv_with(Bytes::copy_from_slice).await
    }

    /// The next message, lent to `f` where it lies, in its registered slot: no allocation and
    /// no copy but `f`'s own. `f` runs once, on the whole message; when it returns, the slot's
    /// receive is posted again and its credit goes back to the peer, and its result is
    /// returned. `None` (and `f` not run) once the peer closed, as [`recv`](Self::recv).
    /// Cancel-safe: dropped before it returns, it loses nothing (`f` runs in the call that
    /// returns); should `f` panic, the message stays first in line for the next receive.
    ///
    /// ```no_run
    /// # async fn f(conn: &mut evchan::local::LocalConnection<'_>) -> Result<(), evchan::Error> {
    /// // An echo that reuses one buffer.
    /// let mut buf = Vec::new();
    /// while let Some(()) = conn
    ///     .recv_with(|msg| {
    ///         buf.clear();
    ///         buf.extend_from_slice(msg);
    ///     })
    ///     .await?
    /// {
    ///     conn.send(&buf).await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// Those of [`recv`](Self::recv).
    pub async fn recv_with<T>(&mut self, f: impl FnOnce(&[u8]) -> T) -> Result<Option<T>> {
        loop {
            if let Some(slot) = self.received.front() {
                let out = f(slot.as_slice());
                let slot = self.received.pop_front().expect("checked");
                if self.repost(slot) {
                    if let Some(credits) = self.credits.as_mut() {
                        credits.consumed();
                    }
                    self.flush_ctrl();
                }
                return Ok(Some(out));
            }
            if self.credits.as_ref().is_some_and(Credits::fin_received) {
                return Ok(None);
            }
            if let Some(why) = &self.lost {
                return Err(Error::ConnectionLost(why.clone()));
            }
            if self.disconnected {
                // What the CQ still holds came before the disconnect.
                if self.poll_cq()? > 0 {
                    continue;
                }
                return match self.credits {
                    None => Ok(None),
                    Some(_) => Err(Error::ConnectionLost(Lost::Disconnected)),
                };
            }
            self.wait().await?;
        }
    }

    /// Waits until at least one completion or rdma_cm event was handled.
    async fn wait(&mut self) -> Result<()> {
        if let Some(window) = self.busy_poll {
            // The clock is read first after 1024 empty polls, then every 1024 (as the core
            // ping-pong's spin): a wait that finds its completion soon reads none.
            let mut start = None;
            let mut spins = 0u32;
            loop {
                if self.poll_cq()? > 0 {
                    return Ok(());
                }
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(SPINS_PER_YIELD) {
                    let cm = self.cm;
                    if let Poll::Ready(ready) = poll_fn(|cx| Poll::Ready(cm.poll_ready(cx))).await {
                        let mut guard = ready?;
                        self.read_cm_events()?;
                        guard.clear_ready();
                        return Ok(());
                    }
                    if spins.is_multiple_of(16 * SPINS_PER_YIELD)
                        && start.get_or_insert_with(Instant::now).elapsed() >= window
                    {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
            }
        }
        let mut wcs = std::mem::take(&mut self.wcs);
        let (waiter, cm, cqs) = (self.waiter, self.cm, [self.cq]);
        let woke = {
            let comp = waiter.wait(&cqs, |_, wc| wcs.push(wc));
            let watch = &mut self.watch;
            tokio::select! {
                biased;
                r = comp => Woke::Comp(r),
                g = cm.ready() => Woke::Cm(g),
                () = watch => Woke::Watch,
            }
        };
        match woke {
            Woke::Comp(n) => {
                n?;
                for wc in wcs.drain(..) {
                    self.on_wc(&wc);
                }
            }
            Woke::Cm(guard) => {
                let mut guard = guard?;
                self.read_cm_events()?;
                guard.clear_ready();
            }
            Woke::Watch => {
                let next = tokio::time::Instant::now() + removal::WATCH_INTERVAL;
                self.watch.as_mut().reset(next);
                if self.device_gone() {
                    self.removed();
                }
            }
        }
        self.wcs = wcs;
        Ok(())
    }

    /// Polls the CQ until it is empty; how many completions it had.
    fn poll_cq(&mut self) -> Result<usize> {
        let mut wcs = std::mem::take(&mut self.wcs);
        let mut total = 0;
        loop {
            let n = self.cq.poll(&mut wcs, 16)?;
            for wc in wcs.drain(..) {
                self.on_wc(&wc);
            }
            total += n;
            if n < 16 {
                break;
            }
        }
        self.wcs = wcs;
        Ok(total)
    }

    /// Reads the connection's rdma_cm events until none is left.
    fn read_cm_events(&mut self) -> Result<()> {
        while let Some(ev) = self.ch.try_get_event()? {
            match ev.kind() {
                // A peer that saw the device go first (one of this process, say) disconnects.
                EventKind::Disconnected if self.device_gone() => self.removed(),
                EventKind::Disconnected => self.disconnected = true,
                EventKind::DeviceRemoval => self.removed(),
                kind => tracing::debug!(%kind, "event ignored by a local connection"),
            }
        }
        Ok(())
    }

    /// Whether the connection's device lost its verbs node (see the module's device removal).
    fn device_gone(&self) -> bool {
        removal::node_gone(std::slice::from_ref(&self.device)).is_some()
    }

    /// The device was removed: the connection is gone with it.
    fn removed(&mut self) {
        self.disconnected = true;
        self.lose(Lost::DeviceRemoved);
    }

    fn lose(&mut self, why: Lost) {
        if self.lost.is_none() {
            tracing::debug!(%why, "local connection lost");
            self.lost = Some(why);
        }
    }

    /// The posted work request `wc` completes, out of its queue: the queue's first (anywhere
    /// in it all the same, should a completion ever come out of order); `None` for a
    /// completion of none of ours.
    fn take_posted(&mut self, wc: &WorkCompletion) -> Option<(PostedSlot, Wr)> {
        let wr_id = wc.wr_id();
        if self
            .posted_send
            .front()
            .is_some_and(|(p, _)| p.wr_id() == wr_id)
        {
            return self.posted_send.pop_front();
        }
        if self.posted_recv.front().is_some_and(|p| p.wr_id() == wr_id) {
            return self.posted_recv.pop_front().map(|p| (p, Wr::Recv));
        }
        if let Some(i) = self
            .posted_send
            .iter()
            .position(|(p, _)| p.wr_id() == wr_id)
        {
            return self.posted_send.remove(i);
        }
        let i = self.posted_recv.iter().position(|p| p.wr_id() == wr_id)?;
        self.posted_recv.remove(i).map(|p| (p, Wr::Recv))
    }

    fn on_wc(&mut self, wc: &WorkCompletion) {
        let Some((p, kind)) = self.take_posted(wc) else {
            return;
        };
        let Ok(slot) = p.complete(wc) else {
            return;
        };
        let ok = wc.is_success();
        match kind {
            Wr::Recv if ok => self.on_recv(slot, wc),
            Wr::Recv => {}
            Wr::Data => {
                self.sends_in_flight = self.sends_in_flight.saturating_sub(1);
                self.free_data.push(slot);
            }
            Wr::Ctrl => {
                if self.fin_wr == Some(wc.wr_id()) {
                    self.fin_wr = None;
                }
                self.free_ctrl.push(slot);
            }
        }
        if !ok && wc.status() != WcStatus::WrFlush {
            self.lose(cm_map::wc_failure(
                kind == Wr::Recv,
                wc.status(),
                self.max_recv,
            ));
        }
    }

    fn on_recv(&mut self, slot: Slot, wc: &WorkCompletion) {
        let kind = match self.credits.as_mut() {
            None => Ok(Kind::Data),
            Some(credits) => credits.on_receive(wc.imm_data(), wc.byte_len()),
        };
        match kind {
            Err(e) => self.lose(Lost::Protocol(e)),
            Ok(Kind::Data) => self.received.push_back(slot),
            // Credit updates and FIN: their receive goes back at once; a confirmation may be due.
            Ok(_) => {
                if self.repost(slot) {
                    self.flush_ctrl();
                }
            }
        }
    }

    /// Posts a receive again; `false` (and the connection lost) when it failed.
    fn repost(&mut self, slot: Slot) -> bool {
        if self.lost.is_some() {
            return false;
        }
        match self.id.post_recv_slot(self.recv_mr, slot) {
            Ok(p) => {
                self.posted_recv.push_back(p);
                true
            }
            Err(e) => {
                self.lose(Lost::Verbs(e.error.to_string()));
                false
            }
        }
    }

    /// Posts the credit updates that are due, from the control slots.
    fn flush_ctrl(&mut self) {
        while self.lost.is_none() && !self.free_ctrl.is_empty() {
            let Some(credits) = self.credits.as_mut() else {
                return;
            };
            let saved = credits.clone();
            let Some(imm) = credits.credit_update() else {
                return;
            };
            if self.post_ctrl(imm).is_none() {
                self.credits = Some(saved);
                return;
            }
        }
    }

    /// Posts a control message with immediate data `imm` from a free control slot (the caller
    /// checked there is one): its work request id, `None` as [`post_send`](Self::post_send).
    fn post_ctrl(&mut self, imm: u32) -> Option<u64> {
        let mut slot = self.free_ctrl.pop()?;
        let _ = slot.set_len(0);
        self.post_send(slot, Some(imm), Wr::Ctrl)
    }

    /// Posts `slot` (a data or control send slot, `kind`) with immediate data `imm`: its work
    /// request id; `None` when the send queue is full (the slot goes back to its free list) or
    /// the post failed (the connection is then lost).
    fn post_send(&mut self, slot: Slot, imm: Option<u32>, kind: Wr) -> Option<u64> {
        match self.id.post_send_slot(self.send_mr, slot, imm) {
            Ok(p) => {
                let wr_id = p.wr_id();
                self.posted_send.push_back((p, kind));
                Some(wr_id)
            }
            Err(e) if e.is_queue_full() => {
                match kind {
                    Wr::Ctrl => self.free_ctrl.push(e.slot),
                    _ => self.free_data.push(e.slot),
                }
                None
            }
            Err(e) => {
                self.lose(Lost::Verbs(e.error.to_string()));
                None
            }
        }
    }

    /// Sends the `FIN` after everything sent and waits for its completion (with a plain peer:
    /// for every send's).
    async fn finish(&mut self) -> Result<()> {
        loop {
            if self.lost.is_some() || self.disconnected {
                return Ok(());
            }
            match self.credits.as_mut() {
                None if self.sends_in_flight == 0 => return Ok(()),
                Some(credits) if credits.fin_sent() && self.fin_wr.is_none() => return Ok(()),
                Some(credits) if !credits.fin_sent() && !self.free_ctrl.is_empty() => {
                    let saved = credits.clone();
                    if let Some(imm) = credits.send_fin() {
                        match self.post_ctrl(imm) {
                            Some(wr_id) => {
                                self.fin_wr = Some(wr_id);
                                continue;
                            }
                            // The send queue is full: again after a completion.
                            None => self.credits = Some(saved),
                        }
                    }
                }
                _ => {}
            }
            self.wait().await?;
        }
    }

    /// The close: `FIN`, disconnect, `DISCONNECTED`, each bounded; then everything goes.
    /// Whether the device was removed (a `DEVICE_REMOVAL` came).
    async fn close(mut self) -> bool {
        match tokio::time::timeout(FIN_TIMEOUT, self.finish()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!("local connection's close: {e}"),
            Err(_) => tracing::debug!("local connection's close: no FIN completion in 15 s"),
        }
        let (ch, cm, disconnected) = (self.ch, self.cm, self.disconnected);
        let mut removed = self.lost == Some(Lost::DeviceRemoved);
        match self.id.disconnect() {
            Ok(id) => {
                if !disconnected {
                    let deadline = Instant::now() + DISCONNECT_TIMEOUT;
                    while let Ok(ev) = next_event(ch, cm, Some(deadline)).await {
                        match ev.kind() {
                            EventKind::Disconnected => break,
                            EventKind::DeviceRemoval => {
                                removed = true;
                                break;
                            }
                            _ => {}
                        }
                    }
                }
                drop(id);
            }
            Err(e) => tracing::debug!("rdma_disconnect: {}", e.error),
        }
        removed
    }
}

/// After a device removal, once everything of it here is dropped: lets librdmacm close its
/// context of the device, one of `removed` (the runtime's step 3 of a removal,
/// `runtime::removal`), without which soft-RoCE's `rdma link delete` waits for the process;
/// at most 20 s.
async fn let_go(removed: &[String]) {
    let start = Instant::now();
    while !removal::sweep(removed, start) {
        tokio::time::sleep(removal::SWEEP_PAUSE).await;
    }
}

/// The next rdma_cm event of `ch`, waiting through the reactor until `deadline`
/// ([`Error::TimedOut`] of [`Step::Connect`] after it).
async fn next_event<'c>(
    ch: &'c EventChannel,
    cm: &Readable<'_>,
    deadline: Option<Instant>,
) -> Result<CmEvent<'c>> {
    loop {
        if let Some(ev) = ch.try_get_event()? {
            return Ok(ev);
        }
        let ready = match deadline {
            Some(d) => tokio::time::timeout_at(d.into(), cm.ready())
                .await
                .map_err(|_| Error::TimedOut(Step::Connect))?,
            None => cm.ready().await,
        };
        let mut guard = ready?;
        if let Some(ev) = ch.try_get_event()? {
            return Ok(ev);
        }
        guard.clear_ready();
    }
}

/// Waits for `want`, the event that completes `step`, until `deadline`; a failure event of the
/// setup becomes the error the shard gives for it; other events are skipped.
async fn next_step<'c>(
    ch: &'c EventChannel,
    cm: &Readable<'_>,
    deadline: Instant,
    step: Step,
    want: EventKind,
) -> Result<CmEvent<'c>> {
    loop {
        let ev = next_event(ch, cm, Some(deadline))
            .await
            .map_err(|e| match e {
                Error::TimedOut(_) => Error::TimedOut(step),
                e => e,
            })?;
        let kind = ev.kind();
        if kind == want {
            return Ok(ev);
        }
        let status = ev.status();
        return Err(match kind {
            EventKind::AddrError => cm_map::status_error(Step::Address, status),
            EventKind::RouteError => cm_map::status_error(Step::Route, status),
            EventKind::Rejected => cm_map::rejected(&ev),
            EventKind::Unreachable => cm_map::unreachable(status),
            EventKind::ConnectError => Error::Connect(status.to_string()),
            EventKind::Disconnected => Error::ConnectionLost(Lost::Disconnected),
            EventKind::DeviceRemoval => Error::ConnectionLost(Lost::DeviceRemoved),
            kind => {
                tracing::debug!(%kind, "event ignored during a local connection's setup");
                continue;
            }
        });
    }
}
