rdma_rpc_macros::spec!("tests/ui/specs/does_not_exist.yaml");

fn main() {}
