//! The codec's tests: the format and the free functions here, the [`Codec`] interface and
//! what it allocates in the files of `tests/`.

mod allocations;
mod baseline;
mod cpu;
mod parity;

use super::erasure;
use super::format::{
    geometry, put_u32, seal, seal_all, shard_hasher, write_stream, H_FLAGS, H_INDEX, H_MAGIC,
    H_ORIGINAL_LEN, H_RESERVED2, H_STORED_LEN, H_VERSION, T_GROUP, T_RESERVED, T_SHARD_LEN, T_SLOT,
    T_VERSION,
};
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
    let (s1, s2) = (&e.data1[..g.shard], &e.data2[..g.shard]);
    erasure::parity_into(s1, s2, &mut e.parity[..g.shard]);
    seal_all([&mut e.data1, &mut e.data2, &mut e.parity], index, g);
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
        (
            CodecError::BadBlockSize { block_size: 3 },
            "block size 3 is not usable: it must be even and between 2 and 1073741824 bytes",
        ),
        (
            CodecError::UnsupportedVersion {
                index: 3,
                slot: Slot::Parity,
                version: 9,
            },
            "parity half of block 3: format version 9, this codec reads version 1",
        ),
    ];
    for (err, text) in cases {
        assert_eq!(err.to_string(), text);
    }
}
