//! Builds `csrc/layout.c` into a small static library: the layout (sizes, alignments, field
//! offsets) of the rdma-core structs evchan reads, as the installed C headers define them.
//! `src/layout.rs` compares it with rdma-sys's Rust definitions.

/// The installed headers the table is computed from. A change of rdma-core must rebuild it.
const HEADERS: &[&str] = &["infiniband/verbs.h", "rdma/rdma_cma.h"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=csrc/layout.c");
    println!("cargo:rerun-if-env-changed=EVCHAN_RDMA_INCLUDE");

    let mut build = cc::Build::new();
    build
        .file("csrc/layout.c")
        .std("c11")
        .warnings(true)
        .extra_warnings(true);

    // Headers outside the compiler's default search path (a non-system rdma-core build):
    // `EVCHAN_RDMA_INCLUDE=/opt/rdma-core/include`. The default is the system's /usr/include.
    let include = std::env::var_os("EVCHAN_RDMA_INCLUDE");
    let include_dir = match &include {
        Some(dir) => {
            build.include(dir);
            std::path::PathBuf::from(dir)
        }
        None => std::path::PathBuf::from("/usr/include"),
    };
    for header in HEADERS {
        let path = include_dir.join(header);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }

    build.compile("evchan_layout");
}
