//! rdma-rpc code generator (work in progress).
