//! The spec items: the whole file (its version first, which decides the keys allowed), its
//! endpoints with their buffers, message references and bulk streams, and its messages and
//! enums, each with the keys it allows.

use super::tree::{join, last, Avail};
use super::units::Size;
use super::{
    Decoder, EndpointSpec, EnumSpec, EnumValueSpec, FieldSpec, MessageRefSpec, MessageSpec, Sp,
    SpecFile, StreamSpec,
};
use crate::ir::{OpKind, SpecFormat};
use crate::naming::closest;
use crate::yaml::{Kind, Node, Pos};

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

impl Decoder<'_> {
    pub(super) fn file(&mut self, root: &Node) -> SpecFile {
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
