mod not_a_literal {
    rdma_rpc_macros::spec!(kv_store);
}

mod empty {
    rdma_rpc_macros::spec!();
}

mod bad_options {
    rdma_rpc_macros::spec!("../specs/kv_store.yaml", sever = false, client = true, client = false);
}

fn main() {}
