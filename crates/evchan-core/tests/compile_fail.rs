//! The compile-time guarantees, one trybuild case each, with the compiler's message committed
//! next to it (`tests/ui/*.stderr`). Regenerate with `TRYBUILD=overwrite` after a deliberate
//! change, and read the diff.

#[test]
fn misuse_does_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
