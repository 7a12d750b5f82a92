//! Three targets and the service in one process, on any transport: what `storage-demo` and
//! the tests start.

use std::sync::Arc;

use rdma_rpc_core::transport::Transport;
use rdma_rpc_core::{Client, Status};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::auth::Secret;
use super::codec::Slot;
use super::cores::{serve_on, CoreThreads};
use super::service::{Service, ServiceConfig};
use super::target::{Target, TargetConfig};

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Bytes per block.
    pub block_size: usize,
    /// Blocks each target holds.
    pub block_count: u64,
    /// The service's behaviour (and the target secret it presents, which the targets check).
    pub service: ServiceConfig,
    /// What the service takes calls with: the initiator presents it ([`Cluster::client`]).
    pub service_secret: Secret,
}

/// A running cluster.
pub struct Cluster {
    /// The transport everything uses.
    pub transport: Arc<dyn Transport>,
    /// Data 1, data 2, parity.
    pub targets: [Arc<Target>; 3],
    /// Their addresses (with threads per core: core 0's listener).
    pub target_addrs: [String; 3],
    /// Each target's listeners, one per core.
    target_lanes: [Vec<String>; 3],
    kills: [watch::Sender<bool>; 3],
    target_tasks: Vec<JoinHandle<rdma_rpc_core::Result<()>>>,
    /// The service's address (the initiator connects here; with threads per core: core 0's
    /// listener).
    pub service_addr: String,
    /// The service's listeners, one per core.
    pub service_addrs: Vec<String>,
    /// The service.
    pub service: Arc<Service>,
    service_secret: Secret,
    service_tasks: Vec<JoinHandle<rdma_rpc_core::Result<()>>>,
    threads: Option<Arc<CoreThreads>>,
}

/// The three of a kind made in a loop over the three slots.
pub(crate) fn three<T>(v: Vec<T>) -> [T; 3] {
    match v.try_into() {
        Ok(a) => a,
        Err(v) => unreachable!("three slots, {} items", v.len()),
    }
}

fn bound(what: &str, e: rdma_rpc_core::Error) -> Status {
    Status::unavailable(format!("{what}: cannot listen: {e}"))
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("targets", &self.target_addrs)
            .field("target_lanes", &self.target_lanes)
            .field("service", &self.service_addrs)
            .finish()
    }
}

impl Cluster {
    /// Starts three targets and the service, each listening on `bind` (an address with port
    /// 0, such as `tcp://127.0.0.1:0`, `mem://` or `doca://127.0.0.1:0`). With
    /// [`ServiceConfig::threads`](super::service::ServiceConfig::threads) each of them listens
    /// once per core, on that core's thread, so that the connections each listener accepts are
    /// served there.
    pub async fn start(
        transport: Arc<dyn Transport>,
        bind: &str,
        config: &ClusterConfig,
    ) -> Result<Cluster, Status> {
        let threads = config.service.threads.clone();
        let listeners = threads.as_ref().map_or(1, |t| t.len());
        let mut targets = Vec::new();
        let mut addrs = Vec::new();
        let mut kills = Vec::new();
        let mut tasks = Vec::new();
        for slot in [Slot::Data1, Slot::Data2, Slot::Parity] {
            let target_config = TargetConfig {
                cores: listeners,
                ..TargetConfig::new(slot, config.block_size, config.block_count)?
            };
            let target = Arc::new(Target::new(target_config)?);
            let (kill, killed) = watch::channel(false);
            let mut slot_addrs = Vec::new();
            for core in 0..listeners {
                let builder = super::target::server(&target, &config.service.target_secret)
                    .transport(transport.clone());
                let (down, mut killed) = (target.shut_down(), killed.clone());
                let (addr, task) = serve_on(threads.as_deref(), core, builder, bind, async move {
                    tokio::select! {
                        _ = down => {}
                        _ = killed.wait_for(|k| *k) => {}
                    }
                })
                .await
                .map_err(|e| bound(&format!("{slot} target"), e))?;
                slot_addrs.push(addr);
                tasks.push(task);
            }
            addrs.push(slot_addrs);
            kills.push(kill);
            targets.push(target);
        }
        let target_lanes: [Vec<String>; 3] = three(addrs);
        let [d1, d2, p] = &target_lanes;
        let service = Arc::new(
            Service::connect(transport.clone(), [d1, d2, p], config.service.clone()).await?,
        );
        let mut service_addrs = Vec::new();
        let mut service_tasks = Vec::new();
        for core in 0..listeners {
            let builder = super::service::server(&service, &config.service_secret)
                .transport(transport.clone());
            let (addr, task) =
                serve_on(threads.as_deref(), core, builder, bind, service.shut_down())
                    .await
                    .map_err(|e| bound("service", e))?;
            service_addrs.push(addr);
            service_tasks.push(task);
        }
        Ok(Cluster {
            transport,
            targets: three(targets),
            target_addrs: target_lanes.clone().map(|a| a[0].clone()),
            target_lanes,
            kills: three(kills),
            target_tasks: tasks,
            service_addr: service_addrs[0].clone(),
            service_addrs,
            service,
            service_secret: config.service_secret.clone(),
            service_tasks,
            threads,
        })
    }

    /// A client of the service, presenting its secret, made on the caller's runtime.
    pub async fn client(&self) -> Result<Client, Status> {
        dial_service(
            self.transport.clone(),
            self.service_secret.clone(),
            self.service_addr.clone(),
        )
        .await
    }

    /// The client of the initiator's core `core`: with threads per core, made on that core's
    /// thread and connected to the service's listener there; otherwise as [`Cluster::client`].
    pub async fn client_on(&self, core: usize) -> Result<Client, Status> {
        let addr = self.service_addrs[core % self.service_addrs.len()].clone();
        let dial = dial_service(self.transport.clone(), self.service_secret.clone(), addr);
        match &self.threads {
            Some(threads) => threads.run(core, dial).await,
            None => dial.await,
        }
    }

    /// Takes target `i` (0 data 1, 1 data 2, 2 parity) off the network: it stops serving, and
    /// the service's calls to it fail from then on.
    pub fn kill_target(&self, i: usize) {
        self.kills[i].send_replace(true);
    }

    /// Waits for the service and the targets to stop (after a shutdown command).
    pub async fn join(self) {
        for task in self.service_tasks.into_iter().chain(self.target_tasks) {
            let _ = task.await;
        }
    }
}

async fn dial_service(
    transport: Arc<dyn Transport>,
    secret: Secret,
    addr: String,
) -> Result<Client, Status> {
    Client::builder()
        .transport(transport)
        .initial_receives(super::RECEIVES)
        .recv_credits(super::RECEIVES)
        .interceptor(secret.present())
        .connect(&addr)
        .await
        .map_err(|e| Status::unavailable(format!("the service: {e}")))
}
