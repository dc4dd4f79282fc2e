//! The compile-time guarantees of `evchan::local`, one trybuild case each, with the compiler's
//! message committed next to it (`tests/ui/*.stderr`): a `LocalConnection` or `LocalListener`
//! borrows the locals of its own future, so it can neither leave its closure nor trade places
//! with one of another future (which would tear down objects still in use). Regenerate with
//! `TRYBUILD=overwrite cargo test -p evchan --test compile_fail` after a deliberate change, and
//! read the diff.
#![forbid(unsafe_code)]

#[test]
fn misuse_does_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
