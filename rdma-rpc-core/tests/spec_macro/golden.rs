//! The golden files of rdma-rpc-codegen, included as a build script's output would be (with
//! the user's spans, so every lint applies), compile without warnings.
#![deny(warnings, missing_docs)]
// A binary uses little of a generated API.
#![allow(dead_code)]

/// The block store.
pub mod kv {
    include!("../../../rdma-rpc-codegen/tests/golden/kv_store.rs");
}

/// The object store (every kind of stream).
pub mod objects {
    include!("../../../rdma-rpc-codegen/tests/golden/object_store.rs");
}

/// The doca-cpp endpoints.
pub mod doca {
    include!("../../../rdma-rpc-codegen/tests/golden/doca_cpp_endpoints.rs");
}

#[test]
fn golden_files_compile_without_warnings() {
    assert_eq!(
        kv::KV_STORE_ENDPOINTS.len(),
        doca::DOCA_CPP_ENDPOINTS_ENDPOINTS.len()
    );
    assert_eq!(objects::OBJECT_STORE_ENDPOINTS.len(), 6);
}
