//! Allocations per call on the hot path: 64-byte sends over `mem://`, server and client on one
//! thread, counted by a global allocator (both ends, the test's own call included). A figure
//! printed for the record and bounded so that a change that adds allocations per call shows.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::{allocations, serve_echo, ENDPOINTS};
use rdma_rpc_core::transport::mem::MemTransport;
use rdma_rpc_core::{Client, Server};

/// 3 per call today, both ends together: the server's mailbox for the call, and two in the
/// echo handler itself (its boxed future and its reply's string). The client allocates nothing
/// per call: the call's state lives in its connection's call table, and the call reads its own
/// response where it lands. No frame allocates: frames are encoded into shared blocks, and
/// received frames are decoded in place from the receive buffer (the path and payloads slice
/// a shared block). 22 before calls ran to completion on the connection's task with mailboxes
/// instead of channels and frames were encoded into shared blocks; 13 before receives were
/// polled in place and a call's state reused its predecessor's box; 8 before received frames
/// were decoded from shared blocks; 5 before the client's calls moved into the connection's
/// state (issue 29: no mailbox on the client, no driver hop). The bound leaves room for one
/// more per call, not for one more per frame.
const BOUND: f64 = 4.0;

#[test]
fn a_small_call_allocates_little() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let per_call = rt.block_on(async {
        let transport = Arc::new(MemTransport::new());
        let builder = Server::builder().transport(transport.clone());
        let (addr, _) = serve_echo(builder, "mem://").await;
        let client = Client::builder()
            .transport(transport)
            .connect(&addr)
            .await
            .unwrap();
        let payload = Bytes::from(vec![7u8; 64]);
        let call = || client.call_raw(&ENDPOINTS[0], Bytes::new(), Some(payload.clone()), None);
        // Warm: receives grown, maps sized, first-use state created.
        for _ in 0..200 {
            call().await.unwrap();
        }
        const N: isize = 2000;
        let before = allocations();
        for _ in 0..N {
            call().await.unwrap();
        }
        (allocations() - before) as f64 / N as f64
    });
    println!("a 64 B send over mem://: {per_call:.1} allocations per call, both ends");
    assert!(
        per_call <= BOUND,
        "{per_call:.1} allocations per call (bound {BOUND})"
    );
}
