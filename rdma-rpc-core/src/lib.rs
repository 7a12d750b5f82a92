//! rdma-rpc runtime (work in progress).
