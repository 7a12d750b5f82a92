//! Writes demo certificates for trying `tls://` on one machine: a throwaway CA, a server
//! certificate for `localhost`, 127.0.0.1 and ::1, a client certificate (`CN=demo-client`),
//! and a revocation list of the CA that revokes that client certificate
//! (`client-revoked.crl`, for the server's `--tls-client-crl`), made now, in PEM. For trying
//! only: use your own CA's elsewhere.
//!
//! `cargo run -p examples --bin tls-certs -- [--out DIR]` (default `tls-demo`), then:
//!
//! ```sh
//! cargo run --release -p examples --bin server -- tls://127.0.0.1:7470 \
//!     --tls-cert tls-demo/server.pem --tls-key tls-demo/server.key --tls-client-ca tls-demo/ca.pem
//! cargo run --release -p examples --bin client -- tls://127.0.0.1:7470 \
//!     --tls-ca tls-demo/ca.pem --tls-cert tls-demo/client.pem --tls-key tls-demo/client.key
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use examples::tls::DemoCerts;

/// Demo certificates for tls:// (a throwaway CA, a server and a client certificate).
#[derive(Debug, clap::Parser)]
#[command(name = "tls-certs")]
struct Args {
    /// The directory to write ca.pem, server.pem, server.key, client.pem, client.key and
    /// client-revoked.crl to.
    #[arg(long, value_name = "DIR", default_value = "tls-demo")]
    out: PathBuf,
}

fn main() -> ExitCode {
    let args = <Args as clap::Parser>::parse();
    let written = DemoCerts::generate()
        .map_err(|e| e.to_string())
        .and_then(|certs| certs.write_to(&args.out).map_err(|e| e.to_string()));
    match written {
        Ok(files) => {
            println!("demo certificates (for trying tls:// only):");
            for f in files {
                println!("  {}", f.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tls-certs: cannot write to {}: {e}", args.out.display());
            ExitCode::FAILURE
        }
    }
}
