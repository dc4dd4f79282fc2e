//! rdma-sys's Rust definitions against the installed rdma-core headers: one test per C type
//! evchan reads (see `evchan_sys::layout` for why).

use std::collections::BTreeSet;

use evchan_sys::layout::{self, Entry, Mismatch, Side};

/// Every C type the tables cover; each has its test below.
const TYPES: &[&str] = &[
    "rdma_event_channel",
    "rdma_cm_event",
    "rdma_conn_param",
    "rdma_ud_param",
    "rdma_cm_id",
    "rdma_route",
    "rdma_addr",
    "rdma_ib_addr",
    "ibv_gid",
    "ibv_global_route",
    "ibv_ah_attr",
    "ibv_wc",
    "ibv_async_event",
    "ibv_gid_entry",
    "ibv_pd",
    "ibv_mr",
    "ibv_comp_channel",
    "ibv_cq",
    "ibv_qp",
    "ibv_qp_cap",
    "ibv_qp_init_attr",
    "ibv_sge",
    "ibv_recv_wr",
    "ibv_send_wr",
    "ibv_mw_bind_info",
    "ibv_context",
    "ibv_port_attr",
    "ibv_device_attr",
    "rdma_cm_event_type",
    "rdma_port_space",
    "ibv_event_type",
    "ibv_wc_status",
    "ibv_wc_opcode",
    "ibv_wr_opcode",
    "ibv_qp_type",
    "ibv_qp_state",
    "ibv_port_state",
    "ibv_mtu",
];

/// Asserts that the C headers and rdma-sys agree on `type_name`, and that the type is really
/// checked (a misspelt name must not pass vacuously).
#[track_caller]
fn assert_layout(type_name: &str) {
    let c: Vec<Entry> = layout::c_layout()
        .filter(|e| e.type_name == type_name)
        .collect();
    assert!(
        c.iter().any(|e| e.check == format!("sizeof({type_name})")),
        "{type_name}: not in the C table (csrc/layout.c)"
    );
    assert!(
        layout::rust_layout()
            .iter()
            .any(|e| e.type_name == type_name),
        "{type_name}: not in the Rust table (src/layout.rs)"
    );
    let bad: Vec<String> = layout::mismatches()
        .iter()
        .filter(|m| m.type_name() == type_name)
        .map(ToString::to_string)
        .collect();
    assert!(
        bad.is_empty(),
        "layout of `{type_name}` differs between the installed C headers and rdma-sys \
         ({} checks):\n  {}",
        c.len(),
        bad.join("\n  ")
    );
}

macro_rules! layout_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                assert_layout(stringify!($name));
            }
        )*

        /// `TYPES` lists exactly the types that have a test here.
        #[test]
        fn every_listed_type_has_a_test() {
            let tested: BTreeSet<&str> = [$(stringify!($name)),*].into_iter().collect();
            let listed: BTreeSet<&str> = TYPES.iter().copied().collect();
            assert_eq!(tested, listed);
        }
    };
}

layout_tests! {
    rdma_event_channel,
    rdma_cm_event,
    rdma_conn_param,
    rdma_ud_param,
    rdma_cm_id,
    rdma_route,
    rdma_addr,
    rdma_ib_addr,
    ibv_gid,
    ibv_global_route,
    ibv_ah_attr,
    ibv_wc,
    ibv_async_event,
    ibv_gid_entry,
    ibv_pd,
    ibv_mr,
    ibv_comp_channel,
    ibv_cq,
    ibv_qp,
    ibv_qp_cap,
    ibv_qp_init_attr,
    ibv_sge,
    ibv_recv_wr,
    ibv_send_wr,
    ibv_mw_bind_info,
    ibv_context,
    ibv_port_attr,
    ibv_device_attr,
    rdma_cm_event_type,
    rdma_port_space,
    ibv_event_type,
    ibv_wc_status,
    ibv_wc_opcode,
    ibv_wr_opcode,
    ibv_qp_type,
    ibv_qp_state,
    ibv_port_state,
    ibv_mtu,
}

/// No type in either table escapes the per-type tests above.
#[test]
fn every_type_in_the_tables_is_tested() {
    let listed: BTreeSet<&str> = TYPES.iter().copied().collect();
    let c: BTreeSet<&str> = layout::c_layout().map(|e| e.type_name).collect();
    let rust: BTreeSet<&str> = layout::rust_layout().iter().map(|e| e.type_name).collect();
    assert_eq!(c, listed, "types in csrc/layout.c vs TYPES");
    assert_eq!(rust, listed, "types in src/layout.rs vs TYPES");
}

/// Every C entry has a Rust counterpart and vice versa, nothing is listed twice, and all agree.
#[test]
fn whole_table_matches() {
    let all: Vec<String> = layout::mismatches()
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(all.is_empty(), "layout mismatches:\n  {}", all.join("\n  "));
    let c = layout::c_layout().count();
    assert_eq!(c, layout::rust_layout().len());
    assert!(c > 400, "only {c} checks; the C table looks truncated");
}

/// Each kind of check is present for a field the core relies on.
#[test]
fn c_table_has_every_kind_of_check() {
    for check in [
        "sizeof(rdma_cm_event)",
        "alignof(rdma_cm_event)",
        "offsetof(rdma_cm_event, param.ud)",
        "sizeof(rdma_cm_event.status)",
        "offsetof(ibv_wc, imm_data)",
    ] {
        assert!(
            layout::c_value(check).is_some(),
            "{check} missing from the C table"
        );
    }
    assert_eq!(layout::c_value("sizeof(rdma_cm_event.status)"), Some(4));
    assert_eq!(layout::c_value("sizeof(no_such_type)"), None);
}

fn entry(check: &'static str, value: usize) -> Entry {
    Entry {
        type_name: "t",
        check,
        value,
    }
}

/// The comparison itself reports a wrong value, a missing entry on either side and a
/// duplicate, with a message naming the check and both values.
#[test]
fn compare_reports_every_kind_of_mismatch() {
    let c = [
        entry("sizeof(t)", 16),
        entry("offsetof(t, a)", 0),
        entry("offsetof(t, b)", 8),
        entry("offsetof(t, only_c)", 12),
    ];
    let rust = [
        entry("sizeof(t)", 16),
        entry("offsetof(t, a)", 0),
        entry("offsetof(t, b)", 4),
        entry("offsetof(t, only_rust)", 12),
        entry("offsetof(t, a)", 0),
    ];
    let found = layout::compare(c, rust);
    assert_eq!(
        found,
        [
            Mismatch::Duplicate {
                type_name: "t",
                check: "offsetof(t, a)",
                side: Side::Rust
            },
            Mismatch::Differs {
                type_name: "t",
                check: "offsetof(t, b)",
                c: 8,
                rust: 4
            },
            Mismatch::Missing {
                type_name: "t",
                check: "offsetof(t, only_c)",
                present_in: Side::C,
                value: 12
            },
            Mismatch::Missing {
                type_name: "t",
                check: "offsetof(t, only_rust)",
                present_in: Side::Rust,
                value: 12
            },
        ]
    );
    assert_eq!(
        found[1].to_string(),
        "offsetof(t, b): C headers say 8, rdma-sys says 4"
    );
    assert!(layout::compare(c, c).is_empty());
}

/// A deliberately wrong expectation against the real C table is caught.
#[test]
fn compare_catches_a_wrong_rust_value() {
    let mut rust = layout::rust_layout();
    let status = rust
        .iter_mut()
        .find(|e| e.check == "offsetof(rdma_cm_event, status)")
        .expect("the Rust table checks rdma_cm_event.status");
    status.value += 4;
    let found = layout::compare(layout::c_layout(), rust);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].check(), "offsetof(rdma_cm_event, status)");
    let c = layout::c_value("offsetof(rdma_cm_event, status)").unwrap();
    let expected = Mismatch::Differs {
        type_name: "rdma_cm_event",
        check: "offsetof(rdma_cm_event, status)",
        c,
        rust: c + 4,
    };
    assert_eq!(found[0], expected);
}

/// Dropping a Rust entry is reported, so no C entry can go silently unchecked.
#[test]
fn compare_catches_an_unchecked_c_entry() {
    let mut rust = layout::rust_layout();
    rust.retain(|e| e.check != "offsetof(ibv_wc, dlid_path_bits)");
    let value = layout::c_value("offsetof(ibv_wc, dlid_path_bits)").unwrap();
    let found = layout::compare(layout::c_layout(), rust);
    assert_eq!(
        found,
        [Mismatch::Missing {
            type_name: "ibv_wc",
            check: "offsetof(ibv_wc, dlid_path_bits)",
            present_in: Side::C,
            value,
        }]
    );
}
