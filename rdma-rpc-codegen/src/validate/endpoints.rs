//! Endpoints: paths, method names and the names generated from them, how calls stream and
//! whether they move a payload, checked against each endpoint's operation and lowered into
//! the IR.

use std::collections::HashMap;

use crate::diagnostics::Sink;
use crate::ir::{EndpointIr, OpKind, SpecFormat, StreamKind};
use crate::limits;
use crate::naming;
use crate::spec::{EndpointSpec, MessageRefSpec, Sp, SpecFile};
use crate::yaml::Pos;

use super::last;
use super::types::TypeNames;

pub(super) fn endpoints(spec: &SpecFile, types: &TypeNames, sink: &mut Sink) -> Vec<EndpointIr> {
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
