// The access markers are sealed: no other crate can grant itself a new kind of access.
use evchan_core::verbs::Access;

enum Everything {}

impl Access for Everything {
    const FLAGS: u32 = 0xffff;
    const WIRE: u8 = 7;
}

fn main() {}
