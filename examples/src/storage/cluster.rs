//! Three targets and the service in one process, on any transport: what `storage-demo` and
//! the tests start.

use std::sync::Arc;

use rdma_rpc_core::transport::Transport;
use rdma_rpc_core::{Client, Server, Status};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::auth::Secret;
use super::codec::Slot;
use super::service::{Service, ServiceConfig};
use super::target::{Target, TargetConfig};
use crate::generated::storage_service::StorageServiceServer;
use crate::generated::storage_target::StorageTargetServer;

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
    /// Their addresses.
    pub target_addrs: [String; 3],
    kills: [watch::Sender<bool>; 3],
    target_tasks: Vec<JoinHandle<rdma_rpc_core::Result<()>>>,
    /// The service's address (the initiator connects here).
    pub service_addr: String,
    service_secret: Secret,
    service_task: JoinHandle<rdma_rpc_core::Result<()>>,
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
            .field("service", &self.service_addr)
            .finish()
    }
}

impl Cluster {
    /// Starts three targets and the service, each listening on `bind` (an address with port
    /// 0, such as `tcp://127.0.0.1:0`, `mem://` or `doca://127.0.0.1:0`).
    pub async fn start(
        transport: Arc<dyn Transport>,
        bind: &str,
        config: &ClusterConfig,
    ) -> Result<Cluster, Status> {
        let mut targets = Vec::new();
        let mut addrs = Vec::new();
        let mut kills = Vec::new();
        let mut tasks = Vec::new();
        for slot in [Slot::Data1, Slot::Data2, Slot::Parity] {
            let target = Arc::new(Target::new(TargetConfig::new(
                slot,
                config.block_size,
                config.block_count,
            )?)?);
            let server = Server::builder()
                .transport(transport.clone())
                .initial_receives(super::RECEIVES)
                .recv_credits(super::RECEIVES)
                .transfer_timeout(super::target::IO_TIMEOUT)
                .interceptor(
                    config
                        .service
                        .target_secret
                        .require("their storage service"),
                )
                .add_service(StorageTargetServer::new(target.clone()))
                .bind(bind)
                .await
                .map_err(|e| bound(&format!("{slot} target"), e))?;
            addrs.push(server.local_addr());
            let (kill, mut killed) = watch::channel(false);
            let down = target.shut_down();
            tasks.push(tokio::spawn(server.serve_with_shutdown(async move {
                tokio::select! {
                    _ = down => {}
                    _ = killed.wait_for(|k| *k) => {}
                }
            })));
            kills.push(kill);
            targets.push(target);
        }
        let addr_refs = [addrs[0].as_str(), addrs[1].as_str(), addrs[2].as_str()];
        let service =
            Arc::new(Service::connect(transport.clone(), addr_refs, config.service.clone()).await?);
        let server = Server::builder()
            .transport(transport.clone())
            .initial_receives(super::RECEIVES)
            .recv_credits(super::RECEIVES)
            .interceptor(config.service_secret.require("its initiator"))
            .add_service(StorageServiceServer::new(service.clone()))
            .bind(bind)
            .await
            .map_err(|e| bound("service", e))?;
        let service_addr = server.local_addr();
        let service_task = tokio::spawn(server.serve_with_shutdown(service.shut_down()));
        Ok(Cluster {
            transport,
            targets: three(targets),
            target_addrs: three(addrs),
            kills: three(kills),
            target_tasks: tasks,
            service_addr,
            service_secret: config.service_secret.clone(),
            service_task,
        })
    }

    /// A client of the service, presenting its secret.
    pub async fn client(&self) -> Result<Client, Status> {
        Client::builder()
            .transport(self.transport.clone())
            .initial_receives(super::RECEIVES)
            .recv_credits(super::RECEIVES)
            .interceptor(self.service_secret.present())
            .connect(&self.service_addr)
            .await
            .map_err(|e| Status::unavailable(format!("the service: {e}")))
    }

    /// Takes target `i` (0 data 1, 1 data 2, 2 parity) off the network: it stops serving, and
    /// the service's calls to it fail from then on.
    pub fn kill_target(&self, i: usize) {
        self.kills[i].send_replace(true);
    }

    /// Waits for the service and the targets to stop (after a shutdown command).
    pub async fn join(self) {
        let _ = self.service_task.await;
        for task in self.target_tasks {
            let _ = task.await;
        }
    }
}
