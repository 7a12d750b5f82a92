//! `rdma-rpc health` against a server of this process that adds the health service behind an
//! interceptor asking for a token; and `specs/health.yaml` against the hand-written service.

mod common;

use std::io::BufRead as _;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::run;
use rdma_rpc_core::health::HealthReporter;
use rdma_rpc_core::interceptor::IncomingCall;
use rdma_rpc_core::{Code, Server, Status};

/// The spec, generated as a client elsewhere would be.
mod generated {
    rdma_rpc_core::spec!("../specs/health.yaml");
}

const TOKEN: &str = "authorization=Bearer 0123";

/// A server with only the health service, calls refused without the token, on a thread of
/// its own: its address, its reporter, and what shuts it down.
fn server() -> (String, HealthReporter, tokio::sync::oneshot::Sender<()>) {
    let reporter = HealthReporter::new();
    reporter.set_serving("Inventory");
    reporter.set_not_serving("Storage");
    let builder = Server::builder()
        .interceptor(
            |call: &mut IncomingCall<'_>| match call.metadata().get_str("authorization") {
                Some("Bearer 0123") => Ok(()),
                _ => Err(Status::new(Code::Unauthenticated, "no valid token")),
            },
        )
        .add_health(&reporter);
    let (addr, stop) = common::serve(builder, "tcp://127.0.0.1:0");
    (addr, reporter, stop)
}

#[test]
fn health_prints_the_status_and_exits_0_only_when_serving() {
    let (addr, _reporter, _stop) = server();
    let (code, stdout, stderr) = run(&["health", &addr, "-H", TOKEN]);
    assert_eq!((code, stdout.as_str()), (0, "SERVING\n"), "{stderr}");
    let (code, stdout, stderr) = run(&["health", &addr, "Inventory", "-H", TOKEN]);
    assert_eq!((code, stdout.as_str()), (0, "SERVING\n"), "{stderr}");
    let (code, stdout, stderr) = run(&["health", &addr, "Storage", "-H", TOKEN]);
    assert_eq!((code, stdout.as_str()), (1, "NOT_SERVING\n"), "{stderr}");
    let (code, stdout, stderr) = run(&["health", &addr, "Nope", "-H", TOKEN]);
    assert_eq!(
        (code, stdout.as_str()),
        (1, "SERVICE_UNKNOWN\n"),
        "{stderr}"
    );
    // Without the token, the server's interceptor refuses the check.
    let (code, stdout, stderr) = run(&["health", &addr]);
    assert_eq!((code, stdout.as_str()), (1, ""));
    assert!(
        stderr.contains("UNAUTHENTICATED: no valid token"),
        "{stderr}"
    );
    // The spec describes the same service: `call` reads it with the spec.
    let (code, stdout, stderr) = run(&[
        "call",
        &addr,
        "check",
        "--spec",
        "specs/health.yaml",
        "-d",
        r#"{"service": "Storage"}"#,
        "-H",
        TOKEN,
    ]);
    assert_eq!(code, 0, "{stderr}");
    let printed: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(printed, serde_json::json!({"status": "NOT_SERVING"}));
}

#[test]
fn health_watch_prints_each_change_until_the_server_stops() {
    let (addr, reporter, stop) = server();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rdma-rpc"))
        .args(["health", &addr, "Inventory", "--watch", "-H", TOKEN])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Lines as the command prints them, read on a thread: the wait for each is bounded.
    let (lines_tx, lines) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let _ = lines_tx.send(line.unwrap());
        }
    });
    let line = || {
        lines
            .recv_timeout(Duration::from_secs(60))
            .expect("a line within the failure bound")
    };
    assert_eq!(line(), "SERVING");
    reporter.set_not_serving("Inventory");
    assert_eq!(line(), "NOT_SERVING");
    reporter.set_serving("Inventory");
    assert_eq!(line(), "SERVING");
    // The server shuts down: its last word is NOT_SERVING, and the watch ends with it.
    stop.send(()).unwrap();
    assert_eq!(line(), "NOT_SERVING");
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_spec_describes_the_hand_written_service() {
    assert_eq!(
        generated::HEALTH_ENDPOINTS,
        rdma_rpc_core::health::ENDPOINTS,
        "specs/health.yaml and rdma_rpc_core::health disagree"
    );
    use prost::Message as _;
    // The same messages on the wire.
    let ours = rdma_rpc_core::health::HealthCheckResponse::from(
        rdma_rpc_core::health::ServingStatus::ServiceUnknown,
    );
    let theirs = generated::HealthCheckResponse::decode(ours.encode_to_vec().as_slice()).unwrap();
    assert_eq!(theirs.status(), generated::ServingStatus::ServiceUnknown);
    let request = generated::HealthCheckRequest {
        service: "Inventory".into(),
    };
    let ours =
        rdma_rpc_core::health::HealthCheckRequest::decode(request.encode_to_vec().as_slice())
            .unwrap();
    assert_eq!(ours.service, "Inventory");
}
