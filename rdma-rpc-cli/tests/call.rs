//! `rdma-rpc call` (and `bench` with a typed request) against the Inventory service of
//! `tests/specs/inventory.yaml`, served from this process over tcp://.

mod common;

use std::pin::Pin;
use std::task::{Context, Poll};

use common::{run, run_with_stdin};
use rdma_rpc_core::codegen::{Bytes, RegisteredBuf, Request, Status, Stream, Streaming};
use rdma_rpc_core::interceptor::IncomingCall;
use rdma_rpc_core::{Code, Server};
use serde_json::{json, Value};

rdma_rpc_core::spec!("tests/specs/inventory.yaml");

const SPEC: &str = "rdma-rpc-cli/tests/specs/inventory.yaml";
const TOKEN: &str = "Bearer 0123";

struct Store;

/// The items of a `list` call, one at a time.
struct Items(std::vec::IntoIter<Item>);

impl Stream for Items {
    type Item = Result<Item, Status>;

    fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Poll::Ready(self.0.next().map(Ok))
    }
}

impl Inventory for Store {
    async fn echo(&self, request: Request<Item>) -> Result<Item, Status> {
        Ok(request.into_inner())
    }

    async fn put(&self, request: Request<PutRequest>, data: Bytes) -> Result<PutResponse, Status> {
        let name = request.into_inner().name;
        if name.is_empty() {
            return Err(Status::invalid_argument("a put needs a name"));
        }
        Ok(PutResponse {
            name,
            length: data.len() as u64,
            sum: data.iter().map(|&b| u32::from(b)).sum(),
        })
    }

    async fn get(
        &self,
        request: Request<GetRequest>,
        buf: &mut RegisteredBuf,
    ) -> Result<Part, Status> {
        let length = request.into_inner().length;
        buf.fill_from(&vec![0x5a; length as usize])
            .map_err(Status::from)?;
        Ok(Part {
            label: "get".into(),
            sizes: vec![u64::from(length)],
            kind: Kind::Small as i32,
        })
    }

    type ListStream = Items;

    async fn list(&self, request: Request<ListRequest>) -> Result<Items, Status> {
        let items = (0..request.into_inner().count)
            .map(|i| Item {
                name: format!("item-{i}"),
                id: u64::from(i),
                kinds: vec![Kind::Large as i32; i as usize],
                ..Item::default()
            })
            .collect::<Vec<_>>();
        Ok(Items(items.into_iter()))
    }

    async fn upload(&self, _: Request<Streaming<Item>>) -> Result<PutResponse, Status> {
        Err(Status::unimplemented("the CLI never calls this"))
    }

    async fn whoami(&self, request: Request<()>) -> Result<Caller, Status> {
        Ok(Caller {
            token: request
                .metadata()
                .get_str("authorization")
                .unwrap_or_default()
                .into(),
        })
    }
}

/// The Inventory server on a thread of its own, `whoami` refused without the token by an
/// interceptor: its address, and what shuts it down.
fn server() -> (String, tokio::sync::oneshot::Sender<()>) {
    let builder = Server::builder()
        .interceptor(|call: &mut IncomingCall<'_>| {
            let authorized = call.metadata().get_str("authorization") == Some(TOKEN);
            if call.endpoint().path == "/inv/whoami" && !authorized {
                return Err(Status::new(Code::Unauthenticated, "no valid token"));
            }
            Ok(())
        })
        .add_service(InventoryServer::new(Store));
    common::serve(builder, "tcp://127.0.0.1:0")
}

/// An item with nested messages, enums and repeated fields in every shape, and the JSON
/// `call` prints for it (every field, lowerCamelCase, 64-bit integers as strings).
fn item() -> (Value, Value) {
    let given = json!({
        "name": "widget",
        "id": 18446744073709551615u64,
        "delta": "-5000000000",
        "count": -3,
        "small": 7,
        "ratio": 0.25,
        "weight": 1.5,
        "signed_big": -9,
        "flag": true,
        "blob": "AAEC+vs=",
        "kind": "HUGE",
        "kinds": ["SMALL", "LARGE"],
        "tags": ["a", "b"],
        "samples": [-1, 0, 1],
        "parts": [{"label": "p0", "sizes": [1, "1099511627776"], "kind": "SMALL"}, {}],
        "origin": {"label": "o", "kind": 2},
        "limit": 0,
        "wide": ["9223372036854775807"],
    });
    let printed = json!({
        "name": "widget",
        "id": "18446744073709551615",
        "delta": "-5000000000",
        "count": -3,
        "small": 7,
        "ratio": 0.25,
        "weight": 1.5,
        "stamp": "0",
        "offset": 0,
        "signedBig": "-9",
        "flag": true,
        "blob": "AAEC+vs=",
        "kind": "HUGE",
        "kinds": ["SMALL", "LARGE"],
        "tags": ["a", "b"],
        "samples": [-1, 0, 1],
        "parts": [
            {"label": "p0", "sizes": ["1", "1099511627776"], "kind": "SMALL"},
            {"label": "", "sizes": [], "kind": "UNKNOWN"}
        ],
        "origin": {"label": "o", "sizes": [], "kind": "LARGE"},
        "note": null,
        "limit": 0,
        "crc": 0,
        "wide": ["9223372036854775807"],
    });
    (given, printed)
}

#[test]
fn a_typed_call_round_trips_nested_enum_and_repeated_fields() {
    let (addr, _stop) = server();
    let (given, printed) = item();
    let request = given.to_string();
    let (code, stdout, stderr) = run(&["call", &addr, "echo", "--spec", SPEC, "-d", &request]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(serde_json::from_str::<Value>(&stdout).unwrap(), printed);
    // The same request as YAML, from a file and from standard input.
    let yaml = "name: widget\nid: 18446744073709551615\ndelta: '-5000000000'\ncount: -3\n\
                small: 7\nratio: 0.25\nweight: 1.5\nsigned_big: -9\nflag: true\n\
                blob: AAEC+vs=\nkind: HUGE\nkinds: [SMALL, LARGE]\ntags: [a, b]\n\
                samples: [-1, 0, 1]\nparts:\n  - label: p0\n    sizes: [1, '1099511627776']\n\
                \x20   kind: SMALL\n  - {}\norigin: {label: o, kind: 2}\nlimit: 0\n\
                wide: ['9223372036854775807']\n";
    let file = std::env::temp_dir().join(format!("rdma-rpc-call-{}.yaml", std::process::id()));
    std::fs::write(&file, yaml).unwrap();
    let at_file = format!("@{}", file.display());
    let (code, stdout, stderr) = run(&["call", &addr, "echo", "--spec", SPEC, "-d", &at_file]);
    std::fs::remove_file(&file).unwrap();
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(serde_json::from_str::<Value>(&stdout).unwrap(), printed);
    let (code, stdout, stderr) =
        run_with_stdin(&["call", &addr, "echo", "--spec", SPEC, "-d", "@-"], yaml);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(serde_json::from_str::<Value>(&stdout).unwrap(), printed);
}

#[test]
fn metadata_reaches_the_interceptor_and_the_handler() {
    let (addr, _stop) = server();
    let (code, stdout, stderr) = run(&["call", &addr, "whoami", "--spec", SPEC]);
    assert_eq!(code, 1);
    assert_eq!(stdout, "");
    assert_eq!(
        stderr,
        format!("error: whoami (receive /inv/whoami) on {addr}: UNAUTHENTICATED: no valid token\n")
    );
    let header = format!("authorization={TOKEN}");
    let (code, stdout, stderr) = run(&[
        "call",
        &addr,
        "whoami",
        "--spec",
        SPEC,
        "-H",
        &header,
        "-H",
        "x-trace=1",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        serde_json::from_str::<Value>(&stdout).unwrap(),
        json!({ "token": TOKEN })
    );
}

#[test]
fn bad_requests_are_refused_before_anything_is_sent() {
    // Nobody listens there: each of these fails before connecting, with exit code 2.
    let addr = "tcp://127.0.0.1:1";
    let cases: [(&[&str], &str); 7] = [
        (
            &["-d", r#"{"parts": [{"lable": "x"}]}"#],
            "error: request: Item.parts[0]: message Part has no field `lable` (its fields: \
             label, sizes, kind)\n",
        ),
        (
            &["-d", r#"{"small": -1}"#],
            "error: request: Item.small: -1 is out of range for uint32\n",
        ),
        (
            &["-d", r#"{"origin": {"kind": "MEDIUM"}}"#],
            "error: request: Item.origin.kind: enum Kind has no value `MEDIUM` (its values: \
             UNKNOWN, SMALL, LARGE, HUGE)\n",
        ),
        (&["-d", "{name: [}"], "error: the request is neither JSON ("),
        (
            &["-H", "k=1", "-H", "k=2"],
            "error: metadata key `k` given twice\n",
        ),
        (
            &["--data-file", "Cargo.toml"],
            "error: echo: --data-file is for send and write endpoints with a payload; this is a \
             send endpoint without one\n",
        ),
        (
            &["--out", "x.bin"],
            "error: echo: --out is for receive and read endpoints with a payload; this is a send \
             endpoint without one\n",
        ),
    ];
    for (extra, expected) in cases {
        let mut args = vec!["call", addr, "echo", "--spec", SPEC];
        args.extend_from_slice(extra);
        let (code, stdout, stderr) = run(&args);
        assert_eq!((code, stdout.as_str()), (2, ""), "{extra:?}: {stderr}");
        assert!(stderr.starts_with(expected), "{extra:?}: {stderr}");
    }
    let (code, _, stderr) = run(&["call", addr, "ecko", "--spec", SPEC]);
    assert_eq!(code, 2);
    assert_eq!(
        stderr,
        "error: service Inventory has no method `ecko` (its methods: echo, put, get, list, \
         upload, whoami)\n"
    );
    let (code, _, stderr) = run(&["call", addr, "whoami", "--spec", SPEC, "-d", "{}"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("whoami takes no request message"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&["call", addr, "upload", "--spec", SPEC]);
    assert_eq!(code, 2);
    assert!(
        stderr.starts_with("error: upload: the client streams its requests, and `rdma-rpc call` sends one request message"),
        "{stderr}"
    );
}

#[test]
fn payloads_come_from_and_go_to_files() {
    let (addr, _stop) = server();
    let dir = std::env::temp_dir();
    let input = dir.join(format!("rdma-rpc-call-in-{}.bin", std::process::id()));
    let output = dir.join(format!("rdma-rpc-call-out-{}.bin", std::process::id()));
    std::fs::write(&input, [1u8, 2, 3, 250]).unwrap();
    let (input_arg, output_arg) = (input.to_str().unwrap(), output.to_str().unwrap());
    let (code, stdout, stderr) = run(&[
        "call",
        &addr,
        "put",
        "--spec",
        SPEC,
        "-d",
        r#"{"name": "n"}"#,
        "--data-file",
        input_arg,
    ]);
    std::fs::remove_file(&input).unwrap();
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        serde_json::from_str::<Value>(&stdout).unwrap(),
        json!({"name": "n", "length": "4", "sum": 256})
    );
    // The handler's own refusal: its status, exit code 1.
    let (code, _, stderr) = run(&["call", &addr, "put", "--spec", SPEC]);
    assert_eq!(code, 1);
    assert!(
        stderr.ends_with("INVALID_ARGUMENT: a put needs a name\n"),
        "{stderr}"
    );
    let (code, stdout, stderr) = run(&[
        "call",
        &addr,
        "get",
        "--spec",
        SPEC,
        "-d",
        "length: 1000",
        "--out",
        output_arg,
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stderr,
        format!("1000 bytes of data written to {output_arg}\n")
    );
    assert_eq!(std::fs::read(&output).unwrap(), vec![0x5a; 1000]);
    std::fs::remove_file(&output).unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&stdout).unwrap(),
        json!({"label": "get", "sizes": ["1000"], "kind": "SMALL"})
    );
    let (code, _, stderr) = run(&["call", &addr, "get", "--spec", SPEC, "-d", "length: 10"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stderr, "10 bytes of data (--out FILE saves them)\n");
}

#[test]
fn server_streams_print_one_json_line_per_message() {
    let (addr, _stop) = server();
    let (code, stdout, stderr) = run(&["call", &addr, "list", "--spec", SPEC, "-d", "count: 3"]);
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["name"], format!("item-{i}"));
        assert_eq!(line["id"], i.to_string());
        assert_eq!(line["kinds"], json!(vec!["LARGE"; i]));
    }
}

#[test]
fn bench_sends_the_typed_request_and_metadata() {
    let (addr, _stop) = server();
    let header = format!("authorization={TOKEN}");
    let (code, stdout, stderr) = run(&[
        "bench", &addr, "--spec", SPEC, "--method", "whoami", "-H", &header, "--calls", "20",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.starts_with(&format!(
            "receive /inv/whoami on {addr}: 20 calls over 1 connection(s)"
        )),
        "{stdout}"
    );
    let (code, _, stderr) = run(&["bench", &addr, "--spec", SPEC, "--method", "whoami"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("UNAUTHENTICATED: no valid token"),
        "{stderr}"
    );
    // The request is encoded from the spec, found by method or by path and operation.
    let (code, stdout, stderr) = run(&[
        "bench",
        &addr,
        "--spec",
        SPEC,
        "--path",
        "/inv/put",
        "--op",
        "write",
        "-d",
        r#"{"name": "n"}"#,
        "--size",
        "4KiB",
        "--calls",
        "20",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.starts_with("write /inv/put on "), "{stdout}");
    let (code, _, stderr) = run(&["bench", &addr, "--spec", SPEC, "--method", "put"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("INVALID_ARGUMENT: a put needs a name"),
        "{stderr}"
    );
    let (code, _, stderr) = run(&["bench", &addr, "--spec", SPEC, "--method", "list"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("bench calls unary endpoints and bulk streams"),
        "{stderr}"
    );
    // A request needs the spec that types it.
    let (code, _, _) = run(&[
        "bench", &addr, "--path", "/inv/put", "--op", "write", "-d", "{}",
    ]);
    assert_eq!(code, 2);
}
