//! A storage offload application modelled on NVIDIA's DOCA storage "GGA offload" design: an
//! initiator, a service, and three storage targets (data 1, data 2, parity).
//!
//! [`codec`] is the pure, I/O-free part: it turns a block into two compressed, checksummed data
//! halves plus a Reed–Solomon parity half, and back (also from one data half plus the parity).

pub mod codec;
