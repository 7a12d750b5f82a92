//! The benchmark's parts (the `bench` binary is being written): baselines measured in the
//! same run as rdma-rpc, so reports are ratios on the same machine.

pub mod copy_baseline;
pub mod grpc;
pub mod measure;
pub mod report;
pub mod scale;
pub mod service;
pub mod streams;
pub mod tcp_baseline;
