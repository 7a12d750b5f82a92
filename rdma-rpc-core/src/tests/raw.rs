//! A client that speaks frames by hand, for tests that misbehave on purpose.

use std::sync::Arc;

use bytes::Bytes;

use super::e2e::req;
use super::Harness;
use crate::protocol::channel::FrameChannel;
use crate::protocol::frames::{AckFrame, Hello, Kind, RequestFrame};
use crate::protocol::PROTOCOL_VERSION;
use crate::service::OpKind;
use crate::transport::{Connection, Descriptor};

/// A client that speaks frames by hand, to misbehave on purpose.
pub(crate) struct RawClient {
    pub(crate) channel: FrameChannel,
    pub(crate) ack: Hello,
    /// Frames read while waiting for a credit to send, for [`RawClient::next`].
    arrived: std::sync::Mutex<std::collections::VecDeque<Kind>>,
}

impl RawClient {
    pub(crate) async fn connect(h: &Harness) -> RawClient {
        let channel = Self::open(h).await;
        channel
            .send_priority(Kind::Hello(Self::hello()))
            .await
            .unwrap();
        let ack = match channel.recv().await.unwrap().kind {
            Some(Kind::HelloAck(ack)) => ack,
            other => panic!("no HelloAck: {other:?}"),
        };
        channel.set_peer(
            ack.credits - 1,
            ack.credits.max(ack.max_credits),
            ack.max_frame,
        );
        RawClient {
            channel,
            ack,
            arrived: Default::default(),
        }
    }

    /// Connects, then makes the server arm this connection's write slots the way a client's
    /// first payload too large to travel inline does (slots are registered only then); their
    /// windows end up in `ack.slots`, as if the handshake had brought them.
    pub(crate) async fn connect_with_slots(h: &Harness) -> RawClient {
        let mut raw = RawClient::connect(h).await;
        // Nothing travels inline for this client (its Hello's inline threshold is 0), so any
        // payload counts; a granted window is acked unwritten, a pull without a window is
        // refused: either way the response carries the slots.
        let id = u64::MAX - 1;
        raw.request(id, "/msg", OpKind::Send, 1).await;
        loop {
            match raw.next().await {
                Kind::Grant(g) if g.id == id => raw.ack(id).await,
                Kind::Response(r) if r.id == id => {
                    raw.ack.slots.extend(r.slots);
                    return raw;
                }
                other => panic!("expected a grant or a response, got {other:?}"),
            }
        }
    }

    /// A connection with its receives posted, before any frame.
    pub(crate) async fn open(h: &Harness) -> FrameChannel {
        let conn = h.transport.connect(&h.addr).await.unwrap();
        FrameChannel::new(conn, 16, 16 * 1024, true).unwrap()
    }

    /// The Hello a well-behaved client sends.
    pub(crate) fn hello() -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            max_frame: 16 * 1024,
            credits: 16,
            max_in_flight: 1000,
            inline_threshold: 0,
            stream_window: 256 << 10,
            ..Default::default()
        }
    }

    /// The window of write slot `index`, as announced in the handshake.
    pub(crate) fn slot(&self, index: u32) -> Descriptor {
        let slot = self.ack.slots.iter().find(|s| s.index == index).unwrap();
        slot.window.clone().unwrap().into()
    }

    pub(crate) async fn send_request(&self, request: RequestFrame) {
        self.send(Kind::Request(request)).await;
    }

    /// Sends a frame, reading what arrives meanwhile (the server's receives grow only as
    /// frames reach it, so its credits come back while this client waits).
    pub(crate) async fn send(&self, kind: Kind) {
        self.channel
            .send_reading(kind, |k| self.arrived.lock().unwrap().push_back(k))
            .await
            .unwrap();
    }

    /// [`send`](Self::send), for a peer the server may close on meanwhile: whether it was sent.
    pub(crate) async fn try_send(&self, kind: Kind) -> bool {
        self.channel
            .send_reading(kind, |k| self.arrived.lock().unwrap().push_back(k))
            .await
            .is_ok()
    }

    /// The next frame, or `None` once the server closed the connection.
    pub(crate) async fn try_next(&self) -> Option<Kind> {
        if let Some(kind) = self.arrived.lock().unwrap().pop_front() {
            return Some(kind);
        }
        loop {
            if let Some(kind) = self.channel.recv().await.ok()?.kind {
                return Some(kind);
            }
        }
    }

    pub(crate) fn conn(&self) -> &Arc<dyn Connection> {
        self.channel.conn()
    }

    pub(crate) async fn request(&self, id: u64, path: &str, op: OpKind, payload_len: u64) {
        let request = RequestFrame {
            id,
            path: Bytes::copy_from_slice(path.as_bytes()),
            op: op.as_u32(),
            metadata: Bytes::from(prost::Message::encode_to_vec(&req(payload_len as usize, 7))),
            payload_len,
            ..Default::default()
        };
        self.send(Kind::Request(request)).await;
    }

    pub(crate) async fn next(&self) -> Kind {
        if let Some(kind) = self.arrived.lock().unwrap().pop_front() {
            return kind;
        }
        loop {
            if let Some(kind) = self.channel.recv().await.unwrap().kind {
                return kind;
            }
        }
    }

    pub(crate) async fn grant(&self) -> Descriptor {
        match self.next().await {
            Kind::Grant(g) => g.window.expect("a window").into(),
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    pub(crate) async fn ack(&self, id: u64) {
        self.send(Kind::Ack(AckFrame { id, reply_to: None })).await;
    }
}
