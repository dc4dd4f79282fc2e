//! Layout checks of the C structs evchan reads, against the installed rdma-core headers.
