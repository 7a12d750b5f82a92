//! Streams of the wrong messages: a handler whose stream yields another message than the
//! spec's, and a client that streams another message than the endpoint takes.
use std::pin::Pin;
use std::task::{Context, Poll};

use rdma_rpc_core::Stream;
use rdma_rpc_core::{Request, Status, Streaming};

mod listing {
    rdma_rpc_macros::spec!("tests/ui/specs/listing.yaml");
}
use listing::{Entry, Line, Listing, ListingClient, Prefix};

struct Iter<I>(I);

impl<I: Iterator + Unpin> Stream for Iter<I> {
    type Item = I::Item;

    fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<I::Item>> {
        Poll::Ready(self.0.next())
    }
}

struct Lister;

impl Listing for Lister {
    // Yields lines, not entries.
    type ListStream = Iter<std::vec::IntoIter<Result<Line, Status>>>;

    async fn list(&self, _: Request<Prefix>) -> Result<Self::ListStream, Status> {
        Ok(Iter(Vec::new().into_iter()))
    }

    async fn log(&self, _: Request<Streaming<Line>>) -> Result<(), Status> {
        Ok(())
    }
}

async fn log(client: &ListingClient) -> Result<(), Status> {
    // `log` takes a stream of `Line`, not of `Entry`.
    client.log(Iter(vec![Entry::default()].into_iter())).await
}

fn main() {
    let _ = log;
}
