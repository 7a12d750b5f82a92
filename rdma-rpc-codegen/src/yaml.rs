//! The untyped YAML layer: a budgeted parse into a tree where every node knows its
//! line and column.
//!
//! serde-saphyr does the parsing (with its budgets and alias limits) and gives each node
//! its location through [`serde_saphyr::Spanned`]. The typed spec model is decoded from this
//! tree by hand in [`crate::spec`], so that every problem in a file is reported in one pass
//! instead of stopping at the first one as a derived `Deserialize` would.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::budget::BudgetBreach;
use serde_saphyr::options::DuplicateKeyPolicy;
use serde_saphyr::{Budget, MergeKeyPolicy, Options, Spanned};

use crate::diagnostics::Diagnostic;
use crate::limits;

/// A position in a spec file, 1-based.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) struct Pos {
    pub(crate) line: u64,
    pub(crate) column: u64,
}

/// One YAML node with its position.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub(crate) pos: Pos,
    pub(crate) kind: Kind,
}

/// The shape and value of a YAML node, after YAML 1.2 core-schema typing.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    /// Entries in source order; duplicate keys are kept so that they can be reported.
    Map(Vec<(Node, Node)>),
}

impl Kind {
    /// How this kind is named in "expected X, found Y" messages.
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Bool(_) => "a boolean",
            Kind::Int(_) => "an integer",
            Kind::Float(_) => "a float",
            Kind::Str(_) => "a string",
            Kind::Seq(_) => "a list",
            Kind::Map(_) => "a mapping",
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spanned = Spanned::<Kind>::deserialize(deserializer)?;
        let loc = spanned.referenced;
        Ok(Node {
            pos: Pos {
                line: loc.line(),
                column: loc.column(),
            },
            kind: spanned.value,
        })
    }
}

impl<'de> Deserialize<'de> for Kind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(KindVisitor)
    }
}

struct KindVisitor;

impl<'de> Visitor<'de> for KindVisitor {
    type Value = Kind;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML node")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Kind, E> {
        Ok(Kind::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Kind, E> {
        Ok(Kind::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Kind, D::Error> {
        Kind::deserialize(deserializer)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Kind, E> {
        Ok(Kind::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Kind, E> {
        Ok(Kind::Int(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Kind, E> {
        Ok(Kind::Int(v.into()))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Kind, E> {
        Ok(Kind::Int(v))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Kind, E> {
        // Larger than any limit we accept; saturate so the range check reports it.
        Ok(Kind::Int(i128::try_from(v).unwrap_or(i128::MAX)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Kind, E> {
        Ok(Kind::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Kind, E> {
        Ok(Kind::Str(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Kind, E> {
        Ok(Kind::Str(v))
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Kind, E> {
        Ok(Kind::Str(String::from_utf8_lossy(v).into_owned()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Kind, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Node>()? {
            items.push(item);
        }
        Ok(Kind::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Kind, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Node>()? {
            let value = map.next_value::<Node>()?;
            entries.push((key, value));
        }
        Ok(Kind::Map(entries))
    }
}

/// The parser options used for every spec: tight budgets, duplicate keys passed through to
/// our own check, no comment retention.
fn options() -> Options {
    let mut budget = Budget::default();
    budget.max_events = limits::MAX_YAML_EVENTS;
    budget.max_nodes = limits::MAX_YAML_NODES;
    budget.max_depth = limits::MAX_YAML_DEPTH;
    budget.flow_nesting_limit = limits::MAX_YAML_DEPTH;
    budget.max_aliases = limits::MAX_YAML_ALIASES;
    budget.max_anchors = limits::MAX_YAML_ALIASES;
    budget.max_documents = 1;
    budget.max_total_scalar_bytes = limits::MAX_SPEC_BYTES;
    budget.max_recorded_anchor_events = limits::MAX_YAML_EVENTS;
    budget.max_recorded_anchor_bytes = limits::MAX_SPEC_BYTES;
    budget.max_reader_input_bytes = Some(limits::MAX_SPEC_BYTES);

    let mut options = Options::default();
    options.budget = Some(budget);
    options.duplicate_keys = DuplicateKeyPolicy::PassThrough;
    options.merge_keys = MergeKeyPolicy::Merge;
    options.alias_limits.max_total_replayed_events = limits::MAX_YAML_EVENTS;
    options.alias_limits.max_replay_stack_depth = limits::MAX_YAML_DEPTH;
    options.emit_comments = false;
    options.with_snippet = false;
    options
}

/// Parses `source` into a tree, refusing oversized or hostile input.
pub(crate) fn parse(file: &str, source: &str) -> Result<Node, Diagnostic> {
    if source.len() > limits::MAX_SPEC_BYTES {
        return Err(too_large(file, source.len() as u64));
    }
    if source.trim().is_empty() {
        return Err(
            Diagnostic::new(file, Pos { line: 1, column: 1 }, "", "the spec is empty")
                .with_hint("a spec starts with `version:` and lists `endpoints:`"),
        );
    }
    match serde_saphyr::from_str_with_options::<Node>(source, options()) {
        Ok(node) => Ok(node),
        Err(err) => Err(syntax_error(file, &err)),
    }
}

/// The diagnostic for a file over [`limits::MAX_SPEC_BYTES`].
pub(crate) fn too_large(file: &str, len: u64) -> Diagnostic {
    Diagnostic::new(
        file,
        Pos { line: 1, column: 1 },
        "",
        format!(
            "the spec is {len} bytes, more than the limit of {} bytes",
            limits::MAX_SPEC_BYTES
        ),
    )
    .with_hint("a spec describes endpoints and messages; split it into several services")
}

fn syntax_error(file: &str, err: &serde_saphyr::Error) -> Diagnostic {
    let pos = err
        .location()
        .filter(|loc| loc.line() > 0)
        .map(|loc| Pos {
            line: loc.line(),
            column: loc.column(),
        })
        .unwrap_or(Pos { line: 1, column: 1 });
    let text = strip_location(&err.to_string());
    let limits_hint = || {
        format!(
            "specs are refused when they nest deeper than {} levels, or hold more than {} \
             nodes or {} parser events once aliases are expanded",
            limits::MAX_YAML_DEPTH,
            limits::MAX_YAML_NODES,
            limits::MAX_YAML_EVENTS
        )
    };
    let (message, hint) = match err {
        serde_saphyr::Error::Budget { breach, .. } => match breach {
            BudgetBreach::Documents { .. } => (
                "the spec holds more than one YAML document".to_owned(),
                "remove the `---` separator; one file describes one service".to_owned(),
            ),
            BudgetBreach::Depth { .. } => (
                format!(
                    "the spec nests deeper than {} levels",
                    limits::MAX_YAML_DEPTH
                ),
                limits_hint(),
            ),
            other => (
                format!("the spec is too large or too complex to accept ({other:?})"),
                limits_hint(),
            ),
        },
        _ if text.contains("recursion limit")
            || text.contains("budget")
            || text.contains("nesting")
            || (text.contains("alias") && (text.contains("limit") || text.contains("replay"))) =>
        {
            (
                format!("the spec is too large or too complex to accept: {text}"),
                limits_hint(),
            )
        }
        serde_saphyr::Error::MultipleDocuments { .. } => (
            "the spec holds more than one YAML document".to_owned(),
            "remove the `---` separator; one file describes one service".to_owned(),
        ),
        _ => (
            format!("invalid YAML: {text}"),
            "check indentation, quoting and the `key: value` syntax around this position"
                .to_owned(),
        ),
    };
    Diagnostic::new(file, pos, "", message).with_hint(hint)
}

/// serde-saphyr appends " at line X, column Y" to some messages; our Display adds it anyway.
fn strip_location(text: &str) -> String {
    let first = text.lines().next().unwrap_or(text);
    match first.find(" at line ") {
        Some(i) => first[..i].to_owned(),
        None => first.to_owned(),
    }
}
