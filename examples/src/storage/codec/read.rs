//! A read: both data halves checked and the block unpacked from the stream they make. A
//! recovery read: one data half and the parity checked, the other data half's shard rebuilt
//! and checked against the checksum they record for it, then the same.

use crc32fast::Hasher;

use super::erasure;
use super::format::{read_stream, shard_hasher, verify, Geometry, Header};
use super::scratch::Scratch;
use super::{CodecError, Half, Slot, HEADER_LEN};

/// Decodes block `index` of geometry `g` from its data halves into `out` (at least a block);
/// returns the block's length.
pub(super) fn decode_into(
    index: u64,
    data1: &[u8],
    data2: &[u8],
    g: Geometry,
    out: &mut [u8],
    scratch: &mut Scratch,
) -> Result<usize, CodecError> {
    check_output(index, g, out)?;
    let (s1, s2) = open(index, data1, data2, g)?;
    unpack_into(index, s1, s2, g, out, &mut scratch.lz4)
}

/// Decodes block `index` of geometry `g` from `surviving` (the `surviving_is` half) and
/// `parity` into `out` (at least a block); returns the block's length.
pub(super) fn recover_into(
    index: u64,
    surviving: &[u8],
    surviving_is: Half,
    parity: &[u8],
    g: Geometry,
    out: &mut [u8],
    scratch: &mut Scratch,
) -> Result<usize, CodecError> {
    check_output(index, g, out)?;
    let Scratch { lz4, rebuilt } = scratch;
    let shard = Scratch::grown(rebuilt, g.shard);
    let (s1, s2) = rebuild(index, surviving, surviving_is, parity, g, shard)?.stream(shard);
    unpack_into(index, s1, s2, g, out, lz4)
}

/// Refuses an output buffer that cannot take every block of geometry `g`.
fn check_output(index: u64, g: Geometry, out: &[u8]) -> Result<(), CodecError> {
    if out.len() < g.block_size {
        return Err(CodecError::OutputTooSmall {
            index,
            needed: g.block_size,
            found: out.len(),
        });
    }
    Ok(())
}

/// Checks that `data1` and `data2` are the intact data halves of one write of block `index`
/// and returns their shards: the stream.
pub(super) fn open<'a>(
    index: u64,
    data1: &'a [u8],
    data2: &'a [u8],
    g: Geometry,
) -> Result<(&'a [u8], &'a [u8]), CodecError> {
    let group1 = verify(data1, Slot::Data1, index, g)?;
    let group2 = verify(data2, Slot::Data2, index, g)?;
    if group1 != group2 {
        return Err(CodecError::MismatchedHalves {
            index,
            first: Slot::Data1,
            second: Slot::Data2,
        });
    }
    Ok((&data1[..g.shard], &data2[..g.shard]))
}

/// What a data shard rebuilt by [`rebuild`] comes with.
#[derive(Debug)]
pub(super) struct Rebuilt<'a> {
    /// The surviving half's shard.
    pub(super) surviving: &'a [u8],
    /// Which data half the rebuilt shard is the shard of.
    pub(super) half: Half,
    /// A hasher that has seen the rebuilt shard.
    pub(super) hasher: Hasher,
    /// The group the surviving half and the parity record.
    pub(super) group: [u32; 3],
}

impl<'a> Rebuilt<'a> {
    /// The stream (`s1`, `s2`) that the surviving shard and `shard`, the rebuilt one, make.
    pub(super) fn stream<'b>(&self, shard: &'b [u8]) -> (&'b [u8], &'b [u8])
    where
        'a: 'b,
    {
        match self.half {
            Half::Data1 => (shard, self.surviving),
            Half::Data2 => (self.surviving, shard),
        }
    }
}

/// Checks that `surviving` (the `surviving_is` half) and `parity` are intact halves of one
/// write of block `index`, rebuilds the other data half's shard into `shard` (a shard long),
/// and checks it against the checksum they record for it.
pub(super) fn rebuild<'a>(
    index: u64,
    surviving: &'a [u8],
    surviving_is: Half,
    parity: &[u8],
    g: Geometry,
    shard: &mut [u8],
) -> Result<Rebuilt<'a>, CodecError> {
    let group = verify(surviving, surviving_is.into(), index, g)?;
    let parity_group = verify(parity, Slot::Parity, index, g)?;
    if group != parity_group {
        return Err(CodecError::MismatchedHalves {
            index,
            first: surviving_is.into(),
            second: Slot::Parity,
        });
    }
    let surviving = &surviving[..g.shard];
    erasure::rebuild_into(surviving, &parity[..g.shard], shard);
    let half = surviving_is.other();
    let hasher = shard_hasher(shard);
    let expected = group[Slot::from(half).group_pos()];
    let found = hasher.clone().finalize();
    if found != expected {
        return Err(CodecError::ReconstructionMismatch {
            index,
            half,
            expected,
            found,
        });
    }
    Ok(Rebuilt {
        surviving,
        half,
        hasher,
        group,
    })
}

/// Unpacks the block from the verified stream `s1 ‖ s2` of block `index` into `out` (at least
/// a block long); returns its length.
pub(super) fn unpack_into(
    index: u64,
    s1: &[u8],
    s2: &[u8],
    g: Geometry,
    out: &mut [u8],
    lz4: &mut Vec<u8>,
) -> Result<usize, CodecError> {
    let header = Header::parse(index, s1, g)?;
    // `parse` checked that the block fits in a block, which `out` holds.
    let found = out.len();
    let out = out
        .get_mut(..header.original_len)
        .ok_or(CodecError::OutputTooSmall {
            index,
            needed: header.original_len,
            found,
        })?;
    unpack(index, header, s1, s2, out, lz4)?;
    Ok(header.original_len)
}

/// Unpacks the block from the verified stream `s1 ‖ s2` of block `index` into a new buffer of
/// its length.
pub(super) fn unpack_to_vec(
    index: u64,
    s1: &[u8],
    s2: &[u8],
    g: Geometry,
    lz4: &mut Vec<u8>,
) -> Result<Vec<u8>, CodecError> {
    let header = Header::parse(index, s1, g)?;
    let mut block = vec![0u8; header.original_len];
    unpack(index, header, s1, s2, &mut block, lz4)?;
    Ok(block)
}

/// Decompresses (or copies) the payload that `header` describes into `out`, which is the
/// block's length, and checks the block's length and checksum.
fn unpack(
    index: u64,
    header: Header,
    s1: &[u8],
    s2: &[u8],
    out: &mut [u8],
    lz4: &mut Vec<u8>,
) -> Result<(), CodecError> {
    let stored_len = header.stored_len;
    let (p1, p2) =
        read_stream(s1, s2, HEADER_LEN, stored_len).ok_or_else(|| CodecError::BadHeader {
            index,
            reason: format!("payload of {stored_len} bytes does not fit in the halves"),
        })?;

    if header.compressed {
        let input = if p2.is_empty() {
            p1
        } else {
            // LZ4 wants its input in one piece.
            lz4.clear();
            lz4.extend_from_slice(p1);
            lz4.extend_from_slice(p2);
            &lz4[..]
        };
        let n = lz4_flex::block::decompress_into(input, out).map_err(|e| {
            CodecError::DecompressFailed {
                index,
                detail: e.to_string(),
            }
        })?;
        if n != header.original_len {
            return Err(CodecError::LengthMismatch {
                index,
                expected: header.original_len,
                found: n,
            });
        }
    } else {
        // A raw payload is the block: `parse` checked that the lengths agree.
        out[..p1.len()].copy_from_slice(p1);
        out[p1.len()..].copy_from_slice(p2);
    }

    let expected = header.block_crc;
    let found = crc32fast::hash(out);
    if found != expected {
        return Err(CodecError::CorruptBlock {
            index,
            expected,
            found,
        });
    }
    Ok(())
}
