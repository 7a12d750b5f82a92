//! Generates the examples' services from `specs/` with rdma-rpc-codegen, and the gRPC
//! baseline of the benchmark with tonic-build's manual builder (no protoc needed: its
//! messages are prost structs in `src/bench/grpc.rs`).

use std::path::PathBuf;

fn main() -> Result<(), rdma_rpc_codegen::Error> {
    // Read when the script runs, not baked in when it is compiled: a build script binary that
    // cargo reuses from another checkout would otherwise look for that checkout's specs.
    let manifest_dir =
        std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(PathBuf::new, PathBuf::from);
    let specs = manifest_dir.join("../specs");
    rdma_rpc_codegen::configure().compile(&[
        specs.join("doca_cpp_endpoints.yaml"),
        specs.join("kv_store.yaml"),
        specs.join("object_store.yaml"),
        specs.join("bench.yaml"),
        specs.join("storage_service.yaml"),
        specs.join("storage_target.yaml"),
    ])?;

    let method = |name: &str, route: &str, input: &str, output: &str| {
        tonic_build::manual::Method::builder()
            .name(name)
            .route_name(route)
            .input_type(input)
            .output_type(output)
            .codec_path("tonic_prost::ProstCodec")
            .build()
    };
    let blob = tonic_build::manual::Service::builder()
        .name("Blob")
        .package("bench")
        .comment("Unary upload and download of opaque bytes: the gRPC baseline.")
        .method(method(
            "upload",
            "Upload",
            "crate::bench::grpc::Payload",
            "crate::bench::grpc::Size",
        ))
        .method(method(
            "download",
            "Download",
            "crate::bench::grpc::Size",
            "crate::bench::grpc::Payload",
        ))
        .build();
    tonic_build::manual::Builder::new().compile(&[blob]);
    println!("cargo:rerun-if-changed=build.rs");
    Ok(())
}
