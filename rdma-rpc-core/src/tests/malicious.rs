//! Malicious servers: a server that speaks the protocol but lies, against the client. Every
//! lie ends the call it concerns with a status (never a hang, a panic, or memory the server
//! chose the size of), and the client's memory is never exposed beyond what the call offered.

use bytes::Bytes;

use super::e2e::{inbound, outbound, BLOB_READ, BLOB_WRITE, MSG_SEND};
use super::service::TestResponse;
use super::{bounded, tcp_backend, Backend};
use crate::protocol::channel::FrameChannel;
use crate::protocol::frames::{
    DescriptorFrame, GrantFrame, Hello, Kind, RequestFrame, ResponseFrame, StatusFrame,
};
use crate::protocol::PROTOCOL_VERSION;
use crate::transport::{Listener, SendData};
use crate::{Access, Client, Code, Status};

/// A server that speaks frames by hand, to misbehave on purpose.
pub(super) struct RawServer {
    backend: Backend,
    listener: Box<dyn Listener>,
}

/// The HelloAck an honest server sends: grant mode, no write slots.
pub(super) fn honest_ack() -> Hello {
    Hello {
        version: PROTOCOL_VERSION,
        max_frame: 16 * 1024,
        credits: 16,
        max_credits: 16,
        max_in_flight: 16,
        inline_threshold: 8 * 1024,
        slots: Vec::new(),
        pull_writes: false,
        token: 1,
        stream_window: 256 << 10,
    }
}

impl RawServer {
    pub(super) async fn start(backend: &Backend) -> RawServer {
        let listener = backend.transport.listen(&backend.bind).await.unwrap();
        RawServer {
            backend: backend.clone(),
            listener,
        }
    }

    /// A client of this server, connected once `accept` answered its handshake.
    pub(super) async fn client(&self, ack: Hello) -> (Client, FrameChannel) {
        let addr = self.listener.local_addr();
        // One connection per client: these tests are about what that connection does.
        let connect = Client::builder()
            .transport(self.backend.transport.clone())
            .reconnect(false)
            .connect(&addr);
        let (client, channel) = tokio::join!(connect, self.accept(ack));
        (client.expect("connect"), channel)
    }

    /// Accepts one connection and answers its Hello with `ack`.
    async fn accept(&self, ack: Hello) -> FrameChannel {
        let conn = self.listener.accept().await.unwrap();
        let channel = FrameChannel::new(conn, 16, 16 * 1024, false).unwrap();
        let hello = match channel.recv().await.unwrap().kind {
            Some(Kind::Hello(hello)) => hello,
            other => panic!("expected a Hello, got {other:?}"),
        };
        channel.set_peer(
            hello.credits,
            hello.credits.max(hello.max_credits),
            hello.max_frame,
        );
        channel.send_priority(Kind::HelloAck(ack)).await.unwrap();
        channel
    }
}

/// Sends a frame to the client, reading its credit updates meanwhile (its receives grow
/// only as frames reach it); any other frame arriving then is a test failure.
pub(super) async fn send(channel: &FrameChannel, kind: Kind) {
    channel
        .send_reading(kind, |other| panic!("unexpected {other:?} while sending"))
        .await
        .unwrap();
}

/// The error a call ended with (it must end, and with an error).
async fn failure<T: std::fmt::Debug>(
    what: &str,
    call: tokio::task::JoinHandle<Result<T, Status>>,
) -> Status {
    bounded(what, call).await.unwrap().unwrap_err()
}

/// `err` has `code` and names `words`.
fn assert_status(err: &Status, code: Code, words: &str) {
    assert_eq!(err.code(), code, "{err}");
    assert!(err.message().contains(words), "{err}");
}

/// The next request the client sends.
pub(super) async fn request(channel: &FrameChannel) -> RequestFrame {
    loop {
        match channel.recv().await.unwrap().kind {
            Some(Kind::Request(r)) => return r,
            None => continue,
            other => panic!("expected a request, got {other:?}"),
        }
    }
}

fn response(id: u64) -> ResponseFrame {
    ResponseFrame {
        id,
        metadata: Bytes::from(prost::Message::encode_to_vec(&TestResponse {
            len: 0,
            exact: true,
            ..Default::default()
        })),
        ..Default::default()
    }
}

/// A grant for a window the server never registered: the client's write fails, and the call
/// ends with `UNAVAILABLE` (the transport puts the connection in error, as RDMA would).
pub(crate) async fn a_forged_window_ends_the_call_with_a_status_on(b: &Backend) {
    let server = RawServer::start(b).await;
    let (client, channel) = server.client(honest_ack()).await;
    let call = tokio::spawn(async move { inbound(&client, BLOB_WRITE, 100_000, 1).await });
    let r = request(&channel).await;
    let forged = DescriptorFrame {
        addr: 0x10_000,
        len: 100_000,
        rkey: 0xdead_beef,
        access: Access::REMOTE_WRITE.bits(),
        blob: Bytes::new(),
    };
    channel
        .send(Kind::Grant(GrantFrame {
            id: r.id,
            window: Some(forged),
            need_buffer: 0,
        }))
        .await
        .unwrap();
    let err = failure("a call given a forged window", call).await;
    assert_eq!(err.code(), Code::Unavailable, "{err}");
}

#[tokio::test]
async fn a_forged_window_ends_the_call_with_a_status() {
    a_forged_window_ends_the_call_with_a_status_on(&tcp_backend()).await;
}

/// Grants call `id` a real window of `len` bytes with `access` over zeroed memory of
/// `capacity` bytes (a write into it would succeed if the client tried), and checks that the
/// call fails with `INTERNAL` naming `words` and that the client wrote nothing into it.
async fn refused_grant(
    channel: &FrameChannel,
    call: tokio::task::JoinHandle<Result<TestResponse, Status>>,
    id: u64,
    (len, access, capacity): (usize, Access, usize),
    words: &str,
) {
    let target = crate::RegisteredBuf::new(capacity, Access::ALL).unwrap();
    let grant = channel.conn().grant(target, 0, len, access).unwrap();
    channel
        .send(Kind::Grant(GrantFrame {
            id,
            window: Some(grant.descriptor().into()),
            need_buffer: 0,
        }))
        .await
        .unwrap();
    let err = failure("a call given a window it must refuse", call).await;
    assert_status(&err, Code::Internal, words);
    let mut target = grant.revoke().await.unwrap();
    target.set_len(capacity);
    assert!(
        target.as_slice().iter().all(|&b| b == 0),
        "the client wrote into a window it had to refuse"
    );
}

/// A grant whose window does not fit the payload (wrong length, or no write right) is a
/// protocol violation: the client writes nothing into it.
#[tokio::test]
async fn a_window_that_does_not_fit_the_payload_is_refused() {
    let server = RawServer::start(&tcp_backend()).await;
    for (len, access) in [
        (99_999, Access::REMOTE_WRITE),
        (100_001, Access::REMOTE_WRITE),
        (100_000, Access::REMOTE_READ),
    ] {
        let (client, channel) = server.client(honest_ack()).await;
        let call = tokio::spawn(async move { inbound(&client, BLOB_WRITE, 100_000, 1).await });
        let r = request(&channel).await;
        refused_grant(&channel, call, r.id, (len, access, 100_001), "does not fit").await;
    }
}

/// A grant for a payload the request carried inline is a protocol violation: the call ends,
/// and the client writes nothing into the window (it no longer holds the bytes, and a server
/// that has them needs no window).
#[tokio::test]
async fn a_grant_for_a_payload_sent_inline_is_refused() {
    let server = RawServer::start(&tcp_backend()).await;
    let (client, channel) = server.client(honest_ack()).await;
    let call = tokio::spawn(async move { inbound(&client, MSG_SEND, 100, 1).await });
    let r = request(&channel).await;
    assert_eq!(
        r.inline_payload.as_ref().map(Bytes::len),
        Some(100),
        "the payload went inline"
    );
    let window = (100, Access::REMOTE_WRITE, 100);
    refused_grant(&channel, call, r.id, window, "payload sent inline").await;
}

/// A server that asks for a result window larger than the endpoint's buffer is refused before
/// the client allocates anything for it.
pub(crate) async fn a_result_window_larger_than_the_endpoint_is_refused_on(b: &Backend) {
    let server = RawServer::start(b).await;
    let (client, channel) = server.client(honest_ack()).await;
    let call = tokio::spawn(async move { outbound(&client, BLOB_READ, 100_000, 1).await });
    let r = request(&channel).await;
    channel
        .send(Kind::Grant(GrantFrame {
            id: r.id,
            window: None,
            need_buffer: 1 << 40,
        }))
        .await
        .unwrap();
    let err = failure("a call asked for a 1 TiB window", call).await;
    assert_status(&err, Code::Internal, "larger than the endpoint");
}

#[tokio::test]
async fn a_result_window_larger_than_the_endpoint_is_refused() {
    a_result_window_larger_than_the_endpoint_is_refused_on(&tcp_backend()).await;
}

/// A response announcing more pushed bytes than the window the client offered holds is a
/// protocol violation: the client never hands out bytes outside that window.
pub(crate) async fn a_pushed_length_outside_the_window_is_refused_on(b: &Backend) {
    let server = RawServer::start(b).await;
    let (client, channel) = server.client(honest_ack()).await;
    for pushed_len in [1 << 20, 1 << 40] {
        let c = client.clone();
        let call = tokio::spawn(async move { outbound(&c, BLOB_READ, 100_000, 1).await });
        let r = request(&channel).await;
        let mut frame = response(r.id);
        frame.pushed_len = pushed_len;
        send(&channel, Kind::Response(frame)).await;
        let err = failure("a call told of bytes outside its window", call).await;
        assert_status(&err, Code::Internal, "outside the window");
    }
}

#[tokio::test]
async fn a_pushed_length_outside_the_window_is_refused() {
    a_pushed_length_outside_the_window_is_refused_on(&tcp_backend()).await;
}

/// Responses to calls the client never made, or already finished, are ignored: the call in
/// flight gets its own response.
pub(crate) async fn responses_to_unknown_calls_are_ignored_on(b: &Backend) {
    let server = RawServer::start(b).await;
    let (client, channel) = server.client(honest_ack()).await;
    let c = client.clone();
    let call = tokio::spawn(async move { inbound(&c, MSG_SEND, 100, 1).await });
    let r = request(&channel).await;
    for id in [r.id + 1000, u64::MAX, 0] {
        let mut lie = response(id);
        lie.status = Some(StatusFrame::from(&Status::internal("a lie")));
        send(&channel, Kind::Response(lie)).await;
    }
    send(&channel, Kind::Response(response(r.id))).await;
    // Twice: the second answers a call that is over.
    send(&channel, Kind::Response(response(r.id))).await;
    let resp = bounded("a call among lies", call).await.unwrap();
    assert!(resp.unwrap().exact);
    // The connection still serves.
    let c = client.clone();
    let next = tokio::spawn(async move { inbound(&c, MSG_SEND, 100, 2).await });
    let r2 = request(&channel).await;
    assert_ne!(r2.id, r.id);
    send(&channel, Kind::Response(response(r2.id))).await;
    assert!(bounded("the next call", next).await.unwrap().unwrap().exact);
}

#[tokio::test]
async fn responses_to_unknown_calls_are_ignored() {
    responses_to_unknown_calls_are_ignored_on(&tcp_backend()).await;
}

/// Frames only a client sends, and bytes that are no frame, end the connection with a status
/// for every call in flight; later calls fail at once.
pub(crate) async fn frames_a_server_must_not_send_end_the_connection_on(b: &Backend) {
    let server = RawServer::start(b).await;
    for garbage in [false, true] {
        let (client, channel) = server.client(honest_ack()).await;
        let c = client.clone();
        let call = tokio::spawn(async move { inbound(&c, MSG_SEND, 100, 1).await });
        let r = request(&channel).await;
        if garbage {
            channel
                .conn()
                .send(SendData::Bytes(Bytes::from_static(&[0xff; 40])), None)
                .await
                .unwrap();
        } else {
            send(&channel, Kind::Request(r.clone())).await;
        }
        let err = failure("a call on a connection the server broke", call).await;
        assert!(
            matches!(err.code(), Code::Internal | Code::Unavailable),
            "{err}"
        );
        let later = bounded(
            "a call after the violation",
            inbound(&client, MSG_SEND, 100, 2),
        )
        .await
        .unwrap_err();
        assert!(
            matches!(later.code(), Code::Internal | Code::Unavailable),
            "{later}"
        );
    }
}

/// A server that says goodbye and closes at once: the calls in flight end with its reason,
/// never with a bare "connection lost" (the Goaway reached the client before the close, so
/// the client reads it even though the connection is over when it re-posts the receive).
pub(crate) async fn a_goaway_right_before_the_close_is_read_on(b: &Backend) {
    let server = RawServer::start(b).await;
    let (client, channel) = server.client(honest_ack()).await;
    let c = client.clone();
    let call = tokio::spawn(async move { inbound(&c, MSG_SEND, 100, 1).await });
    request(&channel).await;
    let goaway = Kind::Goaway(StatusFrame::from(&Status::unavailable(
        "down for maintenance",
    )));
    let delivered = channel
        .try_send_last(goaway)
        .expect("a credit for the goaway");
    delivered.await.unwrap();
    channel.conn().close();
    let err = failure("the call after a goaway", call).await;
    assert_status(&err, Code::Unavailable, "down for maintenance");
}

#[tokio::test]
async fn a_goaway_right_before_the_close_is_read() {
    a_goaway_right_before_the_close_is_read_on(&tcp_backend()).await;
}

#[tokio::test]
async fn frames_a_server_must_not_send_end_the_connection() {
    frames_a_server_must_not_send_end_the_connection_on(&tcp_backend()).await;
}

/// A handshake the client could never use (no receives for its frames, frames too small to
/// hold a request) is refused when it connects, naming what is wrong, instead of leaving
/// every call waiting.
pub(crate) async fn an_unusable_handshake_is_refused_on(b: &Backend) {
    let server = RawServer::start(b).await;
    for (ack, what) in [
        (
            Hello {
                credits: 0,
                ..honest_ack()
            },
            "credits",
        ),
        (
            Hello {
                max_frame: 16,
                ..honest_ack()
            },
            "max_frame",
        ),
        (
            Hello {
                stream_window: 1000,
                ..honest_ack()
            },
            "stream window",
        ),
    ] {
        let addr = server.listener.local_addr();
        let connect = Client::builder()
            .transport(server.backend.transport.clone())
            .connect(&addr);
        let (client, _channel) = tokio::join!(connect, server.accept(ack));
        let err = client.map(drop).unwrap_err().to_string();
        assert!(err.contains(what), "{err}");
    }
}

#[tokio::test]
async fn an_unusable_handshake_is_refused() {
    an_unusable_handshake_is_refused_on(&tcp_backend()).await;
}

/// A server that never answers cannot hold a call with a deadline: it ends with
/// `DEADLINE_EXCEEDED`, and the client's in-flight window is given back only when the server
/// answers (so client and server agree on what is in flight), never before.
pub(crate) async fn a_silent_server_is_bounded_by_the_deadline_on(b: &Backend) {
    let server = RawServer::start(b).await;
    let (client, channel) = server.client(honest_ack()).await;
    let c = client.clone();
    let call = tokio::spawn(async move {
        let data = Bytes::from(super::pattern(100, 1));
        let request = crate::Request::new(super::e2e::req(100, 1))
            .with_timeout(std::time::Duration::from_millis(50));
        crate::codegen::call_inbound::<_, TestResponse>(
            &c,
            &super::service::ENDPOINTS[MSG_SEND],
            request,
            data,
        )
        .await
    });
    let r = request(&channel).await;
    let err = failure("a call to a silent server", call).await;
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    // The client tells the server it stopped waiting.
    match channel.recv().await.unwrap().kind {
        Some(Kind::Cancel(c)) => assert_eq!(c.id, r.id),
        other => panic!("expected a cancel, got {other:?}"),
    }
}

#[tokio::test]
async fn a_silent_server_is_bounded_by_the_deadline() {
    a_silent_server_is_bounded_by_the_deadline_on(&tcp_backend()).await;
}

/// A server keeps the descriptor of a pull window after the call. Over the software
/// transport the window is revoked; over DOCA (which cannot revoke a window) it stays
/// readable, but the client's staging memory belongs to one connection: another connection's
/// payload never appears in it, so the server reads nothing it was not sent.
pub(crate) async fn a_kept_pull_window_never_shows_another_connections_data_on(b: &Backend) {
    let server = RawServer::start(b).await;
    let pull = Hello {
        pull_writes: true,
        ..honest_ack()
    };
    let (first, first_channel) = server.client(pull.clone()).await;
    let (second, second_channel) = server.client(pull).await;
    let len = 100_000;
    let mut kept = None;
    for (client, channel, seed) in [(first, &first_channel, 1), (second, &second_channel, 2)] {
        let call = tokio::spawn(async move { inbound(&client, BLOB_WRITE, len, seed).await });
        let r = request(channel).await;
        let source: crate::transport::Descriptor = r.source.expect("a pull window").into();
        let buf = crate::RegisteredBuf::new(len, Access::LOCAL_WRITE).unwrap();
        let got = channel.conn().read(&source, buf).await.unwrap();
        assert_eq!(got.as_slice(), &super::pattern(len, seed)[..]);
        send(channel, Kind::Response(response(r.id))).await;
        assert!(bounded("a pulled call", call).await.unwrap().unwrap().exact);
        kept.get_or_insert(source);
    }
    // The first connection's window, read again after the second connection's call.
    let again = crate::RegisteredBuf::new(len, Access::LOCAL_WRITE).unwrap();
    if let Ok(bytes) = first_channel.conn().read(&kept.unwrap(), again).await {
        assert!(
            bytes.as_slice() != &super::pattern(len, 2)[..],
            "a kept window showed another connection's payload"
        );
    }
}

#[tokio::test]
async fn a_kept_pull_window_never_shows_another_connections_data() {
    a_kept_pull_window_never_shows_another_connections_data_on(&tcp_backend()).await;
}
