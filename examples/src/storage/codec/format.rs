//! The byte layout of format version 1 (see the [module docs](super)): sizes derived from the
//! block size, the metadata header, the trailer of every half, and the stream that runs over
//! the two data shards. Nothing here allocates.

use crc32fast::Hasher;

use super::{
    CodecError, Half, Slot, FORMAT_VERSION, HALF_ALIGN, HEADER_LEN, MAX_BLOCK_SIZE, TRAILER_LEN,
};

pub(super) const HEADER_MAGIC: [u8; 4] = *b"GGAB";
pub(super) const FLAG_COMPRESSED: u8 = 1;

pub(super) const H_MAGIC: usize = 0;
pub(super) const H_VERSION: usize = 4;
pub(super) const H_FLAGS: usize = 5;
pub(super) const H_RESERVED: usize = 6;
pub(super) const H_INDEX: usize = 8;
pub(super) const H_ORIGINAL_LEN: usize = 16;
pub(super) const H_STORED_LEN: usize = 20;
pub(super) const H_BLOCK_CRC: usize = 24;
pub(super) const H_RESERVED2: usize = 28;

pub(super) const T_VERSION: usize = 0;
pub(super) const T_SLOT: usize = 1;
pub(super) const T_RESERVED: usize = 2;
pub(super) const T_SHARD_LEN: usize = 4;
pub(super) const T_INDEX: usize = 8;
pub(super) const T_GROUP: usize = 16;
pub(super) const T_CRC: usize = 28;

/// Sizes derived from a block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Geometry {
    /// `B`.
    pub(super) block_size: usize,
    /// `S`: a whole half.
    pub(super) half: usize,
    /// `L`: the shard at the start of a half.
    pub(super) shard: usize,
}

/// The geometry of block size `block_size`, or [`CodecError::BadBlockSize`].
pub(super) fn geometry(block_size: usize) -> Result<Geometry, CodecError> {
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

/// What the metadata header of a verified stream says about the payload.
#[derive(Debug, Clone, Copy)]
pub(super) struct Header {
    /// Whether the payload is LZ4.
    pub(super) compressed: bool,
    /// The block's length.
    pub(super) original_len: usize,
    /// The payload's length.
    pub(super) stored_len: usize,
    /// CRC32 of the block.
    pub(super) block_crc: u32,
}

impl Header {
    /// The header of block `index`, whose payload is `stored_len` bytes (LZ4 if `compressed`).
    pub(super) fn of(
        index: u64,
        block: &[u8],
        stored_len: usize,
        compressed: bool,
    ) -> [u8; HEADER_LEN] {
        let mut header = [0u8; HEADER_LEN];
        header[H_MAGIC..H_MAGIC + 4].copy_from_slice(&HEADER_MAGIC);
        header[H_VERSION] = FORMAT_VERSION;
        header[H_FLAGS] = if compressed { FLAG_COMPRESSED } else { 0 };
        put_u64(&mut header, H_INDEX, index);
        // Both fit: they are at most block_size <= MAX_BLOCK_SIZE < 2^32.
        put_u32(&mut header, H_ORIGINAL_LEN, block.len() as u32);
        put_u32(&mut header, H_STORED_LEN, stored_len as u32);
        put_u32(&mut header, H_BLOCK_CRC, crc32fast::hash(block));
        header
    }

    /// Parses and checks the header at the start of the verified stream whose first shard is
    /// `s1`, for block `index` of geometry `g`.
    pub(super) fn parse(index: u64, s1: &[u8], g: Geometry) -> Result<Header, CodecError> {
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
        Ok(Header {
            compressed,
            original_len,
            stored_len,
            block_crc: get_u32(header, H_BLOCK_CRC),
        })
    }
}

/// A hasher that has seen `shard`: its value is the shard's checksum, and fed the trailer it
/// gives the half's.
pub(super) fn shard_hasher(shard: &[u8]) -> Hasher {
    let mut hasher = Hasher::new();
    hasher.update(shard);
    hasher
}

/// Writes the trailer of `half` (whose shard `hasher` has seen).
pub(super) fn seal(
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

/// Checksums the shards of the three halves and seals each of them with the group.
pub(super) fn seal_all(halves: [&mut [u8]; 3], index: u64, g: Geometry) {
    let hashers = [0, 1, 2].map(|k| shard_hasher(&halves[k][..g.shard]));
    let group = hashers.clone().map(|h| h.finalize());
    for ((half, hasher), slot) in halves.into_iter().zip(hashers).zip(Slot::ALL) {
        seal(half, hasher, slot, index, g, &group);
    }
}

/// Checks that `half` is the intact `slot` half of block `index` and returns its group.
pub(super) fn verify(
    half: &[u8],
    slot: Slot,
    index: u64,
    g: Geometry,
) -> Result<[u32; 3], CodecError> {
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

/// Writes `bytes` at offset `at` of the stream `s1 ‖ s2` (the caller knows it fits).
pub(super) fn write_stream(s1: &mut [u8], s2: &mut [u8], at: usize, bytes: &[u8]) {
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

/// Zeroes the stream `s1 ‖ s2` from offset `at` to its end.
pub(super) fn zero_stream_from(s1: &mut [u8], s2: &mut [u8], at: usize) {
    let split = s1.len();
    s1[at.min(split)..].fill(0);
    s2[at.max(split) - split..].fill(0);
}

/// The `len` bytes at offset `at` of the stream `s1 ‖ s2`, as a part in `s1` and a part in
/// `s2`; `None` if they are not all there.
pub(super) fn read_stream<'a>(
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

pub(super) fn get_u32(bytes: &[u8], at: usize) -> u32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(raw)
}

pub(super) fn get_u64(bytes: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(raw)
}

pub(super) fn put_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

pub(super) fn put_u64(bytes: &mut [u8], at: usize, value: u64) {
    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
}
