// An atomic view of an exposed word cannot outlive the exposure: the revocation takes the
// region by value, so no view of it is left when its bytes become a plain slice.
use std::sync::atomic::Ordering;
use evchan_core::verbs::{Exposed, OwnedPd, RemoteAtomic};

fn keep(pd: &OwnedPd) {
    let exposed = Exposed::<RemoteAtomic>::new(pd, 64).unwrap();
    let word = exposed.atomic_u64(0).unwrap();
    let mut mine = exposed.revoke().unwrap();
    mine[0] = 1;
    word.store(2, Ordering::Relaxed);
}

fn main() {}
