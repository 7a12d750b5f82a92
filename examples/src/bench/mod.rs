//! The benchmark's parts: the run the `bench` binary makes ([`run`]), its rdma-rpc
//! measurements and the targets it checks, and baselines measured in the same run as
//! rdma-rpc, so reports are ratios on the same machine.

pub mod copy_baseline;
pub mod grpc;
pub mod machine;
pub mod measure;
mod rdma_rpc;
pub mod report;
pub mod round_trips;
pub mod run;
pub mod scale;
pub mod service;
pub mod streams;
mod targets;
pub mod tcp_baseline;
