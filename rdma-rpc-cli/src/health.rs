//! `health`: the serving status of a server (or of one of its services) from its standard
//! health service (`rdma_rpc_core::health`), as `grpc_health_probe` asks a gRPC server.

use std::process::ExitCode;
use std::time::Duration;

use rdma_rpc_core::health::{HealthCheckRequest, HealthClient, ServingStatus};
use rdma_rpc_core::{Code, Metadata, Request, Status};

/// What `health` asks, and how.
pub(crate) struct HealthArgs {
    pub(crate) addr: String,
    pub(crate) tls: crate::tls::TlsArgs,
    /// The service's name; empty for the server as a whole.
    pub(crate) service: String,
    /// Follow the status instead of asking once.
    pub(crate) watch: bool,
    pub(crate) metadata: Metadata,
    /// Deadline of a check.
    pub(crate) timeout: Duration,
}

impl HealthArgs {
    fn request(&self) -> Request<HealthCheckRequest> {
        let mut request = Request::new(HealthCheckRequest::new(self.service.clone()));
        *request.metadata_mut() = self.metadata.clone();
        request
    }

    /// What the status is about, for messages.
    fn subject(&self) -> String {
        match self.service.as_str() {
            "" => self.addr.clone(),
            service => format!("{service} on {}", self.addr),
        }
    }
}

/// Prints the status (`SERVING`, `NOT_SERVING`, `SERVICE_UNKNOWN`); with `watch`, one line per
/// change until the server shuts down or the connection ends. Exits 0 when the (last) status
/// is `SERVING`, 1 otherwise or when the call fails.
pub(crate) async fn health(args: HealthArgs) -> ExitCode {
    let connector = match args.tls.connector(&args.addr) {
        Ok(connector) => connector,
        Err(code) => return code,
    };
    let client = match connector.builder().connect(&args.addr).await {
        Ok(client) => client,
        Err(e) => return crate::fail(&format!("cannot connect to {}", args.addr), &e),
    };
    let health = HealthClient::new(client.clone());
    let code = if args.watch {
        watch(&health, &args).await
    } else {
        match health
            .check(args.request().with_timeout(args.timeout))
            .await
        {
            Ok(response) => print(response.status()),
            Err(status) => failed(&args, &status),
        }
    };
    client.shutdown().await;
    code
}

/// Follows the status: each change on a line of its own. A watch the server ends at its
/// `max_call_duration` is made again; the stream's end (the server shuts down) or an error
/// ends the command.
async fn watch(health: &HealthClient, args: &HealthArgs) -> ExitCode {
    let mut last = None;
    loop {
        let mut stream = match health.watch(args.request()).await {
            Ok(stream) => stream,
            Err(status) => return failed(args, &status),
        };
        loop {
            match stream.message().await {
                Ok(Some(response)) => {
                    let status = response.status();
                    if last != Some(status) {
                        print(status);
                        last = Some(status);
                    }
                }
                Ok(None) => return exit_code(last.unwrap_or(ServingStatus::Unknown)),
                // The server's limit on a call's duration: watch again.
                Err(status) if status.code() == Code::DeadlineExceeded => break,
                Err(status) => return failed(args, &status),
            }
        }
    }
}

fn print(status: ServingStatus) -> ExitCode {
    println!("{status}");
    exit_code(status)
}

fn exit_code(status: ServingStatus) -> ExitCode {
    if status == ServingStatus::Serving {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn failed(args: &HealthArgs, status: &Status) -> ExitCode {
    let hint = if status.code() == Code::Unimplemented {
        " (does the server add the health service? ServerBuilder::add_health)"
    } else {
        ""
    };
    eprintln!(
        "error: health of {}: {}{hint}",
        args.subject(),
        crate::causes(status)
    );
    ExitCode::FAILURE
}
