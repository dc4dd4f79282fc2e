//! Connections: connect, send, receive, close, split, and the byte-stream view.

use std::net::SocketAddr;
use std::sync::Arc;

use std::future::poll_fn;

use bytes::Bytes;
use tokio::sync::oneshot;

use crate::config::Config;
use crate::error::{Error, Lost, Result};
use crate::proto::handshake::HEADER_LEN;
use crate::proto::Peer;
use crate::runtime::{Cmd, ConnId, ConnectCmd, Established, Runtime, ShardRef};
use crate::wait::Role;
use crate::wire::{Wait, Waiting, Wire};

/// The most user private data `rdma_connect` carries after evchan's handshake (RoCE/IB, TCP
/// port space: 56 − 16).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56 - HEADER_LEN;
/// The most user private data `rdma_accept` carries after evchan's handshake (196 − 16).
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196 - HEADER_LEN;
/// The most private data `rdma_reject` carries (no handshake in a reject).
pub const MAX_REJECT_PRIVATE_DATA: usize = 148;

pub(crate) fn check_private_data(data: &[u8], max: usize) -> Result<()> {
    if data.len() > max {
        return Err(Error::PrivateDataTooLong {
            len: data.len(),
            max,
        });
    }
    Ok(())
}

/// A reliable, message-oriented RDMA connection (an RC QP made through rdma_cm).
///
/// Messages keep their boundaries; each is at most the peer's maximum message size. `send`
/// posts the message from the calling task and waits only when `send_depth` messages are in
/// flight or the peer has granted no credit (it has not consumed what it got, or its window of
/// credits has not widened yet): a slow reader
/// slows the sender down, it never makes the connection fail. `recv` polls the connection's
/// own completion queue from the calling task and, when it is empty, sleeps on its completion
/// channel through tokio's reactor (or spins first, within [`Config::busy_poll`]'s window): no
/// message passes through another task or thread.
///
/// `Connection` is `Send + 'static`: move it into `tokio::spawn`, share it (`Arc`) between
/// tasks that send, or [`split`](Self::split) it into halves for two tasks (of any runtime's
/// worker threads: whichever half reaps a completion hands the other half what is its). Any
/// number of tasks may `send` at once: they post in the order they began to wait, none is
/// left asleep. The completion channel it sleeps on is its shard's, shared by the shard's
/// connections on the device (no descriptor per connection); it is registered with each tokio
/// runtime whose tasks wait on one of them (each must have its I/O driver enabled), so a
/// connection can move between runtimes, or be used from several, and no wait depends on a
/// runtime that sits idle.
/// Dropping the connection closes it gracefully in the background (what was sent is still
/// delivered); [`close`](Self::close) does the same and waits.
///
/// # Examples
///
/// ```no_run
/// # async fn f() -> Result<(), evchan::Error> {
/// let mut conn = evchan::Connection::connect("169.254.77.1:7471".parse().unwrap()).await?;
/// conn.send("ping").await?;
/// if let Some(reply) = conn.recv().await? {
///     println!("{} bytes back", reply.len());
/// }
/// conn.close().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Connection {
    send: SendHalf,
    recv: RecvHalf,
}

/// A connection's data path seen from a test ([`Connection::__probe`]): a test door, not part
/// of the API.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct Probe(Arc<Wire>);

impl Probe {
    /// The data path's state in one line. `kick`: reap the completion queue first and say how
    /// many completions were waiting there (a wake-up that never came shows as completions
    /// found).
    #[must_use]
    pub fn state(&self, kick: bool) -> String {
        self.0.probe(kick)
    }
}

/// The sending half of a [`Connection`].
#[derive(Debug)]
pub struct SendHalf {
    conn: ConnId,
    shard: ShardRef,
    wire: Arc<Wire>,
    max_send: usize,
    info: Arc<Info>,
    shut: bool,
}

/// The receiving half of a [`Connection`].
#[derive(Debug)]
pub struct RecvHalf {
    conn: ConnId,
    shard: ShardRef,
    wire: Arc<Wire>,
    info: Arc<Info>,
}

#[derive(Debug)]
struct Info {
    local_addr: Option<SocketAddr>,
    peer_addr: Option<SocketAddr>,
    peer_private_data: Vec<u8>,
    evchan_peer: bool,
    /// Halves alive: the last one to go closes the connection.
    halves: std::sync::atomic::AtomicU8,
    /// [`Connection::close`] asked the shard already: the halves' drop does not.
    closing: std::sync::atomic::AtomicBool,
}

impl Info {
    /// Whether the calling half was the last one alive, and the close is still to be asked.
    fn last_half(&self) -> bool {
        let last = self
            .halves
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel)
            == 1;
        last && !self.closing.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// Builds an outgoing connection: [`Connection::builder`].
#[derive(Debug, Clone, Default)]
pub struct ConnectBuilder {
    config: Config,
    private_data: Vec<u8>,
}

impl ConnectBuilder {
    /// The settings (queue depths, message size, timeouts, shards).
    #[must_use]
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Private data for the peer's `CONNECT_REQUEST`: at most [`MAX_CONNECT_PRIVATE_DATA`]
    /// bytes.
    #[must_use]
    pub fn private_data(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.private_data = data.into();
        self
    }

    /// Resolves `addr`, connects and waits for `ESTABLISHED`.
    ///
    /// Cancel safety: dropping the future abandons the attempt; a connection that is
    /// established anyway is closed in the background.
    ///
    /// # Errors
    /// [`Error::NoDevice`], [`Error::PrivateDataTooLong`] (before anything is sent),
    /// [`Error::Resolve`], [`Error::TimedOut`] with the step, [`Error::Rejected`] with the
    /// reason and the peer's private data, [`Error::Unreachable`], [`Error::Connect`],
    /// [`Error::Handshake`], [`Error::Config`].
    pub async fn connect(self, addr: SocketAddr) -> Result<Connection> {
        check_private_data(&self.private_data, MAX_CONNECT_PRIVATE_DATA)?;
        let rt = Runtime::shared(&self.config)?;
        let shard = rt.pick();
        let (reply, rx) = oneshot::channel();
        let sent = shard.send(Cmd::Connect(Box::new(ConnectCmd {
            conn: rt.conn_id(),
            addr,
            config: self.config,
            private_data: self.private_data,
            reply,
        })));
        if !sent {
            return Err(Error::ConnectionLost(shard.lost()));
        }
        rx.await.map_err(|_| Error::ConnectionLost(shard.lost()))?
    }
}

impl Connection {
    /// Connects to `addr` with the default [`Config`] and no private data; see
    /// [`ConnectBuilder::connect`].
    ///
    /// # Errors
    /// As [`ConnectBuilder::connect`].
    pub async fn connect(addr: SocketAddr) -> Result<Connection> {
        Self::builder().connect(addr).await
    }

    /// A builder for settings and private data.
    #[must_use]
    pub fn builder() -> ConnectBuilder {
        ConnectBuilder::default()
    }

    pub(crate) fn from_established(est: Established) -> Self {
        let Established {
            conn,
            shard,
            wire,
            local_addr,
            peer_addr,
            peer,
            max_send,
        } = est;
        let (evchan_peer, peer_private_data) = match peer {
            Peer::Evchan(_, user) => (true, user),
            Peer::Plain(user) => (false, user),
        };
        let info = Arc::new(Info {
            local_addr,
            peer_addr,
            peer_private_data,
            evchan_peer,
            halves: std::sync::atomic::AtomicU8::new(2),
            closing: std::sync::atomic::AtomicBool::new(false),
        });
        Connection {
            send: SendHalf {
                conn,
                shard: shard.clone(),
                wire: Arc::clone(&wire),
                max_send,
                info: info.clone(),
                shut: false,
            },
            recv: RecvHalf {
                conn,
                shard,
                wire,
                info,
            },
        }
    }

    /// Sends one message; see [`SendHalf::send`].
    ///
    /// # Errors
    /// As [`SendHalf::send`].
    pub async fn send(&self, data: impl AsRef<[u8]>) -> Result<()> {
        self.send.send(data).await
    }

    /// Receives the next message; see [`RecvHalf::recv`].
    ///
    /// # Errors
    /// As [`RecvHalf::recv`].
    pub async fn recv(&mut self) -> Result<Option<Bytes>> {
        self.recv.recv().await
    }

    /// Closes gracefully: every message sent before is delivered, then the peer's `recv`
    /// returns `None`; then `rdma_disconnect`, and everything of the connection (id, QP, CQ,
    /// memory regions) is released. Returns once that is done. The close message (`FIN`) is
    /// posted, and its completion awaited, from the calling task; the disconnect and the
    /// release are the shard's.
    ///
    /// `Ok(())` says that the connection ended without a loss and that every message this side
    /// sent was delivered: each send completed (on RC, the peer's side acknowledged it).
    /// Delivered means received by the peer's evchan, which hands it to `recv` unless the
    /// peer's application dropped its receive half or closed first. A peer that closed first
    /// and then disconnected is no loss.
    ///
    /// # Errors
    /// [`Error::ConnectionLost`] with the cause when the connection was lost before or during
    /// the close (e.g. `WorkCompletion(RetryExceeded)` for a dead peer or a cut wire,
    /// `Disconnected`, `DeviceRemoved`, `Shutdown`): what was still queued or in flight then
    /// was not delivered. Also `Disconnected` when the peer disconnected during the close (its
    /// own close done) before what was queued here went out. Everything is released either
    /// way.
    ///
    /// The close message waits for a control credit of the peer as long as it takes: a live
    /// peer that does not read keeps the close waiting (a dead one ends it with the
    /// transport's retries).
    ///
    /// One-sided operations ([`crate::remote`]) are not messages: their own futures report
    /// their results, and `close`'s covers the messages alone.
    ///
    /// Cancel safety: dropping the future leaves the close to finish in the background.
    pub async fn close(self) -> Result<()> {
        // A failure here (no I/O driver in this runtime) leaves the wait to the shard.
        {
            let wire = &self.send.wire;
            let mut waiting = Waiting::new(wire, Role::Close);
            let _ = poll_fn(|cx| wire.poll_close(cx, &mut waiting.wait)).await;
        }
        let (reply, done) = oneshot::channel();
        let Connection { send, recv } = self;
        let (wire, shard) = (Arc::clone(&send.wire), send.shard.clone());
        let sent = send.shard.send(Cmd::Close {
            conn: send.conn,
            reply: Some(reply),
        });
        if sent {
            send.info
                .closing
                .store(true, std::sync::atomic::Ordering::Release);
        }
        drop((send, recv));
        let released = sent && done.await.is_ok();
        wire.close_result(released, shard.lost())
    }

    /// The send half, which carries the one-sided operations ([`crate::remote`]).
    pub(crate) fn send_half(&self) -> &SendHalf {
        &self.send
    }

    /// The two halves, for two tasks. Dropping the send half sends the close message after
    /// what is queued (the peer's `recv` then returns `None`); dropping both closes the
    /// connection.
    #[must_use]
    pub fn split(self) -> (SendHalf, RecvHalf) {
        (self.send, self.recv)
    }

    /// Moves the connection's QP to the error state, as a fatal device error would: a test
    /// door (its work requests flush, and the connection ends with [`Lost::QpError`]). Not
    /// part of the API.
    ///
    /// # Errors
    /// [`Error::Verbs`] when `ibv_modify_qp` fails.
    #[doc(hidden)]
    pub fn __force_qp_error(&self) -> Result<()> {
        self.send.__force_qp_error()
    }

    /// [`SendHalf::__route_qp_event`]: a test door, not part of the API.
    #[doc(hidden)]
    pub fn __route_qp_event(&self, kind: evchan_core::verbs::AsyncEventKind) -> bool {
        self.send.__route_qp_event(kind)
    }

    /// A handle on the data path's state, for a test that waited too long: a test door, not
    /// part of the API.
    #[doc(hidden)]
    #[must_use]
    pub fn __probe(&self) -> Probe {
        Probe(Arc::clone(&self.send.wire))
    }

    /// The peer's address.
    #[must_use]
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.send.info.peer_addr
    }

    /// This side's address.
    #[must_use]
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.send.info.local_addr
    }

    /// The private data the peer sent with its connect or accept (for a plain librdmacm
    /// peer, all of it, with RoCE's zero padding).
    #[must_use]
    pub fn peer_private_data(&self) -> &[u8] {
        &self.send.info.peer_private_data
    }

    /// Whether the peer speaks evchan's protocol (flow control, close message); `false` for
    /// a plain librdmacm program.
    #[must_use]
    pub fn is_evchan_peer(&self) -> bool {
        self.send.info.evchan_peer
    }

    /// The largest message [`send`](Self::send) takes (the smaller of this side's and the
    /// peer's maximum).
    #[must_use]
    pub fn max_message_size(&self) -> usize {
        self.send.max_send
    }
}

impl SendHalf {
    /// Sends one message: copies it into a registered send slot and posts it, from the
    /// calling task, once a send slot is free and (toward an evchan peer) the peer has granted
    /// a credit; waits until then. `data` is anything that reads as bytes (`&[u8]`, `&str`,
    /// `Vec<u8>`, `Bytes`, …): since it is copied, a borrowed buffer costs no allocation.
    /// Messages arrive in order. Returns once the message is posted (`data` is dropped then);
    /// [`Connection::close`] says whether everything posted was delivered.
    ///
    /// Any number of `send`s may wait at once (on several tasks, or in one task's
    /// `FuturesUnordered`): they post in the order they began to wait, each woken in turn; a
    /// waiting `send` keeps its place in line until it completes or is dropped.
    ///
    /// Cancel safety: cancel-safe. If the future is dropped before it completes, the message
    /// was not posted and will not be sent, and the next `send` in line takes its turn; once
    /// it completes, it is posted.
    ///
    /// # Errors
    /// [`Error::MessageTooLarge`] (nothing is sent), [`Error::PeerClosed`] after the peer
    /// disconnected cleanly, [`Error::ConnectionLost`] (with [`Lost::Closed`] after
    /// [`shutdown`](Self::shutdown)), [`Error::Config`] on a tokio runtime without its I/O
    /// driver (the message was not sent).
    pub async fn send(&self, data: impl AsRef<[u8]>) -> Result<()> {
        let data = data.as_ref();
        if data.len() > self.max_send {
            return Err(Error::MessageTooLarge {
                len: data.len(),
                max: self.max_send,
            });
        }
        if self.shut {
            return Err(Error::ConnectionLost(Lost::Closed));
        }
        let mut waiting = Waiting::new(&self.wire, Role::Send);
        poll_fn(|cx| self.wire.poll_send(cx, data, &mut waiting.wait)).await
    }

    /// Sends the close message after everything sent: the peer's `recv` returns `None` once it
    /// has read the rest. This side can still receive.
    pub fn shutdown(&mut self) {
        if !self.shut {
            self.shut = true;
            self.wire.shutdown();
        }
    }

    /// The largest message [`send`](Self::send) takes.
    #[must_use]
    pub fn max_message_size(&self) -> usize {
        self.max_send
    }

    /// [`Connection::__force_qp_error`]: a test door, not part of the API.
    ///
    /// # Errors
    /// As [`Connection::__force_qp_error`].
    #[doc(hidden)]
    pub fn __force_qp_error(&self) -> Result<()> {
        self.wire.force_qp_error()
    }

    /// Hands the connection a QP async event of `kind` through the table the runtime routes
    /// the devices' events by (as if the device had reported it): a test door, not part of
    /// the API. `false` when the connection's QP is not in the table.
    #[doc(hidden)]
    pub fn __route_qp_event(&self, kind: evchan_core::verbs::AsyncEventKind) -> bool {
        self.wire.route_qp_event(kind)
    }

    /// `send`'s poll, for the byte stream: posts the first `max_message_size` bytes of `buf`
    /// (or fewer); how many.
    pub(crate) fn poll_write(
        &self,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
        wait: &mut Wait,
    ) -> std::task::Poll<Result<usize>> {
        if self.shut {
            return std::task::Poll::Ready(Err(Error::ConnectionLost(Lost::Closed)));
        }
        let n = buf.len().min(self.max_send);
        self.wire.poll_send(cx, &buf[..n], wait).map_ok(|()| n)
    }

    /// The connection's data path (the byte stream's waits end there).
    pub(crate) fn wire(&self) -> &Wire {
        &self.wire
    }

    /// Whether [`shutdown`](Self::shutdown) was called: nothing more goes out.
    pub(crate) fn is_shut(&self) -> bool {
        self.shut
    }
}

impl Drop for SendHalf {
    fn drop(&mut self) {
        self.shutdown();
        if self.info.last_half() {
            self.shard.send(Cmd::Close {
                conn: self.conn,
                reply: None,
            });
        }
    }
}

impl RecvHalf {
    /// The next message, `None` once the peer closed cleanly (after every message it sent).
    /// Polls the connection's completion queue from the calling task, and sleeps on its
    /// completion channel while nothing has come. The `Bytes` point into the registered
    /// receive buffer, which goes back to the connection (for a receive whose credit it grants)
    /// when the last clone is dropped — hold `recv_depth` messages and the peer waits.
    ///
    /// Cancel safety: cancel-safe. A message is only taken when the future completes; what
    /// the CQ had when the future was dropped waits for the next `recv`.
    ///
    /// # Errors
    /// [`Error::ConnectionLost`] when the connection ended abnormally (the peer vanished,
    /// broke the protocol, or the device went away); messages that arrived before are
    /// delivered first. [`Error::Config`] on a tokio runtime without its I/O driver.
    pub async fn recv(&mut self) -> Result<Option<Bytes>> {
        let mut waiting = Waiting::new(&self.wire, Role::Recv);
        poll_fn(|cx| self.wire.poll_recv(cx, &mut waiting.wait)).await
    }

    pub(crate) fn poll_recv(
        &self,
        cx: &mut std::task::Context<'_>,
        wait: &mut Wait,
    ) -> std::task::Poll<Result<Option<Bytes>>> {
        self.wire.poll_recv(cx, wait)
    }

    /// The connection's data path (the byte stream's waits end there).
    pub(crate) fn wire(&self) -> &Wire {
        &self.wire
    }

    /// The peer's address.
    #[must_use]
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.info.peer_addr
    }
}

impl Drop for RecvHalf {
    fn drop(&mut self) {
        self.wire.recv_dropped();
        if self.info.last_half() {
            self.shard.send(Cmd::Close {
                conn: self.conn,
                reply: None,
            });
        }
    }
}
