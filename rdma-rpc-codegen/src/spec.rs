//! The spec model: the YAML tree decoded into typed spec items, each value keeping its
//! position and key path. Structural problems (unknown keys, wrong types, bad sizes and
//! durations, unsupported versions) are reported here; cross-references and naming are
//! checked in [`crate::validate`].

use std::time::Duration;

use crate::diagnostics::Sink;
use crate::ir::{OpKind, SpecFormat};
use crate::limits;
use crate::naming::closest;
use crate::yaml::{Kind, Node, Pos};

/// A decoded value with where it came from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sp<T> {
    pub(crate) value: T,
    pub(crate) pos: Pos,
    /// The key path, e.g. `endpoints[1].buffer.size`.
    pub(crate) key: String,
}

/// A whole spec file.
#[derive(Debug)]
pub(crate) struct SpecFile {
    pub(crate) format: SpecFormat,
    pub(crate) service: Option<Sp<String>>,
    pub(crate) doc: Option<Sp<String>>,
    /// `None` when the key is missing (reported already).
    pub(crate) endpoints: Option<Sp<Vec<EndpointSpec>>>,
    pub(crate) messages: Vec<MessageSpec>,
    pub(crate) enums: Vec<EnumSpec>,
}

/// One item of `endpoints`.
#[derive(Debug)]
pub(crate) struct EndpointSpec {
    pub(crate) pos: Pos,
    pub(crate) path: Option<Sp<String>>,
    pub(crate) op: Option<Sp<OpKind>>,
    pub(crate) buffer_size: Option<Sp<u64>>,
    pub(crate) method: Option<Sp<String>>,
    pub(crate) doc: Option<Sp<String>>,
    pub(crate) request: Option<MessageRefSpec>,
    pub(crate) response: Option<MessageRefSpec>,
    pub(crate) timeout: Option<Sp<Duration>>,
    /// `payload:`, if given.
    pub(crate) payload: Option<Sp<bool>>,
    /// Whether the endpoint has a `buffer` key (valid or not).
    pub(crate) buffer_given: bool,
    /// `stream:` (a bulk stream), if given.
    pub(crate) stream: Option<StreamSpec>,
}

/// An endpoint's `request` or `response`: a message name, or `{ stream: Name }`.
#[derive(Debug)]
pub(crate) struct MessageRefSpec {
    /// The message name; `None` when a stream names none (reported already).
    pub(crate) name: Option<Sp<String>>,
    /// The `stream` key (where it is, its key path), when the messages stream
    /// (`{ stream: Name }`).
    pub(crate) stream: Option<Sp<()>>,
}

/// An endpoint's `stream:` mapping (a bulk stream).
#[derive(Debug)]
pub(crate) struct StreamSpec {
    /// Where the `stream` key is.
    pub(crate) pos: Pos,
    /// Its key path, `endpoints[i].stream`.
    pub(crate) key: String,
    /// `max_len`, when given and valid.
    pub(crate) max_len: Option<Sp<u64>>,
}

/// One entry of `messages`.
#[derive(Debug)]
pub(crate) struct MessageSpec {
    pub(crate) name: Sp<String>,
    pub(crate) doc: Option<Sp<String>>,
    pub(crate) fields: Vec<FieldSpec>,
}

/// One item of a message's `fields`.
#[derive(Debug)]
pub(crate) struct FieldSpec {
    pub(crate) pos: Pos,
    pub(crate) key: String,
    pub(crate) name: Option<Sp<String>>,
    pub(crate) ty: Option<Sp<String>>,
    pub(crate) tag: Option<Sp<i128>>,
    pub(crate) repeated: Option<Sp<bool>>,
    pub(crate) optional: Option<Sp<bool>>,
    pub(crate) doc: Option<Sp<String>>,
}

/// One entry of `enums`.
#[derive(Debug)]
pub(crate) struct EnumSpec {
    pub(crate) name: Sp<String>,
    pub(crate) doc: Option<Sp<String>>,
    /// `None` when the key is missing (reported already).
    pub(crate) values: Vec<EnumValueSpec>,
}

/// One item of an enum's `values`.
#[derive(Debug)]
pub(crate) struct EnumValueSpec {
    pub(crate) pos: Pos,
    pub(crate) key: String,
    pub(crate) name: Option<Sp<String>>,
    pub(crate) number: Option<Sp<i128>>,
    pub(crate) doc: Option<Sp<String>>,
}

/// In which formats a key may appear.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Avail {
    Both,
    Extended,
}

const ROOT_KEYS: &[(&str, Avail)] = &[
    ("version", Avail::Both),
    ("endpoints", Avail::Both),
    ("service", Avail::Extended),
    ("doc", Avail::Extended),
    ("messages", Avail::Extended),
    ("enums", Avail::Extended),
];
const ENDPOINT_KEYS: &[(&str, Avail)] = &[
    ("path", Avail::Both),
    ("type", Avail::Both),
    ("buffer", Avail::Both),
    ("method", Avail::Extended),
    ("doc", Avail::Extended),
    ("request", Avail::Extended),
    ("response", Avail::Extended),
    ("timeout", Avail::Extended),
    ("payload", Avail::Extended),
    ("stream", Avail::Extended),
];
const BUFFER_KEYS: &[(&str, Avail)] = &[("size", Avail::Both)];
const STREAM_KEYS: &[(&str, Avail)] = &[("max_len", Avail::Extended)];
const MESSAGE_REF_KEYS: &[(&str, Avail)] = &[("stream", Avail::Extended)];
const MESSAGE_KEYS: &[(&str, Avail)] = &[("doc", Avail::Extended), ("fields", Avail::Extended)];
const FIELD_KEYS: &[(&str, Avail)] = &[
    ("name", Avail::Extended),
    ("type", Avail::Extended),
    ("tag", Avail::Extended),
    ("repeated", Avail::Extended),
    ("optional", Avail::Extended),
    ("doc", Avail::Extended),
];
const ENUM_KEYS: &[(&str, Avail)] = &[("doc", Avail::Extended), ("values", Avail::Extended)];
const ENUM_VALUE_KEYS: &[(&str, Avail)] = &[
    ("name", Avail::Extended),
    ("number", Avail::Extended),
    ("doc", Avail::Extended),
];

/// The known keys of one mapping, after unknown and duplicate keys were reported.
struct Fields<'a> {
    key: String,
    /// Each known key with where the key itself is, and its value.
    entries: Vec<(&'static str, Pos, &'a Node)>,
    /// Keys that an unknown key was suggested as ("did you mean"); not reported missing.
    suggested: Vec<&'a str>,
}

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Option<(&'a Node, String)> {
        self.entries
            .iter()
            .find(|(k, _, _)| *k == name)
            .map(|(k, _, node)| (*node, join(&self.key, k)))
    }

    /// Where the key `name` itself is (not its value), if present.
    fn key_pos(&self, name: &str) -> Option<Pos> {
        self.entries
            .iter()
            .find(|(k, _, _)| *k == name)
            .map(|(_, pos, _)| *pos)
    }
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// Decodes the tree of a whole spec, reporting every structural problem into `sink`.
pub(crate) fn decode(root: &Node, sink: &mut Sink) -> SpecFile {
    let mut d = Decoder {
        sink,
        format: SpecFormat::Extended,
    };
    d.file(root)
}

struct Decoder<'s> {
    sink: &'s mut Sink,
    format: SpecFormat,
}

impl Decoder<'_> {
    fn file(&mut self, root: &Node) -> SpecFile {
        let mut spec = SpecFile {
            format: SpecFormat::Extended,
            service: None,
            doc: None,
            endpoints: None,
            messages: Vec::new(),
            enums: Vec::new(),
        };
        let Kind::Map(entries) = &root.kind else {
            self.sink.error_hint(
                root.pos,
                "",
                format!("a spec must be a mapping, found {}", root.kind.describe()),
                "a spec starts with `version:` and lists `endpoints:`",
            );
            return spec;
        };
        // The version decides which keys are allowed, so read it first.
        self.format = self.version(root, entries);
        spec.format = self.format;
        let Some(fields) = self.fields(root, "", ROOT_KEYS) else {
            return spec;
        };
        spec.service = fields.get("service").and_then(|(n, k)| self.string(n, k));
        spec.doc = fields.get("doc").and_then(|(n, k)| self.string(n, k));
        match fields.get("endpoints") {
            Some((node, key)) => {
                spec.endpoints = self.list(node, &key, |d, item, key| d.endpoint(item, key));
            }
            None => self.missing(
                &fields,
                root.pos,
                "endpoints",
                "list the service's endpoints under `endpoints:`, each with `path`, `type` and `buffer`",
            ),
        }
        if let Some((node, key)) = fields.get("messages") {
            spec.messages =
                self.named_map(node, &key, |d, name, node, key| d.message(name, node, key));
        }
        if let Some((node, key)) = fields.get("enums") {
            spec.enums = self.named_map(node, &key, |d, name, node, key| {
                d.enumeration(name, node, key)
            });
        }
        spec
    }

    fn version(&mut self, root: &Node, entries: &[(Node, Node)]) -> SpecFormat {
        let supported = [
            SpecFormat::DocaCpp.version(),
            SpecFormat::Extended.version(),
        ];
        let hint = format!(
            "use `version: \"{}\"` for the doca-cpp endpoint list or `version: \"{}\"` for the extended format",
            supported[0], supported[1]
        );
        let found = entries
            .iter()
            .find(|(k, _)| matches!(&k.kind, Kind::Str(s) if s == "version"));
        let Some((_, value)) = found else {
            // A misspelled `version` is reported as an unknown key with a suggestion.
            let misspelled = entries
                .iter()
                .any(|(k, _)| matches!(&k.kind, Kind::Str(s) if closest(s, ["version"]).is_some()));
            if !misspelled {
                self.sink
                    .error_hint(root.pos, "version", "missing key `version`", hint);
            }
            return SpecFormat::Extended;
        };
        match &value.kind {
            Kind::Str(v) if v == SpecFormat::DocaCpp.version() => SpecFormat::DocaCpp,
            Kind::Str(v) if v == SpecFormat::Extended.version() => SpecFormat::Extended,
            Kind::Str(v) => {
                let hint = match closest(v, supported) {
                    Some(s) => format!("did you mean `\"{s}\"`? {hint}"),
                    None => hint,
                };
                self.sink.error_hint(
                    value.pos,
                    "version",
                    format!("unsupported spec version `{v}`"),
                    hint,
                );
                SpecFormat::Extended
            }
            other => {
                self.sink.error_hint(
                    value.pos,
                    "version",
                    format!("`version` must be a string, found {}", other.describe()),
                    format!("quote it; {hint}"),
                );
                SpecFormat::Extended
            }
        }
    }

    /// Reports the required key `name` missing from `fields`, unless an unknown key was
    /// already reported as a likely misspelling of it.
    fn missing(&mut self, fields: &Fields<'_>, pos: Pos, name: &str, hint: &str) {
        if !fields.suggested.contains(&name) {
            self.sink.error_hint(
                pos,
                &join(&fields.key, name),
                format!("missing key `{name}`"),
                hint,
            );
        }
    }

    /// Checks that `node` is a mapping with only `allowed` keys, each at most once.
    fn fields<'a>(
        &mut self,
        node: &'a Node,
        key: &str,
        allowed: &[(&'static str, Avail)],
    ) -> Option<Fields<'a>> {
        let Kind::Map(entries) = &node.kind else {
            let expected: Vec<String> = allowed.iter().map(|(k, _)| format!("`{k}`")).collect();
            self.sink.error_hint(
                node.pos,
                key,
                format!("expected a mapping, found {}", node.kind.describe()),
                format!(
                    "write it as a mapping with the keys {}",
                    expected.join(", ")
                ),
            );
            return None;
        };
        let mut fields = Fields {
            key: key.to_owned(),
            entries: Vec::new(),
            suggested: Vec::new(),
        };
        for (k, value) in entries {
            let Kind::Str(name) = &k.kind else {
                self.sink.error(
                    k.pos,
                    key,
                    format!("keys must be strings, found {}", k.kind.describe()),
                );
                continue;
            };
            let path = join(key, name);
            let Some((known, avail)) = allowed.iter().find(|(a, _)| a == name) else {
                let message = format!("unknown key `{name}`");
                let valid = allowed
                    .iter()
                    .filter(|(_, a)| self.format == SpecFormat::Extended || *a == Avail::Both)
                    .map(|(k, _)| *k);
                match closest(name, valid) {
                    Some(s) => {
                        fields.suggested.push(s);
                        self.sink
                            .error_hint(k.pos, &path, message, format!("did you mean `{s}`?"));
                    }
                    None => {
                        let list: Vec<String> = allowed
                            .iter()
                            .filter(|(_, a)| {
                                self.format == SpecFormat::Extended || *a == Avail::Both
                            })
                            .map(|(k, _)| format!("`{k}`"))
                            .collect();
                        self.sink.error_hint(
                            k.pos,
                            &path,
                            message,
                            format!("the keys allowed here are {}", list.join(", ")),
                        );
                    }
                }
                continue;
            };
            if *avail == Avail::Extended && self.format == SpecFormat::DocaCpp {
                self.sink.error_hint(
                    k.pos,
                    &path,
                    format!("key `{name}` is not part of the doca-cpp format (version \"0.0.1\")"),
                    "use `version: \"rdma-rpc/1\"` for the extended format",
                );
                continue;
            }
            if let Some((_, _, first)) = fields.entries.iter().find(|(k2, _, _)| k2 == known) {
                let first_line = first.pos.line;
                self.sink.error_hint(
                    k.pos,
                    &path,
                    format!("duplicate key `{name}`"),
                    format!("`{name}` is already set on line {first_line}; remove one of them"),
                );
                continue;
            }
            fields.entries.push((known, k.pos, value));
        }
        Some(fields)
    }

    /// Decodes a list whose items `item` decodes; reports a non-list.
    fn list<T>(
        &mut self,
        node: &Node,
        key: &str,
        mut item: impl FnMut(&mut Self, &Node, String) -> Option<T>,
    ) -> Option<Sp<Vec<T>>> {
        match &node.kind {
            Kind::Seq(items) => Some(Sp {
                value: items
                    .iter()
                    .enumerate()
                    .filter_map(|(i, n)| item(self, n, format!("{key}[{i}]")))
                    .collect(),
                pos: node.pos,
                key: key.to_owned(),
            }),
            Kind::Null => Some(Sp {
                value: Vec::new(),
                pos: node.pos,
                key: key.to_owned(),
            }),
            other => {
                self.sink.error_hint(
                    node.pos,
                    key,
                    format!("`{}` must be a list, found {}", last(key), other.describe()),
                    "write one item per line, each starting with `- `",
                );
                None
            }
        }
    }

    /// Decodes a mapping from names to definitions (`messages`, `enums`).
    fn named_map<T>(
        &mut self,
        node: &Node,
        key: &str,
        mut item: impl FnMut(&mut Self, Sp<String>, &Node, String) -> Option<T>,
    ) -> Vec<T> {
        let mut out = Vec::new();
        match &node.kind {
            Kind::Map(entries) => {
                let mut seen: Vec<(&str, u64)> = Vec::new();
                for (k, value) in entries {
                    let Kind::Str(name) = &k.kind else {
                        self.sink.error(
                            k.pos,
                            key,
                            format!("names must be strings, found {}", k.kind.describe()),
                        );
                        continue;
                    };
                    let path = join(key, name);
                    if let Some((_, line)) = seen.iter().find(|(n, _)| n == name) {
                        self.sink.error_hint(
                            k.pos,
                            &path,
                            format!("`{name}` is defined twice"),
                            format!("the first definition is on line {line}; rename or remove one"),
                        );
                        continue;
                    }
                    seen.push((name, k.pos.line));
                    let name = Sp {
                        value: name.clone(),
                        pos: k.pos,
                        key: path.clone(),
                    };
                    out.extend(item(self, name, value, path));
                }
            }
            Kind::Null => {}
            other => self.sink.error_hint(
                node.pos,
                key,
                format!(
                    "`{}` must be a mapping from names to definitions, found {}",
                    last(key),
                    other.describe()
                ),
                "write one `Name:` per definition",
            ),
        }
        out
    }

    fn endpoint(&mut self, node: &Node, key: String) -> Option<EndpointSpec> {
        let fields = self.fields(node, &key, ENDPOINT_KEYS)?;
        let mut ep = EndpointSpec {
            pos: node.pos,
            path: None,
            op: None,
            buffer_size: None,
            method: None,
            doc: None,
            request: None,
            response: None,
            timeout: None,
            payload: None,
            buffer_given: fields.get("buffer").is_some(),
            stream: None,
        };
        match fields.get("path") {
            Some((n, k)) => ep.path = self.string(n, k),
            None => self.missing(
                &fields,
                node.pos,
                "path",
                "every endpoint needs a `path`, e.g. `path: /kv/put`",
            ),
        }
        match fields.get("type") {
            Some((n, k)) => ep.op = self.op(n, k),
            None => self.missing(
                &fields,
                node.pos,
                "type",
                "every endpoint needs a `type`: send, receive, write or read",
            ),
        }
        if let Some((n, k)) = fields.get("buffer") {
            ep.buffer_size = self.buffer(n, &k);
        } else {
            let required = self.format == SpecFormat::DocaCpp
                || ep.op.as_ref().is_some_and(|op| op.value.is_one_sided());
            if required {
                self.missing(
                    &fields,
                    node.pos,
                    "buffer",
                    if self.format == SpecFormat::DocaCpp {
                        "every endpoint needs `buffer: { size: <bytes> }`"
                    } else {
                        "write and read endpoints need `buffer: { size: ... }`, e.g. `size: 4MiB`"
                    },
                );
            }
        }
        ep.method = fields.get("method").and_then(|(n, k)| self.string(n, k));
        ep.doc = fields.get("doc").and_then(|(n, k)| self.string(n, k));
        ep.request = fields
            .get("request")
            .and_then(|(n, k)| self.message_ref(n, k));
        ep.response = fields
            .get("response")
            .and_then(|(n, k)| self.message_ref(n, k));
        ep.timeout = fields.get("timeout").and_then(|(n, k)| self.duration(n, k));
        ep.payload = fields.get("payload").and_then(|(n, k)| self.boolean(n, k));
        if let Some((n, k)) = fields.get("stream") {
            let pos = fields.key_pos("stream").unwrap_or(n.pos);
            ep.stream = self.bulk_stream(n, k, pos);
        }
        Some(ep)
    }

    /// Decodes an endpoint's `request` or `response`: a message name, or `{ stream: Name }`
    /// for a stream of such messages.
    fn message_ref(&mut self, node: &Node, key: String) -> Option<MessageRefSpec> {
        match &node.kind {
            Kind::Str(_) => Some(MessageRefSpec {
                name: self.string(node, key),
                stream: None,
            }),
            Kind::Map(_) => {
                let fields = self.fields(node, &key, MESSAGE_REF_KEYS)?;
                let Some((n, k)) = fields.get("stream") else {
                    self.missing(
                        &fields,
                        node.pos,
                        "stream",
                        "a stream names the message each of its items is, e.g. `{ stream: ObjectInfo }`",
                    );
                    return None;
                };
                let key_pos = fields.key_pos("stream").unwrap_or(n.pos);
                let name = match &n.kind {
                    // A null value has no place of its own worth pointing at: its key has.
                    Kind::Null => {
                        self.sink.error_hint(
                            key_pos,
                            &k,
                            "a stream must name its message",
                            "give the message each item of the stream is, one defined under `messages:`, e.g. `stream: ObjectInfo`",
                        );
                        None
                    }
                    _ => self.string(n, k),
                };
                let stream = Sp {
                    value: (),
                    pos: key_pos,
                    key: join(&key, "stream"),
                };
                Some(MessageRefSpec {
                    name,
                    stream: Some(stream),
                })
            }
            other => {
                self.sink.error_hint(
                    node.pos,
                    &key,
                    format!(
                        "`{}` must be a message name or `{{ stream: Message }}`, found {}",
                        last(&key),
                        other.describe()
                    ),
                    "name a message defined under `messages:`, or a stream of them with `{ stream: Name }`",
                );
                None
            }
        }
    }

    /// Decodes an endpoint's `stream:` (a bulk stream); `pos` is where its key is.
    fn bulk_stream(&mut self, node: &Node, key: String, pos: Pos) -> Option<StreamSpec> {
        let fields = self.fields(node, &key, STREAM_KEYS)?;
        let max_len = match fields.get("max_len") {
            Some((n, k)) => self.size(n, k, Size::StreamLen),
            None => {
                self.missing(
                    &fields,
                    node.pos,
                    "max_len",
                    "give the most bytes one call may move, e.g. `max_len: 1GiB`: the stream moves them in chunks of the buffer size",
                );
                None
            }
        };
        Some(StreamSpec { pos, key, max_len })
    }

    fn buffer(&mut self, node: &Node, key: &str) -> Option<Sp<u64>> {
        let fields = self.fields(node, key, BUFFER_KEYS)?;
        match fields.get("size") {
            Some((n, k)) => self.size(n, k, Size::Buffer),
            None => {
                self.missing(
                    &fields,
                    node.pos,
                    "size",
                    "give the buffer size in bytes, e.g. `size: 4096`",
                );
                None
            }
        }
    }

    fn op(&mut self, node: &Node, key: String) -> Option<Sp<OpKind>> {
        let text = self.string(node, key)?;
        match OpKind::from_spec(&text.value) {
            Some(op) => Some(Sp {
                value: op,
                pos: text.pos,
                key: text.key,
            }),
            None => {
                let names = OpKind::ALL.map(OpKind::as_str);
                let hint = match closest(&text.value, names) {
                    Some(s) => format!("did you mean `{s}`?"),
                    None => "the operation types are send, receive, write and read".to_owned(),
                };
                self.sink.error_hint(
                    text.pos,
                    &text.key,
                    format!("unknown operation type `{}`", text.value),
                    hint,
                );
                None
            }
        }
    }

    fn size(&mut self, node: &Node, key: String, what: Size) -> Option<Sp<u64>> {
        let (name, max) = (what.name(), what.max());
        let value = match &node.kind {
            Kind::Int(n) => *n,
            // Integers beyond 64 bits arrive as floats; let the range check report them.
            Kind::Float(f) if f.is_finite() && f.fract() == 0.0 && f.abs() > 1e18 => *f as i128,
            Kind::Str(text) if self.format == SpecFormat::DocaCpp => {
                self.sink.error_hint(
                    node.pos,
                    &key,
                    format!("buffer size `{text}` is not a number of bytes"),
                    "the doca-cpp format takes plain byte counts; units like `4KiB` need `version: \"rdma-rpc/1\"`",
                );
                return None;
            }
            Kind::Str(text) => match parse_size(name, text) {
                Ok(n) => n,
                Err((message, hint)) => {
                    self.sink.error_hint(node.pos, &key, message, hint);
                    return None;
                }
            },
            other => {
                self.sink.error_hint(
                    node.pos,
                    &key,
                    format!(
                        "{name} must be a whole number of bytes, found {}",
                        other.describe()
                    ),
                    what.example(),
                );
                return None;
            }
        };
        if value <= 0 {
            self.sink.error_hint(
                node.pos,
                &key,
                format!("{name} must be positive, found {value}"),
                what.example(),
            );
            return None;
        }
        if value > i128::from(max) {
            self.sink.error_hint(
                node.pos,
                &key,
                format!(
                    "{name} {value} bytes is larger than the maximum of {max} bytes ({})",
                    what.max_text()
                ),
                what.too_large_hint(),
            );
            return None;
        }
        Some(Sp {
            value: value as u64,
            pos: node.pos,
            key,
        })
    }

    fn duration(&mut self, node: &Node, key: String) -> Option<Sp<Duration>> {
        let text = match &node.kind {
            Kind::Str(text) => text,
            other => {
                self.sink.error_hint(
                    node.pos,
                    &key,
                    format!(
                        "timeout must be a duration with a unit, found {}",
                        other.describe()
                    ),
                    "write e.g. `250ms`, `5s` or `1m`",
                );
                return None;
            }
        };
        match parse_duration(text) {
            Ok(value) => Some(Sp {
                value,
                pos: node.pos,
                key,
            }),
            Err((message, hint)) => {
                self.sink.error_hint(node.pos, &key, message, hint);
                None
            }
        }
    }

    fn string(&mut self, node: &Node, key: String) -> Option<Sp<String>> {
        match &node.kind {
            Kind::Str(s) => Some(Sp {
                value: s.clone(),
                pos: node.pos,
                key,
            }),
            other => {
                self.sink.error_hint(
                    node.pos,
                    &key,
                    format!(
                        "`{}` must be a string, found {}",
                        last(&key),
                        other.describe()
                    ),
                    "quote the value",
                );
                None
            }
        }
    }

    fn boolean(&mut self, node: &Node, key: String) -> Option<Sp<bool>> {
        match &node.kind {
            Kind::Bool(b) => Some(Sp {
                value: *b,
                pos: node.pos,
                key,
            }),
            other => {
                self.sink.error_hint(
                    node.pos,
                    &key,
                    format!(
                        "`{}` must be true or false, found {}",
                        last(&key),
                        other.describe()
                    ),
                    "write `true` or `false`",
                );
                None
            }
        }
    }

    fn integer(&mut self, node: &Node, key: String) -> Option<Sp<i128>> {
        match &node.kind {
            Kind::Int(n) => Some(Sp {
                value: *n,
                pos: node.pos,
                key,
            }),
            other => {
                self.sink.error(
                    node.pos,
                    &key,
                    format!(
                        "`{}` must be an integer, found {}",
                        last(&key),
                        other.describe()
                    ),
                );
                None
            }
        }
    }

    fn message(&mut self, name: Sp<String>, node: &Node, key: String) -> Option<MessageSpec> {
        let mut msg = MessageSpec {
            name,
            doc: None,
            fields: Vec::new(),
        };
        if matches!(node.kind, Kind::Null) {
            return Some(msg);
        }
        let fields = self.fields(node, &key, MESSAGE_KEYS)?;
        msg.doc = fields.get("doc").and_then(|(n, k)| self.string(n, k));
        if let Some((n, k)) = fields.get("fields") {
            msg.fields = self
                .list(n, &k, |d, item, key| d.field(item, key))
                .map(|l| l.value)
                .unwrap_or_default();
        }
        Some(msg)
    }

    fn field(&mut self, node: &Node, key: String) -> Option<FieldSpec> {
        let fields = self.fields(node, &key, FIELD_KEYS)?;
        let mut field = FieldSpec {
            pos: node.pos,
            key: key.clone(),
            name: None,
            ty: None,
            tag: None,
            repeated: None,
            optional: None,
            doc: None,
        };
        match fields.get("name") {
            Some((n, k)) => field.name = self.string(n, k),
            None => self.missing(
                &fields,
                node.pos,
                "name",
                "every field needs a snake_case `name`",
            ),
        }
        match fields.get("type") {
            Some((n, k)) => field.ty = self.string(n, k),
            None => self.missing(
                &fields,
                node.pos,
                "type",
                "give a protobuf scalar type (e.g. `uint64`, `string`) or a message or enum name",
            ),
        }
        field.tag = fields.get("tag").and_then(|(n, k)| self.integer(n, k));
        field.repeated = fields.get("repeated").and_then(|(n, k)| self.boolean(n, k));
        field.optional = fields.get("optional").and_then(|(n, k)| self.boolean(n, k));
        field.doc = fields.get("doc").and_then(|(n, k)| self.string(n, k));
        Some(field)
    }

    fn enumeration(&mut self, name: Sp<String>, node: &Node, key: String) -> Option<EnumSpec> {
        let mut spec = EnumSpec {
            name,
            doc: None,
            values: Vec::new(),
        };
        let fields = self.fields(node, &key, ENUM_KEYS)?;
        spec.doc = fields.get("doc").and_then(|(n, k)| self.string(n, k));
        match fields.get("values") {
            Some((n, k)) => {
                spec.values = self
                    .list(n, &k, |d, item, key| d.enum_value(item, key))
                    .map(|l| l.value)
                    .unwrap_or_default();
            }
            None => self.missing(
                &fields,
                node.pos,
                "values",
                "list the enum's values, e.g. `values: [OK, NOT_FOUND]`",
            ),
        }
        Some(spec)
    }

    fn enum_value(&mut self, node: &Node, key: String) -> Option<EnumValueSpec> {
        let mut value = EnumValueSpec {
            pos: node.pos,
            key: key.clone(),
            name: None,
            number: None,
            doc: None,
        };
        if let Kind::Str(name) = &node.kind {
            value.name = Some(Sp {
                value: name.clone(),
                pos: node.pos,
                key,
            });
            return Some(value);
        }
        let fields = self.fields(node, &key, ENUM_VALUE_KEYS)?;
        match fields.get("name") {
            Some((n, k)) => value.name = self.string(n, k),
            None => self.missing(&fields, node.pos, "name", "every enum value needs a `name`"),
        }
        value.number = fields.get("number").and_then(|(n, k)| self.integer(n, k));
        value.doc = fields.get("doc").and_then(|(n, k)| self.string(n, k));
        Some(value)
    }
}

/// Which size a size value gives; they differ in their bounds and wording.
#[derive(Clone, Copy)]
enum Size {
    /// `buffer.size`.
    Buffer,
    /// A bulk stream's `max_len`.
    StreamLen,
}

impl Size {
    fn name(self) -> &'static str {
        match self {
            Size::Buffer => "buffer size",
            Size::StreamLen => "stream max_len",
        }
    }

    fn max(self) -> u64 {
        match self {
            Size::Buffer => limits::MAX_BUFFER_SIZE,
            Size::StreamLen => limits::MAX_STREAM_LEN,
        }
    }

    fn max_text(self) -> &'static str {
        match self {
            Size::Buffer => "1 GiB",
            Size::StreamLen => "1 TiB",
        }
    }

    fn example(self) -> &'static str {
        match self {
            Size::Buffer => "write e.g. `4096` or, in the extended format, `4KiB`",
            Size::StreamLen => "write the most bytes one call may move, e.g. `max_len: 1GiB`",
        }
    }

    fn too_large_hint(self) -> &'static str {
        match self {
            Size::Buffer => "use a smaller buffer and transfer large data in several operations",
            Size::StreamLen => "move larger data in several calls",
        }
    }
}

/// The last component of a key path, for messages.
fn last(key: &str) -> &str {
    let tail = key.rsplit('.').next().unwrap_or(key);
    tail.split('[').next().unwrap_or(tail)
}

/// Splits `4KiB` / `250 ms` into the number and the unit.
fn split_number(text: &str) -> Option<(&str, &str)> {
    let text = text.trim();
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '-' || c == '+' || c == '_'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(end);
    if number.is_empty() {
        return None;
    }
    Some((number, unit.trim()))
}

type ParseError = (String, String);

/// Parses an extended-format size (`what` names it in messages): an integer with an optional
/// binary unit.
fn parse_size(what: &str, text: &str) -> Result<i128, ParseError> {
    let units_hint = "write bytes (`4096`) or use a binary unit: `B`, `KiB`, `MiB`, `GiB`, `TiB`";
    let Some((number, unit)) = split_number(text) else {
        return Err((
            format!("{what} `{text}` is not a size"),
            units_hint.to_owned(),
        ));
    };
    let number: i128 = number.replace('_', "").parse().map_err(|_| {
        (
            format!("{what} `{text}` is not a size"),
            units_hint.to_owned(),
        )
    })?;
    let factor: i128 = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "k" | "K" | "kB" | "KB" | "Kb" | "kb" | "kib" | "Ki" | "KIB" => {
            return Err(ambiguous_unit(text, number, "KiB", 1 << 10));
        }
        "M" | "MB" | "Mb" | "mb" | "mib" | "Mi" | "MIB" => {
            return Err(ambiguous_unit(text, number, "MiB", 1 << 20));
        }
        "G" | "GB" | "Gb" | "gb" | "gib" | "Gi" | "GIB" => {
            return Err(ambiguous_unit(text, number, "GiB", 1 << 30));
        }
        "T" | "TB" | "Tb" | "tb" | "tib" | "Ti" | "TIB" => {
            return Err(ambiguous_unit(text, number, "TiB", 1 << 40));
        }
        _ => {
            return Err((
                format!("unknown size unit `{unit}` in `{text}`"),
                units_hint.to_owned(),
            ))
        }
    };
    Ok(number.saturating_mul(factor))
}

fn ambiguous_unit(text: &str, number: i128, unit: &str, factor: i128) -> ParseError {
    (
        format!("ambiguous size unit in `{text}`"),
        format!(
            "did you mean `{number}{unit}` ({} bytes)? sizes use binary units only",
            number.saturating_mul(factor)
        ),
    )
}

/// Parses a timeout: an integer with one of the units `ns`, `us`, `ms`, `s`, `m`, `h`.
fn parse_duration(text: &str) -> Result<Duration, ParseError> {
    let hint = "write a whole number with a unit: `ns`, `us`, `ms`, `s`, `m` or `h`, e.g. `250ms`";
    let bad = || {
        (
            format!("timeout `{text}` is not a duration"),
            hint.to_owned(),
        )
    };
    let (number, unit) = split_number(text).ok_or_else(bad)?;
    let n: i128 = number.replace('_', "").parse().map_err(|_| bad())?;
    if unit.starts_with('.') {
        return Err((
            format!("timeout `{text}` is not a whole number"),
            "use a smaller unit instead of a fraction, e.g. `1500ms` for 1.5 s".to_owned(),
        ));
    }
    let nanos_per: i128 = match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" | "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "" => {
            return Err((
                format!("timeout `{text}` has no unit"),
                format!("did you mean `{n}ms` or `{n}s`?"),
            ))
        }
        _ => {
            return Err((
                format!("unknown duration unit `{unit}` in `{text}`"),
                hint.to_owned(),
            ))
        }
    };
    if n <= 0 {
        return Err((
            format!("timeout must be positive, found `{text}`"),
            "leave `timeout` out to use the runtime's default".to_owned(),
        ));
    }
    let nanos = n.saturating_mul(nanos_per);
    let max = limits::MAX_TIMEOUT;
    if nanos > max.as_nanos() as i128 {
        return Err((
            format!(
                "timeout `{text}` is longer than the maximum of {} s",
                max.as_secs()
            ),
            "a timeout bounds one operation; leave `timeout` out to use the runtime's default"
                .to_owned(),
        ));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("buffer size", "4KiB"), Ok(4096));
        assert_eq!(parse_size("buffer size", "4 MiB"), Ok(4 << 20));
        assert_eq!(parse_size("buffer size", "1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("buffer size", "512"), Ok(512));
        assert_eq!(parse_size("buffer size", "512B"), Ok(512));
        assert_eq!(parse_size("buffer size", "1_024"), Ok(1024));
        assert_eq!(parse_size("buffer size", "-4KiB"), Ok(-4096));
        assert!(parse_size("buffer size", "4KB")
            .unwrap_err()
            .1
            .contains("`4KiB` (4096 bytes)"));
        assert!(parse_size("buffer size", "4 parsecs").is_err());
        assert!(parse_size("buffer size", "KiB").is_err());
        assert_eq!(parse_size("stream max_len", "1TiB"), Ok(1 << 40));
        assert!(parse_size("stream max_len", "1TB")
            .unwrap_err()
            .1
            .contains("`1TiB`"));
        assert_eq!(
            parse_size("stream max_len", "1 parsec").unwrap_err().0,
            "unknown size unit `parsec` in `1 parsec`"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("10us"), Ok(Duration::from_micros(10)));
        assert!(parse_duration("1.5s").unwrap_err().1.contains("1500ms"));
        assert!(parse_duration("5").unwrap_err().1.contains("`5ms`"));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("2h").is_err());
    }
}
