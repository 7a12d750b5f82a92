//! Compile tests of `spec!` (trybuild): bad specs and arguments give readable errors
//! (`tests/ui/fail/*.stderr`; update them with `TRYBUILD=overwrite`). That generated code
//! compiles warning-free is `rdma-rpc-core/tests/spec_macro`, built with the other tests:
//! without cases that must pass, trybuild only checks (`cargo check`), never builds.
//!
//! trybuild compiles the test files in its own project under the target directory, and that
//! project is the `CARGO_MANIFEST_DIR` the macro resolves paths against. So the specs are
//! first copied there, to the same relative places they have from this crate:
//! `../specs/*.yaml` and `tests/ui/specs/*.yaml`.

use std::path::{Path, PathBuf};
use std::process::Command;

#[test]
fn ui() {
    let project = trybuild_project_dir();
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    copy_yaml(&crate_dir.join("../specs"), &project.join("../specs"));
    copy_yaml(
        &crate_dir.join("tests/ui/specs"),
        &project.join("tests/ui/specs"),
    );
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
}

/// `<target dir>/tests/trybuild/rdma-rpc-macros`, where trybuild builds the tests.
fn trybuild_project_dir() -> PathBuf {
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version=1", "--no-deps", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(output.status.success(), "cargo metadata failed");
    let json = String::from_utf8(output.stdout).expect("cargo metadata output is UTF-8");
    let key = "\"target_directory\":\"";
    let start = json.find(key).expect("target_directory in cargo metadata") + key.len();
    let end = start + json[start..].find('"').expect("end of target_directory");
    PathBuf::from(json[start..end].replace("\\\\", "\\"))
        .join("tests/trybuild")
        .join(env!("CARGO_PKG_NAME"))
}

fn copy_yaml(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
        }
    }
}
