//! Calls that end: a call the client cancels, whose deadline passes (the client's, or the
//! server's cap on every call), or whose connection ends has its handler stopped (its future
//! dropped, as tonic does), frees what it held, and is answered with why; work the handler
//! spawned hears of it. A response message's limit is known to the handler before it acts.
//! Sequenced by the test service's gate and counters, never by sleeps.

use std::time::Duration;

use bytes::Bytes;

use super::e2e::{req, MSG_RECEIVE, MSG_SEND};
use super::service::{TestRequest, TestResponse, ENDPOINTS, TINY_RECEIVE};
use super::{bounded, Backend, Harness};
use crate::client::CallOptions;
use crate::codegen::encode_message;
use crate::status::{Code, Status};
use crate::{Client, ServerConfig};

/// Buffers of `path`'s pool in use now.
fn in_use(h: &Harness, path: &str) -> usize {
    h.handle
        .pools()
        .into_iter()
        .find(|p| p.path == path)
        .map_or(0, |p| p.in_use)
}

/// Waits (bounded) until `path`'s pool has every buffer back: the call's task drops the
/// handler and then what the call held, which another task may see in between.
async fn until_free(h: &Harness, path: &str) {
    bounded("every buffer back", async {
        while in_use(h, path) > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// A gated call of `ep` whose handler also spawns a task that waits for the call's end, made
/// on a task of its own (so that the test can drop it), with `timeout`.
fn gated_call(
    client: &Client,
    ep: usize,
    timeout: Option<Duration>,
) -> tokio::task::JoinHandle<Result<(Bytes, Bytes), Status>> {
    let request = TestRequest {
        gated: true,
        watch_cancel: true,
        ..req(1000, 1)
    };
    let client = client.clone();
    tokio::spawn(async move {
        let options = CallOptions {
            timeout,
            ..CallOptions::default()
        };
        let data = ENDPOINTS[ep]
            .op
            .is_inbound()
            .then(|| Bytes::from(vec![1u8; 1000]));
        client
            .call_raw(&ENDPOINTS[ep], encode_message(&request), data, options)
            .await
    })
}

/// The connection serves on after a stopped call.
async fn serves_on(client: &Client) {
    let (got, _) = client
        .call_raw(
            &ENDPOINTS[MSG_SEND],
            encode_message(&req(10, 2)),
            Some(Bytes::from(super::pattern(10, 2))),
            None,
        )
        .await
        .expect("the connection serves on");
    let got: TestResponse = prost::Message::decode(got).unwrap();
    assert!(got.exact);
}

pub(crate) async fn a_cancelled_call_stops_its_handler_and_frees_its_buffer_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    let client = h.client().await;
    let call = gated_call(&client, MSG_RECEIVE, None);
    bounded("the handler runs", h.service.entered(1)).await;
    assert_eq!(in_use(&h, "/msg"), 1, "the handler holds a pool buffer");
    // The caller gives up: its call is dropped, and the client tells the server.
    call.abort();
    bounded("the handler is stopped", h.service.dropped(1)).await;
    bounded("spawned work hears of it", h.service.saw_cancel(1)).await;
    until_free(&h, "/msg").await;
    serves_on(&client).await;
    assert_eq!(*h.service.dropped.borrow(), 1, "only the cancelled call");
}

pub(crate) async fn a_passed_deadline_stops_the_handler_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    let client = h.client().await;
    let call = gated_call(&client, MSG_SEND, Some(Duration::from_millis(300)));
    bounded("the handler runs", h.service.entered(1)).await;
    let status = bounded("the call ends", call).await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status}");
    bounded("the handler is stopped", h.service.dropped(1)).await;
    bounded("spawned work hears of it", h.service.saw_cancel(1)).await;
    until_free(&h, "/msg").await;
    serves_on(&client).await;
}

pub(crate) async fn the_server_bounds_calls_that_carry_no_deadline_on(b: &Backend) {
    let config = ServerConfig {
        max_call_duration: Some(Duration::from_millis(300)),
        ..ServerConfig::default()
    };
    let h = Harness::start_on(b, config).await;
    let client = h.client().await;
    // No deadline from the client, none from the endpoint: the server's cap holds.
    let call = gated_call(&client, MSG_RECEIVE, None);
    let status = bounded("the call ends", call).await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status}");
    assert!(status.message().contains("max_call_duration"), "{status}");
    assert!(status.message().contains("receive /msg"), "{status}");
    bounded("the handler is stopped", h.service.dropped(1)).await;
    bounded("spawned work hears of it", h.service.saw_cancel(1)).await;
    until_free(&h, "/msg").await;
    serves_on(&client).await;
}

pub(crate) async fn a_connection_that_ends_stops_its_handlers_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    let client = h.client().await;
    let calls: Vec<_> = (0..3)
        .map(|i| gated_call(&client, if i == 0 { MSG_SEND } else { MSG_RECEIVE }, None))
        .collect();
    bounded("the handlers run", h.service.entered(3)).await;
    client.close();
    bounded("every handler is stopped", h.service.dropped(3)).await;
    bounded("spawned work hears of it", h.service.saw_cancel(3)).await;
    for call in calls {
        let status = bounded("the call ends", call).await.unwrap().unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{status}");
    }
    until_free(&h, "/msg").await;
}

pub(crate) async fn a_response_over_its_limit_is_known_before_and_refused_after_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    let client = h.client().await;
    let padded = |ep: usize, pad: u64| {
        let client = client.clone();
        async move {
            let request = TestRequest {
                pad_response: pad,
                ..req(10, 1)
            };
            client
                .call_raw(&ENDPOINTS[ep], encode_message(&request), None, None)
                .await
        }
    };
    // A receive endpoint's messages travel in its buffer: 4 KiB here.
    let status = padded(TINY_RECEIVE, 5000).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
    assert!(
        status.message().contains("endpoint's buffer of 4096"),
        "{status}"
    );
    assert!(status.message().contains("max_response_len"), "{status}");
    padded(TINY_RECEIVE, 4000).await.expect("within the buffer");
    // Elsewhere the frame is the limit.
    padded(MSG_RECEIVE, 15_000).await.expect("within a frame");
    let status = padded(MSG_RECEIVE, 17_000).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
    assert!(status.message().contains("max_frame"), "{status}");
    // Each handler knew its limit before it acted.
    let seen = h.service.max_response_seen.lock().unwrap().clone();
    assert_eq!(seen[..2], [4096, 4096], "{seen:?}");
    let frame = seen[2];
    assert!(
        (16 * 1024 - 128..16 * 1024).contains(&frame),
        "a frame less its envelope: {seen:?}"
    );
    assert!(seen.iter().skip(2).all(|&m| m == frame), "{seen:?}");
}

#[tokio::test]
async fn a_cancelled_call_stops_its_handler_and_frees_its_buffer() {
    a_cancelled_call_stops_its_handler_and_frees_its_buffer_on(&super::tcp_backend()).await;
}

#[tokio::test]
async fn a_passed_deadline_stops_the_handler() {
    a_passed_deadline_stops_the_handler_on(&super::tcp_backend()).await;
}

#[tokio::test]
async fn the_server_bounds_calls_that_carry_no_deadline() {
    the_server_bounds_calls_that_carry_no_deadline_on(&super::tcp_backend()).await;
}

#[tokio::test]
async fn a_connection_that_ends_stops_its_handlers() {
    a_connection_that_ends_stops_its_handlers_on(&super::tcp_backend()).await;
}

#[tokio::test]
async fn a_response_over_its_limit_is_known_before_and_refused_after() {
    a_response_over_its_limit_is_known_before_and_refused_after_on(&super::tcp_backend()).await;
}

/// A one-sided read a handler makes of memory whose owner never answers ends by the call's
/// deadline: the peer loses its connection (as the framework's own pull does at
/// `transfer_timeout`), which completes the read and frees the lease it held. Before, the
/// read waited for ever and held the lease until the peer reset its connection.
#[tokio::test]
async fn a_remote_read_nobody_answers_ends_by_the_deadline_and_frees_its_lease() {
    use super::raw::RawClient;
    use super::remote::{Remote, RemoteRequest, ENDPOINTS as REMOTE};
    use crate::memory::Access;
    use crate::protocol::frames::{Frame, Kind, RequestFrame};
    use crate::transport::tcp::raw_peer::{RawPeer, READ_REQUEST};
    let remote = Remote::default();
    let region = remote.region().clone();
    let h = Harness::start_serving(
        &super::tcp_backend(),
        ServerConfig::default(),
        super::TestService::default(),
        |b| b.add_service(remote),
    )
    .await;
    let mut peer = RawPeer::connect(&h.addr).await;
    let frame = |kind| {
        prost::Message::encode_to_vec(&Frame {
            kind: Some(kind),
            credits: 0,
            starved: false,
        })
    };
    let hello = RawClient::hello();
    let token = hello.token;
    peer.send(&frame(Kind::Hello(hello))).await;
    // A handle of the peer's memory, as if it had offered it, in a call with a deadline.
    let handle = crate::RemoteBuf::forged(0x10000, 4096, Access::REMOTE_READ, 1, token);
    let message = RemoteRequest {
        buf: Some(handle),
        len: 4096,
        seed: 1,
        ..Default::default()
    };
    let request = RequestFrame {
        id: 1,
        path: REMOTE[0].path.into(),
        op: REMOTE[0].op.as_u32(),
        metadata: encode_message(&message),
        timeout_us: 300_000,
        ..Default::default()
    };
    peer.send(&frame(Kind::Request(request))).await;
    // The handler reads the peer's memory into a lease of its region; the peer never answers.
    loop {
        match bounded("the handler's read", peer.next()).await {
            Some((kind, _)) if kind == READ_REQUEST => break,
            Some(_) => continue,
            None => panic!("closed before the read"),
        }
    }
    assert_eq!(region.leased(), 4096, "the read holds its lease");
    // By the deadline the server closes the connection, and the lease comes back.
    super::hostile::closed_by_the_server(&mut peer).await;
    bounded("the lease comes back", async {
        while region.leased() > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    serves_on(&h.client().await).await;
}
