//! Busy-poll progress: every context of one DOCA transport (a listener and its accepted
//! connections, and every client connection made through it) shares one polling thread, and
//! the thread ends once the transport and its contexts are gone. A test binary of its own: it
//! counts the process's threads by name.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Echo, ENDPOINTS};
use rdma_rpc_core::transport::doca::{DocaConfig, DocaTransport, ProgressMode};
use rdma_rpc_core::transport::Transport;
use rdma_rpc_core::{Client, Server};

/// Threads of this process with this name (Linux: `/proc/self/task/*/comm`).
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

/// Waits (at most 30 s) until `count` threads have this name: a new thread names itself once
/// it runs, and an ending one disappears once it has returned.
async fn until_threads_named(name: &str, count: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = threads_named(name);
        if now == count || Instant::now() > deadline {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_polling_thread_serves_every_context_of_a_transport() {
    assert_eq!(threads_named("doca-progress"), 0);
    let config = DocaConfig::from_env().with_progress(ProgressMode::BusyPoll);
    let transport: Arc<dyn Transport> = Arc::new(DocaTransport::new(config).expect("device"));
    assert_eq!(until_threads_named("doca-progress", 1).await, 1);

    let server = Server::builder()
        .transport(transport.clone())
        .add_service(Echo)
        .bind("doca://127.0.0.1:0")
        .await
        .expect("bind");
    let (addr, count) = (server.local_addr(), server.connection_count());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve_with_shutdown(async {
        let _ = stopped.await;
    }));
    let mut clients = Vec::new();
    for _ in 0..8 {
        let client = Client::builder()
            .transport(transport.clone())
            .connect(&addr)
            .await
            .expect("connect");
        let answer = client
            .call_raw(
                &ENDPOINTS[0],
                Bytes::new(),
                Some(Bytes::from(vec![7; 100])),
                None,
            )
            .await
            .expect("served");
        assert_eq!(&answer.0[..], b"100");
        clients.push(client);
    }
    assert_eq!(count.current(), 8);
    // Two contexts (the listener, and the client context its eight connections share), one
    // thread.
    assert_eq!(threads_named("doca-progress"), 1);

    // Calls on all connections at once, all progressed by that thread.
    let calls: Vec<_> = clients
        .iter()
        .map(|c| {
            let c = c.clone();
            tokio::spawn(async move {
                let data = Some(Bytes::from(vec![1; 3000]));
                c.call_raw(&ENDPOINTS[0], Bytes::new(), data, None).await
            })
        })
        .collect();
    for call in calls {
        assert_eq!(&call.await.unwrap().expect("served").0[..], b"3000");
    }

    // Without the transport and its contexts, the thread ends (it stops idle contexts on
    // threads of their own and exits when nothing is left).
    for client in clients {
        client.close();
    }
    drop(transport);
    // The server still serves: its listener keeps the thread.
    assert_eq!(threads_named("doca-progress"), 1);
    let _ = stop.send(());
    serving.await.unwrap().expect("served until stopped");
    drop(count);
    assert_eq!(
        until_threads_named("doca-progress", 0).await,
        0,
        "the polling thread outlived its transport and contexts"
    );
}
