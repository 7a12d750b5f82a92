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

/// Aggregate calls per second for each of [`CONNECTIONS`], over [`rounds`] rounds.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ScaleFigures {
    /// Calls per second, in the order of [`CONNECTIONS`]: each count's median over the rounds.
    pub calls_per_s: [f64; 3],
    /// Each round's 1,000-connection figure over its 64-connection one, in order.
    pub round_ratios: Vec<f64>,
}

impl ScaleFigures {
    /// From each round's figures (in the order of [`CONNECTIONS`]).
    pub fn of_rounds(rounds: &[[f64; 3]]) -> ScaleFigures {
        let each = |i: usize| median(rounds.iter().map(|r| r[i]).collect());
        ScaleFigures {
            calls_per_s: [each(0), each(1), each(2)],
            round_ratios: rounds.iter().map(|r| r[2] / r[1]).collect(),
        }
    }

    /// The 1,000-connection figure over the 64-connection one (the target is ≥ 0.8): the
    /// median of the rounds' ratios, each taken between figures measured seconds apart, so
    /// that the machine's swings between rounds cancel out.
    pub fn many_over_few(&self) -> f64 {
        median(self.round_ratios.clone())
    }

    /// Lines of the report's table.
    pub fn table(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            out,
            "\nDOCA connections (software provider, doca://, one server): 64 B send calls/s, \
             all clients at once, each one call at a time, after one untimed call each \
             (median of {} round(s), each on a new server):",
            self.round_ratios.len()
        );
        for (n, rate) in CONNECTIONS.iter().zip(self.calls_per_s) {
            let _ = writeln!(
                out,
                "  {n:>5} connections  {rate:>10.0} calls/s   {:.2} of 64 connections",
                rate / self.calls_per_s[1]
            );
        }
        let rounds: Vec<String> = self
            .round_ratios
            .iter()
            .map(|r| format!("{r:.2}"))
            .collect();
        let _ = writeln!(
            out,
            "  1,000 over 64 by round: {} (median {:.2})",
            rounds.join(", "),
            self.many_over_few()
        );
    }
}

/// The median of `values` (the mean of the middle two for an even count; 0 for none).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
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

/// Rounds of the whole measurement. A round measures every count in order on transports
/// and a server of its own: a server that once held 1,000 connections keeps their staging
/// receives posted, so a 64-connection figure measured after it would not be one of 64.
/// This VM's speed swings by more than the ratio's margin between runs; three rounds, each
/// ratio taken within seconds, give a median that one swing does not decide.
pub fn rounds(quick: bool) -> usize {
    if quick {
        1
    } else {
        3
    }
}

/// Room for the connections of one count while those of the previous one are still closing.
const SERVER_CONNECTIONS: u16 = 2048;

/// Measures [`CONNECTIONS`] against `doca://` servers started on `server` (a runtime of its
/// own), from the current runtime, for [`rounds`] rounds.
pub async fn doca_connections(server: &Handle, quick: bool) -> Result<ScaleFigures, BenchError> {
    let mut rounds = Vec::new();
    for _ in 0..self::rounds(quick) {
        let rates = doca_connections_of(server, &CONNECTIONS, quick).await?;
        rounds.push([rates[0], rates[1], rates[2]]);
    }
    Ok(ScaleFigures::of_rounds(&rounds))
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

#[cfg(test)]
mod tests {
    use super::ScaleFigures;

    #[test]
    fn the_ratio_is_the_median_of_the_rounds_ratios() {
        // Round 2 ran on a fast machine, round 3 with its 64-connection figure slowed.
        let f = ScaleFigures::of_rounds(&[
            [10.0, 100.0, 50.0],
            [20.0, 400.0, 240.0],
            [10.0, 50.0, 45.0],
        ]);
        assert_eq!(f.calls_per_s, [10.0, 100.0, 50.0]);
        assert_eq!(f.round_ratios, vec![0.5, 0.6, 0.9]);
        assert_eq!(f.many_over_few(), 0.6);
        let two = ScaleFigures::of_rounds(&[[1.0, 100.0, 50.0], [1.0, 100.0, 70.0]]);
        assert!((two.many_over_few() - 0.6).abs() < 1e-12);
        let mut out = String::new();
        f.table(&mut out);
        assert!(
            out.contains("1,000 over 64 by round: 0.50, 0.60, 0.90 (median 0.60)"),
            "{out}"
        );
    }
}
