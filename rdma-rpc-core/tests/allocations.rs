//! Allocations per call on the hot path: 64-byte sends over `mem://`, server and client on one
//! thread, counted by a global allocator (both ends, the test's own call included). A figure
//! printed for the record and bounded so that a change that adds allocations per call shows.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::{allocations, serve_echo, ENDPOINTS};
use rdma_rpc_core::transport::mem::MemTransport;
use rdma_rpc_core::{Client, Server};

/// 5 per call today, both ends together: a mailbox per call on each side, and three in the
/// echo handler itself (its boxed future, its reply, and the reply's shared header when the
/// frame is encoded). No frame allocates: frames are encoded into shared blocks, and received
/// frames are copied into shared blocks that their decoded path, metadata and payload slice.
/// 22 before calls ran to completion on the connection's task with mailboxes instead of
/// channels and frames were encoded into shared blocks; 13 before receives were polled in
/// place and a call's state reused its predecessor's box; 8 before received frames were
/// decoded from shared blocks (the path and both payloads were copied out, one allocation
/// each). The bound leaves room for one more per call, not for one more per frame.
const BOUND: f64 = 6.0;

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
