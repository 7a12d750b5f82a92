//! The code generator of rdma-rpc: YAML endpoint specs to typed Rust servers and clients.
//!
//! This crate is a plain library (no runtime dependencies). It reads a spec — either the
//! endpoint list of the C++ project doca-cpp (`version: "0.0.1"`) or the extended format
//! (`version: "rdma-rpc/1"`) with method names, typed messages, enums, timeouts and
//! streams — checks it, and turns it into a validated intermediate representation,
//! [`ServiceIr`]. The spec language is documented in `docs/spec.md`.
//!
//! Every problem in a spec is reported in one pass, each as a [`Diagnostic`] with file, line,
//! column, key and hint:
//!
//! ```
//! let spec = r#"
//! version: "0.0.1"
//! endpoints:
//!   - path: /rdma/ep0
//!     type: recieve
//!     buffer:
//!       size: 4096
//! "#;
//! let err = rdma_rpc_codegen::parse_spec("ep.yaml", spec).unwrap_err();
//! let d = &err.diagnostics()[0];
//! assert_eq!((d.line, d.column), (5, 11));
//! assert_eq!(d.message, "unknown operation type `recieve`");
//! assert_eq!(d.hint.as_deref(), Some("did you mean `receive`?"));
//! ```
//!
//! Pipeline: YAML (serde-saphyr, with budgets) → a tree of nodes with positions → the spec
//! model (structural checks) → validation (names, references, duplicates) → [`ServiceIr`] →
//! tokens (`quote`) → `syn::File` → source formatted by prettyplease ([`generate`]).
//!
//! # From a build script
//!
//! ```no_run
//! // build.rs
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     rdma_rpc_codegen::configure()
//!         .build_client(true)
//!         .build_server(true)
//!         .compile(&["specs/kv_store.yaml"])?;
//!     Ok(())
//! }
//! ```
//!
//! writes `$OUT_DIR/kv_store.rs`, which the crate includes with
//! `rdma_rpc_core::include_spec!("kv_store");`. Without a build script, the
//! `rdma_rpc_core::spec!("specs/kv_store.yaml")` macro (from `rdma-rpc-macros`) expands to
//! the same items. Their layout is tonic-build's: the messages, enums and endpoint table at the
//! include site, `kv_store_server::{KvStore, KvStoreServer}` and
//! `kv_store_client::KvStoreClient` in a module each (re-exported at the include site too),
//! calling only `rdma-rpc-core`'s public API (`rdma_rpc_core::typed`). The shape of the
//! generated code is described in `docs/codegen-target.md`.
//!
//! # Feature flags
//!
//! None yet.

use std::io::Read;
use std::path::Path;

mod build;
pub mod diagnostics;
mod generate;
pub mod ir;
pub mod naming;
mod spec;
mod validate;
mod yaml;

pub use build::{compile, configure, Builder};
pub use diagnostics::{Diagnostic, Diagnostics, Error, Result};
pub use generate::{generate, generate_tokens, Options};
pub use ir::{
    EndpointIr, EnumIr, EnumValueIr, FieldIr, FieldLabel, MessageIr, OpKind, ScalarType, ServiceIr,
    SpecFormat, StreamKind, TypeRef,
};

/// The limits a spec must stay within; documented in `docs/spec.md` ("Limits").
pub mod limits {
    use std::time::Duration;

    /// The largest spec file accepted, checked before parsing: 1 MiB.
    pub const MAX_SPEC_BYTES: usize = 1 << 20;
    /// The largest buffer an endpoint may ask for: 1 GiB.
    pub const MAX_BUFFER_SIZE: u64 = 1 << 30;
    /// The largest `max_len` of a bulk stream: 1 TiB.
    pub const MAX_STREAM_LEN: u64 = 1 << 40;
    /// The buffer size of a send or receive endpoint without `buffer` (extended format).
    pub const DEFAULT_MESSAGE_BUFFER_SIZE: u64 = 4096;
    /// The longest endpoint path in bytes (the doca-cpp request frame's limit).
    pub const MAX_PATH_BYTES: usize = 256;
    /// The longest timeout: one hour.
    pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
    /// The most endpoints one service may have.
    pub const MAX_ENDPOINTS: usize = 1024;
    /// The deepest nesting of YAML mappings and lists.
    pub const MAX_YAML_DEPTH: usize = 16;
    /// The most YAML nodes (scalars, lists, mappings) in one spec, aliases expanded.
    pub const MAX_YAML_NODES: usize = 50_000;
    /// The most parser events in one spec, aliases replayed included.
    pub const MAX_YAML_EVENTS: usize = 100_000;
    /// The most aliases (`*name`) and the most anchors (`&name`) in one spec.
    pub const MAX_YAML_ALIASES: usize = 1_000;
}

/// Reads, checks and lowers the spec file at `path`.
///
/// Files over [`limits::MAX_SPEC_BYTES`] are refused before they are read whole. The
/// diagnostics name the file as `path` displays.
pub fn load_spec(path: impl AsRef<Path>) -> Result<ServiceIr> {
    let path = path.as_ref();
    load_spec_named(path, &path.display().to_string())
}

/// Like [`load_spec`], but diagnostics (and the service name, when the spec has none) use
/// `name` for the file: the proc macro reads `$CARGO_MANIFEST_DIR/specs/x.yaml` and reports
/// `specs/x.yaml` as the user wrote it.
pub fn load_spec_named(path: impl AsRef<Path>, name: &str) -> Result<ServiceIr> {
    let path = path.as_ref();
    let io = |source| Error::Io {
        path: path.to_owned(),
        source,
    };
    let name = name.to_owned();
    let file = std::fs::File::open(path).map_err(io)?;
    let mut bytes = Vec::new();
    file.take(limits::MAX_SPEC_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() > limits::MAX_SPEC_BYTES {
        let len = std::fs::metadata(path).map_or(bytes.len() as u64, |m| m.len());
        return Err(Error::Invalid {
            diagnostics: Diagnostics(vec![yaml::too_large(&name, len)]),
            file: name,
        });
    }
    match String::from_utf8(bytes) {
        Ok(source) => parse_spec(&name, &source),
        Err(err) => {
            let offset = err.utf8_error().valid_up_to();
            let before = &err.as_bytes()[..offset];
            let line = before.iter().filter(|&&b| b == b'\n').count() as u64 + 1;
            let column = (offset
                - before
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map_or(0, |i| i + 1)) as u64
                + 1;
            let mut sink = diagnostics::Sink::new(&name);
            sink.error_hint(
                yaml::Pos { line, column },
                "",
                "the spec is not valid UTF-8",
                "save the file as UTF-8",
            );
            sink.finish(ServiceIr::empty())
        }
    }
}

/// Checks and lowers a spec given as text; `file_name` names it in diagnostics and, when the
/// spec has no `service` name, gives the service its name (`kv_store.yaml` → `KvStore`).
pub fn parse_spec(file_name: &str, source: &str) -> Result<ServiceIr> {
    let mut sink = diagnostics::Sink::new(file_name);
    let root = match yaml::parse(file_name, source) {
        Ok(root) => root,
        Err(diagnostic) => {
            sink.diagnostics.push(diagnostic);
            return sink.finish(ServiceIr::empty());
        }
    };
    let spec = spec::decode(&root, &mut sink);
    let ir = validate::validate(spec, file_name, &mut sink);
    sink.finish(ir)
}

/// The sound parts of a spec that may be invalid: its service name, messages, enums and the
/// endpoints that have no problem of their own. For tools that keep going after an error: the
/// `spec!` macro generates these beside its compile errors, so that code using the service
/// fails once, at the spec's problems, rather than at every use of a missing item. `None` when
/// the text is not YAML at all.
pub fn parse_spec_partial(file_name: &str, source: &str) -> Option<ServiceIr> {
    let mut sink = diagnostics::Sink::new(file_name);
    let root = yaml::parse(file_name, source).ok()?;
    let spec = spec::decode(&root, &mut sink);
    Some(validate::validate(spec, file_name, &mut sink))
}

impl ServiceIr {
    fn empty() -> ServiceIr {
        ServiceIr {
            source: String::new(),
            name: String::new(),
            doc: None,
            format: SpecFormat::Extended,
            endpoints: Vec::new(),
            messages: Vec::new(),
            enums: Vec::new(),
        }
    }
}
