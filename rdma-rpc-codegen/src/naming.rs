//! Naming rules: how service and method names are derived when a spec does not give them,
//! which names are valid Rust identifiers, and "did you mean" suggestions.
//!
//! The rules are documented in `docs/spec.md` ("Naming rules"); keep the two in step.

use heck::{ToSnakeCase, ToUpperCamelCase};

use crate::ir::{EndpointIr, OpKind};

/// Rust keywords (strict, reserved and edition-dependent) that cannot be plain identifiers.
const KEYWORDS: &[&str] = &[
    "abstract", "as", "async", "await", "become", "box", "break", "const", "continue", "crate",
    "do", "dyn", "else", "enum", "extern", "false", "final", "fn", "for", "gen", "if", "impl",
    "in", "let", "loop", "macro", "match", "mod", "move", "mut", "override", "priv", "pub", "ref",
    "return", "self", "Self", "static", "struct", "super", "trait", "true", "try", "type",
    "typeof", "unsafe", "unsized", "use", "virtual", "where", "while", "yield",
];

/// Type names that generated code uses unqualified (prelude types and their variants):
/// a message or enum with one of these names would shadow them.
const RESERVED_TYPE_NAMES: &[&str] = &[
    "Self", "Option", "Some", "None", "Result", "Ok", "Err", "String", "Vec", "Box", "Default",
];

/// Method names the generated code already uses on the client (`<Service>Client`) or the
/// server adapter (`<Service>Server`), with the item that owns each. `clone` is here because an
/// inherent `clone` method on the client would shadow `Clone::clone`.
const RESERVED_METHOD_NAMES: &[(&str, &str)] = &[
    ("new", "the generated client and server (`new`)"),
    ("connect", "the generated client (`connect`)"),
    ("inner", "the generated client (`inner`)"),
    ("from_arc", "the generated server (`from_arc`)"),
    ("clone", "the generated client (`Clone::clone`)"),
];

/// If an endpoint method may not be called `name` because the generated client or server
/// already has a method of that name, which generated item owns it.
///
/// ```
/// use rdma_rpc_codegen::naming::reserved_method_name;
/// assert!(reserved_method_name("connect").is_some());
/// assert!(reserved_method_name("put_block").is_none());
/// ```
pub fn reserved_method_name(name: &str) -> Option<&'static str> {
    RESERVED_METHOD_NAMES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, owner)| *owner)
}

/// The client methods generated for `ep` besides the one named after it: `<method>_into`
/// for receive and read endpoints with a payload (the result lands in the caller's buffer)
/// and `<method>_stream` for bulk read streams (the chunks as they arrive). No other endpoint
/// may have one of these names.
///
/// ```
/// let ir = rdma_rpc_codegen::parse_spec(
///     "s.yaml",
///     "version: \"rdma-rpc/1\"\nendpoints:\n  - { path: /o, type: read, method: get, buffer: { size: 4KiB }, stream: { max_len: 1GiB } }\n",
/// )
/// .unwrap();
/// let extra = rdma_rpc_codegen::naming::extra_client_methods(&ir.endpoints[0]);
/// assert_eq!(extra, ["get_into", "get_stream"]);
/// ```
pub fn extra_client_methods(ep: &EndpointIr) -> Vec<String> {
    let mut extra = Vec::new();
    if ep.payload && !ep.op.is_inbound() {
        extra.push(format!("{}_into", ep.method));
    }
    if ep.op == OpKind::Read && ep.stream.max_len().is_some() {
        extra.push(format!("{}_stream", ep.method));
    }
    extra
}

/// The server trait's associated type for the stream of responses a handler returns:
/// `list_objects` → `ListObjectsStream` (as tonic-build names them).
///
/// ```
/// assert_eq!(rdma_rpc_codegen::naming::stream_type_name("list_objects"), "ListObjectsStream");
/// ```
pub fn stream_type_name(method: &str) -> String {
    format!("{}Stream", method.to_upper_camel_case())
}

/// Whether `name` is a Rust keyword.
pub fn is_keyword(name: &str) -> bool {
    KEYWORDS.contains(&name)
}

/// Whether a message or enum may not be named `name` because generated code relies on the
/// prelude type of that name.
pub fn is_reserved_type_name(name: &str) -> bool {
    RESERVED_TYPE_NAMES.contains(&name)
}

/// Whether `name` is an ASCII identifier: a letter or `_` followed by letters, digits, `_`,
/// and not `_` alone.
pub fn is_ascii_ident(name: &str) -> bool {
    let mut chars = name.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return false,
    }
    name != "_" && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `name` is a snake_case identifier that is not a keyword, and so usable as a method
/// or field name unchanged. Trailing underscores are allowed (`loop_`, `type_`).
pub fn is_snake_case_ident(name: &str) -> bool {
    let base = name.trim_end_matches('_');
    is_ascii_ident(name) && !is_keyword(name) && !base.is_empty() && base.to_snake_case() == base
}

/// Whether `name` is an UpperCamelCase identifier, and so usable as a type name unchanged.
pub fn is_upper_camel_ident(name: &str) -> bool {
    is_ascii_ident(name) && !is_keyword(name) && name.to_upper_camel_case() == name
}

/// Replaces every character that is not an ASCII letter or digit with `_`.
fn ascii_words(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The method name of an endpoint that does not give one.
///
/// 1. Every character of the path that is not an ASCII letter or digit becomes `_`.
/// 2. The result is converted to snake_case (heck): camelCase words are split, letters are
///    lowercased, runs of `_` collapse and leading or trailing `_` go.
/// 3. `_` and the operation type are appended (just the type if nothing is left).
/// 4. A name that starts with a digit gets the prefix `ep_`.
///
/// Because the name always ends with the operation type it can never be a keyword.
///
/// ```
/// use rdma_rpc_codegen::{naming::derive_method_name, OpKind};
/// assert_eq!(derive_method_name("/rdma/ep0", OpKind::Receive), "rdma_ep0_receive");
/// assert_eq!(derive_method_name("/kv/getBlock", OpKind::Read), "kv_get_block_read");
/// assert_eq!(derive_method_name("/2fa-check", OpKind::Send), "ep_2fa_check_send");
/// assert_eq!(derive_method_name("/", OpKind::Write), "write");
/// ```
pub fn derive_method_name(path: &str, op: OpKind) -> String {
    let base = ascii_words(path).to_snake_case();
    let name = if base.is_empty() {
        op.as_str().to_owned()
    } else {
        format!("{base}_{op}")
    };
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        format!("ep_{name}")
    } else {
        name
    }
}

/// The service name of a spec that does not give one, from its file name.
///
/// The file name without its last extension is converted like a path (non-ASCII-alphanumeric
/// characters become word breaks), then to UpperCamelCase (heck). A name that would be empty
/// or start with a digit gets the prefix `Service`.
///
/// ```
/// use rdma_rpc_codegen::naming::service_name_from_file;
/// assert_eq!(service_name_from_file("specs/doca_cpp_endpoints.yaml"), "DocaCppEndpoints");
/// assert_eq!(service_name_from_file("my-service.v2.yml"), "MyServiceV2");
/// assert_eq!(service_name_from_file("3d.yaml"), "Service3d");
/// ```
pub fn service_name_from_file(file: &str) -> String {
    let base = file.rsplit(['/', '\\']).next().unwrap_or(file);
    let stem = match base.rfind('.') {
        Some(i) if i > 0 => &base[..i],
        _ => base,
    };
    let name = ascii_words(stem).to_upper_camel_case();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        format!("Service{name}")
    } else {
        name
    }
}

/// The snake_case spelling of `name`, for hints.
pub fn to_snake(name: &str) -> String {
    ascii_words(name).to_snake_case()
}

/// The UpperCamelCase spelling of `name`, for hints and enum variants.
pub fn to_upper_camel(name: &str) -> String {
    ascii_words(name).to_upper_camel_case()
}

/// The candidate closest to `word`, if it is close enough to be a likely typo: an edit
/// distance (with transpositions, ignoring case) of at most one third of the word, at least 1.
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let lower = word.to_ascii_lowercase();
    let limit = (word.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|c| (edit_distance(&lower, &c.to_ascii_lowercase()), c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Optimal-string-alignment distance: insertions, deletions, substitutions and adjacent
/// transpositions each cost 1.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // Inputs are keys and type names; refuse to spend quadratic time on anything long.
    if a.len() > 64 || b.len() > 64 {
        return usize::MAX;
    }
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_names() {
        assert_eq!(
            derive_method_name("/rdma/ep0", OpKind::Receive),
            "rdma_ep0_receive"
        );
        assert_eq!(
            derive_method_name("/rdma/ep1", OpKind::Write),
            "rdma_ep1_write"
        );
        assert_eq!(derive_method_name("/a//b--c/", OpKind::Send), "a_b_c_send");
        assert_eq!(
            derive_method_name("/Kv/PutBlock", OpKind::Write),
            "kv_put_block_write"
        );
        assert_eq!(derive_method_name("/données", OpKind::Read), "donn_es_read");
        assert_eq!(derive_method_name("/0", OpKind::Read), "ep_0_read");
        assert_eq!(derive_method_name("/fn", OpKind::Send), "fn_send");
    }

    #[test]
    fn service_names() {
        assert_eq!(
            service_name_from_file("doca_cpp_endpoints.yaml"),
            "DocaCppEndpoints"
        );
        assert_eq!(service_name_from_file("/x/kv_store.yaml"), "KvStore");
        assert_eq!(service_name_from_file("-.yaml"), "Service");
    }

    #[test]
    fn identifiers() {
        assert!(is_snake_case_ident("put_block"));
        assert!(!is_snake_case_ident("putBlock"));
        assert!(!is_snake_case_ident("type"));
        assert!(!is_snake_case_ident("1x"));
        assert!(is_snake_case_ident("loop_"));
        assert!(!is_snake_case_ident("_"));
        assert!(!is_snake_case_ident("__"));
        assert!(is_upper_camel_ident("KvStore"));
        assert!(!is_upper_camel_ident("kv_store"));
        assert!(!is_upper_camel_ident("Self"));
    }

    #[test]
    fn suggestions() {
        assert_eq!(
            closest("recieve", ["send", "receive", "write", "read"]),
            Some("receive")
        );
        assert_eq!(closest("Send", ["send", "receive"]), Some("send"));
        assert_eq!(closest("sise", ["size"]), Some("size"));
        assert_eq!(closest("banana", ["size", "path"]), None);
    }
}
