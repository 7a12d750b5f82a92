//! Logs a peer cannot flood. Lines a peer can cause again and again (a refused call, a refused
//! or dropped connection) pass a budget per kind of line and reason: the first [`BURST`] are
//! written, then one per [`INTERVAL`] saying how many like it were left out (`suppressed`);
//! metrics still count every one. Bytes a peer chose (metadata keys, paths, messages) appear
//! through [`Shown`]: cut short, and never longer than they came.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::protocol::rate::{Rate, Verdict};

/// Lines of one kind and reason written before the budget holds them back.
pub(crate) const BURST: u32 = 10;
/// After the first [`BURST`], at most one line per kind and reason in this interval.
pub(crate) const INTERVAL: Duration = Duration::from_secs(5);

/// Most bytes of a peer's string (a key, a path) shown in a message.
pub(crate) const SHOWN: usize = 64;
/// Most bytes of a status message shown in a log line.
pub(crate) const SHOWN_REASON: usize = 512;

/// A line that may be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Line {
    /// Lines of the same kind and reason left out since the last one written (`None` if
    /// none): log it as the `suppressed` field.
    pub(crate) suppressed: Option<u64>,
}

/// Budgets per kind of line and reason. A server keeps its own for the lines it writes about
/// connections and calls; what runs below a server (transfers, transports) shares one for the
/// process ([`line`]).
#[derive(Debug, Default)]
pub(crate) struct LogBudget(Mutex<Budgets>);

/// By (line, reason): both static strings, so there are as many as the sites that log and the
/// reasons they name (status codes, causes), never as many as peers.
type Budgets = Vec<((&'static str, &'static str), Rate)>;

impl LogBudget {
    pub(crate) const fn new() -> LogBudget {
        LogBudget(Mutex::new(Vec::new()))
    }

    /// Whether a line `what` (its message) for `reason` (a status code's name, a cause) may
    /// be written now.
    pub(crate) fn line(&self, what: &'static str, reason: &'static str) -> Option<Line> {
        let mut budgets = self.0.lock().unwrap_or_else(|e| e.into_inner());
        check(&mut budgets, (what, reason), Instant::now())
    }
}

/// The budget of the lines written below any one server.
static PROCESS: LogBudget = LogBudget::new();

/// [`LogBudget::line`] on the process's budget.
pub(crate) fn line(what: &'static str, reason: &'static str) -> Option<Line> {
    PROCESS.line(what, reason)
}

fn check(budgets: &mut Budgets, key: (&'static str, &'static str), now: Instant) -> Option<Line> {
    let at = match budgets.iter().position(|(k, _)| *k == key) {
        Some(at) => at,
        None => {
            budgets.push((key, Rate::new(BURST, INTERVAL)));
            budgets.len() - 1
        }
    };
    match budgets[at].1.check(now) {
        Verdict::Pass { held } => Some(Line {
            suppressed: (held > 0).then_some(held),
        }),
        Verdict::Hold => None,
    }
}

/// How a connection ended, for its log line's level and the `connections_dropped_total`
/// reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// The peer went away: a clean close or a reset, nothing to look at (`DEBUG`).
    Closed,
    /// The peer broke the protocol (`WARN`).
    Protocol,
    /// A limit or a timeout (`WARN`).
    Other,
}

impl Ending {
    pub(crate) fn of(e: &Error) -> Ending {
        use std::io::ErrorKind;
        match e {
            Error::ConnectionClosed { .. } => Ending::Closed,
            Error::Io { source, .. }
                if matches!(
                    source.kind(),
                    ErrorKind::ConnectionReset
                        | ErrorKind::ConnectionAborted
                        | ErrorKind::BrokenPipe
                        | ErrorKind::UnexpectedEof
                ) =>
            {
                Ending::Closed
            }
            Error::Protocol { .. } | Error::VersionMismatch { .. } => Ending::Protocol,
            _ => Ending::Other,
        }
    }

    /// The metrics label and log reason.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Ending::Closed => "closed",
            Ending::Protocol => "protocol",
            Ending::Other => "other",
        }
    }
}

/// A string a peer chose, as a log line or a status message shows it: at most `max` bytes,
/// and every character a log would escape (controls, quotes, backslashes, invisible marks)
/// shown as `?`. Never longer than the string itself, so a peer cannot make the log grow
/// faster than what it sends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shown<'a> {
    text: &'a str,
    max: usize,
}

/// `text` shown in at most [`SHOWN`] bytes.
pub(crate) fn shown(text: &str) -> Shown<'_> {
    Shown { text, max: SHOWN }
}

/// A status message shown in at most [`SHOWN_REASON`] bytes.
pub(crate) fn shown_reason(text: &str) -> Shown<'_> {
    Shown {
        text,
        max: SHOWN_REASON,
    }
}

/// Marks a string cut short.
const CUT: &str = "…";

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.text;
        let cut = text.len() > self.max;
        let mut end = if cut {
            self.max.saturating_sub(CUT.len())
        } else {
            text.len()
        };
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        for c in text[..end].chars() {
            // What `Debug` of a `str` (tracing's formatting of string fields) leaves as is;
            // a single quote only `char`'s escaping touches.
            let plain = c == '\'' || c.escape_debug().len() == 1;
            if plain {
                fmt::Write::write_char(f, c)?;
            } else {
                f.write_str("?")?;
            }
        }
        if cut {
            f.write_str(CUT)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_and_reason_has_its_own_budget() {
        let t0 = Instant::now();
        let mut budgets = Budgets::new();
        let written = |budgets: &mut Budgets, key, at| {
            (0..1000)
                .filter(|_| check(budgets, key, at).is_some())
                .count()
        };
        assert_eq!(
            written(&mut budgets, ("call refused", "A"), t0),
            BURST as usize
        );
        // Another reason, another line: not held back by the first flood.
        assert_eq!(
            written(&mut budgets, ("call refused", "B"), t0),
            BURST as usize
        );
        assert_eq!(written(&mut budgets, ("dropped", "A"), t0), BURST as usize);
        // The next interval: one line, with the count left out.
        let next = t0 + INTERVAL;
        assert_eq!(
            check(&mut budgets, ("call refused", "A"), next),
            Some(Line {
                suppressed: Some(1000 - u64::from(BURST))
            })
        );
        assert_eq!(check(&mut budgets, ("call refused", "A"), next), None);
        assert_eq!(budgets.len(), 3);
    }

    #[test]
    fn shown_strings_are_cut_and_never_grow() {
        let controls: String = (0..128u8).map(|b| char::from(b % 32)).collect();
        let shown_controls = shown(&controls).to_string();
        assert!(shown_controls.len() <= SHOWN, "{shown_controls:?}");
        assert!(shown_controls.starts_with("???"), "{shown_controls:?}");
        assert!(shown_controls.ends_with(CUT));
        // As tracing writes a string field: still no longer than what came.
        assert!(format!("{shown_controls:?}").len() <= SHOWN + 2);
        for text in [
            "",
            "x-trace",
            "a \"quoted\" \\ path",
            "new\nline\r\t",
            "ключ",
            "e\u{301}\u{200b}\u{7f}",
            &"é".repeat(100),
        ] {
            let out = shown(text).to_string();
            assert!(out.len() <= text.len().min(SHOWN), "{text:?} -> {out:?}");
            assert_eq!(format!("{out:?}").len(), out.len() + 2, "{out:?}");
        }
        assert_eq!(shown("/echo").to_string(), "/echo");
        assert_eq!(shown("it's").to_string(), "it's");
        assert_eq!(shown("a\"b\n").to_string(), "a?b?");
        assert_eq!(shown("ключ").to_string(), "ключ");
        let long = "p".repeat(1000);
        assert_eq!(shown_reason(&long).to_string().len(), SHOWN_REASON);
    }

    #[test]
    fn resets_are_a_peer_leaving_and_violations_are_not() {
        let io = |kind: std::io::ErrorKind| Error::Io {
            context: "reading from tcp://peer".into(),
            source: kind.into(),
        };
        assert_eq!(
            Ending::of(&io(std::io::ErrorKind::ConnectionReset)),
            Ending::Closed
        );
        assert_eq!(
            Ending::of(&io(std::io::ErrorKind::BrokenPipe)),
            Ending::Closed
        );
        assert_eq!(
            Ending::of(&io(std::io::ErrorKind::PermissionDenied)),
            Ending::Other
        );
        let closed = Error::ConnectionClosed {
            peer: "p".into(),
            reason: "closed by the peer".into(),
        };
        assert_eq!(Ending::of(&closed), Ending::Closed);
        let violation = Error::Protocol {
            peer: "p".into(),
            reason: "unexpected Response frame from a client".into(),
        };
        assert_eq!(Ending::of(&violation), Ending::Protocol);
    }
}
