//! `rdma-rpc-codegen`: checks rdma-rpc specs (and, later, generates code from them).
//!
//! ```text
//! rdma-rpc-codegen check <spec>...     validate specs, print every problem
//! rdma-rpc-codegen generate <spec>     (not implemented yet)
//! ```
//!
//! Exit codes: 0 success, 1 a spec is invalid or unreadable, 2 usage errors and commands
//! that are not implemented yet.

use std::process::ExitCode;

const USAGE: &str = "\
usage: rdma-rpc-codegen <command> [args]

commands:
  check <spec>...    validate specs and print every problem found
  generate <spec>    generate Rust code from a spec (not implemented yet)
  help               print this help";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("check") => check(&args[1..]),
        Some("generate") => {
            eprintln!("error: `generate` is not implemented yet; use `check` to validate specs");
            ExitCode::from(2)
        }
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
            Err(err @ rdma_rpc_codegen::Error::Invalid { .. }) => {
                failed = true;
                for diagnostic in err.diagnostics() {
                    eprintln!("{diagnostic}\n");
                }
                let n = err.diagnostics().len();
                eprintln!("{path}: {n} error{} found", plural(n));
            }
            Err(err) => {
                failed = true;
                match std::error::Error::source(&err) {
                    Some(source) => eprintln!("error: {err}: {source}"),
                    None => eprintln!("error: {err}"),
                }
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
