//! The demo: a server and a client over the software transport in one process. Runs every
//! endpoint type of the doca-cpp example spec with byte-for-byte verification and prints a
//! table of sizes, round trips, latencies and throughput.
//!
//! `cargo run --release -p examples --bin demo`

use std::process::ExitCode;

use bytes::Bytes;
use examples::buffers::PathBuffers;
use examples::generated::doca_cpp::{DocaCppEndpointsClient, DocaCppEndpointsServer};
use examples::report::{print_table, size, Row, Samples};
use rdma_rpc_core::{Client, Server, Status};

/// Deterministic bytes for a size, different per size.
fn pattern(len: usize, seed: u64) -> Bytes {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    Bytes::from(
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect::<Vec<u8>>(),
    )
}

fn calls_for(len: usize) -> usize {
    match len {
        0..=4096 => 2000,
        4097..=65_536 => 500,
        65_537..=1_048_576 => 100,
        _ => 30,
    }
}

fn verify(what: &str, len: usize, got: &[u8], want: &[u8]) -> Result<(), String> {
    if got == want {
        return Ok(());
    }
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    Err(format!(
        "{what} of {}: {} bytes back, {} expected, first difference at {first:?}",
        size(len),
        got.len(),
        want.len()
    ))
}

async fn run(client: &DocaCppEndpointsClient) -> Result<Vec<Row>, Box<dyn std::error::Error>> {
    let raw: &Client = client.inner();
    let mut rows = Vec::new();
    let mut row = |operation: &str, len: usize, samples: Samples, rts: f64| {
        rows.push(Row {
            operation: operation.into(),
            size: len,
            calls: samples.count(),
            round_trips: rts,
            p50: samples.quantile(0.5),
            p99: samples.quantile(0.99),
            mb_per_s: samples.mb_per_s(len),
        });
    };

    for len in [64, 4096] {
        let data = pattern(len, len as u64);
        let (mut send, before) = (Samples::default(), raw.stats());
        for _ in 0..calls_for(len) {
            send.time(client.rdma_ep0_send((), data.clone())).await?;
        }
        let rts = raw.stats().round_trips_since(&before);
        row("send    /rdma/ep0", len, send, rts);
        let (mut receive, before) = (Samples::default(), raw.stats());
        for _ in 0..calls_for(len) {
            let ((), got) = receive.time(client.rdma_ep0_receive(())).await?;
            verify("receive", len, &got, &data)?;
        }
        let rts = raw.stats().round_trips_since(&before);
        row("receive /rdma/ep0", len, receive, rts);
    }
    for len in [64, 65_536, 1 << 20, 4 << 20] {
        let data = pattern(len, len as u64 + 1);
        let (mut write, before) = (Samples::default(), raw.stats());
        for _ in 0..calls_for(len) {
            write.time(client.rdma_ep1_write((), data.clone())).await?;
        }
        let rts = raw.stats().round_trips_since(&before);
        row("write   /rdma/ep1", len, write, rts);
        let (mut read, before) = (Samples::default(), raw.stats());
        for _ in 0..calls_for(len) {
            let ((), got) = read.time(client.rdma_ep1_read(())).await?;
            verify("read", len, &got, &data)?;
        }
        let rts = raw.stats().round_trips_since(&before);
        row("read    /rdma/ep1", len, read, rts);
    }
    // Bad input gets a clear status, and the connection goes on.
    let too_big = pattern(4097, 1);
    match client.rdma_ep0_send((), too_big).await {
        Err(status) => println!("oversized send refused as expected: {status}"),
        Ok(()) => return Err("an oversized send was accepted".into()),
    }
    Ok(rows)
}

#[tokio::main]
async fn main() -> ExitCode {
    examples::logging::init();
    let server = match Server::builder()
        .add_service(DocaCppEndpointsServer::new(PathBuffers::default()))
        .bind("tcp://127.0.0.1:0")
        .await
    {
        Ok(server) => server,
        Err(e) => {
            eprintln!("demo: cannot start the server: {e}");
            return ExitCode::FAILURE;
        }
    };
    let addr = server.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve_with_shutdown(async {
        let _ = stopped.await;
    }));
    println!("rdma-rpc demo: doca-cpp endpoints over the software transport at {addr}\n");

    let result = match DocaCppEndpointsClient::connect(&addr).await {
        Ok(client) => run(&client).await,
        Err(e) => Err(e.into()),
    };
    let _ = stop.send(());
    let _ = serving.await;
    match result {
        Ok(rows) => {
            println!();
            print_table(&rows);
            println!("\nevery transfer verified byte for byte");
            ExitCode::SUCCESS
        }
        Err(e) => {
            let e: Box<dyn std::error::Error> = e;
            if let Some(status) = e.downcast_ref::<Status>() {
                eprintln!("demo failed: {status}");
            } else {
                eprintln!("demo failed: {e}");
            }
            ExitCode::FAILURE
        }
    }
}
