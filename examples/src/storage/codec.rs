//! The block codec of the storage offload application: pure and I/O-free; it keeps no state
//! of its own (`reed-solomon-simd` builds its Galois-field tables once per process).
//!
//! A block of at most `B` bytes (the block size, even, given at run time) is
//!
//! 1. LZ4-compressed (block format); when that does not make it smaller it is stored raw,
//! 2. prefixed with a [`HEADER_LEN`]-byte metadata header,
//! 3. cut into two *shards* of `L` bytes each (header and payload, zero-padded),
//! 4. protected by a third, Reed–Solomon parity shard (2 original + 1 recovery shard),
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
//! to RDMA and to storage alignment) and `L ≡ 32 (mod 64)` is even, which is what
//! `reed-solomon-simd` 3 requires of a shard (non-zero, even length; it pads to 64 internally).
//! For `B` = 4 KiB, `S` = 2112; for `B` = 1 MiB, `S` = 524 352.
//!
//! # Format, version 1 (all integers little-endian)
//!
//! The *stream* is `data 1 shard ‖ data 2 shard` (`2·L` bytes): the header, the payload, then
//! zeros.
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
//! # Allocation
//!
//! [`encode`] allocates the three halves (each once, at its final size) and a scratch buffer
//! for the LZ4 output, freed before it returns. [`decode`] allocates the block, plus, when an
//! LZ4 payload spans both halves, a copy of the payload to make it contiguous. [`recover`]
//! allocates the rebuilt half, then decodes as [`decode`] does. The Reed–Solomon coder
//! allocates its working space on every call (it is small: a few shards).

use std::borrow::Cow;
use std::error::Error;
use std::fmt;

use crc32fast::Hasher;
use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};

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

const HEADER_MAGIC: [u8; 4] = *b"GGAB";
const FLAG_COMPRESSED: u8 = 1;

const H_MAGIC: usize = 0;
const H_VERSION: usize = 4;
const H_FLAGS: usize = 5;
const H_RESERVED: usize = 6;
const H_INDEX: usize = 8;
const H_ORIGINAL_LEN: usize = 16;
const H_STORED_LEN: usize = 20;
const H_BLOCK_CRC: usize = 24;
const H_RESERVED2: usize = 28;

const T_VERSION: usize = 0;
const T_SLOT: usize = 1;
const T_RESERVED: usize = 2;
const T_SHARD_LEN: usize = 4;
const T_INDEX: usize = 8;
const T_GROUP: usize = 16;
const T_CRC: usize = 28;

/// One of the two data halves of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Half {
    /// The first half of the stream (header and start of the payload), kept by target data 1.
    Data1,
    /// The second half of the stream, kept by target data 2.
    Data2,
}

impl Half {
    /// The other data half.
    pub fn other(self) -> Half {
        match self {
            Half::Data1 => Half::Data2,
            Half::Data2 => Half::Data1,
        }
    }

    /// Index of this half's shard among the Reed–Solomon original shards.
    fn shard_index(self) -> usize {
        match self {
            Half::Data1 => 0,
            Half::Data2 => 1,
        }
    }
}

impl fmt::Display for Half {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Slot::from(*self).fmt(f)
    }
}

/// Any of the three halves of a block, i.e. which storage target keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    /// The data 1 half.
    Data1,
    /// The data 2 half.
    Data2,
    /// The parity half.
    Parity,
}

impl Slot {
    fn code(self) -> u8 {
        match self {
            Slot::Data1 => 1,
            Slot::Data2 => 2,
            Slot::Parity => 3,
        }
    }

    fn from_code(code: u8) -> Option<Slot> {
        match code {
            1 => Some(Slot::Data1),
            2 => Some(Slot::Data2),
            3 => Some(Slot::Parity),
            _ => None,
        }
    }

    /// Position of this slot's shard checksum in the group.
    fn group_pos(self) -> usize {
        match self {
            Slot::Data1 => 0,
            Slot::Data2 => 1,
            Slot::Parity => 2,
        }
    }
}

impl From<Half> for Slot {
    fn from(half: Half) -> Slot {
        match half {
            Half::Data1 => Slot::Data1,
            Half::Data2 => Slot::Data2,
        }
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Slot::Data1 => "data 1",
            Slot::Data2 => "data 2",
            Slot::Parity => "parity",
        })
    }
}

/// Why a block could not be encoded, decoded or recovered.
///
/// Every variant names the block index, and where it applies the half, so that the message is
/// enough for an operator to find the faulty target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodecError {
    /// The block size is odd, zero or larger than [`MAX_BLOCK_SIZE`].
    BadBlockSize {
        /// The block size given.
        block_size: usize,
    },
    /// A block to encode is larger than the block size.
    BlockTooLarge {
        /// The block index.
        index: u64,
        /// The block's length.
        len: usize,
        /// The block size.
        block_size: usize,
    },
    /// A half does not have the stored half size of this block size (truncated, or written with
    /// another block size).
    WrongHalfLength {
        /// The block index.
        index: u64,
        /// The half that has the wrong length.
        slot: Slot,
        /// [`stored_half_size`] of the block size.
        expected: usize,
        /// The half's length.
        found: usize,
    },
    /// A data half's checksum does not match its contents.
    CorruptHalf {
        /// The block index.
        index: u64,
        /// The corrupt half.
        half: Half,
        /// The checksum recorded in the half's trailer.
        expected: u32,
        /// The checksum of the bytes received.
        found: u32,
    },
    /// The parity half's checksum does not match its contents.
    CorruptParity {
        /// The block index.
        index: u64,
        /// The checksum recorded in the parity's trailer.
        expected: u32,
        /// The checksum of the bytes received.
        found: u32,
    },
    /// An intact half that belongs to another block or another slot.
    WrongHalf {
        /// The block index asked for.
        index: u64,
        /// The slot the half was given as.
        expected: Slot,
        /// The slot its trailer names.
        found: Slot,
        /// The block index its trailer names.
        found_index: u64,
    },
    /// Two intact halves of the right block that come from different writes of it (for example
    /// one target holds a stale copy).
    MismatchedHalves {
        /// The block index.
        index: u64,
        /// One half.
        first: Slot,
        /// The other half.
        second: Slot,
    },
    /// An intact half written by a format version this codec does not know.
    UnsupportedVersion {
        /// The block index.
        index: u64,
        /// The half.
        slot: Slot,
        /// The version its trailer names.
        version: u8,
    },
    /// An intact half whose trailer is inconsistent (only a bug or a forgery gets here).
    BadTrailer {
        /// The block index.
        index: u64,
        /// The half.
        slot: Slot,
        /// What is wrong.
        reason: String,
    },
    /// The metadata header in intact halves is inconsistent (only a bug or a forgery gets here).
    BadHeader {
        /// The block index.
        index: u64,
        /// What is wrong.
        reason: String,
    },
    /// The Reed–Solomon library refused to encode or decode.
    Erasure {
        /// The block index.
        index: u64,
        /// The library's message.
        detail: String,
    },
    /// A data half rebuilt from the other half and the parity does not have the checksum that
    /// the other halves record for it.
    ReconstructionMismatch {
        /// The block index.
        index: u64,
        /// The rebuilt half.
        half: Half,
        /// The checksum the surviving half and the parity record for it.
        expected: u32,
        /// The checksum of the rebuilt shard.
        found: u32,
    },
    /// The LZ4 payload could not be decompressed.
    DecompressFailed {
        /// The block index.
        index: u64,
        /// The decompressor's message.
        detail: String,
    },
    /// The payload decompressed to another length than the header records.
    LengthMismatch {
        /// The block index.
        index: u64,
        /// The original length recorded in the header.
        expected: usize,
        /// The decompressed length.
        found: usize,
    },
    /// The decoded block does not have the checksum recorded when it was encoded.
    CorruptBlock {
        /// The block index.
        index: u64,
        /// The checksum recorded in the header.
        expected: u32,
        /// The checksum of the decoded block.
        found: u32,
    },
}

impl fmt::Display for CodecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodecError::BadBlockSize { block_size } => write!(
                f,
                "block size {block_size} is not usable: it must be even and between 2 and \
                 {MAX_BLOCK_SIZE} bytes"
            ),
            CodecError::BlockTooLarge {
                index,
                len,
                block_size,
            } => write!(
                f,
                "block {index} is {len} bytes, larger than the block size {block_size}"
            ),
            CodecError::WrongHalfLength {
                index,
                slot,
                expected,
                found,
            } => write!(
                f,
                "{slot} half of block {index}: {found} bytes, expected {expected} (truncated, \
                 or written with another block size)"
            ),
            CodecError::CorruptHalf {
                index,
                half,
                expected,
                found,
            } => write!(
                f,
                "{half} half of block {index}: checksum {found:#010x} expected {expected:#010x}"
            ),
            CodecError::CorruptParity {
                index,
                expected,
                found,
            } => write!(
                f,
                "parity half of block {index}: checksum {found:#010x} expected {expected:#010x}"
            ),
            CodecError::WrongHalf {
                index,
                expected,
                found,
                found_index,
            } => write!(
                f,
                "{expected} half of block {index}: got the {found} half of block {found_index} \
                 instead"
            ),
            CodecError::MismatchedHalves {
                index,
                first,
                second,
            } => write!(
                f,
                "{first} and {second} halves of block {index} come from different writes (one \
                 of them is stale)"
            ),
            CodecError::UnsupportedVersion {
                index,
                slot,
                version,
            } => write!(
                f,
                "{slot} half of block {index}: format version {version}, this codec reads \
                 version {FORMAT_VERSION}"
            ),
            CodecError::BadTrailer {
                index,
                slot,
                reason,
            } => write!(f, "{slot} half of block {index}: bad trailer: {reason}"),
            CodecError::BadHeader { index, reason } => {
                write!(f, "block {index}: bad metadata header: {reason}")
            }
            CodecError::Erasure { index, detail } => {
                write!(f, "block {index}: Reed-Solomon coding failed: {detail}")
            }
            CodecError::ReconstructionMismatch {
                index,
                half,
                expected,
                found,
            } => write!(
                f,
                "{half} half of block {index} rebuilt from parity: checksum {found:#010x} \
                 expected {expected:#010x}"
            ),
            CodecError::DecompressFailed { index, detail } => {
                write!(f, "block {index}: LZ4 decompression failed: {detail}")
            }
            CodecError::LengthMismatch {
                index,
                expected,
                found,
            } => write!(
                f,
                "block {index}: decompressed to {found} bytes, the header records {expected}"
            ),
            CodecError::CorruptBlock {
                index,
                expected,
                found,
            } => write!(
                f,
                "block {index}: decoded block checksum {found:#010x} expected {expected:#010x}"
            ),
        }
    }
}

impl Error for CodecError {}

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

/// Sizes derived from a block size.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    /// `B`.
    block_size: usize,
    /// `S`: a whole half.
    half: usize,
    /// `L`: the shard at the start of a half.
    shard: usize,
}

fn geometry(block_size: usize) -> Result<Geometry, CodecError> {
    if block_size == 0 || !block_size.is_multiple_of(2) || block_size > MAX_BLOCK_SIZE {
        return Err(CodecError::BadBlockSize { block_size });
    }
    let half = (block_size / 2 + HEADER_LEN / 2 + TRAILER_LEN).div_ceil(HALF_ALIGN) * HALF_ALIGN;
    Ok(Geometry {
        block_size,
        half,
        shard: half - TRAILER_LEN,
    })
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
    if block.len() > g.block_size {
        return Err(CodecError::BlockTooLarge {
            index,
            len: block.len(),
            block_size,
        });
    }

    // lz4_flex wants room for the worst case before it starts; the scratch lives only here.
    let mut scratch = vec![0u8; lz4_flex::block::get_maximum_output_size(block.len())];
    let (payload, compressed) = match lz4_flex::block::compress_into(block, &mut scratch) {
        Ok(n) if n < block.len() => (&scratch[..n], true),
        _ => (block, false),
    };

    let mut header = [0u8; HEADER_LEN];
    header[H_MAGIC..H_MAGIC + 4].copy_from_slice(&HEADER_MAGIC);
    header[H_VERSION] = FORMAT_VERSION;
    header[H_FLAGS] = if compressed { FLAG_COMPRESSED } else { 0 };
    put_u64(&mut header, H_INDEX, index);
    // Both fit: they are at most block_size <= MAX_BLOCK_SIZE < 2^32.
    put_u32(&mut header, H_ORIGINAL_LEN, block.len() as u32);
    put_u32(&mut header, H_STORED_LEN, payload.len() as u32);
    put_u32(&mut header, H_BLOCK_CRC, crc32fast::hash(block));

    let mut data1 = vec![0u8; g.half];
    let mut data2 = vec![0u8; g.half];
    let mut parity = vec![0u8; g.half];
    {
        let (s1, s2) = (&mut data1[..g.shard], &mut data2[..g.shard]);
        write_stream(s1, s2, 0, &header);
        write_stream(s1, s2, HEADER_LEN, payload);
    }
    let compressed_len = payload.len();
    drop(scratch);

    let erasure = |e: reed_solomon_simd::Error| CodecError::Erasure {
        index,
        detail: e.to_string(),
    };
    let mut rs = ReedSolomonEncoder::new(2, 1, g.shard).map_err(erasure)?;
    rs.add_original_shard(&data1[..g.shard]).map_err(erasure)?;
    rs.add_original_shard(&data2[..g.shard]).map_err(erasure)?;
    let result = rs.encode().map_err(erasure)?;
    match result.recovery(0) {
        Some(shard) if shard.len() == g.shard => parity[..g.shard].copy_from_slice(shard),
        _ => {
            return Err(CodecError::Erasure {
                index,
                detail: format!("no recovery shard of {} bytes", g.shard),
            })
        }
    }
    drop(result);
    drop(rs);

    let hashers = [
        shard_hasher(&data1[..g.shard]),
        shard_hasher(&data2[..g.shard]),
        shard_hasher(&parity[..g.shard]),
    ];
    let group = hashers.clone().map(|h| h.finalize());
    let [h1, h2, hp] = hashers;
    seal(&mut data1, h1, Slot::Data1, index, g, &group);
    seal(&mut data2, h2, Slot::Data2, index, g, &group);
    seal(&mut parity, hp, Slot::Parity, index, g, &group);

    Ok(Encoded {
        data1,
        data2,
        parity,
        original_len: block.len(),
        compressed_len,
        compressed,
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
    let group1 = verify(data1, Slot::Data1, index, g)?;
    let group2 = verify(data2, Slot::Data2, index, g)?;
    if group1 != group2 {
        return Err(CodecError::MismatchedHalves {
            index,
            first: Slot::Data1,
            second: Slot::Data2,
        });
    }
    assemble(index, &data1[..g.shard], &data2[..g.shard], g)
}

/// The recovery read: decodes block number `index` from one data half (`surviving`, which is
/// `surviving_is`) and the parity half, rebuilding the missing data half with Reed–Solomon.
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
    let rebuilt = reconstruct(index, surviving, surviving_is, parity, g)?;
    let (s1, s2) = match surviving_is {
        Half::Data1 => (&surviving[..g.shard], &rebuilt[..g.shard]),
        Half::Data2 => (&rebuilt[..g.shard], &surviving[..g.shard]),
    };
    assemble(index, s1, s2, g)
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
    reconstruct(index, surviving, surviving_is, parity, g)
}

/// Verifies `surviving` and `parity`, and returns the missing data half, sealed.
fn reconstruct(
    index: u64,
    surviving: &[u8],
    surviving_is: Half,
    parity: &[u8],
    g: Geometry,
) -> Result<Vec<u8>, CodecError> {
    let group = verify(surviving, surviving_is.into(), index, g)?;
    let parity_group = verify(parity, Slot::Parity, index, g)?;
    if group != parity_group {
        return Err(CodecError::MismatchedHalves {
            index,
            first: surviving_is.into(),
            second: Slot::Parity,
        });
    }

    let missing = surviving_is.other();
    let erasure = |e: reed_solomon_simd::Error| CodecError::Erasure {
        index,
        detail: e.to_string(),
    };
    let mut rs = ReedSolomonDecoder::new(2, 1, g.shard).map_err(erasure)?;
    rs.add_original_shard(surviving_is.shard_index(), &surviving[..g.shard])
        .map_err(erasure)?;
    rs.add_recovery_shard(0, &parity[..g.shard])
        .map_err(erasure)?;
    let result = rs.decode().map_err(erasure)?;
    let shard = match result.restored_original(missing.shard_index()) {
        Some(shard) if shard.len() == g.shard => shard,
        _ => {
            return Err(CodecError::Erasure {
                index,
                detail: format!("the {missing} shard was not restored"),
            })
        }
    };

    let hasher = shard_hasher(shard);
    let expected = group[Slot::from(missing).group_pos()];
    let found = hasher.clone().finalize();
    if found != expected {
        return Err(CodecError::ReconstructionMismatch {
            index,
            half: missing,
            expected,
            found,
        });
    }
    let mut half = vec![0u8; g.half];
    half[..g.shard].copy_from_slice(shard);
    seal(&mut half, hasher, missing.into(), index, g, &group);
    Ok(half)
}

/// A hasher that has seen `shard`: its value is the shard's checksum, and fed the trailer it
/// gives the half's.
fn shard_hasher(shard: &[u8]) -> Hasher {
    let mut hasher = Hasher::new();
    hasher.update(shard);
    hasher
}

/// Writes the trailer of `half` (whose shard `hasher` has seen).
fn seal(
    half: &mut [u8],
    mut hasher: Hasher,
    slot: Slot,
    index: u64,
    g: Geometry,
    group: &[u32; 3],
) {
    let trailer = &mut half[g.shard..];
    trailer.fill(0);
    trailer[T_VERSION] = FORMAT_VERSION;
    trailer[T_SLOT] = slot.code();
    // L < 2^31: block_size <= 2^30.
    put_u32(trailer, T_SHARD_LEN, g.shard as u32);
    put_u64(trailer, T_INDEX, index);
    for (k, crc) in group.iter().enumerate() {
        put_u32(trailer, T_GROUP + 4 * k, *crc);
    }
    hasher.update(&trailer[..T_CRC]);
    put_u32(trailer, T_CRC, hasher.finalize());
}

/// Checks that `half` is the intact `slot` half of block `index` and returns its group.
fn verify(half: &[u8], slot: Slot, index: u64, g: Geometry) -> Result<[u32; 3], CodecError> {
    if half.len() != g.half {
        return Err(CodecError::WrongHalfLength {
            index,
            slot,
            expected: g.half,
            found: half.len(),
        });
    }
    let (shard, trailer) = half.split_at(g.shard);
    let mut hasher = shard_hasher(shard);
    let shard_crc = hasher.clone().finalize();
    hasher.update(&trailer[..T_CRC]);
    let found = hasher.finalize();
    let expected = get_u32(trailer, T_CRC);
    if found != expected {
        return Err(match slot {
            Slot::Data1 => CodecError::CorruptHalf {
                index,
                half: Half::Data1,
                expected,
                found,
            },
            Slot::Data2 => CodecError::CorruptHalf {
                index,
                half: Half::Data2,
                expected,
                found,
            },
            Slot::Parity => CodecError::CorruptParity {
                index,
                expected,
                found,
            },
        });
    }

    let version = trailer[T_VERSION];
    if version != FORMAT_VERSION {
        return Err(CodecError::UnsupportedVersion {
            index,
            slot,
            version,
        });
    }
    let bad = |reason: String| CodecError::BadTrailer {
        index,
        slot,
        reason,
    };
    let found_slot = Slot::from_code(trailer[T_SLOT])
        .ok_or_else(|| bad(format!("unknown slot code {}", trailer[T_SLOT])))?;
    let found_index = get_u64(trailer, T_INDEX);
    if found_slot != slot || found_index != index {
        return Err(CodecError::WrongHalf {
            index,
            expected: slot,
            found: found_slot,
            found_index,
        });
    }
    if trailer[T_RESERVED..T_RESERVED + 2] != [0, 0] {
        return Err(bad("reserved bytes are not zero".to_owned()));
    }
    let shard_len = get_u32(trailer, T_SHARD_LEN);
    if shard_len as usize != g.shard {
        return Err(bad(format!(
            "shard length {shard_len}, this block size uses {}",
            g.shard
        )));
    }
    let group = [
        get_u32(trailer, T_GROUP),
        get_u32(trailer, T_GROUP + 4),
        get_u32(trailer, T_GROUP + 8),
    ];
    if group[slot.group_pos()] != shard_crc {
        return Err(bad(format!(
            "records shard checksum {:#010x}, the shard's is {shard_crc:#010x}",
            group[slot.group_pos()]
        )));
    }
    Ok(group)
}

/// Parses the header of the verified stream `s1 ‖ s2` and returns the block.
fn assemble(index: u64, s1: &[u8], s2: &[u8], g: Geometry) -> Result<Vec<u8>, CodecError> {
    let bad = |reason: String| CodecError::BadHeader { index, reason };
    let header = s1
        .get(..HEADER_LEN)
        .ok_or_else(|| bad("shorter than a header".to_owned()))?;
    if header[H_MAGIC..H_MAGIC + 4] != HEADER_MAGIC {
        return Err(bad(format!(
            "magic {:02x?}, expected {:02x?}",
            &header[H_MAGIC..H_MAGIC + 4],
            HEADER_MAGIC
        )));
    }
    if header[H_VERSION] != FORMAT_VERSION {
        return Err(bad(format!("format version {}", header[H_VERSION])));
    }
    let flags = header[H_FLAGS];
    if flags & !FLAG_COMPRESSED != 0 {
        return Err(bad(format!("unknown flags {flags:#04x}")));
    }
    if header[H_RESERVED..H_RESERVED + 2] != [0, 0] || get_u32(header, H_RESERVED2) != 0 {
        return Err(bad("reserved bytes are not zero".to_owned()));
    }
    let header_index = get_u64(header, H_INDEX);
    if header_index != index {
        return Err(bad(format!("records block index {header_index}")));
    }
    let original_len = get_u32(header, H_ORIGINAL_LEN) as usize;
    let stored_len = get_u32(header, H_STORED_LEN) as usize;
    let compressed = flags & FLAG_COMPRESSED != 0;
    if original_len > g.block_size {
        return Err(bad(format!(
            "original length {original_len} exceeds the block size {}",
            g.block_size
        )));
    }
    if compressed && stored_len >= original_len {
        return Err(bad(format!(
            "compressed payload of {stored_len} bytes for a block of {original_len}"
        )));
    }
    if !compressed && stored_len != original_len {
        return Err(bad(format!(
            "raw payload of {stored_len} bytes for a block of {original_len}"
        )));
    }
    let (p1, p2) = read_stream(s1, s2, HEADER_LEN, stored_len).ok_or_else(|| {
        bad(format!(
            "payload of {stored_len} bytes does not fit in the halves"
        ))
    })?;

    let block = if compressed {
        let input: Cow<'_, [u8]> = if p2.is_empty() {
            Cow::Borrowed(p1)
        } else {
            Cow::Owned([p1, p2].concat())
        };
        let mut block = vec![0u8; original_len];
        let n = lz4_flex::block::decompress_into(&input, &mut block).map_err(|e| {
            CodecError::DecompressFailed {
                index,
                detail: e.to_string(),
            }
        })?;
        if n != original_len {
            return Err(CodecError::LengthMismatch {
                index,
                expected: original_len,
                found: n,
            });
        }
        block
    } else {
        let mut block = Vec::with_capacity(original_len);
        block.extend_from_slice(p1);
        block.extend_from_slice(p2);
        block
    };

    let expected = get_u32(header, H_BLOCK_CRC);
    let found = crc32fast::hash(&block);
    if found != expected {
        return Err(CodecError::CorruptBlock {
            index,
            expected,
            found,
        });
    }
    Ok(block)
}

/// Writes `bytes` at offset `at` of the stream `s1 ‖ s2` (the caller knows it fits).
fn write_stream(s1: &mut [u8], s2: &mut [u8], at: usize, bytes: &[u8]) {
    let split = s1.len();
    if at < split {
        let n = bytes.len().min(split - at);
        s1[at..at + n].copy_from_slice(&bytes[..n]);
        s2[..bytes.len() - n].copy_from_slice(&bytes[n..]);
    } else {
        let at = at - split;
        s2[at..at + bytes.len()].copy_from_slice(bytes);
    }
}

/// The `len` bytes at offset `at` of the stream `s1 ‖ s2`, as a part in `s1` and a part in
/// `s2`; `None` if they are not all there.
fn read_stream<'a>(
    s1: &'a [u8],
    s2: &'a [u8],
    at: usize,
    len: usize,
) -> Option<(&'a [u8], &'a [u8])> {
    let end = at.checked_add(len)?;
    if end > s1.len() + s2.len() {
        return None;
    }
    let split = s1.len();
    let first = s1.get(at.min(split)..end.min(split))?;
    let second = s2.get(at.max(split) - split..end.max(split) - split)?;
    Some((first, second))
}

fn get_u32(bytes: &[u8], at: usize) -> u32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(raw)
}

fn get_u64(bytes: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(raw)
}

fn put_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn put_u64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: usize = 4096;
    const SIZES: [usize; 5] = [2, 64, 4096, 65536, 1 << 20];

    /// A named change to some bytes.
    type Edit = (&'static str, fn(&mut [u8]));

    /// xorshift64: deterministic pseudo-random bytes (no dependency, fixed seeds).
    struct XorShift(u64);

    impl XorShift {
        fn new(seed: u64) -> XorShift {
            XorShift(seed | 1)
        }

        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn bytes(&mut self, len: usize) -> Vec<u8> {
            let mut out = Vec::with_capacity(len + 8);
            while out.len() < len {
                out.extend_from_slice(&self.next().to_le_bytes());
            }
            out.truncate(len);
            out
        }
    }

    fn incompressible(len: usize, seed: u64) -> Vec<u8> {
        XorShift::new(seed).bytes(len)
    }

    fn compressible(len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 64);
        let mut line = 0;
        while out.len() < len {
            out.extend_from_slice(
                format!("line {line:06} of the storage offload codec test\n").as_bytes(),
            );
            line += 1;
        }
        out.truncate(len);
        out
    }

    /// Blocks of every kind for block size `b`.
    fn blocks(b: usize) -> Vec<(&'static str, Vec<u8>)> {
        vec![
            ("compressible", compressible(b)),
            ("incompressible", incompressible(b, 0x5eed_0001)),
            ("zeros", vec![0u8; b]),
            ("short compressible", compressible(b / 3)),
            (
                "short incompressible",
                incompressible(b / 3 + 1, 0x5eed_0002),
            ),
            ("one byte", vec![0xa5]),
            ("empty", Vec::new()),
        ]
    }

    fn shard_len(block_size: usize) -> usize {
        geometry(block_size).unwrap().shard
    }

    /// Recomputes parity, group and trailers after a test changed shard bytes: a forgery that
    /// every checksum accepts, to reach the checks behind them.
    fn reseal(e: &mut Encoded, index: u64, block_size: usize) {
        let g = geometry(block_size).unwrap();
        let mut rs = ReedSolomonEncoder::new(2, 1, g.shard).unwrap();
        rs.add_original_shard(&e.data1[..g.shard]).unwrap();
        rs.add_original_shard(&e.data2[..g.shard]).unwrap();
        let parity = rs.encode().unwrap().recovery(0).unwrap().to_vec();
        e.parity[..g.shard].copy_from_slice(&parity);
        let hashers = [
            shard_hasher(&e.data1[..g.shard]),
            shard_hasher(&e.data2[..g.shard]),
            shard_hasher(&e.parity[..g.shard]),
        ];
        let group = hashers.clone().map(|h| h.finalize());
        let [h1, h2, hp] = hashers;
        seal(&mut e.data1, h1, Slot::Data1, index, g, &group);
        seal(&mut e.data2, h2, Slot::Data2, index, g, &group);
        seal(&mut e.parity, hp, Slot::Parity, index, g, &group);
    }

    /// Recomputes only a half's own checksum (after a test changed its trailer).
    fn fix_crc(half: &mut [u8]) {
        let n = half.len();
        let crc = crc32fast::hash(&half[..n - 4]);
        half[n - 4..].copy_from_slice(&crc.to_le_bytes());
    }

    #[test]
    fn stored_half_size_formula() {
        assert_eq!(stored_half_size(2), Ok(64));
        assert_eq!(stored_half_size(4096), Ok(2112));
        assert_eq!(stored_half_size(1 << 20), Ok(524_352));
        assert_eq!(stored_half_size(MAX_BLOCK_SIZE), Ok((1 << 29) + 64));
        for b in (2..=10_000).step_by(2) {
            let s = stored_half_size(b).unwrap();
            let l = s - TRAILER_LEN;
            assert_eq!(s % HALF_ALIGN, 0, "B={b}");
            assert_eq!(l % 2, 0, "B={b}");
            assert!(2 * l >= HEADER_LEN + b, "B={b}");
            assert!(
                s < b / 2 + 48 + HALF_ALIGN,
                "B={b}: no more than one alignment of slack"
            );
        }
        for bad in [0, 1, 4095, MAX_BLOCK_SIZE + 2, usize::MAX] {
            assert_eq!(
                stored_half_size(bad),
                Err(CodecError::BadBlockSize { block_size: bad })
            );
        }
    }

    #[test]
    fn round_trip_every_size_and_kind() {
        for b in SIZES {
            let s = stored_half_size(b).unwrap();
            for (kind, block) in blocks(b) {
                let index = b as u64 * 7 + block.len() as u64;
                let e = encode(index, &block, b).unwrap();
                assert_eq!(
                    (e.data1.len(), e.data2.len(), e.parity.len()),
                    (s, s, s),
                    "{kind}, B={b}"
                );
                assert_eq!(e.original_len, block.len());
                assert_eq!(
                    decode(index, &e.data1, &e.data2, b).unwrap(),
                    block,
                    "{kind}, B={b}"
                );
            }
        }
    }

    #[test]
    fn recovery_from_either_half_gives_the_block() {
        for b in SIZES {
            for (kind, block) in blocks(b) {
                let e = encode(3, &block, b).unwrap();
                for surviving_is in [Half::Data1, Half::Data2] {
                    let surviving = e.half(surviving_is);
                    assert_eq!(
                        recover(3, surviving, surviving_is, &e.parity, b).unwrap(),
                        block,
                        "{kind}, B={b}, from {surviving_is}"
                    );
                    if b > 65536 {
                        continue; // Reed-Solomon is slow in debug builds; smaller sizes suffice.
                    }
                    assert_eq!(
                        rebuild_half(3, surviving, surviving_is, &e.parity, b).unwrap(),
                        e.half(surviving_is.other()),
                        "{kind}, B={b}: the rebuilt half is the one encode wrote"
                    );
                }
            }
        }
    }

    #[test]
    fn compression_is_used_only_when_it_helps() {
        let text = encode(1, &compressible(B), B).unwrap();
        assert!(text.compressed);
        assert!(text.compressed_len < B / 2);
        assert!(text.ratio() > 2.0);

        let noise = encode(1, &incompressible(B, 7), B).unwrap();
        assert!(!noise.compressed);
        assert_eq!(noise.compressed_len, B);
        assert_eq!(noise.ratio(), 1.0);

        let zeros = encode(1, &vec![0u8; 1 << 20], 1 << 20).unwrap();
        assert!(zeros.compressed);
        assert!(zeros.ratio() > 100.0);

        let empty = encode(1, &[], B).unwrap();
        assert!(!empty.compressed);
        assert_eq!((empty.compressed_len, empty.ratio()), (0, 1.0));
    }

    #[test]
    fn encoding_is_deterministic() {
        let block = compressible(3000);
        assert_eq!(encode(9, &block, B).unwrap(), encode(9, &block, B).unwrap());
    }

    #[test]
    fn a_flipped_bit_anywhere_in_a_half_is_detected() {
        let block = compressible(B);
        let e = encode(17, &block, B).unwrap();
        for pos in 0..e.data1.len() {
            let bit = 1u8 << (pos % 8);

            let mut d1 = e.data1.clone();
            d1[pos] ^= bit;
            assert!(
                matches!(
                    decode(17, &d1, &e.data2, B),
                    Err(CodecError::CorruptHalf {
                        index: 17,
                        half: Half::Data1,
                        ..
                    })
                ),
                "data 1 byte {pos}"
            );
            assert!(
                matches!(
                    recover(17, &d1, Half::Data1, &e.parity, B),
                    Err(CodecError::CorruptHalf {
                        half: Half::Data1,
                        ..
                    })
                ),
                "recovery from data 1 byte {pos}"
            );

            let mut d2 = e.data2.clone();
            d2[pos] ^= bit;
            assert!(
                matches!(
                    decode(17, &e.data1, &d2, B),
                    Err(CodecError::CorruptHalf {
                        index: 17,
                        half: Half::Data2,
                        ..
                    })
                ),
                "data 2 byte {pos}"
            );

            let mut p = e.parity.clone();
            p[pos] ^= bit;
            for surviving_is in [Half::Data1, Half::Data2] {
                assert!(
                    matches!(
                        recover(17, e.half(surviving_is), surviving_is, &p, B),
                        Err(CodecError::CorruptParity { index: 17, .. })
                    ),
                    "parity byte {pos}, from {surviving_is}"
                );
            }
        }
    }

    #[test]
    fn corrupt_half_reports_both_checksums() {
        let e = encode(17, &compressible(B), B).unwrap();
        let mut d2 = e.data2.clone();
        d2[100] ^= 0x10;
        let err = decode(17, &e.data1, &d2, B).unwrap_err();
        let CodecError::CorruptHalf {
            expected, found, ..
        } = err
        else {
            panic!("{err:?}");
        };
        assert_eq!(
            expected,
            u32::from_le_bytes(d2[d2.len() - 4..].try_into().unwrap())
        );
        assert_eq!(found, crc32fast::hash(&d2[..d2.len() - 4]));
        assert_eq!(
            err.to_string(),
            format!("data 2 half of block 17: checksum {found:#010x} expected {expected:#010x}")
        );
    }

    #[test]
    fn a_half_of_another_block_is_refused() {
        let block = compressible(B);
        let e17 = encode(17, &block, B).unwrap();
        let e18 = encode(18, &block, B).unwrap();
        let want = |expected, found| CodecError::WrongHalf {
            index: 17,
            expected,
            found,
            found_index: 18,
        };
        assert_eq!(
            decode(17, &e18.data1, &e17.data2, B),
            Err(want(Slot::Data1, Slot::Data1))
        );
        assert_eq!(
            decode(17, &e17.data1, &e18.data2, B),
            Err(want(Slot::Data2, Slot::Data2))
        );
        assert_eq!(
            recover(17, &e17.data1, Half::Data1, &e18.parity, B),
            Err(want(Slot::Parity, Slot::Parity))
        );
        assert_eq!(
            recover(17, &e18.data2, Half::Data2, &e17.parity, B),
            Err(want(Slot::Data2, Slot::Data2))
        );
        assert_eq!(
            want(Slot::Data1, Slot::Data1).to_string(),
            "data 1 half of block 17: got the data 1 half of block 18 instead"
        );
    }

    #[test]
    fn swapped_or_misplaced_halves_are_refused() {
        let e = encode(5, &incompressible(B, 11), B).unwrap();
        let wrong = |expected, found| {
            Err(CodecError::WrongHalf {
                index: 5,
                expected,
                found,
                found_index: 5,
            })
        };
        assert_eq!(
            decode(5, &e.data2, &e.data1, B),
            wrong(Slot::Data1, Slot::Data2)
        );
        assert_eq!(
            decode(5, &e.parity, &e.data2, B),
            wrong(Slot::Data1, Slot::Parity)
        );
        assert_eq!(
            decode(5, &e.data1, &e.parity, B),
            wrong(Slot::Data2, Slot::Parity)
        );
        assert_eq!(
            recover(5, &e.data1, Half::Data2, &e.parity, B),
            wrong(Slot::Data2, Slot::Data1)
        );
        assert_eq!(
            recover(5, &e.data1, Half::Data1, &e.data2, B),
            wrong(Slot::Parity, Slot::Data2)
        );
    }

    #[test]
    fn halves_of_different_writes_are_refused() {
        let old = encode(8, &compressible(B), B).unwrap();
        let new = encode(8, &incompressible(B, 3), B).unwrap();
        let mismatch = |first, second| {
            Err(CodecError::MismatchedHalves {
                index: 8,
                first,
                second,
            })
        };
        assert_eq!(
            decode(8, &old.data1, &new.data2, B),
            mismatch(Slot::Data1, Slot::Data2)
        );
        assert_eq!(
            recover(8, &new.data1, Half::Data1, &old.parity, B),
            mismatch(Slot::Data1, Slot::Parity)
        );
        assert_eq!(
            recover(8, &old.data2, Half::Data2, &new.parity, B),
            mismatch(Slot::Data2, Slot::Parity)
        );
    }

    #[test]
    fn oversized_blocks_and_bad_block_sizes_are_refused() {
        assert_eq!(
            encode(4, &vec![1u8; B + 1], B),
            Err(CodecError::BlockTooLarge {
                index: 4,
                len: B + 1,
                block_size: B
            })
        );
        assert!(encode(4, &vec![1u8; B], B).is_ok());
        let half = vec![0u8; 64];
        for bad in [0, 3, 4097, MAX_BLOCK_SIZE * 2] {
            let want = Some(CodecError::BadBlockSize { block_size: bad });
            assert_eq!(encode(4, &[], bad).err(), want);
            assert_eq!(decode(4, &half, &half, bad).err(), want);
            assert_eq!(recover(4, &half, Half::Data1, &half, bad).err(), want);
            assert_eq!(rebuild_half(4, &half, Half::Data1, &half, bad).err(), want);
        }
    }

    #[test]
    fn truncated_or_extended_halves_are_refused() {
        let e = encode(6, &compressible(B), B).unwrap();
        let s = e.data1.len();
        let wrong = |slot, found| {
            Err(CodecError::WrongHalfLength {
                index: 6,
                slot,
                expected: s,
                found,
            })
        };
        assert_eq!(
            decode(6, &e.data1[..s - 1], &e.data2, B),
            wrong(Slot::Data1, s - 1)
        );
        assert_eq!(decode(6, &e.data1, &[], B), wrong(Slot::Data2, 0));
        let mut longer = e.data2.clone();
        longer.push(0);
        assert_eq!(decode(6, &e.data1, &longer, B), wrong(Slot::Data2, s + 1));
        assert_eq!(
            recover(6, &e.data2, Half::Data2, &e.parity[..s / 2], B),
            wrong(Slot::Parity, s / 2)
        );
        // Halves written with another block size.
        assert_eq!(
            decode(6, &e.data1, &e.data2, 2 * B),
            Err(CodecError::WrongHalfLength {
                index: 6,
                slot: Slot::Data1,
                expected: stored_half_size(2 * B).unwrap(),
                found: s,
            })
        );
    }

    #[test]
    fn a_block_size_with_the_same_half_size_is_checked_by_the_header() {
        // S(4094) == S(4096): the halves fit, the header's original length does not.
        assert_eq!(stored_half_size(B - 2), stored_half_size(B));
        let e = encode(2, &compressible(B), B).unwrap();
        assert!(matches!(
            decode(2, &e.data1, &e.data2, B - 2),
            Err(CodecError::BadHeader { index: 2, .. })
        ));
        let short = compressible(B - 100);
        let e = encode(2, &short, B).unwrap();
        assert_eq!(decode(2, &e.data1, &e.data2, B - 2).unwrap(), short);
    }

    #[test]
    fn checksummed_forgeries_are_caught_behind_the_checksums() {
        let l = shard_len(B);

        // A compressed payload that is not LZ4: a 0xff token wants more length bytes than exist.
        let mut e = encode(1, &compressible(B), B).unwrap();
        let stored = e.compressed_len;
        write_stream(
            &mut e.data1[..l],
            &mut e.data2[..l],
            HEADER_LEN,
            &vec![0xff; stored],
        );
        reseal(&mut e, 1, B);
        assert!(matches!(
            decode(1, &e.data1, &e.data2, B),
            Err(CodecError::DecompressFailed { index: 1, .. })
        ));
        assert!(matches!(
            recover(1, &e.data2, Half::Data2, &e.parity, B),
            Err(CodecError::DecompressFailed { index: 1, .. })
        ));

        // A header that claims one byte more than the payload decompresses to.
        let short = compressible(1000);
        let mut e = encode(1, &short, B).unwrap();
        assert!(e.compressed);
        put_u32(&mut e.data1, H_ORIGINAL_LEN, 1001);
        reseal(&mut e, 1, B);
        assert_eq!(
            decode(1, &e.data1, &e.data2, B),
            Err(CodecError::LengthMismatch {
                index: 1,
                expected: 1001,
                found: 1000
            })
        );

        // A raw payload changed after the end-to-end checksum was taken.
        let noise = incompressible(B, 99);
        let mut e = encode(1, &noise, B).unwrap();
        assert!(!e.compressed);
        e.data2[10] ^= 1;
        reseal(&mut e, 1, B);
        assert!(matches!(
            decode(1, &e.data1, &e.data2, B),
            Err(CodecError::CorruptBlock { index: 1, .. })
        ));

        // Header fields.
        let edits: [Edit; 6] = [
            ("magic", |h| h[H_MAGIC] = b'X'),
            ("version", |h| h[H_VERSION] = 2),
            ("flags", |h| h[H_FLAGS] |= 0x80),
            ("reserved", |h| h[H_RESERVED2] = 1),
            ("index", |h| h[H_INDEX] ^= 1),
            ("raw stored length", |h| put_u32(h, H_STORED_LEN, 10)),
        ];
        for (what, edit) in edits {
            let mut e = encode(1, &noise, B).unwrap();
            edit(&mut e.data1);
            reseal(&mut e, 1, B);
            assert!(
                matches!(
                    decode(1, &e.data1, &e.data2, B),
                    Err(CodecError::BadHeader { index: 1, .. })
                ),
                "{what}"
            );
        }

        // Trailer fields, with the half's own checksum fixed.
        let e = encode(1, &noise, B).unwrap();
        let mut d1 = e.data1.clone();
        d1[l + T_VERSION] = 2;
        fix_crc(&mut d1);
        assert_eq!(
            decode(1, &d1, &e.data2, B),
            Err(CodecError::UnsupportedVersion {
                index: 1,
                slot: Slot::Data1,
                version: 2
            })
        );
        let trailer_edits: [Edit; 4] = [
            ("slot", |t| t[T_SLOT] = 9),
            ("reserved", |t| t[T_RESERVED + 1] = 1),
            ("shard length", |t| put_u32(t, T_SHARD_LEN, 64)),
            ("own shard checksum", |t| t[T_GROUP + 4] ^= 1),
        ];
        for (what, edit) in trailer_edits {
            let mut d2 = e.data2.clone();
            edit(&mut d2[l..]);
            fix_crc(&mut d2);
            assert!(
                matches!(
                    decode(1, &e.data1, &d2, B),
                    Err(CodecError::BadTrailer {
                        index: 1,
                        slot: Slot::Data2,
                        ..
                    })
                ),
                "{what}"
            );
        }
    }

    #[test]
    fn a_parity_that_does_not_rebuild_the_recorded_half_is_refused() {
        // Parity bytes changed and every checksum recomputed: the group still records the real
        // data 2 shard, which the bad parity cannot rebuild.
        let e = encode(4, &compressible(B), B).unwrap();
        let g = geometry(B).unwrap();
        let mut p = e.parity.clone();
        p[0] ^= 1;
        let hasher = shard_hasher(&p[..g.shard]);
        let group = [
            crc32fast::hash(&e.data1[..g.shard]),
            crc32fast::hash(&e.data2[..g.shard]),
            hasher.clone().finalize(),
        ];
        seal(&mut p, hasher, Slot::Parity, 4, g, &group);
        let mut d1 = e.data1.clone();
        seal(
            &mut d1,
            shard_hasher(&e.data1[..g.shard]),
            Slot::Data1,
            4,
            g,
            &group,
        );
        assert!(matches!(
            recover(4, &d1, Half::Data1, &p, B),
            Err(CodecError::ReconstructionMismatch {
                index: 4,
                half: Half::Data2,
                expected,
                ..
            }) if expected == group[1]
        ));
        assert!(matches!(
            rebuild_half(4, &d1, Half::Data1, &p, B),
            Err(CodecError::ReconstructionMismatch { .. })
        ));
    }

    #[test]
    fn garbage_gives_errors_not_panics() {
        let mut rng = XorShift::new(0x00c0_ffee);
        let block = compressible(B);
        let noise = incompressible(B, 5);
        for round in 0..300 {
            let source = if round % 2 == 0 { &block } else { &noise };
            let mut e = encode(12, source, B).unwrap();
            let s = e.data1.len();
            match round % 3 {
                // Random lengths and contents.
                0 => {
                    let len = if rng.below(2) == 0 {
                        s
                    } else {
                        rng.below(2 * s)
                    };
                    e.data1 = rng.bytes(len);
                    e.parity = rng.bytes(s);
                }
                // Random bytes inside valid halves, every checksum recomputed.
                _ => {
                    for _ in 0..1 + rng.below(4) {
                        let pos = rng.below(2 * shard_len(B));
                        let byte = rng.next() as u8;
                        if pos < shard_len(B) {
                            e.data1[pos] = byte;
                        } else {
                            e.data2[pos - shard_len(B)] = byte;
                        }
                    }
                    reseal(&mut e, 12, B);
                }
            }
            let surviving_is = if rng.below(2) == 0 {
                Half::Data1
            } else {
                Half::Data2
            };
            let results = [
                decode(12, &e.data1, &e.data2, B),
                recover(12, e.half(surviving_is), surviving_is, &e.parity, B),
            ];
            // Only the zero padding after the payload can change harmlessly.
            for decoded in results.into_iter().flatten() {
                assert_eq!(&decoded, source, "round {round}");
            }
        }
    }

    #[test]
    fn error_messages_name_the_half_and_the_block() {
        let cases = [
            (
                CodecError::CorruptParity {
                    index: 3,
                    expected: 1,
                    found: 0xdead_beef,
                },
                "parity half of block 3: checksum 0xdeadbeef expected 0x00000001",
            ),
            (
                CodecError::WrongHalfLength {
                    index: 3,
                    slot: Slot::Data1,
                    expected: 2112,
                    found: 7,
                },
                "data 1 half of block 3: 7 bytes, expected 2112 (truncated, or written with \
                 another block size)",
            ),
            (
                CodecError::MismatchedHalves {
                    index: 3,
                    first: Slot::Data2,
                    second: Slot::Parity,
                },
                "data 2 and parity halves of block 3 come from different writes (one of them \
                 is stale)",
            ),
            (
                CodecError::BlockTooLarge {
                    index: 3,
                    len: 5000,
                    block_size: 4096,
                },
                "block 3 is 5000 bytes, larger than the block size 4096",
            ),
        ];
        for (err, text) in cases {
            assert_eq!(err.to_string(), text);
        }
    }
}
