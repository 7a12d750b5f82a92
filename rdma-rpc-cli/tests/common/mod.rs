//! Runs the `rdma-rpc` binary from the workspace root.

// Each test crate uses a part of this module.
#![allow(dead_code)]

use std::io::Write as _;
use std::process::{Command, Stdio};

/// Exit code, standard output and standard error of `rdma-rpc ARGS`.
pub(crate) fn run(args: &[&str]) -> (i32, String, String) {
    run_with_stdin(args, "")
}

/// As [`run`], with `stdin` on standard input.
pub(crate) fn run_with_stdin(args: &[&str], stdin: &str) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rdma-rpc"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A command that does not read its input may have exited already: that is no error.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// Serves what `builder` holds on `addr`, on a thread and runtime of its own: the address it
/// bound, and what shuts it down (sent, or dropped).
pub(crate) fn serve(
    builder: rdma_rpc_core::ServerBuilder,
    addr: &'static str,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let server = builder.bind(addr).await.unwrap();
            tx.send(server.local_addr()).unwrap();
            server
                .serve_with_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
    });
    (rx.recv().unwrap(), stop)
}
