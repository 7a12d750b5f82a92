//! What refused connections cost the server, counted by a global allocator. Its own test
//! binary with one test, so no other test's allocations are counted.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::{peak, reset_peak, serve_echo, ENDPOINTS};
use rdma_rpc_core::transport::tcp::TcpTransport;
use rdma_rpc_core::transport::Transport;
use rdma_rpc_core::{Client, Server};

/// Opens `n` transport connections to `addr` at once, none saying Hello; once `settled`
/// says the far end has done all it does with them, returns the peak of live memory above
/// what was live before, all of them open.
async fn peak_of_connections(
    transport: &Arc<TcpTransport>,
    addr: &str,
    n: usize,
    settled: impl std::future::Future<Output = ()>,
    refused: bool,
) -> isize {
    let before = reset_peak();
    let mut sockets = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (t, addr) = (transport.clone(), addr.to_owned());
        sockets.spawn(async move {
            let conn = t.connect(&addr).await.unwrap();
            if refused {
                // The server closes a refused connection once its Hello wait is over: by
                // then it has allocated all it ever does for it.
                let _ = conn.closed().await;
            }
            conn
        });
    }
    let mut open = Vec::new();
    while let Some(conn) = sockets.join_next().await {
        open.push(conn.unwrap());
    }
    settled.await;
    let peak = peak() - before;
    drop(open);
    peak
}

/// Connections over `max_connections` that never say Hello cost the server next to nothing
/// beyond the transport connection itself: measured against as many plain transport
/// connections to a listener that only holds them. Before the lean refusal each registered
/// the full receive pool, 1 MiB (+1.26 GB for 1,000 sockets then). All 60 are told why at
/// once (at most 64 are), so all are alive together in both measurements. The admitted client
/// is served all along.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_cost_next_to_nothing_beyond_the_transport() {
    const N: usize = 60;
    let transport = Arc::new(TcpTransport::new());

    // The control: plain transport connections, held by a bare listener.
    let listener = transport.listen("tcp://127.0.0.1:0").await.unwrap();
    let plain_addr = listener.local_addr();
    let mut held = tokio::spawn(async move {
        let mut held = Vec::new();
        while held.len() < N {
            held.push(listener.accept().await.unwrap());
        }
        held
    });
    let mut accepted = None;
    let all_accepted = async { accepted = Some((&mut held).await.unwrap()) };
    let plain = peak_of_connections(&transport, &plain_addr, N, all_accepted, false).await;
    drop(accepted);

    let builder = Server::builder()
        .max_connections(1)
        .transport(transport.clone());
    let (addr, count) = serve_echo(builder, "tcp://127.0.0.1:0").await;
    let admitted = Client::builder()
        .transport(transport.clone())
        .connect(&addr)
        .await
        .unwrap();
    let call = || {
        admitted.call_raw(
            &ENDPOINTS[0],
            Bytes::new(),
            Some(Bytes::from_static(b"hi")),
            None,
        )
    };
    call().await.unwrap();
    let refused = peak_of_connections(&transport, &addr, N, async {}, true).await;
    call()
        .await
        .expect("the admitted client is served during the flood");
    assert_eq!(count.current(), 1, "refused connections are never counted");
    let extra = (refused - plain) / N as isize;
    println!(
        "{N} connections: plain {} KiB each, refused {} KiB each (both ends), {} KiB more",
        plain / N as isize / 1024,
        refused / N as isize / 1024,
        extra / 1024
    );
    assert!(
        extra < 64 << 10,
        "a refused connection cost {extra} bytes more than a plain one"
    );
}
