//! Every operation end to end, byte-exact, and many connections at once.

use std::time::Duration;

use bytes::Bytes;

use super::service::{TestRequest, TestResponse, ENDPOINTS};
use super::{bounded, pattern, tcp_backend, Backend, Harness};
use crate::codegen::{call_inbound, call_outbound};
use crate::{Client, Code, Request, Status};

pub(crate) const SIZES: &[usize] = &[
    0,
    1,
    100,
    4096,
    8 * 1024 - 1,
    8 * 1024,
    8 * 1024 + 1,
    65_536,
    1 << 20,
    16 << 20,
];

pub(crate) const BLOB_WRITE: usize = 0;
pub(crate) const BLOB_READ: usize = 1;
pub(crate) const MSG_SEND: usize = 2;
pub(crate) const MSG_RECEIVE: usize = 3;

pub(crate) fn req(len: usize, seed: u32) -> TestRequest {
    TestRequest {
        len: len as u64,
        seed,
        ..TestRequest::default()
    }
}

pub(crate) async fn inbound(
    client: &Client,
    ep: usize,
    len: usize,
    seed: u32,
) -> Result<TestResponse, Status> {
    let data = Bytes::from(pattern(len, seed));
    call_inbound(client, &ENDPOINTS[ep], Request::new(req(len, seed)), data).await
}

pub(crate) async fn outbound(
    client: &Client,
    ep: usize,
    len: usize,
    seed: u32,
) -> Result<Bytes, Status> {
    let (resp, data): (TestResponse, Bytes) =
        call_outbound(client, &ENDPOINTS[ep], Request::new(req(len, seed))).await?;
    assert_eq!(resp.len, len as u64);
    Ok(data)
}

/// Runs every operation at every size and checks every byte.
pub(crate) async fn all_operations_all_sizes(h: &Harness) {
    let client = h.client().await;
    for (i, &len) in SIZES.iter().enumerate() {
        let seed = i as u32 + 1;
        for ep in [BLOB_WRITE, MSG_SEND] {
            let resp = inbound(&client, ep, len, seed).await.unwrap();
            assert_eq!(
                resp.len, len as u64,
                "{} of {len} bytes",
                ENDPOINTS[ep].method
            );
            assert!(
                resp.exact,
                "{} of {len} bytes arrived altered",
                ENDPOINTS[ep].method
            );
        }
        for ep in [BLOB_READ, MSG_RECEIVE] {
            let data = outbound(&client, ep, len, seed).await.unwrap();
            assert!(
                data[..] == pattern(len, seed)[..],
                "{} of {len} bytes arrived altered",
                ENDPOINTS[ep].method
            );
        }
    }
}

/// 64 connections, each running a mix of operations concurrently.
pub(crate) async fn many_connections_mixed(h: &Harness) {
    let mut tasks = Vec::new();
    for c in 0..64u32 {
        let client = h.client().await;
        tasks.push(tokio::spawn(async move {
            let mut calls = Vec::new();
            for k in 0..6u32 {
                let client = client.clone();
                let seed = c * 100 + k;
                let len = [0, 100, 5000, 9000, 70_000, 300_000][k as usize];
                calls.push(tokio::spawn(async move {
                    match k % 4 {
                        0 => assert!(inbound(&client, BLOB_WRITE, len, seed).await.unwrap().exact),
                        1 => assert!(inbound(&client, MSG_SEND, len, seed).await.unwrap().exact),
                        2 => assert_eq!(
                            outbound(&client, BLOB_READ, len, seed).await.unwrap(),
                            pattern(len, seed)
                        ),
                        _ => assert_eq!(
                            outbound(&client, MSG_RECEIVE, len, seed).await.unwrap(),
                            pattern(len, seed)
                        ),
                    }
                }));
            }
            for call in calls {
                call.await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_all_operations_all_sizes_byte_exact() {
    let h = Harness::tcp_default().await;
    bounded("all operations", all_operations_all_sizes(&h)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_64_connections_mixed_operations() {
    let h = Harness::tcp_default().await;
    bounded("64 connections", many_connections_mixed(&h)).await;
}

pub(crate) async fn many_calls_in_flight_on_one_connection_complete_out_of_order_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    let client = h.client().await;
    // A held call first, then fast ones: the fast ones finish while the held one waits for
    // the gate, which opens only after them.
    let held = h
        .service
        .inbound_runs
        .load(std::sync::atomic::Ordering::SeqCst);
    let slow = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut r = req(10, 1);
            r.gated = true;
            call_inbound::<_, TestResponse>(
                &client,
                &ENDPOINTS[MSG_SEND],
                Request::new(r),
                Bytes::from(pattern(10, 1)),
            )
            .await
        })
    };
    for i in 0..20 {
        assert!(inbound(&client, MSG_SEND, 100, i).await.unwrap().exact);
    }
    assert!(!slow.is_finished(), "the held call is still in flight");
    assert!(
        h.service
            .inbound_runs
            .load(std::sync::atomic::Ordering::SeqCst)
            >= held + 20
    );
    h.service.open_gate();
    assert!(slow.await.unwrap().unwrap().exact);
}

#[tokio::test]
async fn many_calls_in_flight_on_one_connection_complete_out_of_order() {
    many_calls_in_flight_on_one_connection_complete_out_of_order_on(&tcp_backend()).await;
}

/// A handler that outlives its call's deadline (it waits for a gate nobody opens): the call
/// ends with `DEADLINE_EXCEEDED`, and the connection goes on.
pub(crate) async fn deadlines_end_calls_with_deadline_exceeded_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    let client = h.client().await;
    let mut r = req(10, 1);
    r.gated = true;
    let call = call_inbound::<_, TestResponse>(
        &client,
        &ENDPOINTS[MSG_SEND],
        Request::new(r).with_timeout(Duration::from_millis(50)),
        Bytes::from(pattern(10, 1)),
    );
    let err = bounded("a call past its deadline", call).await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    // The connection is still fine.
    assert!(inbound(&client, MSG_SEND, 10, 2).await.unwrap().exact);
}

#[tokio::test]
async fn deadlines_end_calls_with_deadline_exceeded() {
    deadlines_end_calls_with_deadline_exceeded_on(&tcp_backend()).await;
}

pub(crate) async fn graceful_shutdown_drains_calls_in_flight_on(b: &Backend) {
    let mut h = Harness::default_on(b).await;
    let client = h.client().await;
    let mut r = req(50_000, 3);
    r.gated = true;
    let call = {
        let client = client.clone();
        tokio::spawn(async move {
            call_inbound::<_, TestResponse>(
                &client,
                &ENDPOINTS[BLOB_WRITE],
                Request::new(r),
                Bytes::from(pattern(50_000, 3)),
            )
            .await
        })
    };
    // The call is in its handler when the shutdown starts, and finishes after it.
    h.service.entered(1).await;
    h.shutdown();
    h.service.open_gate();
    let resp = bounded("drained call", call).await.unwrap().unwrap();
    assert!(resp.exact, "the call in flight completed");
    bounded("server exit", &mut h.task).await.unwrap().unwrap();
    // New calls are refused once the server is gone.
    let err = inbound(&client, MSG_SEND, 1, 1).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
}

#[tokio::test]
async fn graceful_shutdown_drains_calls_in_flight() {
    graceful_shutdown_drains_calls_in_flight_on(&tcp_backend()).await;
}
