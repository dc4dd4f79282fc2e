//! The erased id: any state, checked at run time.

use std::net::SocketAddr;

use super::state::{
    AddrResolved, Bound, Connected, Connecting, Datagram, Disconnected, Idle, Listening, Requested,
    ResolvingAddr, ResolvingRoute, RouteResolved, State,
};
use super::{Event, EventKind, Id, IdKey, PortSpace, TransitionError};
use crate::error::Error;

/// An [`Id`] whose state is known at run time only: the escape hatch for storing ids of mixed
/// states together, e.g. every connection of a server in one map keyed by [`IdKey`].
///
/// Any `Id<'ch, S>` converts into it ([`Id::erase`], `From`); [`AnyId::downcast`] gets the typed
/// id back, or a [`Error::WrongState`] with the `AnyId` unchanged. [`AnyId::complete`] and
/// [`AnyId::disconnect`] run the common transitions with the state checked at run time. It is
/// a struct around a private enum; match on [`AnyId::state`] or try [`AnyId::downcast`].
///
/// # Examples
///
/// ```no_run
/// use std::collections::HashMap;
/// use evchan_core::cm::{self, state::Connected, AnyId, IdKey};
/// use evchan_core::EventChannel;
///
/// # fn f(channel: &EventChannel, mut ids: HashMap<IdKey, AnyId<'_>>) -> evchan_core::Result<()> {
/// let event = channel.get_event()?;
/// if let Some(id) = ids.remove(&event.id()) {
///     // ADDR_RESOLVED, ROUTE_RESOLVED, ESTABLISHED, CONNECT_RESPONSE: the next state.
///     let id = id.complete(&event)?;
///     if id.is::<Connected>() {
///         println!("{:?} connected", id.peer_addr());
///     }
///     ids.insert(id.key(), id);
/// }
/// # Ok(())
/// # }
/// ```
///
/// # References
/// `rdma_create_id(3)`, `rdma_get_cm_event(3)`, `rdma_cm(7)`.
#[doc(alias = "rdma_cm_id")]
#[derive(Debug)]
pub struct AnyId<'ch> {
    pub(crate) inner: Inner<'ch>,
}

/// The typed id inside an [`AnyId`], one variant per state (named after it).
#[derive(Debug)]
pub(crate) enum Inner<'ch> {
    Idle(Id<'ch, Idle>),
    Bound(Id<'ch, Bound>),
    ResolvingAddr(Id<'ch, ResolvingAddr>),
    AddrResolved(Id<'ch, AddrResolved>),
    ResolvingRoute(Id<'ch, ResolvingRoute>),
    RouteResolved(Id<'ch, RouteResolved>),
    Listening(Id<'ch, Listening>),
    Requested(Id<'ch, Requested>),
    Connecting(Id<'ch, Connecting>),
    Connected(Id<'ch, Connected>),
    Datagram(Id<'ch, Datagram>),
    Disconnected(Id<'ch, Disconnected>),
}

/// Runs `$e` with `$id` bound to the typed id inside `$any`, whatever its state.
macro_rules! each {
    ($any:expr, $id:ident => $e:expr) => {
        match $any {
            Inner::Idle($id) => $e,
            Inner::Bound($id) => $e,
            Inner::ResolvingAddr($id) => $e,
            Inner::AddrResolved($id) => $e,
            Inner::ResolvingRoute($id) => $e,
            Inner::RouteResolved($id) => $e,
            Inner::Listening($id) => $e,
            Inner::Requested($id) => $e,
            Inner::Connecting($id) => $e,
            Inner::Connected($id) => $e,
            Inner::Datagram($id) => $e,
            Inner::Disconnected($id) => $e,
        }
    };
}

impl<'ch, S: State> From<Id<'ch, S>> for AnyId<'ch> {
    fn from(id: Id<'ch, S>) -> Self {
        S::into_any(id)
    }
}

impl<'ch, S: State> Id<'ch, S> {
    /// Erases the state: the id as an [`AnyId`].
    #[must_use]
    pub fn erase(self) -> AnyId<'ch> {
        self.into()
    }
}

/// The result of a run-time checked transition of an [`AnyId`].
pub type AnyTransition<'ch> = Result<AnyId<'ch>, TransitionError<AnyId<'ch>>>;

impl<'ch> AnyId<'ch> {
    /// The name of the id's state, e.g. `"Connected"` ([`State::NAME`]).
    #[must_use]
    pub fn state(&self) -> &'static str {
        fn name<S: State>(_: &Id<'_, S>) -> &'static str {
            S::NAME
        }
        each!(&self.inner, id => name(id))
    }

    /// Whether the id is in state `S`.
    #[must_use]
    pub fn is<S: State>(&self) -> bool {
        self.state() == S::NAME
    }

    /// The typed id, if it is in state `S`.
    ///
    /// # Errors
    /// [`Error::WrongState`] otherwise, with this `AnyId` back.
    pub fn downcast<S: State>(self) -> Result<Id<'ch, S>, TransitionError<AnyId<'ch>>> {
        S::from_any(self).map_err(|id| {
            let actual = id.state();
            TransitionError {
                id,
                error: Error::WrongState {
                    expected: S::NAME,
                    actual,
                },
            }
        })
    }

    /// The key that names this id in its events ([`Id::key`]).
    #[must_use]
    pub fn key(&self) -> IdKey {
        each!(&self.inner, id => id.key())
    }

    /// `rdma_cm_id::ps`: the port space ([`Id::port_space`]).
    #[must_use]
    pub fn port_space(&self) -> PortSpace {
        each!(&self.inner, id => id.port_space())
    }

    /// `rdma_get_local_addr` ([`Id::local_addr`]).
    #[doc(alias = "rdma_get_local_addr")]
    #[must_use]
    pub fn local_addr(&self) -> Option<SocketAddr> {
        each!(&self.inner, id => id.local_addr())
    }

    /// `rdma_get_peer_addr` ([`Id::peer_addr`]).
    #[doc(alias = "rdma_get_peer_addr")]
    #[must_use]
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        each!(&self.inner, id => id.peer_addr())
    }

    /// The QP number, once `rdma_create_qp` has run ([`Id::qp_num`]).
    #[must_use]
    pub fn qp_num(&self) -> Option<u32> {
        each!(&self.inner, id => id.qp_num())
    }

    /// Events counted against the id and not acked yet ([`Id::unacked_events`]).
    #[must_use]
    pub fn unacked_events(&self) -> usize {
        each!(&self.inner, id => id.unacked_events())
    }

    /// Completes the operation the id waits for with its event: `ADDR_RESOLVED`
    /// ([`Id::addr_resolved`]), `ROUTE_RESOLVED` ([`Id::route_resolved`]), and for a connecting
    /// id `ESTABLISHED` ([`Id::established`], or [`Id::established_datagram`] for a UDP id) or
    /// `CONNECT_RESPONSE` ([`Id::establish`], which calls `rdma_establish`).
    ///
    /// # Errors
    /// [`Error::WrongState`] for an id that waits for no event; the error of the typed
    /// transition otherwise (e.g. [`Error::UnexpectedEvent`] for `REJECTED`). The id comes back.
    pub fn complete(self, event: &Event<'_>) -> AnyTransition<'ch> {
        match self.inner {
            Inner::ResolvingAddr(id) => lift(id.addr_resolved(event)),
            Inner::ResolvingRoute(id) => lift(id.route_resolved(event)),
            Inner::Connecting(id) if id.port_space() == PortSpace::Udp => {
                lift(id.established_datagram(event).map(|(id, _)| id))
            }
            Inner::Connecting(id) if event.kind() == EventKind::ConnectResponse => {
                lift(id.establish(event))
            }
            Inner::Connecting(id) => lift(id.established(event)),
            inner => AnyId { inner }
                .wrong_state("ResolvingAddr, ResolvingRoute or Connecting (waiting for an event)"),
        }
    }

    fn wrong_state(self, expected: &'static str) -> AnyTransition<'ch> {
        let actual = self.state();
        Err(TransitionError {
            id: self,
            error: Error::WrongState { expected, actual },
        })
    }

    /// `rdma_disconnect` of a connecting or connected id ([`Id::disconnect`]).
    ///
    /// # Errors
    /// [`Error::WrongState`] in any other state; the OS error. The id comes back.
    #[doc(alias = "rdma_disconnect")]
    pub fn disconnect(self) -> AnyTransition<'ch> {
        match self.inner {
            Inner::Connecting(id) => lift(id.disconnect()),
            Inner::Connected(id) => lift(id.disconnect()),
            inner => AnyId { inner }.wrong_state("Connecting or Connected"),
        }
    }
}

/// A typed transition's result, erased.
fn lift<'ch, S: State, T: State>(
    r: Result<Id<'ch, T>, TransitionError<Id<'ch, S>>>,
) -> AnyTransition<'ch> {
    r.map(Into::into).map_err(|e| e.map_id(Into::into))
}
