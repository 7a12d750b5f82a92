//! Sizes and durations: `buffer.size` and a stream's `max_len` (bytes, with binary units in
//! the extended format) and `timeout` (a whole number with a unit), parsed and bounded.

use std::time::Duration;

use super::{Decoder, Sp};
use crate::ir::SpecFormat;
use crate::limits;
use crate::yaml::{Kind, Node};

/// Which size a size value gives; they differ in their bounds and wording.
#[derive(Clone, Copy)]
pub(super) enum Size {
    /// `buffer.size`.
    Buffer,
    /// A bulk stream's `max_len`.
    StreamLen,
}

impl Size {
    fn name(self) -> &'static str {
        match self {
            Size::Buffer => "buffer size",
            Size::StreamLen => "stream max_len",
        }
    }

    fn max(self) -> u64 {
        match self {
            Size::Buffer => limits::MAX_BUFFER_SIZE,
            Size::StreamLen => limits::MAX_STREAM_LEN,
        }
    }

    fn max_text(self) -> &'static str {
        match self {
            Size::Buffer => "1 GiB",
            Size::StreamLen => "1 TiB",
        }
    }

    fn example(self) -> &'static str {
        match self {
            Size::Buffer => "write e.g. `4096` or, in the extended format, `4KiB`",
            Size::StreamLen => "write the most bytes one call may move, e.g. `max_len: 1GiB`",
        }
    }

    fn too_large_hint(self) -> &'static str {
        match self {
            Size::Buffer => "use a smaller buffer and transfer large data in several operations",
            Size::StreamLen => "move larger data in several calls",
        }
    }
}

impl Decoder<'_> {
    pub(super) fn size(&mut self, node: &Node, key: String, what: Size) -> Option<Sp<u64>> {
        let (name, max) = (what.name(), what.max());
        let value = match &node.kind {
            Kind::Int(n) => *n,
            // Integers beyond 64 bits arrive as floats; let the range check report them.
            Kind::Float(f) if f.is_finite() && f.fract() == 0.0 && f.abs() > 1e18 => *f as i128,
            Kind::Str(text) if self.format == SpecFormat::DocaCpp => {
                self.sink.error_hint(
                    node.pos,
                    &key,
                    format!("buffer size `{text}` is not a number of bytes"),
                    "the doca-cpp format takes plain byte counts; units like `4KiB` need `version: \"rdma-rpc/1\"`",
                );
                return None;
            }
            Kind::Str(text) => match parse_size(name, text) {
                Ok(n) => n,
                Err((message, hint)) => {
                    self.sink.error_hint(node.pos, &key, message, hint);
                    return None;
                }
            },
            other => {
                self.sink.error_hint(
                    node.pos,
                    &key,
                    format!(
                        "{name} must be a whole number of bytes, found {}",
                        other.describe()
                    ),
                    what.example(),
                );
                return None;
            }
        };
        if value <= 0 {
            self.sink.error_hint(
                node.pos,
                &key,
                format!("{name} must be positive, found {value}"),
                what.example(),
            );
            return None;
        }
        if value > i128::from(max) {
            self.sink.error_hint(
                node.pos,
                &key,
                format!(
                    "{name} {value} bytes is larger than the maximum of {max} bytes ({})",
                    what.max_text()
                ),
                what.too_large_hint(),
            );
            return None;
        }
        Some(Sp {
            value: value as u64,
            pos: node.pos,
            key,
        })
    }

    pub(super) fn duration(&mut self, node: &Node, key: String) -> Option<Sp<Duration>> {
        let text = match &node.kind {
            Kind::Str(text) => text,
            other => {
                self.sink.error_hint(
                    node.pos,
                    &key,
                    format!(
                        "timeout must be a duration with a unit, found {}",
                        other.describe()
                    ),
                    "write e.g. `250ms`, `5s` or `1m`",
                );
                return None;
            }
        };
        match parse_duration(text) {
            Ok(value) => Some(Sp {
                value,
                pos: node.pos,
                key,
            }),
            Err((message, hint)) => {
                self.sink.error_hint(node.pos, &key, message, hint);
                None
            }
        }
    }
}

/// Splits `4KiB` / `250 ms` into the number and the unit.
fn split_number(text: &str) -> Option<(&str, &str)> {
    let text = text.trim();
    let end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '-' || c == '+' || c == '_'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(end);
    if number.is_empty() {
        return None;
    }
    Some((number, unit.trim()))
}

type ParseError = (String, String);

/// Parses an extended-format size (`what` names it in messages): an integer with an optional
/// binary unit.
fn parse_size(what: &str, text: &str) -> Result<i128, ParseError> {
    let units_hint = "write bytes (`4096`) or use a binary unit: `B`, `KiB`, `MiB`, `GiB`, `TiB`";
    let Some((number, unit)) = split_number(text) else {
        return Err((
            format!("{what} `{text}` is not a size"),
            units_hint.to_owned(),
        ));
    };
    let number: i128 = number.replace('_', "").parse().map_err(|_| {
        (
            format!("{what} `{text}` is not a size"),
            units_hint.to_owned(),
        )
    })?;
    let factor: i128 = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "k" | "K" | "kB" | "KB" | "Kb" | "kb" | "kib" | "Ki" | "KIB" => {
            return Err(ambiguous_unit(text, number, "KiB", 1 << 10));
        }
        "M" | "MB" | "Mb" | "mb" | "mib" | "Mi" | "MIB" => {
            return Err(ambiguous_unit(text, number, "MiB", 1 << 20));
        }
        "G" | "GB" | "Gb" | "gb" | "gib" | "Gi" | "GIB" => {
            return Err(ambiguous_unit(text, number, "GiB", 1 << 30));
        }
        "T" | "TB" | "Tb" | "tb" | "tib" | "Ti" | "TIB" => {
            return Err(ambiguous_unit(text, number, "TiB", 1 << 40));
        }
        _ => {
            return Err((
                format!("unknown size unit `{unit}` in `{text}`"),
                units_hint.to_owned(),
            ))
        }
    };
    Ok(number.saturating_mul(factor))
}

fn ambiguous_unit(text: &str, number: i128, unit: &str, factor: i128) -> ParseError {
    (
        format!("ambiguous size unit in `{text}`"),
        format!(
            "did you mean `{number}{unit}` ({} bytes)? sizes use binary units only",
            number.saturating_mul(factor)
        ),
    )
}

/// Parses a timeout: an integer with one of the units `ns`, `us`, `ms`, `s`, `m`, `h`.
fn parse_duration(text: &str) -> Result<Duration, ParseError> {
    let hint = "write a whole number with a unit: `ns`, `us`, `ms`, `s`, `m` or `h`, e.g. `250ms`";
    let bad = || {
        (
            format!("timeout `{text}` is not a duration"),
            hint.to_owned(),
        )
    };
    let (number, unit) = split_number(text).ok_or_else(bad)?;
    let n: i128 = number.replace('_', "").parse().map_err(|_| bad())?;
    if unit.starts_with('.') {
        return Err((
            format!("timeout `{text}` is not a whole number"),
            "use a smaller unit instead of a fraction, e.g. `1500ms` for 1.5 s".to_owned(),
        ));
    }
    let nanos_per: i128 = match unit {
        "ns" => 1,
        "us" | "µs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" | "min" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "" => {
            return Err((
                format!("timeout `{text}` has no unit"),
                format!("did you mean `{n}ms` or `{n}s`?"),
            ))
        }
        _ => {
            return Err((
                format!("unknown duration unit `{unit}` in `{text}`"),
                hint.to_owned(),
            ))
        }
    };
    if n <= 0 {
        return Err((
            format!("timeout must be positive, found `{text}`"),
            "leave `timeout` out to use the runtime's default".to_owned(),
        ));
    }
    let nanos = n.saturating_mul(nanos_per);
    let max = limits::MAX_TIMEOUT;
    if nanos > max.as_nanos() as i128 {
        return Err((
            format!(
                "timeout `{text}` is longer than the maximum of {} s",
                max.as_secs()
            ),
            "a timeout bounds one operation; leave `timeout` out to use the runtime's default"
                .to_owned(),
        ));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("buffer size", "4KiB"), Ok(4096));
        assert_eq!(parse_size("buffer size", "4 MiB"), Ok(4 << 20));
        assert_eq!(parse_size("buffer size", "1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("buffer size", "512"), Ok(512));
        assert_eq!(parse_size("buffer size", "512B"), Ok(512));
        assert_eq!(parse_size("buffer size", "1_024"), Ok(1024));
        assert_eq!(parse_size("buffer size", "-4KiB"), Ok(-4096));
        assert!(parse_size("buffer size", "4KB")
            .unwrap_err()
            .1
            .contains("`4KiB` (4096 bytes)"));
        assert!(parse_size("buffer size", "4 parsecs").is_err());
        assert!(parse_size("buffer size", "KiB").is_err());
        assert_eq!(parse_size("stream max_len", "1TiB"), Ok(1 << 40));
        assert!(parse_size("stream max_len", "1TB")
            .unwrap_err()
            .1
            .contains("`1TiB`"));
        assert_eq!(
            parse_size("stream max_len", "1 parsec").unwrap_err().0,
            "unknown size unit `parsec` in `1 parsec`"
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("10us"), Ok(Duration::from_micros(10)));
        assert!(parse_duration("1.5s").unwrap_err().1.contains("1500ms"));
        assert!(parse_duration("5").unwrap_err().1.contains("`5ms`"));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("2h").is_err());
    }
}
