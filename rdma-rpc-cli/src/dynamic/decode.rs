//! Protobuf to JSON: every field of the message, in spec order, under its JSON name; fields
//! the spec does not know are skipped (as prost skips them), bytes that break the wire format
//! are an error naming the field.

use base64::Engine as _;
use prost::encoding::{self as pe, DecodeContext, WireType};
use prost::{DecodeError, Message as _};
use rdma_rpc_codegen::{FieldLabel, MessageIr, ScalarType, ServiceIr, TypeRef};
use serde_json::{Map, Value};

use super::{json_name, message, CodecError, MAX_DEPTH};

/// Decodes `bytes` as the message `name` of `service`.
pub(crate) fn decode(service: &ServiceIr, name: &str, bytes: &[u8]) -> Result<Value, CodecError> {
    Decoder { service }.message(message(service, name)?, bytes, name, 0)
}

struct Decoder<'s> {
    service: &'s ServiceIr,
}

/// What arrived for one field.
#[derive(Default)]
struct Seen {
    /// Scalar and enum values, in order (a singular field keeps the last).
    values: Vec<Value>,
    /// Each record of a message field; a singular one merges them, as protobuf does, by
    /// decoding their concatenation.
    records: Vec<Vec<u8>>,
}

impl Decoder<'_> {
    fn message(
        &self,
        msg: &MessageIr,
        mut buf: &[u8],
        path: &str,
        depth: usize,
    ) -> Result<Value, CodecError> {
        if depth > MAX_DEPTH {
            return Err(CodecError::TooDeep { path: path.into() });
        }
        let mut seen: Vec<Seen> = msg.fields.iter().map(|_| Seen::default()).collect();
        while !buf.is_empty() {
            let malformed = |e: DecodeError| CodecError::Malformed {
                path: path.into(),
                reason: e.to_string(),
            };
            let (tag, wire) = pe::decode_key(&mut buf).map_err(malformed)?;
            let Some(at) = msg.fields.iter().position(|f| f.tag == tag) else {
                pe::skip_field(wire, tag, &mut buf, DecodeContext::default()).map_err(malformed)?;
                continue;
            };
            let field = &msg.fields[at];
            let field_path = format!("{path}.{}", field.name);
            let malformed = |reason: String| CodecError::Malformed {
                path: field_path.clone(),
                reason,
            };
            let seen = &mut seen[at];
            match &field.ty {
                TypeRef::Scalar(ty) => {
                    scalar(*ty, wire, &mut buf, &mut seen.values).map_err(|e| e.to_string())
                }
                TypeRef::Enum(name) => {
                    let enumeration = self.service.enumeration(name);
                    numbers(
                        wire,
                        &mut buf,
                        pe::int32::merge_repeated,
                        &mut seen.values,
                        |n| {
                            enumeration
                                .and_then(|e| e.values.iter().find(|v| v.number == n))
                                .map_or(Value::from(n), |v| Value::from(v.spec_name.clone()))
                        },
                    )
                    .map_err(|e| e.to_string())
                }
                TypeRef::Message(_) | TypeRef::RemoteBuffer => {
                    record(wire, &mut buf).map(|r| seen.records.push(r.to_vec()))
                }
            }
            .map_err(malformed)?;
        }
        let mut object = Map::new();
        for (field, seen) in msg.fields.iter().zip(seen) {
            let path = format!("{path}.{}", field.name);
            let value = match (&field.ty, field.label) {
                (TypeRef::Message(_) | TypeRef::RemoteBuffer, FieldLabel::Repeated) => {
                    let items = seen
                        .records
                        .iter()
                        .enumerate()
                        .map(|(i, r)| self.nested(&field.ty, r, &format!("{path}[{i}]"), depth))
                        .collect::<Result<Vec<_>, _>>()?;
                    Value::Array(items)
                }
                (TypeRef::Message(_) | TypeRef::RemoteBuffer, _) => {
                    if seen.records.is_empty() {
                        Value::Null
                    } else {
                        self.nested(&field.ty, &seen.records.concat(), &path, depth)?
                    }
                }
                (_, FieldLabel::Repeated) => Value::Array(seen.values),
                (_, FieldLabel::Optional) => seen.values.into_iter().last().unwrap_or(Value::Null),
                (ty, FieldLabel::Singular) => match seen.values.into_iter().last() {
                    Some(value) => value,
                    None => self.default(ty),
                },
            };
            object.insert(json_name(&field.name), value);
        }
        Ok(Value::Object(object))
    }

    /// A message field's value, or a remote buffer's length.
    fn nested(
        &self,
        ty: &TypeRef,
        bytes: &[u8],
        path: &str,
        depth: usize,
    ) -> Result<Value, CodecError> {
        match ty {
            TypeRef::Message(name) => {
                self.message(message(self.service, name)?, bytes, path, depth + 1)
            }
            _ => {
                let handle =
                    rdma_rpc_core::RemoteBuf::decode(bytes).map_err(|e| CodecError::Malformed {
                        path: path.into(),
                        reason: e.to_string(),
                    })?;
                let mut object = Map::new();
                object.insert("len".into(), handle.len().to_string().into());
                Ok(Value::Object(object))
            }
        }
    }

    /// What a singular field that was not sent holds.
    fn default(&self, ty: &TypeRef) -> Value {
        match ty {
            TypeRef::Scalar(ty) => zero(*ty),
            TypeRef::Enum(name) => self
                .service
                .enumeration(name)
                .and_then(|e| e.values.iter().find(|v| v.number == 0))
                .map_or(Value::from(0), |v| Value::from(v.spec_name.clone())),
            TypeRef::Message(_) | TypeRef::RemoteBuffer => Value::Null,
        }
    }
}

/// A scalar's default, printed as a zero that was sent would be.
fn zero(ty: ScalarType) -> Value {
    match ty {
        ScalarType::Double | ScalarType::Float => double(0.0),
        ScalarType::Int64
        | ScalarType::Uint64
        | ScalarType::Sint64
        | ScalarType::Fixed64
        | ScalarType::Sfixed64 => text(0),
        ScalarType::Bool => Value::Bool(false),
        ScalarType::String | ScalarType::Bytes => Value::String(String::new()),
        ScalarType::Int32
        | ScalarType::Uint32
        | ScalarType::Sint32
        | ScalarType::Fixed32
        | ScalarType::Sfixed32 => Value::from(0),
    }
}

/// A length-delimited record: its bytes, taken from `buf`.
fn record<'b>(wire: WireType, buf: &mut &'b [u8]) -> Result<&'b [u8], String> {
    pe::check_wire_type(WireType::LengthDelimited, wire).map_err(|e| e.to_string())?;
    let len = pe::decode_varint(buf).map_err(|e| e.to_string())?;
    if len > buf.len() as u64 {
        return Err(format!(
            "a record of {len} bytes where {} remain",
            buf.len()
        ));
    }
    let (record, rest) = buf.split_at(len as usize);
    *buf = rest;
    Ok(record)
}

/// prost's `merge_repeated` of one number type, over a slice that lives `'b`.
type MergeRepeated<'b, T> =
    fn(WireType, &mut Vec<T>, &mut &'b [u8], DecodeContext) -> Result<(), DecodeError>;

/// Numbers of one record, packed or not, each turned into JSON by `json`.
fn numbers<'b, T: Default>(
    wire: WireType,
    buf: &mut &'b [u8],
    merge: MergeRepeated<'b, T>,
    out: &mut Vec<Value>,
    json: impl Fn(T) -> Value,
) -> Result<(), DecodeError> {
    let mut values = Vec::new();
    merge(wire, &mut values, buf, DecodeContext::default())?;
    out.extend(values.into_iter().map(json));
    Ok(())
}

/// 64-bit integers print as strings (proto3 JSON), so no reader loses precision.
fn text(n: impl ToString) -> Value {
    Value::String(n.to_string())
}

/// A double as JSON: a number, or `"NaN"`, `"Infinity"`, `"-Infinity"`.
fn double(x: f64) -> Value {
    match serde_json::Number::from_f64(x) {
        Some(n) => Value::Number(n),
        None if x.is_nan() => "NaN".into(),
        None if x > 0.0 => "Infinity".into(),
        None => "-Infinity".into(),
    }
}

/// A float printed as its shortest decimal (`0.1`, not `0.10000000149011612`).
fn float(x: f32) -> Value {
    double(x.to_string().parse().unwrap_or(f64::from(x)))
}

fn scalar(
    ty: ScalarType,
    wire: WireType,
    buf: &mut &[u8],
    out: &mut Vec<Value>,
) -> Result<(), DecodeError> {
    match ty {
        ScalarType::Double => numbers(wire, buf, pe::double::merge_repeated, out, double),
        ScalarType::Float => numbers(wire, buf, pe::float::merge_repeated, out, float),
        ScalarType::Int32 => numbers(wire, buf, pe::int32::merge_repeated, out, Value::from),
        ScalarType::Int64 => numbers(wire, buf, pe::int64::merge_repeated, out, text),
        ScalarType::Uint32 => numbers(wire, buf, pe::uint32::merge_repeated, out, Value::from),
        ScalarType::Uint64 => numbers(wire, buf, pe::uint64::merge_repeated, out, text),
        ScalarType::Sint32 => numbers(wire, buf, pe::sint32::merge_repeated, out, Value::from),
        ScalarType::Sint64 => numbers(wire, buf, pe::sint64::merge_repeated, out, text),
        ScalarType::Fixed32 => numbers(wire, buf, pe::fixed32::merge_repeated, out, Value::from),
        ScalarType::Fixed64 => numbers(wire, buf, pe::fixed64::merge_repeated, out, text),
        ScalarType::Sfixed32 => numbers(wire, buf, pe::sfixed32::merge_repeated, out, Value::from),
        ScalarType::Sfixed64 => numbers(wire, buf, pe::sfixed64::merge_repeated, out, text),
        ScalarType::Bool => numbers(wire, buf, pe::bool::merge_repeated, out, Value::from),
        ScalarType::String => {
            let mut s = String::new();
            pe::string::merge(wire, &mut s, buf, DecodeContext::default())?;
            out.push(Value::String(s));
            Ok(())
        }
        ScalarType::Bytes => {
            let mut b: Vec<u8> = Vec::new();
            pe::bytes::merge(wire, &mut b, buf, DecodeContext::default())?;
            out.push(Value::String(
                base64::engine::general_purpose::STANDARD.encode(b),
            ));
            Ok(())
        }
    }
}
