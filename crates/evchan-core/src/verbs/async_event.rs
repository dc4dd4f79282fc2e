//! Async device events.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use evchan_sys::fd::{deadline_after, poll_readable, time_left};

use crate::ffi::verbs::{self as ffi, RawElement};

use super::{Context, CqId, Error, Result};

/// One async event of a device (`ibv_get_async_event`), acked once, on
/// [`ack`](Self::ack) or drop (`ibv_ack_async_event`).
///
/// libibverbs' `ibv_destroy_cq` and `ibv_destroy_qp` wait until every async event naming the
/// object has been acked. To make that wait impossible to turn into a hang, an event naming a
/// CQ, QP, SRQ or WQ is acked as soon as it is read, after copying what identifies the object
/// ([`AsyncElement`]); port and device events are acked when the guard goes.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use evchan_core::verbs::{AsyncEventKind, Context};
///
/// # fn main() -> Result<(), evchan_core::verbs::Error> {
/// let ctx = Context::open_first()?;
/// while let Some(event) = ctx.get_async_event_timeout(Duration::from_secs(10))? {
///     match event.kind() {
///         AsyncEventKind::PortErr => eprintln!("port down: {:?}", event.element()),
///         AsyncEventKind::PortActive => eprintln!("port up: {:?}", event.element()),
///         other => eprintln!("{other:?} on {:?}", event.element()),
///     }
///     event.ack();
/// }
/// # Ok(())
/// # }
/// ```
///
/// # References
///
/// [`ibv_get_async_event(3)`](https://man7.org/linux/man-pages/man3/ibv_get_async_event.3.html)
#[doc(alias = "ibv_async_event")]
#[doc(alias = "ibv_get_async_event")]
#[doc(alias = "ibv_ack_async_event")]
#[must_use = "an async event reports a change of the device"]
pub struct AsyncEvent<'ctx> {
    raw: ffi::RawAsyncEvent,
    _ctx: PhantomData<&'ctx Context>,
}

impl AsyncEvent<'_> {
    pub(crate) fn new(raw: ffi::RawAsyncEvent) -> Self {
        Self {
            raw,
            _ctx: PhantomData,
        }
    }

    /// What happened (`event_type`).
    #[must_use]
    pub fn kind(&self) -> AsyncEventKind {
        AsyncEventKind::from_raw(self.raw.event_type())
    }

    /// What it happened to (`element`).
    #[must_use]
    pub fn element(&self) -> AsyncElement {
        match self.raw.element() {
            RawElement::Cq(t) => AsyncElement::Cq(CqId(t)),
            RawElement::Qp(n) => AsyncElement::Qp(n),
            RawElement::Srq(_) => AsyncElement::Srq,
            RawElement::Wq(_) => AsyncElement::Wq,
            RawElement::Port(p) => AsyncElement::Port(u8::try_from(p).unwrap_or(0)),
            RawElement::Device => AsyncElement::Device,
        }
    }

    /// `ibv_ack_async_event`.
    #[doc(alias = "ibv_ack_async_event")]
    pub fn ack(self) {}
}

impl fmt::Debug for AsyncEvent<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncEvent")
            .field("kind", &self.kind())
            .field("element", &self.element())
            .finish()
    }
}

/// What an [`AsyncEvent`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AsyncElement {
    /// A CQ of this process.
    Cq(CqId),
    /// A QP, by number.
    Qp(u32),
    /// A shared receive queue.
    Srq,
    /// A work queue.
    Wq,
    /// A port, by number.
    Port(u8),
    /// The whole device.
    Device,
}

macro_rules! kinds {
    ($($(#[doc = $d:literal])* $c:literal => $var:ident,)*) => {
        /// The type of an async event (`enum ibv_event_type`).
        #[doc(alias = "ibv_event_type")]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum AsyncEventKind {
            $($(#[doc = $d])* $var,)*
            /// A value this crate does not know (a newer kernel).
            Unknown(u32),
        }

        impl AsyncEventKind {
            /// From the C value; unknown values become `Unknown`.
            #[must_use]
            pub fn from_raw(v: u32) -> Self {
                match v {
                    $($c => AsyncEventKind::$var,)*
                    v => AsyncEventKind::Unknown(v),
                }
            }

            /// The C value.
            #[must_use]
            pub fn to_raw(self) -> u32 {
                match self {
                    $(AsyncEventKind::$var => $c,)*
                    AsyncEventKind::Unknown(v) => v,
                }
            }
        }
    };
}

kinds! {
    /// `IBV_EVENT_CQ_ERR`: CQ overrun.
    0 => CqErr,
    /// `IBV_EVENT_QP_FATAL`
    1 => QpFatal,
    /// `IBV_EVENT_QP_REQ_ERR`
    2 => QpReqErr,
    /// `IBV_EVENT_QP_ACCESS_ERR`
    3 => QpAccessErr,
    /// `IBV_EVENT_COMM_EST`
    4 => CommEst,
    /// `IBV_EVENT_SQ_DRAINED`
    5 => SqDrained,
    /// `IBV_EVENT_PATH_MIG`
    6 => PathMig,
    /// `IBV_EVENT_PATH_MIG_ERR`
    7 => PathMigErr,
    /// `IBV_EVENT_DEVICE_FATAL`
    8 => DeviceFatal,
    /// `IBV_EVENT_PORT_ACTIVE`: the port came up.
    9 => PortActive,
    /// `IBV_EVENT_PORT_ERR`: the port went down.
    10 => PortErr,
    /// `IBV_EVENT_LID_CHANGE`
    11 => LidChange,
    /// `IBV_EVENT_PKEY_CHANGE`
    12 => PkeyChange,
    /// `IBV_EVENT_SM_CHANGE`
    13 => SmChange,
    /// `IBV_EVENT_SRQ_ERR`
    14 => SrqErr,
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`
    15 => SrqLimitReached,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`
    16 => QpLastWqeReached,
    /// `IBV_EVENT_CLIENT_REREGISTER`
    17 => ClientReregister,
    /// `IBV_EVENT_GID_CHANGE`
    18 => GidChange,
    /// `IBV_EVENT_WQ_FATAL`
    19 => WqFatal,
}

impl Context {
    /// `ibv_get_async_event`, non-blocking: the next async event, or `Ok(None)` when none is
    /// ready (`EAGAIN` on a context opened here; on an rdma_cm id's shared context, whose fd
    /// stays blocking, a zero-timeout `poll` first — see [`CmId::context`](crate::CmId::context)).
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_get_async_event` error.
    #[doc(alias = "ibv_get_async_event")]
    pub fn try_get_async_event(&self) -> Result<Option<AsyncEvent<'_>>> {
        Ok(self
            .raw
            .get_async_event()
            .map_err(Error::io("ibv_get_async_event"))?
            .map(AsyncEvent::new))
    }

    /// `ibv_get_async_event`, blocking until an event arrives. `EINTR` is retried.
    ///
    /// # Errors
    /// As [`try_get_async_event`](Self::try_get_async_event), plus `poll` errors.
    #[doc(alias = "ibv_get_async_event")]
    pub fn get_async_event(&self) -> Result<AsyncEvent<'_>> {
        loop {
            if let Some(ev) = self.try_get_async_event()? {
                return Ok(ev);
            }
            poll_readable(self.async_fd(), None).map_err(Error::io("poll"))?;
        }
    }

    /// `ibv_get_async_event`, waiting at most `timeout`: `Ok(None)` when it expires.
    ///
    /// # Errors
    /// As [`get_async_event`](Self::get_async_event).
    #[doc(alias = "ibv_get_async_event")]
    pub fn get_async_event_timeout(&self, timeout: Duration) -> Result<Option<AsyncEvent<'_>>> {
        // No deadline (a timeout past what `Instant` represents, e.g. `Duration::MAX`): forever.
        let deadline = deadline_after(timeout);
        loop {
            if let Some(ev) = self.try_get_async_event()? {
                return Ok(Some(ev));
            }
            let left = time_left(deadline);
            if !poll_readable(self.async_fd(), left).map_err(Error::io("poll"))? {
                return Ok(None);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_and_unknown_is_a_value() {
        for v in 0..=64 {
            assert_eq!(AsyncEventKind::from_raw(v).to_raw(), v);
        }
        assert_eq!(AsyncEventKind::from_raw(10), AsyncEventKind::PortErr);
        assert_eq!(AsyncEventKind::from_raw(9), AsyncEventKind::PortActive);
        assert_eq!(AsyncEventKind::from_raw(20), AsyncEventKind::Unknown(20));
        assert_eq!(
            AsyncEventKind::from_raw(u32::MAX),
            AsyncEventKind::Unknown(u32::MAX)
        );
    }
}
