//! Many connections on one DOCA server: aggregate 64 B send calls per second when 1, 64 and
//! 1,000 clients each make calls one at a time, all on the same server and client transports
//! of the same run (so the figures compare connection counts, not machines). Next to them, in
//! the same rounds, the same loop beneath the framework ([`super::round_trips`]): 64 B echoes
//! over the DOCA transport alone, and between tokio tasks over channels, with 64 and 1,000
//! clients: how much of what 1,000 connections cost is there before the RPC layers begin.

use std::sync::Arc;

use bytes::Bytes;
use rdma_rpc_core::transport::doca::{DocaConfig, DocaTransport};
use rdma_rpc_core::transport::Transport;
use rdma_rpc_core::{Client, Server};
use tokio::runtime::Handle;

use super::measure::BenchError;
use super::service::{BenchClient, BenchServer, Len, Sink};

/// Connection counts measured, in order.
pub const CONNECTIONS: [usize; 3] = [1, 64, 1000];

/// Connection counts of the baselines: the two the target compares.
pub const BASELINE_CONNECTIONS: [usize; 2] = [64, 1000];

/// What one round measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Round {
    /// Calls per second, in the order of [`CONNECTIONS`].
    pub calls: [f64; 3],
    /// Round trips per second over the DOCA transport alone, in the order of
    /// [`BASELINE_CONNECTIONS`].
    pub transport: [f64; 2],
    /// Round trips per second between tokio tasks over channels, in the same order.
    pub channels: [f64; 2],
}

/// A baseline's figures at [`BASELINE_CONNECTIONS`] over the rounds.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Baseline {
    /// Round trips per second at each count: its median over the rounds.
    pub round_trips_per_s: [f64; 2],
    /// Each round's 1,000-connection figure over its 64-connection one, in order.
    pub round_ratios: Vec<f64>,
}

impl Baseline {
    fn of(rounds: impl Iterator<Item = [f64; 2]> + Clone) -> Baseline {
        let each = |i: usize| median(rounds.clone().map(|r| r[i]).collect());
        Baseline {
            round_trips_per_s: [each(0), each(1)],
            round_ratios: rounds.map(|r| r[1] / r[0]).collect(),
        }
    }

    /// The median of the rounds' ratios.
    pub fn many_over_few(&self) -> f64 {
        median(self.round_ratios.clone())
    }
}

/// Aggregate calls per second for each of [`CONNECTIONS`], over [`rounds`] rounds, and the
/// baselines of the same rounds.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ScaleFigures {
    /// Calls per second, in the order of [`CONNECTIONS`]: each count's median over the rounds.
    pub calls_per_s: [f64; 3],
    /// Each round's 1,000-connection figure over its 64-connection one, in order.
    pub round_ratios: Vec<f64>,
    /// 64 B echoes over the DOCA transport alone (no RPC protocol).
    pub transport_alone: Baseline,
    /// 64 B echoes between tokio tasks over channels (no rdma-rpc).
    pub tokio_channels: Baseline,
}

impl ScaleFigures {
    /// From each round's figures.
    pub fn of_rounds(rounds: &[Round]) -> ScaleFigures {
        let each = |i: usize| median(rounds.iter().map(|r| r.calls[i]).collect());
        ScaleFigures {
            calls_per_s: [each(0), each(1), each(2)],
            round_ratios: rounds.iter().map(|r| r.calls[2] / r.calls[1]).collect(),
            transport_alone: Baseline::of(rounds.iter().map(|r| r.transport)),
            tokio_channels: Baseline::of(rounds.iter().map(|r| r.channels)),
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
        let _ = writeln!(
            out,
            "  Beneath the framework, in the same rounds: 64 B echoes, each client one at a time:"
        );
        for (what, b) in [
            ("the DOCA transport alone (no RPC)", &self.transport_alone),
            (
                "tokio tasks over channels (no rdma-rpc)",
                &self.tokio_channels,
            ),
        ] {
            let [few, many] = b.round_trips_per_s;
            let _ = writeln!(
                out,
                "    {what:<40} {few:>10.0} /s over 64, {many:>10.0} /s over 1,000: {:.2} \
                 (median of the rounds)",
                b.many_over_few()
            );
        }
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
        let mut round = Round {
            calls: [rates[0], rates[1], rates[2]],
            transport: [0.0; 2],
            channels: [0.0; 2],
        };
        let (server_t, client_t) = transports()?;
        // Stops accepting when dropped, at the end of the round, and lets its transport go.
        let echo = server
            .spawn(super::round_trips::echo_server(
                server_t,
                "doca://127.0.0.1:0",
            ))
            .await??;
        for (i, n) in BASELINE_CONNECTIONS.into_iter().enumerate() {
            let total = total_calls(quick);
            round.transport[i] =
                super::round_trips::over_transport(&client_t, &echo.addr, n, total).await?;
            round.channels[i] = super::round_trips::over_channels(server, n, total).await?;
        }
        rounds.push(round);
    }
    Ok(ScaleFigures::of_rounds(&rounds))
}

/// A server's transport and a client's.
type Pair = (Arc<dyn Transport>, Arc<dyn Transport>);

/// A server transport with room for the connections of one count while those of the previous
/// one are still closing, and a client transport, both new.
fn transports() -> Result<Pair, BenchError> {
    let mut config = DocaConfig::from_env();
    config.max_connections = SERVER_CONNECTIONS;
    let server: Arc<dyn Transport> = Arc::new(DocaTransport::new(config)?);
    let client: Arc<dyn Transport> = Arc::new(DocaTransport::new(DocaConfig::from_env())?);
    Ok((server, client))
}

/// As [`doca_connections`], for any list of connection counts: calls per second of each.
pub async fn doca_connections_of(
    server: &Handle,
    counts: &[usize],
    quick: bool,
) -> Result<Vec<f64>, BenchError> {
    let (server_t, client_t) = transports()?;
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
    super::round_trips::per_second(each * n, clients, |client| {
        let data = data.clone();
        async move {
            for _ in 0..each {
                let len = Len { len: 64 };
                client.send_bytes(len, data.clone()).await?;
            }
            Ok(())
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::{Round, ScaleFigures};

    /// A round with these calls per second, and baselines at twice and four times them.
    fn round(calls: [f64; 3]) -> Round {
        Round {
            calls,
            transport: [calls[1] * 2.0, calls[2] * 2.0],
            channels: [calls[1] * 4.0, calls[2] * 8.0],
        }
    }

    #[test]
    fn the_ratio_is_the_median_of_the_rounds_ratios() {
        // Round 2 ran on a fast machine, round 3 with its 64-connection figure slowed.
        let f = ScaleFigures::of_rounds(&[
            round([10.0, 100.0, 50.0]),
            round([20.0, 400.0, 240.0]),
            round([10.0, 50.0, 45.0]),
        ]);
        assert_eq!(f.calls_per_s, [10.0, 100.0, 50.0]);
        assert_eq!(f.round_ratios, vec![0.5, 0.6, 0.9]);
        assert_eq!(f.many_over_few(), 0.6);
        assert_eq!(f.transport_alone.round_trips_per_s, [200.0, 100.0]);
        assert_eq!(f.transport_alone.many_over_few(), 0.6);
        assert_eq!(f.tokio_channels.round_trips_per_s, [400.0, 400.0]);
        assert_eq!(f.tokio_channels.many_over_few(), 1.2);
        let two = ScaleFigures::of_rounds(&[round([1.0, 100.0, 50.0]), round([1.0, 100.0, 70.0])]);
        assert!((two.many_over_few() - 0.6).abs() < 1e-12);
        let mut out = String::new();
        f.table(&mut out);
        assert!(
            out.contains("1,000 over 64 by round: 0.50, 0.60, 0.90 (median 0.60)"),
            "{out}"
        );
        assert!(
            out.contains("200 /s over 64,        100 /s over 1,000: 0.60"),
            "{out}"
        );
    }
}
