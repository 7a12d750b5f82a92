//! Generates the gRPC baseline service of the benchmark with tonic-build's manual builder
//! (no protoc needed: the messages are prost structs in `src/bench/grpc.rs`).

fn main() {
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
}
