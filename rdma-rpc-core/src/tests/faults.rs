//! Bad input and faults: each closes only what it must, and the server keeps serving.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::e2e::{inbound, outbound, req, BLOB_WRITE, MSG_SEND};
use super::service::{TestResponse, ENDPOINTS};
use super::{bounded, pattern, tcp_backend, Backend, Harness};
use crate::codegen::call_inbound;
use crate::protocol::channel::FrameChannel;
use crate::protocol::frames::{CallId, Hello, Kind, RequestFrame};
use crate::protocol::PROTOCOL_VERSION;
use crate::service::{EndpointDef, OpKind};
use crate::transport::{Connection, Descriptor, SendData};
use crate::{Access, ClientConfig, Code, Error, Request, ServerConfig};

/// A client that speaks frames by hand, to misbehave on purpose.
struct RawClient {
    channel: FrameChannel,
}

impl RawClient {
    async fn connect(h: &Harness) -> RawClient {
        let conn = h.transport.connect(&h.addr).await.unwrap();
        let channel = FrameChannel::new(conn, 16, 16 * 1024, true).unwrap();
        channel
            .send_priority(Kind::Hello(Hello {
                version: PROTOCOL_VERSION,
                max_frame: 16 * 1024,
                credits: 16,
                max_in_flight: 1000,
                inline_threshold: 0,
            }))
            .await
            .unwrap();
        match channel.recv().await.unwrap().kind {
            Some(Kind::HelloAck(ack)) => channel.set_peer(ack.credits - 1, ack.max_frame),
            other => panic!("no HelloAck: {other:?}"),
        }
        RawClient { channel }
    }

    fn conn(&self) -> &Arc<dyn Connection> {
        self.channel.conn()
    }

    async fn request(&self, id: u64, path: &str, op: OpKind, payload_len: u64) {
        let request = RequestFrame {
            id,
            path: path.into(),
            op: op.as_u32(),
            metadata: Bytes::from(prost::Message::encode_to_vec(&req(payload_len as usize, 7))),
            payload_len,
            inline_payload: None,
            timeout_us: 0,
        };
        self.channel.send(Kind::Request(request)).await.unwrap();
    }

    async fn next(&self) -> Kind {
        loop {
            if let Some(kind) = self.channel.recv().await.unwrap().kind {
                return kind;
            }
        }
    }

    async fn grant(&self) -> Descriptor {
        match self.next().await {
            Kind::Grant(g) => Descriptor {
                addr: g.addr,
                len: g.len,
                rkey: g.rkey,
                access: Access::from_bits_truncate(g.access),
                blob: g.blob,
            },
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    async fn ack(&self, id: u64) {
        self.channel.send(Kind::Ack(CallId { id })).await.unwrap();
    }
}

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
    };
    let err = call(&MISSING, 1).await;
    assert_eq!(err.code(), Code::NotFound, "{err}");
    assert!(err.message().contains("/nope"), "{err}");

    static WRONG_OP: EndpointDef = EndpointDef {
        path: "/small",
        op: OpKind::Send,
        buffer_size: 1024,
        method: "x",
        timeout_ms: None,
    };
    let err = call(&WRONG_OP, 1).await;
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("supports: write"), "{err}");

    // The client believes the buffer is larger than the server's: the server refuses.
    static TOO_BIG: EndpointDef = EndpointDef {
        path: "/small",
        op: OpKind::Write,
        buffer_size: 1 << 20,
        method: "x",
        timeout_ms: None,
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

pub(crate) async fn handler_panic_is_an_internal_error_and_the_server_goes_on_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    let client = h.client().await;
    let err = call_inbound::<_, TestResponse>(
        &client,
        &ENDPOINTS[5],
        Request::new(req(1, 1)),
        Bytes::from_static(b"x"),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err}");
    assert!(inbound(&client, MSG_SEND, 10, 1).await.unwrap().exact);
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
            r.delay_ms = 60_000;
            call_inbound::<_, TestResponse>(
                &client,
                &ENDPOINTS[MSG_SEND],
                Request::new(r),
                Bytes::from(pattern(10, i)),
            )
            .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
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

// TCP-only (DOCA cannot revoke an exported mmap per request: a descriptor keeps working after
// the ack while the region lives; see docs/doca.md).
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
// learns the blob can use it; see docs/doca.md).
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
    // Two writes wait for their transfers; the third is over the limit.
    for id in 1..=3 {
        raw.request(id, "/blob", OpKind::Write, 100_000).await;
    }
    let mut refused = None;
    for _ in 0..3 {
        if let Kind::Response(r) = raw.next().await {
            refused = Some(r);
        }
    }
    let r = refused.expect("one request refused");
    assert_eq!(r.id, 3);
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
    let err = crate::Client::builder()
        .transport(h.transport.clone())
        .connect(&h.addr)
        .await
        .unwrap_err();
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
