//! A DOCA server that holds 1,000 connections, over the software provider: connected in bursts
//! of 250 at once, each making a call of every operation (send, receive, write, read), then all
//! dropped and reconnected at once. No connection may end with receiver not ready, and the
//! provider's counters give what an idle connection pins on each side, what a connect
//! registers, and how often event-mode owners wake while the connections sit idle.
//!
//! A test binary of its own, with the server on the provider's `mlx5_0` and the clients on
//! `mlx5_1`, so each device's counters see one side only. CM and out of band run one after
//! the other in one test (they share the devices' counters).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdma_rpc_core::service::{EndpointDef, OpKind, ServerCall, Service};
use rdma_rpc_core::transport::doca::{Counters, DocaConfig, DocaTransport};
use rdma_rpc_core::transport::{BoxFuture, Transport};
use rdma_rpc_core::{Client, ConnectionCount, Server, ServerConfig, Status, StreamKind};

const CONNECTIONS: usize = 1000;
const BURST: usize = 250;

/// Inline sizes for send and receive, RDMA sizes (beyond the inline threshold) for write and
/// read.
const SMALL: usize = 512;
const LARGE: usize = 32 * 1024;

static OPS: &[EndpointDef] = &[
    EndpointDef {
        path: "/scale/send",
        op: OpKind::Send,
        buffer_size: 4096,
        method: "send",
        timeout_ms: None,
        stream: StreamKind::Unary,
    },
    EndpointDef {
        path: "/scale/receive",
        op: OpKind::Receive,
        buffer_size: 4096,
        method: "receive",
        timeout_ms: None,
        stream: StreamKind::Unary,
    },
    EndpointDef {
        path: "/scale/write",
        op: OpKind::Write,
        buffer_size: 64 * 1024,
        method: "write",
        timeout_ms: None,
        stream: StreamKind::Unary,
    },
    EndpointDef {
        path: "/scale/read",
        op: OpKind::Read,
        buffer_size: 64 * 1024,
        method: "read",
        timeout_ms: None,
        stream: StreamKind::Unary,
    },
];

/// The bytes a client with `seed` moves: distinct per client and position (byte `i` is
/// `31 i + 7919 seed`, modulo 256). Built by copies of one 256-byte period: byte by byte, in a
/// debug build, this and [`checksum`] took half the test's time.
fn pattern(seed: u32, len: usize) -> Vec<u8> {
    let period: Vec<u8> = (0..256u32)
        .map(|i| i.wrapping_mul(31).wrapping_add(seed.wrapping_mul(7919)) as u8)
        .collect();
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let take = (len - out.len()).min(period.len());
        out.extend_from_slice(&period[..take]);
    }
    out
}

/// Inbound calls answer with a checksum of what arrived; outbound calls fill the pattern of
/// the seed and length their request names.
struct Scale;

impl Service for Scale {
    fn name(&self) -> &'static str {
        "Scale"
    }

    fn endpoints(&self) -> &'static [EndpointDef] {
        OPS
    }

    fn call<'a>(&'a self, _: usize, call: ServerCall<'a>) -> BoxFuture<'a, Result<Bytes, Status>> {
        Box::pin(async move {
            match call {
                ServerCall::Inbound { data, .. } => Ok(Bytes::from(checksum(&data).to_string())),
                ServerCall::Outbound { request, buf } => {
                    let message = &request.message;
                    let (seed, len) = match message.len() {
                        8 => (
                            u32::from_le_bytes(message[..4].try_into().expect("4 bytes")),
                            u32::from_le_bytes(message[4..].try_into().expect("4 bytes")) as usize,
                        ),
                        _ => return Err(Status::invalid_argument("seed and length")),
                    };
                    buf.fill_from(&pattern(seed, len))
                        .map_err(|e| Status::internal(e.to_string()))?;
                    Ok(Bytes::new())
                }
                _ => Err(Status::unimplemented("unary calls only")),
            }
        })
    }
}

/// A checksum of `data` that sees every byte and its place (SipHash with fixed keys: the
/// same in the client and the server, and std's optimized code even in debug builds).
fn checksum(data: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut hasher = std::hash::DefaultHasher::new();
    hasher.write(data);
    hasher.finish()
}

fn request(seed: u32, len: usize) -> Bytes {
    let mut m = seed.to_le_bytes().to_vec();
    m.extend_from_slice(&(len as u32).to_le_bytes());
    Bytes::from(m)
}

/// One call of every operation, each checked byte for byte.
async fn every_operation(client: &Client, seed: u32) {
    for (ep, len) in [(&OPS[0], SMALL), (&OPS[2], LARGE)] {
        let data = pattern(seed, len);
        let (answer, _) = client
            .call_raw(ep, Bytes::new(), Some(Bytes::from(data.clone())), None)
            .await
            .unwrap_or_else(|e| panic!("{} of client {seed}: {e}", ep.path));
        assert_eq!(
            answer,
            checksum(&data).to_string().as_bytes(),
            "{}",
            ep.path
        );
    }
    for (ep, len) in [(&OPS[1], SMALL), (&OPS[3], LARGE)] {
        let (_, got) = client
            .call_raw(ep, request(seed, len), None, None)
            .await
            .unwrap_or_else(|e| panic!("{} of client {seed}: {e}", ep.path));
        assert!(
            got[..] == pattern(seed, len)[..],
            "{} of client {seed}",
            ep.path
        );
    }
}

/// Runs `work` on each item, each on a task of its own, all at once: the outputs in the
/// items' order (a panic in one fails the test).
async fn all_at_once<T, F, Fut>(items: impl IntoIterator<Item = T>, work: F) -> Vec<Fut::Output>
where
    F: Fn(T) -> Fut,
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    let mut n = 0;
    for (i, item) in items.into_iter().enumerate() {
        let job = work(item);
        set.spawn(async move { (i, job.await) });
        n += 1;
    }
    let mut out: Vec<Option<Fut::Output>> = (0..n).map(|_| None).collect();
    while let Some(done) = set.join_next().await {
        let (i, v) = done.expect("a task of the test failed");
        out[i] = Some(v);
    }
    out.into_iter()
        .map(|o| o.expect("every task ran"))
        .collect()
}

async fn connect_many(transport: &Arc<dyn Transport>, addr: &str, n: usize) -> Vec<Client> {
    all_at_once(0..n, |_| {
        let (transport, addr) = (transport.clone(), addr.to_owned());
        async move {
            Client::builder()
                .transport(transport)
                .connect(&addr)
                .await
                .expect("connect")
        }
    })
    .await
}

/// [`every_operation`] on every client, all at once, the seeds counted from `first`.
async fn every_operation_on(clients: &[Client], first: usize) {
    all_at_once(clients.iter().cloned().enumerate(), |(i, c)| async move {
        every_operation(&c, (first + i) as u32).await
    })
    .await;
}

/// Waits (at most 60 s) until the server counts `n` connections.
async fn until_connections(count: &ConnectionCount, n: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    while count.current() != n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    count.current()
}

fn transport(device: &str) -> DocaTransport {
    let mut config = DocaConfig::default();
    config.device = Some(device.into());
    DocaTransport::new(config).expect("the provider's devices")
}

fn per(n: u64, of: usize) -> f64 {
    n as f64 / of as f64
}

async fn thousand_connections(scheme: &str) {
    let server_t = transport("mlx5_0");
    let client_t = transport("mlx5_1");
    let reading = |t: &DocaTransport| -> Counters { t.counters().expect("the provider counts") };

    // Every client is on this host: out of band, they all come from one address.
    let mut config = ServerConfig::default();
    config.max_connections_per_peer = 0;
    let server = Server::builder()
        .transport(Arc::new(server_t.clone()))
        .config(config)
        .add_service(Scale)
        .bind(&format!("{scheme}://127.0.0.1:0"))
        .await
        .expect("bind");
    let (addr, count) = (server.local_addr(), server.connection_count());
    tokio::spawn(server.serve());
    let clients_t: Arc<dyn Transport> = Arc::new(client_t.clone());

    // One connection first: what the server pinned at bind and for its first connection is
    // not what each further one costs.
    let first = connect_many(&clients_t, &addr, 1).await;
    every_operation(&first[0], u32::MAX).await;
    let (server_before, client_before) = (reading(&server_t), reading(&client_t));

    // Connected in bursts of 250 at once.
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS / BURST {
        clients.extend(connect_many(&clients_t, &addr, BURST).await);
    }
    assert_eq!(
        until_connections(&count, CONNECTIONS + 1).await,
        CONNECTIONS + 1
    );
    let (server_idle, client_idle) = (reading(&server_t), reading(&client_t));
    let server_cost = server_idle.since(&server_before);
    let client_cost = client_idle.since(&client_before);
    // `pinned_bytes` is a level, not a count: the difference of two readings.
    let pinned = |after: &Counters, before: &Counters| {
        per(
            after.pinned_bytes.saturating_sub(before.pinned_bytes),
            CONNECTIONS,
        )
    };
    let server_pinned = pinned(&server_idle, &server_before);
    let client_pinned = pinned(&client_idle, &client_before);
    println!(
        "{scheme}: {CONNECTIONS} idle connections: {:.1} KiB pinned per server connection, \
         {:.1} KiB per client connection; {:.3} registrations per connect on the server, {:.3} \
         on the client",
        server_pinned / 1024.0,
        client_pinned / 1024.0,
        per(server_cost.registrations, CONNECTIONS),
        per(client_cost.registrations, CONNECTIONS),
    );

    // Idle: how often the event-mode owners wake (a figure, not a check: it depends on time).
    let wakes = (server_t.wakeups(), client_t.wakeups());
    let idle_since = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seconds = idle_since.elapsed().as_secs_f64();
    println!(
        "{scheme}: idle wake-ups per second per connection: {:.3} (server), {:.3} (client)",
        (server_t.wakeups() - wakes.0) as f64 / seconds / CONNECTIONS as f64,
        (client_t.wakeups() - wakes.1) as f64 / seconds / CONNECTIONS as f64,
    );

    // Every operation on every connection, 250 connections at a time.
    for (b, burst) in clients.chunks(BURST).enumerate() {
        every_operation_on(burst, b * BURST).await;
    }
    assert_eq!(count.current(), CONNECTIONS + 1, "no connection ended");

    // All dropped, then all reconnected at once: the staging receives the first ones
    // registered serve the new ones.
    drop(clients);
    assert_eq!(until_connections(&count, 1).await, 1);
    let (server_before, client_before) = (reading(&server_t), reading(&client_t));
    let clients = connect_many(&clients_t, &addr, CONNECTIONS).await;
    assert_eq!(
        until_connections(&count, CONNECTIONS + 1).await,
        CONNECTIONS + 1
    );
    let reconnect = (
        reading(&server_t).since(&server_before),
        reading(&client_t).since(&client_before),
    );
    println!(
        "{scheme}: {CONNECTIONS} reconnected at once: {} registrations on the server, {} on the \
         client",
        reconnect.0.registrations, reconnect.1.registrations
    );
    every_operation_on(&clients, 0).await;
    assert_eq!(count.current(), CONNECTIONS + 1, "no connection ended");

    let server_all = reading(&server_t).since(&server_before);
    let client_all = reading(&client_t).since(&client_before);
    for (side, all, idle) in [
        ("server", &server_all, &server_idle),
        ("client", &client_all, &client_idle),
    ] {
        println!(
            "{scheme}: {side}: {} RNR waits, {} RNR failures, {} doorbells for {} tasks",
            all.rnr_waits, all.rnr_failures, all.doorbells, all.task_submissions
        );
        assert_eq!(
            (idle.rnr_failures, all.rnr_failures),
            (0, 0),
            "{side}: a connection ran into receiver not ready"
        );
    }
    assert!(
        server_pinned <= 64.0 * 1024.0,
        "{server_pinned} bytes pinned per idle server connection (target 64 KiB)"
    );
    assert!(
        client_pinned <= 256.0 * 1024.0,
        "{client_pinned} bytes pinned per idle client connection (target 256 KiB)"
    );
    // The staging receives the first connections registered serve the new ones; a pool may
    // still grow once or twice under a burst four times larger than before, never per connect.
    for (side, cost) in [("server", &reconnect.0), ("client", &reconnect.1)] {
        assert!(
            cost.registrations <= 4,
            "{side}: {} registrations for {CONNECTIONS} reconnects",
            cost.registrations
        );
    }
}

/// A client whose connection queues calls behind a send queue of two: what each round of
/// completions frees is submitted together, with one doorbell.
async fn backlogs_drain_with_one_doorbell_per_round() {
    let server = Server::builder()
        .transport(Arc::new(transport("mlx5_0")))
        .add_service(Scale)
        .bind("doca://127.0.0.1:0")
        .await
        .expect("bind");
    let addr = server.local_addr();
    tokio::spawn(server.serve());
    let mut config = DocaConfig::default();
    config.device = Some("mlx5_1".into());
    config.send_queue_size = 2;
    let narrow = DocaTransport::new(config).expect("the provider's second device");
    let client = Client::builder()
        .transport(Arc::new(narrow.clone()))
        .connect(&addr)
        .await
        .expect("connect");
    every_operation(&client, 1).await;
    let before = narrow.counters().expect("the provider counts");
    every_operation_on(&vec![client; 256], 0).await;
    let cost = narrow
        .counters()
        .expect("the provider counts")
        .since(&before);
    println!(
        "send queue of 2, 1024 calls at once: {} doorbells for {} tasks",
        cost.doorbells, cost.task_submissions
    );
    assert!(
        cost.doorbells < cost.task_submissions,
        "a draining backlog rang once per task: {cost:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_holds_a_thousand_connections_over_cm_and_out_of_band() {
    thousand_connections("doca").await;
    thousand_connections("doca+oob").await;
    // Same devices, so after the others (the counters are per device).
    backlogs_drain_with_one_doorbell_per_round().await;
}
