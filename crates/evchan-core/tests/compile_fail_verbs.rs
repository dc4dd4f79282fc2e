//! Compile-fail cases of the verbs layer: each file in `tests/ui/verbs_*.rs` is a misuse that
//! libibverbs would turn into EBUSY, a hang or a use-after-free, and that must not compile here.
//! The expected compiler output is committed next to it (`.stderr`); regenerate with
//! `TRYBUILD=overwrite cargo test -p evchan-core --test compile_fail_verbs` after review.

#[test]
fn verbs_misuse_does_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/verbs_*.rs");
}
