//! What a typed call sends, from the command line (`call` and `bench`): the endpoint as a
//! spec describes it, the request message given as JSON or YAML and encoded from the spec,
//! and the metadata of `-H key=value`.

use std::io::Read as _;
use std::path::PathBuf;

use rdma_rpc_codegen::{EndpointIr, ServiceIr, TypeRef};
use rdma_rpc_core::{Bytes, EndpointDef, Metadata, OpKind, StreamKind};
use serde_json::Value;

use crate::dynamic::{self, CodecError};

/// The request and metadata options `call` and `bench` share.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct RequestArgs {
    /// The request message as JSON or YAML (`'{"key": "YQ==", "min_version": "7"}'`), or
    /// `@FILE` to read it from a file, `@-` from standard input. Without it, an empty
    /// message (every field at its default).
    #[arg(
        short = 'd',
        long = "request",
        value_name = "JSON|YAML|@FILE",
        requires = "spec"
    )]
    pub(crate) request: Option<String>,
    /// Metadata of the call, `key=value` (repeatable): `-H authorization='Bearer 0123'`.
    #[arg(short = 'H', long = "metadata", value_name = "KEY=VALUE", value_parser = parse_metadata)]
    pub(crate) metadata: Vec<(String, String)>,
}

/// Why a typed call cannot be made as asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum RequestError {
    /// No endpoint with this method name.
    #[error("service {service} has no method `{method}` (its methods: {known})")]
    UnknownMethod {
        service: String,
        method: String,
        known: String,
    },
    /// No endpoint with this path and operation.
    #[error("service {service} has no {op} endpoint on `{path}`")]
    UnknownRoute {
        service: String,
        path: String,
        op: OpKind,
    },
    /// A request given to an endpoint whose spec types none.
    #[error("{method} takes no request message (the spec gives it no `request` type)")]
    Untyped { method: String },
    /// A kind of endpoint the command cannot call.
    #[error("{method}: {what}")]
    Unsupported { method: String, what: String },
    /// A file or standard input that could not be read.
    #[error("cannot read {what}")]
    Read {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// Text that is neither JSON nor YAML.
    #[error("the request is neither JSON ({json}) nor YAML ({yaml})")]
    Parse { json: String, yaml: String },
    /// A request that does not fit its message type.
    #[error("request: {0}")]
    Encode(#[from] CodecError),
    /// A metadata key given twice.
    #[error("metadata key `{0}` given twice")]
    DuplicateMetadata(String),
}

impl RequestError {
    /// Reading a file failed (exit code 1); everything else is a usage error (2).
    pub(crate) fn exit_code(&self) -> std::process::ExitCode {
        match self {
            RequestError::Read { .. } => std::process::ExitCode::FAILURE,
            _ => std::process::ExitCode::from(2),
        }
    }
}

/// `key=value`, split at the first `=`.
pub(crate) fn parse_metadata(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("`{text}` is not key=value")),
    }
}

/// The endpoint whose method is `method`.
pub(crate) fn by_method<'s>(
    service: &'s ServiceIr,
    method: &str,
) -> Result<&'s EndpointIr, RequestError> {
    service
        .endpoints
        .iter()
        .find(|e| e.method == method)
        .ok_or_else(|| RequestError::UnknownMethod {
            service: service.name.clone(),
            method: method.to_owned(),
            known: service
                .endpoints
                .iter()
                .map(|e| e.method.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// The endpoint of operation `op` on `path`.
pub(crate) fn by_route<'s>(
    service: &'s ServiceIr,
    path: &str,
    op: OpKind,
) -> Result<&'s EndpointIr, RequestError> {
    service
        .endpoints
        .iter()
        .find(|e| e.path == path && op_kind(e.op) == op)
        .ok_or_else(|| RequestError::UnknownRoute {
            service: service.name.clone(),
            path: path.to_owned(),
            op,
        })
}

fn op_kind(op: rdma_rpc_codegen::OpKind) -> OpKind {
    match op {
        rdma_rpc_codegen::OpKind::Send => OpKind::Send,
        rdma_rpc_codegen::OpKind::Receive => OpKind::Receive,
        rdma_rpc_codegen::OpKind::Write => OpKind::Write,
        rdma_rpc_codegen::OpKind::Read => OpKind::Read,
    }
}

/// The endpoint as the runtime's client sees it, as the generated code describes it; it
/// lives as long as the process.
pub(crate) fn endpoint_def(ep: &EndpointIr) -> &'static EndpointDef {
    use rdma_rpc_codegen::StreamKind as Spec;
    let stream = match ep.stream {
        Spec::Unary => StreamKind::Unary,
        Spec::Bulk { max_len } => StreamKind::Bulk { max_len },
        Spec::Messages {
            requests,
            responses,
        } => StreamKind::Messages {
            requests,
            responses,
        },
    };
    Box::leak(Box::new(EndpointDef {
        path: Box::leak(ep.path.clone().into_boxed_str()),
        op: op_kind(ep.op),
        buffer_size: ep.buffer_size,
        method: Box::leak(ep.method.clone().into_boxed_str()),
        // Whole milliseconds, rounded up as the generator rounds them (never 0).
        timeout_ms: ep
            .timeout
            .map(|t| t.as_nanos().div_ceil(1_000_000).max(1) as u64),
        stream,
    }))
}

/// The message type of `ty` (specs type requests and responses as messages only).
pub(crate) fn message_name(ty: Option<&TypeRef>) -> Option<&str> {
    match ty {
        Some(TypeRef::Message(name)) => Some(name),
        _ => None,
    }
}

/// The request message of a call of `ep`: `request` (JSON, YAML, `@FILE` or `@-`) encoded as
/// the endpoint's request type; empty when not given.
pub(crate) fn message(
    service: &ServiceIr,
    ep: &EndpointIr,
    request: Option<&str>,
) -> Result<Bytes, RequestError> {
    let Some(request) = request else {
        return Ok(Bytes::new());
    };
    let Some(name) = message_name(ep.request.as_ref()) else {
        return Err(RequestError::Untyped {
            method: ep.method.clone(),
        });
    };
    let value = parse(&read_arg(request)?)?;
    Ok(dynamic::encode(service, name, &value)?.into())
}

/// The text of an argument: itself, or a file's contents for `@FILE`, standard input's for
/// `@-`.
fn read_arg(arg: &str) -> Result<String, RequestError> {
    match arg.strip_prefix('@') {
        None => Ok(arg.to_owned()),
        Some("-") => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|source| RequestError::Read {
                    what: "the request from standard input".into(),
                    source,
                })?;
            Ok(text)
        }
        Some(file) => std::fs::read_to_string(file).map_err(|source| RequestError::Read {
            what: format!("the request from `{file}`"),
            source,
        }),
    }
}

/// JSON, or else YAML (which most JSON is too, but JSON's own errors are clearer).
fn parse(text: &str) -> Result<Value, RequestError> {
    let json = match serde_json::from_str(text) {
        Ok(value) => return Ok(value),
        Err(e) => e,
    };
    serde_saphyr::from_str::<Value>(text).map_err(|yaml| RequestError::Parse {
        json: json.to_string(),
        yaml: yaml
            .to_string()
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned(),
    })
}

/// The metadata of `-H` pairs; a key given twice is refused rather than silently replaced.
pub(crate) fn metadata(pairs: &[(String, String)]) -> Result<Metadata, RequestError> {
    let mut metadata = Metadata::new();
    for (key, value) in pairs {
        if metadata.insert(key.clone(), value.clone()).is_some() {
            return Err(RequestError::DuplicateMetadata(key.clone()));
        }
    }
    Ok(metadata)
}

/// Reads a payload file (`--data-file`).
pub(crate) fn read_file(path: &PathBuf) -> Result<Bytes, RequestError> {
    std::fs::read(path)
        .map(Bytes::from)
        .map_err(|source| RequestError::Read {
            what: format!("`{}`", path.display()),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_pairs_split_at_the_first_equals_sign() {
        assert_eq!(
            parse_metadata("authorization=Bearer a=b"),
            Ok(("authorization".into(), "Bearer a=b".into()))
        );
        assert_eq!(parse_metadata("k="), Ok(("k".into(), String::new())));
        assert!(parse_metadata("=v").is_err());
        assert!(parse_metadata("novalue").is_err());
        let twice = [("k".into(), "1".into()), ("k".into(), "2".into())];
        assert!(matches!(
            metadata(&twice),
            Err(RequestError::DuplicateMetadata(k)) if k == "k"
        ));
    }

    #[test]
    fn requests_are_json_or_yaml() {
        let json = parse(r#"{"a": [1, "2"]}"#).unwrap();
        let yaml = parse("a:\n  - 1\n  - \"2\"\n").unwrap();
        assert_eq!(json, yaml);
        let err = parse("{a: [}").unwrap_err().to_string();
        assert!(err.starts_with("the request is neither JSON ("), "{err}");
    }
}
