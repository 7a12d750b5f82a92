//! Many connections on one DOCA server: aggregate 64 B send calls per second when 1, 64 and
//! 1,000 clients each make calls one at a time, all on the same server and client transports
//! of the same run (so the figures compare connection counts, not machines).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use rdma_rpc_core::transport::doca::{DocaConfig, DocaTransport};
use rdma_rpc_core::transport::Transport;
use rdma_rpc_core::{Client, Server};
use tokio::runtime::Handle;

use super::measure::BenchError;
use super::service::{BenchClient, BenchServer, Len, Sink};

/// Connection counts measured, in order.
pub const CONNECTIONS: [usize; 3] = [1, 64, 1000];

/// Aggregate calls per second for each of [`CONNECTIONS`].
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ScaleFigures {
    /// Calls per second, in the order of [`CONNECTIONS`].
    pub calls_per_s: [f64; 3],
}

impl ScaleFigures {
    /// The 1,000-connection figure over the 64-connection one (the target is ≥ 0.8).
    pub fn many_over_few(&self) -> f64 {
        self.calls_per_s[2] / self.calls_per_s[1]
    }

    /// Lines of the report's table.
    pub fn table(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            out,
            "\nDOCA connections (software provider, doca://, one server): 64 B send calls/s, \
             all clients at once, each one call at a time, after one untimed call each:"
        );
        for (n, rate) in CONNECTIONS.iter().zip(self.calls_per_s) {
            let _ = writeln!(
                out,
                "  {n:>5} connections  {rate:>10.0} calls/s   {:.2} of 64 connections",
                rate / self.calls_per_s[1]
            );
        }
    }
}

/// Total calls per measurement: the same work whatever the connection count.
fn total_calls(quick: bool) -> usize {
    if quick {
        8_000
    } else {
        40_000
    }
}

/// Room for the connections of one count while those of the previous one are still closing.
const SERVER_CONNECTIONS: u16 = 2048;

/// Starts a `doca://` server of the benchmark's service on `server` (a runtime of its own)
/// and measures [`CONNECTIONS`] against it from the current runtime.
pub async fn doca_connections(server: &Handle, quick: bool) -> Result<ScaleFigures, BenchError> {
    let rates = doca_connections_of(server, &CONNECTIONS, quick).await?;
    Ok(ScaleFigures {
        calls_per_s: [rates[0], rates[1], rates[2]],
    })
}

/// As [`doca_connections`], for any list of connection counts: calls per second of each.
pub async fn doca_connections_of(
    server: &Handle,
    counts: &[usize],
    quick: bool,
) -> Result<Vec<f64>, BenchError> {
    let mut config = DocaConfig::from_env();
    config.max_connections = SERVER_CONNECTIONS;
    let server_t: Arc<dyn Transport> = Arc::new(DocaTransport::new(config)?);
    let client_t: Arc<dyn Transport> = Arc::new(DocaTransport::new(DocaConfig::from_env())?);
    let bound = server
        .spawn(async move {
            Server::builder()
                .transport(server_t)
                .max_connections(usize::from(SERVER_CONNECTIONS))
                .add_service(BenchServer::new(Sink))
                .bind("doca://127.0.0.1:0")
                .await
        })
        .await??;
    let addr = bound.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = server.spawn(bound.serve_with_shutdown(async {
        let _ = stopped.await;
    }));
    let mut rates = Vec::with_capacity(counts.len());
    for &n in counts {
        match calls_per_second(&client_t, &addr, n, total_calls(quick)).await {
            Ok(rate) => rates.push(rate),
            Err(e) => {
                let _ = stop.send(());
                return Err(e);
            }
        }
    }
    let _ = stop.send(());
    let _ = serving.await;
    Ok(rates)
}

/// `n` clients of the benchmark's server at `addr` connect (not timed) and make one untimed
/// call each, then each makes its share of `total` 64 B send calls one after the other, all
/// clients at once, on tasks of the current runtime: the calls per second of all of them
/// together.
pub async fn calls_per_second(
    transport: &Arc<dyn Transport>,
    addr: &str,
    n: usize,
    total: usize,
) -> Result<f64, BenchError> {
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        let client = Client::builder()
            .transport(transport.clone())
            .connect(addr)
            .await?;
        clients.push(BenchClient::new(client));
    }
    let each = (total / n).max(1);
    let data = Bytes::from(vec![0x5a; 64]);
    // One untimed call each: what a connection's first call sets up is not the rate.
    let mut warm = tokio::task::JoinSet::new();
    for client in &clients {
        let (client, data) = (client.clone(), data.clone());
        warm.spawn(async move { client.send_bytes(Len { len: 64 }, data).await });
    }
    while let Some(done) = warm.join_next().await {
        done??;
    }
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for client in clients {
        let data = data.clone();
        tasks.spawn(async move {
            for _ in 0..each {
                let len = Len { len: 64 };
                client.send_bytes(len, data.clone()).await?;
            }
            Ok::<(), BenchError>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok((each * n) as f64 / start.elapsed().as_secs_f64())
}
