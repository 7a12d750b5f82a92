//! Reads and checks the spec: the path is resolved against `CARGO_MANIFEST_DIR`, and every
//! diagnostic becomes a compile error spanned on the path literal.

use std::path::PathBuf;

use rdma_rpc_codegen::{Diagnostic, Error, ServiceIr};

use crate::parse::SpecArgs;

/// A spec that failed validation: every problem as a compile error, and the items its sound
/// parts generate, so that code using the service fails only where it touches a broken part.
pub(crate) struct Invalid {
    pub(crate) errors: syn::Error,
    /// The sound parts, with the file, when the spec could be read as YAML.
    pub(crate) partial: Option<Box<Spec>>,
}

/// A spec that passed validation, with the file it came from.
pub(crate) struct Spec {
    /// The validated service.
    pub(crate) ir: ServiceIr,
    /// The absolute path of the spec file, for `include_str!`.
    pub(crate) file: PathBuf,
}

pub(crate) fn load(args: &SpecArgs) -> Result<Spec, Invalid> {
    let span = args.path.span();
    let relative = args.path.value();
    let alone = |errors| Invalid {
        errors,
        partial: None,
    };
    let Some(manifest_dir) = std::env::var_os("CARGO_MANIFEST_DIR") else {
        return Err(alone(syn::Error::new(
            span,
            "`CARGO_MANIFEST_DIR` is not set: `spec!` resolves its path against it, so it only \
             works in a crate built by Cargo",
        )));
    };
    let file = PathBuf::from(manifest_dir).join(&relative);
    match rdma_rpc_codegen::load_spec_named(&file, &relative) {
        Ok(ir) => Ok(Spec { ir, file }),
        Err(Error::Io { source, .. }) => Err(alone(syn::Error::new(
            span,
            format!("cannot read spec `{relative}` (paths are relative to `CARGO_MANIFEST_DIR`): {source}"),
        ))),
        Err(err) => {
            let mut errors = err
                .diagnostics()
                .iter()
                .map(|d| syn::Error::new(span, message(d)));
            let Some(mut all) = errors.next() else {
                return Err(alone(syn::Error::new(span, err.to_string())));
            };
            errors.for_each(|e| all.combine(e));
            // The file was read once already; a second read that fails only loses the stubs.
            let partial = std::fs::read_to_string(&file)
                .ok()
                .and_then(|text| rdma_rpc_codegen::parse_spec_partial(&relative, &text))
                .map(|ir| Box::new(Spec { ir, file }));
            Err(Invalid {
                errors: all,
                partial,
            })
        }
    }
}

/// `specs/x.yaml:4:11: unknown operation type ...` with the key and hint on their own lines.
fn message(d: &Diagnostic) -> String {
    let mut text = format!("{}:{}:{}: {}", d.file, d.line, d.column, d.message);
    if !d.key.is_empty() {
        text.push_str(&format!("\n  = key: {}", d.key));
    }
    if let Some(hint) = &d.hint {
        text.push_str(&format!("\n  = help: {hint}"));
    }
    text
}
