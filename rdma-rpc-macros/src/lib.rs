//! rdma-rpc procedural macros (work in progress).
