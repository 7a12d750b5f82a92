//! Messages without generated code: JSON values to protobuf bytes and back, driven by a
//! spec's [`ServiceIr`], with the bytes prost's generated types would write and read.
//!
//! JSON follows proto3's JSON mapping:
//! - field names in the spec's spelling (`min_version`) or lowerCamelCase (`minVersion`);
//!   output uses lowerCamelCase;
//! - 64-bit integers are accepted as numbers or strings and printed as strings; 32-bit ones
//!   are numbers (strings accepted);
//! - `float` and `double` accept numbers and `"NaN"`, `"Infinity"`, `"-Infinity"`;
//! - enums by value name (numbers accepted), `bytes` as base64 (standard or URL-safe, with
//!   or without padding; printed standard, padded);
//! - `null` is the field's default (absent).
//!
//! Output prints every field of a message: the default of a singular field the peer did not
//! send, `null` for an absent message or `optional` field, `[]` for an empty repeated field.
//! A `remote_buffer` cannot be given (it is an offer of the sender's own memory); one that
//! is received prints as `{"len": "<bytes>"}`.
//!
//! Every error names the path of the field it is about (`Item.parts[1].kind`).

mod decode;
mod encode;
#[cfg(test)]
mod tests;

use rdma_rpc_codegen::ServiceIr;
use serde_json::Value;

pub(crate) use decode::decode;
pub(crate) use encode::encode;

/// How deep messages may nest, in either direction.
const MAX_DEPTH: usize = 64;

/// Why a value could not be encoded or bytes decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum CodecError {
    /// A JSON key that names no field of the message.
    #[error("{path}: message {message} has no field `{key}` (its fields: {known})")]
    UnknownField {
        path: String,
        key: String,
        message: String,
        known: String,
    },
    /// A field given twice, under both of its names.
    #[error("{path}: given twice, as `{first}` and as `{second}`")]
    Duplicate {
        path: String,
        first: String,
        second: String,
    },
    /// A value of the wrong JSON type.
    #[error("{path}: expected {expected}, found {found}")]
    WrongType {
        path: String,
        expected: String,
        found: String,
    },
    /// A number the field's type cannot hold.
    #[error("{path}: {value} is out of range for {ty}")]
    OutOfRange {
        path: String,
        value: String,
        ty: &'static str,
    },
    /// An enum value name the enum does not have.
    #[error("{path}: enum {enumeration} has no value `{value}` (its values: {known})")]
    UnknownEnumValue {
        path: String,
        value: String,
        enumeration: String,
        known: String,
    },
    /// A `remote_buffer` field in a value to encode.
    #[error(
        "{path}: a remote_buffer cannot be given from the command line (it offers the \
         sender's own memory); leave it out"
    )]
    RemoteBuffer { path: String },
    /// Messages nested deeper than [`MAX_DEPTH`].
    #[error("{path}: messages nest deeper than {MAX_DEPTH} levels")]
    TooDeep { path: String },
    /// Bytes that are not a valid encoding of the message.
    #[error("{path}: malformed message: {reason}")]
    Malformed { path: String, reason: String },
    /// A message the spec does not define (a bug of the caller: the IR is validated).
    #[error("the spec defines no message `{0}`")]
    NoSuchMessage(String),
}

/// The message named `name` in `service`.
fn message<'s>(
    service: &'s ServiceIr,
    name: &str,
) -> Result<&'s rdma_rpc_codegen::MessageIr, CodecError> {
    service
        .message(name)
        .ok_or_else(|| CodecError::NoSuchMessage(name.to_owned()))
}

/// A field's JSON name, as protoc derives it: underscores dropped, the letter after each
/// one uppercased (`min_version` -> `minVersion`, `type_` -> `type`).
pub(crate) fn json_name(field: &str) -> String {
    let mut out = String::with_capacity(field.len());
    let mut upper = false;
    for c in field.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.push(c.to_ascii_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// A short description of a JSON value, for errors: `a string "abc"`, `the number 1.5`.
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) if s.chars().count() > 40 => {
            let cut: String = s.chars().take(40).collect();
            format!("a string {:?}...", cut)
        }
        Value::String(s) => format!("a string {s:?}"),
        Value::Array(a) => format!("an array of {}", a.len()),
        Value::Object(_) => "an object".into(),
    }
}

/// `a, b, c` of some names, for errors.
fn list<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}
