//! Shared code of the rdma-rpc examples: the doca-cpp endpoints as a service, an in-memory
//! implementation of it, and the demo's measuring and reporting.

pub mod bench;
pub mod buffers;
pub mod generated;
pub mod hand_written;
pub mod kv;
pub mod logging;
pub mod object_store;
pub mod report;
pub mod storage;
pub mod tls;
