//! The compile-time guarantees of both halves (rdma_cm ids and events; the verbs completion
//! channel, CQs, memory regions and QPs: `tests/ui/verbs_*.rs`), one trybuild case each, with
//! the compiler's message committed next to it (`tests/ui/*.stderr`). Each is a misuse that
//! librdmacm or libibverbs would turn into EBUSY, a hang or a use-after-free. Regenerate with
//! `TRYBUILD=overwrite cargo test -p evchan-core --test compile_fail` after a deliberate change,
//! and read the diff.
#![forbid(unsafe_code)]

#[test]
fn misuse_does_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
