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
//! it back there. As in NVIDIA's application, that memory is shared and offered once per
//! connection ([`rdma_rpc_core::Share::offer_all`]: the initiator's at `init_storage`, the
//! service's at each target's `init`), and each I/O message carries a block index and
//! offsets: no I/O registers, imports, offers or revokes memory. Only the requests and answers
//! travel as messages. [`auth`] keeps each tier's calls to the tier above it.

pub mod auth;
pub mod cluster;
pub mod codec;
pub mod cores;
pub mod flags;
pub mod handles;
pub mod initiator;
pub mod service;
pub mod target;

/// Receives each storage connection (initiator to service, service to target) posts, from the
/// start and for good (`initial_receives` and `recv_credits`): room for 8 transactions in
/// flight on one connection, two frames each way. The parts know their queue depths, as
/// NVIDIA's application sizes its queues at start, so the receives (over DOCA: their
/// registered staging) are in place before the first I/O instead of growing, and registering,
/// mid-run.
pub const RECEIVES: u32 = 16;
