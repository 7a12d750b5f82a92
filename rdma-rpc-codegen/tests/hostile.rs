//! Hostile input is refused with a diagnostic, in bounded time and memory.

use rdma_rpc_codegen::{limits, parse_spec};

fn only_error(file: &str, src: &str) -> rdma_rpc_codegen::Diagnostic {
    let err = parse_spec(file, src).unwrap_err();
    assert_eq!(err.diagnostics().len(), 1, "{err}");
    err.diagnostics()[0].clone()
}

#[test]
fn alias_bomb_is_refused() {
    // "Billion laughs": nine levels of nine aliases would expand to 9^9 strings.
    let mut src =
        String::from("version: \"0.0.1\"\nl0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..=9 {
        let prev = format!("*l{}", i - 1);
        let items = [prev.as_str(); 9].join(", ");
        src.push_str(&format!("l{i}: &l{i} [{items}]\n"));
    }
    src.push_str("endpoints: *l9\n");
    let d = only_error("bomb.yaml", &src);
    assert!(
        d.message
            .starts_with("the spec is too large or too complex to accept"),
        "{d}"
    );
    assert!(d.line > 1, "{d}");
}

#[test]
fn deep_flow_nesting_is_refused() {
    let depth = 100_000;
    let src = format!(
        "version: \"0.0.1\"\nendpoints: {}{}\n",
        "[".repeat(depth),
        "]".repeat(depth)
    );
    let d = only_error("deep.yaml", &src);
    assert!(
        d.message.contains("too complex") || d.message.contains("nests deeper"),
        "{d}"
    );
}

#[test]
fn deep_block_nesting_is_refused() {
    let mut src = String::from("version: \"0.0.1\"\nendpoints:\n");
    for i in 0..200 {
        src.push_str(&"  ".repeat(i + 1));
        src.push_str(&format!("k{i}:\n"));
    }
    let d = only_error("deep.yaml", &src);
    assert_eq!(d.message, "the spec nests deeper than 16 levels");
    assert_eq!(d.line, 18);
}

#[test]
fn oversized_file_is_refused_before_parsing() {
    // 2 MiB of an unterminated flow sequence: parsing it would fail anyway, but the size
    // check must come first.
    let src = format!("version: \"0.0.1\"\nendpoints: [{}", "x, ".repeat(700_000));
    assert!(src.len() > limits::MAX_SPEC_BYTES);
    let d = only_error("big.yaml", &src);
    assert_eq!(
        d.message,
        format!(
            "the spec is {} bytes, more than the limit of 1048576 bytes",
            src.len()
        )
    );
    assert_eq!((d.line, d.column), (1, 1));
}

#[test]
fn oversized_file_on_disk_is_refused() {
    let path =
        std::env::temp_dir().join(format!("rdma-rpc-codegen-big-{}.yaml", std::process::id()));
    std::fs::write(&path, vec![b'#'; limits::MAX_SPEC_BYTES + 10]).unwrap();
    let err = rdma_rpc_codegen::load_spec(&path).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(err.diagnostics().len(), 1, "{err}");
    assert!(
        err.diagnostics()[0].message.contains("more than the limit"),
        "{err}"
    );
}

#[test]
fn several_documents_and_empty_input_are_refused() {
    let d = only_error(
        "two.yaml",
        "version: \"0.0.1\"\nendpoints: []\n---\nversion: \"0.0.1\"\n",
    );
    assert_eq!(d.message, "the spec holds more than one YAML document");
    let d = only_error("empty.yaml", "  \n");
    assert_eq!(d.message, "the spec is empty");
    let d = only_error("scalar.yaml", "hello\n");
    assert_eq!(d.message, "a spec must be a mapping, found a string");
}

#[test]
fn invalid_utf8_on_disk_is_reported() {
    let path =
        std::env::temp_dir().join(format!("rdma-rpc-codegen-utf8-{}.yaml", std::process::id()));
    std::fs::write(&path, b"version: \"0.0.1\"\nendpoints:\n  - path: /\xff\n").unwrap();
    let err = rdma_rpc_codegen::load_spec(&path).unwrap_err();
    std::fs::remove_file(&path).unwrap();
    let d = &err.diagnostics()[0];
    assert_eq!(
        (d.message.as_str(), d.line, d.column),
        ("the spec is not valid UTF-8", 3, 12)
    );
}
