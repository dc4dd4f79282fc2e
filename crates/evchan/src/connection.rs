//! Connections: connect, send, receive, close, split, and the byte-stream view.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use crate::config::Config;
use crate::error::{Error, Lost, Result};
use crate::proto::handshake::HEADER_LEN;
use crate::proto::Peer;
use crate::runtime::{Cmd, ConnId, ConnectCmd, Delivery, Established, Runtime, ShardRef, Shared};

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
/// waits only when `send_depth` messages are already queued or in flight, or the peer has
/// granted no credit (it has not consumed what it got): a slow reader slows the sender down,
/// it never makes the connection fail.
///
/// `Connection` is `Send + 'static`: move it into `tokio::spawn`, or [`split`](Self::split) it
/// into halves for two tasks. Dropping it closes it gracefully in the background (queued
/// messages are still delivered); [`close`](Self::close) does the same and waits.
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

/// The sending half of a [`Connection`].
#[derive(Debug)]
pub struct SendHalf {
    conn: ConnId,
    shard: ShardRef,
    shared: Arc<Shared>,
    max_send: usize,
    info: Arc<Info>,
    shut: bool,
}

/// The receiving half of a [`Connection`].
#[derive(Debug)]
pub struct RecvHalf {
    conn: ConnId,
    shard: ShardRef,
    inbox: mpsc::UnboundedReceiver<Delivery>,
    end: Option<std::result::Result<(), Lost>>,
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
}

impl Info {
    /// Whether the calling half was the last one alive.
    fn last_half(&self) -> bool {
        self.halves
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel)
            == 1
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
            inbox,
            shared,
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
        });
        Connection {
            send: SendHalf {
                conn,
                shard: shard.clone(),
                shared,
                max_send,
                info: info.clone(),
                shut: false,
            },
            recv: RecvHalf {
                conn,
                shard,
                inbox,
                end: None,
                info,
            },
        }
    }

    /// Sends one message; see [`SendHalf::send`].
    ///
    /// # Errors
    /// As [`SendHalf::send`].
    pub async fn send(&self, data: impl Into<Bytes>) -> Result<()> {
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
    /// returns `None`; then `rdma_disconnect`, and everything of the connection (id, QP,
    /// memory regions) is released. Returns once that is done.
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
    /// Queued messages wait for the peer's credits as long as it takes: a live peer that does
    /// not read keeps the close waiting (a dead one ends it with the transport's retries).
    ///
    /// Cancel safety: dropping the future leaves the close to finish in the background.
    pub async fn close(self) -> Result<()> {
        let (reply, done) = oneshot::channel();
        let Connection { send, recv } = self;
        let (shared, shard) = (Arc::clone(&send.shared), send.shard.clone());
        let sent = send.shard.send(Cmd::Close {
            conn: send.conn,
            reply: Some(reply),
        });
        drop((send, recv));
        let released = sent && done.await.is_ok();
        shared.close_result(released, shard.lost())
    }

    /// The two halves, for two tasks. Dropping the send half sends the close message after
    /// what is queued (the peer's `recv` then returns `None`); dropping both closes the
    /// connection.
    #[must_use]
    pub fn split(self) -> (SendHalf, RecvHalf) {
        (self.send, self.recv)
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
    /// Queues one message for sending, waiting while `send_depth` messages are queued or in
    /// flight. Messages arrive in order. A message is copied into a registered send slot
    /// when a credit allows; the `Bytes` are dropped then.
    ///
    /// Cancel safety: cancel-safe. If the future is dropped before it completes, the message
    /// was not queued and will not be sent; once it completes, the message is queued.
    ///
    /// # Errors
    /// [`Error::MessageTooLarge`] (nothing is sent), [`Error::PeerClosed`] after the peer
    /// disconnected cleanly, [`Error::ConnectionLost`].
    pub async fn send(&self, data: impl Into<Bytes>) -> Result<()> {
        let data = data.into();
        if data.len() > self.max_send {
            return Err(Error::MessageTooLarge {
                len: data.len(),
                max: self.max_send,
            });
        }
        if self.shut {
            return Err(Error::ConnectionLost(Lost::Closed));
        }
        // A free permit is taken without the future and its waiter list (the common case).
        let permit = match self.shared.permits.try_acquire() {
            Ok(permit) => permit,
            Err(tokio::sync::TryAcquireError::Closed) => return Err(self.shared.send_error()),
            Err(tokio::sync::TryAcquireError::NoPermits) => self
                .shared
                .permits
                .acquire()
                .await
                .map_err(|_| self.shared.send_error())?,
        };
        permit.forget();
        self.queue(data)
    }

    /// Sends the close message after everything queued: the peer's `recv` returns `None`
    /// once it has read the rest. This side can still receive.
    pub fn shutdown(&mut self) {
        if !self.shut {
            self.shut = true;
            self.shard.send(Cmd::Shutdown(self.conn));
        }
    }

    /// The largest message [`send`](Self::send) takes.
    #[must_use]
    pub fn max_message_size(&self) -> usize {
        self.max_send
    }

    pub(crate) fn poll_permit(
        &self,
        sem: &mut tokio_util::sync::PollSemaphore,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<()>> {
        match sem.poll_acquire(cx) {
            std::task::Poll::Ready(Some(p)) => {
                p.forget();
                std::task::Poll::Ready(Ok(()))
            }
            std::task::Poll::Ready(None) => std::task::Poll::Ready(Err(self.shared.send_error())),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }

    /// Hands `data` to the shard, once a permit is taken.
    pub(crate) fn queue(&self, data: Bytes) -> Result<()> {
        if self.shard.send(Cmd::Send {
            conn: self.conn,
            data,
        }) {
            Ok(())
        } else {
            Err(Error::ConnectionLost(self.shard.lost()))
        }
    }

    pub(crate) fn semaphore(&self) -> tokio_util::sync::PollSemaphore {
        tokio_util::sync::PollSemaphore::new(self.shared.permits_arc())
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
    /// The `Bytes` point into the registered receive buffer; the buffer is posted again, and
    /// its credit returned to the peer, when the last clone is dropped — hold messages and
    /// the peer waits.
    ///
    /// Cancel safety: cancel-safe. A message is only taken from the queue when the future
    /// completes; dropping the future loses nothing.
    ///
    /// # Errors
    /// [`Error::ConnectionLost`] when the connection ended abnormally (the peer vanished,
    /// broke the protocol, or the device went away); messages that arrived before are
    /// delivered first.
    pub async fn recv(&mut self) -> Result<Option<Bytes>> {
        if let Some(end) = &self.end {
            return end.clone().map(|()| None).map_err(Error::ConnectionLost);
        }
        let d = self.inbox.recv().await;
        self.on_delivery(d)
    }

    pub(crate) fn poll_recv(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<Option<Bytes>>> {
        if let Some(end) = &self.end {
            return std::task::Poll::Ready(
                end.clone().map(|()| None).map_err(Error::ConnectionLost),
            );
        }
        self.inbox.poll_recv(cx).map(|d| self.on_delivery(d))
    }

    fn on_delivery(&mut self, d: Option<Delivery>) -> Result<Option<Bytes>> {
        match d {
            Some(Delivery::Data(b)) => Ok(Some(b)),
            Some(Delivery::Fin) => {
                self.end = Some(Ok(()));
                Ok(None)
            }
            Some(Delivery::Lost(l)) => {
                self.end = Some(Err(l.clone()));
                Err(Error::ConnectionLost(l))
            }
            None => {
                let lost = self.shard.lost();
                self.end = Some(Err(lost.clone()));
                Err(Error::ConnectionLost(lost))
            }
        }
    }

    /// The peer's address.
    #[must_use]
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.info.peer_addr
    }
}

impl Drop for RecvHalf {
    fn drop(&mut self) {
        self.shard.send(Cmd::RecvDropped(self.conn));
        if self.info.last_half() {
            self.shard.send(Cmd::Close {
                conn: self.conn,
                reply: None,
            });
        }
    }
}
