//! The `rdma-rpc-codegen` binary: exit codes and output of `check` and `generate`.

use std::process::Command;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rdma-rpc-codegen"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn check_valid_specs_exits_0_with_one_line_each() {
    let (code, stdout, stderr) = run(&[
        "check",
        "specs/doca_cpp_endpoints.yaml",
        "specs/kv_store.yaml",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout,
        "specs/doca_cpp_endpoints.yaml: ok: service DocaCppEndpoints (0.0.1 format), 4 endpoints, 0 messages, 0 enums\n\
         specs/kv_store.yaml: ok: service KvStore (rdma-rpc/1 format), 4 endpoints, 7 messages, 2 enums\n"
    );
}

#[test]
fn check_invalid_spec_exits_1_and_prints_every_diagnostic() {
    let path =
        std::env::temp_dir().join(format!("rdma-rpc-codegen-cli-{}.yaml", std::process::id()));
    std::fs::write(
        &path,
        "version: \"0.0.1\"\nendpoints:\n  - path: /a\n    type: sned\n    buffer: { size: 0 }\n",
    )
    .unwrap();
    let path_str = path.to_str().unwrap();
    let (code, stdout, stderr) = run(&["check", "specs/kv_store.yaml", path_str]);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(code, 1);
    assert!(stdout.starts_with("specs/kv_store.yaml: ok"), "{stdout}");
    assert!(
        stderr.contains(&format!(
            "error: unknown operation type `sned`\n  --> {path_str}:4:11\n"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "error: buffer size must be positive, found 0\n  --> {path_str}:5:21\n"
        )),
        "{stderr}"
    );
    assert!(
        stderr.ends_with(&format!("{path_str}: 2 errors found\n")),
        "{stderr}"
    );
}

#[test]
fn check_missing_file_exits_1() {
    let (code, _, stderr) = run(&["check", "specs/does-not-exist.yaml"]);
    assert_eq!(code, 1);
    assert!(
        stderr.starts_with("error: cannot read spec `specs/does-not-exist.yaml`: "),
        "{stderr}"
    );
}

#[test]
fn generate_prints_the_generated_code() {
    let (code, stdout, stderr) = run(&["generate", "specs/kv_store.yaml"]);
    assert_eq!(code, 0, "{stderr}");
    let golden = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/kv_store.rs"
    ))
    .unwrap();
    assert_eq!(stdout, golden);
    let (code, stdout, _) = run(&["generate", "--no-server", "specs/kv_store.yaml"]);
    assert_eq!(code, 0);
    assert!(!stdout.contains("KvStoreServer"));
    assert!(stdout.contains("KvStoreClient"));
}

#[test]
fn generate_invalid_spec_exits_1_with_diagnostics() {
    let path = std::env::temp_dir().join(format!(
        "rdma-rpc-codegen-cli-gen-{}.yaml",
        std::process::id()
    ));
    std::fs::write(
        &path,
        "version: \"0.0.1\"\nendpoints:\n  - path: /a\n    type: sned\n    buffer: { size: 64 }\n",
    )
    .unwrap();
    let path_str = path.to_str().unwrap();
    let (code, stdout, stderr) = run(&["generate", path_str]);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(code, 1);
    assert_eq!(stdout, "");
    assert!(
        stderr.contains(&format!(
            "error: unknown operation type `sned`\n  --> {path_str}:4:11\n"
        )),
        "{stderr}"
    );
    let (code, _, stderr) = run(&["generate", "specs/does-not-exist.yaml"]);
    assert_eq!(code, 1);
    assert!(stderr.starts_with("error: cannot read spec"), "{stderr}");
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(run(&[]).0, 2);
    assert_eq!(run(&["check"]).0, 2);
    assert_eq!(run(&["generate"]).0, 2);
    assert_eq!(run(&["generate", "a.yaml", "b.yaml"]).0, 2);
    assert_eq!(run(&["generate", "--server=no", "a.yaml"]).0, 2);
    assert_eq!(run(&["frobnicate"]).0, 2);
}
