//! A write: a block compressed, cut into the two data shards, given its parity, and the three
//! halves sealed, all in the caller's buffers.

use super::erasure;
use super::format::{seal_all, write_stream, zero_stream_from, Geometry, Header};
use super::scratch::Scratch;
use super::{CodecError, Slot, HEADER_LEN};

/// What a write stored.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stored {
    /// The payload's length.
    pub(super) payload_len: usize,
    /// Whether the payload is LZ4.
    pub(super) compressed: bool,
}

/// Encodes block `index` of geometry `g` into `halves` (data 1, data 2, parity), each of which
/// must be exactly a half long; every byte of them is written.
pub(super) fn encode_into(
    index: u64,
    block: &[u8],
    g: Geometry,
    halves: [&mut [u8]; 3],
    scratch: &mut Scratch,
) -> Result<Stored, CodecError> {
    if block.len() > g.block_size {
        return Err(CodecError::BlockTooLarge {
            index,
            len: block.len(),
            block_size: g.block_size,
        });
    }
    for (half, slot) in halves.iter().zip(Slot::ALL) {
        if half.len() != g.half {
            return Err(CodecError::WrongBufferLength {
                index,
                slot,
                expected: g.half,
                found: half.len(),
            });
        }
    }
    let lz4 = &mut scratch.lz4;

    // lz4_flex wants room for the worst case before it starts.
    let room = lz4_flex::block::get_maximum_output_size(block.len());
    if lz4.len() < room {
        lz4.resize(room, 0);
    }
    let (payload, compressed) = match lz4_flex::block::compress_into(block, &mut lz4[..room]) {
        Ok(n) if n < block.len() => (&lz4[..n], true),
        _ => (block, false),
    };

    let [data1, data2, parity] = halves;
    let (s1, s2) = (&mut data1[..g.shard], &mut data2[..g.shard]);
    write_stream(
        s1,
        s2,
        0,
        &Header::of(index, block, payload.len(), compressed),
    );
    write_stream(s1, s2, HEADER_LEN, payload);
    zero_stream_from(s1, s2, HEADER_LEN + payload.len());
    erasure::parity_into(s1, s2, &mut parity[..g.shard]);
    seal_all([data1, data2, parity], index, g);
    Ok(Stored {
        payload_len: payload.len(),
        compressed,
    })
}
