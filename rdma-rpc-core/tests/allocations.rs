//! Allocations per call on the hot path: 64-byte sends over `mem://`, server and client on one
//! thread, counted by a global allocator (both ends, the test's own call included). A figure
//! printed for the record and bounded so that a change that adds allocations per call shows.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::{allocations, serve_echo, ENDPOINTS};
use rdma_rpc_core::transport::mem::MemTransport;
use rdma_rpc_core::{CallOptions, Client, Server};

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

/// Allocations per 64 B send over `mem://`, both ends, with or without one metadata entry per
/// call (a key known at build time, a shared value: what an interceptor that sets a token on
/// every call does).
fn per_call(with_metadata: bool) -> f64 {
    // The count is the process's: one measure at a time.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let transport = Arc::new(MemTransport::new());
        let builder = Server::builder().transport(transport.clone());
        let (addr, _) = serve_echo(builder, "mem://").await;
        let client = Client::builder()
            .transport(transport)
            .connect(&addr)
            .await
            .unwrap();
        let payload = Bytes::from(vec![7u8; 64]);
        let token = Bytes::from_static(b"0123456789abcdef");
        let call = || {
            let mut options = CallOptions::default();
            if with_metadata {
                options.metadata.insert_static("x-token", token.clone());
            }
            client.call_raw(&ENDPOINTS[0], Bytes::new(), Some(payload.clone()), options)
        };
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
    })
}

#[test]
fn a_small_call_allocates_little() {
    let per_call = per_call(false);
    println!("a 64 B send over mem://: {per_call:.1} allocations per call, both ends");
    assert!(
        per_call <= BOUND,
        "{per_call:.1} allocations per call (bound {BOUND})"
    );
}

/// A call's metadata travels as it was made: moved into the request, received as slices of
/// the frame, handed to the server's interceptors and handler as it came. The two allocations
/// it adds are the lists of entries, the caller's and the one the server decodes into. 7 more
/// per call before (keys copied into and out of frames as strings, lists rebuilt on both
/// ends), and 4 with a key given as a `String` now.
#[test]
fn metadata_adds_only_its_lists_of_entries() {
    let (without, with) = (per_call(false), per_call(true));
    println!("with one metadata entry: {with:.1} allocations per call (without: {without:.1})");
    assert!(
        with - without <= 2.1,
        "one metadata entry costs {:.1} allocations per call",
        with - without
    );
}
