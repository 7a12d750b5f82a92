//! The [`Codec`] that runs on the CPU: LZ4 (`lz4_flex`), the parity (XOR) and CRC32
//! (`crc32fast`), in the caller's buffers and this thread's scratch.

use super::format::{geometry, Geometry};
use super::scratch::Scratch;
use super::{read, write, Codec, CodecError, Half};

/// The CPU implementation of [`Codec`] for one block size.
///
/// It keeps no state besides the block size: the working space (an LZ4 buffer and a shard
/// for recovery reads) belongs to each calling thread and is reused for every block, so a
/// call allocates nothing once the thread has coded a block of this size (see the
/// [module docs](super#allocation)). Cheap to clone; one value may serve every thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuCodec {
    g: Geometry,
}

impl CpuCodec {
    /// The codec for blocks of at most `block_size` bytes. Fails with
    /// [`CodecError::BadBlockSize`] unless `block_size` is even and in
    /// `2..=`[`MAX_BLOCK_SIZE`](super::MAX_BLOCK_SIZE).
    pub fn new(block_size: usize) -> Result<CpuCodec, CodecError> {
        Ok(CpuCodec {
            g: geometry(block_size)?,
        })
    }
}

impl Codec for CpuCodec {
    fn block_size(&self) -> usize {
        self.g.block_size
    }

    fn half_size(&self) -> usize {
        self.g.half
    }

    fn encode_into(
        &self,
        index: u64,
        block: &[u8],
        halves: [&mut [u8]; 3],
    ) -> Result<usize, CodecError> {
        Scratch::with(|scratch| write::encode_into(index, block, self.g, halves, scratch))
            .map(|stored| stored.payload_len)
    }

    fn decode_into(
        &self,
        index: u64,
        data1: &[u8],
        data2: &[u8],
        out: &mut [u8],
    ) -> Result<usize, CodecError> {
        Scratch::with(|scratch| read::decode_into(index, data1, data2, self.g, out, scratch))
    }

    fn recover_into(
        &self,
        index: u64,
        surviving: &[u8],
        surviving_is: Half,
        parity: &[u8],
        out: &mut [u8],
    ) -> Result<usize, CodecError> {
        Scratch::with(|scratch| {
            read::recover_into(index, surviving, surviving_is, parity, self.g, out, scratch)
        })
    }
}
