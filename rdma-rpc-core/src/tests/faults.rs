//! Bad input and faults: each closes only what it must, and the server keeps serving.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;

use super::e2e::{inbound, outbound, req, BLOB_READ, BLOB_WRITE, MSG_SEND};
use super::raw::RawClient;
use super::service::{TestRequest, TestResponse, ENDPOINTS};
use super::{bounded, pattern, tcp_backend, Backend, Harness};
use crate::codegen::call_inbound;
use crate::protocol::channel::FrameChannel;
use crate::protocol::frames::{Hello, Kind, RequestFrame};
use crate::service::{EndpointDef, OpKind};
use crate::transport::{Fencing, SendData};
use crate::{Access, ClientConfig, Code, Error, Request, ServerConfig, Status};

async fn still_serving(h: &Harness) {
    let client = h.client().await;
    assert!(
        inbound(&client, BLOB_WRITE, 100_000, 9)
            .await
            .unwrap()
            .exact
    );
}

pub(crate) async fn malformed_frames_close_that_connection_only_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    let good = h.client().await;
    for garbage in [
        &[0xff, 0xff, 0xff][..],
        &[0x1a, 0x40, 0x01][..],
        &[0x08][..],
    ] {
        let raw = RawClient::connect(&h).await;
        // Not a protobuf frame / a truncated one: straight through the transport.
        raw.conn()
            .send(SendData::Bytes(Bytes::copy_from_slice(garbage)), None)
            .await
            .unwrap();
        let err = bounded("close", raw.conn().closed()).await;
        assert!(err.is_connection_fatal(), "{err}");
    }
    assert!(inbound(&good, MSG_SEND, 10, 1).await.unwrap().exact);
    still_serving(&h).await;
}

#[tokio::test]
async fn malformed_frames_close_that_connection_only() {
    malformed_frames_close_that_connection_only_on(&tcp_backend()).await;
}

pub(crate) async fn frames_a_client_must_not_send_close_the_connection_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    let raw = RawClient::connect(&h).await;
    raw.channel
        .send(Kind::HelloAck(Hello::default()))
        .await
        .unwrap();
    match raw.next().await {
        Kind::Goaway(s) => assert!(s.message.contains("unexpected HelloAck"), "{}", s.message),
        other => panic!("expected goaway, got {other:?}"),
    }
    still_serving(&h).await;
}

#[tokio::test]
async fn frames_a_client_must_not_send_close_the_connection() {
    frames_a_client_must_not_send_close_the_connection_on(&tcp_backend()).await;
}

pub(crate) async fn unknown_endpoints_wrong_operations_and_oversized_requests_get_statuses_on(
    b: &Backend,
) {
    let h = Harness::default_on(b).await;
    let client = h.client().await;
    let call = |ep: &'static EndpointDef, len: usize| {
        let client = client.clone();
        async move {
            call_inbound::<_, TestResponse>(
                &client,
                ep,
                Request::new(req(len, 1)),
                Bytes::from(pattern(len, 1)),
            )
            .await
            .unwrap_err()
        }
    };
    static MISSING: EndpointDef = EndpointDef {
        path: "/nope",
        op: OpKind::Send,
        buffer_size: 64,
        method: "x",
        timeout_ms: None,
        stream: crate::service::StreamKind::Unary,
    };
    let err = call(&MISSING, 1).await;
    assert_eq!(err.code(), Code::Unimplemented, "{err}");
    assert!(err.message().contains("/nope"), "{err}");

    static WRONG_OP: EndpointDef = EndpointDef {
        path: "/small",
        op: OpKind::Send,
        buffer_size: 1024,
        method: "x",
        timeout_ms: None,
        stream: crate::service::StreamKind::Unary,
    };
    let err = call(&WRONG_OP, 1).await;
    assert_eq!(err.code(), Code::Unimplemented, "{err}");
    assert!(err.message().contains("supports: write"), "{err}");

    // The client believes the buffer is larger than the server's: the server refuses.
    static TOO_BIG: EndpointDef = EndpointDef {
        path: "/small",
        op: OpKind::Write,
        buffer_size: 1 << 20,
        method: "x",
        timeout_ms: None,
        stream: crate::service::StreamKind::Unary,
    };
    let err = call(&TOO_BIG, 4096).await;
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(
        err.message().contains("exceeds the 1024 byte buffer"),
        "{err}"
    );

    // And the client refuses what does not fit the endpoint it knows, before sending.
    let err = call(&ENDPOINTS[4], 4096).await;
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");

    // The connection survived all of it.
    assert!(inbound(&client, MSG_SEND, 10, 1).await.unwrap().exact);
}

#[tokio::test]
async fn unknown_endpoints_wrong_operations_and_oversized_requests_get_statuses() {
    unknown_endpoints_wrong_operations_and_oversized_requests_get_statuses_on(&tcp_backend()).await;
}

/// A handler that panics before it first waits (on the connection's task, run to
/// completion), one that panics after waiting (on a task of its own: it waits at the gate
/// until the test sees it started), and both with every call on its own task
/// (`inline_handlers` off): each call ends `INTERNAL`, the connection goes on.
pub(crate) async fn handler_panic_is_an_internal_error_and_the_server_goes_on_on(b: &Backend) {
    for inline_handlers in [true, false] {
        let config = ServerConfig {
            inline_handlers,
            ..ServerConfig::default()
        };
        let h = Harness::start_on(b, config).await;
        let client = h.client().await;
        for gated in [false, true] {
            let started = h.service.entered_now() + 1;
            let call = {
                let client = client.clone();
                tokio::spawn(async move {
                    call_inbound::<_, TestResponse>(
                        &client,
                        &ENDPOINTS[5],
                        Request::new(TestRequest { gated, ..req(1, 1) }),
                        Bytes::from_static(b"x"),
                    )
                    .await
                })
            };
            if gated {
                bounded("the handler starts", h.service.entered(started)).await;
                h.service.open_gate();
            }
            let err = bounded("the call of a panicking handler", call)
                .await
                .unwrap()
                .unwrap_err();
            assert_eq!(err.code(), Code::Internal, "{err}");
            assert!(inbound(&client, MSG_SEND, 10, 1).await.unwrap().exact);
        }
    }
}

#[tokio::test]
async fn handler_panic_is_an_internal_error_and_the_server_goes_on() {
    handler_panic_is_an_internal_error_and_the_server_goes_on_on(&tcp_backend()).await;
}

pub(crate) async fn client_dying_mid_write_never_reaches_the_handler_and_frees_the_buffer_on(
    b: &Backend,
) {
    // One buffer per path: a leaked buffer would make the next write wait forever.
    let config = ServerConfig {
        min_buffers: 1,
        max_buffers: 1,
        ..ServerConfig::default()
    };
    let h = Harness::start_on(b, config).await;
    let raw = RawClient::connect(&h).await;
    let len = 1 << 20;
    if raw.ack.pull_writes {
        // The server pulls: offer a window the read cannot complete (it ends half way into
        // the buffer), then vanish.
        let buf = crate::RegisteredBuf::new(len as usize / 2, Access::ALL).unwrap();
        let window = raw
            .conn()
            .grant(buf, 0, len as usize / 2, Access::REMOTE_READ)
            .unwrap();
        let mut source = window.descriptor().clone();
        source.len = len;
        raw.send_request(RequestFrame {
            id: 1,
            path: "/blob".into(),
            op: OpKind::Write.as_u32(),
            metadata: Bytes::from(prost::Message::encode_to_vec(&req(len as usize, 7))),
            payload_len: len,
            source: Some((&source).into()),
            ..Default::default()
        })
        .await;
        raw.conn().close();
        drop(window);
        drop(raw);
    } else {
        raw.request(1, "/blob", OpKind::Write, len).await;
        let window = raw.grant().await;
        // Half the bytes, then the client vanishes without acking.
        let half = window.slice(0, len / 2).unwrap();
        raw.conn()
            .write(
                SendData::Bytes(Bytes::from(vec![1u8; (len / 2) as usize])),
                &half,
                None,
            )
            .await
            .unwrap();
        raw.conn().close();
        drop(raw);
    }

    let client = h.client().await;
    let resp = call_inbound::<_, TestResponse>(
        &client,
        &ENDPOINTS[BLOB_WRITE],
        Request::new(req(1000, 5)).with_timeout(Duration::from_secs(20)),
        Bytes::from(pattern(1000, 5)),
    )
    .await
    .expect("the buffer came back to the pool");
    assert!(resp.exact);
    assert_eq!(
        h.service.inbound_runs.load(Ordering::SeqCst),
        1,
        "only the good write ran"
    );
}

#[tokio::test]
async fn client_dying_mid_write_never_reaches_the_handler_and_frees_the_buffer() {
    client_dying_mid_write_never_reaches_the_handler_and_frees_the_buffer_on(&tcp_backend()).await;
}

pub(crate) async fn server_death_ends_pending_calls_promptly_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    let client = h.client().await;
    let mut calls = Vec::new();
    for i in 0..8 {
        let client = client.clone();
        calls.push(tokio::spawn(async move {
            let mut r = req(10, i);
            r.gated = true; // never opened: the handlers wait until the server dies
            call_inbound::<_, TestResponse>(
                &client,
                &ENDPOINTS[MSG_SEND],
                Request::new(r),
                Bytes::from(pattern(10, i)),
            )
            .await
        }));
    }
    // Every call is in its handler, pending on the server, when the server dies.
    bounded("every handler starts", h.service.entered(8)).await;
    assert!(calls.iter().all(|c| !c.is_finished()), "a call ended early");
    drop(h); // aborts the server: every connection drops
    for call in calls {
        let err = bounded("pending call", call).await.unwrap().unwrap_err();
        assert_eq!(err.code(), Code::Unavailable, "{err}");
    }
    let err = inbound(&client, MSG_SEND, 1, 1).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
}

#[tokio::test]
async fn server_death_ends_pending_calls_promptly() {
    server_death_ends_pending_calls_promptly_on(&tcp_backend()).await;
}

/// Write slots are used once per announcement, and only as far as they reach.
pub(crate) async fn misused_write_slots_get_statuses_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    assert!(
        RawClient::connect(&h).await.ack.slots.is_empty(),
        "no slots before a payload needs them"
    );
    let raw = RawClient::connect_with_slots(&h).await;
    assert_eq!(
        raw.ack.slots.len(),
        4,
        "the default slots come with the first response after a large payload"
    );
    let slot = raw.slot(0);
    assert_eq!(slot.len, 64 * 1024);
    assert!(
        slot.access.contains(Access::REMOTE_WRITE) && !slot.access.contains(Access::REMOTE_READ)
    );
    let request = |id: u64, slot: u32, len: u64| RequestFrame {
        id,
        path: "/blob".into(),
        op: OpKind::Write.as_u32(),
        metadata: Bytes::from(prost::Message::encode_to_vec(&req(len as usize, 3))),
        payload_len: len,
        slot: Some(slot),
        ..Default::default()
    };
    let status = |kind: Kind| match kind {
        Kind::Response(r) => r.status.map(crate::Status::from),
        other => panic!("expected a response, got {other:?}"),
    };
    // A slot never announced.
    raw.send_request(request(1, 77, 10_000)).await;
    let s = status(raw.next().await).expect("an error");
    assert_eq!(s.code(), Code::InvalidArgument);
    assert!(s.message().contains("slot 77"), "{s}");
    // More bytes than the slot holds.
    raw.send_request(request(2, 1, 65 * 1024)).await;
    let s = status(raw.next().await).expect("an error");
    assert_eq!(s.code(), Code::InvalidArgument);
    assert!(s.message().contains("write slot 1"), "{s}");
    // Used properly, slot 0 delivers exactly what was written into it.
    raw.conn()
        .write(
            SendData::Bytes(Bytes::from(pattern(10_000, 3))),
            &slot,
            None,
        )
        .await
        .unwrap();
    raw.send_request(request(3, 0, 10_000)).await;
    assert!(status(raw.next().await).is_none());
    still_serving(&h).await;
}

#[tokio::test]
async fn misused_write_slots_get_statuses() {
    misused_write_slots_get_statuses_on(&tcp_backend()).await;
}

/// A handler that keeps the payload of a write slot holds bytes nobody can change: the
/// client writes garbage through the used slot's old descriptor, and the kept bytes stay as
/// they were. Over the software transport the write fails (the window was revoked); over
/// DOCA it lands in the slot, and the handler holds a copy.
pub(crate) async fn slot_bytes_never_change_under_a_handler_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    let raw = RawClient::connect_with_slots(&h).await;
    let stale = raw.slot(0);
    let data = Bytes::from(pattern(20_000, 5));
    raw.conn()
        .write(SendData::Bytes(data.clone()), &stale, None)
        .await
        .unwrap();
    let mut keep = req(20_000, 5);
    keep.keep = true;
    raw.send_request(RequestFrame {
        id: 1,
        path: "/blob".into(),
        op: OpKind::Write.as_u32(),
        metadata: Bytes::from(prost::Message::encode_to_vec(&keep)),
        payload_len: 20_000,
        slot: Some(0),
        ..Default::default()
    })
    .await;
    match raw.next().await {
        Kind::Response(r) => assert!(r.status.is_none(), "{:?}", r.status),
        other => panic!("expected a response, got {other:?}"),
    }
    let garbage = SendData::Bytes(Bytes::from(vec![0xee; 20_000]));
    match raw.conn().write(garbage, &stale, None).await {
        Ok(()) => assert_eq!(raw.conn().fencing(), Fencing::Unfenced),
        Err(e) => assert!(matches!(e, Error::RemoteAccess { .. }), "{e}"),
    }
    // A later request on the same connection proves the write above completed first.
    raw.send_request(RequestFrame {
        id: 2,
        path: "/blob".into(),
        op: OpKind::Write.as_u32(),
        metadata: Bytes::from(prost::Message::encode_to_vec(&req(0, 0))),
        ..Default::default()
    })
    .await;
    let kept = h.service.kept.lock().unwrap().clone();
    assert_eq!(kept.len(), 1);
    assert!(kept[0] == data, "the bytes a handler holds changed");
}

#[tokio::test]
async fn slot_bytes_never_change_under_a_handler() {
    slot_bytes_never_change_under_a_handler_on(&tcp_backend()).await;
}

/// A client that keeps a descriptor after its call (a used write slot, a pulled payload's
/// window) cannot touch another connection's data with it: slots belong to one connection,
/// and no other server memory is ever exposed for payloads pulled or results pushed. Over
/// the software transport the stale descriptor fails outright; over DOCA (no per-request
/// revocation) it reaches only the misbehaving connection's own slot.
pub(crate) async fn stale_descriptors_never_reach_another_connection_on(b: &Backend) {
    let config = ServerConfig {
        pull_writes: Some(true),
        ..ServerConfig::default()
    };
    let h = Harness::start_on(b, config).await;
    let thief = RawClient::connect_with_slots(&h).await;
    let stale = thief.slot(0);
    thief
        .conn()
        .write(
            SendData::Bytes(Bytes::from(pattern(20_000, 1))),
            &stale,
            None,
        )
        .await
        .unwrap();
    thief
        .send_request(RequestFrame {
            id: 1,
            path: "/blob".into(),
            op: OpKind::Write.as_u32(),
            metadata: Bytes::from(prost::Message::encode_to_vec(&req(20_000, 1))),
            payload_len: 20_000,
            slot: Some(0),
            ..Default::default()
        })
        .await;
    match thief.next().await {
        Kind::Response(r) => assert!(r.status.is_none(), "{:?}", r.status),
        other => panic!("expected a response, got {other:?}"),
    }
    let victim = h.client().await;
    let work = async {
        let calls: Vec<_> = (0..24u32)
            .map(|seed| {
                let victim = victim.clone();
                tokio::spawn(async move {
                    let len = [30_000, 60_000, 400_000][seed as usize % 3];
                    if seed % 2 == 0 {
                        assert!(inbound(&victim, BLOB_WRITE, len, seed).await.unwrap().exact);
                    } else {
                        let data = outbound(&victim, BLOB_READ, len, seed).await.unwrap();
                        assert!(data == pattern(len, seed));
                    }
                })
            })
            .collect();
        for call in calls {
            call.await.unwrap();
        }
    };
    let attack = async {
        for _ in 0..200 {
            let garbage = SendData::Bytes(Bytes::from(vec![0xee; 64 * 1024]));
            match thief.conn().write(garbage, &stale, None).await {
                Ok(()) => tokio::task::yield_now().await,
                Err(e) => {
                    assert_eq!(
                        thief.conn().fencing(),
                        Fencing::Revocable,
                        "only revocable windows refuse: {e}"
                    );
                    assert!(matches!(e, Error::RemoteAccess { .. }), "{e}");
                    return;
                }
            }
        }
        assert_eq!(
            thief.conn().fencing(),
            Fencing::Unfenced,
            "a used slot's old window must be revoked"
        );
    };
    bounded("victim and thief", async { tokio::join!(work, attack) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_descriptors_never_reach_another_connection() {
    stale_descriptors_never_reach_another_connection_on(&tcp_backend()).await;
}

// TCP-only (DOCA cannot revoke an exported mmap per request: a descriptor keeps working after
// the ack while the region lives; see docs/doca.md). Over DOCA the server pulls instead and
// never grants a pool buffer (`stale_descriptors_never_reach_another_connection_on`).
#[tokio::test]
async fn descriptors_grant_one_buffer_one_direction_until_the_ack() {
    let h = Harness::tcp_default().await;
    let raw = RawClient::connect(&h).await;
    raw.request(1, "/blob", OpKind::Write, 4096).await;
    let window = raw.grant().await;
    assert_eq!(window.len, 4096, "exactly the request's size");
    assert!(window.access.contains(Access::REMOTE_WRITE));
    assert!(
        !window.access.contains(Access::REMOTE_READ),
        "write windows are write-only"
    );
    raw.conn()
        .write(
            SendData::Bytes(Bytes::from(pattern(4096, 7))),
            &window,
            None,
        )
        .await
        .unwrap();
    raw.ack(1).await;
    match raw.next().await {
        Kind::Response(r) => assert!(r.status.is_none(), "{:?}", r.status),
        other => panic!("expected a response, got {other:?}"),
    }
    // After the ack the descriptor is dead: using it again is a remote access error.
    let err = raw
        .conn()
        .write(SendData::Bytes(Bytes::from_static(b"late")), &window, None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::RemoteAccess { .. }), "{err}");
    still_serving(&h).await;
}

// TCP-only (a DOCA export is not bound to one connection: any connection on the device that
// learns the blob can use it; see docs/doca.md). Over DOCA no pool buffer is ever granted to a
// client (pull mode), so there is no such window to steal.
#[tokio::test]
async fn a_client_cannot_reach_another_connections_buffers() {
    let h = Harness::tcp_default().await;
    let victim = RawClient::connect(&h).await;
    victim.request(1, "/blob", OpKind::Write, 4096).await;
    let window = victim.grant().await;
    let thief = RawClient::connect(&h).await;
    let err = thief
        .conn()
        .write(SendData::Bytes(Bytes::from(vec![0xee; 16])), &window, None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::RemoteAccess { .. }), "{err}");
    let err = thief
        .conn()
        .read(
            &window,
            crate::RegisteredBuf::new(4096, Access::LOCAL_WRITE).unwrap(),
        )
        .await
        .unwrap_err();
    assert!(err.is_connection_fatal(), "{err}");
    // The victim's transfer is untouched.
    victim
        .conn()
        .write(
            SendData::Bytes(Bytes::from(pattern(4096, 7))),
            &window,
            None,
        )
        .await
        .unwrap();
    victim.ack(1).await;
    match victim.next().await {
        Kind::Response(r) => assert!(r.status.is_none(), "{:?}", r.status),
        other => panic!("expected a response, got {other:?}"),
    }
}

pub(crate) async fn in_flight_limit_is_enforced_and_named_on(b: &Backend) {
    let config = ServerConfig {
        max_in_flight: 2,
        ..ServerConfig::default()
    };
    let h = Harness::start_on(b, config).await;
    let raw = RawClient::connect(&h).await;
    // Two slow reads stay in their handlers (held at the gate); the third is over the limit.
    for id in 1..=3 {
        let mut slow = req(10, 7);
        slow.gated = true;
        raw.send_request(RequestFrame {
            id,
            path: "/blob".into(),
            op: OpKind::Read.as_u32(),
            metadata: Bytes::from(prost::Message::encode_to_vec(&slow)),
            ..Default::default()
        })
        .await;
    }
    let r = bounded("a response", async {
        loop {
            if let Kind::Response(r) = raw.next().await {
                return r;
            }
        }
    })
    .await;
    assert_eq!(
        r.id, 3,
        "the first response, while two calls are held, refuses the third"
    );
    let status = r.status.unwrap();
    assert_eq!(Code::from_u32(status.code), Code::ResourceExhausted);
    assert!(
        status.message.contains("max_in_flight = 2"),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn in_flight_limit_is_enforced_and_named() {
    in_flight_limit_is_enforced_and_named_on(&tcp_backend()).await;
}

pub(crate) async fn well_behaved_clients_wait_instead_of_exceeding_the_in_flight_limit_on(
    b: &Backend,
) {
    let config = ServerConfig {
        max_in_flight: 2,
        ..ServerConfig::default()
    };
    let h = Harness::start_on(b, config).await;
    let client = h.client().await;
    let calls: Vec<_> = (0..10)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { outbound(&client, super::e2e::BLOB_READ, 20_000, i).await })
        })
        .collect();
    for (i, call) in calls.into_iter().enumerate() {
        assert_eq!(call.await.unwrap().unwrap(), pattern(20_000, i as u32));
    }
    // Small sends too, held in their handlers until all are made: a call that finds room
    // opens and sends its request under one lock, the others wait their turn in line.
    let sends: Vec<_> = (0..10)
        .map(|i| {
            let client = client.clone();
            let mut held = req(64, i);
            held.gated = true;
            let data = Bytes::from(pattern(64, i));
            let send = &ENDPOINTS[MSG_SEND];
            tokio::spawn(async move {
                call_inbound::<_, TestResponse>(&client, send, Request::new(held), data).await
            })
        })
        .collect();
    // Handler runs are counted from the start: the 10 reads above, then 2 sends. A third
    // send the client let out would be refused by the server (its `unwrap` below fails).
    h.service.entered(12).await;
    assert_eq!(
        h.service.entered_now(),
        12,
        "two sends in flight, the others wait"
    );
    h.service.open_gate();
    for send in sends {
        assert!(send.await.unwrap().unwrap().exact);
    }
}

#[tokio::test]
async fn well_behaved_clients_wait_instead_of_exceeding_the_in_flight_limit() {
    well_behaved_clients_wait_instead_of_exceeding_the_in_flight_limit_on(&tcp_backend()).await;
}

pub(crate) async fn connection_limit_is_enforced_and_named_on(b: &Backend) {
    let config = ServerConfig {
        max_connections: 2,
        ..ServerConfig::default()
    };
    let h = Harness::start_on(b, config).await;
    let _a = h.client().await;
    let _b = h.client().await;
    let err = h.refused().await;
    assert!(err.to_string().contains("max_connections = 2"), "{err}");
}

#[tokio::test]
async fn connection_limit_is_enforced_and_named() {
    connection_limit_is_enforced_and_named_on(&tcp_backend()).await;
}

pub(crate) async fn oversized_metadata_is_refused_with_the_limit_named_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    let client = h.client_with(ClientConfig::default()).await;
    let err = client
        .call_raw(
            &ENDPOINTS[MSG_SEND],
            Bytes::from(vec![0u8; 64 * 1024]),
            Some(Bytes::new()),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    assert!(err.message().contains("max_frame"), "{err}");
    assert!(inbound(&client, MSG_SEND, 10, 1).await.unwrap().exact);
}

#[tokio::test]
async fn oversized_metadata_is_refused_with_the_limit_named() {
    oversized_metadata_is_refused_with_the_limit_named_on(&tcp_backend()).await;
}

pub(crate) async fn protocol_version_mismatch_is_reported_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    let conn = h.transport.connect(&h.addr).await.unwrap();
    let channel = FrameChannel::new(conn, 4, 16 * 1024, true).unwrap();
    channel
        .send_priority(Kind::Hello(Hello {
            version: 99,
            max_frame: 16 * 1024,
            credits: 4,
            max_in_flight: 1,
            inline_threshold: 0,
            ..Default::default()
        }))
        .await
        .unwrap();
    match channel.recv().await.unwrap().kind {
        Some(Kind::Goaway(s)) => {
            assert_eq!(Code::from_u32(s.code), Code::FailedPrecondition);
            assert!(s.message.contains("version 99"), "{}", s.message);
        }
        other => panic!("expected goaway, got {other:?}"),
    }
}

#[tokio::test]
async fn protocol_version_mismatch_is_reported() {
    protocol_version_mismatch_is_reported_on(&tcp_backend()).await;
}

pub(crate) async fn silent_clients_time_out_in_the_handshake_on(b: &Backend) {
    let config = ServerConfig {
        handshake_timeout: Duration::from_millis(100),
        ..ServerConfig::default()
    };
    let h = Harness::start_on(b, config).await;
    let conn = h.transport.connect(&h.addr).await.unwrap();
    let err = bounded("handshake timeout", conn.closed()).await;
    assert!(err.is_connection_fatal(), "{err}");
    still_serving(&h).await;
}

#[tokio::test]
async fn silent_clients_time_out_in_the_handshake() {
    silent_clients_time_out_in_the_handshake_on(&tcp_backend()).await;
}

/// Messages too large for their frame or their endpoint fail the call at once with a status
/// that names the limit, on both sides, and the connection serves on (before: the response was
/// dropped and the caller waited for its deadline, or forever).
pub(crate) async fn oversized_messages_fail_at_once_naming_the_limit_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    let client = h.client().await;
    let send = |request: TestRequest| {
        let client = client.clone();
        async move {
            call_inbound::<_, TestResponse>(
                &client,
                &ENDPOINTS[MSG_SEND],
                // A bound, so that a regression fails instead of hanging.
                Request::new(request).with_timeout(Duration::from_secs(30)),
                Bytes::from(pattern(10, 1)),
            )
            .await
        }
    };
    // A response message larger than max_frame (16 KiB).
    let big = TestRequest {
        pad_response: 20_000,
        ..req(10, 1)
    };
    let status = send(big).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
    assert!(status.message().contains("max_frame"), "{status}");
    // An error whose message is larger: its code stays, its message is cut.
    let failing = TestRequest {
        fail_with: 20_000,
        ..req(10, 1)
    };
    let status = send(failing).await.unwrap_err();
    assert_eq!(status.code(), Code::Internal, "{status}");
    assert!(
        status.message().contains("cut from 20000 bytes"),
        "{}",
        &status.message()[status.message().len() - 60..]
    );
    // A request message larger than a send endpoint's buffer (the panic endpoint's is 64
    // bytes): refused by the client before sending, and by the server from a raw client.
    const PANIC: usize = 5;
    // Never decoded: the size is checked first.
    let padded = vec![0u8; 100];
    let status = client
        .call_raw(
            &ENDPOINTS[PANIC],
            Bytes::from(padded.clone()),
            Some(Bytes::new()),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
    assert!(status.message().contains("64 byte buffer"), "{status}");
    let raw = RawClient::connect(&h).await;
    raw.send_request(RequestFrame {
        id: 1,
        path: Bytes::from_static(b"/panic"),
        op: OpKind::Send.as_u32(),
        metadata: Bytes::from(padded),
        ..Default::default()
    })
    .await;
    match raw.next().await {
        Kind::Response(r) => {
            let status = Status::from(r.status.expect("a status"));
            assert_eq!(status.code(), Code::ResourceExhausted, "{status}");
        }
        other => panic!("expected a response, got {other:?}"),
    }
    assert!(
        send(req(10, 1)).await.unwrap().exact,
        "the connection serves on"
    );
}

#[tokio::test]
async fn oversized_messages_fail_at_once_naming_the_limit() {
    oversized_messages_fail_at_once_naming_the_limit_on(&tcp_backend()).await;
}

/// Errors a new user meets first say what to do: a missing scheme names the ones there are, an
/// unknown one lists them all, and a refused connection says "refused" in its message (not
/// only in its `Debug`).
#[tokio::test]
async fn address_and_connection_errors_say_what_is_wrong() {
    let no_scheme = crate::transport::transport_for("127.0.0.1:7470")
        .unwrap_err()
        .to_string();
    assert!(no_scheme.contains("tcp://127.0.0.1:7470"), "{no_scheme}");
    let unknown = crate::transport::transport_for("rdma://h:1")
        .unwrap_err()
        .to_string();
    assert!(unknown.contains("doca+oob"), "{unknown}");
    // A port nobody listens on (bound, then closed).
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let refused = crate::Client::connect(&format!("tcp://127.0.0.1:{port}"))
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.to_lowercase().contains("refused"), "{refused}");
}

/// Every configuration field has a builder setter (the config structs are `non_exhaustive`),
/// and a client says when its connection is over.
#[tokio::test]
async fn builders_set_every_field_and_clients_know_when_they_are_closed() {
    let h = Harness::default_on(&tcp_backend()).await;
    let refused = crate::Client::builder()
        .transport(h.transport.clone())
        .recv_credits(2)
        .connect(&h.addr)
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("recv_credits"), "{refused}");
    let bound = crate::Server::builder()
        .recv_credits(2)
        .bind("tcp://127.0.0.1:0")
        .await;
    let Err(err) = bound else {
        panic!("a server with too few receives was bound")
    };
    assert!(err.to_string().contains("recv_credits"), "{err}");
    let client = crate::Client::builder()
        .transport(h.transport.clone())
        .max_frame(32 * 1024)
        .inline_threshold(1024)
        .connect_timeout(Duration::from_secs(5))
        .connect(&h.addr)
        .await
        .unwrap();
    assert!(inbound(&client, MSG_SEND, 10, 1).await.unwrap().exact);
    assert!(!client.is_closed());
    client.close();
    let err = inbound(&client, MSG_SEND, 10, 1).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(client.is_closed());
}
