//! What the server logs about calls, read back from a capture: each answered call's line ends
//! with its status, bytes and round trips; a refused call is a warning with its reason; a
//! handler's panic names the call; a stopped call (cancelled, or past `max_call_duration`) says
//! how it ended. A test binary of its own with one test (see `common::capture_logs`).

mod common;

use std::time::Duration;

use bytes::Bytes;
use rdma_rpc_core::{Client, Code, Server};

/// The line of `log` that contains `what`, with every one of `fields`.
fn line_with<'a>(log: &'a str, what: &str, fields: &[&str]) -> &'a str {
    let line = log
        .lines()
        .find(|l| l.contains(what) && fields.iter().all(|f| l.contains(f)))
        .unwrap_or_else(|| panic!("no {what:?} with {fields:?} logged:\n{log}"));
    line
}

#[test]
fn calls_are_logged_with_how_they_ended() {
    let captured = common::capture_logs();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let stall = common::Stall::default();
        let server = Server::builder()
            .add_service(common::Echo)
            .add_service(stall.clone())
            .add_service(common::Panics)
            .max_call_duration(Some(Duration::from_millis(300)))
            .bind("tcp://127.0.0.1:0")
            .await
            .unwrap();
        let addr = server.local_addr();
        tokio::spawn(server.serve());
        let client = Client::connect(&addr).await.unwrap();
        let echo = |len: usize| {
            client.call_raw(
                &common::ENDPOINTS[0],
                Bytes::new(),
                Some(Bytes::from(vec![7; len])),
                None,
            )
        };
        echo(10).await.unwrap();
        // Larger than the inline threshold: pulled or granted.
        echo(100_000).await.unwrap();
        let err = client
            .call_raw(&common::UNKNOWN, Bytes::new(), None, None)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unimplemented, "{err}");
        let err = client
            .call_raw(&common::PANICS[0], Bytes::new(), Some(Bytes::new()), None)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Internal, "{err}");
        // A call the client abandons, and one past the server's max_call_duration.
        let abandoned = {
            let client = client.clone();
            tokio::spawn(async move {
                client
                    .call_raw(&common::STALL[0], Bytes::new(), Some(Bytes::new()), None)
                    .await
            })
        };
        stall
            .started
            .subscribe()
            .wait_for(|n| *n >= 1)
            .await
            .unwrap();
        abandoned.abort();
        stall
            .stopped
            .subscribe()
            .wait_for(|n| *n >= 1)
            .await
            .unwrap();
        let err = client
            .call_raw(&common::STALL[0], Bytes::new(), Some(Bytes::new()), None)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::DeadlineExceeded, "{err}");
        stall
            .stopped
            .subscribe()
            .wait_for(|n| *n >= 2)
            .await
            .unwrap();
    });
    drop(rt);
    let log = captured.text();
    line_with(
        &log,
        "call answered",
        &[
            "path=\"/echo\"",
            "status=\"OK\"",
            "bytes=10",
            "round_trips=1",
        ],
    );
    line_with(&log, "call answered", &["path=\"/echo\"", "bytes=100000"]);
    line_with(
        &log,
        "call refused",
        &["WARN", "code=\"UNIMPLEMENTED\"", "/nowhere"],
    );
    line_with(
        &log,
        "handler panicked",
        &[
            "method=\"panic_send\"",
            "path=\"/panic\"",
            "op=send",
            "peer=\"tcp://",
        ],
    );
    line_with(
        &log,
        "call answered",
        &["method=\"stall\"", "status=\"CANCELLED\""],
    );
    line_with(
        &log,
        "call answered",
        &["method=\"stall\"", "status=\"DEADLINE_EXCEEDED\""],
    );
}
