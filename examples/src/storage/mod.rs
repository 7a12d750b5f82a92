//! A storage offload application modelled on NVIDIA's DOCA storage "GGA offload" design: an
//! initiator, a service, and three storage targets (data 1, data 2, parity).
//!
//! - [`codec`] is the pure, I/O-free part: it turns a block into two compressed, checksummed
//!   data halves plus a Reed–Solomon parity half, and back (also from one data half plus the
//!   parity).
//! - [`target`] keeps one kind of half in registered memory; [`service`] compresses, splits,
//!   spreads and recovers; [`initiator`] writes and reads blocks and checks them; [`cluster`]
//!   starts the three targets and the service in one process (`storage-demo`, the tests).
//!
//! Every block moves by one-sided RDMA: the service reads it from the initiator's memory and
//! writes it back there, and each target reads its half from the service's memory and writes
//! it back there, through remote buffers (`remote_buffer` fields, [`rdma_rpc_core::RemoteBuf`])
//! offered for one call. Only the requests and answers travel as messages.

pub mod cluster;
pub mod codec;
pub mod flags;
pub mod initiator;
pub mod service;
pub mod target;
