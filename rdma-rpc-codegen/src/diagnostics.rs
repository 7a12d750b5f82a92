//! Problems found in a spec, each with file, line, column, key and hint, and the error type
//! that carries all of them.

use std::fmt;
use std::path::PathBuf;

use crate::yaml::Pos;

/// One problem found in a spec file.
///
/// Its [`Display`](fmt::Display) looks like a rustc diagnostic:
///
/// ```text
/// error: unknown operation type `recieve`
///   --> specs/kv_store.yaml:12:11
///    = key: endpoints[2].type
///    = help: did you mean `receive`?
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Diagnostic {
    /// The spec file, as it was named to [`crate::load_spec`] or [`crate::parse_spec`].
    pub file: String,
    /// 1-based line of the offending key or value.
    pub line: u64,
    /// 1-based column of the offending key or value.
    pub column: u64,
    /// Where in the document the problem is, e.g. `endpoints[2].buffer.size`; empty for the
    /// document as a whole.
    pub key: String,
    /// What is wrong.
    pub message: String,
    /// How to fix it, when there is something useful to say.
    pub hint: Option<String>,
}

impl Diagnostic {
    pub(crate) fn new(
        file: &str,
        pos: Pos,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Diagnostic {
            file: file.to_owned(),
            line: pos.line,
            column: pos.column,
            key: key.into(),
            message: message.into(),
            hint: None,
        }
    }

    pub(crate) fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "error: {}", self.message)?;
        write!(f, "  --> {}:{}:{}", self.file, self.line, self.column)?;
        if !self.key.is_empty() {
            write!(f, "\n   = key: {}", self.key)?;
        }
        if let Some(hint) = &self.hint {
            write!(f, "\n   = help: {hint}")?;
        }
        Ok(())
    }
}

/// Every diagnostic of one spec file, in source order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    /// The diagnostics, in source order.
    pub fn iter(&self) -> std::slice::Iter<'_, Diagnostic> {
        self.0.iter()
    }

    /// How many problems were found.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no problem was found (never the case inside an [`Error`]).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'a> IntoIterator for &'a Diagnostics {
    type Item = &'a Diagnostic;
    type IntoIter = std::slice::Iter<'a, Diagnostic>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, diagnostic) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n\n")?;
            }
            write!(f, "{diagnostic}")?;
        }
        Ok(())
    }
}

/// Why a spec could not be turned into a [`crate::ServiceIr`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The spec file could not be read.
    #[error("cannot read spec `{}`", path.display())]
    Io {
        /// The file that was being read.
        path: PathBuf,
        /// What the operating system reported.
        #[source]
        source: std::io::Error,
    },
    /// The spec was read but is invalid; every problem found is listed.
    #[error("{file}: {} error{} in spec\n\n{diagnostics}", diagnostics.len(), if diagnostics.len() == 1 { "" } else { "s" })]
    Invalid {
        /// The spec file.
        file: String,
        /// Every problem, in source order.
        diagnostics: Diagnostics,
    },
}

impl Error {
    /// The diagnostics of an [`Error::Invalid`]; empty for other errors.
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            Error::Invalid { diagnostics, .. } => &diagnostics.0,
            Error::Io { .. } => &[],
        }
    }
}

/// The result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Collects diagnostics for one file.
#[derive(Debug)]
pub(crate) struct Sink {
    pub(crate) file: String,
    pub(crate) diagnostics: Vec<Diagnostic>,
}

impl Sink {
    pub(crate) fn new(file: &str) -> Self {
        Sink {
            file: file.to_owned(),
            diagnostics: Vec::new(),
        }
    }

    /// Records a problem; returns it for a chained `with_hint` through [`Sink::hint`].
    pub(crate) fn error(&mut self, pos: Pos, key: &str, message: impl Into<String>) {
        self.diagnostics
            .push(Diagnostic::new(&self.file, pos, key, message));
    }

    /// Records a problem with a hint.
    pub(crate) fn error_hint(
        &mut self,
        pos: Pos,
        key: &str,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) {
        self.diagnostics
            .push(Diagnostic::new(&self.file, pos, key, message).with_hint(hint));
    }

    /// Turns the collected problems into an error, or `Ok` when there are none.
    pub(crate) fn finish<T>(mut self, value: T) -> Result<T> {
        if self.diagnostics.is_empty() {
            return Ok(value);
        }
        self.diagnostics.sort_by_key(|d| (d.line, d.column));
        Err(Error::Invalid {
            file: self.file,
            diagnostics: Diagnostics(self.diagnostics),
        })
    }
}
