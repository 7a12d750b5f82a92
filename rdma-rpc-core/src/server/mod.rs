//! The server: a builder that takes services, binds an address, and serves connections.
//!
//! ```no_run
//! # async fn run(service: impl rdma_rpc_core::Service) -> Result<(), rdma_rpc_core::Error> {
//! use rdma_rpc_core::Server;
//!
//! Server::builder()
//!     .add_service(service)
//!     .serve("tcp://0.0.0.0:7470")
//!     .await
//! # }
//! ```

mod admission;
mod buffers;
mod call;
mod config;
mod conn;
mod listing;
mod routes;
mod share;
mod slots;
mod spare;
mod start;
mod stream;
mod transfer;
mod waited;

pub use admission::ConnectionCount;
pub(crate) use call::ClientEvent;
pub use config::ServerConfig;
pub use listing::{ConnectionInfo, PoolInfo, ServerHandle};
pub(crate) use routes::{Holding, Routes};

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::error::{Error, Result};
use crate::interceptor::{Chain, ServerInterceptor};

use crate::observe::logs;
use crate::service::Service;
use crate::transport::{transport_for, Fencing, Listener, Transport};

/// Entry point: [`Server::builder`].
#[derive(Debug)]
pub struct Server;

impl Server {
    /// A builder with default settings.
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }
}

/// Builds a server. See [`Server::builder`].
#[derive(Default)]
pub struct ServerBuilder {
    config: ServerConfig,
    services: Vec<Arc<dyn Service>>,
    transport: Option<Arc<dyn Transport>>,
    interceptors: Chain<dyn ServerInterceptor>,
    /// The health services added, with their reporters.
    health: Vec<crate::health::HealthServer>,
}

impl fmt::Debug for ServerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerBuilder")
            .field("config", &self.config)
            .field(
                "services",
                &self.services.iter().map(|s| s.name()).collect::<Vec<_>>(),
            )
            .field("transport", &self.transport)
            .field("interceptors", &self.interceptors)
            .finish()
    }
}

/// Largest write slot over a transport that cannot fence windows: its payload is copied
/// before the handler sees it.
pub(crate) const MAX_UNFENCED_SLOT: usize = 64 << 10;

/// Refuses configurations whose safety needs windows the transport cannot fence.
fn check_fencing(config: &ServerConfig, fencing: Fencing) -> Result<()> {
    if fencing == Fencing::Revocable {
        return Ok(());
    }
    if config.pull_writes == Some(false) {
        return Err(Error::InvalidArgument(
            "pull_writes = Some(false) grants clients windows of shared pool buffers, which this \
             transport cannot revoke (DOCA): a client could keep writing into a buffer that \
             later serves another connection. Use pull_writes = None or Some(true)"
                .into(),
        ));
    }
    if config.write_slots > 0 && config.slot_size > MAX_UNFENCED_SLOT {
        return Err(Error::InvalidArgument(format!(
            "slot_size of {} bytes: over a transport that cannot revoke windows (DOCA) each \
             slot payload is copied before the handler sees it, so slots are limited to {} \
             bytes",
            config.slot_size, MAX_UNFENCED_SLOT
        )));
    }
    Ok(())
}

impl ServerBuilder {
    /// Adds a service (a generated `<Name>Server` adapter, or a hand-written [`Service`]).
    pub fn add_service(mut self, service: impl Service) -> Self {
        self.services.push(Arc::new(service));
        self
    }

    /// Adds the standard health service (see [`health`](crate::health)), serving the
    /// statuses `reporter` sets: when the server binds, each of its services (and the server
    /// as a whole, the empty name) is `SERVING` unless `reporter` says otherwise; once it
    /// starts shutting down, every name is `NOT_SERVING` and watches end. Interceptors apply
    /// to its calls as to any other.
    pub fn add_health(mut self, reporter: &crate::health::HealthReporter) -> Self {
        let health = crate::health::HealthServer::new(reporter.clone());
        self.health.push(health.clone());
        self.add_service(health)
    }

    /// Adds an interceptor: it runs before the handler of each call, after those added
    /// before it; a refusal answers the call with its status (see
    /// [`interceptor`](crate::interceptor)).
    pub fn interceptor(mut self, interceptor: impl ServerInterceptor) -> Self {
        self.interceptors.push(Arc::new(interceptor));
        self
    }

    /// Replaces the whole configuration.
    pub fn config(mut self, config: ServerConfig) -> Self {
        self.config = config;
        self
    }

    /// Uses this transport instead of the one the address scheme names.
    pub fn transport(mut self, transport: Arc<dyn Transport>) -> Self {
        self.transport = Some(transport);
        self
    }

    setters! {
        /// See [`ServerConfig::max_connections`].
        max_connections: usize,
        /// See [`ServerConfig::max_connections_per_peer`].
        max_connections_per_peer: usize,
        /// See [`ServerConfig::idle_timeout`].
        idle_timeout: Option<Duration>,
        /// See [`ServerConfig::max_in_flight`].
        max_in_flight: u32,
        /// See [`ServerConfig::max_frame`].
        max_frame: usize,
        /// See [`ServerConfig::recv_credits`].
        recv_credits: u32,
        /// See [`ServerConfig::initial_receives`].
        initial_receives: u32,
        /// See [`ServerConfig::min_buffers`].
        min_buffers: usize,
        /// See [`ServerConfig::max_buffers`].
        max_buffers: usize,
        /// See [`ServerConfig::handshake_timeout`].
        handshake_timeout: Duration,
        /// See [`ServerConfig::inline_threshold`].
        inline_threshold: u32,
        /// See [`ServerConfig::pool_budget`].
        pool_budget: usize,
        /// See [`ServerConfig::write_slots`].
        write_slots: u32,
        /// See [`ServerConfig::slot_size`].
        slot_size: usize,
        /// See [`ServerConfig::pull_writes`].
        pull_writes: Option<bool>,
        /// See [`ServerConfig::transfer_timeout`].
        transfer_timeout: Duration,
        /// See [`ServerConfig::max_call_duration`].
        max_call_duration: Option<Duration>,
        /// See [`ServerConfig::pool_share_percent`].
        pool_share_percent: u32,
        /// See [`ServerConfig::buffer_wait`].
        buffer_wait: Duration,
        /// See [`ServerConfig::shutdown_grace`].
        shutdown_grace: Duration,
        /// See [`ServerConfig::inline_handlers`].
        inline_handlers: bool,
        /// See [`ServerConfig::stream_window`].
        stream_window: u64,
        /// See [`ServerConfig::max_pings_per_second`].
        max_pings_per_second: u32,
    }

    /// Builds the routing table, registers every buffer pool, and binds `addr`.
    pub async fn bind(self, addr: &str) -> Result<BoundServer> {
        let config = self.config;
        let min_receives = crate::protocol::credits::MIN_RECEIVES;
        if config.max_frame < 2 * crate::protocol::FRAME_OVERHEAD
            || config.recv_credits < min_receives
        {
            return Err(Error::InvalidArgument(format!(
                "max_frame must be at least {} bytes and recv_credits at least {min_receives}",
                2 * crate::protocol::FRAME_OVERHEAD
            )));
        }
        crate::protocol::credits::check_initial(config.initial_receives, config.recv_credits)?;
        if config.slot_size > crate::memory::MAX_BUFFER {
            return Err(Error::InvalidArgument(format!(
                "slot_size of {} bytes is over the {} byte limit of one buffer",
                config.slot_size,
                crate::memory::MAX_BUFFER
            )));
        }
        if !(1..=100).contains(&config.pool_share_percent) {
            return Err(Error::InvalidArgument(format!(
                "pool_share_percent of {} is not a share: give 1 to 100 (percent of a path's \
                 buffers one connection may hold)",
                config.pool_share_percent
            )));
        }
        let routes = Routes::build(&self.services, &config)?;
        let transport = match self.transport {
            Some(t) => t,
            None => transport_for(addr)?,
        };
        check_fencing(&config, transport.fencing())?;
        // Pools are registered once, here, not by the calls that first use their buffers.
        for pool in routes.pools() {
            transport.register_pool(pool)?;
        }
        let listener = transport.listen(addr).await?;
        for health in &self.health {
            for service in &self.services {
                if service.name() != crate::health::SERVICE_NAME {
                    health.reporter().serving_unless_set(service.name());
                }
            }
            health.reporter().serving_unless_set("");
        }
        tracing::info!(addr = %listener.local_addr(), "rdma-rpc server listening");
        Ok(BoundServer {
            shared: Arc::new(Shared {
                config,
                routes,
                interceptors: self.interceptors,
                live: listing::Live::default(),
                logs: logs::LogBudget::new(),
                health: self.health.iter().map(|h| h.stopping()).collect(),
            }),
            listener,
            admission: admission::Admission::new(),
        })
    }

    /// Binds `addr` and serves until an error.
    pub async fn serve(self, addr: &str) -> Result<()> {
        self.bind(addr).await?.serve().await
    }

    /// Binds `addr` and serves until `signal` completes, then shuts down gracefully.
    pub async fn serve_with_shutdown(
        self,
        addr: &str,
        signal: impl Future<Output = ()> + Send,
    ) -> Result<()> {
        self.bind(addr).await?.serve_with_shutdown(signal).await
    }
}

pub(crate) struct Shared {
    pub(crate) config: ServerConfig,
    pub(crate) routes: Routes,
    pub(crate) interceptors: Chain<dyn ServerInterceptor>,
    /// The handshaken connections, for [`ServerHandle::connections`].
    pub(crate) live: listing::Live,
    /// What this server may still log of each kind of line a peer can cause.
    pub(crate) logs: logs::LogBudget,
    /// Set when the server starts shutting down: its health services then say `NOT_SERVING`.
    health: Vec<Arc<watch::Sender<bool>>>,
}

/// A server bound to its address, ready to serve.
pub struct BoundServer {
    shared: Arc<Shared>,
    listener: Box<dyn Listener>,
    admission: Arc<admission::Admission>,
}

impl fmt::Debug for BoundServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundServer")
            .field("local_addr", &self.listener.local_addr())
            .finish()
    }
}

impl BoundServer {
    /// The address clients connect to (with the port chosen for port 0).
    pub fn local_addr(&self) -> String {
        self.listener.local_addr()
    }

    /// The number of connections the server holds, now and as it changes while it serves.
    pub fn connection_count(&self) -> ConnectionCount {
        self.admission.count()
    }

    /// A view of the server that outlives [`serve`](BoundServer::serve): its connections
    /// and the use of its buffer pools.
    pub fn handle(&self) -> ServerHandle {
        ServerHandle {
            shared: self.shared.clone(),
            count: self.admission.count(),
        }
    }

    /// Serves until an error.
    pub async fn serve(self) -> Result<()> {
        self.serve_with_shutdown(std::future::pending()).await
    }

    /// Serves until `signal` completes; then stops accepting, tells clients (a goaway on each
    /// connection: they send new calls elsewhere, and their calls in flight go on), lets
    /// in-flight calls finish (up to [`ServerConfig::shutdown_grace`]), and returns.
    pub async fn serve_with_shutdown(self, signal: impl Future<Output = ()> + Send) -> Result<()> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut conns = JoinSet::new();
        tokio::pin!(signal);
        loop {
            while conns.try_join_next().is_some() {}
            tokio::select! {
                _ = &mut signal => break,
                accepted = self.listener.accept() => match accepted {
                    Ok(conn) => match self.admission.admit(conn.peer(), &self.shared.config) {
                        Ok(admitted) => {
                            conns.spawn(conn::serve(self.shared.clone(), conn, stop_rx.clone(), admitted));
                        }
                        Err(status) => {
                            if let Some(line) = self.shared.logs.line("connection refused", status.code().as_str()) {
                                tracing::warn!(
                                    peer = conn.peer(),
                                    reason = status.message(),
                                    suppressed = line.suppressed,
                                    "connection refused"
                                );
                            }
                            match self.admission.refusing() {
                                Some(permit) => {
                                    conns.spawn(conn::refuse(self.shared.clone(), conn, status, permit));
                                }
                                // Too many refusals at once: no reason for this one.
                                None => conn.close(),
                            }
                        }
                    },
                    Err(e) => {
                        if let Some(line) = self.shared.logs.line("accept failed", "") {
                            tracing::warn!(error = %e, suppressed = line.suppressed, "accept failed");
                        }
                    }
                },
            }
        }
        tracing::info!(connections = conns.len(), "shutting down");
        for stopping in &self.shared.health {
            stopping.send_replace(true);
        }
        drop(self.listener);
        stop_tx.send_replace(true);
        let drain = async { while conns.join_next().await.is_some() {} };
        if tokio::time::timeout(self.shared.config.shutdown_grace, drain)
            .await
            .is_err()
        {
            tracing::warn!(
                left = conns.len(),
                "shutdown grace expired; closing connections"
            );
            conns.shutdown().await;
        }
        Ok(())
    }
}
