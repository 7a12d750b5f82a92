//! As `invalid_spec_items_still_generated`, with the items generated at the crate root and
//! used by their names: still only the spec's errors.
use rdma_rpc_core::codegen::Bytes;
use rdma_rpc_core::{Request, Status};

rdma_rpc_macros::spec!("tests/ui/specs/two_mistakes.yaml");

struct MyGreeter;

impl Greeter for MyGreeter {
    async fn say_hello(&self, request: Request<HelloRequest>) -> Result<HelloReply, Status> {
        Ok(HelloReply { message: format!("hello, {}!", request.into_inner().name) })
    }

    async fn upload_photo(&self, _: Request<HelloRequest>, photo: Bytes) -> Result<(), Status> {
        let _ = photo.len();
        Ok(())
    }
}

async fn call(client: GreeterClient) -> Result<String, Status> {
    let reply = client.say_hello(HelloRequest { name: "world".into() }).await?;
    Ok(reply.message)
}

fn main() {
    let _ = GreeterServer::new(MyGreeter);
    let _ = call;
}
