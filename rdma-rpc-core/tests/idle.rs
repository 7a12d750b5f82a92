//! What an idle connection costs: 1,000 handshaken connections that make no call, over
//! `mem://` and over TCP, counted by a global allocator. Both ends live in this process, so the
//! clients are lean (four 1 KiB receives) and their own state is counted too: the figure is
//! an upper bound of what each connection costs the server (issue 11: at most 256 KiB).

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::{live, serve_echo, ENDPOINTS};
use rdma_rpc_core::transport::mem::MemTransport;
use rdma_rpc_core::transport::tcp::TcpTransport;
use rdma_rpc_core::transport::Transport;
use rdma_rpc_core::{Client, ClientConfig, Server};

const N: usize = 1000;
const BUDGET: isize = 256 << 10;

async fn lean_client(transport: &Arc<dyn Transport>, addr: &str) -> Client {
    let mut config = ClientConfig::default();
    config.max_frame = 1024;
    config.recv_credits = 4;
    Client::builder()
        .config(config)
        .transport(transport.clone())
        .connect(addr)
        .await
        .expect("connect")
}

/// Bytes each of `N` idle connections keeps live, server and lean client together.
async fn per_idle_connection(transport: Arc<dyn Transport>, addr: &str) -> isize {
    let builder = Server::builder()
        .transport(transport.clone())
        .max_connections(N + 1)
        .max_connections_per_peer(N + 1);
    let (addr, count) = serve_echo(builder, addr).await;
    let call = |client: Client| async move {
        client
            .call_raw(
                &ENDPOINTS[0],
                Bytes::new(),
                Some(Bytes::from_static(b"hi")),
                None,
            )
            .await
            .expect("served")
    };
    // A first connection and call: what is created once per process or server (runtime
    // state, transport threads, pools) is not counted against the idle ones.
    let first = lean_client(&transport, &addr).await;
    call(first.clone()).await;

    let before = live();
    let mut idle = Vec::with_capacity(N);
    for _ in 0..N {
        idle.push(lean_client(&transport, &addr).await);
    }
    // Each `connect` returned after the server's HelloAck, which the server sends once it
    // has set the connection up; all of them are counted by then.
    assert_eq!(count.current(), N + 1);
    let after = live();
    call(first).await;
    drop(idle);
    (after - before) / N as isize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_costs_at_most_256_kib() {
    let mem = per_idle_connection(Arc::new(MemTransport::new()), "mem://").await;
    let tcp = per_idle_connection(Arc::new(TcpTransport::new()), "tcp://127.0.0.1:0").await;
    println!(
        "{N} idle connections: {} KiB each over mem://, {} KiB each over TCP (server and a \
         lean client together)",
        mem / 1024,
        tcp / 1024
    );
    for (what, bytes) in [("mem://", mem), ("TCP", tcp)] {
        assert!(
            bytes <= BUDGET,
            "an idle connection over {what} keeps {bytes} bytes (budget {BUDGET})"
        );
    }
}
