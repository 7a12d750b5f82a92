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
