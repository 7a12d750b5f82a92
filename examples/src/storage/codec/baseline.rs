//! What the codec alone costs: writes (compress, split, parity, checksums), reads (verify,
//! decompress) and recovery reads (verify, rebuild, verify, decompress) on one core, in the
//! caller's buffers, with no I/O. The storage service cannot beat these figures per core, so
//! they are the baseline its throughput is read against.
//!
//! A quick run, 64 KiB blocks of mixed data (prints the figures):
//!
//! ```text
//! cargo test -p examples --release --lib storage::codec::tests::baseline::report -- --ignored --nocapture
//! ```

use std::hint::black_box;
use std::time::{Duration, Instant};

use super::{Codec, Half};

/// Throughput of one [`Codec`] on one core, in block (original, uncompressed) bytes per
/// second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Baseline {
    /// Writes: [`Codec::encode_into`] each block into three reused half buffers.
    pub write_bytes_per_sec: f64,
    /// Reads: [`Codec::decode_into`] each block from its data halves.
    pub read_bytes_per_sec: f64,
    /// Recovery reads: [`Codec::recover_into`] each block from data 1 and the parity.
    pub recover_bytes_per_sec: f64,
    /// How many blocks were measured (each kind of operation ran over all of them, as many
    /// times as `min_time` took).
    pub blocks: usize,
}

/// Measures `codec` on the calling thread over `blocks` (block `i` is given index `i`): each of
/// writes, reads and recovery reads runs over all the blocks, again and again until `min_time`
/// has passed (at least once), and is timed on its own. The halves that reads use are encoded
/// first, untimed, and every block is checked to decode and recover back to itself.
///
/// With no blocks, or only empty ones, every figure is 0.
///
/// # Panics
///
/// If a block does not encode (it is larger than [`Codec::block_size`]), or does not decode or
/// recover back to itself (a bug in the codec).
pub fn measure(codec: &dyn Codec, blocks: &[Vec<u8>], min_time: Duration) -> Baseline {
    let bytes: usize = blocks.iter().map(Vec::len).sum();
    if bytes == 0 {
        return Baseline {
            write_bytes_per_sec: 0.0,
            read_bytes_per_sec: 0.0,
            recover_bytes_per_sec: 0.0,
            blocks: blocks.len(),
        };
    }
    let half = codec.half_size();
    let mut out = vec![0u8; codec.block_size()];
    let stored: Vec<[Vec<u8>; 3]> = blocks
        .iter()
        .zip(0u64..)
        .map(|(block, index)| {
            let mut halves = [(); 3].map(|()| vec![0u8; half]);
            let [d1, d2, p] = &mut halves;
            if let Err(e) = codec.encode_into(index, block, [d1, d2, p]) {
                panic!("baseline: block {index} does not encode: {e}");
            }
            halves
        })
        .collect();
    for ((block, [d1, d2, p]), index) in blocks.iter().zip(&stored).zip(0u64..) {
        let decoded = codec.decode_into(index, d1, d2, &mut out);
        assert!(
            decoded.as_ref().is_ok_and(|n| out[..*n] == block[..]),
            "baseline: block {index} does not decode back to itself: {decoded:?}"
        );
        let recovered = codec.recover_into(index, d1, Half::Data1, p, &mut out);
        assert!(
            recovered.as_ref().is_ok_and(|n| out[..*n] == block[..]),
            "baseline: block {index} does not recover back to itself: {recovered:?}"
        );
    }

    let mut halves = [(); 3].map(|()| vec![0u8; half]);
    let write = rate(bytes, min_time, || {
        for (block, index) in blocks.iter().zip(0u64..) {
            let [d1, d2, p] = &mut halves;
            black_box(codec.encode_into(index, black_box(block), [d1, d2, p])).ok();
        }
    });
    let read = rate(bytes, min_time, || {
        for ([d1, d2, _], index) in stored.iter().zip(0u64..) {
            black_box(codec.decode_into(index, black_box(d1), d2, &mut out)).ok();
        }
    });
    let recover = rate(bytes, min_time, || {
        for ([d1, _, p], index) in stored.iter().zip(0u64..) {
            black_box(codec.recover_into(index, black_box(d1), Half::Data1, p, &mut out)).ok();
        }
    });
    Baseline {
        write_bytes_per_sec: write,
        read_bytes_per_sec: read,
        recover_bytes_per_sec: recover,
        blocks: blocks.len(),
    }
}

/// Runs `pass` (which handles `bytes`) until `min_time` has passed, at least once, and returns
/// bytes per second.
fn rate(bytes: usize, min_time: Duration, mut pass: impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut passes = 0u64;
    loop {
        pass();
        passes += 1;
        if start.elapsed() >= min_time {
            break;
        }
    }
    // A clock too coarse to see one pass must not make the figure infinite.
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    (bytes as f64 * passes as f64) / secs
}
