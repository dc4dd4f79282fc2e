//! QP async events, routed to their connection.
//!
//! A device reports a QP that failed outside any work request (`IBV_EVENT_QP_FATAL`,
//! `QP_REQ_ERR`, `QP_ACCESS_ERR`, `PATH_MIG_ERR`) as an async event on its context, naming the
//! QP by number. librdmacm never reads its contexts' async events, so the runtime thread reads
//! them ([`drain`], each watch interval, about 50 ms) and hands each to the connection whose
//! QP it names, which ends with `Lost::QpError`. Every runtime of the process shares
//! librdmacm's contexts, so any runtime may read an event of another's connection: the table
//! is process-wide, keyed by device name and QP number (numbers are unique per device while
//! the QP lives). An application that reads the same contexts' async events itself takes them
//! away from evchan.
//!
//! The other QP events (`COMM_EST`, `SQ_DRAINED`, `QP_LAST_WQE_REACHED`) are logged only.
//!
//! evchan-core acks a QP event as it reads it (so that no destroy waits for it): between the
//! read and the routing, the QP may be destroyed and its number given to a new QP of the
//! same device, which would then get the event. Providers hand QP numbers out in turn, so
//! that takes a whole cycle of numbers within microseconds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use evchan_core::verbs::{AsyncElement, AsyncEventKind, Context};

use crate::wire::Wire;

type Table = HashMap<(String, u32), Weak<Wire>>;

static QPS: Mutex<Option<Table>> = Mutex::new(None);

fn with_table<T>(f: impl FnOnce(&mut Table) -> T) -> T {
    let mut t = QPS.lock().unwrap_or_else(PoisonError::into_inner);
    f(t.get_or_insert_with(HashMap::new))
}

/// The QP `qp_num` of `device` is `wire`'s: its events go there.
pub(crate) fn register(device: &str, qp_num: u32, wire: &Arc<Wire>) {
    with_table(|t| t.insert((device.to_owned(), qp_num), Arc::downgrade(wire)));
}

/// `wire`'s QP is gone: its entry goes (unless a new QP of the same number took it already).
pub(crate) fn unregister(device: &str, qp_num: u32, wire: &Wire) {
    with_table(|t| {
        let key = (device.to_owned(), qp_num);
        if t.get(&key).is_some_and(|w| std::ptr::eq(w.as_ptr(), wire)) {
            t.remove(&key);
            super::trim::shrink_if_sparse(t);
        }
    });
}

/// Whether a QP event of `kind` ends its connection.
pub(crate) fn is_fatal(kind: AsyncEventKind) -> bool {
    matches!(
        kind,
        AsyncEventKind::QpFatal
            | AsyncEventKind::QpReqErr
            | AsyncEventKind::QpAccessErr
            | AsyncEventKind::PathMigErr
    )
}

/// Reads every async event queued on `ctx` (the device `name`) and routes the QP events.
pub(crate) fn drain(name: &str, ctx: &Context) {
    loop {
        let event = match ctx.try_get_async_event() {
            Ok(Some(e)) => e,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(device = name, "reading async events: {e}");
                return;
            }
        };
        let (kind, element) = (event.kind(), event.element());
        drop(event);
        tracing::debug!(device = name, ?kind, ?element, "async event");
        if let AsyncElement::Qp(qp_num) = element {
            if is_fatal(kind) && !route(name, qp_num, kind) {
                tracing::debug!(device = name, qp_num, "no connection has the QP");
            }
        }
    }
}

/// Hands a fatal event of QP `qp_num` of `device` to its connection; `false` when no
/// connection has that QP.
pub(crate) fn route(device: &str, qp_num: u32, kind: AsyncEventKind) -> bool {
    let wire = with_table(|t| t.get(&(device.to_owned(), qp_num)).and_then(Weak::upgrade));
    match wire {
        Some(wire) => {
            wire.on_qp_event(kind);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fatal_kinds() {
        for k in [
            AsyncEventKind::QpFatal,
            AsyncEventKind::QpReqErr,
            AsyncEventKind::QpAccessErr,
            AsyncEventKind::PathMigErr,
        ] {
            assert!(is_fatal(k), "{k:?}");
        }
        for k in [
            AsyncEventKind::CommEst,
            AsyncEventKind::SqDrained,
            AsyncEventKind::QpLastWqeReached,
            AsyncEventKind::Unknown(99),
        ] {
            assert!(!is_fatal(k), "{k:?}");
        }
    }
}
