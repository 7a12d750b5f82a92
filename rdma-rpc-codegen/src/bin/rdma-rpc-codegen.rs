//! `rdma-rpc-codegen`: checks rdma-rpc specs and generates Rust code from them.
//!
//! ```text
//! rdma-rpc-codegen check <spec>...                   validate specs, print every problem
//! rdma-rpc-codegen generate [--no-server] [--no-client] <spec>
//!                                                    print the generated Rust code
//! ```
//!
//! Exit codes: 0 success, 1 a spec is invalid or unreadable, 2 usage errors.

use std::process::ExitCode;

const USAGE: &str = "\
usage: rdma-rpc-codegen <command> [args]

commands:
  check <spec>...    validate specs and print every problem found
  generate [--no-server] [--no-client] <spec>
                     print the Rust code generated from a spec
  help               print this help";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("check") => check(&args[1..]),
        Some("generate") => generate(&args[1..]),
        Some("help" | "--help" | "-h") => {
            println!("{USAGE}");
            ExitCode::SUCCESS
        }
        Some(other) => {
            eprintln!("error: unknown command `{other}`\n\n{USAGE}");
            ExitCode::from(2)
        }
        None => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn check(specs: &[String]) -> ExitCode {
    if specs.is_empty() {
        eprintln!("error: `check` needs at least one spec file\n\n{USAGE}");
        return ExitCode::from(2);
    }
    let mut failed = false;
    for path in specs {
        match rdma_rpc_codegen::load_spec(path) {
            Ok(service) => {
                let (messages, enums) = (service.messages.len(), service.enums.len());
                println!(
                    "{path}: ok: service {} ({} format), {} endpoint{}, {messages} message{}, {enums} enum{}",
                    service.name,
                    service.format.version(),
                    service.endpoints.len(),
                    plural(service.endpoints.len()),
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

fn generate(args: &[String]) -> ExitCode {
    let mut options = rdma_rpc_codegen::Options::default();
    let mut spec = None;
    for arg in args {
        match arg.as_str() {
            "--no-server" => options.build_server = false,
            "--no-client" => options.build_client = false,
            flag if flag.starts_with("--") => {
                eprintln!("error: unknown option `{flag}`\n\n{USAGE}");
                return ExitCode::from(2);
            }
            path if spec.is_none() => spec = Some(path),
            _ => {
                eprintln!("error: `generate` takes one spec file\n\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(path) = spec else {
        eprintln!("error: `generate` needs a spec file\n\n{USAGE}");
        return ExitCode::from(2);
    };
    match rdma_rpc_codegen::load_spec(path) {
        Ok(service) => {
            print!("{}", rdma_rpc_codegen::generate(&service, &options));
            ExitCode::SUCCESS
        }
        Err(err) => {
            report(path, &err);
            ExitCode::FAILURE
        }
    }
}

/// Prints an error of `load_spec`: every diagnostic, or the error with its cause.
fn report(path: &str, err: &rdma_rpc_codegen::Error) {
    if let rdma_rpc_codegen::Error::Invalid { .. } = err {
        for diagnostic in err.diagnostics() {
            eprintln!("{diagnostic}\n");
        }
        let n = err.diagnostics().len();
        eprintln!("{path}: {n} error{} found", plural(n));
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
