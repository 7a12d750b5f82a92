//! A spec with problems: the errors are the spec's, one per problem; the code below, which
//! uses every generated item, adds none.
use rdma_rpc_core::Bytes;
use rdma_rpc_core::{Request, Status};

mod greeter {
    rdma_rpc_macros::spec!("tests/ui/specs/two_mistakes.yaml");
}
use greeter::{Greeter, GreeterClient, GreeterServer, HelloReply, HelloRequest};

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
