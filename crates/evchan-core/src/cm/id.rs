//! The typestate id.

use std::fmt;
use std::io;
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::time::Duration;

use super::param::{check_private_data, ConnParam};
use super::state::{
    AddrResolved, Bound, CanAccept, CanConnect, CanCreateQp, CanDisconnect, CanListen,
    CanResolveAddr, Connected, Connecting, Disconnected, HasDevice, Idle, Listening, ResolvingAddr,
    ResolvingRoute, RouteResolved, State,
};
use super::{Event, EventKind, PortSpace};
use crate::error::{Error, Message, Result, UnexpectedEvent};
use crate::ffi::cm::Id as RawId;
use crate::verbs::{ContextRef, PdRef, QpInit};
use crate::EventChannel;

/// An opaque key naming one id, to match events to ids ([`Event::id`], [`Id::key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IdKey(pub(crate) usize);

/// An rdma_cm id (`struct rdma_cm_id`) on the channel `'ch`, in state `S`.
///
/// `rdma_create_id` creates it ([`Id::new`]) in state [`Idle`]; each operation consumes the id
/// and returns it in its next state, and operations whose completion arrives as an event take
/// that event as proof ([`Id::addr_resolved`], [`Id::route_resolved`], [`Id::established`]).
/// Calling an operation in the wrong state is a compile error.
///
/// Dropping the id calls `rdma_destroy_id` (after `rdma_destroy_qp` if it has a QP). If an event
/// counted against the id is still unacked, the destroy is deferred to that event's ack instead
/// of blocking forever as the C call would.
///
/// The id borrows its channel: the channel cannot be dropped while the id lives, and
/// [`Id::migrate`] moves the id to another channel's lifetime. A QP made on the caller's PD and
/// CQs ([`Id::create_qp_with`]) is borrowed for `'ch` too. The id is `Send` but not `Sync`.
///
/// A failed operation gives the id back in its old state inside a [`TransitionError`].
///
/// # Examples
///
/// The active side, up to a resolved route:
///
/// ```no_run
/// use std::time::Duration;
/// use evchan_core::{cm, CmId, EventChannel};
///
/// let channel = EventChannel::new()?;
/// let timeout = Duration::from_secs(2);
/// let id = CmId::new(&channel, cm::PortSpace::Tcp)?
///     .resolve_addr(None, ([169, 254, 77, 1], 7471).into(), timeout)?;
/// let id = id.addr_resolved(&channel.get_event()?)?;
/// let id = id.resolve_route(timeout)?;
/// let id = id.route_resolved(&channel.get_event()?)?;
/// println!("route to {:?} on {}", id.peer_addr(), id.verbs().name());
/// # Ok::<(), evchan_core::Error>(())
/// ```
///
/// Connecting before the route is resolved does not compile:
///
/// ```compile_fail
/// # use evchan_core::{cm, CmId, EventChannel};
/// # fn f(id: CmId<'_, cm::state::AddrResolved>) {
/// let _ = id.connect(&cm::ConnParam::new());
/// # }
/// ```
///
/// # References
/// `rdma_create_id(3)`, `rdma_destroy_id(3)`, `rdma_cm(7)`.
#[doc(alias = "rdma_cm_id")]
#[doc(alias = "rdma_create_id")]
#[doc(alias = "rdma_destroy_id")]
pub struct Id<'ch, S: State = Idle> {
    pub(crate) raw: RawId<'ch>,
    _state: PhantomData<S>,
}

impl<S: State> fmt::Debug for Id<'_, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmId")
            .field("state", &S::NAME)
            .field("key", &self.key())
            .field("port_space", &self.port_space())
            .field("local", &self.raw.local_addr())
            .field("peer", &self.raw.peer_addr())
            .finish()
    }
}

/// A failed transition: the error, and the id back in its old state.
///
/// `?` converts it into [`Error`] (dropping the id).
#[derive(Debug)]
pub struct TransitionError<I> {
    /// The id, unchanged.
    pub id: I,
    /// What went wrong.
    pub error: Error,
}

impl<I> TransitionError<I> {
    /// The id, unchanged.
    pub fn into_id(self) -> I {
        self.id
    }

    /// The same error with the id converted by `f` (e.g. into an [`AnyId`](super::AnyId)).
    pub fn map_id<J>(self, f: impl FnOnce(I) -> J) -> TransitionError<J> {
        TransitionError {
            id: f(self.id),
            error: self.error,
        }
    }
}

impl<I> fmt::Display for TransitionError<I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<I: fmt::Debug> std::error::Error for TransitionError<I> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<I> From<TransitionError<I>> for Error {
    fn from(e: TransitionError<I>) -> Self {
        e.error
    }
}

/// The result of a transition of an id in state `S`.
pub type Transition<'ch, S, T> = std::result::Result<T, TransitionError<Id<'ch, S>>>;

/// Drops the id of a failed transition and keeps its [`Error`], so that `?` works in functions
/// that return `Box<dyn std::error::Error>` (or `anyhow`-style errors), which need a `'static`
/// error: a [`TransitionError`] holds the id, which borrows its channel.
///
/// In a function returning [`crate::Result`], plain `?` already does this.
///
/// ```no_run
/// use std::error::Error;
/// use evchan_core::cm::{ConnParam, PortSpace, TransitionExt};
/// use evchan_core::{CmId, EventChannel};
///
/// fn serve(channel: &EventChannel) -> Result<(), Box<dyn Error>> {
///     let listener = CmId::new(channel, PortSpace::Tcp)?
///         .bind(([169, 254, 77, 1], 7471).into())
///         .drop_id()?
///         .listen(8)
///         .drop_id()?;
///     let mut event = channel.get_event()?;
///     let request = event.take_request().ok_or("not a connection request")?;
///     event.ack();
///     let _connecting = request.accept(&ConnParam::default()).drop_id()?;
///     drop(listener);
///     Ok(())
/// }
/// ```
pub trait TransitionExt<T> {
    /// The value, or the error with the id dropped (an id's drop never hangs; see
    /// [`Id`]).
    ///
    /// # Errors
    /// The transition's [`Error`].
    fn drop_id(self) -> Result<T>;
}

impl<T, I> TransitionExt<T> for std::result::Result<T, TransitionError<I>> {
    fn drop_id(self) -> Result<T> {
        self.map_err(Error::from)
    }
}

impl<'ch> Id<'ch, Idle> {
    /// `rdma_create_id`: a new id on `channel` in port space `ps`.
    ///
    /// # Errors
    /// [`Error::NoDevice`] without an RDMA device; the OS error otherwise.
    #[doc(alias = "rdma_create_id")]
    pub fn new(channel: &'ch EventChannel, ps: PortSpace) -> Result<Self> {
        RawId::create(channel.raw(), ps.code())
            .map(Self::from_raw)
            .map_err(|e| Error::os("rdma_create_id", e))
    }

    /// `rdma_bind_addr`: binds the id to a local address (port 0 picks a free port).
    ///
    /// # Errors
    /// The OS error (e.g. `EADDRINUSE`, `EADDRNOTAVAIL`), with the id back.
    #[doc(alias = "rdma_bind_addr")]
    pub fn bind(self, addr: SocketAddr) -> Transition<'ch, Idle, Id<'ch, Bound>> {
        self.run("rdma_bind_addr", |raw| raw.bind(addr))
    }
}

impl<'ch, S: State> Id<'ch, S> {
    pub(crate) fn from_raw(raw: RawId<'ch>) -> Self {
        Self {
            raw,
            _state: PhantomData,
        }
    }

    pub(super) fn into_state<T: State>(self) -> Id<'ch, T> {
        Id {
            raw: self.raw,
            _state: PhantomData,
        }
    }

    pub(super) fn fail(self, error: Error) -> TransitionError<Self> {
        TransitionError { id: self, error }
    }

    /// The transition made by the C call `call` (`f` on the raw id): the id in state `T` when
    /// it succeeds, else back in its state with the OS error.
    pub(super) fn run<T: State>(
        self,
        call: &'static str,
        f: impl FnOnce(&RawId<'ch>) -> io::Result<()>,
    ) -> Transition<'ch, S, Id<'ch, T>> {
        match f(&self.raw) {
            Ok(()) => Ok(self.into_state()),
            Err(e) => Err(self.fail(Error::os(call, e))),
        }
    }

    /// [`run`](Self::run) of a call that sends `data` as the private data of `message`: the
    /// length is checked against the port space's limit first.
    pub(super) fn send<T: State>(
        self,
        message: Message,
        data: &[u8],
        call: &'static str,
        f: impl FnOnce(&RawId<'ch>) -> io::Result<()>,
    ) -> Transition<'ch, S, Id<'ch, T>> {
        match check_private_data(self.port_space(), message, data) {
            Ok(()) => self.run(call, f),
            Err(e) => Err(self.fail(e.into())),
        }
    }

    /// The key that names this id in its events ([`Event::id`]).
    #[must_use]
    pub fn key(&self) -> IdKey {
        IdKey(self.raw.key())
    }

    /// `rdma_cm_id::ps`: the port space.
    #[must_use]
    pub fn port_space(&self) -> PortSpace {
        PortSpace::from_code(self.raw.port_space())
    }

    /// `rdma_get_local_addr`: the local address, once bound or resolved.
    #[doc(alias = "rdma_get_local_addr")]
    #[must_use]
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.raw.local_addr()
    }

    /// `rdma_get_peer_addr`: the destination address, once resolving or connected.
    #[doc(alias = "rdma_get_peer_addr")]
    #[must_use]
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.raw.peer_addr()
    }

    /// Events read for this id (for a listener, its `CONNECT_REQUEST`s) not acked yet.
    #[must_use]
    pub fn unacked_events(&self) -> usize {
        self.raw.pending()
    }

    /// `rdma_migrate_id`: moves the id to `channel`; its later events arrive there, and the id
    /// now borrows `channel` instead of its old channel.
    ///
    /// # Errors
    /// [`Error::Busy`] while an event counted against the id is unacked (the C call would wait
    /// for its ack forever); `EBUSY` as an OS error while the id has a QP on the caller's PD
    /// and CQs ([`Id::create_qp_with`]), which the migrated id would not borrow
    /// ([`Id::destroy_qp`] first lets it go); the OS error
    /// otherwise. The id comes back unchanged.
    ///
    /// A listening id cannot be migrated ([`CanMigrate`](super::state::CanMigrate) says why: a
    /// queued `CONNECT_REQUEST` would be lost):
    ///
    /// ```compile_fail
    /// use evchan_core::{cm::PortSpace, CmId, EventChannel};
    /// let (a, b) = (EventChannel::new().unwrap(), EventChannel::new().unwrap());
    /// let listener = CmId::new(&a, PortSpace::Tcp).unwrap().listen(8).unwrap();
    /// let _ = listener.migrate(&b); // error: a listening id cannot be migrated
    /// ```
    #[doc(alias = "rdma_migrate_id")]
    pub fn migrate<'to>(self, channel: &'to EventChannel) -> Transition<'ch, S, Id<'to, S>>
    where
        S: super::state::CanMigrate,
    {
        let pending = self.raw.pending();
        match self.raw.migrate(channel.raw()) {
            Ok(raw) => Ok(Id::from_raw(raw)),
            Err((raw, e)) => {
                let error = if e.raw_os_error() == Some(libc::EBUSY) && pending > 0 {
                    Error::Busy {
                        call: "rdma_migrate_id",
                        pending,
                    }
                } else {
                    Error::os("rdma_migrate_id", e)
                };
                Err(Id::from_raw(raw).fail(error))
            }
        }
    }

    /// `rdma_destroy_id`: the same as dropping the id (deferred while its events are unacked).
    #[doc(alias = "rdma_destroy_id")]
    pub fn destroy(self) {
        drop(self);
    }

    /// `rdma_resolve_addr`: starts resolving `dst` (and `src`, if given) to an RDMA device;
    /// completes with an `ADDR_RESOLVED` or `ADDR_ERROR` event, for [`Id::addr_resolved`].
    ///
    /// # Errors
    /// The OS error of the call, with the id back.
    #[doc(alias = "rdma_resolve_addr")]
    pub fn resolve_addr(
        self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Transition<'ch, S, Id<'ch, ResolvingAddr>>
    where
        S: CanResolveAddr,
    {
        self.run("rdma_resolve_addr", |raw| {
            raw.resolve_addr(src, dst, timeout)
        })
    }

    /// `rdma_listen`: listens for connection requests (binding to any address first if the id is
    /// idle); they arrive as `CONNECT_REQUEST` events.
    ///
    /// `backlog` bounds the requests queued on the channel and not read yet; the kernel treats
    /// 0, a negative value or one above `net.rdma_ucm.max_backlog` (1024 by default) as that
    /// maximum. A request beyond the backlog is dropped without a reply, and the peer's CM sends
    /// it again only after its response timeout (about 4 s): with bursts of connections, a small
    /// backlog shows up as multi-second connect times, not as errors.
    ///
    /// # Errors
    /// The OS error (e.g. `EADDRINUSE`), with the id back.
    #[doc(alias = "rdma_listen")]
    pub fn listen(self, backlog: i32) -> Transition<'ch, S, Id<'ch, Listening>>
    where
        S: CanListen,
    {
        self.run("rdma_listen", |raw| raw.listen(backlog))
    }

    /// `rdma_cm_id::verbs`: the device context of the id.
    ///
    /// # Panics
    /// Never in practice: librdmacm guarantees a device in these states (it turns an address
    /// resolution without one into `ADDR_ERROR`).
    #[must_use]
    pub fn verbs(&self) -> ContextRef<'_>
    where
        S: HasDevice,
    {
        ContextRef::new(
            self.raw
                .verbs()
                .expect("librdmacm: an id with a device has `verbs`"),
        )
    }

    /// `rdma_cm_id::pd`: the protection domain librdmacm allocated for the id's device (used by
    /// [`Id::create_qp`]); the caller's while a QP from [`Id::create_qp_with`] lives.
    #[must_use]
    pub fn pd(&self) -> Option<PdRef<'_>>
    where
        S: HasDevice,
    {
        self.raw.pd().map(PdRef::new)
    }

    /// `rdma_cm_id::port_num`: the device port of the id.
    #[must_use]
    pub fn port_num(&self) -> u8
    where
        S: HasDevice,
    {
        self.raw.port_num()
    }

    /// The QP number, once [`Id::create_qp`] has run.
    #[must_use]
    pub fn qp_num(&self) -> Option<u32> {
        self.raw.qp_num()
    }

    /// `rdma_create_qp`: creates the id's QP (RC for TCP/IB port spaces, UD for UDP) on its PD,
    /// with completion queues librdmacm creates; the QP is destroyed with the id. With a QP,
    /// `connect`/`accept` complete with `ESTABLISHED` (without one, the active side gets
    /// `CONNECT_RESPONSE`).
    ///
    /// # Errors
    /// The OS error; `EINVAL` when the id already has a QP.
    #[doc(alias = "rdma_create_qp")]
    pub fn create_qp(&mut self, init: &QpInit) -> Result<()>
    where
        S: CanCreateQp,
    {
        if self.raw.qp_num().is_some() {
            return Err(Error::os(
                "rdma_create_qp",
                std::io::Error::from_raw_os_error(libc::EINVAL),
            ));
        }
        self.raw
            .create_qp(init.caps())
            .map_err(|e| Error::os("rdma_create_qp", e))
    }

    /// `rdma_destroy_qp`: destroys the id's QP (from [`Id::create_qp`], with the CQs
    /// librdmacm made for it, or from [`Id::create_qp_with`], on the caller's CQs, which stay)
    /// now, before the id goes, as rdma-core's own programs do after `rdma_disconnect`. The id
    /// is then as one that never had a QP: [`Id::qp_num`] is `None`, its drop destroys no QP,
    /// and in a state that allows it a new QP may be created.
    ///
    /// A destroyed QP owes no completion for the work requests still posted on it: a
    /// [`Posted`] (or `PostedSlot`) whose completion never comes keeps its buffer, which nothing
    /// can read again (as after the id's drop). Whether the QP's completions already in the
    /// caller's CQs survive the destroy is the provider's choice: rdma-core's mlx5 provider
    /// removes them, rxe (Linux 6.1) leaves them to be polled. Reap what you need first; one that
    /// is still there afterwards completes its `Posted` as before.
    ///
    /// ```no_run
    /// use evchan_core::cm::{state::Connected, Id};
    ///
    /// fn hang_up(id: Id<'_, Connected>) -> Result<(), evchan_core::Error> {
    ///     let mut id = id.disconnect().map_err(|e| e.error)?;
    ///     id.destroy_qp()?; // the QP goes now, the id once its DISCONNECTED is read
    ///     Ok(())
    /// }
    /// ```
    ///
    /// [`Posted`]: crate::verbs::Posted
    ///
    /// # Errors
    /// `EINVAL` when the id has no QP.
    #[doc(alias = "rdma_destroy_qp")]
    pub fn destroy_qp(&mut self) -> Result<()> {
        self.raw
            .destroy_qp()
            .map_err(|e| Error::os("rdma_destroy_qp", e))
    }

    /// `rdma_connect`: sends a connection request with `param` (its private data checked against
    /// the port space's limit first); completes with `ESTABLISHED`, `REJECTED`, `UNREACHABLE` or
    /// `CONNECT_ERROR`, for [`Id::established`].
    ///
    /// # Errors
    /// [`Error::PrivateDataTooLong`] before the call; the OS error of the call. The id comes back.
    #[doc(alias = "rdma_connect")]
    pub fn connect(self, param: &ConnParam<'_>) -> Transition<'ch, S, Id<'ch, Connecting>>
    where
        S: CanConnect,
    {
        self.send(Message::Connect, param.data(), "rdma_connect", |raw| {
            raw.connect(param.to_raw())
        })
    }

    /// `rdma_accept`: accepts the connection request with `param`; completes with `ESTABLISHED`,
    /// for [`Id::established`].
    ///
    /// A UDP id's request is answered with [`Id::accept_datagram`] instead: no event completes
    /// it.
    ///
    /// # Errors
    /// [`Error::WrongPortSpace`] for a UDP id and [`Error::PrivateDataTooLong`], both before the
    /// call; the OS error. The id comes back.
    #[doc(alias = "rdma_accept")]
    pub fn accept(self, param: &ConnParam<'_>) -> Transition<'ch, S, Id<'ch, Connecting>>
    where
        S: CanAccept,
    {
        if self.port_space() == PortSpace::Udp {
            return Err(self.fail(Error::WrongPortSpace {
                call: "accept",
                port_space: PortSpace::Udp,
                hint: "a UDP request is answered with `accept_datagram`, which no event completes",
            }));
        }
        self.send(Message::Accept, param.data(), "rdma_accept", |raw| {
            raw.accept(param.to_raw())
        })
    }

    /// `rdma_reject`: rejects the connection request, sending `private_data` (the peer gets
    /// `REJECTED` with reason 28 and this data), then destroys the id.
    ///
    /// # Errors
    /// [`Error::PrivateDataTooLong`] before the call; the OS error. The id comes back.
    #[doc(alias = "rdma_reject")]
    pub fn reject(self, private_data: &[u8]) -> Transition<'ch, S, ()>
    where
        S: CanAccept,
    {
        self.send::<S>(Message::Reject, private_data, "rdma_reject", |raw| {
            raw.reject(private_data)
        })
        .map(drop)
    }

    /// `rdma_disconnect`: tears the connection down; both sides get `DISCONNECTED` (and later
    /// `TIMEWAIT_EXIT` when the id has a QP).
    ///
    /// # Errors
    /// The OS error, with the id back.
    #[doc(alias = "rdma_disconnect")]
    pub fn disconnect(self) -> Transition<'ch, S, Id<'ch, Disconnected>>
    where
        S: CanDisconnect,
    {
        self.run("rdma_disconnect", RawId::disconnect)
    }

    /// Checks that `event` is `expected` for this id, else says why not.
    pub(super) fn expect_event(&self, event: &Event<'_>, expected: EventKind) -> Result<()> {
        let same_id = event.is_for(self);
        if same_id && event.kind() == expected && event.status().is_success() {
            return Ok(());
        }
        Err(UnexpectedEvent {
            expected,
            got: event.kind(),
            status: event.status(),
            same_id,
        }
        .into())
    }

    fn advance<T: State>(
        self,
        event: &Event<'_>,
        expected: EventKind,
    ) -> Transition<'ch, S, Id<'ch, T>> {
        match self.expect_event(event, expected) {
            Ok(()) => Ok(self.into_state()),
            Err(e) => Err(self.fail(e)),
        }
    }
}

impl<'ch> Id<'ch, ResolvingAddr> {
    /// Completes address resolution with its `ADDR_RESOLVED` event.
    ///
    /// # Errors
    /// [`Error::UnexpectedEvent`] for any other event (e.g. `ADDR_ERROR`, whose status says
    /// why), with the id back.
    pub fn addr_resolved(
        self,
        event: &Event<'_>,
    ) -> Transition<'ch, ResolvingAddr, Id<'ch, AddrResolved>> {
        self.advance(event, EventKind::AddrResolved)
    }
}

impl<'ch> Id<'ch, AddrResolved> {
    /// `rdma_resolve_route`: starts resolving the route; completes with `ROUTE_RESOLVED` or
    /// `ROUTE_ERROR`, for [`Id::route_resolved`].
    ///
    /// # Errors
    /// The OS error, with the id back.
    #[doc(alias = "rdma_resolve_route")]
    pub fn resolve_route(
        self,
        timeout: Duration,
    ) -> Transition<'ch, AddrResolved, Id<'ch, ResolvingRoute>> {
        self.run("rdma_resolve_route", |raw| raw.resolve_route(timeout))
    }
}

impl Id<'_, AddrResolved> {
    /// `rdma_join_multicast`: joins the multicast group `group` (a UDP id; on RoCE an IPv4
    /// group); completes with `MULTICAST_JOIN` or `MULTICAST_ERROR`. Groups still joined are
    /// left when the id is destroyed.
    ///
    /// # Errors
    /// The OS error (e.g. `EINVAL` for an id that is not UDP).
    #[doc(alias = "rdma_join_multicast")]
    pub fn join_multicast(&mut self, group: SocketAddr) -> Result<()> {
        self.raw
            .join_multicast(group)
            .map_err(|e| Error::os("rdma_join_multicast", e))
    }

    /// `rdma_leave_multicast`: leaves `group`.
    ///
    /// # Errors
    /// [`Error::Busy`] while an event of the id is unacked (the C call would wait for its ack);
    /// the OS error otherwise (`EADDRNOTAVAIL` for a group not joined).
    #[doc(alias = "rdma_leave_multicast")]
    pub fn leave_multicast(&mut self, group: SocketAddr) -> Result<()> {
        let pending = self.raw.pending();
        self.raw.leave_multicast(group).map_err(|e| {
            if e.raw_os_error() == Some(libc::EBUSY) && pending > 0 {
                Error::Busy {
                    call: "rdma_leave_multicast",
                    pending,
                }
            } else {
                Error::os("rdma_leave_multicast", e)
            }
        })
    }
}

impl<'ch> Id<'ch, ResolvingRoute> {
    /// Completes route resolution with its `ROUTE_RESOLVED` event.
    ///
    /// # Errors
    /// [`Error::UnexpectedEvent`] for any other event, with the id back.
    pub fn route_resolved(
        self,
        event: &Event<'_>,
    ) -> Transition<'ch, ResolvingRoute, Id<'ch, RouteResolved>> {
        self.advance(event, EventKind::RouteResolved)
    }
}

impl<'ch> Id<'ch, Connecting> {
    /// Completes `connect`/`accept` with its `ESTABLISHED` event.
    ///
    /// A connect without a QP completes with `CONNECT_RESPONSE` instead ([`Id::establish`]); a
    /// UDP id's with [`Id::established_datagram`].
    ///
    /// # Errors
    /// [`Error::UnexpectedEvent`] for any other event (`REJECTED` with its reject reason,
    /// `UNREACHABLE`, `CONNECT_ERROR`, …); [`Error::WrongPortSpace`] for a UDP id. The id comes
    /// back.
    pub fn established(self, event: &Event<'_>) -> Transition<'ch, Connecting, Id<'ch, Connected>> {
        if self.port_space() == PortSpace::Udp {
            return Err(self.fail(Error::WrongPortSpace {
                call: "established",
                port_space: PortSpace::Udp,
                hint: "a UDP id completes its connect with `established_datagram`",
            }));
        }
        self.advance(event, EventKind::Established)
    }
}
