//! What a client's session carries beyond single calls: metadata and interceptors on both
//! ends, pings, and reconnection after the server restarts.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::e2e::{inbound, MSG_SEND};
use super::{bounded, tcp_backend, Backend, Harness};
use crate::codegen::call_inbound;
use crate::interceptor::{IncomingCall, OutgoingCall};
use crate::tests::e2e::req;
use crate::tests::service::{TestResponse, ENDPOINTS};
use crate::{Bytes, Client, ClientConfig, Code, Request, ServerConfig, Status};

/// A client of `h` with `config` and the builder changes of `build`.
async fn client_built(
    h: &Harness,
    config: ClientConfig,
    build: impl FnOnce(crate::ClientBuilder) -> crate::ClientBuilder,
) -> Client {
    build(Client::builder().config(config))
        .transport(h.transport.clone())
        .connect(&h.addr)
        .await
        .expect("connect")
}

async fn send_with(
    client: &Client,
    request: Request<super::service::TestRequest>,
) -> Result<TestResponse, Status> {
    call_inbound(
        client,
        &ENDPOINTS[MSG_SEND],
        request,
        Bytes::from_static(b"hi"),
    )
    .await
}

pub(crate) async fn metadata_and_interceptors_reach_the_handler_on(b: &Backend) {
    let h = Harness::start_built(b, ServerConfig::default(), |builder| {
        builder.interceptor(|call: &mut IncomingCall<'_>| {
            match call.metadata().get_str("authorization") {
                Some("Bearer good") => {
                    let who = format!("user-of-{}", call.endpoint().path);
                    call.metadata_mut().insert("x-user", who);
                    Ok(())
                }
                _ => Err(Status::new(Code::Unauthenticated, "no valid token")),
            }
        })
    })
    .await;
    let client = client_built(&h, ClientConfig::default(), |builder| {
        builder.interceptor(|call: &mut OutgoingCall<'_>| {
            call.metadata_mut().insert("x-trace-id", "4bf92f35");
            Ok(())
        })
    })
    .await;

    // The token the caller set and the trace id the client's interceptor added reach the
    // handler, with what the server's interceptor added.
    let mut request = Request::new(req(2, 0));
    request
        .metadata_mut()
        .insert("authorization", "Bearer good");
    request
        .metadata_mut()
        .insert("x-blob", Bytes::from_static(&[0, 255, 7]));
    let resp = send_with(&client, request).await.expect("authorized call");
    assert_eq!(resp.len, 2);
    let seen = h.service.metadata_seen.lock().unwrap().pop().expect("seen");
    assert_eq!(seen.get_str("authorization"), Some("Bearer good"));
    assert_eq!(seen.get_str("x-trace-id"), Some("4bf92f35"));
    assert_eq!(seen.get("x-blob").map(|v| &v[..]), Some(&[0u8, 255, 7][..]));
    assert_eq!(seen.get_str("x-user"), Some("user-of-/msg"));

    // Without the token the server's interceptor refuses: the handler never runs.
    let runs = h.service.inbound_runs.load(Ordering::SeqCst);
    let err = send_with(&client, Request::new(req(2, 0)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err}");
    assert_eq!(err.message(), "no valid token");
    assert_eq!(h.service.inbound_runs.load(Ordering::SeqCst), runs);

    // A bad key fails on the client, before anything is sent.
    let mut request = Request::new(req(2, 0));
    request
        .metadata_mut()
        .insert("Authorization", "Bearer good");
    let err = send_with(&client, request).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    assert!(err.message().contains("`Authorization`"), "{err}");

    // A client interceptor's refusal ends the call before it leaves.
    let refusing = client_built(&h, ClientConfig::default(), |builder| {
        builder.interceptor(|call: &mut OutgoingCall<'_>| {
            Err(Status::failed_precondition(format!(
                "{} is not allowed here",
                call.endpoint().path
            )))
        })
    })
    .await;
    let err = send_with(&refusing, Request::new(req(2, 0)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert_eq!(h.service.inbound_runs.load(Ordering::SeqCst), runs);
    assert_eq!(refusing.stats().calls, 0, "nothing was sent");

    // The server serves on.
    let mut request = Request::new(req(2, 0));
    request
        .metadata_mut()
        .insert("authorization", "Bearer good");
    send_with(&client, request).await.expect("served on");
}

pub(crate) async fn ping_measures_round_trips_without_a_handler_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    let client = h.client().await;
    for _ in 0..3 {
        let rtt = client.ping().await.expect("ping");
        assert!(rtt > Duration::ZERO);
    }
    let runs = h.service.inbound_runs.load(Ordering::SeqCst)
        + h.service.outbound_runs.load(Ordering::SeqCst);
    assert_eq!(runs, 0, "pings run no handler");
    // Pings and calls share the connection.
    let (ping, call) = tokio::join!(client.ping(), inbound(&client, MSG_SEND, 10, 1));
    ping.expect("ping beside a call");
    assert!(call.expect("call beside a ping").exact);
    client.close();
    let err = client.ping().await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
}

/// A client that reconnects without waiting between attempts.
fn eager() -> ClientConfig {
    ClientConfig {
        reconnect_backoff: Duration::ZERO,
        ..ClientConfig::default()
    }
}

/// Stops `h` and waits until its server is gone.
async fn stop(mut h: Harness) -> Backend {
    let backend = Backend {
        transport: h.transport.clone(),
        bind: h.addr.clone(),
    };
    h.shutdown();
    let _ = (&mut h.task).await;
    backend
}

pub(crate) async fn a_client_survives_a_server_restart_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    let client = h.client_with(eager()).await;
    assert!(inbound(&client, MSG_SEND, 10, 1).await.unwrap().exact);
    let same_addr = stop(h).await;
    // The server said goodbye and closed: the client learns it with its next call at the
    // latest, which fails (the server is gone) or finds it already known and dials again.
    let h = Harness::default_on(&same_addr).await;
    let mut failures = 0;
    let resp = loop {
        match inbound(&client, MSG_SEND, 10, 2).await {
            Ok(resp) => break resp,
            Err(e) => {
                assert_eq!(e.code(), Code::Unavailable, "{e}");
                failures += 1;
                assert!(failures <= 1, "a second failure after the restart: {e}");
            }
        }
    };
    assert!(resp.exact);
    assert!(!client.is_closed());
    assert_eq!(h.count.current(), 1, "one connection to the new server");
    assert!(client.ping().await.is_ok());
    // Counters go on across the reconnection (a call that failed got no response).
    assert_eq!(client.stats().calls, 2);
}

pub(crate) async fn a_client_without_reconnection_stays_closed_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    let mut config = eager();
    config.reconnect = false;
    let client = h.client_with(config).await;
    inbound(&client, MSG_SEND, 10, 1).await.unwrap();
    let same_addr = stop(h).await;
    let h = Harness::default_on(&same_addr).await;
    // One failure may find the connection not yet known lost; after it, every call fails.
    let _ = inbound(&client, MSG_SEND, 10, 2).await;
    assert!(client.is_closed());
    let err = inbound(&client, MSG_SEND, 10, 3).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert_eq!(h.count.current(), 0, "no connection to the new server");

    // `close` is for good, also with reconnection on.
    let client = h.client_with(eager()).await;
    client.close();
    assert!(client.is_closed());
    let err = inbound(&client, MSG_SEND, 10, 4).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.message().contains("closed by this client"), "{err}");
}

pub(crate) async fn failed_reconnections_back_off_and_say_why_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    let config = ClientConfig {
        reconnect_backoff: config_backoff(),
        connect_timeout: Duration::from_secs(5),
        ..ClientConfig::default()
    };
    let client = h.client_with(config).await;
    inbound(&client, MSG_SEND, 10, 1).await.unwrap();
    let _gone = stop(h).await;
    // Until a call fails on the lost connection, calls may still find it open.
    let mut first = inbound(&client, MSG_SEND, 10, 2).await.unwrap_err();
    if !first.message().contains("reconnecting") {
        assert!(client.is_closed(), "{first}");
        first = inbound(&client, MSG_SEND, 10, 3).await.unwrap_err();
    }
    // One attempt, which fails: nobody listens.
    assert_eq!(first.code(), Code::Unavailable, "{first}");
    assert!(
        first.message().contains("reconnecting to") && first.message().contains("failed"),
        "{first}"
    );
    // During the backoff calls fail at once, saying why, with the same message as the
    // attempt's (no countdown in it: errors group), and the wait apart.
    let next = inbound(&client, MSG_SEND, 10, 4).await.unwrap_err();
    let again = inbound(&client, MSG_SEND, 10, 5).await.unwrap_err();
    assert_eq!(next.code(), Code::Unavailable, "{next}");
    assert!(
        next.message().contains("waiting before the next attempt"),
        "{next}"
    );
    assert_eq!(next.message(), first.message());
    assert_eq!(again.message(), next.message());
    for status in [&first, &next, &again] {
        let wait = status
            .retry_after()
            .expect("the wait, apart from the message");
        assert!(wait <= config_backoff(), "{wait:?}");
    }
}

/// The backoff of [`failed_reconnections_back_off_and_say_why_on`].
fn config_backoff() -> Duration {
    Duration::from_secs(3600)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_and_interceptors_reach_the_handler() {
    bounded(
        "metadata",
        metadata_and_interceptors_reach_the_handler_on(&tcp_backend()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_measures_round_trips_without_a_handler() {
    bounded(
        "ping",
        ping_measures_round_trips_without_a_handler_on(&tcp_backend()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_survives_a_server_restart() {
    bounded(
        "restart",
        a_client_survives_a_server_restart_on(&tcp_backend()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_reconnection_stays_closed() {
    bounded(
        "no reconnection",
        a_client_without_reconnection_stays_closed_on(&tcp_backend()),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_reconnections_back_off_and_say_why() {
    bounded(
        "backoff",
        failed_reconnections_back_off_and_say_why_on(&tcp_backend()),
    )
    .await;
}
