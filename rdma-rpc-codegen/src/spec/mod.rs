//! The spec model: the YAML tree decoded into typed spec items, each value keeping its
//! position and key path. Structural problems (unknown keys, wrong types, bad sizes and
//! durations, unsupported versions) are reported here; cross-references and naming are
//! checked in [`crate::validate`].
//!
//! This file holds the model and the entry point, [`decode`]; `tree` walks the YAML tree
//! with positions and key paths, `items` decodes each spec item, `units` parses sizes and
//! durations.

mod items;
mod tree;
mod units;

use std::time::Duration;

use crate::diagnostics::Sink;
use crate::ir::{OpKind, SpecFormat};
use crate::yaml::{Node, Pos};

/// A decoded value with where it came from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sp<T> {
    pub(crate) value: T,
    pub(crate) pos: Pos,
    /// The key path, e.g. `endpoints[1].buffer.size`.
    pub(crate) key: String,
}

/// A whole spec file.
#[derive(Debug)]
pub(crate) struct SpecFile {
    pub(crate) format: SpecFormat,
    pub(crate) service: Option<Sp<String>>,
    pub(crate) doc: Option<Sp<String>>,
    /// `None` when the key is missing (reported already).
    pub(crate) endpoints: Option<Sp<Vec<EndpointSpec>>>,
    pub(crate) messages: Vec<MessageSpec>,
    pub(crate) enums: Vec<EnumSpec>,
}

/// One item of `endpoints`.
#[derive(Debug)]
pub(crate) struct EndpointSpec {
    pub(crate) pos: Pos,
    pub(crate) path: Option<Sp<String>>,
    pub(crate) op: Option<Sp<OpKind>>,
    pub(crate) buffer_size: Option<Sp<u64>>,
    pub(crate) method: Option<Sp<String>>,
    pub(crate) doc: Option<Sp<String>>,
    pub(crate) request: Option<MessageRefSpec>,
    pub(crate) response: Option<MessageRefSpec>,
    pub(crate) timeout: Option<Sp<Duration>>,
    /// `payload:`, if given.
    pub(crate) payload: Option<Sp<bool>>,
    /// Whether the endpoint has a `buffer` key (valid or not).
    pub(crate) buffer_given: bool,
    /// `stream:` (a bulk stream), if given.
    pub(crate) stream: Option<StreamSpec>,
}

/// An endpoint's `request` or `response`: a message name, or `{ stream: Name }`.
#[derive(Debug)]
pub(crate) struct MessageRefSpec {
    /// The message name; `None` when a stream names none (reported already).
    pub(crate) name: Option<Sp<String>>,
    /// The `stream` key (where it is, its key path), when the messages stream
    /// (`{ stream: Name }`).
    pub(crate) stream: Option<Sp<()>>,
}

/// An endpoint's `stream:` mapping (a bulk stream).
#[derive(Debug)]
pub(crate) struct StreamSpec {
    /// Where the `stream` key is.
    pub(crate) pos: Pos,
    /// Its key path, `endpoints[i].stream`.
    pub(crate) key: String,
    /// `max_len`, when given and valid.
    pub(crate) max_len: Option<Sp<u64>>,
}

/// One entry of `messages`.
#[derive(Debug)]
pub(crate) struct MessageSpec {
    pub(crate) name: Sp<String>,
    pub(crate) doc: Option<Sp<String>>,
    pub(crate) fields: Vec<FieldSpec>,
}

/// One item of a message's `fields`.
#[derive(Debug)]
pub(crate) struct FieldSpec {
    pub(crate) pos: Pos,
    pub(crate) key: String,
    pub(crate) name: Option<Sp<String>>,
    pub(crate) ty: Option<Sp<String>>,
    pub(crate) tag: Option<Sp<i128>>,
    pub(crate) repeated: Option<Sp<bool>>,
    pub(crate) optional: Option<Sp<bool>>,
    pub(crate) doc: Option<Sp<String>>,
}

/// One entry of `enums`.
#[derive(Debug)]
pub(crate) struct EnumSpec {
    pub(crate) name: Sp<String>,
    pub(crate) doc: Option<Sp<String>>,
    /// `None` when the key is missing (reported already).
    pub(crate) values: Vec<EnumValueSpec>,
}

/// One item of an enum's `values`.
#[derive(Debug)]
pub(crate) struct EnumValueSpec {
    pub(crate) pos: Pos,
    pub(crate) key: String,
    pub(crate) name: Option<Sp<String>>,
    pub(crate) number: Option<Sp<i128>>,
    pub(crate) doc: Option<Sp<String>>,
}

/// Decodes the tree of a whole spec, reporting every structural problem into `sink`.
pub(crate) fn decode(root: &Node, sink: &mut Sink) -> SpecFile {
    let mut d = Decoder {
        sink,
        format: SpecFormat::Extended,
    };
    d.file(root)
}

struct Decoder<'s> {
    sink: &'s mut Sink,
    format: SpecFormat,
}
