//! The block codec of the storage offload application: pure and I/O-free. It keeps no state
//! of its own besides per-thread working space reused from block to block.
//!
//! A block of at most `B` bytes (the block size, even, given at run time) is
//!
//! 1. LZ4-compressed (block format); when that does not make it smaller it is stored raw,
//! 2. prefixed with a [`HEADER_LEN`]-byte metadata header,
//! 3. cut into two *shards* of `L` bytes each (header and payload, zero-padded),
//! 4. protected by a third, parity shard, `data 1 shard ⊕ data 2 shard`: the recovery shard
//!    of the Reed–Solomon code of `reed-solomon-simd` 3 with 2 original shards and 1 recovery
//!    shard, which for that shape is XOR (the tests prove it against the library),
//! 5. and each of the three shards gets a [`TRAILER_LEN`]-byte trailer with its identity and
//!    its CRC32, making the three *halves* `data 1`, `data 2` and `parity` that the three
//!    storage targets keep.
//!
//! All three halves have the same size `S` = [`stored_half_size`]`(B)`:
//!
//! ```text
//! S(B) = round_up(B/2 + HEADER_LEN/2 + TRAILER_LEN, 64) = round_up(B/2 + 48, 64)
//! L(B) = S(B) - TRAILER_LEN                               = S(B) - 32
//! ```
//!
//! so `2·L ≥ HEADER_LEN + B` holds any block, compressible or not (an incompressible block is
//! stored raw, so the payload never exceeds `B`). `S` is a multiple of 64 (a cache line; friendly
//! to RDMA and to storage alignment) and `L ≡ 32 (mod 64)` is even, so a shard is one that
//! `reed-solomon-simd` 3 takes (non-zero, even length; it pads to 64 internally).
//! For `B` = 4 KiB, `S` = 2112; for `B` = 1 MiB, `S` = 524 352.
//!
//! # Format, version 1 (all integers little-endian)
//!
//! The *stream* is `data 1 shard ‖ data 2 shard` (`2·L` bytes): the header, the payload, then
//! zeros. The parity shard is the two data shards XORed byte by byte.
//!
//! | stream offset | size | header field                                         |
//! |---------------|------|------------------------------------------------------|
//! | 0             | 4    | magic `GGAB`                                         |
//! | 4             | 1    | format version (1)                                   |
//! | 5             | 1    | flags: bit 0 set = payload is LZ4, clear = raw       |
//! | 6             | 2    | reserved, zero                                       |
//! | 8             | 8    | block index                                          |
//! | 16            | 4    | original block length                                |
//! | 20            | 4    | stored payload length                                |
//! | 24            | 4    | CRC32 of the original block (end-to-end check)       |
//! | 28            | 4    | reserved, zero                                       |
//! | 32            | …    | payload                                              |
//!
//! Every half is `shard (L bytes) ‖ trailer (32 bytes)`:
//!
//! | trailer offset | size | field                                               |
//! |----------------|------|-----------------------------------------------------|
//! | 0              | 1    | format version (1)                                  |
//! | 1              | 1    | slot: 1 = data 1, 2 = data 2, 3 = parity            |
//! | 2              | 2    | reserved, zero                                      |
//! | 4              | 4    | shard length `L`                                    |
//! | 8              | 8    | block index                                         |
//! | 12+4·k         | 4    | CRC32 of the data 1, data 2, parity shard (k=1,2,3) |
//! | 28             | 4    | CRC32 of bytes `0 .. S-4` of this half              |
//!
//! The last field protects the half; slot and index say which half of which block it is, so a
//! half read from the wrong block or the wrong target is refused. The three shard checksums
//! (the *group*) are the same in all three halves of one write: two halves whose groups differ
//! come from different writes of the block (say a stale target) and are refused, and a shard
//! rebuilt from parity is checked against the checksum the group records for it.
//!
//! Bytes given to [`decode`] and [`recover`] may come from the network: every malformed input
//! gives a [`CodecError`], never a panic.
//!
//! # Two interfaces
//!
//! The [`Codec`] trait works in the caller's memory: [`Codec::encode_into`] writes the three
//! halves into buffers the caller provides (the service's registered memory, that the targets
//! read by RDMA), and [`Codec::decode_into`] / [`Codec::recover_into`] write the block into
//! the caller's buffer (that the service writes to the initiator by RDMA). [`CpuCodec`]
//! implements it on the CPU; a hardware offload (compression, erasure coding) can implement it
//! later, and must keep the byte format.
//!
//! The free functions [`encode`], [`decode`], [`recover`] and [`rebuild_half`] do the same work
//! and return new buffers. Both interfaces run the same code and write the same bytes.
//!
//! # Allocation
//!
//! Each thread keeps a scratch space that every call reuses: a buffer for the LZ4 output when
//! encoding, which also makes an LZ4 payload that spans both data shards contiguous when
//! decoding (both grow to `1.1·B + 20` bytes at most), and a shard (`L` bytes) where a
//! recovery read rebuilds the lost data shard. The parity itself is written straight into the
//! parity half. LZ4's hash table lives on the stack (`lz4_flex` without `alloc`). So:
//!
//! - [`CpuCodec`]'s methods allocate nothing per block once the thread has coded a block of
//!   the codec's size (its first call, or the first after a larger block size, grows the
//!   scratch); a failure allocates its [`CodecError`]'s message where the variant has one.
//!   The scratch is freed when the thread exits.
//! - [`encode`] allocates the three halves, each once, at its final size; [`decode`] and
//!   [`recover`] the block, at its length; [`rebuild_half`] the half.
//! - Should a codec run inside another on the same thread (no caller does), or while the
//!   thread exits, it gets a fresh scratch, allocated for that call.

mod cpu;
mod erasure;
mod error;
mod format;
mod read;
mod scratch;
mod slot;
mod write;

pub mod baseline;

#[cfg(test)]
mod tests;

pub use cpu::CpuCodec;
pub use error::CodecError;
pub use slot::{Half, Slot};

use std::fmt;

use format::{geometry, seal};
use scratch::Scratch;

/// Size of the metadata header at the start of the stream.
pub const HEADER_LEN: usize = 32;
/// Size of the trailer at the end of every half.
pub const TRAILER_LEN: usize = 32;
/// Every half's size is a multiple of this.
pub const HALF_ALIGN: usize = 64;
/// The largest block size accepted (lengths are stored as 32-bit integers).
pub const MAX_BLOCK_SIZE: usize = 1 << 30;
/// The format version written in every header and trailer.
pub const FORMAT_VERSION: u8 = 1;

/// A block codec that works in the caller's memory: the CPU one ([`CpuCodec`]) or, later, a
/// hardware offload. Every implementation writes and reads the format of the
/// [module docs](self), byte for byte, so that halves written by one are read by any other.
///
/// Buffers of the wrong size give a [`CodecError`], never a panic, and so do halves that are
/// not what they should be (they may come from the network). When a method fails, the bytes
/// it was given to write are unspecified.
pub trait Codec: Send + Sync + fmt::Debug + 'static {
    /// Largest block it encodes.
    fn block_size(&self) -> usize;

    /// Bytes of each of the three halves (`stored_half_size(block_size)`).
    fn half_size(&self) -> usize;

    /// Encodes block `index` into `halves` (data 1, data 2, parity), each exactly
    /// `half_size()` bytes; returns the compressed payload length (the block's own length when
    /// stored raw).
    ///
    /// Every byte of the halves is written. Fails with [`CodecError::BlockTooLarge`] for a
    /// block longer than `block_size()` and [`CodecError::WrongBufferLength`] for a half of
    /// another size.
    fn encode_into(
        &self,
        index: u64,
        block: &[u8],
        halves: [&mut [u8]; 3],
    ) -> Result<usize, CodecError>;

    /// Decodes block `index` from its two data halves into `out` (at least `block_size()`
    /// bytes); returns the block's length.
    ///
    /// Checks what [`decode`] checks; a shorter `out` gives [`CodecError::OutputTooSmall`].
    fn decode_into(
        &self,
        index: u64,
        data1: &[u8],
        data2: &[u8],
        out: &mut [u8],
    ) -> Result<usize, CodecError>;

    /// Rebuilds block `index` from one data half (`surviving_is` says which) and the parity,
    /// into `out` (at least `block_size()` bytes); returns its length.
    ///
    /// Checks what [`recover`] checks; a shorter `out` gives [`CodecError::OutputTooSmall`].
    fn recover_into(
        &self,
        index: u64,
        surviving: &[u8],
        surviving_is: Half,
        parity: &[u8],
        out: &mut [u8],
    ) -> Result<usize, CodecError>;
}

/// The three halves of an encoded block, each exactly [`stored_half_size`] bytes, and what the
/// compression achieved.
#[derive(Clone, PartialEq, Eq)]
pub struct Encoded {
    /// The data 1 half.
    pub data1: Vec<u8>,
    /// The data 2 half.
    pub data2: Vec<u8>,
    /// The parity half.
    pub parity: Vec<u8>,
    /// Length of the block given to [`encode`].
    pub original_len: usize,
    /// Length of the stored payload: the LZ4 output, or `original_len` when the block is stored
    /// raw.
    pub compressed_len: usize,
    /// Whether the payload is LZ4 (false: compression did not make the block smaller, it is
    /// stored raw).
    pub compressed: bool,
}

impl Encoded {
    /// `original_len / compressed_len`: above 1 when compression helped, 1 for a raw block
    /// (and for an empty one).
    pub fn ratio(&self) -> f64 {
        if self.compressed_len == 0 {
            1.0
        } else {
            self.original_len as f64 / self.compressed_len as f64
        }
    }

    /// The given data half.
    pub fn half(&self, half: Half) -> &[u8] {
        match half {
            Half::Data1 => &self.data1,
            Half::Data2 => &self.data2,
        }
    }
}

impl fmt::Debug for Encoded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Encoded")
            .field("data1_len", &self.data1.len())
            .field("data2_len", &self.data2.len())
            .field("parity_len", &self.parity.len())
            .field("original_len", &self.original_len)
            .field("compressed_len", &self.compressed_len)
            .field("compressed", &self.compressed)
            .finish()
    }
}

/// `S(B)`: the size of every stored half (data 1, data 2 and parity) for block size `B`:
/// `round_up(B/2 + 48, 64)`. Fails with [`CodecError::BadBlockSize`] unless `B` is even and in
/// `2..=`[`MAX_BLOCK_SIZE`].
pub fn stored_half_size(block_size: usize) -> Result<usize, CodecError> {
    geometry(block_size).map(|g| g.half)
}

/// Encodes block number `index` into its three halves.
///
/// The block may be shorter than `block_size` (its length is kept); a longer one is refused.
pub fn encode(index: u64, block: &[u8], block_size: usize) -> Result<Encoded, CodecError> {
    let g = geometry(block_size)?;
    let [mut data1, mut data2, mut parity] = [(); 3].map(|()| vec![0u8; g.half]);
    let stored = Scratch::with(|scratch| {
        let halves = [&mut data1[..], &mut data2[..], &mut parity[..]];
        write::encode_into(index, block, g, halves, scratch)
    })?;
    Ok(Encoded {
        data1,
        data2,
        parity,
        original_len: block.len(),
        compressed_len: stored.payload_len,
        compressed: stored.compressed,
    })
}

/// Decodes block number `index` from its two data halves: checks both (length, checksum, slot,
/// block index, same write), reassembles the stream, decompresses (or copies) the payload, and
/// checks its length and checksum.
pub fn decode(
    index: u64,
    data1: &[u8],
    data2: &[u8],
    block_size: usize,
) -> Result<Vec<u8>, CodecError> {
    let g = geometry(block_size)?;
    let (s1, s2) = read::open(index, data1, data2, g)?;
    Scratch::with(|scratch| read::unpack_to_vec(index, s1, s2, g, &mut scratch.lz4))
}

/// The recovery read: decodes block number `index` from one data half (`surviving`, which is
/// `surviving_is`) and the parity half, rebuilding the missing data half's shard from them.
///
/// Checks the surviving half and the parity (length, checksum, slot, block index, same
/// write), checks the rebuilt half against the checksum both record for it, then decodes as
/// [`decode`] does.
pub fn recover(
    index: u64,
    surviving: &[u8],
    surviving_is: Half,
    parity: &[u8],
    block_size: usize,
) -> Result<Vec<u8>, CodecError> {
    let g = geometry(block_size)?;
    Scratch::with(|scratch| {
        let Scratch { lz4, rebuilt } = scratch;
        let shard = Scratch::grown(rebuilt, g.shard);
        let (s1, s2) =
            read::rebuild(index, surviving, surviving_is, parity, g, shard)?.stream(shard);
        read::unpack_to_vec(index, s1, s2, g, lz4)
    })
}

/// Rebuilds the missing data half (`surviving_is.other()`) of block `index`, byte for byte as
/// [`encode`] wrote it, from the other data half and the parity, with the checks of
/// [`recover`]. This is what a replaced data target is repaired with.
pub fn rebuild_half(
    index: u64,
    surviving: &[u8],
    surviving_is: Half,
    parity: &[u8],
    block_size: usize,
) -> Result<Vec<u8>, CodecError> {
    let g = geometry(block_size)?;
    let mut half = vec![0u8; g.half];
    let shard = &mut half[..g.shard];
    let rebuilt = read::rebuild(index, surviving, surviving_is, parity, g, shard)?;
    let slot = rebuilt.half.into();
    seal(&mut half, rebuilt.hasher, slot, index, g, &rebuilt.group);
    Ok(half)
}
