//! The states of a [`CmId`](super::Id) and the capabilities they grant.
//!
//! States are zero-sized types; transitions consume the id and return it in the new state.
//! Capabilities are sealed marker traits, so only this crate decides which state may do what.

mod sealed {
    use crate::cm::{AnyId, Id};

    /// Seals [`State`](super::State) and converts between an [`Id`] and an [`AnyId`].
    pub trait Sealed: Sized {
        fn into_any<'ch>(id: Id<'ch, Self>) -> AnyId<'ch>
        where
            Self: super::State;
        fn from_any<'ch>(any: AnyId<'ch>) -> Result<Id<'ch, Self>, AnyId<'ch>>
        where
            Self: super::State;
    }
}

/// A state of a [`CmId`](super::Id). Sealed.
pub trait State: sealed::Sealed + std::fmt::Debug + Send + 'static {
    /// The state's name, for messages.
    const NAME: &'static str;
}

macro_rules! states {
    ($($(#[$m:meta])* $name:ident,)*) => {$(
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name;
        impl sealed::Sealed for $name {
            fn into_any<'ch>(id: crate::cm::Id<'ch, Self>) -> crate::cm::AnyId<'ch> {
                crate::cm::AnyId {
                    inner: crate::cm::any::Inner::$name(id),
                }
            }
            fn from_any<'ch>(
                any: crate::cm::AnyId<'ch>,
            ) -> Result<crate::cm::Id<'ch, Self>, crate::cm::AnyId<'ch>> {
                match any.inner {
                    crate::cm::any::Inner::$name(id) => Ok(id),
                    inner => Err(crate::cm::AnyId { inner }),
                }
            }
        }
        impl State for $name {
            const NAME: &'static str = stringify!($name);
        }
    )*};
}

states! {
    /// Created by `rdma_create_id`; nothing else done yet.
    Idle,
    /// Bound to a local address (`rdma_bind_addr`).
    Bound,
    /// `rdma_resolve_addr` called; waiting for `ADDR_RESOLVED` or `ADDR_ERROR`.
    ResolvingAddr,
    /// The destination address is resolved: the id has a device, a port and a PD.
    AddrResolved,
    /// `rdma_resolve_route` called; waiting for `ROUTE_RESOLVED` or `ROUTE_ERROR`.
    ResolvingRoute,
    /// The route is resolved: the id may connect.
    RouteResolved,
    /// Listening (`rdma_listen`); connection requests arrive as `CONNECT_REQUEST` events.
    Listening,
    /// A passive id handed over by a `CONNECT_REQUEST`: accept or reject it.
    Requested,
    /// `rdma_connect` or `rdma_accept` called; waiting for `ESTABLISHED` (or a failure).
    Connecting,
    /// The connection is established.
    Connected,
    /// A UDP (UD) id whose service ID resolution (SIDR) is done: the active side got the peer's
    /// QP number, QKey and address vector with `ESTABLISHED`; the passive side answered with
    /// `rdma_accept`. There is no connection to tear down: drop the id when done.
    Datagram,
    /// `rdma_disconnect` called.
    Disconnected,
}

/// States that may resolve an address.
#[diagnostic::on_unimplemented(
    message = "`resolve_addr` needs an idle or bound id, not one in state `{Self}`",
    label = "this id is past address resolution",
    note = "create a new id with `CmId::new` for another resolution"
)]
pub trait CanResolveAddr: State {}
impl CanResolveAddr for Idle {}
impl CanResolveAddr for Bound {}

/// States that may listen.
#[diagnostic::on_unimplemented(
    message = "`listen` needs an idle or bound id, not one in state `{Self}`",
    label = "a connecting, resolving or connected id cannot listen",
    note = "listen on a fresh id: `CmId::new(&channel, ..)?.bind(addr)?.listen(backlog)`"
)]
pub trait CanListen: State {}
impl CanListen for Idle {}
impl CanListen for Bound {}

/// States that may connect.
#[diagnostic::on_unimplemented(
    message = "`connect` needs the route resolved, but the id is in state `{Self}`",
    label = "the route of this id is not resolved",
    note = "call `resolve_route` and pass its ROUTE_RESOLVED event to `route_resolved` first"
)]
pub trait CanConnect: State {}
impl CanConnect for RouteResolved {}

/// States that may accept or reject.
#[diagnostic::on_unimplemented(
    message = "`accept` and `reject` are for a passive id from a CONNECT_REQUEST, not for an id in state `{Self}`",
    label = "not an incoming connection request",
    note = "take the new id out of the CONNECT_REQUEST event with `Event::take_request`"
)]
pub trait CanAccept: State {}
impl CanAccept for Requested {}

/// States with a device (after address resolution), so a QP can be created.
#[diagnostic::on_unimplemented(
    message = "the id in state `{Self}` has no device yet",
    label = "no device before address resolution",
    note = "resolve the address (ADDR_RESOLVED) or take the id from a CONNECT_REQUEST first"
)]
pub trait HasDevice: State {}
impl HasDevice for AddrResolved {}
impl HasDevice for ResolvingRoute {}
impl HasDevice for RouteResolved {}
impl HasDevice for Requested {}
impl HasDevice for Connecting {}
impl HasDevice for Connected {}
impl HasDevice for Datagram {}
impl HasDevice for Disconnected {}

/// States that may create their QP (before connecting or accepting).
#[diagnostic::on_unimplemented(
    message = "`create_qp` is for an id with a device that has not connected yet, not state `{Self}`",
    label = "create the QP before `connect` / `accept`"
)]
pub trait CanCreateQp: HasDevice {}
impl CanCreateQp for AddrResolved {}
impl CanCreateQp for RouteResolved {}
impl CanCreateQp for Requested {}

/// States that may disconnect.
#[diagnostic::on_unimplemented(
    message = "`disconnect` needs a connecting or connected id, not one in state `{Self}`",
    label = "nothing to disconnect"
)]
pub trait CanDisconnect: State {}
impl CanDisconnect for Connecting {}
impl CanDisconnect for Connected {}

/// States that may be migrated to another channel: every state but [`Listening`].
///
/// A listening id cannot be migrated, because a `CONNECT_REQUEST` queued for it and not yet
/// read would be lost. The kernel makes the new connection's context on the listener's file
/// when the request arrives (`ucma_connect_event_handler`: `ucma_alloc_ctx(listen_ctx->file)`)
/// and `ucma_migrate_id` moves the queued request to the new file but leaves that context on
/// the old one; librdmacm then makes the new id on the listener's *new* channel, its first
/// query (`ucma_query_req_info`) is refused by the kernel (`EINVAL`: the context belongs to
/// another file), and `rdma_get_cm_event` drops the request and reads on. The peer is never
/// answered. Whether a request is queued cannot be known before the migrate (one may arrive
/// during it), so the migrate is refused for every listening id: make the listener on the
/// channel it is to use, or migrate the ids its requests hand over (state [`Requested`]).
#[diagnostic::on_unimplemented(
    message = "a listening id cannot be migrated (a queued CONNECT_REQUEST would be lost)",
    label = "this id listens",
    note = "listen on the channel the requests should arrive on, or migrate the new ids taken from them"
)]
pub trait CanMigrate: State {}
impl CanMigrate for Idle {}
impl CanMigrate for Bound {}
impl CanMigrate for ResolvingAddr {}
impl CanMigrate for AddrResolved {}
impl CanMigrate for ResolvingRoute {}
impl CanMigrate for RouteResolved {}
impl CanMigrate for Requested {}
impl CanMigrate for Connecting {}
impl CanMigrate for Connected {}
impl CanMigrate for Datagram {}
impl CanMigrate for Disconnected {}
