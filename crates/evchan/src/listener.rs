//! Listeners and incoming connection requests.

use std::net::SocketAddr;

use tokio::sync::{mpsc, oneshot};

use crate::config::Config;
use crate::connection::{
    check_private_data, Connection, MAX_ACCEPT_PRIVATE_DATA, MAX_REJECT_PRIVATE_DATA,
};
use crate::error::{Error, Result};
use crate::runtime::{Cmd, ConnId, ListenCmd, Runtime, ShardRef};

/// A listening rdma_cm id (`rdma_bind_addr` + `rdma_listen`), like `tokio::net::TcpListener`.
///
/// Requests are spread over the runtime's event-channel shards (`rdma_migrate_id`); each
/// waits in a queue for [`accept`](Self::accept). At most [`Config::backlog`] connections of a
/// listener are half-open (waiting for `accept`, for the application's answer, or accepted and
/// not yet established) — a request beyond them is rejected at once — and each goes when it
/// waits longer than [`Config::connect_timeout`] for the answer, or for `ESTABLISHED` after
/// the accept. Dropping the listener destroys the listening id; connections already accepted,
/// and requests already handed out, are not affected.
///
/// # Examples
///
/// An echo server:
///
/// ```no_run
/// use evchan::{Config, Listener};
///
/// # async fn f() -> Result<(), evchan::Error> {
/// let listener = Listener::bind("169.254.77.1:7471".parse().unwrap(), Config::new()).await?;
/// loop {
///     let incoming = listener.accept().await?;
///     tokio::spawn(async move {
///         let mut conn = incoming.accept(b"welcome").await?;
///         while let Some(msg) = conn.recv().await? {
///             conn.send(msg).await?;
///         }
///         Ok::<_, evchan::Error>(())
///     });
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct Listener {
    conn: ConnId,
    shard: ShardRef,
    queue: tokio::sync::Mutex<mpsc::Receiver<Incoming>>,
    local_addr: SocketAddr,
}

impl Listener {
    /// Binds to `addr` (port 0 picks one; [`local_addr`](Self::local_addr) says which) and
    /// listens.
    ///
    /// Cancel safety: dropping the future before it completes destroys the listening id if
    /// it was made; the address is free again.
    ///
    /// # Errors
    /// [`Error::NoDevice`], [`Error::Config`], or the core's error of `rdma_bind_addr` /
    /// `rdma_listen` (e.g. `EADDRINUSE`).
    pub async fn bind(addr: SocketAddr, config: Config) -> Result<Listener> {
        let rt = Runtime::shared(&config)?;
        let shard = rt.pick();
        let conn = rt.conn_id();
        let (reply, rx) = oneshot::channel();
        if !shard.send(Cmd::Listen(Box::new(ListenCmd {
            conn,
            addr,
            config,
            reply,
        }))) {
            return Err(Error::ConnectionLost(shard.lost()));
        }
        rx.await.map_err(|_| Error::ConnectionLost(shard.lost()))?
    }

    pub(crate) fn new(
        conn: ConnId,
        shard: ShardRef,
        queue: mpsc::Receiver<Incoming>,
        local_addr: SocketAddr,
    ) -> Self {
        Listener {
            conn,
            shard,
            queue: tokio::sync::Mutex::new(queue),
            local_addr,
        }
    }

    /// The next connection request.
    ///
    /// Cancel safety: cancel-safe; a request is only taken when the future completes.
    ///
    /// # Errors
    /// [`Error::ConnectionLost`] once the listening id is gone: its device was removed
    /// ([`Lost::DeviceRemoved`](crate::Lost::DeviceRemoved)), or its shard stopped on an error
    /// ([`Lost::Shutdown`](crate::Lost::Shutdown)).
    pub async fn accept(&self) -> Result<Incoming> {
        self.queue
            .lock()
            .await
            .recv()
            .await
            .ok_or_else(|| Error::ConnectionLost(self.shard.lost()))
    }

    /// The bound address.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.shard.send(Cmd::CloseListener(self.conn));
    }
}

/// A connection request (`CONNECT_REQUEST`) waiting for the application's answer. Dropping it
/// rejects the request.
#[derive(Debug)]
pub struct Incoming {
    conn: ConnId,
    shard: ShardRef,
    peer_addr: Option<SocketAddr>,
    local_addr: Option<SocketAddr>,
    private_data: Vec<u8>,
    answered: bool,
}

impl Incoming {
    pub(crate) fn new(
        shard: ShardRef,
        conn: ConnId,
        peer_addr: Option<SocketAddr>,
        local_addr: Option<SocketAddr>,
        private_data: Vec<u8>,
    ) -> Self {
        Self {
            conn,
            shard,
            peer_addr,
            local_addr,
            private_data,
            answered: false,
        }
    }

    /// The peer's address.
    #[must_use]
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer_addr
    }

    /// The local address the request came to.
    #[must_use]
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// The private data of the peer's connect (an evchan peer's own data, without the
    /// handshake; a plain librdmacm peer's data with RoCE's zero padding).
    #[must_use]
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// Accepts with `private_data` (at most [`MAX_ACCEPT_PRIVATE_DATA`] bytes) and waits for
    /// `ESTABLISHED`.
    ///
    /// Cancel safety: dropping the future closes the connection if it gets established.
    ///
    /// # Errors
    /// [`Error::PrivateDataTooLong`] (the request stays rejected), [`Error::TimedOut`],
    /// [`Error::ConnectionLost`] when the peer went away, or the core's error.
    pub async fn accept(mut self, private_data: &[u8]) -> Result<Connection> {
        check_private_data(private_data, MAX_ACCEPT_PRIVATE_DATA)?;
        self.answered = true;
        let (reply, rx) = oneshot::channel();
        if !self.shard.send(Cmd::Accept {
            conn: self.conn,
            private_data: private_data.to_vec(),
            reply,
        }) {
            return Err(Error::ConnectionLost(self.shard.lost()));
        }
        rx.await
            .map_err(|_| Error::ConnectionLost(self.shard.lost()))?
    }

    /// Rejects with `private_data` (at most [`MAX_REJECT_PRIVATE_DATA`] bytes): the peer's
    /// connect fails with [`Error::Rejected`], reason 28.
    ///
    /// # Errors
    /// [`Error::PrivateDataTooLong`]; the request is then rejected without data.
    pub fn reject(mut self, private_data: &[u8]) -> Result<()> {
        self.answered = true;
        let checked = check_private_data(private_data, MAX_REJECT_PRIVATE_DATA);
        let data = if checked.is_ok() {
            private_data.to_vec()
        } else {
            Vec::new()
        };
        self.shard.send(Cmd::Reject {
            conn: self.conn,
            private_data: data,
        });
        checked
    }
}

impl Drop for Incoming {
    fn drop(&mut self) {
        if !self.answered {
            self.shard.send(Cmd::Reject {
                conn: self.conn,
                private_data: Vec::new(),
            });
        }
    }
}
