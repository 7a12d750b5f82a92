//! JSON to protobuf: fields in spec order, the same bytes prost writes for the generated type
//! (proto3: singular scalars at their default are left out, repeated numbers are packed).

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use prost::encoding::{self as pe, WireType};
use rdma_rpc_codegen::{FieldIr, FieldLabel, MessageIr, ScalarType, ServiceIr, TypeRef};
use serde_json::Value;

use super::{describe, json_name, list, message, CodecError, MAX_DEPTH};

/// Encodes `value`, a JSON object, as the message `name` of `service`.
pub(crate) fn encode(
    service: &ServiceIr,
    name: &str,
    value: &Value,
) -> Result<Vec<u8>, CodecError> {
    let mut buf = Vec::new();
    Encoder { service }.message(message(service, name)?, value, name, 0, &mut buf)?;
    Ok(buf)
}

struct Encoder<'s> {
    service: &'s ServiceIr,
}

/// How a field's values are written.
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    /// Left out at its default (proto3's implicit presence).
    Singular,
    /// Written whenever given.
    Optional,
    /// Numbers packed, the rest one record each.
    Repeated,
}

impl Encoder<'_> {
    fn message(
        &self,
        msg: &MessageIr,
        value: &Value,
        path: &str,
        depth: usize,
        buf: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        if depth > MAX_DEPTH {
            return Err(CodecError::TooDeep { path: path.into() });
        }
        let object = match value {
            Value::Null => return Ok(()),
            Value::Object(object) => object,
            other => {
                return Err(CodecError::WrongType {
                    path: path.into(),
                    expected: format!("an object (message {})", msg.name),
                    found: describe(other),
                })
            }
        };
        // Each field's value and the key it came under, in spec order.
        let mut given: Vec<Option<(&str, &Value)>> = vec![None; msg.fields.len()];
        for (key, v) in object {
            let Some(at) = msg
                .fields
                .iter()
                .position(|f| f.name == *key || json_name(&f.name) == *key)
            else {
                return Err(CodecError::UnknownField {
                    path: path.into(),
                    key: key.clone(),
                    message: msg.name.clone(),
                    known: list(msg.fields.iter().map(|f| f.name.as_str())),
                });
            };
            if let Some((first, _)) = given[at] {
                return Err(CodecError::Duplicate {
                    path: format!("{path}.{}", msg.fields[at].name),
                    first: first.into(),
                    second: key.clone(),
                });
            }
            given[at] = Some((key, v));
        }
        for (field, given) in msg.fields.iter().zip(given) {
            if let Some((_, v)) = given {
                let path = format!("{path}.{}", field.name);
                self.field(field, v, &path, depth, buf)?;
            }
        }
        Ok(())
    }

    fn field(
        &self,
        field: &FieldIr,
        value: &Value,
        path: &str,
        depth: usize,
        buf: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        let (shape, items): (Shape, Vec<(&Value, String)>) = match (field.label, value) {
            (_, Value::Null) => return Ok(()),
            (FieldLabel::Repeated, Value::Array(values)) => (
                Shape::Repeated,
                values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| (v, format!("{path}[{i}]")))
                    .collect(),
            ),
            (FieldLabel::Repeated, other) => {
                return Err(CodecError::WrongType {
                    path: path.into(),
                    expected: format!("an array (repeated {})", field.ty.name()),
                    found: describe(other),
                })
            }
            (FieldLabel::Singular, v) => (Shape::Singular, vec![(v, path.to_owned())]),
            (FieldLabel::Optional, v) => (Shape::Optional, vec![(v, path.to_owned())]),
        };
        let tag = field.tag;
        match &field.ty {
            TypeRef::Scalar(ty) => scalar(*ty, tag, shape, &items, buf),
            TypeRef::Enum(name) => {
                let numbers = items
                    .iter()
                    .map(|(v, path)| self.enum_number(name, v, path))
                    .collect::<Result<Vec<i32>, _>>()?;
                put(
                    tag,
                    shape,
                    &numbers,
                    pe::int32::encode,
                    pe::int32::encode_packed,
                    buf,
                );
                Ok(())
            }
            TypeRef::Message(name) => {
                let msg = message(self.service, name)?;
                for (v, path) in &items {
                    let mut inner = Vec::new();
                    self.message(msg, v, path, depth + 1, &mut inner)?;
                    pe::encode_key(tag, WireType::LengthDelimited, buf);
                    pe::encode_varint(inner.len() as u64, buf);
                    buf.extend_from_slice(&inner);
                }
                Ok(())
            }
            TypeRef::RemoteBuffer => Err(CodecError::RemoteBuffer { path: path.into() }),
        }
    }

    /// An enum value given by name (as the spec writes it, or its Rust name) or number.
    fn enum_number(&self, name: &str, value: &Value, path: &str) -> Result<i32, CodecError> {
        let Some(enumeration) = self.service.enumeration(name) else {
            return Err(CodecError::NoSuchMessage(name.into()));
        };
        match value {
            Value::String(s) => enumeration
                .values
                .iter()
                .find(|v| v.spec_name == *s || v.name == *s)
                .map(|v| v.number)
                .ok_or_else(|| CodecError::UnknownEnumValue {
                    path: path.into(),
                    value: s.clone(),
                    enumeration: name.into(),
                    known: list(enumeration.values.iter().map(|v| v.spec_name.as_str())),
                }),
            Value::Number(_) => integer(value, path, "enum"),
            other => Err(CodecError::WrongType {
                path: path.into(),
                expected: format!("a value name of enum {name}"),
                found: describe(other),
            }),
        }
    }
}

/// Writes the values of one field: a singular one only when not at its default, repeated
/// ones packed when `packed` says how.
fn put<T: Default + PartialEq>(
    tag: u32,
    shape: Shape,
    values: &[T],
    one: fn(u32, &T, &mut Vec<u8>),
    packed: fn(u32, &[T], &mut Vec<u8>),
    buf: &mut Vec<u8>,
) {
    match shape {
        Shape::Repeated => packed(tag, values, buf),
        Shape::Singular if values.iter().all(|v| *v == T::default()) => {}
        Shape::Singular | Shape::Optional => values.iter().for_each(|v| one(tag, v, buf)),
    }
}

/// Writes strings and bytes: never packed.
fn put_unpacked<T: Default + PartialEq>(
    tag: u32,
    shape: Shape,
    values: &[T],
    one: fn(u32, &T, &mut Vec<u8>),
    buf: &mut Vec<u8>,
) {
    if shape == Shape::Singular && values.iter().all(|v| *v == T::default()) {
        return;
    }
    values.iter().for_each(|v| one(tag, v, buf));
}

/// Converts every item with `convert`.
fn each<T>(
    items: &[(&Value, String)],
    convert: impl Fn(&Value, &str) -> Result<T, CodecError>,
) -> Result<Vec<T>, CodecError> {
    items.iter().map(|(v, path)| convert(v, path)).collect()
}

fn scalar(
    ty: ScalarType,
    tag: u32,
    shape: Shape,
    items: &[(&Value, String)],
    buf: &mut Vec<u8>,
) -> Result<(), CodecError> {
    match ty {
        ScalarType::Double => {
            let v = each(items, |v, p| float(v, p, "double"))?;
            put(
                tag,
                shape,
                &v,
                pe::double::encode,
                pe::double::encode_packed,
                buf,
            );
        }
        ScalarType::Float => {
            let v = each(items, |v, p| {
                let x = float(v, p, "float")?;
                if x.is_finite() && x.abs() > f64::from(f32::MAX) {
                    return Err(out_of_range(v, p, "float"));
                }
                Ok(x as f32)
            })?;
            put(
                tag,
                shape,
                &v,
                pe::float::encode,
                pe::float::encode_packed,
                buf,
            );
        }
        ScalarType::Int32 => {
            let v: Vec<i32> = each(items, |v, p| integer(v, p, "int32"))?;
            put(
                tag,
                shape,
                &v,
                pe::int32::encode,
                pe::int32::encode_packed,
                buf,
            );
        }
        ScalarType::Int64 => {
            let v: Vec<i64> = each(items, |v, p| integer(v, p, "int64"))?;
            put(
                tag,
                shape,
                &v,
                pe::int64::encode,
                pe::int64::encode_packed,
                buf,
            );
        }
        ScalarType::Uint32 => {
            let v: Vec<u32> = each(items, |v, p| integer(v, p, "uint32"))?;
            put(
                tag,
                shape,
                &v,
                pe::uint32::encode,
                pe::uint32::encode_packed,
                buf,
            );
        }
        ScalarType::Uint64 => {
            let v: Vec<u64> = each(items, |v, p| integer(v, p, "uint64"))?;
            put(
                tag,
                shape,
                &v,
                pe::uint64::encode,
                pe::uint64::encode_packed,
                buf,
            );
        }
        ScalarType::Sint32 => {
            let v: Vec<i32> = each(items, |v, p| integer(v, p, "sint32"))?;
            put(
                tag,
                shape,
                &v,
                pe::sint32::encode,
                pe::sint32::encode_packed,
                buf,
            );
        }
        ScalarType::Sint64 => {
            let v: Vec<i64> = each(items, |v, p| integer(v, p, "sint64"))?;
            put(
                tag,
                shape,
                &v,
                pe::sint64::encode,
                pe::sint64::encode_packed,
                buf,
            );
        }
        ScalarType::Fixed32 => {
            let v: Vec<u32> = each(items, |v, p| integer(v, p, "fixed32"))?;
            put(
                tag,
                shape,
                &v,
                pe::fixed32::encode,
                pe::fixed32::encode_packed,
                buf,
            );
        }
        ScalarType::Fixed64 => {
            let v: Vec<u64> = each(items, |v, p| integer(v, p, "fixed64"))?;
            put(
                tag,
                shape,
                &v,
                pe::fixed64::encode,
                pe::fixed64::encode_packed,
                buf,
            );
        }
        ScalarType::Sfixed32 => {
            let v: Vec<i32> = each(items, |v, p| integer(v, p, "sfixed32"))?;
            put(
                tag,
                shape,
                &v,
                pe::sfixed32::encode,
                pe::sfixed32::encode_packed,
                buf,
            );
        }
        ScalarType::Sfixed64 => {
            let v: Vec<i64> = each(items, |v, p| integer(v, p, "sfixed64"))?;
            put(
                tag,
                shape,
                &v,
                pe::sfixed64::encode,
                pe::sfixed64::encode_packed,
                buf,
            );
        }
        ScalarType::Bool => {
            let v = each(items, |v, p| match v {
                Value::Bool(b) => Ok(*b),
                other => Err(wrong(other, p, "true or false")),
            })?;
            put(
                tag,
                shape,
                &v,
                pe::bool::encode,
                pe::bool::encode_packed,
                buf,
            );
        }
        ScalarType::String => {
            let v = each(items, |v, p| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(wrong(other, p, "a string")),
            })?;
            put_unpacked(tag, shape, &v, pe::string::encode, buf);
        }
        ScalarType::Bytes => {
            let v = each(items, bytes)?;
            put_unpacked(tag, shape, &v, pe::bytes::encode, buf);
        }
    }
    Ok(())
}

fn wrong(value: &Value, path: &str, expected: &str) -> CodecError {
    CodecError::WrongType {
        path: path.into(),
        expected: expected.into(),
        found: describe(value),
    }
}

fn out_of_range(value: &Value, path: &str, ty: &'static str) -> CodecError {
    CodecError::OutOfRange {
        path: path.into(),
        value: match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        },
        ty,
    }
}

/// An integer of type `T` from a JSON number or a string of one (`"18446744073709551615"`,
/// `1e3`); fractions and values outside `T` are errors.
fn integer<T: TryFrom<i128>>(value: &Value, path: &str, ty: &'static str) -> Result<T, CodecError> {
    let expected = || wrong(value, path, &format!("an integer ({ty})"));
    let whole = |x: f64| {
        (x.is_finite() && x.fract() == 0.0 && x.abs() < 2f64.powi(100)).then_some(x as i128)
    };
    let n: i128 = match value {
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i128::from(i),
            (_, Some(u), _) => i128::from(u),
            (_, _, Some(x)) => whole(x).ok_or_else(expected)?,
            _ => return Err(expected()),
        },
        Value::String(s) => match s.trim().parse::<i128>() {
            Ok(i) => i,
            Err(_) => s
                .trim()
                .parse::<f64>()
                .ok()
                .and_then(whole)
                .ok_or_else(expected)?,
        },
        _ => return Err(expected()),
    };
    T::try_from(n).map_err(|_| out_of_range(value, path, ty))
}

/// A `float` or `double`: a number, a string of one, or `"NaN"`, `"Infinity"`, `"-Infinity"`.
fn float(value: &Value, path: &str, ty: &'static str) -> Result<f64, CodecError> {
    let expected = || wrong(value, path, &format!("a number ({ty})"));
    match value {
        Value::Number(n) => n.as_f64().ok_or_else(expected),
        Value::String(s) => match s.as_str() {
            "NaN" => Ok(f64::NAN),
            "Infinity" => Ok(f64::INFINITY),
            "-Infinity" => Ok(f64::NEG_INFINITY),
            other => other
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .ok_or_else(expected),
        },
        _ => Err(expected()),
    }
}

/// base64 as proto3 JSON accepts it: standard or URL-safe alphabet, padded or not.
fn bytes(value: &Value, path: &str) -> Result<Vec<u8>, CodecError> {
    const CONFIG: GeneralPurposeConfig =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    const STANDARD: GeneralPurpose = GeneralPurpose::new(&base64::alphabet::STANDARD, CONFIG);
    const URL_SAFE: GeneralPurpose = GeneralPurpose::new(&base64::alphabet::URL_SAFE, CONFIG);
    let Value::String(s) = value else {
        return Err(wrong(value, path, "a base64 string (bytes)"));
    };
    STANDARD
        .decode(s)
        .or_else(|_| URL_SAFE.decode(s))
        .map_err(|e| CodecError::WrongType {
            path: path.into(),
            expected: "a base64 string (bytes)".into(),
            found: format!("{} ({e})", describe(value)),
        })
}
