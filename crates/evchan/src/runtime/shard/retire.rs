//! Device removal (see `crate::runtime::removal`): the shard fails everything it has and ends.

use evchan_core::cm::IdKey;

use super::Shard;
use crate::error::{Error, Lost};
use crate::runtime::{Cmd, ConnId};

impl Shard<'_> {
    /// `DEVICE_REMOVAL` on the id `key` (its event already acked): every runtime of the
    /// process retires, this shard at once.
    pub(super) fn on_device_removal(&mut self, key: IdKey) {
        let device = self
            .by_key
            .get(&key)
            .and_then(|conn| self.conns.get(conn))
            .and_then(|c| c.device)
            .map(|dev| self.env.names[dev].clone());
        tracing::debug!(
            ?device,
            listener = self.listener_keys.contains_key(&key),
            "DEVICE_REMOVAL"
        );
        match self.runtime() {
            Some(rt) => rt.device_removed(device.as_deref()),
            None => {
                self.env.removal.retire(device.as_deref());
            }
        }
        self.retire();
    }

    /// Fails every listener and connection of the shard with [`Lost::DeviceRemoved`] and
    /// destroys their ids, QPs and memory regions now; the shard then ends.
    pub(super) fn retire(&mut self) {
        if self.retired {
            return;
        }
        self.retired = true;
        // A listener's accept() returns ConnectionLost(DeviceRemoved) once its queue is
        // closed and empty.
        self.listener_keys.clear();
        let listeners = std::mem::take(&mut self.listeners);
        let n_listeners = listeners.len();
        drop(listeners);
        let all: Vec<ConnId> = self.conns.keys().copied().collect();
        let n_conns = all.len();
        for conn in all {
            let Some(mut c) = self.remove(conn) else {
                continue;
            };
            if let Some(reply) = c.reply.take() {
                let _ = reply.send(Err(Error::ConnectionLost(Lost::DeviceRemoved)));
            }
            self.release(c, Lost::DeviceRemoved);
        }
        // Their send slots' registrations go with them (not left for the shard's end).
        self.pools.clear();
        tracing::debug!(
            listeners = n_listeners,
            connections = n_conns,
            "shard retired after a device removal"
        );
    }
}

/// A command that reached a retired shard: what waits for an answer gets one.
pub(super) fn refuse_removed(cmd: Cmd) {
    let removed = || Error::ConnectionLost(Lost::DeviceRemoved);
    match cmd {
        Cmd::Connect(c) => drop(c.reply.send(Err(removed()))),
        Cmd::Accept { reply, .. } => drop(reply.send(Err(removed()))),
        Cmd::Listen(l) => drop(l.reply.send(Err(removed()))),
        Cmd::Close {
            reply: Some(reply), ..
        } => drop(reply.send(())),
        _ => {}
    }
}
