//! `check` and `generate`: the code generator's work, from the command line; and the specs
//! that `call` and `bench` encode requests from.

use std::path::Path;
use std::process::ExitCode;

/// Validates every spec; prints one line per valid spec and every diagnostic of the others.
pub(crate) fn check(specs: &[impl AsRef<Path>]) -> ExitCode {
    let mut failed = false;
    for path in specs {
        let path = path.as_ref();
        let shown = path.display();
        match rdma_rpc_codegen::load_spec(path) {
            Ok(service) => {
                let (endpoints, messages, enums) = (
                    service.endpoints.len(),
                    service.messages.len(),
                    service.enums.len(),
                );
                println!(
                    "{shown}: ok: service {} ({} format), {endpoints} endpoint{}, {messages} \
                     message{}, {enums} enum{}",
                    service.name,
                    service.format.version(),
                    plural(endpoints),
                    plural(messages),
                    plural(enums),
                );
            }
            Err(err) => {
                failed = true;
                report(path, &err);
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Prints the code generated from `spec` (or writes it to `output`).
pub(crate) fn generate(spec: &Path, server: bool, client: bool, output: Option<&Path>) -> ExitCode {
    let mut options = rdma_rpc_codegen::Options::default();
    options.build_server = server;
    options.build_client = client;
    let Some(service) = load(spec) else {
        return ExitCode::FAILURE;
    };
    let code = rdma_rpc_codegen::generate(&service, &options);
    match output {
        None => {
            print!("{code}");
            ExitCode::SUCCESS
        }
        Some(file) => match std::fs::write(file, code) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => crate::fail(&format!("cannot write `{}`", file.display()), &e),
        },
    }
}

/// Loads a spec for a call; prints every problem and returns `None` if it is invalid.
pub(crate) fn load(spec: &Path) -> Option<rdma_rpc_codegen::ServiceIr> {
    match rdma_rpc_codegen::load_spec(spec) {
        Ok(service) => Some(service),
        Err(err) => {
            report(spec, &err);
            None
        }
    }
}

/// Prints an error of `load_spec`: every diagnostic, or the error with its cause.
fn report(path: &Path, err: &rdma_rpc_codegen::Error) {
    if let rdma_rpc_codegen::Error::Invalid { .. } = err {
        for diagnostic in err.diagnostics() {
            eprintln!("{diagnostic}\n");
        }
        let n = err.diagnostics().len();
        eprintln!("{}: {n} error{} found", path.display(), plural(n));
    } else {
        match std::error::Error::source(err) {
            Some(source) => eprintln!("error: {err}: {source}"),
            None => eprintln!("error: {err}"),
        }
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
