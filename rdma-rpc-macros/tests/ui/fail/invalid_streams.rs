rdma_rpc_macros::spec!("tests/ui/specs/bad_streams.yaml");

fn main() {}
