rdma_rpc_macros::spec!("tests/ui/specs/invalid.yaml");

fn main() {}
