//! The storage application end to end, in one process: three targets, the service and the
//! initiator over TCP, `mem://` and DOCA (software provider). Blocks of several sizes are
//! written and read back byte for byte; recovery reads, a target lost mid-run, corrupt halves
//! and control commands out of order; callers without the secrets refused.

use std::sync::Arc;
use std::time::Duration;

use examples::generated::storage_service::{
    BlockIo, InitStorage, StorageCommand, StorageServiceClient,
};
use examples::storage::auth::Secret;
use examples::storage::cluster::{Cluster, ClusterConfig};
use examples::storage::initiator::{self, block_contents, InitiatorConfig};
use examples::storage::service::ServiceConfig;
use examples::storage::target;
use rdma_rpc_core::transport::{transport_for, Transport};
use rdma_rpc_core::{Access, Code, RegionOffer, Share, SharedRegion, Status};

fn config(block_size: usize, block_count: u64, recovery_every: u64) -> ClusterConfig {
    ClusterConfig {
        block_size,
        block_count,
        service: ServiceConfig {
            recovery_every,
            control_timeout: Duration::from_secs(5),
            cores: 2,
            codec: None,
            target_secret: Secret::random(),
            threads: None,
        },
        service_secret: Secret::random(),
    }
}

/// One connection per core of the initiator (2).
async fn clients(cluster: &Cluster) -> Vec<rdma_rpc_core::Client> {
    vec![
        cluster.client().await.unwrap(),
        cluster.client().await.unwrap(),
    ]
}

fn initiator(block_size: usize, blocks: u64) -> InitiatorConfig {
    InitiatorConfig {
        block_size,
        blocks,
        cores: 2,
        transactions_per_core: 4,
        progress: false,
        counters: None,
        threads: None,
    }
}

/// With `RDMA_RPC_TEST_LOG=<level>` (`debug`, `trace`, ...), logs every part of every test
/// in this process to stderr, with times and thread names, through one global subscriber;
/// nothing without it. Run one test at a time to read a failure's lines in order.
fn log_if_asked() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Ok(level) = std::env::var("RDMA_RPC_TEST_LOG") else {
            return;
        };
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level.parse().unwrap_or(tracing::Level::DEBUG))
            .with_thread_names(true)
            .with_ansi(false)
            .with_writer(std::io::stderr)
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
}

async fn start(scheme: &str, config: &ClusterConfig) -> Cluster {
    log_if_asked();
    let bind = match scheme {
        "mem://" => "mem://",
        "doca://" => "doca://127.0.0.1:0",
        _ => "tcp://127.0.0.1:0",
    };
    let transport: Arc<dyn Transport> = transport_for(bind).unwrap();
    Cluster::start(transport, bind, config).await.unwrap()
}

/// Writes and reads back `blocks` blocks of each size; every Nth read goes through parity.
async fn round_trip(scheme: &str, sizes: &[usize], blocks: u64) {
    for &size in sizes {
        let cluster = start(scheme, &config(size, blocks, 5)).await;
        let report = initiator::run_on(clients(&cluster).await, &initiator(size, blocks))
            .await
            .unwrap();
        assert_eq!((report.write.count, report.read.count), (blocks, blocks));
        assert_eq!(report.recovery_reads, blocks / 5, "every 5th read recovers");
        assert_eq!(report.degraded_writes, 0);
        assert!(report.compression_ratio() > 1.2, "{}", report.table());
        // What each phase cost in CPU is measured and shown next to it.
        #[cfg(unix)]
        for phase in [&report.write, &report.read] {
            assert!(
                phase.cpu.is_some_and(|cpu| !cpu.total().is_zero()),
                "{}",
                report.table()
            );
        }
        #[cfg(unix)]
        assert!(report.table().contains("CPU of this process per I/O"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_round_trip_over_tcp() {
    round_trip("tcp://", &[4096, 64 << 10, 1 << 20], 40).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_round_trip_over_mem() {
    round_trip("mem://", &[4096, 256 << 10], 60).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_round_trip_over_doca() {
    round_trip("doca://", &[4096, 64 << 10], 30).await;
    let violations = doca_sys::take_contract_violations();
    assert!(
        violations.is_empty(),
        "DOCA contract violations: {violations:#?}"
    );
}

/// A data path per core: with a thread per core, each core's initiator connection, service
/// listener and service-to-target lanes live on that core's thread, and every I/O the service
/// starts runs on one of them, spread over both.
async fn a_data_path_per_core(scheme: &str) {
    use examples::storage::cores::CoreThreads;
    let threads = CoreThreads::start(2).unwrap();
    let mut config = config(64 << 10, 80, 5);
    config.service.threads = Some(threads.clone());
    let cluster = start(scheme, &config).await;
    assert_eq!(
        cluster.service_addrs.len(),
        2,
        "a service listener per core"
    );
    let clients = vec![
        cluster.client_on(0).await.unwrap(),
        cluster.client_on(1).await.unwrap(),
    ];
    let mut setup = initiator(64 << 10, 80);
    setup.threads = Some(threads);
    let report = initiator::run_on(clients, &setup).await.unwrap();
    assert_eq!((report.write.count, report.read.count), (80, 80));
    assert_eq!(report.recovery_reads, 16, "every 5th read recovers");
    let (by_core, elsewhere) = cluster.service.ios_by_core();
    assert_eq!(elsewhere, 0, "every I/O ran on a core thread: {by_core:?}");
    assert_eq!(by_core.iter().sum::<u64>(), 160, "{by_core:?}");
    // Each core's 4 transactions take blocks as they finish: both cores serve I/O.
    assert!(by_core.iter().all(|&n| n > 0), "{by_core:?}");
    // Each core's I/Os took their staging from that core's lane only.
    let lanes = cluster.service.staging_by_lane();
    assert_eq!(lanes.len(), 2, "staging per lane");
    for (lane, (by_core, elsewhere)) in lanes.iter().enumerate() {
        assert_eq!(*elsewhere, 0, "lane {lane}: {by_core:?}");
        for (core, &n) in by_core.iter().enumerate() {
            assert_eq!(
                n > 0,
                core == lane,
                "lane {lane}'s staging on core {core}: {lanes:?}"
            );
        }
    }
    // And each target moved its halves on the core threads of its listeners: data 1 in every
    // write and read, data 2 in the reads that do not recover, the parity in those that do.
    for (target, moved) in cluster.targets.iter().zip([160, 80 + 64, 80 + 16]) {
        let (by_core, elsewhere) = target.halves_by_core();
        let slot = target.slot();
        assert_eq!(elsewhere, 0, "{slot}: every half on a core: {by_core:?}");
        assert_eq!(by_core.iter().sum::<u64>(), moved, "{slot}: {by_core:?}");
        assert!(by_core.iter().all(|&n| n > 0), "{slot}: {by_core:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_path_per_core_over_tcp() {
    a_data_path_per_core("tcp://").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_path_per_core_over_mem() {
    a_data_path_per_core("mem://").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_path_per_core_over_doca() {
    a_data_path_per_core("doca://").await;
    let violations = doca_sys::take_contract_violations();
    assert!(
        violations.is_empty(),
        "DOCA contract violations: {violations:#?}"
    );
}

/// Register once: over DOCA, after the first I/Os of each phase, no I/O registers, exports
/// or imports memory anywhere (initiator, service, targets). On `mlx5_1`, which no other test
/// of this binary uses, so the counters see this run only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_io_registers_memory_over_doca_once_warm() {
    use rdma_rpc_core::transport::doca::{DocaConfig, DocaTransport};
    let mut doca_config = DocaConfig::from_env();
    doca_config.device = Some("mlx5_1".into());
    let doca = DocaTransport::new(doca_config).unwrap();
    let bind = "doca://127.0.0.1:0";
    let cluster = Cluster::start(Arc::new(doca.clone()), bind, &config(64 << 10, 200, 5))
        .await
        .unwrap();
    let read = doca.clone();
    let mut setup = initiator(64 << 10, 200);
    setup.counters = Some(Arc::new(move || read.counters()));
    let report = initiator::run_on(clients(&cluster).await, &setup)
        .await
        .unwrap();
    for (name, cost) in [("write", report.write_cost), ("read", report.read_cost)] {
        let cost = cost.expect("counted");
        assert!(cost.ios >= 100, "{name}: {cost:?}");
        assert_eq!(
            (cost.registrations, cost.exports, cost.imports),
            (0, 0, 0),
            "{name}: per-I/O registrations, exports or imports\n{}",
            report.table()
        );
    }
    assert_eq!(report.recovery_reads, 40, "recovery reads ran too");
    let violations = doca_sys::take_contract_violations();
    assert!(
        violations.is_empty(),
        "DOCA contract violations: {violations:#?}"
    );
}

/// The data 2 target dies after storing 10 halves: the rest of the writes say so, every read
/// is rebuilt from data 1 and the parity, and every byte comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_lost_mid_run_loses_nothing_over_tcp() {
    a_target_lost_mid_run_loses_nothing("tcp://").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_lost_mid_run_loses_nothing_over_doca() {
    a_target_lost_mid_run_loses_nothing("doca://").await;
}

async fn a_target_lost_mid_run_loses_nothing(scheme: &str) {
    let blocks = 40;
    let cluster = start(scheme, &config(16 << 10, blocks, 0)).await;
    let stored = cluster.targets[1].stored(10);
    let clients = clients(&cluster).await;
    let run =
        tokio::spawn(async move { initiator::run_on(clients, &initiator(16 << 10, blocks)).await });
    stored.await;
    cluster.kill_target(1);
    let report = run.await.unwrap().unwrap();
    assert_eq!(
        report.read.count, blocks,
        "every block read back and checked"
    );
    assert!(report.degraded_writes > 0, "{}", report.table());
    let why = report.first_degraded.clone().unwrap();
    assert!(why.starts_with("data 2:"), "{why}");
    assert_eq!(
        report.recovery_reads, blocks,
        "data 2 is gone: every read recovers"
    );
}

/// An initiator's I/O memory on one connection: shared and offered whole once.
struct Io {
    region: SharedRegion,
    offer: Option<(Share, RegionOffer)>,
}

impl Io {
    fn new(client: &rdma_rpc_core::Client, len: usize) -> Io {
        let region = SharedRegion::new(len).unwrap();
        let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
        let share = client.remote_memory().share(&region, rw).unwrap();
        let offer = share.offer_all(rw).unwrap();
        Io {
            region,
            offer: Some((share, offer)),
        }
    }

    fn init(&self, block_size: usize, transactions: u32) -> InitStorage {
        InitStorage {
            core_count: 1,
            transactions_per_core: transactions,
            block_size: block_size as u32,
            io_memory: self.offer.as_ref().map(|(_, offer)| offer.handle()),
        }
    }
}

async fn write(stub: &StorageServiceClient, io: &Io, block: u64, len: usize) -> Result<(), Status> {
    io.region
        .lease(0, len)
        .unwrap()
        .write_at(0, &block_contents(block, len))
        .unwrap();
    let request = BlockIo {
        block,
        offset: 0,
        length: len as u32,
    };
    stub.write_block(request).await.map(drop)
}

async fn read(
    stub: &StorageServiceClient,
    io: &Io,
    block: u64,
    len: usize,
) -> Result<(bool, Vec<u8>), Status> {
    io.region
        .lease(0, len)
        .unwrap()
        .write_at(0, &vec![0; len])
        .unwrap();
    let request = BlockIo {
        block,
        offset: 0,
        length: len as u32,
    };
    let done = stub.read_block(request).await?;
    let mut bytes = vec![0; len];
    io.region
        .lease(0, len)
        .unwrap()
        .read_at(0, &mut bytes)
        .unwrap();
    Ok((done.recovered, bytes))
}

async fn ready(cluster: &Cluster, block_size: usize) -> (StorageServiceClient, Io) {
    let client = cluster.client().await.unwrap();
    let stub = StorageServiceClient::new(client.clone());
    let io = Io::new(&client, block_size);
    stub.init_storage(io.init(block_size, 2)).await.unwrap();
    initiator::control(&stub, StorageCommand::Start)
        .await
        .unwrap();
    (stub, io)
}

/// A corrupt data half is rebuilt from the parity; a corrupt parity behind it is caught by its
/// checksum and reported as data loss, naming the block, never returned as data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_halves_are_detected_by_checksum_over_tcp() {
    corrupt_halves_are_detected_by_checksum("tcp://").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_halves_are_detected_by_checksum_over_doca() {
    corrupt_halves_are_detected_by_checksum("doca://").await;
}

async fn corrupt_halves_are_detected_by_checksum(scheme: &str) {
    let len = 8192;
    let cluster = start(scheme, &config(len, 8, 0)).await;
    let (stub, io) = ready(&cluster, len).await;
    for block in 0..4 {
        write(&stub, &io, block, len).await.unwrap();
    }
    target::corrupt(&cluster.targets[0], 1, 100).unwrap();
    let (recovered, bytes) = read(&stub, &io, 1, len).await.unwrap();
    assert!(recovered, "data 1 failed its checksum: rebuilt from parity");
    assert_eq!(bytes, block_contents(1, len));
    // Data 2 of a block this compressible carries no data (only zeros, which never move, and
    // its trailer): its trailer goes bad.
    let trailer = cluster.targets[1].half_size() - 20;
    // Its zeros are never stored: they cannot go bad.
    let zeros = target::corrupt(&cluster.targets[1], 2, 5).unwrap_err();
    assert_eq!(zeros.code(), Code::InvalidArgument, "{zeros}");
    target::corrupt(&cluster.targets[1], 2, trailer).unwrap();
    target::corrupt(&cluster.targets[2], 2, 7).unwrap();
    let status = read(&stub, &io, 2, len).await.unwrap_err();
    assert_eq!(status.code(), Code::DataLoss, "{status}");
    assert!(
        status.message().contains("block 2") && status.message().contains("parity"),
        "{status}"
    );
    let (recovered, bytes) = read(&stub, &io, 3, len).await.unwrap();
    assert!(!recovered);
    assert_eq!(bytes, block_contents(3, len), "other blocks are untouched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_commands_out_of_order_are_refused() {
    let len = 4096;
    let cluster = start("tcp://", &config(len, 4, 0)).await;
    let client = cluster.client().await.unwrap();
    let stub = StorageServiceClient::new(client.clone());
    let io = Io::new(&client, len);
    let refused = |r: Result<(), Status>, what: &str| {
        let status = r.unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition, "{what}: {status}");
        status.message().to_owned()
    };
    let why = refused(write(&stub, &io, 0, len).await, "a write before init");
    assert!(why.contains("init_storage"), "{why}");
    refused(
        initiator::control(&stub, StorageCommand::Start).await,
        "start before init",
    );
    refused(
        initiator::control(&stub, StorageCommand::Stop).await,
        "stop before start",
    );
    let init = io.init(len, 1);
    let without = InitStorage {
        io_memory: None,
        ..init.clone()
    };
    let status = stub.init_storage(without).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    stub.init_storage(init.clone()).await.unwrap();
    let why = refused(write(&stub, &io, 0, len).await, "a write before start");
    assert!(why.contains("start"), "{why}");
    initiator::control(&stub, StorageCommand::Start)
        .await
        .unwrap();
    refused(stub.init_storage(init).await, "init while running");
    refused(
        initiator::control(&stub, StorageCommand::Start).await,
        "start twice",
    );
    write(&stub, &io, 0, len).await.unwrap();
    initiator::control(&stub, StorageCommand::Shutdown)
        .await
        .unwrap();
    // Refused by the service, or by the server that is going down with it.
    let after = write(&stub, &io, 1, len).await.unwrap_err();
    assert!(
        matches!(after.code(), Code::FailedPrecondition | Code::Unavailable),
        "a write after shutdown: {after}"
    );
    bounded("everything stops", cluster.join()).await;
}

/// A failure bound of 60 s, never what a test asserts. At the bound the future is not polled
/// again, so one that lost a wake-up fails here instead of passing late.
async fn bounded<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::select! {
        biased; // the deadline first: once it passed, `fut` is not polled again
        () = tokio::time::sleep(Duration::from_secs(60)) => panic!("{what} hung"),
        out = fut => out,
    }
}

/// A TCP proxy to `to` for hostile tests: it forwards both ways until `cut` is set, then drops
/// everything the server sends (to the client it looks like a peer whose NIC stopped
/// answering). Counts the connections the server closed.
async fn black_hole_proxy(
    to: String,
) -> (
    String,
    Arc<std::sync::atomic::AtomicBool>,
    tokio::sync::watch::Receiver<usize>,
) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("tcp://{}", listener.local_addr().unwrap());
    let cut = Arc::new(AtomicBool::new(false));
    let (closed_tx, closed) = tokio::sync::watch::channel(0usize);
    let closed_tx = Arc::new(closed_tx);
    let (to, cut_flag) = (to.trim_start_matches("tcp://").to_owned(), cut.clone());
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let server = tokio::net::TcpStream::connect(&to).await.unwrap();
            let (mut client_rd, mut client_wr) = client.into_split();
            let (mut server_rd, mut server_wr) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut client_rd, &mut server_wr).await;
            });
            let (cut, closed) = (cut_flag.clone(), closed_tx.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    match server_rd.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) if !cut.load(Ordering::SeqCst) => {
                            if client_wr.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                        Ok(_) => {} // the black hole
                    }
                }
                closed.send_modify(|n| *n += 1);
            });
        }
    });
    (addr, cut, closed)
}

/// The attack a hostile client made on a target: 128 `write_half` calls whose RDMA reads of
/// its memory it never answers. Each held its block's slot ("block busy" for everyone else)
/// until the attacker reset its connection. Now each read is bounded by the target's
/// `transfer_timeout` (and by the call's deadline, had the attacker set one): the attacker loses
/// its connections, every block is free again, and a legitimate client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_answers_cannot_keep_a_targets_blocks() {
    use examples::generated::storage_target::{
        Command, HalfIo, StorageTargetClient, StorageTargetServer, TargetControl, TargetInit,
    };
    use examples::storage::codec::Slot;
    use examples::storage::target::{Target, TargetConfig};
    let config = TargetConfig::new(Slot::Data1, 4096, 256).unwrap();
    let target = Arc::new(Target::new(config).unwrap());
    // Eight receives per connection from the start: a connection that hears nothing keeps
    // 7 credits, room for the attack's 4 calls each.
    let server = rdma_rpc_core::Server::builder()
        .transfer_timeout(Duration::from_millis(300))
        .initial_receives(8)
        .add_service(StorageTargetServer::new(target.clone()))
        .bind("tcp://127.0.0.1:0")
        .await
        .unwrap();
    let addr = server.local_addr();
    tokio::spawn(server.serve());
    let legit = rdma_rpc_core::Client::connect(&addr).await.unwrap();
    let stub = StorageTargetClient::new(legit.clone());
    let mut start = TargetControl::default();
    start.set_command(Command::Start);
    stub.control(start).await.unwrap();
    let region = SharedRegion::new(1 << 20).unwrap();
    let half = config.half_size;
    // Each connection shares and offers the region once and tells the target (`init`).
    let init = |client: rdma_rpc_core::Client| {
        let region = region.clone();
        async move {
            let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
            let share = client.remote_memory().share(&region, rw).unwrap();
            let offer = share.offer_all(rw).unwrap();
            let memory = Some(offer.handle());
            StorageTargetClient::new(client)
                .init(TargetInit { memory })
                .await
                .unwrap();
            (share, offer)
        }
    };
    let write_half = |client: rdma_rpc_core::Client, block: u64, at: usize| async move {
        let io = HalfIo {
            block,
            offset: at as u64,
            length: half as u32,
            used: (half - examples::storage::codec::TRAILER_LEN) as u32,
        };
        StorageTargetClient::new(client)
            .write_half(io)
            .await
            .map(drop)
    };
    let _legit_memory = init(legit.clone()).await;

    // The attacker: 32 connections through a proxy that, once they are up, stops passing
    // anything the target sends: 4 calls each (within the credits of a connection that hears
    // nothing), 128 in all, whose reads are never answered.
    let (via, cut, closed) = black_hole_proxy(addr.clone()).await;
    let mut attackers = Vec::new();
    let mut attacker_memory = Vec::new();
    for _ in 0..32 {
        let attacker = rdma_rpc_core::Client::connect(&via).await.unwrap();
        attacker_memory.push(init(attacker.clone()).await);
        attackers.push(attacker);
    }
    cut.store(true, std::sync::atomic::Ordering::SeqCst);
    let attack: Vec<_> = (0..128u64)
        .map(|block| {
            let client = attackers[block as usize / 4].clone();
            let at = block as usize * half;
            tokio::spawn(write_half(client, block, at))
        })
        .collect();
    bounded("the attack holds 128 blocks", async {
        while target.busy() < 128 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let refused = write_half(legit.clone(), 5, 900 << 10).await.unwrap_err();
    assert_eq!(refused.code(), Code::Aborted, "{refused}");
    assert!(refused.message().contains("busy"), "{refused}");

    // The target gives up on the reads: it closes the attacker's connections, which frees
    // every block; then it serves the legitimate client, every block.
    let mut closed = closed;
    bounded(
        "the attacker's connections closed",
        closed.wait_for(|n| *n >= 32),
    )
    .await
    .unwrap();
    bounded("every block free again", async {
        while target.busy() > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    for block in 0..128 {
        write_half(legit.clone(), block, 900 << 10)
            .await
            .unwrap_or_else(|s| panic!("block {block}: {s}"));
    }
    for call in attack {
        call.abort();
    }
}

/// The attacks a hostile client made on a running cluster, over every transport: shutting a
/// target down through `/target/control`, reading another client's stored half through
/// `/target/io/read`, and driving the service without its initiator's secret. Each is refused
/// (`UNAUTHENTICATED` without a secret, `PERMISSION_DENIED` with another tier's), nothing
/// changes, and the storage goes on serving its initiator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_service_reaches_targets_and_only_its_initiator_the_service() {
    for scheme in ["tcp://", "mem://", "doca://"] {
        refuses_strangers(scheme).await;
    }
    let violations = doca_sys::take_contract_violations();
    assert!(
        violations.is_empty(),
        "DOCA contract violations: {violations:#?}"
    );
}

async fn refuses_strangers(scheme: &str) {
    use examples::generated::storage_target::{
        Command, HalfIo, StorageTargetClient, TargetControl, TargetInit,
    };
    let (len, blocks) = (8192, 16);
    let setup = config(len, blocks, 0);
    let cluster = start(scheme, &setup).await;
    let (stub, io) = ready(&cluster, len).await;
    for block in 0..4 {
        write(&stub, &io, block, len).await.unwrap();
    }
    let connect = |addr: String, secret: Option<Secret>| {
        let transport = cluster.transport.clone();
        async move {
            let mut builder = rdma_rpc_core::Client::builder().transport(transport);
            if let Some(secret) = secret {
                builder = builder.interceptor(secret.present());
            }
            builder.connect(&addr).await.unwrap()
        }
    };
    let refused = |r: Result<(), Status>, code: Code, what: &str| {
        let status = r.expect_err(what);
        assert_eq!(status.code(), code, "{scheme} {what}: {status}");
    };
    // A stranger, and the initiator's own secret, at a target.
    for (secret, code) in [
        (None, Code::Unauthenticated),
        (Some(setup.service_secret.clone()), Code::PermissionDenied),
    ] {
        let stranger = connect(cluster.target_addrs[0].clone(), secret).await;
        let target = StorageTargetClient::new(stranger.clone());
        let mut shutdown = TargetControl::default();
        shutdown.set_command(Command::Shutdown);
        refused(target.control(shutdown).await, code, "a target shut down");
        // Its own memory to read another client's half into.
        let region = SharedRegion::new(1 << 20).unwrap();
        let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
        let share = stranger.remote_memory().share(&region, rw).unwrap();
        let offer = share.offer_all(rw).unwrap();
        let init = TargetInit {
            memory: Some(offer.handle()),
        };
        refused(target.init(init).await, code, "a target's init");
        let io = HalfIo {
            block: 1,
            offset: 0,
            length: cluster.targets[0].half_size() as u32,
            used: 0,
        };
        refused(
            target.read_half(io).await.map(drop),
            code,
            "a stored half read",
        );
        let mut bytes = vec![0; 64];
        region.lease(0, 64).unwrap().read_at(0, &mut bytes).unwrap();
        assert!(bytes.iter().all(|&b| b == 0), "nothing was written");
    }
    // A stranger, and the targets' secret, at the service.
    for (secret, code) in [
        (None, Code::Unauthenticated),
        (
            Some(setup.service.target_secret.clone()),
            Code::PermissionDenied,
        ),
    ] {
        let stranger = connect(cluster.service_addr.clone(), secret).await;
        let service = StorageServiceClient::new(stranger.clone());
        let other = Io::new(&stranger, len);
        refused(
            service.init_storage(other.init(len, 1)).await,
            code,
            "the service's init",
        );
        let io = BlockIo {
            block: 1,
            offset: 0,
            length: len as u32,
        };
        refused(service.read_block(io).await.map(drop), code, "a block read");
        refused(
            initiator::control(&service, StorageCommand::Shutdown).await,
            code,
            "the service shut down",
        );
    }
    // Nothing changed: the initiator reads what it wrote, and writes more.
    for block in 0..4 {
        let (recovered, bytes) = read(&stub, &io, block, len).await.unwrap();
        assert!(!recovered, "{scheme}: every target kept serving");
        assert_eq!(bytes, block_contents(block, len));
    }
    write(&stub, &io, 5, len).await.unwrap();
}

/// A target given by no address is refused before anything is dialed.
#[tokio::test]
async fn a_target_without_an_address_is_refused() {
    use examples::storage::service::Service;
    let transport: Arc<dyn Transport> = transport_for("mem://").unwrap();
    let one = vec!["mem://nowhere".to_owned()];
    let err = Service::connect(transport, [&one, &[], &one], config(4096, 4, 0).service)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("data 2"), "{err:?}");
}
