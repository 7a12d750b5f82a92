//! Structure-aware fuzzing of our frame handling, on stable Rust (property-based).
//!
//! - Bytes of any kind, valid frames (fixed-layout and protobuf requests) with bytes changed,
//!   and frames our own encoder wrote (with the credits it appends) go through a connection
//!   into the frame channel of the tests' hand-written peers, which decodes as every
//!   connection does (`FrameChannel::recv`: `codec::Decoder`'s landing copy and decoding,
//!   credits, re-posting). Each arrives as exactly the frame its bytes hold, decoded on their
//!   own, or ends with a protocol error; never a panic, never more credits than the peer
//!   announced, and a frame already received is never changed by those landing after it (they
//!   share blocks, and a frame's last byte field is its block itself).
//! - End to end, a server fed such frames by one client, ending with bytes that are no frame,
//!   closes that connection with an error and keeps serving another client.
//!
//! CI runs the default number of cases; a longer run:
//! `PROPTEST_CASES=20000 cargo test --release -p rdma-rpc-core tests::fuzz`.

use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use prost::Message;

use super::e2e::{inbound, MSG_SEND};
use super::raw::RawClient;
use super::{bounded, tcp, Harness};
use crate::error::Error;
use crate::protocol::channel::FrameChannel;
use crate::protocol::codec::{frame_bytes, Decoder};
use crate::protocol::frames::{
    AckFrame, CallId, DescriptorFrame, Frame, Kind, RequestFrame, ResponseFrame, StatusFrame,
};
use crate::transport::mem::{MemConfig, MemTransport};
use crate::transport::SendData;

fn request() -> impl Strategy<Value = RequestFrame> {
    (
        any::<u64>(),
        "[ -~]{0,24}",
        any::<u32>(),
        prop::collection::vec(any::<u8>(), 0..64),
        any::<u64>(),
        prop::option::of(any::<u32>()),
        prop::option::of((any::<u64>(), any::<u64>(), any::<u32>(), any::<u32>())),
        any::<u64>(),
    )
        .prop_map(
            |(id, path, op, metadata, payload_len, slot, source, timeout_us)| RequestFrame {
                id,
                path: path.into(),
                op,
                metadata: Bytes::from(metadata),
                payload_len,
                slot,
                source: source.map(|(addr, len, rkey, access)| {
                    Box::new(DescriptorFrame {
                        addr,
                        len,
                        rkey,
                        access,
                        blob: Bytes::new(),
                    })
                }),
                timeout_us,
                ..Default::default()
            },
        )
}

/// Frames of several kinds, as a peer's frame channel would send them.
fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        request().prop_map(Kind::Request),
        (
            any::<u64>(),
            prop::option::of((any::<u32>(), "[ -~]{0,32}")),
            prop::collection::vec(any::<u8>(), 0..64),
            any::<u64>(),
        )
            .prop_map(|(id, status, metadata, pushed_len)| {
                Kind::Response(ResponseFrame {
                    id,
                    status: status.map(|(code, message)| StatusFrame { code, message }),
                    metadata: Bytes::from(metadata),
                    pushed_len,
                    ..Default::default()
                })
            }),
        any::<u64>().prop_map(|id| Kind::Ack(AckFrame { id, reply_to: None })),
        any::<u64>().prop_map(|id| Kind::Cancel(CallId { id })),
    ]
}

/// Encoded request frames, in the fixed layout a peer sends or as a protobuf field (which is
/// understood too), with a few bytes replaced, inserted or removed.
fn mutated_frame() -> impl Strategy<Value = Vec<u8>> {
    (
        request(),
        any::<bool>(),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 0..4),
    )
        .prop_map(|(request, fixed, edits)| {
            let kind = Kind::Request(request);
            let mut bytes = if fixed {
                frame_bytes(Some(&kind), 0, false).to_vec()
            } else {
                Frame {
                    kind: Some(kind),
                    credits: 0,
                    starved: false,
                }
                .encode_to_vec()
            };
            for (at, byte, how) in edits {
                if bytes.is_empty() {
                    break;
                }
                let i = at.index(bytes.len());
                match how {
                    0 => bytes[i] = byte,
                    1 => bytes.insert(i, byte),
                    _ => {
                        bytes.remove(i);
                    }
                }
            }
            bytes
        })
}

/// Bytes that are no frame at all.
fn not_a_frame() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 1..64).prop_filter("bytes that decode as a frame", |b| {
        Decoder::default().decode(b).is_err()
    })
}

/// What one side of a connection sends the other.
#[derive(Debug, Clone)]
enum Input {
    /// Bytes sent as they are, straight through the transport.
    Bytes(Vec<u8>),
    /// A frame sent by the peer's frame channel (our encoder, with the credits it owes).
    Frame(Box<Kind>),
}

fn input() -> impl Strategy<Value = Input> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256).prop_map(Input::Bytes),
        mutated_frame().prop_map(Input::Bytes),
        kind().prop_map(|kind| Input::Frame(Box::new(kind))),
    ]
}

/// Receives each side posts, and the most frames it believes the other may have in flight.
const RECEIVES: u32 = 16;
const MAX_FRAME: usize = 16 * 1024;

/// Sends every input from one frame channel to another, receiving each before the next is
/// sent, and checks what arrived.
async fn through_a_channel(inputs: Vec<Input>) {
    let transport = MemTransport::with_config(MemConfig {
        // Never reached: a side never waits for the other's receive here.
        rnr_timeout: Duration::from_secs(3600),
        ..MemConfig::default()
    });
    let (a, b) = crate::transport::conformance::pair_on(&transport, "mem://").await;
    let peer = FrameChannel::new(a, RECEIVES, MAX_FRAME, false).unwrap();
    peer.set_peer(RECEIVES, RECEIVES, MAX_FRAME as u32);
    let ours = FrameChannel::new(b, RECEIVES, MAX_FRAME, false).unwrap();
    ours.set_peer(RECEIVES, RECEIVES, MAX_FRAME as u32);
    let mut kept = Vec::new();
    for (i, input) in inputs.into_iter().enumerate() {
        match input {
            Input::Bytes(bytes) => {
                let sent = SendData::Bytes(Bytes::from(bytes.clone()));
                peer.conn().send(sent, None).await.unwrap();
                // What the bytes hold, decoded on their own (the codec's own tests hold it to
                // prost for every frame but the fixed ones).
                let expected = Decoder::default().decode(&bytes);
                match (ours.recv().await, expected) {
                    (Ok(got), Ok(expected)) => {
                        assert_eq!(got, expected, "input {i}: {bytes:?}");
                        kept.push((got, expected));
                    }
                    (Err(Error::Protocol { reason, .. }), Err(_)) => {
                        assert!(reason.contains("undecodable frame"), "input {i}: {reason}");
                    }
                    (got, expected) => {
                        panic!("input {i}: {bytes:?} arrived as {got:?}, holds {expected:?}")
                    }
                }
            }
            Input::Frame(kind) => {
                peer.send_reading((*kind).clone(), |_| {}).await.unwrap();
                let got = ours.recv().await.unwrap();
                assert_eq!(got.kind.as_ref(), Some(&*kind), "input {i}");
                let expected = got.clone();
                kept.push((got, expected));
            }
        }
        assert!(
            ours.available_credits() <= RECEIVES,
            "input {i}: {} credits, more than the {RECEIVES} receives the peer announced",
            ours.available_credits()
        );
    }
    // Frames are slices of blocks shared with those landing after them: none changed since.
    for (got, expected) in kept {
        assert_eq!(got, expected);
    }
}

proptest! {
    #[test]
    fn frames_arrive_as_their_bytes_say_or_end_with_a_protocol_error(
        inputs in prop::collection::vec(input(), 1..24)
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(bounded("frames through a channel", through_a_channel(inputs)));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever one client sends after its handshake (well-formed requests with odd fields,
    /// or frames with bytes changed), ending with bytes that are no frame: the server closes
    /// that connection with an error, and a client connected before it, and one connected
    /// after, are served.
    #[test]
    fn a_server_fed_arbitrary_frames_closes_that_connection_and_keeps_serving(
        frames in prop::collection::vec(mutated_frame(), 0..6),
        garbage in not_a_frame(),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let h = Harness::start(tcp(), crate::ServerConfig::default()).await;
            let before = h.client().await;
            assert!(inbound(&before, MSG_SEND, 100, 1).await.unwrap().exact);
            let raw = RawClient::connect(&h).await;
            for frame in frames.into_iter().chain([garbage]) {
                let sent = SendData::Bytes(Bytes::from(frame));
                if raw.conn().send(sent, None).await.is_err() {
                    break; // the server closed it already
                }
            }
            let err = bounded("the fuzzed connection closes", raw.conn().closed()).await;
            assert!(err.is_connection_fatal(), "{err}");
            let served = |client| async move {
                let call = inbound(&client, MSG_SEND, 100, 2);
                assert!(bounded("a call of a well-behaved client", call).await.unwrap().exact);
            };
            served(before).await;
            served(h.client().await).await;
        });
    }
}
