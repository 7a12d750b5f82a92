//! The codec-alone baseline: it runs, its figures make sense, and (ignored by default) a quick
//! run on 64 KiB blocks of mixed data, printed.

use std::time::Duration;

use super::*;
use crate::storage::codec::baseline::measure;

#[test]
fn figures_are_positive_and_finite() {
    let codec = CpuCodec::new(B).unwrap();
    let blocks = vec![compressible(B), incompressible(B, 8), compressible(100)];
    let baseline = measure(&codec, &blocks, Duration::from_millis(1));
    assert_eq!(baseline.blocks, 3);
    for figure in [
        baseline.write_bytes_per_sec,
        baseline.read_bytes_per_sec,
        baseline.recover_bytes_per_sec,
    ] {
        assert!(figure.is_finite() && figure > 0.0, "{baseline:?}");
    }
}

#[test]
fn no_bytes_give_zero_figures() {
    let codec = CpuCodec::new(B).unwrap();
    let baseline = measure(&codec, &[Vec::new()], Duration::from_secs(60));
    assert_eq!(
        (baseline.write_bytes_per_sec, baseline.blocks),
        (0.0, 1),
        "{baseline:?}"
    );
}

/// 64 KiB blocks of mixed data: a quarter each text-like (about 6:1 under LZ4), random
/// (stored raw), half text and half random, and zeros.
fn mixed(count: usize) -> Vec<Vec<u8>> {
    const BLOCK: usize = 64 * 1024;
    (0..count as u64)
        .map(|i| match i % 4 {
            0 => compressible(BLOCK),
            1 => incompressible(BLOCK, i),
            2 => {
                let mut block = compressible(BLOCK / 2);
                block.extend(incompressible(BLOCK / 2, i));
                block
            }
            _ => vec![0u8; BLOCK],
        })
        .collect()
}

/// `cargo test -p examples --release --lib storage::codec::tests::baseline::report --
/// --ignored --nocapture`
#[test]
#[ignore = "a measurement, not a check: run it in release with --nocapture"]
fn report() {
    let codec = CpuCodec::new(64 * 1024).unwrap();
    let blocks = mixed(64);
    let stored: usize = blocks
        .iter()
        .map(|b| encode(0, b, 64 * 1024).unwrap().compressed_len)
        .sum();
    let original: usize = blocks.iter().map(Vec::len).sum();
    let b = measure(&codec, &blocks, Duration::from_secs(1));
    let mib = |bytes_per_sec: f64| bytes_per_sec / (1024.0 * 1024.0);
    println!(
        "codec alone, one core, {} blocks of 64 KiB mixed data (payload {:.2} of the original):\n\
         \x20 writes   {:8.1} MiB/s\n\
         \x20 reads    {:8.1} MiB/s\n\
         \x20 recovery {:8.1} MiB/s",
        b.blocks,
        stored as f64 / original as f64,
        mib(b.write_bytes_per_sec),
        mib(b.read_bytes_per_sec),
        mib(b.recover_bytes_per_sec),
    );
}
