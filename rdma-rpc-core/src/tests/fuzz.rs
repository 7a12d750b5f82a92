//! Structure-aware fuzzing of frame decoding, on stable Rust (property-based): arbitrary
//! bytes never panic the decoder, mutated valid frames decode or are refused, and a server fed
//! arbitrary frames by one client closes that connection and keeps serving the others. CI
//! runs the default number of cases; a longer run:
//! `PROPTEST_CASES=20000 cargo test --release -p rdma-rpc-core tests::fuzz`.

use bytes::Bytes;
use proptest::prelude::*;
use prost::Message;

use super::raw::RawClient;
use super::{tcp, Harness};
use crate::protocol::frames::{DescriptorFrame, Frame, Kind, RequestFrame};

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
                source: source.map(|(addr, len, rkey, access)| DescriptorFrame {
                    addr,
                    len,
                    rkey,
                    access,
                    blob: Bytes::new(),
                }),
                timeout_us,
                ..Default::default()
            },
        )
}

/// Encoded request frames with a few bytes replaced, inserted or removed.
fn mutated_frame() -> impl Strategy<Value = Vec<u8>> {
    (
        request(),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 0..4),
    )
        .prop_map(|(request, edits)| {
            let mut bytes = Frame {
                kind: Some(Kind::Request(request)),
                credits: 0,
            }
            .encode_to_vec();
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

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_the_frame_decoder(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = Frame::decode(bytes.as_slice());
    }

    #[test]
    fn request_frames_round_trip(request in request()) {
        let frame = Frame { kind: Some(Kind::Request(request)), credits: 7 };
        let decoded = Frame::decode(frame.encode_to_vec().as_slice()).unwrap();
        prop_assert_eq!(decoded, frame);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever one client sends after its handshake (well-formed requests with odd fields,
    /// or frames with bytes changed), the server answers or closes that connection, and a
    /// well-behaved client is still served.
    #[test]
    fn a_server_fed_arbitrary_frames_keeps_serving(frames in prop::collection::vec(mutated_frame(), 1..6)) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let h = Harness::start(tcp(), crate::ServerConfig::default()).await;
            let raw = RawClient::connect(&h).await;
            for frame in frames {
                if raw
                    .conn()
                    .send(crate::transport::SendData::Bytes(Bytes::from(frame)), None)
                    .await
                    .is_err()
                {
                    break;
                }
            }
            let client = h.client().await;
            let ok = super::bounded(
                "a well-behaved client after a fuzzed one",
                super::e2e::inbound(&client, super::e2e::MSG_SEND, 100, 1),
            )
            .await
            .unwrap();
            assert!(ok.exact);
        });
    }
}
