//! The fast paths: write slots, pulled payloads, pushed results. Each is checked for exact
//! bytes and for the round trips it takes, over every transport.

use std::time::Duration;

use bytes::Bytes;

use super::e2e::{inbound, outbound, req, BLOB_READ, BLOB_WRITE, MSG_SEND};
use super::malicious::{honest_ack, request, send, RawServer};
use super::service::{TestRequest, TestResponse, ENDPOINTS};
use super::{bounded, pattern, tcp_backend, Backend, Harness};
use crate::codegen::{call_inbound, call_outbound};
use crate::protocol::channel::FrameChannel;
use crate::protocol::frames::{GrantFrame, Kind, ResponseFrame};
use crate::transport::SendData;
use crate::{Client, ClientStats, Code, Request, ServerConfig};

/// Runs `call` and returns the round trips it took.
async fn round_trips<F: std::future::Future<Output = ()>>(client: &Client, call: F) -> f64 {
    let before: ClientStats = client.stats();
    call.await;
    client.stats().round_trips_since(&before)
}

async fn write_exact(client: &Client, ep: usize, len: usize, seed: u32) {
    let resp = inbound(client, ep, len, seed).await.unwrap();
    assert!(resp.exact, "{len} bytes arrived altered");
}

async fn read_exact(client: &Client, len: usize, seed: u32) {
    let data = outbound(client, BLOB_READ, len, seed).await.unwrap();
    assert!(data == pattern(len, seed), "{len} bytes arrived altered");
}

/// Round trips of every path, with large writes pulled (`pull`) or granted.
pub(crate) async fn round_trips_per_path_on(b: &Backend, pull: bool) {
    let config = ServerConfig {
        pull_writes: Some(pull),
        ..ServerConfig::default()
    };
    let h = Harness::start_on(b, config).await;
    let client = h.client().await;

    // Inline: one round trip.
    assert_eq!(
        round_trips(&client, write_exact(&client, BLOB_WRITE, 100, 1)).await,
        1.0
    );
    // The first payload too large to travel inline finds no slot (a connection's slots are
    // registered when it first needs them): pulled by the server (1) or written into a
    // granted window (2). Its response brings the slots.
    let rts = round_trips(&client, write_exact(&client, BLOB_WRITE, 60_000, 99)).await;
    assert_eq!(rts, if pull { 1.0 } else { 2.0 }, "first large write");
    // Write slots: one round trip, also after more writes than the connection has slots
    // (each response arms the slot its call used again).
    for seed in 0..12 {
        let rts = round_trips(&client, write_exact(&client, BLOB_WRITE, 60_000, seed)).await;
        assert_eq!(rts, 1.0, "slot write {seed}");
    }
    // Larger than a slot: pulled by the server (1) or written into a granted window (2).
    let rts = round_trips(&client, write_exact(&client, MSG_SEND, 1 << 20, 3)).await;
    assert_eq!(rts, if pull { 1.0 } else { 2.0 });

    // Results: the first large one teaches the client its size (2), then it is pushed (1).
    assert_eq!(
        round_trips(&client, read_exact(&client, 1 << 20, 4)).await,
        2.0
    );
    assert_eq!(
        round_trips(&client, read_exact(&client, 1 << 20, 5)).await,
        1.0
    );
    // Smaller results fit the window offered; larger ones ask for a new one once.
    assert_eq!(
        round_trips(&client, read_exact(&client, 300_000, 6)).await,
        1.0
    );
    assert_eq!(
        round_trips(&client, read_exact(&client, 3 << 20, 7)).await,
        2.0
    );
    assert_eq!(
        round_trips(&client, read_exact(&client, 3 << 20, 8)).await,
        1.0
    );
    // A small result goes inline, and the window offered goes unused.
    assert_eq!(round_trips(&client, read_exact(&client, 10, 9)).await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_per_path_with_granted_writes() {
    round_trips_per_path_on(&tcp_backend(), false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_per_path_with_pulled_writes() {
    round_trips_per_path_on(&tcp_backend(), true).await;
}

/// With one slot and many writes at once, the calls that find no slot take the other path,
/// and the slot is armed again afterwards.
pub(crate) async fn calls_without_a_free_slot_take_the_other_path_on(b: &Backend) {
    let config = ServerConfig {
        write_slots: 1,
        ..ServerConfig::default()
    };
    let h = Harness::start_on(b, config).await;
    let client = h.client().await;
    let calls: Vec<_> = (0..16u32)
        .map(|seed| {
            let client = client.clone();
            tokio::spawn(async move { write_exact(&client, BLOB_WRITE, 50_000, seed).await })
        })
        .collect();
    for call in calls {
        bounded("write", call).await.unwrap();
    }
    assert_eq!(
        round_trips(&client, write_exact(&client, BLOB_WRITE, 50_000, 99)).await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_a_free_slot_take_the_other_path() {
    calls_without_a_free_slot_take_the_other_path_on(&tcp_backend()).await;
}

/// Write slots off, and results too large for the window they were offered: the slow paths
/// still move exact bytes.
pub(crate) async fn slots_off_and_growing_results_stay_exact_on(b: &Backend) {
    let config = ServerConfig {
        write_slots: 0,
        ..ServerConfig::default()
    };
    let h = Harness::start_on(b, config).await;
    let client = h.client().await;
    for (seed, len) in [20_000usize, 200_000, 2_000_000, 9000]
        .into_iter()
        .enumerate()
    {
        write_exact(&client, BLOB_WRITE, len, seed as u32).await;
        read_exact(&client, len, seed as u32).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_off_and_growing_results_stay_exact() {
    slots_off_and_growing_results_stay_exact_on(&tcp_backend()).await;
}

/// Serves the next request, a read of `len` bytes, as an honest server pushing the pattern of
/// `seed`: into the window the request offered, or, if it offered none that large, into the
/// one the client names when asked for it.
async fn serve_read(channel: &FrameChannel, len: usize, seed: u32) {
    let r = request(channel).await;
    let window = match r.reply_to {
        Some(window) if window.len >= len as u64 => *window,
        _ => {
            let ask = GrantFrame {
                id: r.id,
                window: None,
                need_buffer: len as u64,
            };
            send(channel, Kind::Grant(ask)).await;
            loop {
                match channel.recv().await.unwrap().kind {
                    Some(Kind::Ack(ack)) if ack.id == r.id => {
                        break ack.reply_to.expect("a window for the result")
                    }
                    None => continue,
                    other => panic!("expected the ack naming a window, got {other:?}"),
                }
            }
        }
    };
    let data = SendData::Bytes(Bytes::from(pattern(len, seed)));
    channel
        .conn()
        .write(data, &window.into(), None)
        .await
        .expect("a push into the offered window");
    send(channel, Kind::Response(pushed(r.id, len))).await;
}

/// The response to a read whose `len` bytes were pushed.
fn pushed(id: u64, len: usize) -> ResponseFrame {
    ResponseFrame {
        pushed_len: len as u64,
        ..received(id, len)
    }
}

/// A caller that gives up while the server still works on a large result: the window the
/// call offered stays open until the server's response, so the server's push neither fails
/// nor breaks the connection, and the next call works.
///
/// The server is played by hand, so that it pushes exactly when the test says: after the
/// caller has given up and its cancel has arrived (a real server stops the handler at the
/// deadline the request carries, and so pushes into an abandoned call's window only when
/// its push and the caller's cancel cross).
pub(crate) async fn abandoned_reads_keep_their_window_until_the_response_on(b: &Backend) {
    let server = RawServer::start(b).await;
    let (client, channel) = server.client(honest_ack()).await;
    let len = 1 << 20;
    // The client learns the size of the result: later calls offer a window that large.
    let first = {
        let client = client.clone();
        tokio::spawn(async move { outbound(&client, BLOB_READ, len, 1).await })
    };
    serve_read(&channel, len, 1).await;
    let data = bounded("the first read", first).await.unwrap().unwrap();
    assert!(data == pattern(len, 1), "the first read arrived altered");

    // The slow call offers its window, then its caller gives up.
    let slow = {
        let client = client.clone();
        tokio::spawn(async move {
            let request = Request::new(req(len, 2)).with_timeout(Duration::from_millis(50));
            call_outbound::<_, TestResponse>(&client, &ENDPOINTS[BLOB_READ], request).await
        })
    };
    let r = request(&channel).await;
    let window = r
        .reply_to
        .clone()
        .expect("the slow call offers a result window");
    assert!(window.len >= len as u64, "{window:?}");
    let err = bounded("the abandoned call", slow)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
    loop {
        match channel.recv().await.unwrap().kind {
            Some(Kind::Cancel(c)) => {
                assert_eq!(c.id, r.id);
                break;
            }
            None => continue,
            other => panic!("expected the cancel of the abandoned call, got {other:?}"),
        }
    }

    // Given up and said so: the window is still open, the push lands, and the response
    // follows it.
    let data = SendData::Bytes(Bytes::from(pattern(len, 2)));
    channel
        .conn()
        .write(data, &window.into(), None)
        .await
        .expect("the window of an abandoned call is open until its response");
    send(&channel, Kind::Response(pushed(r.id, len))).await;

    // The same connection serves the next call.
    let next = {
        let client = client.clone();
        tokio::spawn(async move { outbound(&client, BLOB_READ, len, 3).await })
    };
    serve_read(&channel, len, 3).await;
    let data = bounded("the next read", next).await.unwrap().unwrap();
    assert!(data == pattern(len, 3), "the next read arrived altered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_reads_keep_their_window_until_the_response() {
    abandoned_reads_keep_their_window_until_the_response_on(&tcp_backend()).await;
}

/// A response saying all `len` bytes were as sent (a send's, or with `pushed`, a read's).
fn received(id: u64, len: usize) -> ResponseFrame {
    let message = TestResponse {
        len: len as u64,
        exact: true,
        ..Default::default()
    };
    ResponseFrame {
        id,
        metadata: Bytes::from(prost::Message::encode_to_vec(&message)),
        ..Default::default()
    }
}

/// A small send goes at once and waits in a future of its own (`client::sent`): a caller that
/// gives up (its task is aborted while the call waits) tells the server with a cancel, the
/// server's late response to it is ignored, and the connection serves the next send. The
/// server is played by hand, so that it answers exactly when the test says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_send_given_up_is_cancelled_and_its_late_response_ignored() {
    let server = RawServer::start(&tcp_backend()).await;
    let (client, channel) = server.client(honest_ack()).await;
    let send_call = |seed| {
        let client = client.clone();
        tokio::spawn(async move { inbound(&client, MSG_SEND, 100, seed).await })
    };
    let given_up = send_call(1);
    let r = request(&channel).await;
    assert_eq!(
        r.inline_payload.as_ref().map(Bytes::len),
        Some(100),
        "the payload went inline"
    );
    given_up.abort();
    let aborted = bounded("the aborted call", given_up).await.unwrap_err();
    assert!(aborted.is_cancelled(), "{aborted}");
    let cancel = async {
        loop {
            match channel.recv().await.unwrap().kind {
                Some(Kind::Cancel(c)) => return c.id,
                None => continue,
                other => panic!("expected the cancel of the call given up, got {other:?}"),
            }
        }
    };
    let cancelled = bounded("the cancel of the call given up", cancel).await;
    assert_eq!(cancelled, r.id, "the cancel names the call given up");
    // The late response finds no call; the next send is served as usual.
    send(&channel, Kind::Response(received(r.id, 100))).await;
    let next = send_call(2);
    let r2 = request(&channel).await;
    assert_ne!(r2.id, r.id, "a new call");
    send(&channel, Kind::Response(received(r2.id, 100))).await;
    let got = bounded("the next send", next).await.unwrap().unwrap();
    assert!(got.exact && got.len == 100, "{got:?}");
    assert_eq!(
        client.stats().calls,
        1,
        "only the next send got its response"
    );
}

/// Payloads of every size between the inline threshold and past a slot, in both directions,
/// many at once on one connection.
pub(crate) async fn concurrent_mixed_sizes_on(b: &Backend) {
    let h = Harness::default_on(b).await;
    let client = h.client().await;
    let calls: Vec<_> = (0..32u32)
        .map(|seed| {
            let client = client.clone();
            let len = [8 * 1024 + 1, 30_000, 65_536, 65_537, 500_000][seed as usize % 5];
            tokio::spawn(async move {
                if seed % 2 == 0 {
                    write_exact(&client, BLOB_WRITE, len, seed).await;
                } else {
                    read_exact(&client, len, seed).await;
                }
            })
        })
        .collect();
    for call in calls {
        bounded("call", call).await.unwrap();
    }
    // A payload handed in as a slice of a larger buffer arrives as just that slice.
    let big = Bytes::from(pattern(70_000, 5));
    let resp: TestResponse = call_inbound(
        &client,
        &ENDPOINTS[BLOB_WRITE],
        Request::new(req(60_000, 5)),
        big.slice(0..60_000),
    )
    .await
    .unwrap();
    assert!(resp.exact);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_mixed_sizes() {
    concurrent_mixed_sizes_on(&tcp_backend()).await;
}

/// Calls whose handlers wait at the gate, made from this one task, four and then four more:
/// how many more tasks the runtime holds with eight waiting than with four (the connection's
/// tasks, and whatever its setup spawned, are settled by then); then each answers once the
/// gate opens.
async fn tasks_per_four_waiting_calls() -> usize {
    let h = Harness::default_on(&tcp_backend()).await;
    let client = h.client().await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let started = h.service.entered_now();
    let call = |seed| {
        call_inbound::<_, TestResponse>(
            &client,
            &ENDPOINTS[MSG_SEND],
            Request::new(TestRequest {
                gated: true,
                ..req(10, seed)
            }),
            Bytes::from(pattern(10, seed)),
        )
    };
    let mut first = std::pin::pin!(async { tokio::join!(call(1), call(2), call(3), call(4)) });
    tokio::select! {
        _ = &mut first => panic!("gated calls answered before the gate opened"),
        () = bounded("four handlers start", h.service.entered(started + 4)) => {}
    }
    let four = metrics.num_alive_tasks();
    let mut second = std::pin::pin!(async { tokio::join!(call(5), call(6), call(7), call(8)) });
    tokio::select! {
        _ = &mut first => panic!("gated calls answered before the gate opened"),
        _ = &mut second => panic!("gated calls answered before the gate opened"),
        () = bounded("four more start", h.service.entered(started + 8)) => {}
    }
    let eight = metrics.num_alive_tasks();
    h.service.open_gate();
    let (a, b) = bounded("the calls answer", async { tokio::join!(first, second) }).await;
    for answer in [a.0, a.1, a.2, a.3, b.0, b.1, b.2, b.3] {
        assert!(answer.unwrap().exact);
    }
    eight - four
}

/// On a current-thread runtime a call that waits goes on on its connection's task: no task
/// per call (one would buy nothing on one thread, and costs a spawn). (On a multi-threaded
/// runtime each gets a task of its own, as with `inline_handlers` off, which the suites run;
/// counting those tasks here would race with their spawns.)
#[tokio::test]
async fn waiting_calls_stay_on_their_connections_task_on_one_thread() {
    assert_eq!(tasks_per_four_waiting_calls().await, 0);
}
