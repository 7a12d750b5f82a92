//! The memory-copy baseline. Where moving bytes is a copy (over `mem://`, over the DOCA
//! software provider, and through the loopback TCP stack), a throughput figure is bounded by
//! how fast one thread copies, and that depends on the working set: the one-connection runs
//! keep `depth` payloads in flight, the many-connection runs one per connection. Measured in
//! the same run: one thread copying 1 MiB buffers, cycling over as many as each run keeps in
//! flight.

use std::time::Instant;

use serde::Serialize;

/// Bytes of each buffer.
const BUFFER: usize = 1 << 20;

/// Copy rates of one thread over two working sets of 1 MiB buffers.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CopyRates {
    /// Buffers cycled over in the first figure (the one-connection depth).
    pub few_buffers: usize,
    /// GB/s copying among `few_buffers` buffers.
    pub few_gb_per_s: f64,
    /// Buffers cycled over in the second figure (the many-connection count).
    pub many_buffers: usize,
    /// GB/s copying among `many_buffers` buffers.
    pub many_gb_per_s: f64,
}

/// GB/s of one thread copying `total` bytes among `n` source and destination buffers.
fn rate(n: usize, total: usize) -> f64 {
    let src: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8; BUFFER]).collect();
    let mut dst: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; BUFFER]).collect();
    // One untimed pass: the pages exist before the clock starts.
    for (d, s) in dst.iter_mut().zip(&src) {
        d.copy_from_slice(s);
    }
    let copies = (total / BUFFER).max(n);
    let start = Instant::now();
    for i in 0..copies {
        dst[i % n].copy_from_slice(&src[i % n]);
    }
    std::hint::black_box(&dst);
    (copies * BUFFER) as f64 / start.elapsed().as_secs_f64().max(1e-9) / 1e9
}

/// Copy rates among `few` and among `many` buffers (each copying `total` bytes).
pub fn measure(few: usize, many: usize, total: usize) -> CopyRates {
    CopyRates {
        few_buffers: few,
        few_gb_per_s: rate(few, total),
        many_buffers: many,
        many_gb_per_s: rate(many, total),
    }
}
