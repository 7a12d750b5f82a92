//! End-to-end tests of client, server and protocol, written against `dyn Transport` so the
//! same suite runs over every transport.

#[cfg(feature = "doca")]
mod doca;
mod e2e;
mod fast_paths;
mod faults;
mod faulty;
mod fuzz;
mod hostile;
mod malicious;
mod mem;
mod raw;
mod service;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::transport::tcp::{TcpConfig, TcpTransport};
use crate::transport::Transport;
use crate::{Client, ClientConfig, Server, ServerConfig};

pub(crate) use service::{pattern, TestService};

/// A running server for one test.
pub(crate) struct Harness {
    pub(crate) addr: String,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) service: TestService,
    /// The server's live connection count.
    pub(crate) count: crate::ConnectionCount,
    stop: Option<oneshot::Sender<()>>,
    pub(crate) task: JoinHandle<crate::Result<()>>,
}

pub(crate) fn tcp() -> Arc<dyn Transport> {
    Arc::new(TcpTransport::with_config(TcpConfig {
        rnr_timeout: Duration::from_secs(5),
        ..TcpConfig::default()
    }))
}

/// A transport and the address a test server binds with it.
#[derive(Clone)]
pub(crate) struct Backend {
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) bind: String,
}

/// The software transport on loopback.
pub(crate) fn tcp_backend() -> Backend {
    Backend {
        transport: tcp(),
        bind: "tcp://127.0.0.1:0".into(),
    }
}

impl Harness {
    pub(crate) async fn start(transport: Arc<dyn Transport>, config: ServerConfig) -> Harness {
        Harness::start_on(
            &Backend {
                transport,
                bind: "tcp://127.0.0.1:0".into(),
            },
            config,
        )
        .await
    }

    /// A server on `backend` (any transport).
    pub(crate) async fn start_on(backend: &Backend, config: ServerConfig) -> Harness {
        let transport = backend.transport.clone();
        let service = TestService::default();
        let server = Server::builder()
            .config(config)
            .transport(transport.clone())
            .add_service(service.clone())
            .bind(&backend.bind)
            .await
            .expect("bind");
        let addr = server.local_addr();
        let count = server.connection_count();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.serve_with_shutdown(async move {
            let _ = stopped.await;
        }));
        Harness {
            addr,
            transport,
            service,
            count,
            stop: Some(stop),
            task,
        }
    }

    pub(crate) async fn tcp_default() -> Harness {
        Harness::start(tcp(), ServerConfig::default()).await
    }

    /// A server with the default configuration on `backend`.
    pub(crate) async fn default_on(backend: &Backend) -> Harness {
        Harness::start_on(backend, ServerConfig::default()).await
    }

    pub(crate) async fn client(&self) -> Client {
        self.client_with(ClientConfig::default()).await
    }

    pub(crate) async fn client_with(&self, config: ClientConfig) -> Client {
        Client::builder()
            .config(config)
            .transport(self.transport.clone())
            .connect(&self.addr)
            .await
            .expect("connect")
    }

    /// The error of a connection the server refuses.
    pub(crate) async fn refused(&self) -> crate::Error {
        Client::builder()
            .transport(self.transport.clone())
            .connect(&self.addr)
            .await
            .map(drop)
            .unwrap_err()
    }

    /// Starts a graceful shutdown.
    pub(crate) fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Fails the test instead of hanging it (a generous bound, not a performance assertion).
pub(crate) async fn bounded<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
}
