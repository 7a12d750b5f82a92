//! What goes wrong when a block is encoded, decoded or recovered.

use super::{Half, Slot, FORMAT_VERSION, MAX_BLOCK_SIZE};

/// Why a block could not be encoded, decoded or recovered.
///
/// Every variant names the block index, and where it applies the half, so that the message is
/// enough for an operator to find the faulty target.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The block size is odd, zero or larger than [`MAX_BLOCK_SIZE`].
    #[error(
        "block size {block_size} is not usable: it must be even and between 2 and \
         {MAX_BLOCK_SIZE} bytes"
    )]
    BadBlockSize {
        /// The block size given.
        block_size: usize,
    },
    /// A block to encode is larger than the block size.
    #[error("block {index} is {len} bytes, larger than the block size {block_size}")]
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
    #[error(
        "{slot} half of block {index}: {found} bytes, expected {expected} (truncated, or \
         written with another block size)"
    )]
    WrongHalfLength {
        /// The block index.
        index: u64,
        /// The half that has the wrong length.
        slot: Slot,
        /// [`stored_half_size`](super::stored_half_size) of the block size.
        expected: usize,
        /// The half's length.
        found: usize,
    },
    /// A buffer given to [`Codec::encode_into`](super::Codec::encode_into) to receive a half is
    /// not exactly [`Codec::half_size`](super::Codec::half_size) bytes (a bug in the caller).
    #[error(
        "buffer for the {slot} half of block {index} is {found} bytes, it must be exactly \
         {expected}"
    )]
    WrongBufferLength {
        /// The block index.
        index: u64,
        /// The half the buffer was given for.
        slot: Slot,
        /// The half size.
        expected: usize,
        /// The buffer's length.
        found: usize,
    },
    /// The buffer given to receive a decoded block is shorter than the block size (a bug in
    /// the caller).
    #[error(
        "output buffer for block {index} is {found} bytes, it must hold the block size, \
         {needed}"
    )]
    OutputTooSmall {
        /// The block index.
        index: u64,
        /// The block size.
        needed: usize,
        /// The buffer's length.
        found: usize,
    },
    /// A data half's checksum does not match its contents.
    #[error("{half} half of block {index}: checksum {found:#010x} expected {expected:#010x}")]
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
    #[error("parity half of block {index}: checksum {found:#010x} expected {expected:#010x}")]
    CorruptParity {
        /// The block index.
        index: u64,
        /// The checksum recorded in the parity's trailer.
        expected: u32,
        /// The checksum of the bytes received.
        found: u32,
    },
    /// An intact half that belongs to another block or another slot.
    #[error(
        "{expected} half of block {index}: got the {found} half of block {found_index} instead"
    )]
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
    #[error(
        "{first} and {second} halves of block {index} come from different writes (one of them \
         is stale)"
    )]
    MismatchedHalves {
        /// The block index.
        index: u64,
        /// One half.
        first: Slot,
        /// The other half.
        second: Slot,
    },
    /// An intact half written by a format version this codec does not know.
    #[error(
        "{slot} half of block {index}: format version {version}, this codec reads version \
         {FORMAT_VERSION}"
    )]
    UnsupportedVersion {
        /// The block index.
        index: u64,
        /// The half.
        slot: Slot,
        /// The version its trailer names.
        version: u8,
    },
    /// An intact half whose trailer is inconsistent (only a bug or a forgery gets here).
    #[error("{slot} half of block {index}: bad trailer: {reason}")]
    BadTrailer {
        /// The block index.
        index: u64,
        /// The half.
        slot: Slot,
        /// What is wrong.
        reason: String,
    },
    /// The metadata header in intact halves is inconsistent (only a bug or a forgery gets here).
    #[error("block {index}: bad metadata header: {reason}")]
    BadHeader {
        /// The block index.
        index: u64,
        /// What is wrong.
        reason: String,
    },
    /// A data half rebuilt from the other half and the parity does not have the checksum that
    /// the other halves record for it.
    #[error(
        "{half} half of block {index} rebuilt from parity: checksum {found:#010x} expected \
         {expected:#010x}"
    )]
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
    #[error("block {index}: LZ4 decompression failed: {detail}")]
    DecompressFailed {
        /// The block index.
        index: u64,
        /// The decompressor's message.
        detail: String,
    },
    /// The payload decompressed to another length than the header records.
    #[error("block {index}: decompressed to {found} bytes, the header records {expected}")]
    LengthMismatch {
        /// The block index.
        index: u64,
        /// The original length recorded in the header.
        expected: usize,
        /// The decompressed length.
        found: usize,
    },
    /// The decoded block does not have the checksum recorded when it was encoded.
    #[error("block {index}: decoded block checksum {found:#010x} expected {expected:#010x}")]
    CorruptBlock {
        /// The block index.
        index: u64,
        /// The checksum recorded in the header.
        expected: u32,
        /// The checksum of the decoded block.
        found: u32,
    },
}
