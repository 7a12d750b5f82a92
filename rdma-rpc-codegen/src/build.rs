//! The build-script API: specs in, `<out_dir>/<spec file stem>.rs` out.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::diagnostics::{Error, Result};
use crate::generate::{generate, Options};
use crate::ir::ServiceIr;

/// Generates code for one spec into `OUT_DIR`, with the server and the client; the same as
/// `configure().compile(&[spec])`.
///
/// ```no_run
/// // build.rs
/// fn main() -> Result<(), Box<dyn std::error::Error>> {
///     rdma_rpc_codegen::compile("specs/kv_store.yaml")?;
///     Ok(())
/// }
/// ```
///
/// Then, in the crate: `rdma_rpc_core::include_spec!("kv_store");`.
pub fn compile(spec: impl AsRef<Path>) -> Result<()> {
    configure().compile(&[spec])
}

/// A [`Builder`] with the defaults: server and client, output to `OUT_DIR`.
///
/// ```no_run
/// rdma_rpc_codegen::configure()
///     .build_server(false)
///     .compile(&["specs/kv_store.yaml", "specs/doca_cpp_endpoints.yaml"])?;
/// # Ok::<(), rdma_rpc_codegen::Error>(())
/// ```
pub fn configure() -> Builder {
    Builder::default()
}

/// Code generation settings for a build script; made by [`configure`].
#[derive(Debug, Clone, Default)]
pub struct Builder {
    options: Options,
    out_dir: Option<PathBuf>,
}

impl Builder {
    /// Whether to generate the service trait and the `<Service>Server<T>` adapter (default
    /// `true`).
    pub fn build_server(mut self, enable: bool) -> Self {
        self.options.build_server = enable;
        self
    }

    /// Whether to generate the `<Service>Client` (default `true`).
    pub fn build_client(mut self, enable: bool) -> Self {
        self.options.build_client = enable;
        self
    }

    /// Where to write the generated files (default: the `OUT_DIR` environment variable,
    /// which Cargo sets for build scripts). Created if missing.
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.out_dir = Some(dir.into());
        self
    }

    /// Checks every spec and, if all are valid, writes `<out_dir>/<spec file stem>.rs` for
    /// each (`specs/kv_store.yaml` → `kv_store.rs`). A file whose content would not change is
    /// not rewritten.
    ///
    /// With an output directory (explicit, or `OUT_DIR`), prints
    /// `cargo:rerun-if-changed=<spec>` for every spec, so Cargo reruns the build script when
    /// one changes. Never panics; every problem of every spec is in the one error returned
    /// (an [`Error::Several`] when there is more than one).
    pub fn compile<P: AsRef<Path>>(&self, specs: &[P]) -> Result<()> {
        let mut errors = Vec::new();
        let out_dir = self
            .out_dir
            .clone()
            .or_else(|| std::env::var_os("OUT_DIR").map(PathBuf::from));
        if out_dir.is_none() {
            errors.push(Error::NoOutDir);
        }
        let mut services: Vec<(&Path, OsString, ServiceIr)> = Vec::new();
        let mut outputs: HashMap<OsString, &Path> = HashMap::new();
        for spec in specs {
            let path = spec.as_ref();
            if out_dir.is_some() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
            let ir = match crate::load_spec(path) {
                Ok(ir) => ir,
                Err(err) => {
                    errors.push(err);
                    continue;
                }
            };
            let mut file = path.file_stem().unwrap_or(path.as_os_str()).to_owned();
            file.push(".rs");
            if let Some(first) = outputs.get(&file) {
                errors.push(Error::SameOutput {
                    file: file.to_string_lossy().into_owned(),
                    first: first.to_path_buf(),
                    second: path.to_path_buf(),
                });
                continue;
            }
            outputs.insert(file.clone(), path);
            services.push((path, file, ir));
        }
        if let Some(err) = Error::combine(errors) {
            return Err(err);
        }
        let Some(out_dir) = out_dir else {
            return Err(Error::NoOutDir);
        };
        std::fs::create_dir_all(&out_dir).map_err(|source| Error::Write {
            path: out_dir.clone(),
            source,
        })?;
        let mut errors = Vec::new();
        for (_, file, ir) in &services {
            let target = out_dir.join(file);
            let code = generate(ir, &self.options);
            if std::fs::read(&target).is_ok_and(|old| old == code.as_bytes()) {
                continue;
            }
            if let Err(source) = std::fs::write(&target, code) {
                errors.push(Error::Write {
                    path: target,
                    source,
                });
            }
        }
        Error::combine(errors).map_or(Ok(()), Err)
    }
}
