//! The `rdma-rpc` binary: exit codes and output of every command. `ping` and `bench` run
//! against a server started in this process.

mod common;

use common::run;

#[test]
fn check_valid_specs_exits_0_with_one_line_each() {
    let (code, stdout, stderr) = run(&[
        "check",
        "specs/doca_cpp_endpoints.yaml",
        "specs/kv_store.yaml",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout,
        "specs/doca_cpp_endpoints.yaml: ok: service DocaCppEndpoints (0.0.1 format), 4 endpoints, 0 messages, 0 enums\n\
         specs/kv_store.yaml: ok: service KvStore (rdma-rpc/1 format), 4 endpoints, 7 messages, 2 enums\n"
    );
}

#[test]
fn check_invalid_spec_exits_1_and_prints_every_diagnostic() {
    let path = std::env::temp_dir().join(format!("rdma-rpc-cli-{}.yaml", std::process::id()));
    std::fs::write(
        &path,
        "version: \"0.0.1\"\nendpoints:\n  - path: /a\n    type: sned\n    buffer: { size: 0 }\n",
    )
    .unwrap();
    let path_str = path.to_str().unwrap();
    let (code, stdout, stderr) = run(&["check", "specs/kv_store.yaml", path_str]);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(code, 1);
    assert!(stdout.starts_with("specs/kv_store.yaml: ok"), "{stdout}");
    assert!(
        stderr.contains(&format!(
            "error: unknown operation type `sned`\n  --> {path_str}:4:11\n"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "error: buffer size must be positive, found 0\n  --> {path_str}:5:21\n"
        )),
        "{stderr}"
    );
    assert!(
        stderr.ends_with(&format!("{path_str}: 2 errors found\n")),
        "{stderr}"
    );
}

#[test]
fn check_missing_file_exits_1() {
    let (code, _, stderr) = run(&["check", "specs/does-not-exist.yaml"]);
    assert_eq!(code, 1);
    assert!(
        stderr.starts_with("error: cannot read spec `specs/does-not-exist.yaml`: "),
        "{stderr}"
    );
}

#[test]
fn generate_prints_the_generated_code() {
    let (code, stdout, stderr) = run(&["generate", "specs/kv_store.yaml"]);
    assert_eq!(code, 0, "{stderr}");
    let golden = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../rdma-rpc-codegen/tests/golden/kv_store.rs"
    ))
    .unwrap();
    assert_eq!(stdout, golden);
    let (code, stdout, _) = run(&["generate", "--no-server", "specs/kv_store.yaml"]);
    assert_eq!(code, 0);
    assert!(!stdout.contains("KvStoreServer"));
    assert!(stdout.contains("KvStoreClient"));
}

#[test]
fn generate_invalid_spec_exits_1_with_diagnostics() {
    let path = std::env::temp_dir().join(format!("rdma-rpc-cli-gen-{}.yaml", std::process::id()));
    std::fs::write(
        &path,
        "version: \"0.0.1\"\nendpoints:\n  - path: /a\n    type: sned\n    buffer: { size: 64 }\n",
    )
    .unwrap();
    let path_str = path.to_str().unwrap();
    let (code, stdout, stderr) = run(&["generate", path_str]);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(code, 1);
    assert_eq!(stdout, "");
    assert!(
        stderr.contains(&format!(
            "error: unknown operation type `sned`\n  --> {path_str}:4:11\n"
        )),
        "{stderr}"
    );
    let (code, _, stderr) = run(&["generate", "specs/does-not-exist.yaml"]);
    assert_eq!(code, 1);
    assert!(stderr.starts_with("error: cannot read spec"), "{stderr}");
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(run(&[]).0, 2);
    assert_eq!(run(&["check"]).0, 2);
    assert_eq!(run(&["generate"]).0, 2);
    assert_eq!(run(&["generate", "a.yaml", "b.yaml"]).0, 2);
    assert_eq!(run(&["generate", "--server=no", "a.yaml"]).0, 2);
    assert_eq!(run(&["frobnicate"]).0, 2);
    assert_eq!(
        run(&["bench", "tcp://127.0.0.1:1", "--path", "/a"]).0,
        2,
        "no --op"
    );
    assert_eq!(
        run(&[
            "bench",
            "tcp://127.0.0.1:1",
            "--path",
            "/a",
            "--op",
            "send",
            "--size",
            "4KB"
        ])
        .0,
        2,
        "a size in an unknown unit"
    );
    let (code, _, stderr) = run(&["bench", "tcp://127.0.0.1:1", "--path", "/a", "--op", "sned"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("possible values: send, receive, write, read"),
        "{stderr}"
    );
}

#[test]
fn version_names_the_protocol() {
    let (code, stdout, _) = run(&["--version"]);
    assert_eq!(code, 0);
    assert_eq!(
        stdout,
        format!(
            "rdma-rpc {} (protocol {})\n",
            env!("CARGO_PKG_VERSION"),
            rdma_rpc_core::protocol::PROTOCOL_VERSION
        )
    );
}

#[test]
fn devices_lists_the_providers_devices() {
    // The software provider's devices (doca-sys/CONTRACT.md): mlx5_0 and mlx5_1 support every
    // RDMA task; mlx5_2 supports none and is not listed.
    let (code, stdout, stderr) = run(&["devices"]);
    assert_eq!(code, 0, "{stderr}");
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("2 devices (software provider)"));
    assert!(lines.next().unwrap().starts_with("name"));
    for (name, pci) in [("mlx5_0", "0000:03:00.0"), ("mlx5_1", "0000:03:00.1")] {
        let line = lines.next().unwrap();
        assert!(line.starts_with(name) && line.contains(pci), "{line}");
        assert!(line.contains("send/receive,write,read,atomics"), "{line}");
    }
    let (code, stdout, _) = run(&["devices", "--json"]);
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["provider"], "software provider");
    assert_eq!(json["devices"][1]["pci_addr"], "0000:03:00.1");
    assert_eq!(json["devices"][0]["capabilities"]["atomics"], true);
}

/// A server with one send endpoint (`/echo`, answers with the payload's length) and one
/// receive endpoint (`/echo`, 1000 bytes), on a thread of its own: its address, and what
/// shuts it down.
fn server() -> (String, tokio::sync::oneshot::Sender<()>) {
    use rdma_rpc_core::service::{EndpointDef, OpKind, ServerCall, Service};
    use rdma_rpc_core::transport::BoxFuture;
    use rdma_rpc_core::{Server, Status};

    static ENDPOINTS: &[EndpointDef] = &[
        EndpointDef {
            path: "/echo",
            op: OpKind::Send,
            buffer_size: 1 << 20,
            method: "echo",
            timeout_ms: None,
            stream: rdma_rpc_core::StreamKind::Unary,
        },
        EndpointDef {
            path: "/echo",
            op: OpKind::Receive,
            buffer_size: 1 << 20,
            method: "fetch",
            timeout_ms: None,
            stream: rdma_rpc_core::StreamKind::Unary,
        },
    ];
    struct Echo;
    impl Service for Echo {
        fn name(&self) -> &'static str {
            "Echo"
        }
        fn endpoints(&self) -> &'static [EndpointDef] {
            ENDPOINTS
        }
        fn call<'a>(
            &'a self,
            _: usize,
            call: ServerCall<'a>,
        ) -> BoxFuture<'a, Result<bytes::Bytes, Status>> {
            Box::pin(async move {
                match call {
                    ServerCall::Inbound { data, .. } => Ok(data.len().to_string().into()),
                    ServerCall::Outbound { buf, .. } => {
                        buf.fill_from(&[7; 1000]).map_err(Status::from)?;
                        Ok(bytes::Bytes::new())
                    }
                    _ => Err(Status::unimplemented("no streams here")),
                }
            })
        }
    }
    common::serve(Server::builder().add_service(Echo), "tcp://127.0.0.1:0")
}

#[test]
fn ping_reports_each_round_trip_and_a_summary() {
    let (addr, _stop) = server();
    let (code, stdout, stderr) = run(&["ping", &addr, "--count", "3", "--interval", "0"]);
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{stdout}");
    assert!(
        lines[0].starts_with(&format!("connected to {addr} in ")),
        "{stdout}"
    );
    for (seq, line) in lines[1..4].iter().enumerate() {
        assert!(
            line.starts_with(&format!("ping {seq}: ")) && line.ends_with(" us"),
            "{line}"
        );
    }
    assert!(lines[4].starts_with("3 pings: min "), "{stdout}");
    // Nobody listens: the cause is printed and the exit code is 1.
    let (code, _, stderr) = run(&["ping", "tcp://127.0.0.1:1"]);
    assert_eq!(code, 1);
    assert!(
        stderr.starts_with("error: cannot connect to tcp://127.0.0.1:1: ")
            && stderr.contains("refused"),
        "{stderr}"
    );
}

#[test]
fn bench_calls_an_endpoint_and_reports_rates_and_latency() {
    let (addr, _stop) = server();
    let (code, stdout, stderr) = run(&[
        "bench",
        &addr,
        "--path",
        "/echo",
        "--op",
        "send",
        "--size",
        "1KiB",
        "--calls",
        "50",
        "--in-flight",
        "4",
        "--connections",
        "2",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.starts_with(&format!(
            "send /echo on {addr}: 50 calls over 2 connection(s), 4 in flight each\n"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(" calls/s, ") && stdout.contains(" MB/s, latency p50 "),
        "{stdout}"
    );
    assert!(
        stdout.contains("1.00 protocol round trips per call"),
        "{stdout}"
    );
    let (code, stdout, stderr) = run(&[
        "bench", &addr, "--path", "/echo", "--op", "receive", "--calls", "10",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("receive /echo on"), "{stdout}");
    // An endpoint the server does not have: its status, exit code 1.
    let (code, _, stderr) = run(&["bench", &addr, "--path", "/nope", "--op", "write"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("UNIMPLEMENTED"), "{stderr}");
}
