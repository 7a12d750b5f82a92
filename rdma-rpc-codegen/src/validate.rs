//! Semantic checks over the decoded spec and the lowering into the IR: names, duplicates,
//! collisions with generated Rust names, and references between endpoints, messages and enums.

use std::collections::HashMap;

use crate::diagnostics::Sink;
use crate::ir::{
    EndpointIr, EnumIr, EnumValueIr, FieldIr, FieldLabel, MessageIr, OpKind, ScalarType, ServiceIr,
    SpecFormat, StreamKind, TypeRef, REMOTE_BUFFER,
};
use crate::limits;
use crate::naming;
use crate::spec::{EndpointSpec, EnumSpec, MessageRefSpec, MessageSpec, Sp, SpecFile};
use crate::yaml::Pos;

/// The highest protobuf field number.
const MAX_TAG: i128 = (1 << 29) - 1;
/// Field numbers protobuf reserves for its own implementation.
const RESERVED_TAGS: std::ops::RangeInclusive<i128> = 19_000..=19_999;

/// Checks `spec` and builds the IR; problems go to `sink` (the IR is meaningless then).
pub(crate) fn validate(spec: SpecFile, file: &str, sink: &mut Sink) -> ServiceIr {
    let name = service_name(&spec, file, sink);
    let types = TypeNames::collect(&spec, &name, sink);
    let messages = spec
        .messages
        .iter()
        .map(|m| message(m, &types, sink))
        .collect();
    let enums = spec.enums.iter().map(|e| enumeration(e, sink)).collect();
    let endpoints = endpoints(&spec, &types, sink);
    ServiceIr {
        source: file.to_owned(),
        name,
        doc: spec.doc.map(|d| d.value),
        format: spec.format,
        endpoints,
        messages,
        enums,
    }
}

fn service_name(spec: &SpecFile, file: &str, sink: &mut Sink) -> String {
    let Some(given) = &spec.service else {
        let derived = naming::service_name_from_file(file);
        if naming::is_reserved_type_name(&derived) {
            sink.error_hint(
                Pos { line: 1, column: 1 },
                "service",
                format!("the service name `{derived}` derived from the file name would shadow a Rust prelude type"),
                "rename the file, or set `service:` in the extended format",
            );
        }
        return derived;
    };
    let name = &given.value;
    if !naming::is_upper_camel_ident(name) {
        let suggestion = naming::to_upper_camel(name);
        sink.error_hint(
            given.pos,
            &given.key,
            format!("service name `{name}` is not an UpperCamelCase Rust identifier"),
            if naming::is_upper_camel_ident(&suggestion) {
                format!("did you mean `{suggestion}`?")
            } else {
                "use letters and digits, starting with an uppercase letter, e.g. `KvStore`".into()
            },
        );
    } else if naming::is_reserved_type_name(name) {
        sink.error_hint(
            given.pos,
            &given.key,
            format!("service name `{name}` would shadow a Rust prelude type"),
            format!("choose another name, e.g. `{name}Service`"),
        );
    }
    name.clone()
}

/// The message and enum names of the spec, for resolving field and endpoint types.
struct TypeNames {
    messages: Vec<String>,
    enums: Vec<String>,
}

impl TypeNames {
    fn collect(spec: &SpecFile, service: &str, sink: &mut Sink) -> TypeNames {
        let generated = [
            (service.to_owned(), "the service trait"),
            (format!("{service}Server"), "the generated server"),
            (format!("{service}Client"), "the generated client"),
        ];
        let mut seen: HashMap<&str, u64> = HashMap::new();
        let names = spec
            .messages
            .iter()
            .map(|m| (&m.name, "message"))
            .chain(spec.enums.iter().map(|e| (&e.name, "enum")));
        for (name, what) in names {
            let n = name.value.as_str();
            if !naming::is_upper_camel_ident(n) {
                let suggestion = naming::to_upper_camel(n);
                sink.error_hint(
                    name.pos,
                    &name.key,
                    format!("{what} name `{n}` is not an UpperCamelCase Rust identifier"),
                    if naming::is_upper_camel_ident(&suggestion) {
                        format!("did you mean `{suggestion}`?")
                    } else {
                        "use letters and digits, starting with an uppercase letter".to_owned()
                    },
                );
            } else if naming::is_reserved_type_name(n) {
                sink.error_hint(
                    name.pos,
                    &name.key,
                    format!("{what} name `{n}` would shadow a Rust prelude type"),
                    format!(
                        "choose another name, e.g. `{n}{}`",
                        if what == "enum" { "Kind" } else { "Message" }
                    ),
                );
            } else if let Some((_, item)) = generated.iter().find(|(g, _)| g == n) {
                sink.error_hint(
                    name.pos,
                    &name.key,
                    format!("{what} name `{n}` collides with {item} of service `{service}`"),
                    "rename the type",
                );
            }
            if let Some(line) = seen.get(n) {
                // Duplicates inside one mapping were reported while decoding; this catches
                // a message and an enum of the same name.
                sink.error_hint(
                    name.pos,
                    &name.key,
                    format!("type name `{n}` is used by a message and an enum"),
                    format!("the other definition is on line {line}; rename one of them"),
                );
            } else {
                seen.insert(n, name.pos.line);
            }
        }
        TypeNames {
            messages: spec.messages.iter().map(|m| m.name.value.clone()).collect(),
            enums: spec.enums.iter().map(|e| e.name.value.clone()).collect(),
        }
    }

    /// Resolves a field type.
    fn field_type(&self, ty: &Sp<String>, sink: &mut Sink) -> Option<TypeRef> {
        let name = ty.value.as_str();
        if let Some(scalar) = ScalarType::from_spec(name) {
            return Some(TypeRef::Scalar(scalar));
        }
        if name == REMOTE_BUFFER {
            return Some(TypeRef::RemoteBuffer);
        }
        if self.messages.iter().any(|m| m == name) {
            return Some(TypeRef::Message(name.to_owned()));
        }
        if self.enums.iter().any(|e| e == name) {
            return Some(TypeRef::Enum(name.to_owned()));
        }
        let candidates = ScalarType::ALL
            .iter()
            .map(|s| s.as_str())
            .chain([REMOTE_BUFFER])
            .chain(self.messages.iter().map(String::as_str))
            .chain(self.enums.iter().map(String::as_str));
        let hint = match naming::closest(name, candidates) {
            Some(s) => format!("did you mean `{s}`?"),
            None => "use a protobuf scalar type (e.g. `uint64`, `string`, `bytes`), `remote_buffer`, or a message or enum defined under `messages:` / `enums:`".to_owned(),
        };
        sink.error_hint(ty.pos, &ty.key, format!("unknown type `{name}`"), hint);
        None
    }

    /// Resolves an endpoint's request or response: it must be a message.
    fn message_ref(&self, ty: &Sp<String>, sink: &mut Sink) -> Option<TypeRef> {
        let name = ty.value.as_str();
        if self.messages.iter().any(|m| m == name) {
            return Some(TypeRef::Message(name.to_owned()));
        }
        let is_scalar = ScalarType::from_spec(name).is_some();
        if is_scalar || self.enums.iter().any(|e| e == name) {
            sink.error_hint(
                ty.pos,
                &ty.key,
                format!(
                    "`{}` must name a message, but `{name}` is {}",
                    last(&ty.key),
                    if is_scalar {
                        "a scalar type"
                    } else {
                        "an enum"
                    }
                ),
                format!("define a message with a field of type `{name}` and use it here"),
            );
            return None;
        }
        let hint = match naming::closest(name, self.messages.iter().map(String::as_str)) {
            Some(s) => format!("did you mean `{s}`?"),
            None if self.messages.is_empty() => "define it under `messages:`".to_owned(),
            None => format!(
                "the messages defined in this spec are {}",
                self.messages
                    .iter()
                    .map(|m| format!("`{m}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        sink.error_hint(
            ty.pos,
            &ty.key,
            format!("unknown message type `{name}`"),
            hint,
        );
        None
    }
}

fn last(key: &str) -> &str {
    key.rsplit('.').next().unwrap_or(key)
}

fn endpoints(spec: &SpecFile, types: &TypeNames, sink: &mut Sink) -> Vec<EndpointIr> {
    let Some(list) = &spec.endpoints else {
        return Vec::new();
    };
    if list.value.is_empty() {
        sink.error_hint(
            list.pos,
            &list.key,
            "the service has no endpoints",
            "add at least one endpoint with `path`, `type` and `buffer`",
        );
    }
    if list.value.len() > limits::MAX_ENDPOINTS {
        sink.error_hint(
            list.pos,
            &list.key,
            format!(
                "the service has {} endpoints, more than the limit of {}",
                list.value.len(),
                limits::MAX_ENDPOINTS
            ),
            "split it into several services",
        );
    }
    let mut by_path_op: HashMap<(&str, OpKind), u64> = HashMap::new();
    // method name -> (line, derived?)
    let mut by_method: HashMap<String, (u64, &str)> = HashMap::new();
    let mut out = Vec::new();
    for ep in &list.value {
        if let Some(path) = &ep.path {
            check_path(path, sink);
        }
        if let (Some(path), Some(op)) = (&ep.path, &ep.op) {
            let key = (path.value.as_str(), op.value);
            if let Some(line) = by_path_op.get(&key) {
                sink.error_hint(
                    op.pos,
                    &op.key,
                    format!(
                        "duplicate endpoint: `{}` with type `{}`",
                        path.value, op.value
                    ),
                    format!(
                        "the same path and type are defined on line {line}; remove one of them"
                    ),
                );
            } else {
                by_path_op.insert(key, ep.pos.line);
            }
        }
        // An endpoint whose method name has a problem stays out of the IR: generated from it,
        // the IR of an invalid spec (what `parse_spec_partial` offers) would not compile. Other
        // problems (a bad timeout, an unknown key, a missing message) leave an endpoint that
        // generates sound code.
        let problems_before = sink.diagnostics.len();
        let method = method_name(ep, sink);
        if let Some((method, pos, key)) = &method {
            if let Some((line, first_path)) = by_method.get(method) {
                let (message, hint) = match &ep.method {
                    Some(_) => (
                        format!("duplicate method name `{method}`"),
                        format!("`{method}` is already used by the endpoint on line {line}; choose another `method`"),
                    ),
                    None => (
                        format!(
                            "path `{}` maps to method name `{method}`, like `{first_path}` on line {line}",
                            ep.path.as_ref().map_or("", |p| p.value.as_str())
                        ),
                        if spec.format == SpecFormat::Extended {
                            "give one of the endpoints an explicit `method:`".to_owned()
                        } else {
                            "rename one of the paths, or use the extended format and give one an explicit `method:`".to_owned()
                        },
                    ),
                };
                sink.error_hint(*pos, key, message, hint);
            } else {
                let path = ep.path.as_ref().map_or("", |p| p.value.as_str());
                by_method.insert(method.clone(), (ep.pos.line, path));
            }
        }
        let method_is_sound = sink.diagnostics.len() == problems_before;
        let message = |r: &MessageRefSpec, sink: &mut Sink| {
            r.name
                .as_ref()
                .and_then(|name| types.message_ref(name, sink))
        };
        let request = ep.request.as_ref().and_then(|r| message(r, sink));
        let response = ep.response.as_ref().and_then(|r| message(r, sink));
        let (Some(path), Some(op), Some((method, pos, key))) = (&ep.path, &ep.op, method) else {
            continue;
        };
        let stream = stream_kind(ep, op.value, sink);
        let payload = payload(spec.format, ep, op.value, stream, sink);
        if !method_is_sound {
            continue;
        }
        out.push((
            EndpointIr {
                path: path.value.clone(),
                op: op.value,
                buffer_size: ep
                    .buffer_size
                    .as_ref()
                    .map_or(limits::DEFAULT_MESSAGE_BUFFER_SIZE, |s| s.value),
                method,
                doc: ep.doc.as_ref().map(|d| d.value.clone()),
                request,
                response,
                timeout: ep.timeout.as_ref().map(|t| t.value),
                payload,
                stream,
            },
            pos,
            key,
        ));
    }
    generated_name_clashes(out, &by_method, sink)
}

/// Checks the names generated from the endpoints' method names besides the methods: the
/// clients' `<method>_into` and `<method>_stream`, which must not be another endpoint's
/// method, and the server trait's `<Method>Stream` types, which must be distinct. An endpoint
/// whose generated names clash stays out of the IR (its code would not compile).
fn generated_name_clashes(
    endpoints: Vec<(EndpointIr, Pos, String)>,
    methods: &HashMap<String, (u64, &str)>,
    sink: &mut Sink,
) -> Vec<EndpointIr> {
    let mut stream_types: HashMap<String, (u64, String)> = HashMap::new();
    let mut out = Vec::new();
    for (ep, pos, key) in endpoints {
        let mut sound = true;
        for extra in naming::extra_client_methods(&ep) {
            if let Some((line, _)) = methods.get(&extra) {
                sink.error_hint(
                    pos,
                    &key,
                    format!(
                        "the generated client method `{extra}` of `{}` collides with the method of the endpoint on line {line}",
                        ep.method
                    ),
                    "give one of the endpoints another `method:`",
                );
                sound = false;
            }
        }
        if ep.stream.streams_responses() {
            let ty = naming::stream_type_name(&ep.method);
            match stream_types.get(&ty) {
                Some((line, other)) => {
                    sink.error_hint(
                        pos,
                        &key,
                        format!(
                            "method `{}` names its stream type `{ty}`, like `{other}` on line {line}",
                            ep.method
                        ),
                        "give one of the endpoints another `method:`",
                    );
                    sound = false;
                }
                None => {
                    stream_types.insert(ty, (pos.line, ep.method.clone()));
                }
            }
        }
        if sound {
            out.push(ep);
        }
    }
    out
}

/// How an endpoint's calls stream, checked against its operation: a bulk stream
/// (`stream: { max_len }`) on write and read, message streams (`request: { stream: .. }`,
/// `response: { stream: .. }`) on send and receive. A kind the operation does not carry is
/// reported and left out, so that the IR of an invalid spec still generates code the runtime
/// accepts.
fn stream_kind(ep: &EndpointSpec, op: OpKind, sink: &mut Sink) -> StreamKind {
    let requests = ep.request.as_ref().and_then(|r| r.stream.as_ref());
    let responses = ep.response.as_ref().and_then(|r| r.stream.as_ref());
    if op.is_one_sided() {
        for stream in [requests, responses].into_iter().flatten() {
            sink.error_hint(
                stream.pos,
                &stream.key,
                format!("a `{op}` endpoint has no message streams"),
                format!(
                    "message streams are for send and receive endpoints; a `{op}` endpoint streams \
                     its bytes with `stream: {{ max_len: .. }}` and names its messages plainly \
                     (`{}: Name`)",
                    last(stream.key.trim_end_matches(".stream"))
                ),
            );
        }
        let Some(bulk) = &ep.stream else {
            return StreamKind::Unary;
        };
        let buffer = ep.buffer_size.as_ref().map(|b| b.value);
        let max_len = match (&bulk.max_len, buffer) {
            (Some(max_len), Some(buffer)) if max_len.value < buffer => {
                sink.error_hint(
                    max_len.pos,
                    &max_len.key,
                    format!(
                        "stream max_len {} bytes is smaller than the buffer size {buffer} bytes",
                        max_len.value
                    ),
                    "`max_len` bounds the whole stream and the buffer one chunk of it: give `max_len` at least the buffer size",
                );
                buffer
            }
            (Some(max_len), _) => max_len.value,
            // Reported already; the buffer's size keeps the kind sound.
            (None, _) => buffer.unwrap_or(limits::DEFAULT_MESSAGE_BUFFER_SIZE),
        };
        return StreamKind::Bulk { max_len };
    }
    if let Some(bulk) = &ep.stream {
        sink.error_hint(
            bulk.pos,
            &bulk.key,
            format!("a `{op}` endpoint has no bulk stream"),
            "bulk streams are for write and read endpoints; stream messages with \
             `request: { stream: T }` / `response: { stream: T }`",
        );
    }
    if requests.is_none() && responses.is_none() {
        return StreamKind::Unary;
    }
    StreamKind::Messages {
        requests: requests.is_some(),
        responses: responses.is_some(),
    }
}

/// Whether an endpoint's calls move bytes besides their messages. Said with `payload:`;
/// otherwise, in the extended format, a send or receive without a `buffer` moves none (its
/// messages are the call); every other endpoint does. Message streams never do.
fn payload(
    format: SpecFormat,
    ep: &EndpointSpec,
    op: OpKind,
    stream: StreamKind,
    sink: &mut Sink,
) -> bool {
    if let StreamKind::Messages { .. } = stream {
        if let Some(given) = ep.payload.as_ref().filter(|p| p.value) {
            sink.error_hint(
                given.pos,
                &given.key,
                "a message-streaming endpoint carries no payload: `payload: true` does not fit it",
                "its messages are the call; remove `payload`, and move bulk bytes through a \
                 `write` or `read` endpoint (with `stream: { max_len: .. }` for large ones)",
            );
        }
        return false;
    }
    if let Some(given) = &ep.payload {
        if !given.value && stream.max_len().is_some() {
            sink.error_hint(
                given.pos,
                &given.key,
                "a bulk stream moves bytes: `payload: false` does not fit it",
                "remove `payload: false`; for an endpoint that carries messages only, use \
                 `type: send` or `type: receive`",
            );
        } else if !given.value && op.is_one_sided() {
            sink.error_hint(
                given.pos,
                &given.key,
                format!("a `{op}` endpoint always moves bytes: `payload: false` does not fit it"),
                "for an endpoint that carries messages only, use `type: send` or `type: receive`",
            );
        }
        return given.value;
    }
    op.is_one_sided() || format == SpecFormat::DocaCpp || ep.buffer_given
}

fn check_path(path: &Sp<String>, sink: &mut Sink) {
    let p = &path.value;
    if !p.starts_with('/') {
        sink.error_hint(
            path.pos,
            &path.key,
            format!("path `{p}` does not start with `/`"),
            format!("did you mean `/{}`?", p.trim_start()),
        );
    } else if p.len() > limits::MAX_PATH_BYTES {
        sink.error_hint(
            path.pos,
            &path.key,
            format!(
                "path is {} bytes long, more than the limit of {} bytes",
                p.len(),
                limits::MAX_PATH_BYTES
            ),
            "use a shorter path",
        );
    } else if let Some(c) = p.chars().find(|c| c.is_whitespace() || c.is_control()) {
        sink.error_hint(
            path.pos,
            &path.key,
            format!("path `{}` contains the character {c:?}", p.escape_debug()),
            "paths may not contain whitespace or control characters",
        );
    }
}

/// The method name of an endpoint with where to report problems about it.
fn method_name(ep: &EndpointSpec, sink: &mut Sink) -> Option<(String, Pos, String)> {
    if let Some(given) = &ep.method {
        let name = &given.value;
        if naming::is_keyword(name) {
            sink.error_hint(
                given.pos,
                &given.key,
                format!("method name `{name}` is a Rust keyword"),
                format!("choose another name, e.g. `{name}_`"),
            );
            return None;
        }
        if !naming::is_snake_case_ident(name) {
            let suggestion = naming::to_snake(name);
            sink.error_hint(
                given.pos,
                &given.key,
                format!("method name `{name}` is not a snake_case Rust identifier"),
                if naming::is_snake_case_ident(&suggestion) {
                    format!("did you mean `{suggestion}`?")
                } else {
                    "use lowercase letters, digits and `_`, starting with a letter".to_owned()
                },
            );
            return None;
        }
        if let Some(owner) = naming::reserved_method_name(name) {
            let op = ep.op.as_ref().map_or("call", |op| op.value.as_str());
            sink.error_hint(
                given.pos,
                &given.key,
                format!("method name `{name}` collides with a method of {owner}"),
                format!("choose another `method`, e.g. `{name}_{op}`"),
            );
            return None;
        }
        return Some((name.clone(), given.pos, given.key.clone()));
    }
    let (path, op) = (ep.path.as_ref()?, ep.op.as_ref()?);
    Some((
        naming::derive_method_name(&path.value, op.value),
        path.pos,
        path.key.clone(),
    ))
}

fn message(spec: &MessageSpec, types: &TypeNames, sink: &mut Sink) -> MessageIr {
    let mut fields = Vec::new();
    let mut names: HashMap<&str, u64> = HashMap::new();
    let mut tags: HashMap<i128, u64> = HashMap::new();
    let mut next_tag: i128 = 1;
    for f in &spec.fields {
        if let Some(name) = &f.name {
            let n = name.value.as_str();
            if naming::is_keyword(n) {
                sink.error_hint(
                    name.pos,
                    &name.key,
                    format!("field name `{n}` is a Rust keyword"),
                    format!("choose another name, e.g. `{n}_`"),
                );
            } else if !naming::is_snake_case_ident(n) {
                let suggestion = naming::to_snake(n);
                sink.error_hint(
                    name.pos,
                    &name.key,
                    format!("field name `{n}` is not a snake_case Rust identifier"),
                    if naming::is_snake_case_ident(&suggestion) {
                        format!("did you mean `{suggestion}`?")
                    } else {
                        "use lowercase letters, digits and `_`, starting with a letter".to_owned()
                    },
                );
            }
            if let Some(line) = names.get(n) {
                sink.error_hint(
                    name.pos,
                    &name.key,
                    format!(
                        "duplicate field name `{n}` in message `{}`",
                        spec.name.value
                    ),
                    format!("the first `{n}` is on line {line}"),
                );
            } else {
                names.insert(n, name.pos.line);
            }
        }
        let tag = match &f.tag {
            Some(t) => {
                let ok = (1..=MAX_TAG).contains(&t.value) && !RESERVED_TAGS.contains(&t.value);
                if !ok {
                    sink.error_hint(
                        t.pos,
                        &t.key,
                        format!("field number {} is out of range", t.value),
                        format!("use 1 to {MAX_TAG}, except 19000 to 19999 (reserved by protobuf)"),
                    );
                }
                t.value
            }
            None => next_tag,
        };
        if let Some(line) = tags.get(&tag) {
            let pos = f.tag.as_ref().map_or(f.pos, |t| t.pos);
            let key = f.tag.as_ref().map_or(f.key.clone(), |t| t.key.clone());
            sink.error_hint(
                pos,
                &key,
                format!("field number {tag} is used twice in message `{}`", spec.name.value),
                format!("the field on line {line} has the same number; fields without `tag` take the previous number plus one"),
            );
        } else {
            tags.insert(tag, f.pos.line);
        }
        next_tag = tag.saturating_add(1);
        let label = match (&f.repeated, &f.optional) {
            (Some(r), Some(o)) if r.value && o.value => {
                sink.error_hint(
                    o.pos,
                    &o.key,
                    "a field cannot be both `repeated` and `optional`",
                    "remove one of them",
                );
                FieldLabel::Repeated
            }
            (Some(r), _) if r.value => FieldLabel::Repeated,
            (_, Some(o)) if o.value => FieldLabel::Optional,
            _ => FieldLabel::Singular,
        };
        let ty = f.ty.as_ref().and_then(|t| types.field_type(t, sink));
        if let (Some(name), Some(ty)) = (&f.name, ty) {
            fields.push(FieldIr {
                name: name.value.clone(),
                tag: u32::try_from(tag).unwrap_or(0),
                ty,
                label,
                doc: f.doc.as_ref().map(|d| d.value.clone()),
            });
        }
    }
    MessageIr {
        name: spec.name.value.clone(),
        doc: spec.doc.as_ref().map(|d| d.value.clone()),
        fields,
    }
}

fn enumeration(spec: &EnumSpec, sink: &mut Sink) -> EnumIr {
    if spec.values.is_empty() {
        sink.error_hint(
            spec.name.pos,
            &spec.name.key,
            format!("enum `{}` has no values", spec.name.value),
            "list at least one value; the first one has number 0 and is the default",
        );
    }
    let mut values = Vec::new();
    let mut names: HashMap<String, (u64, String)> = HashMap::new();
    let mut numbers: HashMap<i128, u64> = HashMap::new();
    let mut next: i128 = 0;
    for (i, v) in spec.values.iter().enumerate() {
        let number = match &v.number {
            Some(n) => {
                if i32::try_from(n.value).is_err() {
                    sink.error_hint(
                        n.pos,
                        &n.key,
                        format!("enum number {} is out of range", n.value),
                        "enum numbers are 32-bit signed integers",
                    );
                }
                if i == 0 && n.value != 0 {
                    sink.error_hint(
                        n.pos,
                        &n.key,
                        format!(
                            "the first value of enum `{}` has number {}, not 0",
                            spec.name.value, n.value
                        ),
                        "protobuf (proto3) enums start with a value numbered 0, their default",
                    );
                }
                n.value
            }
            None => next,
        };
        if let Some(line) = numbers.get(&number) {
            let (pos, key) = v
                .number
                .as_ref()
                .map_or((v.pos, v.key.as_str()), |n| (n.pos, n.key.as_str()));
            sink.error_hint(
                pos,
                key,
                format!("enum number {number} is used twice in enum `{}`", spec.name.value),
                format!("the value on line {line} has the same number; values without `number` take the previous number plus one"),
            );
        } else {
            numbers.insert(number, v.pos.line);
        }
        next = number.saturating_add(1);
        let Some(name) = &v.name else { continue };
        let rust = naming::to_upper_camel(&name.value);
        if !naming::is_ascii_ident(&name.value) || !naming::is_upper_camel_ident(&rust) {
            sink.error_hint(
                name.pos,
                &name.key,
                format!("enum value `{}` is not a valid name", name.value),
                "use an identifier such as `NOT_FOUND` or `NotFound`",
            );
            continue;
        }
        if let Some((line, other)) = names.get(&rust) {
            sink.error_hint(
                name.pos,
                &name.key,
                format!("enum value `{}` becomes the Rust variant `{rust}`, like `{other}` on line {line}", name.value),
                "rename one of the values",
            );
            continue;
        }
        names.insert(rust.clone(), (name.pos.line, name.value.clone()));
        values.push(EnumValueIr {
            spec_name: name.value.clone(),
            name: rust,
            number: i32::try_from(number).unwrap_or(0),
            doc: v.doc.as_ref().map(|d| d.value.clone()),
        });
    }
    EnumIr {
        name: spec.name.value.clone(),
        doc: spec.doc.as_ref().map(|d| d.value.clone()),
        values,
    }
}
