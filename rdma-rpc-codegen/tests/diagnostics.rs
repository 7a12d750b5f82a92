//! One test per class of spec error: the message, its line and column, key and hint.

use rdma_rpc_codegen::{parse_spec, Diagnostic};

/// All diagnostics of `src` (which must be invalid).
fn errors(src: &str) -> Vec<Diagnostic> {
    match parse_spec("test.yaml", src) {
        Ok(ir) => panic!("spec was accepted: {ir:?}"),
        Err(err) => err.diagnostics().to_vec(),
    }
}

/// The one diagnostic of `src` with this message.
fn find(src: &str, message: &str) -> Diagnostic {
    let all = errors(src);
    let found: Vec<_> = all.iter().filter(|d| d.message == message).collect();
    assert_eq!(found.len(), 1, "expected one `{message}` among:\n{all:#?}");
    found[0].clone()
}

fn assert_at(d: &Diagnostic, line: u64, column: u64, key: &str) {
    assert_eq!(
        (d.line, d.column, d.key.as_str()),
        (line, column, key),
        "{d}"
    );
    assert_eq!(d.file, "test.yaml");
}

const DOCA_HEAD: &str = "version: \"0.0.1\"\nendpoints:\n";
const EXT_HEAD: &str = "version: \"rdma-rpc/1\"\nendpoints:\n";

#[test]
fn yaml_syntax_error() {
    let all = errors("version: \"0.0.1\"\nendpoints:\n  - path: [/a\n    type: send\n");
    assert_eq!(all.len(), 1, "{all:#?}");
    // Inside the unclosed `[`, the parser trips over the next line's `type:`.
    assert_eq!(
        all[0].message,
        "invalid YAML: illegal placement of ':' indicator"
    );
    assert_eq!((all[0].line, all[0].column), (4, 9), "{}", all[0]);
    assert!(all[0].hint.is_some());
}

#[test]
fn unknown_key_with_suggestion() {
    let src = format!("{DOCA_HEAD}  - path: /a\n    type: send\n    buffer:\n      sise: 4096\n");
    let d = find(&src, "unknown key `sise`");
    assert_at(&d, 6, 7, "endpoints[0].buffer.sise");
    assert_eq!(d.hint.as_deref(), Some("did you mean `size`?"));
    // The misspelling is not reported a second time as a missing `size`.
    assert_eq!(errors(&src).len(), 1);
    let d = find(
        "verison: \"0.0.1\"\nendpoints: []\n",
        "unknown key `verison`",
    );
    assert_at(&d, 1, 1, "verison");
    assert_eq!(d.hint.as_deref(), Some("did you mean `version`?"));
}

#[test]
fn unknown_key_without_suggestion_lists_the_keys() {
    let src = format!(
        "{DOCA_HEAD}  - path: /a\n    type: send\n    colour: red\n    buffer: {{ size: 1 }}\n"
    );
    let d = find(&src, "unknown key `colour`");
    assert_at(&d, 5, 5, "endpoints[0].colour");
    assert_eq!(
        d.hint.as_deref(),
        Some("the keys allowed here are `path`, `type`, `buffer`")
    );
}

#[test]
fn extended_key_in_doca_cpp_format() {
    let src = format!(
        "{DOCA_HEAD}  - path: /a\n    type: send\n    method: go\n    buffer: {{ size: 1 }}\n"
    );
    let d = find(
        &src,
        "key `method` is not part of the doca-cpp format (version \"0.0.1\")",
    );
    assert_at(&d, 5, 5, "endpoints[0].method");
    assert!(d.hint.unwrap().contains("rdma-rpc/1"));
}

#[test]
fn wrong_types() {
    let src = format!(
        "{EXT_HEAD}  - path: 42\n    type: send\n    buffer: [4096]\n    doc: {{ a: 1 }}\nmessages: [A]\n"
    );
    let d = find(&src, "`path` must be a string, found an integer");
    assert_at(&d, 3, 11, "endpoints[0].path");
    let d = find(&src, "expected a mapping, found a list");
    assert_at(&d, 5, 13, "endpoints[0].buffer");
    assert_eq!(
        d.hint.as_deref(),
        Some("write it as a mapping with the keys `size`")
    );
    let d = find(&src, "`doc` must be a string, found a mapping");
    assert_at(&d, 6, 10, "endpoints[0].doc");
    let d = find(
        &src,
        "`messages` must be a mapping from names to definitions, found a list",
    );
    assert_at(&d, 7, 11, "messages");
    let d = find(
        &format!("{DOCA_HEAD}  path: /a\n"),
        "`endpoints` must be a list, found a mapping",
    );
    assert_at(&d, 3, 3, "endpoints");
}

#[test]
fn misspelled_operation_type() {
    let src = format!("{DOCA_HEAD}  - path: /a\n    type: recieve\n    buffer: {{ size: 1 }}\n");
    let d = find(&src, "unknown operation type `recieve`");
    assert_at(&d, 4, 11, "endpoints[0].type");
    assert_eq!(d.hint.as_deref(), Some("did you mean `receive`?"));
    let d = find(
        &src.replace("recieve", "Write"),
        "unknown operation type `Write`",
    );
    assert_eq!(d.hint.as_deref(), Some("did you mean `write`?"));
}

#[test]
fn duplicate_path_and_type() {
    let ep = "  - path: /a\n    type: send\n    buffer: { size: 1 }\n";
    let src = format!("{DOCA_HEAD}{ep}{ep}");
    let d = find(&src, "duplicate endpoint: `/a` with type `send`");
    assert_at(&d, 7, 11, "endpoints[1].type");
    assert_eq!(
        d.hint.as_deref(),
        Some("the same path and type are defined on line 3; remove one of them")
    );
    // The same path with another type is fine (one buffer, several operations).
    let ok = format!("{DOCA_HEAD}{ep}{}", ep.replace("send", "receive"));
    parse_spec("test.yaml", &ok).unwrap();
}

#[test]
fn duplicate_method_names() {
    let src = format!(
        "{EXT_HEAD}  - path: /a\n    type: send\n    method: put\n  - path: /b\n    type: send\n    method: put\n"
    );
    let d = find(&src, "duplicate method name `put`");
    assert_at(&d, 8, 13, "endpoints[1].method");
    assert!(d.hint.unwrap().contains("line 3"));
}

#[test]
fn two_paths_map_to_the_same_method() {
    let src = format!(
        "{DOCA_HEAD}  - path: /a-b\n    type: send\n    buffer: {{ size: 1 }}\n  - path: /a_b\n    type: send\n    buffer: {{ size: 1 }}\n"
    );
    let d = find(
        &src,
        "path `/a_b` maps to method name `a_b_send`, like `/a-b` on line 3",
    );
    assert_at(&d, 6, 11, "endpoints[1].path");
    assert!(d.hint.unwrap().contains("rename one of the paths"));
}

#[test]
fn keyword_and_non_snake_case_names() {
    let src = format!(
        "{EXT_HEAD}  - path: /a\n    type: send\n    method: loop\n  - path: /b\n    type: send\n    method: getBlock\nmessages:\n  M:\n    fields:\n      - {{ name: type, type: bool }}\n"
    );
    let d = find(&src, "method name `loop` is a Rust keyword");
    assert_at(&d, 5, 13, "endpoints[0].method");
    assert_eq!(d.hint.as_deref(), Some("choose another name, e.g. `loop_`"));
    let d = find(
        &src,
        "method name `getBlock` is not a snake_case Rust identifier",
    );
    assert_at(&d, 8, 13, "endpoints[1].method");
    assert_eq!(d.hint.as_deref(), Some("did you mean `get_block`?"));
    let d = find(&src, "field name `type` is a Rust keyword");
    assert_at(&d, 12, 17, "messages.M.fields[0].name");
}

#[test]
fn method_names_of_the_generated_client_and_server_are_reserved() {
    let src = format!(
        "{EXT_HEAD}  - path: /a\n    type: send\n    method: connect\n  - path: /b\n    type: read\n    method: from_arc\n    buffer: {{ size: 64 }}\n  - path: /c\n    type: write\n    method: new\n    buffer: {{ size: 64 }}\n  - path: /d\n    type: receive\n    method: inner\n  - path: /e\n    type: send\n    method: loop_\n"
    );
    let all = errors(&src);
    assert_eq!(all.len(), 4, "{all:#?}");
    let d = find(
        &src,
        "method name `connect` collides with a method of the generated client (`connect`)",
    );
    assert_at(&d, 5, 13, "endpoints[0].method");
    assert_eq!(
        d.hint.as_deref(),
        Some("choose another `method`, e.g. `connect_send`")
    );
    let d = find(
        &src,
        "method name `from_arc` collides with a method of the generated server (`from_arc`)",
    );
    assert_at(&d, 8, 13, "endpoints[1].method");
    assert_eq!(
        d.hint.as_deref(),
        Some("choose another `method`, e.g. `from_arc_read`")
    );
    let d = find(
        &src,
        "method name `new` collides with a method of the generated client and server (`new`)",
    );
    assert_at(&d, 12, 13, "endpoints[2].method");
    find(
        &src,
        "method name `inner` collides with a method of the generated client (`inner`)",
    );
}

#[test]
fn generated_name_collisions() {
    let src = "version: \"rdma-rpc/1\"\nservice: KvStore\nendpoints:\n  - { path: /a, type: send }\nmessages:\n  KvStoreClient: {}\n  Result: {}\nenums:\n  KvStore:\n    values: [A]\n";
    let d = find(
        src,
        "message name `KvStoreClient` collides with the generated client of service `KvStore`",
    );
    assert_at(&d, 6, 3, "messages.KvStoreClient");
    let d = find(
        src,
        "message name `Result` would shadow a Rust prelude type",
    );
    assert_at(&d, 7, 3, "messages.Result");
    let d = find(
        src,
        "enum name `KvStore` collides with the service trait of service `KvStore`",
    );
    assert_at(&d, 9, 3, "enums.KvStore");
}

#[test]
fn unknown_message_types() {
    let src = format!(
        "{EXT_HEAD}  - path: /a\n    type: send\n    request: PutReqest\n    response: uint64\nmessages:\n  PutRequest:\n    fields:\n      - {{ name: id, type: uint46 }}\n      - {{ name: next, type: Nope }}\n"
    );
    let d = find(&src, "unknown message type `PutReqest`");
    assert_at(&d, 5, 14, "endpoints[0].request");
    assert_eq!(d.hint.as_deref(), Some("did you mean `PutRequest`?"));
    let d = find(
        &src,
        "`response` must name a message, but `uint64` is a scalar type",
    );
    assert_at(&d, 6, 15, "endpoints[0].response");
    let d = find(&src, "unknown type `uint46`");
    assert_at(&d, 10, 27, "messages.PutRequest.fields[0].type");
    assert_eq!(d.hint.as_deref(), Some("did you mean `uint64`?"));
    find(&src, "unknown type `Nope`");
}

#[test]
fn bad_buffer_sizes() {
    let ep = |size: &str| {
        format!(
            "  - path: /{}\n    type: write\n    buffer:\n      size: {size}\n",
            size.len()
        )
    };
    let src = format!("{EXT_HEAD}{}", ep("0"));
    assert_at(
        &find(&src, "buffer size must be positive, found 0"),
        6,
        13,
        "endpoints[0].buffer.size",
    );
    let src = format!("{EXT_HEAD}{}", ep("-4096"));
    find(&src, "buffer size must be positive, found -4096");
    let src = format!("{EXT_HEAD}{}", ep("2GiB"));
    let d = find(
        &src,
        "buffer size 2147483648 bytes is larger than the maximum of 1073741824 bytes (1 GiB)",
    );
    assert_at(&d, 6, 13, "endpoints[0].buffer.size");
    let src = format!("{EXT_HEAD}{}", ep("99999999999999999999999"));
    assert!(errors(&src)[0].message.contains("larger than the maximum"));
    let src = format!("{EXT_HEAD}{}", ep("4KB"));
    let d = find(&src, "ambiguous size unit in `4KB`");
    assert_eq!(
        d.hint.as_deref(),
        Some("did you mean `4KiB` (4096 bytes)? sizes use binary units only")
    );
    let src = format!("{EXT_HEAD}{}", ep("1.5"));
    find(
        &src,
        "buffer size must be a whole number of bytes, found a float",
    );
    let src = format!("{DOCA_HEAD}{}", ep("4KiB"));
    find(&src, "buffer size `4KiB` is not a number of bytes");
}

#[test]
fn missing_keys() {
    let src = format!("{DOCA_HEAD}  - type: write\n");
    let d = find(&src, "missing key `path`");
    assert_at(&d, 3, 5, "endpoints[0].path");
    let d = find(&src, "missing key `buffer`");
    assert_at(&d, 3, 5, "endpoints[0].buffer");
    let d = find("version: \"0.0.1\"\n", "missing key `endpoints`");
    assert_at(&d, 1, 1, "endpoints");
}

#[test]
fn unsupported_versions() {
    let d = find(
        "version: \"0.0.2\"\nendpoints: []\n",
        "unsupported spec version `0.0.2`",
    );
    assert_at(&d, 1, 10, "version");
    assert!(d.hint.unwrap().starts_with("did you mean `\"0.0.1\"`?"));
    let d = find(
        "version: 1\nendpoints: []\n",
        "`version` must be a string, found an integer",
    );
    assert_at(&d, 1, 10, "version");
    let d = find("endpoints: []\n", "missing key `version`");
    assert_at(&d, 1, 1, "version");
}

#[test]
fn duplicate_yaml_keys() {
    let src = format!(
        "{DOCA_HEAD}  - path: /a\n    type: send\n    type: read\n    buffer: {{ size: 1 }}\n"
    );
    let d = find(&src, "duplicate key `type`");
    assert_at(&d, 5, 5, "endpoints[0].type");
    assert!(d.hint.unwrap().contains("line 4"));
    let src =
        format!("{EXT_HEAD}  - {{ path: /a, type: send }}\nmessages:\n  A: {{}}\n  A: {{}}\n");
    assert_at(&find(&src, "`A` is defined twice"), 6, 3, "messages.A");
}

#[test]
fn bad_timeouts() {
    let ep = |t: &str| format!("{EXT_HEAD}  - path: /a\n    type: send\n    timeout: {t}\n");
    let d = find(
        &ep("5"),
        "timeout must be a duration with a unit, found an integer",
    );
    assert_at(&d, 5, 14, "endpoints[0].timeout");
    find(&ep("0ms"), "timeout must be positive, found `0ms`");
    find(
        &ep("2h"),
        "timeout `2h` is longer than the maximum of 3600 s",
    );
    find(
        &ep("5 fortnights"),
        "unknown duration unit `fortnights` in `5 fortnights`",
    );
}

#[test]
fn bad_paths_and_enums() {
    let src = format!(
        "{EXT_HEAD}  - {{ path: rdma/x, type: send }}\nenums:\n  E:\n    values:\n      - {{ name: A, number: 1 }}\n      - {{ name: B, number: 1 }}\n      - a\n"
    );
    let d = find(&src, "path `rdma/x` does not start with `/`");
    assert_at(&d, 3, 13, "endpoints[0].path");
    let d = find(&src, "the first value of enum `E` has number 1, not 0");
    assert_at(&d, 7, 28, "enums.E.values[0].number");
    let d = find(&src, "enum number 1 is used twice in enum `E`");
    assert_at(&d, 8, 28, "enums.E.values[1].number");
    let d = find(
        &src,
        "enum value `a` becomes the Rust variant `A`, like `A` on line 7",
    );
    assert_at(&d, 9, 9, "enums.E.values[2]");
}

#[test]
fn every_error_is_reported_in_one_pass() {
    let src = "version: \"0.0.1\"\nendpoints:\n  - path: /a\n    type: sned\n    buffer: { size: 0 }\n  - path: /b\n    typ: send\n    buffer: { size: 4096 }\n  - path: /a\n    type: read\n    buffer: { size: 5000000000 }\n";
    let all = errors(src);
    let got: Vec<_> = all
        .iter()
        .map(|d| (d.line, d.column, d.message.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (4, 11, "unknown operation type `sned`"),
            (5, 21, "buffer size must be positive, found 0"),
            (7, 5, "unknown key `typ`"),
            (
                11,
                21,
                "buffer size 5000000000 bytes is larger than the maximum of 1073741824 bytes (1 GiB)"
            ),
        ]
    );
    let err = parse_spec("test.yaml", src).unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("test.yaml: 4 errors in spec\n\nerror: unknown operation type `sned`\n  --> test.yaml:4:11\n   = key: endpoints[0].type\n   = help: did you mean `send`?\n\n"), "{text}");
}

#[test]
fn remote_buffer_fields_resolve_and_misspellings_are_named() {
    let src = format!(
        "{EXT_HEAD}  - path: /a\n    type: send\n    request: HalfIo\nmessages:\n  HalfIo:\n    fields:\n      - {{ name: buf, type: remote_buffer }}\n      - {{ name: more, type: remote_buffer, repeated: true }}\n"
    );
    let ir = parse_spec("io.yaml", &src).expect("a valid spec");
    let types: Vec<_> = ir.messages[0].fields.iter().map(|f| f.ty.clone()).collect();
    use rdma_rpc_codegen::TypeRef;
    assert_eq!(types, [TypeRef::RemoteBuffer, TypeRef::RemoteBuffer]);
    let d = find(
        &src.replace("type: remote_buffer }", "type: remote_bufer }"),
        "unknown type `remote_bufer`",
    );
    assert_at(&d, 9, 28, "messages.HalfIo.fields[0].type");
    assert_eq!(d.hint.as_deref(), Some("did you mean `remote_buffer`?"));
    // As a request or response, it is not a message.
    find(
        &src.replace("request: HalfIo", "request: remote_buffer"),
        "unknown message type `remote_buffer`",
    );
}

#[test]
fn payload_false_on_a_one_sided_endpoint() {
    let src = format!(
        "{EXT_HEAD}  - path: /a\n    type: write\n    buffer: {{ size: 4KiB }}\n    payload: false\n"
    );
    let d = find(
        &src,
        "a `write` endpoint always moves bytes: `payload: false` does not fit it",
    );
    assert_at(&d, 6, 14, "endpoints[0].payload");
    assert!(d.hint.as_deref().unwrap().contains("`type: send`"), "{d}");
    // In the doca-cpp format the key does not exist.
    let src = format!(
        "{DOCA_HEAD}  - path: /a\n    type: send\n    buffer: {{ size: 64 }}\n    payload: false\n"
    );
    assert!(
        errors(&src)
            .iter()
            .any(|d| d.message.contains("payload") && d.key == "endpoints[0].payload"),
        "{:#?}",
        errors(&src)
    );
}

#[test]
fn bulk_stream_on_a_two_sided_endpoint() {
    let src = format!("{EXT_HEAD}  - path: /a\n    type: send\n    stream:\n      max_len: 1GiB\n");
    let d = find(&src, "a `send` endpoint has no bulk stream");
    assert_at(&d, 5, 5, "endpoints[0].stream");
    assert_eq!(
        d.hint.as_deref(),
        Some(
            "bulk streams are for write and read endpoints; stream messages with \
             `request: { stream: T }` / `response: { stream: T }`"
        )
    );
    find(
        &src.replace("type: send", "type: receive"),
        "a `receive` endpoint has no bulk stream",
    );
}

#[test]
fn message_stream_on_a_one_sided_endpoint() {
    let src = format!(
        "{EXT_HEAD}  - path: /a\n    type: write\n    buffer: {{ size: 4KiB }}\n    request: {{ stream: Line }}\n    response:\n      stream: Line\nmessages:\n  Line: {{}}\n"
    );
    let all = errors(&src);
    assert_eq!(all.len(), 2, "{all:#?}");
    let d = &all[0];
    assert_eq!(d.message, "a `write` endpoint has no message streams");
    assert_at(d, 6, 16, "endpoints[0].request.stream");
    let hint = d.hint.as_deref().unwrap();
    assert!(hint.contains("`stream: { max_len: .. }`"), "{hint}");
    assert!(hint.contains("(`request: Name`)"), "{hint}");
    assert_at(&all[1], 8, 7, "endpoints[0].response.stream");
    assert!(all[1]
        .hint
        .as_deref()
        .unwrap()
        .contains("(`response: Name`)"));
    let read = errors(&src.replace("type: write", "type: read"));
    assert!(
        read.iter()
            .all(|d| d.message == "a `read` endpoint has no message streams"),
        "{read:#?}"
    );
}

#[test]
fn bulk_stream_limits() {
    let ep = |max_len: &str| {
        format!(
            "{EXT_HEAD}  - path: /a\n    type: read\n    buffer: {{ size: 4MiB }}\n    stream:\n      max_len: {max_len}\n"
        )
    };
    parse_spec("test.yaml", &ep("4MiB")).expect("max_len may equal the buffer");
    parse_spec("test.yaml", &ep("1TiB")).expect("1 TiB is the limit");
    let d = find(
        &ep("1MiB"),
        "stream max_len 1048576 bytes is smaller than the buffer size 4194304 bytes",
    );
    assert_at(&d, 7, 16, "endpoints[0].stream.max_len");
    assert!(d
        .hint
        .as_deref()
        .unwrap()
        .contains("at least the buffer size"));
    let d = find(
        &ep("2TiB"),
        "stream max_len 2199023255552 bytes is larger than the maximum of 1099511627776 bytes (1 TiB)",
    );
    assert_at(&d, 7, 16, "endpoints[0].stream.max_len");
    find(&ep("0"), "stream max_len must be positive, found 0");
    let d = find(&ep("1GB"), "ambiguous size unit in `1GB`");
    assert_eq!(
        d.hint.as_deref(),
        Some("did you mean `1GiB` (1073741824 bytes)? sizes use binary units only")
    );
    let d = find(
        &ep("1 gigabyte"),
        "unknown size unit `gigabyte` in `1 gigabyte`",
    );
    assert_at(&d, 7, 16, "endpoints[0].stream.max_len");
    find(&ep("lots"), "stream max_len `lots` is not a size");
    find(
        &ep("[1]"),
        "stream max_len must be a whole number of bytes, found a list",
    );
}

#[test]
fn bulk_stream_without_max_len() {
    let src = format!(
        "{EXT_HEAD}  - path: /a\n    type: write\n    buffer: {{ size: 4MiB }}\n    stream: {{}}\n"
    );
    let d = find(&src, "missing key `max_len`");
    assert_at(&d, 6, 13, "endpoints[0].stream.max_len");
    assert!(d.hint.as_deref().unwrap().contains("`max_len: 1GiB`"));
    // A misspelling is reported once, as a misspelling.
    let src = src.replace("stream: {}", "stream: { maxlen: 1GiB }");
    let all = errors(&src);
    assert_eq!(all.len(), 1, "{all:#?}");
    assert_eq!(all[0].message, "unknown key `maxlen`");
    assert_eq!(all[0].hint.as_deref(), Some("did you mean `max_len`?"));
    let d = find(
        &src.replace("{ maxlen: 1GiB }", "1GiB"),
        "expected a mapping, found a string",
    );
    assert_at(&d, 6, 13, "endpoints[0].stream");
    assert_eq!(
        d.hint.as_deref(),
        Some("write it as a mapping with the keys `max_len`")
    );
}

#[test]
fn streamed_messages_must_be_declared_messages() {
    let src = format!(
        "{EXT_HEAD}  - path: /a\n    type: receive\n    response: {{ stream: ObjectInf }}\n  - path: /b\n    type: send\n    request:\n      stream:\n  - path: /c\n    type: send\n    request: {{ stream: uint64 }}\n  - path: /d\n    type: send\n    request: {{ steam: ObjectInfo }}\n  - path: /e\n    type: send\n    request: {{}}\n  - path: /f\n    type: send\n    response: [ObjectInfo]\nmessages:\n  ObjectInfo: {{}}\n"
    );
    let d = find(&src, "unknown message type `ObjectInf`");
    assert_at(&d, 5, 25, "endpoints[0].response.stream");
    assert_eq!(d.hint.as_deref(), Some("did you mean `ObjectInfo`?"));
    let d = find(&src, "a stream must name its message");
    assert_at(&d, 9, 7, "endpoints[1].request.stream");
    assert!(d.hint.as_deref().unwrap().contains("`stream: ObjectInfo`"));
    let d = find(
        &src,
        "`stream` must name a message, but `uint64` is a scalar type",
    );
    assert_at(&d, 12, 24, "endpoints[2].request.stream");
    let d = find(&src, "unknown key `steam`");
    assert_eq!(d.hint.as_deref(), Some("did you mean `stream`?"));
    let d = find(&src, "missing key `stream`");
    assert_at(&d, 18, 14, "endpoints[4].request.stream");
    let d = find(
        &src,
        "`response` must be a message name or `{ stream: Message }`, found a list",
    );
    assert_at(&d, 21, 15, "endpoints[5].response");
    assert_eq!(errors(&src).len(), 6, "{:#?}", errors(&src));
}

#[test]
fn payload_contradicting_a_stream() {
    let src = format!(
        "{EXT_HEAD}  - path: /a\n    type: send\n    payload: true\n    request: {{ stream: M }}\n  - path: /b\n    type: write\n    buffer: {{ size: 4KiB }}\n    stream: {{ max_len: 1MiB }}\n    payload: false\nmessages:\n  M: {{}}\n"
    );
    let d = find(
        &src,
        "a message-streaming endpoint carries no payload: `payload: true` does not fit it",
    );
    assert_at(&d, 5, 14, "endpoints[0].payload");
    assert!(d
        .hint
        .as_deref()
        .unwrap()
        .starts_with("its messages are the call"));
    let d = find(
        &src,
        "a bulk stream moves bytes: `payload: false` does not fit it",
    );
    assert_at(&d, 11, 14, "endpoints[1].payload");
    // One diagnostic for it, not the general one of `payload: false` on a write as well.
    assert_eq!(errors(&src).len(), 2, "{:#?}", errors(&src));
    // `payload: false` on a message stream says what is so anyway; a `buffer` there bounds
    // the request and response messages and gives no payload.
    let ok = src
        .replace(
            "payload: true",
            "payload: false\n    buffer: { size: 1KiB }",
        )
        .replace("    payload: false\nmessages", "messages");
    let ir = parse_spec("test.yaml", &ok).unwrap();
    assert!(!ir.endpoints[0].payload);
    assert_eq!(ir.endpoints[0].buffer_size, 1024);
}

#[test]
fn streams_in_the_doca_cpp_format() {
    let src = format!(
        "{DOCA_HEAD}  - path: /a\n    type: write\n    buffer: {{ size: 4096 }}\n    stream: {{ max_len: 1073741824 }}\n  - path: /b\n    type: send\n    buffer: {{ size: 64 }}\n    request: {{ stream: M }}\n"
    );
    let all = errors(&src);
    assert_eq!(all.len(), 2, "{all:#?}");
    let d = find(
        &src,
        "key `stream` is not part of the doca-cpp format (version \"0.0.1\")",
    );
    assert_at(&d, 6, 5, "endpoints[0].stream");
    assert_eq!(
        d.hint.as_deref(),
        Some("use `version: \"rdma-rpc/1\"` for the extended format")
    );
    let d = find(
        &src,
        "key `request` is not part of the doca-cpp format (version \"0.0.1\")",
    );
    assert_at(&d, 10, 5, "endpoints[1].request");
}

#[test]
fn names_generated_for_streams_must_not_clash() {
    // `list_` and `list` both name their stream type `ListStream`.
    let src = format!(
        "{EXT_HEAD}  - path: /a\n    type: receive\n    method: list\n    response: {{ stream: M }}\n  - path: /b\n    type: receive\n    method: list_\n    response: {{ stream: M }}\nmessages:\n  M: {{}}\n"
    );
    let d = find(
        &src,
        "method `list_` names its stream type `ListStream`, like `list` on line 5",
    );
    assert_at(&d, 9, 13, "endpoints[1].method");
    // A bulk read's client has `<method>_stream` (and `<method>_into`) besides `<method>`.
    let src = format!(
        "{EXT_HEAD}  - path: /a\n    type: read\n    method: get\n    buffer: {{ size: 4KiB }}\n    stream: {{ max_len: 1MiB }}\n  - path: /b\n    type: send\n    method: get_stream\n  - path: /c\n    type: send\n    method: get_into\n"
    );
    let all = errors(&src);
    assert_eq!(all.len(), 2, "{all:#?}");
    let d = find(
        &src,
        "the generated client method `get_stream` of `get` collides with the method of the endpoint on line 8",
    );
    assert_at(&d, 5, 13, "endpoints[0].method");
    find(
        &src,
        "the generated client method `get_into` of `get` collides with the method of the endpoint on line 11",
    );
}
