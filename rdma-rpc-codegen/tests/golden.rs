//! Golden files: the code generated for the example specs, committed under `tests/golden/`
//! and reviewed with `git diff`. Run with `RDMA_RPC_BLESS=1` to rewrite them after a change
//! to the generator.

use std::path::{Path, PathBuf};

use rdma_rpc_codegen::{generate, load_spec_named, Options, ServiceIr};

/// The example specs of the repository's `specs/`, then the specs of `tests/specs/`.
const SPECS: &[&str] = &[
    "doca_cpp_endpoints",
    "kv_store",
    "object_store",
    "storage_service",
    "storage_target",
    // Messages named `Status`, `ClientStats`, `Request`, `Bytes`, ...: the runtime's names.
    "shadowing",
];

/// The spec of `stem` and the name the generated header gives it.
fn spec(stem: &str) -> (PathBuf, String) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let test_spec = dir.join("tests/specs").join(format!("{stem}.yaml"));
    if test_spec.exists() {
        return (test_spec, format!("tests/specs/{stem}.yaml"));
    }
    let spec = dir.join("../specs").join(format!("{stem}.yaml"));
    (spec, format!("specs/{stem}.yaml"))
}

fn ir(stem: &str) -> ServiceIr {
    let (path, name) = spec(stem);
    load_spec_named(&path, &name).unwrap()
}

fn generated(stem: &str) -> String {
    generate(&ir(stem), &Options::default())
}

#[test]
fn generated_code_matches_golden_files() {
    let bless = std::env::var_os("RDMA_RPC_BLESS").is_some_and(|v| v == "1");
    let mut stale = Vec::new();
    for stem in SPECS {
        let code = generated(stem);
        let golden = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(format!("{stem}.rs"));
        let old = std::fs::read_to_string(&golden).unwrap_or_default();
        if old == code {
            continue;
        }
        if bless {
            std::fs::write(&golden, &code).unwrap();
        } else {
            stale.push(golden.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "generated code differs from {stale:?}; rerun with RDMA_RPC_BLESS=1 and review the diff"
    );
}

#[test]
fn generated_code_parses_and_uses_absolute_paths() {
    for stem in SPECS {
        let code = generated(stem);
        let file = syn::parse_file(&code).unwrap_or_else(|e| panic!("{stem}: {e}"));
        assert!(file.items.len() > 3, "{stem}");
        // `super::` only names the spec's own messages and table, one level up from the
        // server and client modules.
        let ir = ir(stem);
        let table = code
            .split("pub const ")
            .nth(1)
            .and_then(|rest| rest.split(':').next())
            .unwrap();
        for (i, _) in code.match_indices("super::") {
            let name: String = code[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                name == table
                    || ir.messages.iter().any(|m| m.name == name)
                    || ir.enums.iter().any(|e| e.name == name),
                "{stem}: `super::{name}` names no spec type"
            );
        }
        assert!(!code.contains("super::super::"), "{stem}");
        assert!(
            !code.contains("crate::"),
            "{stem} uses a crate-relative path"
        );
        // Every runtime path is absolute.
        for (i, _) in code.match_indices("rdma_rpc_core::") {
            assert_eq!(
                &code[i - 2..i],
                "::",
                "{stem}: relative runtime path at byte {i}"
            );
        }
    }
}
