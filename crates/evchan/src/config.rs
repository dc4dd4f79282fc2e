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
    pub(crate) send_depth: u32,
    pub(crate) ctrl_slots: u16,
    pub(crate) addr_timeout: Duration,
    pub(crate) route_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) shards: usize,
    pub(crate) backlog: u32,
    pub(crate) cq_entries: u32,
    pub(crate) busy_poll: Option<Duration>,
    pub(crate) keepalive: Option<Duration>,
    pub(crate) retry_count: u8,
    pub(crate) in_task: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self::new()
    }
}

impl Config {
    /// The defaults: 4 KiB messages, 16 receives and 16 sends in flight per connection, 2 s to
    /// resolve the address and the route each, 10 s to connect, a backlog of 128, one
    /// event-channel shard per available CPU, 16,384 CQ entries per shard, a keepalive after
    /// 15 s without a completion, 6 transport retries.
    #[must_use]
    pub fn new() -> Self {
        Self {
            max_message: 4096,
            recv_depth: 16,
            send_depth: 16,
            ctrl_slots: 4,
            addr_timeout: Duration::from_secs(2),
            route_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(10),
            shards: std::thread::available_parallelism().map_or(1, usize::from),
            backlog: 128,
            cq_entries: 16_384,
            busy_poll: None,
            keepalive: Some(Duration::from_secs(15)),
            retry_count: 6,
            in_task: false,
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

    /// How many data messages the peer may have in flight toward this side (receive slots,
    /// registered once per connection; the peer's credits).
    #[must_use]
    pub fn recv_depth(mut self, n: u32) -> Self {
        self.recv_depth = n;
        self
    }

    /// How many of this side's messages may be queued or in flight before `send` waits.
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

    /// How many event channels (each with its own thread and completion channel) spread the
    /// connections; at least 1. Listeners and connections with the same number (and the same
    /// CQ entries and busy-poll window) share them.
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
    /// with their receive and send slots (made at the accept) are ever spent on peers that do
    /// not complete their side, each for at most `connect_timeout`.
    #[must_use]
    pub fn backlog(mut self, n: u32) -> Self {
        self.backlog = n;
        self
    }

    /// CQ entries of each shard (shared by its connections; each takes
    /// `recv_depth + send_depth + 2 × 4`). Handles with different values get different shards.
    #[must_use]
    pub fn cq_entries(mut self, n: u32) -> Self {
        self.cq_entries = n;
        self
    }

    /// Busy-poll: before a shard sleeps, it polls its CQs, commands and returned buffers
    /// without sleeping until nothing has happened for `window` (like rsocket's polling
    /// window). Off by default: it trades a CPU per shard for latency. While it polls, its CQs
    /// are not armed (no completion events to read); it arms them before it sleeps. With
    /// [`in_task`](Self::in_task) the shard yields to its runtime after each piece of progress
    /// and every 64 empty polls, so that the application's tasks on that thread run between
    /// polls. Handles whose shards, CQ entries and busy-poll window are equal share one set of
    /// shards.
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

    /// Drive the connections on the caller's tokio runtime instead of on threads of their own:
    /// one shard (the [`shards`](Self::shards) setting is not used) that runs as a task
    /// (`tokio::spawn`) on the runtime of the task that first connects or listens with this
    /// setting on that thread. Receiving, sending and the shard's work then hand over between
    /// tasks, not threads: on a current-thread runtime a round trip needs no thread wake-up
    /// besides the completion channel's (see `docs/BENCHMARKS.md`). The runtime must have its
    /// I/O and time drivers enabled (`enable_all`); outside a tokio runtime, connect and bind
    /// fail with [`Error::Config`](crate::Error::Config). Handles made on another thread get
    /// a shard of their own. When that runtime shuts down, the shard is dropped with it:
    /// everything of its connections and listeners is released, and their handles fail with
    /// [`Lost::Shutdown`](crate::Lost::Shutdown). With [`busy_poll`](Self::busy_poll), see
    /// there. A removed device is seen as by a runtime thread (its verbs node gone, looked for
    /// every 50 ms by a second task on the same runtime; or rdma_cm's `DEVICE_REMOVAL`): the
    /// handles fail with [`Lost::DeviceRemoved`](crate::Lost::DeviceRemoved) (see
    /// `docs/RELIABILITY.md`). Off by default.
    ///
    /// ```
    /// # async fn f() -> Result<(), evchan::Error> {
    /// let config = evchan::Config::new().in_task(true);
    /// let mut conn = evchan::Connection::builder()
    ///     .config(config)
    ///     .connect("169.254.77.1:7471".parse().unwrap())
    ///     .await?;
    /// conn.send("ping").await?;
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn in_task(mut self, yes: bool) -> Self {
        self.in_task = yes;
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
        if self.retry_count > 6 {
            return bad("retry_count must be within 0..=6 (rdma_rxe retries 7 forever)");
        }
        if self.keepalive.is_some_and(|k| k.is_zero()) {
            return bad("keepalive must be above zero (None turns it off)");
        }
        Ok(())
    }

    /// CQ entries one connection takes.
    pub(crate) fn cq_cost(&self) -> u32 {
        self.recv_depth + self.send_depth + 2 * u32::from(self.ctrl_slots)
    }
}
