//! Structure-aware fuzzing of the spec parser, on stable Rust (property-based): specs built
//! from the grammar of both formats, then mutated, never panic, and every error points into
//! the source with a line and a column. CI runs the default number of cases; a longer run:
//! `PROPTEST_CASES=100000 cargo test --release -p rdma-rpc-codegen --test fuzz`.

use proptest::prelude::*;
use rdma_rpc_codegen::parse_spec;

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "/rdma/ep0",
            "/kv/block",
            "send",
            "receive",
            "write",
            "read",
            "4096",
            "4MiB",
            "1KiB",
            "0",
            "-1",
            "250ms",
            "1s",
            "PutBlockRequest",
            "{ stream: PutBlockRequest }",
            "{ stream: }",
            "{ max_len: 1GiB }",
            "1TiB",
            "u64",
            "string",
            "bytes",
            "true",
            "~",
            "\"\"",
            "''",
            "[]",
            "{}",
            "&a x",
            "*a",
            "!!binary x",
            "|",
            ">",
        ])
        .prop_map(String::from),
        "[ -~]{0,16}",
        any::<u64>().prop_map(|n| n.to_string()),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "path",
            "type",
            "method",
            "doc",
            "buffer",
            "size",
            "request",
            "response",
            "timeout",
            "payload",
            "stream",
            "max_len",
            "fields",
            "name",
            "pth",
            "Type",
            "buffer_size",
        ])
        .prop_map(String::from),
        "[a-z_]{1,8}",
    ]
}

/// One endpoint: some of its keys, in any order, with plausible or odd values; `buffer`
/// nested as the formats nest it.
fn endpoint() -> impl Strategy<Value = String> {
    prop::collection::vec((key(), value(), any::<bool>()), 0..7).prop_map(|entries| {
        let mut out = String::new();
        for (i, (k, v, nested)) in entries.into_iter().enumerate() {
            let lead = if i == 0 { "  - " } else { "    " };
            if nested {
                out.push_str(&format!("{lead}{k}:\n      size: {v}\n"));
            } else {
                out.push_str(&format!("{lead}{k}: {v}\n"));
            }
        }
        if out.is_empty() {
            out.push_str("  - {}\n");
        }
        out
    })
}

fn spec() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec!["\"0.0.1\"", "\"rdma-rpc/1\"", "\"9\"", "1", "[]"]),
        prop::option::of(value()),
        prop::collection::vec(endpoint(), 0..6),
    )
        .prop_map(|(version, service, endpoints)| {
            let mut out = format!("version: {version}\n");
            if let Some(service) = service {
                out.push_str(&format!("service: {service}\n"));
            }
            out.push_str("endpoints:\n");
            for e in endpoints {
                out.push_str(&e);
            }
            out
        })
}

/// A spec with a few bytes replaced, inserted or removed.
fn mutated() -> impl Strategy<Value = String> {
    (
        spec(),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 0..4),
    )
        .prop_map(|(spec, edits)| {
            let mut bytes = spec.into_bytes();
            for (at, byte, how) in edits {
                if bytes.is_empty() {
                    break;
                }
                let i = at.index(bytes.len());
                match how {
                    0 => bytes[i] = byte,
                    1 => bytes.insert(i, byte),
                    _ => {
                        bytes.remove(i);
                    }
                }
            }
            String::from_utf8_lossy(&bytes).into_owned()
        })
}

fn check(source: &str) {
    let lines = source.lines().count() as u64 + 1;
    if let Err(err) = parse_spec("fuzz.yaml", source) {
        assert!(!err.diagnostics().is_empty());
        for d in err.diagnostics().iter() {
            assert!(
                d.line >= 1 && d.line <= lines,
                "{d} (source of {lines} lines)"
            );
            assert!(d.column >= 1, "{d}");
            assert!(!d.message.is_empty(), "{d}");
        }
    }
}

proptest! {
    #[test]
    fn generated_specs_never_panic_and_errors_point_into_the_source(source in spec()) {
        check(&source);
    }

    #[test]
    fn mutated_specs_never_panic_and_errors_point_into_the_source(source in mutated()) {
        check(&source);
    }

    #[test]
    fn arbitrary_text_never_panics(source in "[ -~\n\t]{0,400}") {
        check(&source);
    }
}
