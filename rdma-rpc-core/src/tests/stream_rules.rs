//! Peers that break the rules of streams (`protocol::stream`): a client that overruns a
//! window, credits what was never sent, sends messages where none are taken, offers windows
//! out of order or past the stream, reports what only the server reports, or never ends its
//! stream; and clients that stop taking what the server streams. Each loses its stream or its
//! connection with a status, and the server serves everyone else.

use std::time::Duration;

use bytes::Bytes;

use super::hostile::still_serving;
use super::raw::RawClient;
use super::streams::{start, Ask, ECHO, ENDPOINTS, GET, LIST, PUT, SUM};
use super::{bounded, Backend};
use crate::codegen::encode_message;
use crate::memory::{Access, RegisteredBuf};
use crate::protocol::frames::{
    ChunksFrame, CreditFrame, DescriptorFrame, Kind, MessagesFrame, RequestFrame, UsedWindow,
    WindowOffer,
};
use crate::status::Code;
use crate::ServerConfig;

/// A request of endpoint `index` of the streaming service, with `offers`.
fn request(id: u64, index: usize, message: Bytes, payload_len: u64) -> RequestFrame {
    let ep = &ENDPOINTS[index];
    RequestFrame {
        id,
        path: Bytes::from_static(ep.path.as_bytes()),
        op: ep.op.as_u32(),
        metadata: message,
        payload_len,
        ..Default::default()
    }
}

/// A window of `len` bytes of fresh memory of `raw`'s connection, offered as window `id`
/// holding the stream's bytes at `offset`.
fn offer(
    raw: &RawClient,
    id: u32,
    offset: u64,
    len: usize,
) -> (WindowOffer, crate::transport::Grant) {
    let buf = RegisteredBuf::new(len, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    let grant = raw.conn().grant(buf, 0, len, Access::REMOTE_READ).unwrap();
    let offer = WindowOffer {
        window: id,
        offset,
        descriptor: Some(DescriptorFrame::from(grant.descriptor())),
    };
    (offer, grant)
}

/// Waits until the server ends `raw`'s connection, reading what it still sends.
async fn closed(raw: &RawClient) {
    bounded("the server closes the connection", async {
        while raw.channel.recv().await.is_ok() {}
    })
    .await;
}

/// The response to call `id`, skipping other frames.
async fn response(raw: &RawClient, id: u64) -> crate::protocol::frames::ResponseFrame {
    bounded("the response", async {
        loop {
            if let Kind::Response(r) = raw.next().await {
                if r.id == id {
                    return r;
                }
            }
        }
    })
    .await
}

fn gated_list() -> Bytes {
    encode_message(&Ask {
        count: 10,
        gated: true,
        ..Default::default()
    })
}

pub(crate) async fn stream_rule_breakers_lose_their_connection_on(b: &Backend) {
    let (h, streams) = start(b, ServerConfig::default()).await;

    // Messages past the server's window: a bidirectional call whose client never takes the
    // echoes, so the handler stops taking messages once the client's window is full.
    let raw = RawClient::connect(&h).await;
    raw.send_request(request(1, ECHO, Bytes::new(), 0)).await;
    let message = encode_message(&super::streams::Item {
        seq: 1,
        pad: vec![7u8; 8000],
    });
    let overrun = async {
        loop {
            let frame = MessagesFrame {
                id: 1,
                messages: vec![message.clone()],
                end: false,
            };
            if raw
                .channel
                .send_reading(Kind::Messages(frame), |_| {})
                .await
                .is_err()
            {
                return;
            }
        }
    };
    bounded("the overrun ends the connection", overrun).await;
    closed(&raw).await;
    still_serving(&h).await;

    // A credit for messages never sent, and messages where the server takes none: each on a
    // call that waits at its gate.
    for breach in [
        Kind::Credit(CreditFrame {
            id: 2,
            bytes: 1 << 30,
        }),
        Kind::Messages(MessagesFrame {
            id: 2,
            messages: vec![Bytes::from_static(b"x")],
            end: false,
        }),
    ] {
        let at_gate = streams.at_gate.load(std::sync::atomic::Ordering::SeqCst);
        let raw = RawClient::connect(&h).await;
        raw.send_request(request(2, LIST, gated_list(), 0)).await;
        bounded("the handler reaches its gate", async {
            while streams.at_gate.load(std::sync::atomic::Ordering::SeqCst) == at_gate {
                tokio::task::yield_now().await;
            }
        })
        .await;
        raw.send(breach).await;
        closed(&raw).await;
        still_serving(&h).await;
    }

    // A window offered mid-stream that does not continue the stream.
    let raw = RawClient::connect(&h).await;
    let (first, _first) = offer(&raw, 0, 0, 4096);
    let mut put = request(3, PUT, encode_message(&Ask::default()), 1 << 20);
    put.offers.push(first);
    raw.send_request(put).await;
    let (gap, _gap) = offer(&raw, 1, 8192, 4096);
    raw.send(Kind::Chunks(ChunksFrame {
        id: 3,
        offers: vec![gap],
        used: Vec::new(),
    }))
    .await;
    closed(&raw).await;
    still_serving(&h).await;

    // A client reporting windows used, which only the server does.
    let raw = RawClient::connect(&h).await;
    raw.send(Kind::Chunks(ChunksFrame {
        id: 4,
        offers: Vec::new(),
        used: vec![UsedWindow {
            window: 0,
            offset: 0,
            len: 1,
        }],
    }))
    .await;
    closed(&raw).await;
    still_serving(&h).await;
}

/// Offers in a request that break the stream's rules refuse that call, with a status naming
/// the rule; the connection serves on.
pub(crate) async fn broken_offers_in_a_request_refuse_the_call_on(b: &Backend) {
    let (h, _) = start(b, ServerConfig::default()).await;
    let raw = RawClient::connect(&h).await;
    // (what, the declared length, the windows offered: number, offset, length)
    type Windows = Vec<(u32, u64, usize)>;
    let cases: [(&str, u64, Windows); 4] = [
        ("out of order", 1 << 20, vec![(0, 4096, 4096)]),
        ("past the declared length", 100, vec![(0, 0, 200)]),
        (
            "a number twice",
            1 << 20,
            vec![(0, 0, 4096), (0, 4096, 4096)],
        ),
        ("past max_len", super::streams::MAX_LEN + 1, vec![]),
    ];
    let mut grants = Vec::new();
    for (id, (what, len, windows)) in cases.into_iter().enumerate() {
        let id = 10 + id as u64;
        let mut put = request(id, PUT, encode_message(&Ask::default()), len);
        for (window, offset, size) in windows {
            let (o, g) = offer(&raw, window, offset, size);
            put.offers.push(o);
            grants.push(g);
        }
        raw.send_request(put).await;
        let status = crate::Status::from(response(&raw, id).await.status.expect(what));
        let code = if what == "past max_len" {
            Code::ResourceExhausted
        } else {
            Code::InvalidArgument
        };
        assert_eq!(status.code(), code, "{what}: {status}");
        assert!(status.message().contains("/s/obj"), "{what}: {status}");
    }
    // Offers on a call that does not stream bulk.
    let mut list = request(20, LIST, encode_message(&Ask::default()), 0);
    let (o, _g) = offer(&raw, 0, 0, 64);
    list.offers.push(o);
    raw.send_request(list).await;
    let status = crate::Status::from(response(&raw, 20).await.status.expect("refused"));
    assert_eq!(status.code(), Code::InvalidArgument, "{status}");
    // The connection still serves a well-formed streaming call.
    let mut put = request(21, PUT, encode_message(&Ask::default()), 0);
    put.offers.clear();
    raw.send_request(put).await;
    let r = response(&raw, 21).await;
    assert!(r.status.is_none(), "{:?}", r.status);
}

/// A client stream that never ends is bounded by the server's cap on every call: the call
/// answers `DEADLINE_EXCEEDED`, the handler is dropped, and the client stops sending.
pub(crate) async fn a_stream_that_never_ends_is_bounded_on(b: &Backend) {
    let config = ServerConfig {
        max_call_duration: Some(Duration::from_millis(300)),
        ..ServerConfig::default()
    };
    let (h, streams) = start(b, config).await;
    let client = h.client().await;
    struct Forever(u64);
    impl futures_core::Stream for Forever {
        type Item = Bytes;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Bytes>> {
            self.0 += 1;
            // Now and then let the runtime run something else.
            if self.0.is_multiple_of(64) {
                cx.waker().wake_by_ref();
                return std::task::Poll::Pending;
            }
            std::task::Poll::Ready(Some(Bytes::from_static(b"\x08\x01")))
        }
    }
    let status = client
        .call_raw_client_stream(&ENDPOINTS[SUM], Box::pin(Forever(0)), None)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status}");
    assert!(status.message().contains("max_call_duration"), "{status}");
    bounded("the handler is dropped", async {
        while streams.dropped.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    still_serving(&h).await;
}

/// A client that stops taking what the server streams loses that stream after
/// `transfer_timeout`: a message stream ends with `UNAVAILABLE` naming the setting; a bulk read
/// loses its connection (the server's memory is free again).
pub(crate) async fn a_client_that_stops_reading_loses_its_stream_on(b: &Backend) {
    let config = ServerConfig {
        transfer_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    };
    let (h, _) = start(b, config).await;
    let client = h
        .client_with(crate::ClientConfig {
            stream_window: 64 << 10,
            ..Default::default()
        })
        .await;
    let ask = Ask {
        count: 100_000,
        pad: 100,
        ..Default::default()
    };
    let mut stream = super::streams::list(&client, ask).await.unwrap();
    // Nothing is read until the server gave up; then what it sent arrives, and its error.
    let in_flight = |h: &super::Harness| -> usize {
        h.handle
            .connections()
            .iter()
            .map(|c| c.calls_in_flight)
            .sum()
    };
    bounded("the call reaches the server", async {
        while in_flight(&h) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    bounded("the server gives up on the stream", async {
        while in_flight(&h) > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let status = loop {
        match stream.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream ended without the server's error"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::Unavailable, "{status}");
    assert!(status.message().contains("transfer_timeout"), "{status}");

    // A bulk read whose client takes nothing: its connection goes, and the pool is whole.
    let ask = Ask {
        count: 40 * super::streams::CHUNK,
        ..Default::default()
    };
    let mut read = client
        .call_raw_read_stream(&ENDPOINTS[GET], encode_message(&ask), None)
        .await
        .unwrap();
    bounded("the server drops the connection", async {
        while h.count.current() > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    bounded("the pool is whole again", async {
        while h.handle.pools().iter().any(|p| p.in_use > 0) {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let failed = loop {
        match read.chunk().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("a stream of 40 chunks ended without them"),
            Err(status) => break status,
        }
    };
    assert_eq!(failed.code(), Code::Unavailable, "{failed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_rule_breakers_lose_their_connection() {
    bounded(
        "rule breakers",
        stream_rule_breakers_lose_their_connection_on(&super::tcp_backend()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_offers_in_a_request_refuse_the_call() {
    bounded(
        "broken offers",
        broken_offers_in_a_request_refuse_the_call_on(&super::tcp_backend()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_never_ends_is_bounded() {
    bounded(
        "a stream that never ends",
        a_stream_that_never_ends_is_bounded_on(&super::tcp_backend()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_loses_its_stream() {
    bounded(
        "a client that stops reading",
        a_client_that_stops_reading_loses_its_stream_on(&super::tcp_backend()),
    )
    .await;
}
