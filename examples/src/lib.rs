//! Shared code of the rdma-rpc examples.
