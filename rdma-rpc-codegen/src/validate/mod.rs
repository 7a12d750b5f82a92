//! Semantic checks over the decoded spec and the lowering into the IR: names, duplicates,
//! collisions with generated Rust names, and references between endpoints, messages and enums.
//!
//! This file holds the entry point and the service name; `types` collects and resolves the
//! type names, `endpoints` and `messages` check and lower the endpoints and the messages and
//! enums.

mod endpoints;
mod messages;
mod types;

use crate::diagnostics::Sink;
use crate::ir::ServiceIr;
use crate::naming;
use crate::spec::SpecFile;
use crate::yaml::Pos;

use endpoints::endpoints;
use messages::{enumeration, message};
use types::TypeNames;

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

fn last(key: &str) -> &str {
    key.rsplit('.').next().unwrap_or(key)
}
