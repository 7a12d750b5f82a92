//! Many connections on one DOCA server: aggregate 64 B send calls per second when 1, 64 and
//! 1,000 clients each make calls one at a time. Next to them, in the same rounds, the same
//! loop beneath the framework ([`super::round_trips`]): 64 B echoes over the DOCA transport
//! alone, and between tokio tasks over channels, with 64 and 1,000 clients: how much of what
//! 1,000 connections cost is there before the RPC layers begin.
//!
//! The 64- and 1,000-connection figures are measured in alternating phases, each count on a
//! server and transports of its own, both connected for the whole round: this VM's speed swings
//! by more than the target's margin within seconds (the same build measured 0.65 and 0.87 a
//! few minutes apart when the counts ran one after the other), and a ratio of phases a tenth
//! of a second apart does not see those swings. The connections of the count not measuring
//! are idle meanwhile (in event mode an idle DOCA connection costs well under one wake-up a
//! second: docs/doca.md, "Few wake-ups").

use std::sync::Arc;

use bytes::Bytes;
use rdma_rpc_core::transport::doca::{DocaConfig, DocaTransport};
use rdma_rpc_core::transport::Transport;
use rdma_rpc_core::{Client, Server};
use tokio::runtime::Handle;

use super::measure::BenchError;
use super::round_trips::{ChannelClients, EchoClients};
use super::service::{BenchClient, BenchServer, Len, Sink};

/// Connection counts measured, in order.
pub const CONNECTIONS: [usize; 3] = [1, 64, 1000];

/// Connection counts of the baselines: the two the target compares.
pub const BASELINE_CONNECTIONS: [usize; 2] = [64, 1000];

/// One measurement at 64 and at 1,000 connections in alternating phases: each phase's rate,
/// in order (see [`alternate`]).
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct Alternated {
    /// Calls (or round trips) per second of each 64-connection phase.
    pub few: Vec<f64>,
    /// Of each 1,000-connection phase; `many[i]` ran next to `few[i]`.
    pub many: Vec<f64>,
}

impl Alternated {
    /// The median rate of each count's phases, in the order of [`BASELINE_CONNECTIONS`].
    pub fn rates(&self) -> [f64; 2] {
        [median(self.few.clone()), median(self.many.clone())]
    }

    /// The median of the ratios of neighbouring phases (1,000 connections over 64).
    pub fn ratio(&self) -> f64 {
        median(
            self.few
                .iter()
                .zip(&self.many)
                .map(|(f, m)| m / f)
                .collect(),
        )
    }
}

/// What one round measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    /// Calls per second with one connection.
    pub one: f64,
    /// Calls at 64 and 1,000 connections.
    pub calls: Alternated,
    /// Round trips over the DOCA transport alone, at the same counts.
    pub transport: Alternated,
    /// Round trips between tokio tasks over channels, at the same counts.
    pub channels: Alternated,
}

/// A baseline's figures at [`BASELINE_CONNECTIONS`] over the rounds.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Baseline {
    /// Round trips per second at each count: the median over the rounds of each round's
    /// median phase.
    pub round_trips_per_s: [f64; 2],
    /// Each round's 1,000-connection figure over its 64-connection one (the median of its
    /// neighbouring phases' ratios), in order.
    pub round_ratios: Vec<f64>,
}

impl Baseline {
    fn of<'a>(rounds: impl Iterator<Item = &'a Alternated> + Clone) -> Baseline {
        let each = |i: usize| median(rounds.clone().map(|r| r.rates()[i]).collect());
        Baseline {
            round_trips_per_s: [each(0), each(1)],
            round_ratios: rounds.map(Alternated::ratio).collect(),
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
    /// Calls per second, in the order of [`CONNECTIONS`]: each count's median over the rounds
    /// (of each round's median phase, for 64 and 1,000).
    pub calls_per_s: [f64; 3],
    /// Each round's 1,000-connection figure over its 64-connection one (the median of its
    /// neighbouring phases' ratios), in order.
    pub round_ratios: Vec<f64>,
    /// Phases of each count per round.
    pub phases: usize,
    /// Calls (or round trips) of each phase, whatever the count.
    pub phase_calls: usize,
    /// Each round's phases of calls, in order: what the medians were taken of.
    pub call_phases: Vec<Alternated>,
    /// 64 B echoes over the DOCA transport alone (no RPC protocol).
    pub transport_alone: Baseline,
    /// 64 B echoes between tokio tasks over channels (no rdma-rpc).
    pub tokio_channels: Baseline,
}

impl ScaleFigures {
    /// From each round's figures, whose phases were of `phase_calls` calls each.
    pub fn of_rounds(rounds: &[Round], phase_calls: usize) -> ScaleFigures {
        let each = |i: usize| median(rounds.iter().map(|r| r.calls.rates()[i]).collect());
        ScaleFigures {
            calls_per_s: [
                median(rounds.iter().map(|r| r.one).collect()),
                each(0),
                each(1),
            ],
            round_ratios: rounds.iter().map(|r| r.calls.ratio()).collect(),
            phases: rounds.first().map_or(0, |r| r.calls.few.len()),
            phase_calls,
            call_phases: rounds.iter().map(|r| r.calls.clone()).collect(),
            transport_alone: Baseline::of(rounds.iter().map(|r| &r.transport)),
            tokio_channels: Baseline::of(rounds.iter().map(|r| &r.channels)),
        }
    }

    /// The 1,000-connection figure over the 64-connection one (the target is ≥ 0.8): the
    /// median of the rounds' ratios, each the median of ratios between phases measured a
    /// fraction of a second apart, so that the machine's swings cancel out.
    pub fn many_over_few(&self) -> f64 {
        median(self.round_ratios.clone())
    }

    /// Lines of the report's table.
    pub fn table(&self, out: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            out,
            "\nDOCA connections (software provider, doca://): 64 B send calls/s, all clients \
             at once, each one call at a time, after one untimed call each (median of {} \
             round(s), each on new servers; 64 and 1,000 connections on a server each, in {} \
             alternating phases of {} calls each per round):",
            self.round_ratios.len(),
            2 * self.phases,
            self.phase_calls
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
            "  1,000 over 64 by round (each the median of its neighbouring phases' ratios): \
             {} (median {:.2})",
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

/// Calls of the one-connection figure.
fn total_calls(quick: bool) -> usize {
    if quick {
        8_000
    } else {
        40_000
    }
}

/// Calls (or round trips) of each phase, the same whatever the connection count: at this VM's
/// rates a tenth of a second or more, 20 per connection at 1,000 (so that the last calls of
/// a phase, when fewer clients are left, weigh little).
fn phase_calls(quick: bool) -> usize {
    if quick {
        4_000
    } else {
        20_000
    }
}

/// Pairs of phases per round (see [`alternate`]).
fn pairs(quick: bool) -> usize {
    if quick {
        2
    } else {
        4
    }
}

/// Rounds of the whole measurement, each on new servers and transports. Three, so that one
/// round's server (a slow start, a neighbour's burst) does not decide the median.
pub fn rounds(quick: bool) -> usize {
    if quick {
        1
    } else {
        3
    }
}

/// Room for a count's connections, and those of a count before it still closing.
const SERVER_CONNECTIONS: u16 = 2048;

/// Measures [`CONNECTIONS`] against `doca://` servers started on `server` (a runtime of its
/// own), from the current runtime, for [`rounds`] rounds.
pub async fn doca_connections(server: &Handle, quick: bool) -> Result<ScaleFigures, BenchError> {
    let mut rounds = Vec::new();
    for _ in 0..self::rounds(quick) {
        rounds.push(round(server, quick).await?);
    }
    Ok(ScaleFigures::of_rounds(&rounds, phase_calls(quick)))
}

/// One round: one connection on a server of its own, then each pair of figures (calls, the
/// transport alone, channels) at 64 and 1,000 connections in alternating phases.
async fn round(server: &Handle, quick: bool) -> Result<Round, BenchError> {
    let [few, many] = BASELINE_CONNECTIONS;
    let (pairs, per) = (pairs(quick), phase_calls(quick));
    let one = doca_connections_of(server, &[1], quick).await?[0];
    let calls = {
        let a = RpcClients::start(server, few).await?;
        let b = RpcClients::start(server, many).await?;
        let calls = alternate(
            pairs,
            || a.calls_per_second(per),
            || b.calls_per_second(per),
        )
        .await;
        a.stop().await;
        b.stop().await;
        calls?
    };
    let transport = {
        let a = EchoSet::start(server, few).await?;
        let b = EchoSet::start(server, many).await?;
        alternate(
            pairs,
            || a.clients.round_trips_per_second(per),
            || b.clients.round_trips_per_second(per),
        )
        .await?
    };
    let channels = {
        let a = ChannelClients::spawn(server, few);
        let b = ChannelClients::spawn(server, many);
        alternate(
            pairs,
            || a.round_trips_per_second(per),
            || b.round_trips_per_second(per),
        )
        .await?
    };
    Ok(Round {
        one,
        calls,
        transport,
        channels,
    })
}

/// Runs `few` and `many` (each one timed phase, giving its rate) in `pairs` pairs of phases,
/// in the order few, many, many, few, few, many...: a machine that speeds up or slows down
/// steadily favours neither.
pub async fn alternate<A, FA, B, FB>(
    pairs: usize,
    mut few: A,
    mut many: B,
) -> Result<Alternated, BenchError>
where
    A: FnMut() -> FA,
    FA: std::future::Future<Output = Result<f64, BenchError>>,
    B: FnMut() -> FB,
    FB: std::future::Future<Output = Result<f64, BenchError>>,
{
    let mut out = Alternated::default();
    for pair in 0..pairs {
        if pair % 2 == 0 {
            out.few.push(few().await?);
            out.many.push(many().await?);
        } else {
            out.many.push(many().await?);
            out.few.push(few().await?);
        }
    }
    Ok(out)
}

/// A server's transport and a client's.
type Pair = (Arc<dyn Transport>, Arc<dyn Transport>);

/// A server transport with room for [`SERVER_CONNECTIONS`], and a client transport, both new.
fn transports() -> Result<Pair, BenchError> {
    let mut config = DocaConfig::from_env();
    config.max_connections = SERVER_CONNECTIONS;
    let server: Arc<dyn Transport> = Arc::new(DocaTransport::new(config)?);
    let client: Arc<dyn Transport> = Arc::new(DocaTransport::new(DocaConfig::from_env())?);
    Ok((server, client))
}

/// The benchmark's server on `transport`, served on `server` until stopped.
struct Served {
    addr: String,
    stop: tokio::sync::oneshot::Sender<()>,
    serving: tokio::task::JoinHandle<Result<(), rdma_rpc_core::Error>>,
}

impl Served {
    async fn start(server: &Handle, transport: Arc<dyn Transport>) -> Result<Served, BenchError> {
        let bound = server
            .spawn(async move {
                Server::builder()
                    .transport(transport)
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
        Ok(Served {
            addr,
            stop,
            serving,
        })
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.serving.await;
    }
}

/// As [`doca_connections`], for any list of connection counts, one after the other on one
/// server: calls per second of each.
pub async fn doca_connections_of(
    server: &Handle,
    counts: &[usize],
    quick: bool,
) -> Result<Vec<f64>, BenchError> {
    let (server_t, client_t) = transports()?;
    let served = Served::start(server, server_t).await?;
    let mut rates = Vec::with_capacity(counts.len());
    for &n in counts {
        match calls_per_second(&client_t, &served.addr, n, total_calls(quick)).await {
            Ok(rate) => rates.push(rate),
            Err(e) => {
                served.stop().await;
                return Err(e);
            }
        }
    }
    served.stop().await;
    Ok(rates)
}

/// A server on transports of its own and `n` clients of it, connected and warm, for phases
/// of calls.
struct RpcClients {
    clients: Vec<BenchClient>,
    served: Served,
}

impl RpcClients {
    async fn start(server: &Handle, n: usize) -> Result<RpcClients, BenchError> {
        let (server_t, client_t) = transports()?;
        let served = Served::start(server, server_t).await?;
        match connect_warm(&client_t, &served.addr, n).await {
            Ok(clients) => Ok(RpcClients { clients, served }),
            Err(e) => {
                served.stop().await;
                Err(e)
            }
        }
    }

    async fn calls_per_second(&self, total: usize) -> Result<f64, BenchError> {
        calls_of(&self.clients, total).await
    }

    /// Closes the clients, then stops the server.
    async fn stop(self) {
        drop(self.clients);
        self.served.stop().await;
    }
}

/// An echo server on transports of its own and `n` connections to it, ready.
struct EchoSet {
    // Closed before the server stops.
    clients: EchoClients,
    _server: super::round_trips::EchoServer,
}

impl EchoSet {
    async fn start(server: &Handle, n: usize) -> Result<EchoSet, BenchError> {
        let (server_t, client_t) = transports()?;
        // Stops accepting when dropped, and lets its transport go.
        let echo = server
            .spawn(super::round_trips::echo_server(
                server_t,
                "doca://127.0.0.1:0",
            ))
            .await??;
        let clients = EchoClients::connect(&client_t, &echo.addr, n).await?;
        Ok(EchoSet {
            clients,
            _server: echo,
        })
    }
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
    calls_of(&connect_warm(transport, addr, n).await?, total).await
}

/// `n` clients of the benchmark's server at `addr`, connected, each after one untimed call:
/// what a connection's first call sets up is not the rate.
async fn connect_warm(
    transport: &Arc<dyn Transport>,
    addr: &str,
    n: usize,
) -> Result<Vec<BenchClient>, BenchError> {
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        let client = Client::builder()
            .transport(transport.clone())
            .connect(addr)
            .await?;
        clients.push(BenchClient::new(client));
    }
    let data = message();
    let mut warm = tokio::task::JoinSet::new();
    for client in &clients {
        let (client, data) = (client.clone(), data.clone());
        warm.spawn(async move { client.send_bytes(Len { len: 64 }, data).await });
    }
    while let Some(done) = warm.join_next().await {
        done??;
    }
    Ok(clients)
}

/// The 64 B of every call (one allocation, shared by the clients' calls).
fn message() -> Bytes {
    Bytes::from(vec![0x5a; 64])
}

/// Each of `clients` makes its share of `total` calls one after the other, all at once: calls
/// per second of all of them together.
async fn calls_of(clients: &[BenchClient], total: usize) -> Result<f64, BenchError> {
    let data = message();
    super::round_trips::shares_per_second(total, clients, |client, each| {
        let data = data.clone();
        async move {
            for _ in 0..each {
                client.send_bytes(Len { len: 64 }, data.clone()).await?;
            }
            Ok(())
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::{alternate, Alternated, Round, ScaleFigures};

    /// One phase of each count.
    fn one_pair(few: f64, many: f64) -> Alternated {
        Alternated {
            few: vec![few],
            many: vec![many],
        }
    }

    /// A round with these calls per second, and baselines at twice and four times them.
    fn round(calls: [f64; 3]) -> Round {
        Round {
            one: calls[0],
            calls: one_pair(calls[1], calls[2]),
            transport: one_pair(calls[1] * 2.0, calls[2] * 2.0),
            channels: one_pair(calls[1] * 4.0, calls[2] * 8.0),
        }
    }

    #[test]
    fn the_ratio_is_the_median_of_the_rounds_ratios() {
        // Round 2 ran on a fast machine, round 3 with its 64-connection figure slowed.
        let f = ScaleFigures::of_rounds(
            &[
                round([10.0, 100.0, 50.0]),
                round([20.0, 400.0, 240.0]),
                round([10.0, 50.0, 45.0]),
            ],
            1000,
        );
        assert_eq!(f.calls_per_s, [10.0, 100.0, 50.0]);
        assert_eq!(f.round_ratios, vec![0.5, 0.6, 0.9]);
        assert_eq!(f.many_over_few(), 0.6);
        assert_eq!(f.transport_alone.round_trips_per_s, [200.0, 100.0]);
        assert_eq!(f.transport_alone.many_over_few(), 0.6);
        assert_eq!(f.tokio_channels.round_trips_per_s, [400.0, 400.0]);
        assert_eq!(f.tokio_channels.many_over_few(), 1.2);
        let two = ScaleFigures::of_rounds(
            &[round([1.0, 100.0, 50.0]), round([1.0, 100.0, 70.0])],
            1000,
        );
        assert!((two.many_over_few() - 0.6).abs() < 1e-12);
        let mut out = String::new();
        f.table(&mut out);
        assert!(
            out.contains("in 2 alternating phases of 1000 calls"),
            "{out}"
        );
        assert!(out.contains("0.50, 0.60, 0.90 (median 0.60)"), "{out}");
        assert!(
            out.contains("200 /s over 64,        100 /s over 1,000: 0.60"),
            "{out}"
        );
    }

    /// Each ratio is taken between neighbouring phases: a machine that slows down by half
    /// during the round changes the rates, not the ratio.
    #[test]
    fn a_round_s_ratio_is_between_neighbouring_phases() {
        let a = Alternated {
            few: vec![100.0, 80.0, 60.0, 50.0],
            many: vec![90.0, 72.0, 54.0, 10.0],
        };
        assert_eq!(a.rates(), [70.0, 63.0]);
        // 0.9 three times; the last pair, disturbed, does not move the median.
        assert!((a.ratio() - 0.9).abs() < 1e-12, "{}", a.ratio());
        // No phases, no ratio.
        assert_eq!(Alternated::default().ratio(), 0.0);
    }

    /// Phases alternate as few, many, many, few, ... and each ends up in its own list.
    #[tokio::test]
    async fn phases_alternate_and_keep_their_pairs() {
        let order = std::cell::RefCell::new(Vec::new());
        let next = std::cell::Cell::new(0.0);
        let phase = |what: &'static str| {
            order.borrow_mut().push(what);
            next.set(next.get() + 1.0);
            let rate = next.get();
            async move { Ok(rate) }
        };
        let a = alternate(3, || phase("few"), || phase("many"))
            .await
            .unwrap();
        assert_eq!(
            *order.borrow(),
            ["few", "many", "many", "few", "few", "many"]
        );
        assert_eq!(a.few, [1.0, 4.0, 5.0]);
        assert_eq!(a.many, [2.0, 3.0, 6.0]);
    }
}
