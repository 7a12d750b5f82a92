//! `call`: one typed call from the shell, as grpcurl makes them for gRPC. The request is
//! encoded from the spec, the response decoded with it and printed as JSON.
//!
//! Unary endpoints, bulk streams (their whole payload in one buffer here) and server streams
//! (each message one JSON line, as it arrives) are called; client and bidirectional streams
//! are refused: a call from the shell sends one request.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use rdma_rpc_codegen::{EndpointIr, ServiceIr};
use rdma_rpc_core::{Bytes, CallOptions};
use serde_json::Value;

use crate::dynamic;
use crate::request::{self, RequestArgs, RequestError};

/// What `call` calls, and with what.
#[derive(Debug)]
pub(crate) struct CallArgs {
    pub(crate) addr: String,
    pub(crate) tls: crate::tls::TlsArgs,
    pub(crate) spec: PathBuf,
    pub(crate) method: String,
    pub(crate) request: RequestArgs,
    pub(crate) data_file: Option<PathBuf>,
    pub(crate) out: Option<PathBuf>,
    pub(crate) timeout_ms: Option<u64>,
}

/// Makes the call and prints its response; exit code 0 if the server answered OK, 1 if not
/// (its status on standard error), 2 if the call cannot be made as asked.
pub(crate) async fn call(args: CallArgs) -> ExitCode {
    let Some(service) = crate::specs::load(&args.spec) else {
        return ExitCode::FAILURE;
    };
    let prepared = match prepare(&service, &args) {
        Ok(prepared) => prepared,
        Err(e) => return refuse(&e),
    };
    let ep = prepared.ep;
    let connector = match args.tls.connector(&args.addr) {
        Ok(connector) => connector,
        Err(code) => return code,
    };
    let client = match connector.builder().connect(&args.addr).await {
        Ok(client) => client,
        Err(e) => return crate::fail(&format!("cannot connect to {}", args.addr), &e),
    };
    let what = format!("{} ({} {}) on {}", ep.method, ep.op, ep.path, args.addr);
    let def = request::endpoint_def(ep);
    let response = request::message_name(ep.response.as_ref());
    if ep.stream.streams_responses() {
        let mut stream = match client
            .call_raw_server_stream(def, prepared.message, None, prepared.options)
            .await
        {
            Ok(stream) => stream,
            Err(status) => return crate::fail(&what, &status),
        };
        loop {
            match stream.message().await {
                Ok(Some(message)) => match show(&service, response, &message) {
                    Ok(json) => println!("{json}"),
                    Err(e) => return crate::fail(&format!("{what}: a streamed message"), &e),
                },
                Ok(None) => {
                    client.shutdown().await;
                    return ExitCode::SUCCESS;
                }
                Err(status) => return crate::fail(&what, &status),
            }
        }
    }
    let data = ep
        .op
        .is_inbound()
        .then(|| prepared.data.unwrap_or_default());
    let (message, data) = match client
        .call_raw(def, prepared.message, data, prepared.options)
        .await
    {
        Ok(answer) => answer,
        Err(status) => return crate::fail(&what, &status),
    };
    match show(&service, response, &message) {
        Ok(json) => println!("{json:#}"),
        Err(e) => return crate::fail(&format!("{what}: the response"), &e),
    }
    if ep.payload && !ep.op.is_inbound() {
        match &args.out {
            Some(path) => {
                if let Err(e) = std::fs::write(path, &data) {
                    return crate::fail(&format!("cannot write `{}`", path.display()), &e);
                }
                eprintln!("{} bytes of data written to {}", data.len(), path.display());
            }
            None => eprintln!("{} bytes of data (--out FILE saves them)", data.len()),
        }
    }
    // Goodbye to the server before the runtime stops: a client that left, not a lost one.
    client.shutdown().await;
    ExitCode::SUCCESS
}

/// A call checked against its endpoint, before anything is sent.
struct Prepared<'s> {
    ep: &'s EndpointIr,
    message: Bytes,
    data: Option<Bytes>,
    options: CallOptions,
}

fn prepare<'s>(service: &'s ServiceIr, args: &CallArgs) -> Result<Prepared<'s>, RequestError> {
    let ep = request::by_method(service, &args.method)?;
    let unsupported = |what: &str| {
        Err(RequestError::Unsupported {
            method: ep.method.clone(),
            what: what.into(),
        })
    };
    if ep.stream.streams_requests() {
        return unsupported(
            "the client streams its requests, and `rdma-rpc call` sends one request message \
             (it calls unary endpoints, bulk streams and server streams)",
        );
    }
    let inbound = ep.op.is_inbound();
    if args.data_file.is_some() && !(inbound && ep.payload) {
        return unsupported(&format!(
            "--data-file is for send and write endpoints with a payload; this is a {} \
             endpoint{}",
            ep.op,
            if ep.payload { "" } else { " without one" }
        ));
    }
    if args.out.is_some() && (inbound || !ep.payload) {
        return unsupported(&format!(
            "--out is for receive and read endpoints with a payload; this is a {} endpoint{}",
            ep.op,
            if ep.payload { "" } else { " without one" }
        ));
    }
    let message = request::message(service, ep, args.request.request.as_deref())?;
    let mut options = CallOptions::new().metadata(request::metadata(&args.request.metadata)?);
    if let Some(ms) = args.timeout_ms {
        options = options.timeout(Duration::from_millis(ms));
    }
    let data = args
        .data_file
        .as_ref()
        .map(request::read_file)
        .transpose()?;
    Ok(Prepared {
        ep,
        message,
        data,
        options,
    })
}

/// A response message as JSON; an untyped endpoint's prints as `{}` (the generated client
/// ignores its bytes too).
fn show(
    service: &ServiceIr,
    ty: Option<&str>,
    message: &[u8],
) -> Result<Value, dynamic::CodecError> {
    match ty {
        Some(name) => dynamic::decode(service, name, message),
        None => Ok(Value::Object(Default::default())),
    }
}

/// Prints why a call cannot be made; its exit code.
pub(crate) fn refuse(e: &RequestError) -> ExitCode {
    eprintln!("error: {}", crate::causes(e));
    e.exit_code()
}
