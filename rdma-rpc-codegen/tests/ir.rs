//! Unit tests on the IR built from the example specs in `specs/` and from small specs.

use std::time::Duration;

use rdma_rpc_codegen::{FieldLabel, OpKind, ScalarType, SpecFormat, StreamKind, TypeRef};

fn spec(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../specs")
        .join(name)
}

#[test]
fn doca_cpp_example() {
    let ir = rdma_rpc_codegen::load_spec(spec("doca_cpp_endpoints.yaml")).unwrap();
    assert_eq!(ir.name, "DocaCppEndpoints");
    assert_eq!(ir.format, SpecFormat::DocaCpp);
    assert_eq!(ir.doc, None);
    let endpoints: Vec<_> = ir
        .endpoints
        .iter()
        .map(|e| (e.path.as_str(), e.op, e.buffer_size, e.method.as_str()))
        .collect();
    assert_eq!(
        endpoints,
        [
            ("/rdma/ep0", OpKind::Receive, 4096, "rdma_ep0_receive"),
            ("/rdma/ep1", OpKind::Write, 4_194_304, "rdma_ep1_write"),
            ("/rdma/ep0", OpKind::Send, 4096, "rdma_ep0_send"),
            ("/rdma/ep1", OpKind::Read, 4_194_304, "rdma_ep1_read"),
        ]
    );
    for e in &ir.endpoints {
        assert_eq!(
            (&e.request, &e.response, e.timeout, &e.doc),
            (&None, &None, None, &None)
        );
    }
    assert!(ir.messages.is_empty());
    assert!(ir.enums.is_empty());
}

#[test]
fn doca_cpp_example_is_kept_byte_for_byte() {
    let text = std::fs::read_to_string(spec("doca_cpp_endpoints.yaml")).unwrap();
    assert!(text.starts_with("version: \"0.0.1\"\n\nendpoints:\n  - path: /rdma/ep0\n"));
    assert!(text.contains("      size: 4194304 # bytes - 4MB\n"));
}

#[test]
fn extended_example() {
    let ir = rdma_rpc_codegen::load_spec(spec("kv_store.yaml")).unwrap();
    assert_eq!(ir.name, "KvStore");
    assert_eq!(ir.format, SpecFormat::Extended);
    assert!(ir
        .doc
        .as_deref()
        .unwrap()
        .starts_with("A key-value block store."));

    let put = &ir.endpoints[0];
    assert_eq!(
        (put.path.as_str(), put.op, put.method.as_str()),
        ("/kv/block", OpKind::Write, "put_block")
    );
    assert_eq!(put.buffer_size, 4 << 20);
    assert_eq!(
        put.request,
        Some(TypeRef::Message("PutBlockRequest".into()))
    );
    assert_eq!(
        put.response,
        Some(TypeRef::Message("PutBlockResponse".into()))
    );
    assert_eq!(put.timeout, Some(Duration::from_millis(250)));
    assert!(put.doc.as_deref().unwrap().starts_with("Writes one block"));

    let get = &ir.endpoints[1];
    assert_eq!(
        (get.op, get.method.as_str(), get.buffer_size),
        (OpKind::Read, "get_block", 4 << 20)
    );

    let control = &ir.endpoints[2];
    assert_eq!((control.op, control.buffer_size), (OpKind::Send, 1024));
    assert_eq!(control.response, None);
    assert_eq!(control.timeout, Some(Duration::from_secs(1)));

    let stats = &ir.endpoints[3];
    assert_eq!(
        (stats.op, stats.method.as_str()),
        (OpKind::Receive, "stats")
    );
    assert_eq!(
        stats.buffer_size, 4096,
        "default buffer of a receive endpoint"
    );
    assert_eq!(stats.request, None);
    assert_eq!(stats.response, Some(TypeRef::Message("Stats".into())));
    assert_eq!(stats.timeout, Some(Duration::from_secs(5)));

    let names: Vec<_> = ir.messages.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "PutBlockRequest",
            "PutBlockResponse",
            "GetBlockRequest",
            "GetBlockResponse",
            "ControlCommand",
            "Stats",
            "ClientStats"
        ]
    );
    let put_req = ir.message("PutBlockRequest").unwrap();
    let fields: Vec<_> = put_req
        .fields
        .iter()
        .map(|f| (f.name.as_str(), f.tag, f.ty.clone(), f.label))
        .collect();
    assert_eq!(
        fields,
        [
            (
                "key",
                1,
                TypeRef::Scalar(ScalarType::Bytes),
                FieldLabel::Singular
            ),
            (
                "length",
                2,
                TypeRef::Scalar(ScalarType::Uint32),
                FieldLabel::Singular
            ),
            (
                "checksum",
                3,
                TypeRef::Scalar(ScalarType::Fixed32),
                FieldLabel::Optional
            ),
        ]
    );
    assert_eq!(put_req.fields[0].doc.as_deref(), Some("The block's key."));

    let stats_msg = ir.message("Stats").unwrap();
    let per_client = &stats_msg.fields[3];
    assert_eq!(per_client.ty, TypeRef::Message("ClientStats".into()));
    assert_eq!(
        (per_client.tag, per_client.label),
        (10, FieldLabel::Repeated)
    );
    assert_eq!(stats_msg.fields[2].ty, TypeRef::Scalar(ScalarType::Double));
    let control_msg = ir.message("ControlCommand").unwrap();
    assert_eq!(control_msg.fields[0].ty, TypeRef::Enum("Action".into()));

    let status = ir.enumeration("Status").unwrap();
    let values: Vec<_> = status
        .values
        .iter()
        .map(|v| (v.spec_name.as_str(), v.name.as_str(), v.number))
        .collect();
    assert_eq!(
        values,
        [
            ("OK", "Ok", 0),
            ("NOT_FOUND", "NotFound", 1),
            ("STALE", "Stale", 2),
            ("NO_SPACE", "NoSpace", 10)
        ]
    );
    assert_eq!(status.values[3].doc.as_deref(), Some("The store is full."));
    let action = ir.enumeration("Action").unwrap();
    assert_eq!(
        action.values.iter().map(|v| v.number).collect::<Vec<_>>(),
        [0, 1, 2]
    );
}

#[test]
fn derived_names_and_units() {
    let src = r#"
version: "rdma-rpc/1"
endpoints:
  - path: /Kv/getBlock
    type: read
    buffer: { size: 2 GiB }
  - path: /9lives
    type: send
    buffer: { size: 512B }
  - path: /x
    type: receive
    buffer: { size: 1_024 }
    timeout: 90s
"#;
    let err = rdma_rpc_codegen::parse_spec("my-store.v2.yaml", src).unwrap_err();
    assert_eq!(
        err.diagnostics().len(),
        1,
        "only the 2 GiB buffer is wrong: {err}"
    );
    let ir =
        rdma_rpc_codegen::parse_spec("my-store.v2.yaml", &src.replace("2 GiB", "1 GiB")).unwrap();
    assert_eq!(ir.name, "MyStoreV2");
    let methods: Vec<_> = ir.endpoints.iter().map(|e| e.method.as_str()).collect();
    assert_eq!(
        methods,
        ["kv_get_block_read", "ep_9lives_send", "x_receive"]
    );
    let sizes: Vec<_> = ir.endpoints.iter().map(|e| e.buffer_size).collect();
    assert_eq!(sizes, [1 << 30, 512, 1024]);
    assert_eq!(ir.endpoints[2].timeout, Some(Duration::from_secs(90)));
}

#[test]
fn payloads_follow_the_buffer_unless_said() {
    let src = "version: \"rdma-rpc/1\"\nservice: P\nendpoints:\n\
        - { path: /s, type: send }\n\
        - { path: /sb, type: send, buffer: { size: 1KiB } }\n\
        - { path: /sf, type: send, buffer: { size: 1KiB }, payload: false }\n\
        - { path: /r, type: receive }\n\
        - { path: /rt, type: receive, payload: true }\n\
        - { path: /w, type: write, buffer: { size: 1KiB } }\n\
        - { path: /rd, type: read, buffer: { size: 1KiB } }\n";
    let ir = rdma_rpc_codegen::parse_spec("p.yaml", src).unwrap();
    let payloads: Vec<(&str, bool)> = ir
        .endpoints
        .iter()
        .map(|e| (e.path.as_str(), e.payload))
        .collect();
    assert_eq!(
        payloads,
        [
            ("/s", false),
            ("/sb", true),
            ("/sf", false),
            ("/r", false),
            ("/rt", true),
            ("/w", true),
            ("/rd", true),
        ]
    );
    // The doca-cpp format has no messages: every endpoint has a payload.
    let doca = rdma_rpc_codegen::parse_spec(
        "d.yaml",
        "version: \"0.0.1\"\nendpoints:\n  - { path: /a, type: send, buffer: { size: 64 } }\n",
    )
    .unwrap();
    assert!(doca.endpoints[0].payload);
}

#[test]
fn object_store_streams() {
    let ir = rdma_rpc_codegen::load_spec(spec("object_store.yaml")).unwrap();
    assert_eq!(ir.name, "ObjectStore");
    let message = |name: &str| Some(TypeRef::Message(name.into()));
    let endpoints: Vec<_> = ir
        .endpoints
        .iter()
        .map(|e| (e.method.as_str(), e.op, e.buffer_size, e.stream, e.payload))
        .collect();
    let messages = |requests, responses| StreamKind::Messages {
        requests,
        responses,
    };
    assert_eq!(
        endpoints,
        [
            (
                "put_object",
                OpKind::Write,
                4 << 20,
                StreamKind::Bulk { max_len: 1 << 30 },
                true
            ),
            (
                "get_object",
                OpKind::Read,
                4 << 20,
                StreamKind::Bulk { max_len: 1 << 30 },
                true
            ),
            (
                "list_objects",
                OpKind::Receive,
                4096,
                messages(false, true),
                false
            ),
            (
                "append_log",
                OpKind::Send,
                4096,
                messages(true, false),
                false
            ),
            ("watch", OpKind::Send, 4096, messages(true, true), false),
            (
                "delete_object",
                OpKind::Send,
                4096,
                StreamKind::Unary,
                false
            ),
        ]
    );
    // The streamed types, and the plain messages beside them.
    let list = &ir.endpoints[2];
    assert_eq!(list.request, message("ListRequest"));
    assert_eq!(list.request_stream(), None);
    assert_eq!(list.response_stream(), message("ObjectInfo").as_ref());
    assert_eq!(list.timeout, Some(Duration::from_secs(30)));
    let append = &ir.endpoints[3];
    assert_eq!(append.request_stream(), message("LogLine").as_ref());
    assert_eq!(append.response, message("AppendSummary"));
    assert_eq!(append.response_stream(), None);
    let watch = &ir.endpoints[4];
    assert_eq!(watch.request_stream(), message("WatchRequest").as_ref());
    assert_eq!(watch.response_stream(), message("ObjectEvent").as_ref());
    let put = &ir.endpoints[0];
    assert_eq!(put.stream.max_len(), Some(1 << 30));
    assert_eq!((put.request_stream(), put.response_stream()), (None, None));
    let info = ir.message("ObjectInfo").unwrap();
    let fields: Vec<_> = info.fields.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(fields, ["key", "size", "crc32c"]);
}

#[test]
fn message_streams_without_messages_on_the_other_side() {
    // A server stream needs no request message, a client stream no response message.
    let src = "version: \"rdma-rpc/1\"\nendpoints:\n\
        - { path: /ticks, type: receive, response: { stream: Tick } }\n\
        - { path: /log, type: send, request: { stream: Tick } }\n\
        messages:\n  Tick: {}\n";
    let ir = rdma_rpc_codegen::parse_spec("t.yaml", src).unwrap();
    let ticks = &ir.endpoints[0];
    assert_eq!(
        (&ticks.request, ticks.stream.streams_responses()),
        (&None, true)
    );
    let log = &ir.endpoints[1];
    assert_eq!(
        (&log.response, log.stream.streams_requests()),
        (&None, true)
    );
    assert!(!log.stream.streams_responses());
}
