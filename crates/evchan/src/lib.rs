//! Async RDMA connections on tokio, built on [`evchan_core`]'s safe event channels.
//!
//! ```no_run
//! use evchan::{Config, Connection, Listener};
//!
//! # async fn f() -> Result<(), evchan::Error> {
//! // Server
//! let listener = Listener::bind("169.254.77.1:7471".parse().unwrap(), Config::new()).await?;
//! tokio::spawn(async move {
//!     while let Ok(incoming) = listener.accept().await {
//!         tokio::spawn(async move {
//!             let mut conn = incoming.accept(b"").await?;
//!             while let Some(msg) = conn.recv().await? {
//!                 conn.send(msg).await?; // echo
//!             }
//!             Ok::<_, evchan::Error>(())
//!         });
//!     }
//! });
//!
//! // Client
//! let mut conn = Connection::connect("169.254.77.1:7471".parse().unwrap()).await?;
//! conn.send("hello").await?;
//! assert_eq!(conn.recv().await?.as_deref(), Some(&b"hello"[..]));
//! conn.close().await?; // Ok: everything sent was delivered
//! # Ok(())
//! # }
//! ```
//!
//! - [`Listener`] / [`Incoming`] / [`Connection`]: messages as [`bytes::Bytes`]; a received
//!   message points into registered memory (zero copy) and its buffer goes back to the
//!   connection, for a receive whose credit it grants, when the last clone is dropped.
//! - Credit flow control ([`proto`]): a sender never overruns the receives its peer posted,
//!   however slow the reader; `send` waits instead. The receiver grants a few credits at
//!   first and more as the peer's messages come, up to `Config::recv_depth` granted or
//!   unread.
//! - [`Stream`]: the byte-stream view (`AsyncRead` + `AsyncWrite`).
//! - [`remote`]: one-sided RDMA WRITE, READ and atomics on a peer's memory, and memory
//!   exposed for the peer's, safely on both sides.
//! - Every handle is `Send + 'static`, splittable ([`Connection::split`]) and movable between
//!   tasks and runtimes. A connection's messages are posted and reaped in the task that calls
//!   `send` or `recv`: no hand-off to another task or thread. Each connection has its own
//!   completion queue, on a completion channel its shard shares among its connections on the
//!   device (no descriptor per connection); `recv` polls the queue and, when it is empty,
//!   arms it and waits for the channel's event through tokio's reactor (or spins within
//!   [`Config::busy_poll`]'s window first). The QP, CQ and memory are evchan-core's owned
//!   style (`evchan_core::verbs::owned`): reference counted, the QP revocable.
//! - The rdma_cm control path (connect, accept, disconnect, device removal, keepalive timers)
//!   runs on background shard threads (see the `runtime` module's docs): on every wake-up they
//!   read until `EAGAIN` before they clear readiness and dispatch events by id.
//! - A peer that is a plain librdmacm program (no evchan handshake in its private data) works
//!   too, without flow control of ours (its sends are retried on RNR as C programs' are).
//!
//! Nothing is logged by default; lifecycle events are `tracing` debug events.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod buffer;
mod cm_map;
mod config;
mod connection;
mod error;
mod hub;
mod listener;
pub mod proto;
pub mod remote;
mod runtime;
mod stream;
mod wait;
mod wire;

pub use buffer::{Buffer, BufferError, BufferResult};
pub use config::Config;
#[doc(hidden)]
pub use connection::Probe;
pub use connection::{
    ConnectBuilder, Connection, RecvHalf, SendHalf, MAX_ACCEPT_PRIVATE_DATA,
    MAX_CONNECT_PRIVATE_DATA, MAX_REJECT_PRIVATE_DATA,
};
pub use error::{Busy, Error, Lost, Result, Step};
pub use listener::{Incoming, Listener};
pub use stream::Stream;

// The READMEs' Rust examples (the workspace's and this crate's), compiled as doc tests of this
// crate (`no_run`: they need a device).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct WorkspaceReadmeDoctests;
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

pub use evchan_core as core;
