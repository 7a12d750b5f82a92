//! The initiator: writes blocks from its registered I/O memory, reads them back into it, and
//! checks every byte. The I/O memory is shared with and offered whole to the service once per
//! connection (`init_storage`); each I/O names its block's place in it by offset, and the
//! service reaches it with one RDMA read (write) or one RDMA write (read). One connection per
//! core, each with its transactions in flight.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use rdma_rpc_core::transport::doca::Counters;
use rdma_rpc_core::{Access, Client, SharedBuf, SharedRegion, Status};

use super::cores::CoreThreads;
use crate::bench::measure::{process_cpu, process_cpu_since, CpuTime, Latencies};
use crate::generated::storage_service::{
    BlockIo, InitStorage, StorageCommand, StorageControl, StorageServiceClient,
};

/// Reads the transport's cost counters (`DocaTransport::counters`: memory registrations,
/// exports, imports), so that a run reports what each I/O cost in them.
pub type CostCounters = Arc<dyn Fn() -> Option<Counters> + Send + Sync>;

/// What one phase cost in registrations and imports, counted after its first I/Os (which warm
/// the pools and caches up), by the transport's counters, over every part in this process.
#[derive(Debug, Default, Clone, Copy)]
pub struct IoCost {
    /// I/Os counted (the phase's, after the first ones).
    pub ios: u64,
    /// I/Os before counting started.
    pub warm_up: u64,
    /// Memory registrations meanwhile.
    pub registrations: u64,
    /// Imports of a peer's memory meanwhile.
    pub imports: u64,
    /// Exports meanwhile.
    pub exports: u64,
    /// `doca_buf`s taken from inventories meanwhile (no NIC work, but work per operation).
    pub buffers_taken: u64,
}

impl IoCost {
    /// Registrations per I/O.
    pub fn registrations_per_io(&self) -> f64 {
        self.registrations as f64 / self.ios.max(1) as f64
    }

    /// Imports per I/O.
    pub fn imports_per_io(&self) -> f64 {
        self.imports as f64 / self.ios.max(1) as f64
    }

    /// Buffers taken per I/O.
    pub fn buffers_taken_per_io(&self) -> f64 {
        self.buffers_taken as f64 / self.ios.max(1) as f64
    }
}

/// What the initiator runs.
#[derive(Clone)]
pub struct InitiatorConfig {
    /// Bytes per block (at most the service's block size).
    pub block_size: usize,
    /// Blocks written, then read back.
    pub blocks: u64,
    /// Initiator cores, each with `transactions_per_core` I/O in flight.
    pub cores: u32,
    /// I/O in flight per core.
    pub transactions_per_core: u32,
    /// Draw a progress bar (on a terminal).
    pub progress: bool,
    /// The transport's cost counters, if it has them (DOCA over the software provider):
    /// the report then says what each I/O cost in registrations and imports.
    pub counters: Option<CostCounters>,
    /// A thread per core: the transactions of connection `k` run on core `k` (where that
    /// connection should have been made: [`super::cluster::Cluster::client_on`]). `None`: on
    /// the caller's runtime.
    pub threads: Option<Arc<CoreThreads>>,
}

impl std::fmt::Debug for InitiatorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InitiatorConfig")
            .field("block_size", &self.block_size)
            .field("blocks", &self.blocks)
            .field("cores", &self.cores)
            .field("transactions_per_core", &self.transactions_per_core)
            .field("progress", &self.progress)
            .field("counters", &self.counters.is_some())
            .field("threads", &self.threads)
            .finish()
    }
}

/// Latencies and counts of one operation.
#[derive(Debug, Default, Clone)]
pub struct OpReport {
    /// Blocks done.
    pub count: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Wall time of the phase.
    pub elapsed: Duration,
    /// CPU time this process used during the phase, every thread together (`None` where it
    /// cannot be read). When the process runs every part (`storage-demo`), this is what the
    /// whole storage path cost.
    pub cpu: Option<CpuTime>,
    /// Each I/O's latency.
    pub latencies: Latencies,
}

impl OpReport {
    /// I/O per second.
    pub fn iops(&self) -> f64 {
        self.count as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Payload gigabytes per second.
    pub fn gb_per_s(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9) / 1e9
    }

    /// The `q` quantile of the latencies (0 when none).
    pub fn quantile(&self, q: f64) -> Duration {
        self.latencies.quantile(q)
    }
}

/// What a run did.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// The write phase.
    pub write: OpReport,
    /// The read phase.
    pub read: OpReport,
    /// Reads rebuilt from the parity.
    pub recovery_reads: u64,
    /// Writes one target missed, with the first reason.
    pub degraded_writes: u64,
    /// Why the first degraded write was degraded.
    pub first_degraded: Option<String>,
    /// Bytes before and after compression, over all writes.
    pub original_bytes: u64,
    /// Bytes after compression.
    pub compressed_bytes: u64,
    /// What the writes cost in registrations and imports (with counters only).
    pub write_cost: Option<IoCost>,
    /// What the reads cost in registrations and imports (with counters only).
    pub read_cost: Option<IoCost>,
}

impl Report {
    /// Original over compressed bytes.
    pub fn compression_ratio(&self) -> f64 {
        self.original_bytes as f64 / (self.compressed_bytes.max(1)) as f64
    }

    /// The final table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<6} {:>8} {:>10} {:>8} {:>10} {:>10}\n",
            "op", "blocks", "IOPS", "GB/s", "p50 us", "p99 us"
        );
        for (name, op) in [("write", &self.write), ("read", &self.read)] {
            out.push_str(&format!(
                "{:<6} {:>8} {:>10.0} {:>8.3} {:>10.1} {:>10.1}\n",
                name,
                op.count,
                op.iops(),
                op.gb_per_s(),
                op.quantile(0.5).as_secs_f64() * 1e6,
                op.quantile(0.99).as_secs_f64() * 1e6,
            ));
        }
        out.push_str(&format!(
            "recovery reads: {}   degraded writes: {}   compression ratio: {:.2}\n",
            self.recovery_reads,
            self.degraded_writes,
            self.compression_ratio()
        ));
        if let Some(why) = &self.first_degraded {
            out.push_str(&format!("first degraded write: {why}\n"));
        }
        if let (Some(w), Some(r)) = (self.write.cpu, self.read.cpu) {
            let ((w, wu, wk), (r, ru, rk)) =
                (w.per_us(self.write.count), r.per_us(self.read.count));
            out.push_str(&format!(
                "CPU of this process per I/O, every thread: write {w:.1} us (user {wu:.1}, \
                 kernel {wk:.1}), read {r:.1} us (user {ru:.1}, kernel {rk:.1})\n"
            ));
        }
        for (name, cost) in [("write", &self.write_cost), ("read", &self.read_cost)] {
            if let Some(c) = cost {
                out.push_str(&format!(
                    "{name}: {:.3} registrations, {:.3} imports, {:.1} buffers taken per I/O \
                     (over {} I/Os after the first {}; all parts together)\n",
                    c.registrations_per_io(),
                    c.imports_per_io(),
                    c.buffers_taken_per_io(),
                    c.ios,
                    c.warm_up
                ));
            }
        }
        out
    }
}

/// Blocks a transaction takes at once from its phase's counter: the cores take that counter's
/// line from each other once per this many I/Os, not on every one.
const CLAIM: u64 = 4;

/// Distinct block contents; block `index` is template [`template_of`]`(index)` with its
/// index in the first 8 bytes, so that contents are made once and every block still differs.
const TEMPLATES: u64 = 64;

/// Consecutive blocks share a template in runs of this many, so that a worker's next block
/// often has the template its I/O memory already holds, and a write changes only the stamp
/// (the bytes an application would have in its memory anyway are not made anew per write).
const RUN: u64 = 64;

/// The template of block `index`.
fn template_of(index: u64) -> u64 {
    (index / RUN) % TEMPLATES
}

/// The bytes of block `index`: text that compresses, with a stretch of noise that does not
/// (the first KiB of every 4 KiB), so both the ratio and the checks mean something; the first
/// 8 bytes are the index.
pub fn block_contents(index: u64, len: usize) -> Vec<u8> {
    let mut out = template(template_of(index), len);
    stamp(&mut out, index);
    out
}

fn template(seed: u64, len: usize) -> Vec<u8> {
    const PAGE: usize = 4096;
    const NOISE: usize = 1024;
    let line = format!("block {seed:>10}: the quick brown fox jumps over the lazy dog. ");
    let text: Vec<u8> = line.bytes().cycle().take(PAGE - NOISE).collect();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + PAGE);
    while out.len() < len {
        for _ in 0..NOISE / 8 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.extend_from_slice(&x.to_le_bytes());
        }
        out.extend_from_slice(&text);
    }
    out.truncate(len);
    out
}

/// The first (up to) 8 bytes of block `index`: never all zero, so that clearing them before a
/// read shows a read that wrote nothing.
fn stamp_of(index: u64) -> [u8; 8] {
    (index | 1 << 63).to_le_bytes()
}

fn stamp(block: &mut [u8], index: u64) {
    let n = block.len().min(8);
    block[..n].copy_from_slice(&stamp_of(index)[..n]);
}

/// Block contents made once per run: what a worker copies into its I/O memory before a write
/// and compares after a read, without making each block anew.
struct Contents {
    templates: Vec<Vec<u8>>,
}

impl Contents {
    fn new(block_size: usize) -> Contents {
        Contents {
            templates: (0..TEMPLATES).map(|t| template(t, block_size)).collect(),
        }
    }

    /// Puts block `index` into `buf`, which holds template `held` (if any) from its last
    /// block: then only the stamp changes. Returns the template `buf` now holds.
    fn fill(&self, index: u64, buf: &mut SharedBuf, held: Option<u64>) -> Result<u64, Status> {
        let t = template_of(index);
        let template = &self.templates[t as usize];
        if held != Some(t) {
            buf.write_at(0, template).map_err(Status::from)?;
        }
        let n = template.len().min(8);
        buf.write_at(0, &stamp_of(index)[..n])
            .map_err(Status::from)?;
        Ok(t)
    }

    /// Whether `buf` holds block `index`, compared where it is, a few KiB at a time (no copy
    /// of the whole block to compare it).
    fn is(&self, index: u64, buf: &SharedBuf) -> Result<bool, Status> {
        let template = &self.templates[template_of(index) as usize];
        if buf.capacity() < template.len() {
            return Ok(false);
        }
        let n = template.len().min(8);
        let mut chunk = [0u8; 4096];
        let mut at = 0;
        while at < template.len() {
            let len = (template.len() - at).min(chunk.len());
            let got = &mut chunk[..len];
            buf.read_at(at, got).map_err(Status::from)?;
            let want = &template[at..at + len];
            let same = if at == 0 {
                got[..n] == stamp_of(index)[..n] && got[n..] == want[n..]
            } else {
                *got == *want
            };
            if !same {
                return Ok(false);
            }
            at += len;
        }
        Ok(true)
    }
}

/// Sends a control command.
pub async fn control(stub: &StorageServiceClient, command: StorageCommand) -> Result<(), Status> {
    let mut request = StorageControl::default();
    request.set_command(command);
    stub.control(request).await
}

/// Runs the whole flow against a service over one connection (see [`run_on`]).
pub async fn run(client: Client, config: &InitiatorConfig) -> Result<Report, Status> {
    run_on(vec![client], config).await
}

/// Runs the whole flow against a service, one connection per core (`clients`, as many as
/// `config.cores`, or fewer: cores then share them): query, share and offer the I/O memory
/// and init on each connection, start, write every block, read every block back and check
/// it, stop. Fails on the first wrong byte or failed I/O.
pub async fn run_on(clients: Vec<Client>, config: &InitiatorConfig) -> Result<Report, Status> {
    let first = clients
        .first()
        .cloned()
        .ok_or_else(|| Status::invalid_argument("no connection to the service"))?;
    let stub = StorageServiceClient::new(first);
    let geometry = stub.query_storage(()).await?;
    if config.block_size > geometry.block_size as usize {
        return Err(Status::invalid_argument(format!(
            "blocks of {} bytes do not fit the service's {}",
            config.block_size, geometry.block_size
        )));
    }
    if config.blocks > geometry.block_count {
        return Err(Status::invalid_argument(format!(
            "{} blocks do not fit the service's {}",
            config.blocks, geometry.block_count
        )));
    }
    let workers = (config.cores.max(1) * config.transactions_per_core.max(1)) as usize;
    // The I/O memory: registered, shared and offered whole once per connection, here; each
    // I/O then names its block by offset.
    let memory = SharedRegion::new(workers * config.block_size).map_err(Status::from)?;
    let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
    let mut lanes = Vec::new();
    for client in &clients {
        let share = client.remote_memory().share(&memory, rw)?;
        let offer = share.offer_all(rw)?;
        let lane = StorageServiceClient::new(client.clone());
        lane.init_storage(InitStorage {
            core_count: config.cores,
            transactions_per_core: config.transactions_per_core,
            block_size: config.block_size as u32,
            io_memory: Some(offer.handle()),
        })
        .await?;
        lanes.push((lane, share, offer));
    }
    control(&stub, StorageCommand::Start).await?;
    let bar = if config.progress {
        let bar = ProgressBar::new(2 * config.blocks);
        bar.set_style(
            ProgressStyle::with_template("{prefix:>6} [{bar:40}] {pos}/{len} blocks {per_sec}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar
    } else {
        ProgressBar::hidden()
    };
    let contents = Arc::new(Contents::new(config.block_size));
    let mut report = Report::default();
    // The first I/Os of a phase warm pools and caches up; what the rest cost is counted.
    let warm_up = (config.blocks / 10)
        .max(workers as u64)
        .min(config.blocks / 2);
    for write in [true, false] {
        bar.set_prefix(if write { "write" } else { "read" });
        let next = Arc::new(AtomicU64::new(0));
        let done_count = Arc::new(AtomicU64::new(0));
        let warmed = Arc::new(AtomicBool::new(false));
        let warm: Arc<std::sync::Mutex<Option<Counters>>> = Arc::default();
        let started = Instant::now();
        let cpu_before = process_cpu();
        let mut tasks = tokio::task::JoinSet::new();
        for w in 0..workers {
            let lane = w % lanes.len();
            let stub = lanes[lane].0.clone();
            let (next, bar, contents) = (next.clone(), bar.clone(), contents.clone());
            let (done_count, warmed, warm, counters) = (
                done_count.clone(),
                warmed.clone(),
                warm.clone(),
                config.counters.clone(),
            );
            let offset = w * config.block_size;
            let mut buf = memory
                .lease(offset, config.block_size)
                .map_err(Status::from)?;
            let (blocks, block_size) = (config.blocks, config.block_size);
            let transaction = async move {
                let mut seen = Vec::new();
                let stale = [0u8; 8];
                // The template the I/O memory holds from this worker's last write.
                let mut held = None;
                let mut claimed = 0..0;
                // Progress not yet shown.
                let mut unshown = 0;
                loop {
                    let block = match claimed.next() {
                        Some(block) => block,
                        None => {
                            let first = next.fetch_add(CLAIM, Ordering::Relaxed);
                            if first >= blocks {
                                bar.inc(unshown);
                                return Ok::<_, Status>(seen);
                            }
                            claimed = first + 1..(first + CLAIM).min(blocks);
                            first
                        }
                    };
                    if write {
                        held = Some(contents.fill(block, &mut buf, held)?);
                    } else {
                        // The stamp cleared: a read that wrote nothing cannot pass the check.
                        let n = block_size.min(8);
                        buf.write_at(0, &stale[..n]).map_err(Status::from)?;
                    }
                    let request = BlockIo {
                        block,
                        offset: offset as u64,
                        length: block_size as u32,
                    };
                    let t = Instant::now();
                    let done = if write {
                        stub.write_block(request).await?
                    } else {
                        stub.read_block(request).await?
                    };
                    seen.push((t.elapsed(), done));
                    if !write && !contents.is(block, &buf)? {
                        return Err(Status::data_loss(format!(
                            "block {block} read back differs from what was written"
                        )));
                    }
                    // Counted until the warm-up is over, then only read: a line both cores
                    // wrote on every I/O otherwise.
                    if !warmed.load(Ordering::Relaxed)
                        && done_count.fetch_add(1, Ordering::Relaxed) + 1 == warm_up
                    {
                        if let Some(read) = &counters {
                            *warm.lock().unwrap_or_else(|e| e.into_inner()) = read();
                        }
                        warmed.store(true, Ordering::Relaxed);
                    }
                    unshown += 1;
                    if unshown == CLAIM * 4 {
                        bar.inc(unshown);
                        unshown = 0;
                    }
                }
            };
            match &config.threads {
                Some(threads) => tasks.spawn_on(transaction, threads.handle(lane)),
                None => tasks.spawn(transaction),
            };
        }
        let mut op = OpReport::default();
        while let Some(joined) = tasks.join_next().await {
            let seen =
                joined.map_err(|e| Status::internal(format!("an I/O task failed: {e}")))??;
            for (latency, done) in seen {
                op.latencies.record(latency);
                op.count += 1;
                op.bytes += config.block_size as u64;
                if write {
                    report.original_bytes += u64::from(done.length);
                    report.compressed_bytes += u64::from(done.compressed_length);
                    if !done.degraded.is_empty() {
                        report.degraded_writes += 1;
                        report.first_degraded.get_or_insert(done.degraded);
                    }
                } else if done.recovered {
                    report.recovery_reads += 1;
                }
            }
        }
        op.elapsed = started.elapsed();
        op.cpu = process_cpu_since(cpu_before);
        let from = *warm.lock().unwrap_or_else(|e| e.into_inner());
        let cost = match (from, config.counters.as_ref().and_then(|read| read())) {
            (Some(from), Some(to)) => {
                let d = to.since(&from);
                Some(IoCost {
                    ios: op.count - warm_up,
                    warm_up,
                    registrations: d.registrations,
                    imports: d.imports,
                    exports: d.exports,
                    buffers_taken: d.buffers_taken,
                })
            }
            _ => None,
        };
        if write {
            report.write = op;
            report.write_cost = cost;
        } else {
            report.read = op;
            report.read_cost = cost;
        }
    }
    bar.finish_and_clear();
    control(&stub, StorageCommand::Stop).await?;
    for (_, _share, offer) in lanes {
        offer.revoke().await;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use rdma_rpc_core::SharedRegion;

    use super::{block_contents, template_of, Contents, RUN};

    /// A write restamps a buffer that holds its template and fills one that does not; a read's
    /// check, made a few KiB at a time, finds a wrong stamp and a wrong byte anywhere.
    #[test]
    fn blocks_are_made_and_checked_in_place() {
        let len = 3 * 4096 + 100;
        let contents = Contents::new(len);
        let region = SharedRegion::new(len).unwrap();
        let mut buf = region.lease(0, len).unwrap();
        let whole = |buf: &rdma_rpc_core::SharedBuf| {
            let mut bytes = vec![0u8; len];
            buf.read_at(0, &mut bytes).unwrap();
            bytes
        };
        let held = contents.fill(5, &mut buf, None).unwrap();
        assert_eq!(held, template_of(5));
        assert!(contents.is(5, &buf).unwrap());
        // Block 6 shares block 5's template: only the stamp changes.
        assert_eq!(template_of(6), held);
        contents.fill(6, &mut buf, Some(held)).unwrap();
        assert_eq!(whole(&buf), block_contents(6, len));
        assert!(contents.is(6, &buf).unwrap());
        assert!(!contents.is(5, &buf).unwrap(), "another block's stamp");
        // The next run has another template: the whole block is written.
        let next = RUN * 3 + 1;
        assert_ne!(template_of(next), held);
        let held = contents.fill(next, &mut buf, Some(held)).unwrap();
        assert_eq!(held, template_of(next));
        assert_eq!(whole(&buf), block_contents(next, len));
        // A byte wrong in the last, partial chunk, then in the first after the stamp.
        for at in [len - 1, 9] {
            let mut byte = [0u8];
            buf.read_at(at, &mut byte).unwrap();
            buf.write_at(at, &[byte[0] ^ 1]).unwrap();
            assert!(!contents.is(next, &buf).unwrap(), "byte {at} flipped");
            buf.write_at(at, &byte).unwrap();
            assert!(contents.is(next, &buf).unwrap());
        }
        // A buffer shorter than a block never holds one.
        drop(buf);
        let short = region.lease(0, len - 1).unwrap();
        assert!(!contents.is(next, &short).unwrap());
    }
}
