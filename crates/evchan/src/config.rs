//! Connection settings.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::proto::handshake::{MAX_DATA_SLOTS, MIN_CTRL_SLOTS};

/// Settings of a [`Listener`](crate::Listener) or a connection made by
/// [`Connection::builder`](crate::Connection::builder).
///
/// ```
/// use std::time::Duration;
/// let config = evchan::Config::new()
///     .max_message(16 * 1024)
///     .recv_depth(32)
///     .connect_timeout(Duration::from_secs(5));
/// assert_eq!(config.max_message_size(), 16 * 1024);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub(crate) max_message: u32,
    pub(crate) recv_depth: u32,
    pub(crate) recv_initial: u32,
    pub(crate) send_depth: u32,
    pub(crate) ctrl_slots: u16,
    pub(crate) addr_timeout: Duration,
    pub(crate) route_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) shards: usize,
    pub(crate) backlog: u32,
    pub(crate) max_connections: u32,
    pub(crate) memory_budget: u64,
    pub(crate) busy_poll: Option<Duration>,
    pub(crate) keepalive: Option<Duration>,
    pub(crate) retry_count: u8,
}

impl Default for Config {
    fn default() -> Self {
        Self::new()
    }
}

/// The CPUs available to the process, asked the first time (a `Config` is often made per
/// connect; the answer costs system calls and file reads each time).
fn default_shards() -> usize {
    static SHARDS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SHARDS.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

impl Config {
    /// The defaults: 4 KiB messages, 16 receives and 16 sends in flight per connection, 2 s to
    /// resolve the address and the route each, 10 s to connect, a backlog of 128, no limit on
    /// a listener's connections (`max_connections`) nor on their memory (`memory_budget`), one
    /// event-channel shard per CPU available to the process when a `Config` was first made
    /// (`std::thread::available_parallelism`, asked once: it reads the affinity and the
    /// cgroup's CPU quota, about ten system calls), no busy poll, a keepalive after 15 s
    /// without a completion, 6 transport retries.
    #[must_use]
    pub fn new() -> Self {
        Self {
            max_message: 4096,
            recv_depth: 16,
            recv_initial: 1,
            send_depth: 16,
            ctrl_slots: 4,
            addr_timeout: Duration::from_secs(2),
            route_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(10),
            shards: default_shards(),
            backlog: 128,
            max_connections: u32::MAX,
            memory_budget: u64::MAX,
            busy_poll: None,
            keepalive: Some(Duration::from_secs(15)),
            retry_count: 6,
        }
    }

    /// The largest message this side receives (and sends), in bytes; each receive slot has
    /// this size. A `send` above the peer's maximum fails with
    /// [`Error::MessageTooLarge`](crate::Error::MessageTooLarge) before anything is sent.
    #[must_use]
    pub fn max_message(mut self, bytes: u32) -> Self {
        self.max_message = bytes;
        self
    }

    /// The largest message this side receives.
    #[must_use]
    pub fn max_message_size(&self) -> u32 {
        self.max_message
    }

    /// How many data messages the peer may have in flight toward this side or unread by the
    /// application at once: the most receive slots the connection posts for data (toward an
    /// evchan peer, its window of credits at its widest). The slots come from the pool that the
    /// shard's connections on the device share (per `max_message`, as the send slots).
    ///
    /// An evchan connection starts with [`recv_initial`](Self::recv_initial) of them posted,
    /// and widens its window (doubling it) each time the peer's data uses every credit the
    /// peer knew of; a connection that stays quiet keeps the few it started with. Toward a
    /// plain librdmacm peer, which has no credits of ours, all of them are posted once the
    /// connection is established.
    #[must_use]
    pub fn recv_depth(mut self, n: u32) -> Self {
        self.recv_depth = n;
        self
    }

    /// How many receive slots for data a connection posts before it connects: the peer's
    /// first credits (at most [`recv_depth`](Self::recv_depth)). Default 1, so that an idle
    /// connection holds little memory; a larger value spares a stream that starts at once the
    /// first round trips of its window's growth.
    ///
    /// ```
    /// let config = evchan::Config::new().recv_depth(64).recv_initial(16);
    /// # drop(config);
    /// ```
    #[must_use]
    pub fn recv_initial(mut self, n: u32) -> Self {
        self.recv_initial = n;
        self
    }

    /// How many of this side's messages may be in flight before `send` waits. Their send
    /// slots come from a pool that the shard's connections on the device share (per
    /// `max_message`), taken when a message is posted and kept as spares after its
    /// completion (so the pool's lock is not on every message's path), until the
    /// connection's next keepalive look gives them back (about every
    /// [`keepalive`](Self::keepalive) ÷ 2; with the keepalive off, or toward a plain
    /// librdmacm peer, at its release): an idle connection holds none.
    #[must_use]
    pub fn send_depth(mut self, n: u32) -> Self {
        self.send_depth = n;
        self
    }

    /// The timeout of address resolution.
    #[must_use]
    pub fn addr_timeout(mut self, t: Duration) -> Self {
        self.addr_timeout = t;
        self
    }

    /// The timeout of route resolution.
    #[must_use]
    pub fn route_timeout(mut self, t: Duration) -> Self {
        self.route_timeout = t;
        self
    }

    /// The timeout from `rdma_connect` (or `rdma_accept`) to `ESTABLISHED`. On a listener it
    /// also bounds how long a request may wait for the application's answer: unanswered for
    /// this long, it is rejected (its [`Incoming`](crate::Incoming)'s `accept` then fails).
    #[must_use]
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// How many event channels, each with a thread of its own, spread the connections'
    /// rdma_cm events (connects, accepts, disconnects, keepalive checks); at least 1. Their
    /// messages do not pass through them. Listeners and connections with the same number
    /// share them.
    #[must_use]
    pub fn shards(mut self, n: usize) -> Self {
        self.shards = n;
        self
    }

    /// How many half-open connections a listener keeps: requests waiting for
    /// [`Listener::accept`](crate::Listener::accept) or for the application's answer, plus
    /// accepted ones waiting for `ESTABLISHED`. A request beyond them is rejected at once
    /// (reason 28, consumer reject). A request unanswered for
    /// [`connect_timeout`](Self::connect_timeout) is rejected, and an accepted one not
    /// established within `connect_timeout` of the accept is destroyed: at most `backlog` QPs
    /// with their receive slots (made at the accept) are ever spent on peers that do
    /// not complete their side, each for at most `connect_timeout`.
    #[must_use]
    pub fn backlog(mut self, n: u32) -> Self {
        self.backlog = n;
        self
    }

    /// A listener's admission control: at most `n` of its connections at a time, from the
    /// request until the connection is released (closed, lost or dropped, and its QP
    /// destroyed). A request beyond them is rejected at once and the client's `connect` fails
    /// with [`Error::Rejected`](crate::Error::Rejected) whose `busy` is
    /// [`Busy::Connections`](crate::Busy::Connections); the listener and its connections carry
    /// on, and a `tracing` warning says the limit was reached (once, until a request is
    /// admitted again). For a plain librdmacm client the reject's private data is the ASCII
    /// text `evchan-busy:connections` (see [`Busy`](crate::Busy)). Default: no limit. Only a
    /// listener's `Config` reads it. A connection whose peer died silently holds its place
    /// until the loss is noticed: by the [`keepalive`](Self::keepalive), or by the next send.
    ///
    /// ```
    /// let config = evchan::Config::new().max_connections(1_000);
    /// # drop(config);
    /// ```
    #[must_use]
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// A listener's memory budget: the slots its connections hold (registered buffers of
    /// `max_message` bytes, for their receives and sends) count against `bytes` as they are
    /// taken and given back. A request is admitted when the budget has room for
    /// [`admission_bytes`](Self::admission_bytes), what a connection needs to move at all, and
    /// rejected at once otherwise, as beyond [`max_connections`](Self::max_connections),
    /// with [`Busy::Memory`](crate::Busy::Memory) (`evchan-busy:memory` on the wire) and a
    /// `tracing` warning; the listener and its connections carry on. Default: no budget. Only
    /// a listener's `Config` reads it; a budget below one connection's
    /// [`admission_bytes`](Self::admission_bytes) is a [`Error::Config`](crate::Error::Config).
    ///
    /// An admitted connection takes a slot beyond those when the budget has room for it:
    /// otherwise a receive is not posted (its peer gets no credit for it, and waits), and a
    /// message or one-sided operation waits for one of the connection's own in flight to give
    /// its slot back. Where waiting could be for ever a slot is taken beyond the budget: a
    /// connection keeps its first receives (`recv_initial` + `ctrl_slots`) posted, so the
    /// received messages its application has not read or still holds (each is its receive
    /// slot) are bounded by the credits ([`recv_depth`](Self::recv_depth)), not the budget; a
    /// message goes when none of the connection's is in flight from a slot; control messages
    /// (at most `ctrl_slots` in flight) go. With those alone a connection may hold up to
    /// `recv_depth` + 2 × `ctrl_slots` + 1 slots (25 with the defaults, against its admission
    /// of 10), and the count may exceed `bytes` by that; while it does, connections holding
    /// more than their admission give slots back as they are done with them. Toward a plain
    /// librdmacm peer, which has no credits to wait for, every receive is posted. A
    /// connection keeps the slots it took as spares for its next messages until its
    /// keepalive's next look (toward a plain peer or with [`keepalive`](Self::keepalive) off,
    /// until it is released), and they count. A connection's slots stop counting when it is
    /// released (a received message the application still holds is its own from then on).
    ///
    /// What it bounds is the registered memory evchan maps for the connections, the bulk of a
    /// connection's cost with the defaults; beyond it, a shard's pool maps its slots in
    /// chunks of up to 256 KiB, so the pools may hold up to about one chunk per shard, device
    /// and message size more than their connections' share, and more when the receives that
    /// connections keep posted hold slots of chunks a burst emptied otherwise (and,
    /// for about a second after a burst, the chunks it emptied); not the rest of the process
    /// (the QP's and CQ's queues, which the provider maps, and evchan's bookkeeping).
    ///
    /// ```
    /// let config = evchan::Config::new();
    /// // The defaults: a connection is admitted for 10 slots of 4 KiB, and may hold up to
    /// // 20 receive and 20 send slots.
    /// assert_eq!(config.admission_bytes(), 40 * 1024);
    /// # #[cfg(target_arch = "x86_64")]
    /// assert_eq!(config.buffer_bytes(), 160 * 1024);
    /// // 400 MiB for the connections' buffers: 10,000 connections of this configuration
    /// // at first, and as many as the slots they hold leave room for.
    /// let config = config.clone().memory_budget(400 << 20);
    /// # drop(config);
    /// ```
    #[must_use]
    pub fn memory_budget(mut self, bytes: u64) -> Self {
        self.memory_budget = bytes;
        self
    }

    /// The buffer memory one connection of this configuration may hold at most: the receive
    /// slots it may have posted or unread at once (`recv_depth` + `ctrl_slots`) and the send
    /// slots it may have in flight at once (`send_depth` + `ctrl_slots`), all from its
    /// shard's pool, each of `max_message` bytes, each set rounded up to whole pages (a
    /// connection quiet since its start holds far less: [`recv_initial`](Self::recv_initial)
    /// + `ctrl_slots` receive slots; see [`admission_bytes`](Self::admission_bytes)).
    #[must_use]
    pub fn buffer_bytes(&self) -> u64 {
        let ctrl = u32::from(self.ctrl_slots);
        let size = self.max_message as usize;
        [self.recv_depth, self.send_depth]
            .into_iter()
            .map(|n| {
                let n = (n as usize).saturating_add(ctrl as usize);
                evchan_core::verbs::SlotPool::mapped_bytes(n, size).map_or(u64::MAX, |b| b as u64)
            })
            .fold(0u64, u64::saturating_add)
    }

    /// What [`memory_budget`](Self::memory_budget) counts for a connection from its request:
    /// the slots it needs to move at all, each of `max_message` bytes (it holds the receives
    /// at first) —
    /// its first receives ([`recv_initial`](Self::recv_initial) + `ctrl_slots`), one data
    /// send and `ctrl_slots` control sends. A connection holding more slots counts each one
    /// more (at most [`buffer_bytes`](Self::buffer_bytes) in all, but for the pages' rounding).
    ///
    /// ```
    /// let config = evchan::Config::new();
    /// // The defaults: 1 + 4 receives, 1 + 4 sends, of 4 KiB.
    /// assert_eq!(config.admission_bytes(), 10 * 4096);
    /// ```
    #[must_use]
    pub fn admission_bytes(&self) -> u64 {
        u64::from(self.admission_slots()).saturating_mul(u64::from(self.max_message))
    }

    /// The slots [`admission_bytes`](Self::admission_bytes) counts.
    pub(crate) fn admission_slots(&self) -> u32 {
        self.first_recvs()
            .saturating_add(1)
            .saturating_add(u32::from(self.ctrl_slots))
    }

    /// Busy-poll: a `recv` that finds nothing, and a `send` that finds no credit or send slot
    /// free (the first in line, when several wait), polls the connection's completion queue
    /// without sleeping for up to `window` from its first poll (like rsocket's polling
    /// window), yielding to the tokio runtime after every 64 polls that found nothing (as
    /// `tokio::task::yield_now` does; a future polled by another executor is woken at once
    /// instead), before it arms the queue and sleeps on its completion channel. The window is
    /// the future's: a dropped `recv` or `send` takes its window with it. (A
    /// [`Stream`](crate::Stream) read or write, which has no future, starts a new window when
    /// polled after more than `window`.)
    /// Off by default: it trades the CPU of the waiting task's thread for latency. Per
    /// connection (a listener's setting is its connections').
    #[must_use]
    pub fn busy_poll(mut self, window: Option<Duration>) -> Self {
        self.busy_poll = window;
        self
    }

    /// Liveness of an idle connection: at most `idle` after its last completion (a message
    /// sent, acknowledged or received), and not before half of it, this side sends a
    /// keepalive, a control message without payload (a credit update that returns nothing)
    /// that the peer's RDMA device acknowledges. A peer that died, or a cut wire, makes that
    /// send fail once the reliable connection's retries are spent, and the connection ends with
    /// [`Lost::WorkCompletion`](crate::Lost::WorkCompletion): pending `recv`, `send` and
    /// `close` return. Without it, a connection with nothing in flight never learns that its
    /// peer is gone. Only toward evchan peers (a plain librdmacm peer would read it as data);
    /// sent only while a control credit is free besides the one kept for confirmations.
    /// `None` turns it off; default 15 s. The bound from the fault to the error is in
    /// `docs/RELIABILITY.md`: about `idle` plus the transport's retries.
    #[must_use]
    pub fn keepalive(mut self, idle: Option<Duration>) -> Self {
        self.keepalive = idle;
        self
    }

    /// The reliable connection's `retry_count` (0–6): how often an unacknowledged send is
    /// sent again, each after the QP's local ACK timeout, before it fails with
    /// `RETRY_EXC_ERR`. Together with that timeout (set by rdma_cm from the path; on RoCE from
    /// its fixed packet lifetime) it bounds how long a dead peer or a cut wire goes unnoticed
    /// while something is in flight. The IB CM carries the connecting side's value in its
    /// request, and both QPs use it: for an accepted connection the peer's setting counts.
    /// Default 6; 7, librdmacm's default, is refused: soft-RoCE (`rdma_rxe`) reads it as
    /// "retry forever", so nothing would ever fail.
    #[must_use]
    pub fn retry_count(mut self, n: u8) -> Self {
        self.retry_count = n;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::Config(m.to_owned()));
        if self.max_message == 0 {
            return bad("max_message must be at least 1");
        }
        if !(1..=MAX_DATA_SLOTS).contains(&self.recv_depth) {
            return bad("recv_depth must be within 1..=8192");
        }
        if self.recv_initial == 0 {
            return bad("recv_initial must be at least 1");
        }
        if !(1..=MAX_DATA_SLOTS).contains(&self.send_depth) {
            return bad("send_depth must be within 1..=8192");
        }
        if self.ctrl_slots < MIN_CTRL_SLOTS {
            return bad("ctrl_slots must be at least 3");
        }
        if self.shards == 0 {
            return bad("shards must be at least 1");
        }
        if self.backlog == 0 {
            return bad("backlog must be at least 1");
        }
        if self.max_connections == 0 {
            return bad("max_connections must be at least 1");
        }
        if self.memory_budget < self.admission_bytes() {
            return bad("memory_budget must hold at least one connection's admission_bytes");
        }
        if self.retry_count > 6 {
            return bad("retry_count must be within 0..=6 (rdma_rxe retries 7 forever)");
        }
        if self.keepalive.is_some_and(|k| k.is_zero()) {
            return bad("keepalive must be above zero (None turns it off)");
        }
        Ok(())
    }

    /// The entries of a connection's CQ: every work request it may have posted.
    pub(crate) fn cq_cost(&self) -> u32 {
        self.recv_depth + self.send_depth + 2 * u32::from(self.ctrl_slots)
    }
}
