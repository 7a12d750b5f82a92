//! The spec's type names: message and enum names checked (UpperCamelCase, no prelude or
//! generated name, no message and enum alike) and collected, and field and endpoint types
//! resolved against them.

use std::collections::HashMap;

use crate::diagnostics::Sink;
use crate::ir::{ScalarType, TypeRef, REMOTE_BUFFER};
use crate::naming;
use crate::spec::{Sp, SpecFile};

use super::last;

/// The message and enum names of the spec, for resolving field and endpoint types.
pub(super) struct TypeNames {
    messages: Vec<String>,
    enums: Vec<String>,
}

impl TypeNames {
    pub(super) fn collect(spec: &SpecFile, service: &str, sink: &mut Sink) -> TypeNames {
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
    pub(super) fn field_type(&self, ty: &Sp<String>, sink: &mut Sink) -> Option<TypeRef> {
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
    pub(super) fn message_ref(&self, ty: &Sp<String>, sink: &mut Sink) -> Option<TypeRef> {
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
