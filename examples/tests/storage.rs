//! The storage application end to end, in one process: three targets, the service and the
//! initiator over TCP, `mem://` and DOCA (software provider). Blocks of several sizes are
//! written and read back byte for byte; recovery reads, a target lost mid-run, corrupt halves
//! and control commands out of order.

use std::sync::Arc;
use std::time::Duration;

use examples::generated::storage_service::{
    BlockIo, InitStorage, StorageCommand, StorageServiceClient,
};
use examples::storage::cluster::{Cluster, ClusterConfig};
use examples::storage::initiator::{self, block_contents, InitiatorConfig};
use examples::storage::service::ServiceConfig;
use examples::storage::target;
use rdma_rpc_core::transport::{transport_for, Transport};
use rdma_rpc_core::{Access, Code, MemoryRegion, Status};

fn config(block_size: usize, block_count: u64, recovery_every: u64) -> ClusterConfig {
    ClusterConfig {
        block_size,
        block_count,
        service: ServiceConfig {
            recovery_every,
            control_timeout: Duration::from_secs(5),
        },
    }
}

fn initiator(block_size: usize, blocks: u64) -> InitiatorConfig {
    InitiatorConfig {
        block_size,
        blocks,
        cores: 2,
        transactions_per_core: 4,
        progress: false,
        counters: None,
    }
}

async fn start(scheme: &str, config: &ClusterConfig) -> Cluster {
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
        let client = cluster.client().await.unwrap();
        let report = initiator::run(client, &initiator(size, blocks))
            .await
            .unwrap();
        assert_eq!((report.write.count, report.read.count), (blocks, blocks));
        assert_eq!(report.recovery_reads, blocks / 5, "every 5th read recovers");
        assert_eq!(report.degraded_writes, 0);
        assert!(report.compression_ratio() > 1.2, "{}", report.table());
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
    let client = cluster.client().await.unwrap();
    let read = doca.clone();
    let mut setup = initiator(64 << 10, 200);
    setup.counters = Some(Arc::new(move || read.counters()));
    let report = initiator::run(client, &setup).await.unwrap();
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
    let client = cluster.client().await.unwrap();
    let run =
        tokio::spawn(async move { initiator::run(client, &initiator(16 << 10, blocks)).await });
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

async fn write(
    stub: &StorageServiceClient,
    client: &rdma_rpc_core::Client,
    region: &MemoryRegion,
    block: u64,
    len: usize,
) -> Result<(), Status> {
    let mut buf = region.lease(0, len).unwrap();
    buf.as_mut_slice()
        .copy_from_slice(&block_contents(block, len));
    let offer = client.remote_memory().offer(buf, Access::REMOTE_READ)?;
    let io = BlockIo {
        block,
        buffer: Some(offer.handle()),
        length: len as u32,
    };
    let done = stub.write_block(io).await;
    offer.revoke().await;
    done.map(drop)
}

async fn read(
    stub: &StorageServiceClient,
    client: &rdma_rpc_core::Client,
    region: &MemoryRegion,
    block: u64,
    len: usize,
) -> Result<(bool, Vec<u8>), Status> {
    let buf = region.lease(0, len).unwrap();
    let offer = client.remote_memory().offer(buf, Access::REMOTE_WRITE)?;
    let io = BlockIo {
        block,
        buffer: Some(offer.handle()),
        length: len as u32,
    };
    let done = stub.read_block(io).await;
    let buf = offer.revoke().await.unwrap();
    Ok((done?.recovered, buf.as_slice().to_vec()))
}

async fn ready(
    cluster: &Cluster,
    block_size: usize,
) -> (StorageServiceClient, rdma_rpc_core::Client) {
    let client = cluster.client().await.unwrap();
    let stub = StorageServiceClient::new(client.clone());
    let init = InitStorage {
        core_count: 1,
        transactions_per_core: 2,
        block_size: block_size as u32,
    };
    stub.init_storage(init).await.unwrap();
    initiator::control(&stub, StorageCommand::Start)
        .await
        .unwrap();
    (stub, client)
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
    let (stub, client) = ready(&cluster, len).await;
    let region = MemoryRegion::new(len).unwrap();
    for block in 0..4 {
        write(&stub, &client, &region, block, len).await.unwrap();
    }
    target::corrupt(&cluster.targets[0], 1, 100).unwrap();
    let (recovered, bytes) = read(&stub, &client, &region, 1, len).await.unwrap();
    assert!(recovered, "data 1 failed its checksum: rebuilt from parity");
    assert_eq!(bytes, block_contents(1, len));
    target::corrupt(&cluster.targets[1], 2, 7).unwrap();
    target::corrupt(&cluster.targets[2], 2, 7).unwrap();
    let status = read(&stub, &client, &region, 2, len).await.unwrap_err();
    assert_eq!(status.code(), Code::DataLoss, "{status}");
    assert!(
        status.message().contains("block 2") && status.message().contains("parity"),
        "{status}"
    );
    let (recovered, bytes) = read(&stub, &client, &region, 3, len).await.unwrap();
    assert!(!recovered);
    assert_eq!(bytes, block_contents(3, len), "other blocks are untouched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_commands_out_of_order_are_refused() {
    let len = 4096;
    let cluster = start("tcp://", &config(len, 4, 0)).await;
    let client = cluster.client().await.unwrap();
    let stub = StorageServiceClient::new(client.clone());
    let region = MemoryRegion::new(len).unwrap();
    let refused = |r: Result<(), Status>, what: &str| {
        let status = r.unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition, "{what}: {status}");
        status.message().to_owned()
    };
    let why = refused(
        write(&stub, &client, &region, 0, len).await,
        "a write before init",
    );
    assert!(why.contains("init_storage"), "{why}");
    refused(
        initiator::control(&stub, StorageCommand::Start).await,
        "start before init",
    );
    refused(
        initiator::control(&stub, StorageCommand::Stop).await,
        "stop before start",
    );
    let init = InitStorage {
        core_count: 1,
        transactions_per_core: 1,
        block_size: len as u32,
    };
    stub.init_storage(init.clone()).await.unwrap();
    let why = refused(
        write(&stub, &client, &region, 0, len).await,
        "a write before start",
    );
    assert!(why.contains("start"), "{why}");
    initiator::control(&stub, StorageCommand::Start)
        .await
        .unwrap();
    refused(stub.init_storage(init).await, "init while running");
    refused(
        initiator::control(&stub, StorageCommand::Start).await,
        "start twice",
    );
    write(&stub, &client, &region, 0, len).await.unwrap();
    initiator::control(&stub, StorageCommand::Shutdown)
        .await
        .unwrap();
    // Refused by the service, or by the server that is going down with it.
    let after = write(&stub, &client, &region, 1, len).await.unwrap_err();
    assert!(
        matches!(after.code(), Code::FailedPrecondition | Code::Unavailable),
        "a write after shutdown: {after}"
    );
    tokio::time::timeout(Duration::from_secs(30), cluster.join())
        .await
        .expect("everything stops");
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
        Command, HalfIo, StorageTargetClient, StorageTargetServer, TargetControl,
    };
    use examples::storage::codec::Slot;
    use examples::storage::target::{Target, TargetConfig};
    let config = TargetConfig::new(Slot::Data1, 4096, 256).unwrap();
    let target = Arc::new(Target::new(config).unwrap());
    let server = rdma_rpc_core::Server::builder()
        .transfer_timeout(Duration::from_millis(300))
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
    let region = MemoryRegion::new(1 << 20).unwrap();
    let half = config.half_size;
    let write_half = |client: rdma_rpc_core::Client, block: u64, at: usize| {
        let region = region.clone();
        async move {
            let lease = region.lease(at, half).unwrap();
            let stub = StorageTargetClient::new(client.clone());
            let (done, _) = client
                .remote_memory()
                .lend(lease, Access::REMOTE_READ, |handle| async move {
                    let io = HalfIo {
                        block,
                        buffer: Some(handle),
                        length: half as u32,
                    };
                    stub.write_half(io).await
                })
                .await?;
            done.map(drop)
        }
    };

    // The attacker: 32 connections through a proxy that, once they are up, stops passing
    // anything the target sends: 4 calls each (what the credits of a connection that hears
    // nothing allow), 128 in all, whose reads are never answered.
    let (via, cut, closed) = black_hole_proxy(addr.clone()).await;
    let mut attackers = Vec::new();
    for _ in 0..32 {
        attackers.push(rdma_rpc_core::Client::connect(&via).await.unwrap());
    }
    cut.store(true, std::sync::atomic::Ordering::SeqCst);
    let attack: Vec<_> = (0..128u64)
        .map(|block| {
            let client = attackers[block as usize / 4].clone();
            let at = block as usize * half;
            tokio::spawn(write_half(client, block, at))
        })
        .collect();
    tokio::time::timeout(Duration::from_secs(60), async {
        while target.busy() < 128 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the attack holds 128 blocks");
    let refused = write_half(legit.clone(), 5, 900 << 10).await.unwrap_err();
    assert_eq!(refused.code(), Code::Aborted, "{refused}");
    assert!(refused.message().contains("busy"), "{refused}");

    // The target gives up on the reads: it closes the attacker's connections, which frees
    // every block; then it serves the legitimate client, every block.
    let mut closed = closed;
    tokio::time::timeout(Duration::from_secs(60), closed.wait_for(|n| *n >= 32))
        .await
        .expect("the attacker's connections closed")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), async {
        while target.busy() > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("every block free again");
    for block in 0..128 {
        write_half(legit.clone(), block, 900 << 10)
            .await
            .unwrap_or_else(|s| panic!("block {block}: {s}"));
    }
    for call in attack {
        call.abort();
    }
}
