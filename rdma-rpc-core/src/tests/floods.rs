//! Floods: a peer that repeats what costs the server something (pings, refused calls with
//! hostile bytes) gets a bounded answer, and other connections are served on. The log flood
//! itself (100,000 refused calls) is `tests/log_flood.rs`, a test binary of its own.

use std::io::Write;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::hostile::still_serving;
use super::raw::RawClient;
use super::{bounded, tcp_backend, Harness};
use crate::metadata::MAX_KEY_LEN;
use crate::protocol::frames::{CallId, Kind, MetadataEntry, RequestFrame};
use crate::service::OpKind;
use crate::{Code, ServerConfig};

/// A client that pings without waiting for the answers loses its connection once it passes
/// `max_pings_per_second`, told why; it got at most that many pongs in the window, and the
/// server serves other connections on (pings included).
#[tokio::test]
async fn a_ping_flood_loses_its_connection_and_others_are_served() {
    const LIMIT: u32 = 5;
    let config = ServerConfig {
        max_pings_per_second: LIMIT,
        ..ServerConfig::default()
    };
    let h = Harness::start_on(&tcp_backend(), config).await;
    let raw = RawClient::connect(&h).await;
    let mut sent = 0u32;
    while sent < 10 * LIMIT && raw.try_send(Kind::Ping(CallId { id: sent.into() })).await {
        sent += 1;
    }
    let (mut pongs, mut goaway) = (0u32, None);
    while let Some(kind) = bounded("the server's answers", raw.try_next()).await {
        match kind {
            Kind::Pong(_) => pongs += 1,
            Kind::Goaway(status) => goaway = Some(status),
            other => panic!("unexpected {other:?}"),
        }
    }
    let status = goaway.expect("the server said why it closed the connection");
    assert_eq!(Code::from_u32(status.code), Code::ResourceExhausted);
    assert!(
        status.message.contains("max_pings_per_second"),
        "{}",
        status.message
    );
    // Each one-second window answers at most LIMIT: the flood was cut well before its end.
    assert!(
        pongs >= LIMIT && pongs < sent,
        "{pongs} pongs of {sent} pings"
    );
    // Pings within the limit, and calls, are served on other connections.
    let client = h.client().await;
    for _ in 0..LIMIT {
        client.ping().await.expect("a ping within the limit");
    }
    still_serving(&h).await;
}

/// What a log subscriber wrote, to read back.
#[derive(Clone, Default)]
struct Written(Arc<Mutex<Vec<u8>>>);

impl Write for Written {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A metadata key of 128 control characters (which the server echoed escaped before, about 5
/// times its length) is refused with a log line of bounded length that never repeats it
/// escaped. The subscriber is this thread's; the test's runtime (current-thread) runs the
/// server's connection on it.
#[tokio::test]
async fn a_key_of_control_characters_makes_a_short_log_line() {
    let written = Written::default();
    let writer = written.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let h = Harness::start_on(&tcp_backend(), ServerConfig::default()).await;
    let raw = RawClient::connect(&h).await;
    let key: String = (0..MAX_KEY_LEN)
        .map(|i| char::from(1 + (i % 31) as u8))
        .collect();
    raw.send_request(RequestFrame {
        id: 1,
        path: Bytes::from_static(b"/msg"),
        op: OpKind::Send.as_u32(),
        call_metadata: vec![MetadataEntry {
            key: key.clone().into(),
            value: Bytes::from_static(b"v"),
        }],
        ..Default::default()
    })
    .await;
    match raw.next().await {
        Kind::Response(r) => {
            let code = r.status.expect("refused").code;
            assert_eq!(Code::from_u32(code), Code::InvalidArgument);
        }
        other => panic!("expected a response, got {other:?}"),
    }
    let log = String::from_utf8(written.0.lock().unwrap().clone()).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("call refused") && l.contains("metadata key"))
        .unwrap_or_else(|| panic!("no refusal logged:\n{log}"));
    let escaped = format!("{key:?}");
    assert!(!line.contains("\\u{"), "{line}");
    assert!(line.len() < 400, "{} bytes: {line}", line.len());
    assert!(line.len() < escaped.len(), "{line}");
    assert_eq!(
        h.service
            .inbound_runs
            .load(std::sync::atomic::Ordering::SeqCst),
        0
    );
}
