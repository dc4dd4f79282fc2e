//! Shared by the benchmarks: the device check and criterion's setup.
//!
//! Every figure is a ratio: each benchmark group measures the safe layer (`evchan`) and a raw-FFI
//! baseline (`raw`) of the same work, on the same machine, in the same run. Under the VM's TCG
//! emulation absolute times mean nothing; the ratios hold. `cargo xtask bench` runs them there
//! and prints the table.

use criterion::Criterion;

/// Whether `EVCHAN_REQUIRE_DEVICE=1`: a missing device fails the benchmark instead of skipping it.
fn device_required() -> bool {
    std::env::var("EVCHAN_REQUIRE_DEVICE").is_ok_and(|v| v == "1")
}

/// `true` when an RDMA device is there. Without one: prints the skip line and returns `false`
/// (the benchmark then exits 0), or, under `EVCHAN_REQUIRE_DEVICE=1`, exits with status 1.
pub fn device_present() -> bool {
    match evchan_core::device::probe() {
        Ok(_) => true,
        Err(e) if device_required() => {
            eprintln!("EVCHAN_REQUIRE_DEVICE=1 but {e}");
            std::process::exit(1);
        }
        Err(_) => {
            eprintln!("skipping: no RDMA device (run `cargo xtask bench`)");
            false
        }
    }
}

/// Criterion, configured from the command line (`cargo bench -- --help` lists the options).
pub fn criterion() -> Criterion {
    Criterion::default().configure_from_args()
}
