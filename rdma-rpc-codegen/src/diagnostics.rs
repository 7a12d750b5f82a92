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

/// Why a spec could not be read or compiled.
///
/// [`Display`](fmt::Display) prints every problem, each diagnostic with file, line and
/// column. [`Debug`](fmt::Debug) prints the same text followed by the chain of causes, so a
/// build script whose `main` returns `Result<(), Box<dyn std::error::Error>>` shows readable
/// diagnostics when it fails.
#[derive(thiserror::Error)]
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
    /// No output directory was configured and the `OUT_DIR` environment variable (set by
    /// Cargo for build scripts) is not set.
    #[error("no output directory: `OUT_DIR` is not set (are we running outside a build script?); set one with `configure().out_dir(..)`")]
    NoOutDir,
    /// Two specs would be generated into the same file.
    #[error("specs `{}` and `{}` both generate `{file}`; rename one of them", first.display(), second.display())]
    SameOutput {
        /// The generated file name, `<spec file stem>.rs`.
        file: String,
        /// The first spec.
        first: PathBuf,
        /// The second spec.
        second: PathBuf,
    },
    /// A generated file could not be written.
    #[error("cannot write generated code to `{}`", path.display())]
    Write {
        /// The file (or directory) that was being written.
        path: PathBuf,
        /// What the operating system reported.
        #[source]
        source: std::io::Error,
    },
    /// Several of the above, in the order the specs were given.
    #[error("{}", Several(errors))]
    Several {
        /// Every error; none is itself `Several`.
        errors: Vec<Error>,
    },
}

/// Displays several errors with their causes, separated by blank lines.
struct Several<'a>(&'a [Error]);

impl fmt::Display for Several<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} problems:", self.0.len())?;
        for err in self.0 {
            f.write_str("\n\n")?;
            write_chain(f, err)?;
        }
        Ok(())
    }
}

/// Writes `err` and its sources, `error: cause: cause`.
fn write_chain(f: &mut fmt::Formatter<'_>, err: &Error) -> fmt::Result {
    write!(f, "{err}")?;
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        write!(f, ": {cause}")?;
        source = cause.source();
    }
    Ok(())
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_chain(f, self)
    }
}

impl Error {
    /// The diagnostics of an [`Error::Invalid`]; empty for other errors (for an
    /// [`Error::Several`], look at each of its [`errors`](Error::errors)).
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            Error::Invalid { diagnostics, .. } => &diagnostics.0,
            _ => &[],
        }
    }

    /// The individual errors: the inner errors of [`Error::Several`], else `self` alone.
    pub fn errors(&self) -> &[Error] {
        match self {
            Error::Several { errors } => errors,
            other => std::slice::from_ref(other),
        }
    }

    /// One error for all of `errors`: `None` if there are none, the error itself if there is
    /// one, [`Error::Several`] otherwise.
    pub(crate) fn combine(mut errors: Vec<Error>) -> Option<Error> {
        match errors.len() {
            0 => None,
            1 => errors.pop(),
            _ => Some(Error::Several { errors }),
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
