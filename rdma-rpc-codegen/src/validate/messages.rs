//! Messages and enums: field names, protobuf field numbers and labels, enum values and
//! numbers, checked and lowered into the IR.

use std::collections::HashMap;

use crate::diagnostics::Sink;
use crate::ir::{EnumIr, EnumValueIr, FieldIr, FieldLabel, MessageIr};
use crate::naming;
use crate::spec::{EnumSpec, MessageSpec};

use super::types::TypeNames;

/// The highest protobuf field number.
const MAX_TAG: i128 = (1 << 29) - 1;
/// Field numbers protobuf reserves for its own implementation.
const RESERVED_TAGS: std::ops::RangeInclusive<i128> = 19_000..=19_999;

pub(super) fn message(spec: &MessageSpec, types: &TypeNames, sink: &mut Sink) -> MessageIr {
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

pub(super) fn enumeration(spec: &EnumSpec, sink: &mut Sink) -> EnumIr {
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
