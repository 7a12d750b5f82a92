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
