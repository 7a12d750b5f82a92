//! Golden files: the code generated for the example specs, committed under `tests/golden/`
//! and reviewed with `git diff`. Run with `RDMA_RPC_BLESS=1` to rewrite them after a change
//! to the generator.

use std::path::Path;

use rdma_rpc_codegen::{generate, load_spec_named, Options};

const SPECS: &[&str] = &[
    "doca_cpp_endpoints",
    "kv_store",
    "object_store",
    "storage_service",
    "storage_target",
];

fn generated(stem: &str) -> String {
    let spec = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../specs")
        .join(format!("{stem}.yaml"));
    let ir = load_spec_named(&spec, &format!("specs/{stem}.yaml")).unwrap();
    generate(&ir, &Options::default())
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
        assert!(!code.contains("super::"), "{stem} uses a relative path");
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
