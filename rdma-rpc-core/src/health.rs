//! A standard health service, as gRPC's `grpc.health.v1.Health` (and tonic-health): a serving
//! status per service name that load balancers, orchestrators and `rdma-rpc health` read with
//! `check`, or follow with `watch`.
//!
//! One line adds it to a server; the [`HealthReporter`] changes the statuses:
//!
//! ```no_run
//! # async fn run(service: impl rdma_rpc_core::Service) -> Result<(), rdma_rpc_core::Error> {
//! use rdma_rpc_core::health::HealthReporter;
//! use rdma_rpc_core::Server;
//!
//! let health = HealthReporter::new();
//! let server = Server::builder()
//!     .add_service(service)
//!     .add_health(&health) // every service of the server SERVING, the server ("") too
//!     .bind("tcp://0.0.0.0:7470")
//!     .await?;
//! // Later, while a dependency is down:
//! health.set_not_serving("Greeter");
//! # Ok(()) }
//! ```
//!
//! - `check(service)` answers `SERVING`, `NOT_SERVING` or `SERVICE_UNKNOWN` (a name never set;
//!   gRPC answers `NOT_FOUND` there, which `rdma-rpc health` reports the same way). The empty
//!   name is the server as a whole.
//! - `watch(service)` streams the status at once, then each change, until the client stops
//!   or the server shuts down (it then sends `NOT_SERVING` and ends). A watch is a call: the
//!   server's `max_call_duration` (120 s by default) ends it with `DEADLINE_EXCEEDED`, and the
//!   watcher calls again (`rdma-rpc health --watch` does).
//! - Health calls are calls like any other: the server's interceptors run first (a server that
//!   asks for a token asks it of health checks too), and they are counted and logged as
//!   others are.
//! - [`ServerBuilder::add_health`](crate::ServerBuilder::add_health) sets every service of the
//!   server and the empty name to `SERVING` when the server binds (unless the reporter set
//!   them already); once the server starts shutting down, its health service answers
//!   `NOT_SERVING` for every name.
//!
//! The service is `Health`, at the paths [`CHECK_PATH`] and [`WATCH_PATH`];
//! `specs/health.yaml` describes it as a spec (for `rdma-rpc call`, or a client generated in
//! another crate). [`HealthClient`] is its client.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::watch;

use crate::client::Client;
use crate::service::{EndpointDef, IntoRequest, OpKind, ServerCall, Service, StreamKind};
use crate::status::Status;
use crate::stream::{MessageSink, Streaming};
use crate::transport::BoxFuture;

/// The name of the health service ([`Service::name`]).
pub const SERVICE_NAME: &str = "Health";

/// The path of `check`.
pub const CHECK_PATH: &str = "/rdma_rpc.health.v1.Health/Check";

/// The path of `watch`.
pub const WATCH_PATH: &str = "/rdma_rpc.health.v1.Health/Watch";

/// Most bytes of a health request or response message (a service name is well below).
const BUFFER: u64 = 1024;

/// The endpoints of the health service, as `specs/health.yaml` has them.
pub static ENDPOINTS: &[EndpointDef] = &[
    EndpointDef {
        path: CHECK_PATH,
        op: OpKind::Send,
        buffer_size: BUFFER,
        method: "check",
        timeout_ms: None,
        stream: StreamKind::Unary,
    },
    EndpointDef {
        path: WATCH_PATH,
        op: OpKind::Receive,
        buffer_size: BUFFER,
        method: "watch",
        timeout_ms: None,
        stream: StreamKind::Messages {
            requests: false,
            responses: true,
        },
    },
];

/// Which service a health call asks about.
#[derive(Clone, PartialEq, Eq, Hash, prost::Message)]
pub struct HealthCheckRequest {
    /// The service's name (its `service:` in the spec, [`Service::name`]); empty for the
    /// server as a whole.
    #[prost(string, tag = "1")]
    pub service: String,
}

impl HealthCheckRequest {
    /// A request about `service`.
    pub fn new(service: impl Into<String>) -> HealthCheckRequest {
        HealthCheckRequest {
            service: service.into(),
        }
    }
}

/// A service's serving status.
#[derive(Clone, Copy, PartialEq, Eq, Hash, prost::Message)]
pub struct HealthCheckResponse {
    /// The status: read it with [`status`](HealthCheckResponse::status).
    #[prost(enumeration = "ServingStatus", tag = "1")]
    pub status: i32,
}

impl From<ServingStatus> for HealthCheckResponse {
    fn from(status: ServingStatus) -> HealthCheckResponse {
        HealthCheckResponse {
            status: status as i32,
        }
    }
}

/// The serving status of a service (gRPC's `HealthCheckResponse.ServingStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ServingStatus {
    /// Not known (a status number this side does not know).
    Unknown = 0,
    /// The service serves.
    Serving = 1,
    /// The service does not serve now.
    NotServing = 2,
    /// No status was ever set for this name.
    ServiceUnknown = 3,
}

impl ServingStatus {
    /// The value's name as written in `specs/health.yaml` (`SERVING`, ...).
    pub fn as_str_name(&self) -> &'static str {
        match self {
            ServingStatus::Unknown => "UNKNOWN",
            ServingStatus::Serving => "SERVING",
            ServingStatus::NotServing => "NOT_SERVING",
            ServingStatus::ServiceUnknown => "SERVICE_UNKNOWN",
        }
    }
}

impl std::fmt::Display for ServingStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str_name())
    }
}

/// Sets the serving statuses a health service reports. Cheap to clone: clones share the
/// statuses. A new reporter has the server as a whole (the empty name) `SERVING`.
#[derive(Clone)]
pub struct HealthReporter {
    statuses: Arc<watch::Sender<HashMap<String, ServingStatus>>>,
}

impl std::fmt::Debug for HealthReporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.statuses.borrow().iter())
            .finish()
    }
}

impl Default for HealthReporter {
    fn default() -> HealthReporter {
        HealthReporter::new()
    }
}

impl HealthReporter {
    /// A reporter whose server as a whole (the empty name) is `SERVING`.
    pub fn new() -> HealthReporter {
        let statuses = HashMap::from([(String::new(), ServingStatus::Serving)]);
        HealthReporter {
            statuses: Arc::new(watch::channel(statuses).0),
        }
    }

    /// Sets the status of `service` (the empty name: the server as a whole). Watchers hear
    /// of it if it changed.
    pub fn set_status(&self, service: &str, status: ServingStatus) {
        self.statuses.send_if_modified(|statuses| {
            match statuses.insert(service.to_owned(), status) {
                Some(before) => before != status,
                None => true,
            }
        });
    }

    /// Sets `service` `SERVING`.
    pub fn set_serving(&self, service: &str) {
        self.set_status(service, ServingStatus::Serving);
    }

    /// Sets `service` `NOT_SERVING`.
    pub fn set_not_serving(&self, service: &str) {
        self.set_status(service, ServingStatus::NotServing);
    }

    /// Forgets `service`: it is `SERVICE_UNKNOWN` again.
    pub fn clear_status(&self, service: &str) {
        self.statuses
            .send_if_modified(|statuses| statuses.remove(service).is_some());
    }

    /// The status of `service` now (`SERVICE_UNKNOWN` for a name never set).
    pub fn status(&self, service: &str) -> ServingStatus {
        status_in(&self.statuses.borrow(), service)
    }

    /// Sets `service` `SERVING` unless it has a status already.
    pub(crate) fn serving_unless_set(&self, service: &str) {
        self.statuses.send_if_modified(|statuses| {
            if statuses.contains_key(service) {
                return false;
            }
            statuses.insert(service.to_owned(), ServingStatus::Serving);
            true
        });
    }
}

fn status_in(statuses: &HashMap<String, ServingStatus>, service: &str) -> ServingStatus {
    statuses
        .get(service)
        .copied()
        .unwrap_or(ServingStatus::ServiceUnknown)
}

/// The health service a server runs (a [`Service`]): what
/// [`ServerBuilder::add_health`](crate::ServerBuilder::add_health) adds. Answers from its
/// [`HealthReporter`]'s statuses, and `NOT_SERVING` for every name once its server shuts down.
#[derive(Debug, Clone)]
pub struct HealthServer {
    reporter: HealthReporter,
    /// Set when the server that runs this service starts shutting down.
    stopping: Arc<watch::Sender<bool>>,
}

impl HealthServer {
    /// Serves the statuses of `reporter`.
    pub fn new(reporter: HealthReporter) -> HealthServer {
        HealthServer {
            reporter,
            stopping: Arc::new(watch::channel(false).0),
        }
    }

    /// The reporter whose statuses it serves.
    pub fn reporter(&self) -> &HealthReporter {
        &self.reporter
    }

    /// What its server sets when it starts shutting down.
    pub(crate) fn stopping(&self) -> Arc<watch::Sender<bool>> {
        self.stopping.clone()
    }

    fn status(&self, service: &str) -> ServingStatus {
        if *self.stopping.borrow() {
            ServingStatus::NotServing
        } else {
            self.reporter.status(service)
        }
    }

    /// Sends the status of `service` now and at each change, until the server shuts down
    /// (then `NOT_SERVING`, and the stream ends) or the call ends.
    async fn watch(&self, service: &str, sink: &mut MessageSink) -> Result<Bytes, Status> {
        let mut statuses = self.reporter.statuses.subscribe();
        let mut stopping = self.stopping.subscribe();
        let mut sent = None;
        loop {
            let stopped = *stopping.borrow_and_update();
            let now = if stopped {
                ServingStatus::NotServing
            } else {
                status_in(&statuses.borrow_and_update(), service)
            };
            if sent != Some(now) {
                sink.send(&HealthCheckResponse::from(now)).await?;
                sink.flush().await?;
                sent = Some(now);
            }
            if stopped {
                return Ok(Bytes::new());
            }
            // Both senders live as long as `self`: neither wait fails.
            tokio::select! {
                _ = statuses.changed() => {}
                _ = stopping.changed() => {}
            }
        }
    }
}

impl Service for HealthServer {
    fn name(&self) -> &'static str {
        SERVICE_NAME
    }

    fn endpoints(&self) -> &'static [EndpointDef] {
        ENDPOINTS
    }

    fn call<'a>(
        &'a self,
        index: usize,
        call: ServerCall<'a>,
    ) -> BoxFuture<'a, Result<Bytes, Status>> {
        use crate::typed::server::{decode_request, encode_message, mismatched_call};
        match (index, call) {
            (0, ServerCall::Inbound { request, .. }) => Box::pin(async move {
                let request = decode_request::<HealthCheckRequest>(request)?;
                let status = self.status(&request.get_ref().service);
                Ok(encode_message(&HealthCheckResponse::from(status)))
            }),
            (
                1,
                ServerCall::Streaming {
                    request,
                    responses: Some(sink),
                    ..
                },
            ) => Box::pin(async move {
                let request = decode_request::<HealthCheckRequest>(request)?;
                self.watch(&request.get_ref().service, sink).await
            }),
            (index, call) => mismatched_call(SERVICE_NAME, index, call),
        }
    }
}

/// The client of the health service.
#[derive(Debug, Clone)]
pub struct HealthClient {
    inner: Client,
}

impl HealthClient {
    /// Uses an existing connection (its interceptors, such as one that adds a token, apply).
    pub fn new(inner: Client) -> HealthClient {
        HealthClient { inner }
    }

    /// Connects to `addr` (e.g. `tcp://127.0.0.1:7470`).
    pub async fn connect(addr: &str) -> crate::Result<HealthClient> {
        Ok(HealthClient::new(Client::connect(addr).await?))
    }

    /// The underlying client.
    pub fn inner(&self) -> &Client {
        &self.inner
    }

    /// The status of a service now.
    pub async fn check(
        &self,
        request: impl IntoRequest<HealthCheckRequest>,
    ) -> Result<HealthCheckResponse, Status> {
        crate::typed::client::call_inbound(
            &self.inner,
            &ENDPOINTS[0],
            request.into_request(),
            Bytes::new(),
        )
        .await
    }

    /// The status of a service now, then at each change: read the stream with
    /// `message().await` until `None` (the server shut down) or an error (the call ended,
    /// for example at the server's `max_call_duration`: watch again).
    pub async fn watch(
        &self,
        request: impl IntoRequest<HealthCheckRequest>,
    ) -> Result<Streaming<HealthCheckResponse>, Status> {
        crate::typed::client::call_server_stream(&self.inner, &ENDPOINTS[1], request.into_request())
            .await
    }
}
