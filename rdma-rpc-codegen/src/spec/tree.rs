//! Walking the YAML tree with positions: a mapping's keys checked against the keys an item
//! allows in the spec's format (unknown, misspelled, duplicate or extended-only keys are
//! reported), lists, named maps and scalars, each decoded value kept with its position and
//! key path ([`Sp`]).

use super::{Decoder, Sp};
use crate::ir::SpecFormat;
use crate::naming::closest;
use crate::yaml::{Kind, Node, Pos};

/// In which formats a key may appear.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Avail {
    Both,
    Extended,
}

/// The known keys of one mapping, after unknown and duplicate keys were reported.
pub(super) struct Fields<'a> {
    key: String,
    /// Each known key with where the key itself is, and its value.
    entries: Vec<(&'static str, Pos, &'a Node)>,
    /// Keys that an unknown key was suggested as ("did you mean"); not reported missing.
    suggested: Vec<&'a str>,
}

impl<'a> Fields<'a> {
    pub(super) fn get(&self, name: &str) -> Option<(&'a Node, String)> {
        self.entries
            .iter()
            .find(|(k, _, _)| *k == name)
            .map(|(k, _, node)| (*node, join(&self.key, k)))
    }

    /// Where the key `name` itself is (not its value), if present.
    pub(super) fn key_pos(&self, name: &str) -> Option<Pos> {
        self.entries
            .iter()
            .find(|(k, _, _)| *k == name)
            .map(|(_, pos, _)| *pos)
    }
}

pub(super) fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// The last component of a key path, for messages.
pub(super) fn last(key: &str) -> &str {
    let tail = key.rsplit('.').next().unwrap_or(key);
    tail.split('[').next().unwrap_or(tail)
}

impl Decoder<'_> {
    /// Reports the required key `name` missing from `fields`, unless an unknown key was
    /// already reported as a likely misspelling of it.
    pub(super) fn missing(&mut self, fields: &Fields<'_>, pos: Pos, name: &str, hint: &str) {
        if !fields.suggested.contains(&name) {
            self.sink.error_hint(
                pos,
                &join(&fields.key, name),
                format!("missing key `{name}`"),
                hint,
            );
        }
    }

    /// Checks that `node` is a mapping with only `allowed` keys, each at most once.
    pub(super) fn fields<'a>(
        &mut self,
        node: &'a Node,
        key: &str,
        allowed: &[(&'static str, Avail)],
    ) -> Option<Fields<'a>> {
        let Kind::Map(entries) = &node.kind else {
            let expected: Vec<String> = allowed.iter().map(|(k, _)| format!("`{k}`")).collect();
            self.sink.error_hint(
                node.pos,
                key,
                format!("expected a mapping, found {}", node.kind.describe()),
                format!(
                    "write it as a mapping with the keys {}",
                    expected.join(", ")
                ),
            );
            return None;
        };
        let mut fields = Fields {
            key: key.to_owned(),
            entries: Vec::new(),
            suggested: Vec::new(),
        };
        for (k, value) in entries {
            let Kind::Str(name) = &k.kind else {
                self.sink.error(
                    k.pos,
                    key,
                    format!("keys must be strings, found {}", k.kind.describe()),
                );
                continue;
            };
            let path = join(key, name);
            let Some((known, avail)) = allowed.iter().find(|(a, _)| a == name) else {
                let message = format!("unknown key `{name}`");
                let valid = allowed
                    .iter()
                    .filter(|(_, a)| self.format == SpecFormat::Extended || *a == Avail::Both)
                    .map(|(k, _)| *k);
                match closest(name, valid) {
                    Some(s) => {
                        fields.suggested.push(s);
                        self.sink
                            .error_hint(k.pos, &path, message, format!("did you mean `{s}`?"));
                    }
                    None => {
                        let list: Vec<String> = allowed
                            .iter()
                            .filter(|(_, a)| {
                                self.format == SpecFormat::Extended || *a == Avail::Both
                            })
                            .map(|(k, _)| format!("`{k}`"))
                            .collect();
                        self.sink.error_hint(
                            k.pos,
                            &path,
                            message,
                            format!("the keys allowed here are {}", list.join(", ")),
                        );
                    }
                }
                continue;
            };
            if *avail == Avail::Extended && self.format == SpecFormat::DocaCpp {
                self.sink.error_hint(
                    k.pos,
                    &path,
                    format!("key `{name}` is not part of the doca-cpp format (version \"0.0.1\")"),
                    "use `version: \"rdma-rpc/1\"` for the extended format",
                );
                continue;
            }
            if let Some((_, _, first)) = fields.entries.iter().find(|(k2, _, _)| k2 == known) {
                let first_line = first.pos.line;
                self.sink.error_hint(
                    k.pos,
                    &path,
                    format!("duplicate key `{name}`"),
                    format!("`{name}` is already set on line {first_line}; remove one of them"),
                );
                continue;
            }
            fields.entries.push((known, k.pos, value));
        }
        Some(fields)
    }

    /// Decodes a list whose items `item` decodes; reports a non-list.
    pub(super) fn list<T>(
        &mut self,
        node: &Node,
        key: &str,
        mut item: impl FnMut(&mut Self, &Node, String) -> Option<T>,
    ) -> Option<Sp<Vec<T>>> {
        match &node.kind {
            Kind::Seq(items) => Some(Sp {
                value: items
                    .iter()
                    .enumerate()
                    .filter_map(|(i, n)| item(self, n, format!("{key}[{i}]")))
                    .collect(),
                pos: node.pos,
                key: key.to_owned(),
            }),
            Kind::Null => Some(Sp {
                value: Vec::new(),
                pos: node.pos,
                key: key.to_owned(),
            }),
            other => {
                self.sink.error_hint(
                    node.pos,
                    key,
                    format!("`{}` must be a list, found {}", last(key), other.describe()),
                    "write one item per line, each starting with `- `",
                );
                None
            }
        }
    }

    /// Decodes a mapping from names to definitions (`messages`, `enums`).
    pub(super) fn named_map<T>(
        &mut self,
        node: &Node,
        key: &str,
        mut item: impl FnMut(&mut Self, Sp<String>, &Node, String) -> Option<T>,
    ) -> Vec<T> {
        let mut out = Vec::new();
        match &node.kind {
            Kind::Map(entries) => {
                let mut seen: Vec<(&str, u64)> = Vec::new();
                for (k, value) in entries {
                    let Kind::Str(name) = &k.kind else {
                        self.sink.error(
                            k.pos,
                            key,
                            format!("names must be strings, found {}", k.kind.describe()),
                        );
                        continue;
                    };
                    let path = join(key, name);
                    if let Some((_, line)) = seen.iter().find(|(n, _)| n == name) {
                        self.sink.error_hint(
                            k.pos,
                            &path,
                            format!("`{name}` is defined twice"),
                            format!("the first definition is on line {line}; rename or remove one"),
                        );
                        continue;
                    }
                    seen.push((name, k.pos.line));
                    let name = Sp {
                        value: name.clone(),
                        pos: k.pos,
                        key: path.clone(),
                    };
                    out.extend(item(self, name, value, path));
                }
            }
            Kind::Null => {}
            other => self.sink.error_hint(
                node.pos,
                key,
                format!(
                    "`{}` must be a mapping from names to definitions, found {}",
                    last(key),
                    other.describe()
                ),
                "write one `Name:` per definition",
            ),
        }
        out
    }

    pub(super) fn string(&mut self, node: &Node, key: String) -> Option<Sp<String>> {
        match &node.kind {
            Kind::Str(s) => Some(Sp {
                value: s.clone(),
                pos: node.pos,
                key,
            }),
            other => {
                self.sink.error_hint(
                    node.pos,
                    &key,
                    format!(
                        "`{}` must be a string, found {}",
                        last(&key),
                        other.describe()
                    ),
                    "quote the value",
                );
                None
            }
        }
    }

    pub(super) fn boolean(&mut self, node: &Node, key: String) -> Option<Sp<bool>> {
        match &node.kind {
            Kind::Bool(b) => Some(Sp {
                value: *b,
                pos: node.pos,
                key,
            }),
            other => {
                self.sink.error_hint(
                    node.pos,
                    &key,
                    format!(
                        "`{}` must be true or false, found {}",
                        last(&key),
                        other.describe()
                    ),
                    "write `true` or `false`",
                );
                None
            }
        }
    }

    pub(super) fn integer(&mut self, node: &Node, key: String) -> Option<Sp<i128>> {
        match &node.kind {
            Kind::Int(n) => Some(Sp {
                value: *n,
                pos: node.pos,
                key,
            }),
            other => {
                self.sink.error(
                    node.pos,
                    &key,
                    format!(
                        "`{}` must be an integer, found {}",
                        last(&key),
                        other.describe()
                    ),
                );
                None
            }
        }
    }
}
