// Memory exposed to peers shows no slice: the peer's device may write it at any moment.
use evchan_core::verbs::{Exposed, OwnedPd, RemoteWrite};

fn peek(pd: &OwnedPd) {
    let exposed = Exposed::<RemoteWrite>::new(pd, 64).unwrap();
    let bytes: &[u8] = &exposed[..];
    println!("{bytes:?}");
}

fn main() {}
