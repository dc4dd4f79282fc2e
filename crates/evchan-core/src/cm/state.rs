//! The states of a [`CmId`](super::Id) and the capabilities they grant.
//!
//! States are zero-sized types; transitions consume the id and return it in the new state.
//! Capabilities are sealed marker traits, so only this crate decides which state may do what.

mod sealed {
    pub trait Sealed {}
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
        impl sealed::Sealed for $name {}
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
