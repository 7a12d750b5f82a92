//! `rdma-rpc`: the command line of rdma-rpc.
//!
//! ```text
//! rdma-rpc check <SPEC>...                      validate specs, print every problem
//! rdma-rpc generate [--no-server] [--no-client] [-o FILE] <SPEC>
//! rdma-rpc devices [--json]                     DOCA devices: PCI address, capabilities
//! rdma-rpc ping <ADDR> [-c N] [-i MS]           round trips to a server's runtime
//! rdma-rpc health <ADDR> [SERVICE] [--watch] [-H K=V]...   serving status (exit 1 unless SERVING)
//! rdma-rpc call <ADDR> --spec S METHOD [-d JSON] [-H K=V]...   one typed call, JSON out
//! rdma-rpc bench <ADDR> --path P --op OP ...    calls/s, MB/s and latency of one endpoint
//! rdma-rpc bench <ADDR> --spec S --method M [-d JSON] [-H K=V]...   the same, typed
//! ```
//!
//! The commands that connect take `--tls-ca FILE [--tls-cert FILE --tls-key FILE]
//! [--tls-server-name NAME] [--tls-crl FILE]` for a `tls://` server, or a `doca+oob://` one
//! whose side channel runs TLS.
//!
//! Exit codes: 0 success, 1 a spec is invalid or a command failed, 2 usage errors.

mod call;
mod devices;
mod dynamic;
mod health;
mod net;
mod request;
mod specs;
mod tls;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::request::RequestArgs;

/// rdma-rpc: RPC over RDMA from YAML endpoint specs.
#[derive(Debug, Parser)]
#[command(name = "rdma-rpc", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    tls: tls::TlsArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Validate specs and print every problem found (file:line:column and a hint).
    Check {
        /// Spec files (YAML, either format).
        #[arg(required = true)]
        specs: Vec<PathBuf>,
    },
    /// Print (or write) the Rust code generated from a spec.
    Generate {
        /// The spec file.
        spec: PathBuf,
        /// Leave out the server trait and adapter.
        #[arg(long)]
        no_server: bool,
        /// Leave out the client.
        #[arg(long)]
        no_client: bool,
        /// Write the code to this file instead of standard output.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// List the DOCA devices with their PCI address and RDMA capabilities.
    Devices {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Measure round trips to a running server's runtime (no handler runs).
    Ping {
        /// The server: tcp://HOST:PORT, doca://IP:PORT, doca+oob://IP:PORT.
        addr: String,
        /// Pings to send.
        #[arg(short, long, default_value_t = 5)]
        count: u32,
        /// Wait between pings, in milliseconds.
        #[arg(short, long, default_value_t = 200)]
        interval: u64,
    },
    /// Ask a server's health service for its serving status, or a service's: prints
    /// SERVING, NOT_SERVING or SERVICE_UNKNOWN and exits 0 only for SERVING.
    ///
    /// The server adds the service with `ServerBuilder::add_health`; its interceptors apply,
    /// so pass the metadata they ask for: `rdma-rpc health tcp://127.0.0.1:7470 Greeter
    /// -H authorization='Bearer 0123'`.
    Health {
        /// The server: tcp://HOST:PORT, doca://IP:PORT, doca+oob://IP:PORT.
        addr: String,
        /// The service (its name, as its spec's `service:`); without it, the server as a whole.
        #[arg(default_value = "")]
        service: String,
        /// Follow the status: a line per change, until the server shuts down or the
        /// connection ends (the exit code is the last status's).
        #[arg(long)]
        watch: bool,
        /// Metadata of the call, `key=value` (repeatable): `-H authorization='Bearer 0123'`.
        #[arg(short = 'H', long = "metadata", value_name = "KEY=VALUE", value_parser = request::parse_metadata)]
        metadata: Vec<(String, String)>,
        /// Deadline of a check, in milliseconds.
        #[arg(long, value_name = "MS", default_value_t = 5_000)]
        timeout: u64,
    },
    /// Make one typed call: the request given as JSON or YAML and encoded from the spec, the
    /// response printed as JSON.
    ///
    /// `rdma-rpc call tcp://127.0.0.1:7470 --spec specs/kv_store.yaml get_block
    /// -d '{"key": "YmxvY2s="}' -H authorization='Bearer 0123' --out block.bin`
    ///
    /// Field names as in the spec or lowerCamelCase; 64-bit integers as numbers or strings
    /// (printed as strings), enums by name, bytes as base64. Server streams print one JSON
    /// line per message; client and bidirectional streams are refused.
    Call {
        /// The server: tcp://HOST:PORT, doca://IP:PORT, doca+oob://IP:PORT.
        addr: String,
        /// The endpoint's method name, as in the spec (`get_block`).
        method: String,
        /// The spec that describes the endpoint and its messages.
        #[arg(long, value_name = "SPEC")]
        spec: PathBuf,
        #[command(flatten)]
        request: RequestArgs,
        /// The bytes a send or write endpoint moves besides its message.
        #[arg(long, value_name = "FILE")]
        data_file: Option<PathBuf>,
        /// Where a receive or read endpoint's bytes go (without it, their length is printed).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Deadline of the call, in milliseconds (default: the endpoint's).
        #[arg(long, value_name = "MS")]
        timeout: Option<u64>,
    },
    /// Call one endpoint of a running server many times and report calls/s, MB/s and latency.
    ///
    /// The example server serves endpoints to try it on:
    /// `cargo run --release -p examples --bin server -- tcp://127.0.0.1:7470`, then
    /// `rdma-rpc bench tcp://127.0.0.1:7470 --path /rdma/ep1 --op write --size 1MiB`.
    /// With `--spec`, the request (`-d`) is encoded from the spec as `call` encodes it.
    Bench {
        /// The server: tcp://HOST:PORT, doca://IP:PORT, doca+oob://IP:PORT.
        addr: String,
        /// The endpoint's path.
        #[arg(long, required_unless_present = "method")]
        path: Option<String>,
        /// The endpoint's operation.
        #[arg(long, value_enum, required_unless_present = "method")]
        op: Option<Op>,
        /// The spec that types the endpoint (its request, buffer, stream and timeout).
        #[arg(long, value_name = "SPEC")]
        spec: Option<PathBuf>,
        /// The endpoint's method name in the spec, instead of --path and --op.
        #[arg(long, requires = "spec", conflicts_with_all = ["path", "op"])]
        method: Option<String>,
        #[command(flatten)]
        request: RequestArgs,
        /// Bytes each send or write moves (64, 4KiB, 1MiB); ignored by receive and read, whose
        /// size the server decides.
        #[arg(long, default_value = "64", value_parser = parse_size)]
        size: u64,
        /// Calls in all.
        #[arg(long, default_value_t = 10_000)]
        calls: u64,
        /// Calls in flight per connection.
        #[arg(long, default_value_t = 8)]
        in_flight: u32,
        /// Connections.
        #[arg(long, default_value_t = 1)]
        connections: u32,
        /// Deadline of each call, in milliseconds.
        #[arg(long, default_value_t = 10_000)]
        timeout: u64,
    },
}

/// An endpoint's operation.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Op {
    Send,
    Receive,
    Write,
    Read,
}

impl From<Op> for rdma_rpc_core::OpKind {
    fn from(op: Op) -> Self {
        match op {
            Op::Send => rdma_rpc_core::OpKind::Send,
            Op::Receive => rdma_rpc_core::OpKind::Receive,
            Op::Write => rdma_rpc_core::OpKind::Write,
            Op::Read => rdma_rpc_core::OpKind::Read,
        }
    }
}

/// `64`, `512B`, `4KiB`, `1 MiB`, `1GiB`.
fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let at = t
        .find(|c: char| !c.is_ascii_digit() && c != '_')
        .unwrap_or(t.len());
    let (digits, unit) = t.split_at(at);
    let n: u64 = digits
        .replace('_', "")
        .parse()
        .map_err(|_| format!("`{text}` is not a size (64, 4KiB, 1MiB)"))?;
    let scale = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => return Err(format!("unknown unit `{other}` (B, KiB, MiB or GiB)")),
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("`{text}` is too large"))
}

/// What a failed command prints: `error: ...` with its causes.
pub(crate) fn fail(what: &str, err: &dyn std::error::Error) -> ExitCode {
    eprintln!("error: {what}: {}", causes(err));
    ExitCode::FAILURE
}

/// An error and its causes, `: `-separated.
pub(crate) fn causes(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        // Errors that print their cause already are not repeated.
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn main() -> ExitCode {
    // The version line names the wire protocol too: peers of different protocols refuse
    // each other.
    let version = format!(
        "{} (protocol {})",
        env!("CARGO_PKG_VERSION"),
        rdma_rpc_core::protocol::PROTOCOL_VERSION
    );
    let matches = Cli::command()
        .version(&*Box::leak(version.into_boxed_str()))
        .get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::Check { specs } => specs::check(&specs),
        Command::Generate {
            spec,
            no_server,
            no_client,
            output,
        } => specs::generate(&spec, !no_server, !no_client, output.as_deref()),
        Command::Devices { json } => devices::list(json),
        Command::Ping {
            addr,
            count,
            interval,
        } => runtime().block_on(net::ping(&addr, &cli.tls, count, interval)),
        Command::Health {
            addr,
            service,
            watch,
            metadata,
            timeout,
        } => {
            let metadata = match request::metadata(&metadata) {
                Ok(metadata) => metadata,
                Err(e) => return call::refuse(&e),
            };
            runtime().block_on(health::health(health::HealthArgs {
                addr,
                tls: cli.tls,
                service,
                watch,
                metadata,
                timeout: std::time::Duration::from_millis(timeout),
            }))
        }
        Command::Call {
            addr,
            method,
            spec,
            request,
            data_file,
            out,
            timeout,
        } => runtime().block_on(call::call(call::CallArgs {
            addr,
            tls: cli.tls,
            spec,
            method,
            request,
            data_file,
            out,
            timeout_ms: timeout,
        })),
        Command::Bench {
            addr,
            path,
            op,
            spec,
            method,
            request,
            size,
            calls,
            in_flight,
            connections,
            timeout,
        } => runtime().block_on(net::bench(net::BenchArgs {
            addr,
            tls: cli.tls,
            spec,
            method,
            path,
            op: op.map(Into::into),
            request,
            size,
            calls,
            in_flight,
            connections,
            timeout_ms: timeout,
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(parse_size("64"), Ok(64));
        assert_eq!(parse_size("512B"), Ok(512));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("1 MiB"), Ok(1 << 20));
        assert_eq!(parse_size("1_024"), Ok(1024));
        assert!(parse_size("4KB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999GiB")
            .unwrap_err()
            .contains("too large"));
    }
}
