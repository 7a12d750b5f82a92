//! rdma-rpc's side of the measurements: the benchmark's server, one call of each operation,
//! what calls register and import, 4 MiB calls from one region or in flight, and rdma-rpc
//! over `tls://` next to `tcp://`.

use std::sync::Arc;

use bytes::Bytes;
use rdma_rpc_core::transport::doca::DocaTransport;
use rdma_rpc_core::transport::Transport;
use rdma_rpc_core::{Client, Server};
use tokio::runtime::Handle;
use tokio::task::JoinHandle;

use super::measure::{latency, throughput, BenchError, Throughput};
use super::report::{RegistrationCost, TlsFigures, TransportFigures};
use super::run::{calls, Settings, POOL_BUDGET};
use super::service::{BenchClient, BenchServer, Len, Sink};
use super::streams::StreamSink;

/// Registrations and imports per call of `calls` calls of `f`, if the transport counts them.
pub(super) async fn registration_cost<F, Fut>(
    doca: Option<&DocaTransport>,
    calls: usize,
    mut f: F,
) -> Result<Option<RegistrationCost>, BenchError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), BenchError>>,
{
    let Some(before) = doca.and_then(DocaTransport::counters) else {
        return Ok(None);
    };
    for _ in 0..calls {
        f().await?;
    }
    let after = doca.and_then(DocaTransport::counters).unwrap_or(before);
    let d = after.since(&before);
    Ok(Some(RegistrationCost {
        calls: calls as u64,
        registrations_per_call: d.registrations as f64 / calls as f64,
        imports_per_call: d.imports as f64 / calls as f64,
    }))
}

/// One call of `op` with `data`.
pub(super) async fn call(client: &BenchClient, op: &str, data: &Bytes) -> Result<(), BenchError> {
    match op {
        "send" => send(client, data).await,
        "write" => write(client, data).await,
        "receive" => receive(client, data).await,
        _ => read(client, data).await,
    }
}

/// Calls/s of `calls` calls of `op` with `data`, `workers` at a time, worker `w` calling on
/// `client(w)`. The operation is picked once per run, so that each worker's loop makes that
/// operation's call and nothing else, as a service's code does: no match on its name per call,
/// and no call future as large as the largest operation's.
pub(super) async fn op_throughput(
    op: &str,
    calls: usize,
    data: &Bytes,
    workers: usize,
    client: impl Fn(usize) -> BenchClient,
) -> Result<Throughput, BenchError> {
    // One loop per operation (a closure type each), calling it with the worker's client.
    macro_rules! each {
        ($one:ident) => {
            throughput(calls, data.len(), workers, |w| {
                let (client, data) = (client(w), data.clone());
                move || {
                    let (client, data) = (client.clone(), data.clone());
                    async move { $one(&client, &data).await }
                }
            })
            .await
        };
    }
    match op {
        "send" => each!(send),
        "write" => each!(write),
        "receive" => each!(receive),
        _ => each!(read),
    }
}

async fn send(client: &BenchClient, data: &Bytes) -> Result<(), BenchError> {
    let got = client.send_bytes(len_of(data), data.clone()).await?.len;
    check("send", got, data.len())
}

async fn write(client: &BenchClient, data: &Bytes) -> Result<(), BenchError> {
    let got = client.write_bytes(len_of(data), data.clone()).await?.len;
    check("write", got, data.len())
}

async fn receive(client: &BenchClient, data: &Bytes) -> Result<(), BenchError> {
    let got = client.receive_bytes(len_of(data)).await?.1.len();
    check("receive", got as u64, data.len())
}

async fn read(client: &BenchClient, data: &Bytes) -> Result<(), BenchError> {
    let got = client.read_bytes(len_of(data)).await?.1.len();
    check("read", got as u64, data.len())
}

fn len_of(data: &Bytes) -> Len {
    Len {
        len: data.len() as u64,
    }
}

/// An error unless the call moved the `want` bytes it was given or asked for.
fn check(op: &str, got: u64, want: usize) -> Result<(), BenchError> {
    if got != want as u64 {
        return Err(format!("{op}: {got} bytes instead of {want}").into());
    }
    Ok(())
}

/// GB/s of `object` bytes written as 4 MiB write calls, `depth` in flight, each from its own
/// 4 MiB part of one region of `object` bytes, sent in place: the unary way to move what a
/// stream moves, with a source as large as the stream's.
pub(super) async fn calls_over_object(
    client: &BenchClient,
    object: usize,
    depth: usize,
) -> Result<f64, BenchError> {
    const PART: usize = 4 << 20;
    let parts = (object / PART).max(1);
    let region = rdma_rpc_core::MemoryRegion::new(parts * PART)?;
    region
        .lease(0, parts * PART)?
        .fill_from(&vec![0x5a; parts * PART])?;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t = throughput(parts, PART, depth, |_| {
        let (client, region, next) = (client.clone(), region.clone(), next.clone());
        move || {
            let (client, region, next) = (client.clone(), region.clone(), next.clone());
            async move {
                let part = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % parts;
                let data = region.lease(part * PART, PART)?.freeze();
                call(&client, "write", &data).await
            }
        }
    })
    .await?;
    Ok(t.gb_per_s)
}

/// Starts the benchmark's server on the serving runtime, listening on `addr` (over
/// `transport`, or the one the address names): the address it is bound to, and its task.
pub(super) async fn start_server(
    server: &Handle,
    addr: &str,
    transport: Option<Arc<dyn Transport>>,
) -> Result<(String, JoinHandle<()>), BenchError> {
    let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
    let addr = addr.to_owned();
    let serving = server.spawn(async move {
        let mut builder = Server::builder()
            .pool_budget(POOL_BUDGET)
            .max_in_flight(256)
            .add_service(BenchServer::new(Sink))
            .add_service(StreamSink);
        if let Some(t) = transport {
            builder = builder.transport(t);
        }
        match builder.bind(&addr).await {
            Ok(bound) => {
                let _ = addr_tx.send(Ok(bound.local_addr()));
                if let Err(e) = bound.serve().await {
                    eprintln!("bench server stopped: {e}");
                }
            }
            Err(e) => {
                let _ = addr_tx.send(Err(e));
            }
        }
    });
    let bound = addr_rx.await??;
    Ok((bound, serving))
}

/// A client of `addr`, over `transport` or the one the address names.
pub(super) fn client_builder(
    transport: &Option<Arc<dyn Transport>>,
) -> rdma_rpc_core::ClientBuilder {
    let builder = Client::builder();
    match transport {
        Some(t) => builder.transport(t.clone()),
        None => builder,
    }
}

/// rdma-rpc over `tls://` (demo certificates made now, client certificates required) next
/// to `tcp://`: 64 B send latency and 4 MiB write and read throughput, each on a server of its
/// own, measured the same way one after the other.
pub(super) async fn tls_vs_tcp(o: &Settings, server: &Handle) -> Result<TlsFigures, BenchError> {
    let certs = crate::tls::DemoCerts::generate()?;
    let tls: Arc<dyn Transport> = Arc::new(certs.transport()?);
    let mut figures = Vec::new();
    for (addr, transport) in [
        ("tcp://127.0.0.1:0", None),
        ("tls://127.0.0.1:0", Some(tls)),
    ] {
        let (addr, serving) = start_server(server, addr, transport.clone()).await?;
        let client = BenchClient::new(client_builder(&transport).connect(&addr).await?);
        let small = Bytes::from(vec![0x5a; 64]);
        let send_64b = latency(calls(64, o.quick).0, || call(&client, "send", &small)).await?;
        let write_4mib = bulk_4mib(&client, "write", o).await?;
        let read_4mib = bulk_4mib(&client, "read", o).await?;
        serving.abort();
        figures.push(TransportFigures {
            send_64b,
            write_4mib,
            read_4mib,
        });
    }
    Ok(TlsFigures {
        tcp: figures[0],
        tls: figures[1],
    })
}

/// 4 MiB `op` calls, `--depth` in flight on one connection.
async fn bulk_4mib(
    client: &BenchClient,
    op: &'static str,
    o: &Settings,
) -> Result<super::measure::Throughput, BenchError> {
    let big = Bytes::from(vec![0x5a; 4 << 20]);
    op_throughput(op, calls(big.len(), o.quick).1, &big, o.depth, |_| {
        client.clone()
    })
    .await
}
