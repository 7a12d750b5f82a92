//! Remote buffers end to end: a client offers leases of its memory region, handlers read,
//! write and update them; a handler lends server memory the client reads; and every misuse
//! (range, rights, another connection, after revocation, a forged length) fails with a status
//! and touches nothing.

use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::{pattern, tcp_backend, Backend};
use crate::codegen::{decode_request, encode_message, mismatched_call};
use crate::memory::{Access, MemoryRegion, RegisteredBuf};
use crate::remote::{Offer, RemoteBuf};
use crate::service::{EndpointDef, OpKind, Request, ServerCall, Service};
use crate::status::{Code, Status};
use crate::transport::BoxFuture;
use crate::{Client, Server};

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RemoteRequest {
    #[prost(message, optional, tag = "1")]
    pub(crate) buf: Option<RemoteBuf>,
    #[prost(uint64, tag = "2")]
    pub(crate) offset: u64,
    #[prost(uint64, tag = "3")]
    pub(crate) len: u64,
    #[prost(uint32, tag = "4")]
    pub(crate) seed: u32,
    /// The handler waits at the service's gate first ([`Remote::gated_by`]).
    #[prost(bool, tag = "5")]
    pub(crate) gated: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct RemoteResponse {
    /// `pull`: the bytes read matched the pattern.
    #[prost(bool, tag = "1")]
    pub(crate) exact: bool,
    /// `count`: what fetch-and-add and compare-and-swap returned.
    #[prost(uint64, tag = "2")]
    pub(crate) added_to: u64,
    #[prost(uint64, tag = "3")]
    pub(crate) swapped: u64,
    /// `lend`: server memory holding the pattern, offered for reading.
    #[prost(message, optional, tag = "4")]
    pub(crate) lent: Option<RemoteBuf>,
}

const fn send(path: &'static str, method: &'static str) -> EndpointDef {
    EndpointDef {
        path,
        op: OpKind::Send,
        buffer_size: 256,
        method,
        timeout_ms: None,
        stream: crate::service::StreamKind::Unary,
    }
}

pub(crate) static ENDPOINTS: &[EndpointDef] = &[
    send("/remote/pull", "pull"),
    send("/remote/push", "push"),
    send("/remote/count", "count"),
    send("/remote/lend", "lend"),
    send("/remote/reclaim", "reclaim"),
    send("/remote/push_posted", "push_posted"),
];
pub(crate) const PULL: usize = 0;
pub(crate) const PUSH: usize = 1;
pub(crate) const COUNT: usize = 2;
pub(crate) const LEND: usize = 3;
pub(crate) const RECLAIM: usize = 4;
/// As `PUSH`, with the write posted ahead of the response
/// ([`write_posted`](crate::RemoteMemory::write_posted)).
pub(crate) const PUSH_POSTED: usize = 5;

/// Uses the remote buffers of its requests; lends leases of its own region. Its memory is one
/// region registered once (64 slots of 256 KiB, taken in turn), as a real service's would be:
/// no call registers memory.
pub(crate) struct Remote {
    lent: Mutex<Vec<Offer>>,
    region: MemoryRegion,
    next: std::sync::atomic::AtomicUsize,
    /// Where gated requests wait (open unless shared with a test service), and the count of
    /// runs that reached it.
    gate: Arc<tokio::sync::watch::Sender<bool>>,
    entered: Arc<tokio::sync::watch::Sender<usize>>,
}

impl Default for Remote {
    fn default() -> Remote {
        Remote {
            lent: Mutex::new(Vec::new()),
            region: MemoryRegion::new(16 << 20).expect("16 MiB"),
            next: std::sync::atomic::AtomicUsize::new(0),
            gate: Arc::new(tokio::sync::watch::channel(true).0),
            entered: Arc::new(tokio::sync::watch::channel(0).0),
        }
    }
}

impl Remote {
    /// A service whose gated requests wait at `service`'s gate and count in its runs.
    #[cfg_attr(not(feature = "doca"), allow(dead_code))] // the registration tests
    pub(crate) fn gated_by(service: &super::TestService) -> Remote {
        let (gate, entered) = service.gate_parts();
        Remote {
            gate,
            entered,
            ..Remote::default()
        }
    }

    /// The memory the service reads into and lends from.
    pub(crate) fn region(&self) -> &MemoryRegion {
        &self.region
    }

    /// `len` bytes (at most 256 KiB) of the service's region.
    fn lease(&self, len: u64) -> Result<RegisteredBuf, Status> {
        let slot = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 64;
        self.region
            .lease(slot << 18, len.min(1 << 18) as usize)
            .map_err(Status::from)
    }

    async fn run(
        &self,
        index: usize,
        request: Request<RemoteRequest>,
    ) -> Result<RemoteResponse, Status> {
        let memory = request.remote_memory().expect("server side").clone();
        let req = request.into_inner();
        if req.gated {
            self.entered.send_modify(|runs| *runs += 1);
            let _ = self.gate.subscribe().wait_for(|open| *open).await;
        }
        let buf = || {
            req.buf
                .clone()
                .ok_or_else(|| Status::invalid_argument("no buffer"))
        };
        let mut out = RemoteResponse::default();
        match index {
            PULL => {
                let dst = self.lease(req.len)?;
                let got = memory.read(&buf()?, req.offset, dst).await?;
                out.exact = got.as_slice() == &pattern(req.len as usize, req.seed)[..];
            }
            PUSH => {
                let data = Bytes::from(pattern(req.len as usize, req.seed));
                memory.write(&buf()?, req.offset, data).await?;
            }
            PUSH_POSTED => {
                let data = Bytes::from(pattern(req.len as usize, req.seed));
                memory.write_posted(&buf()?, req.offset, data).await?;
            }
            COUNT => {
                out.added_to = memory.fetch_and_add(&buf()?, req.offset, req.len).await?;
                let now = out.added_to + req.len;
                out.swapped = memory.compare_and_swap(&buf()?, req.offset, now, 7).await?;
            }
            LEND => {
                let mut lease = self.lease(req.len)?;
                lease
                    .as_mut_slice()
                    .copy_from_slice(&pattern(req.len as usize, req.seed));
                let offer = memory.offer(lease, Access::REMOTE_READ)?;
                out.lent = Some(offer.handle());
                self.lent.lock().unwrap().push(offer);
            }
            _ => {
                let offers = std::mem::take(&mut *self.lent.lock().unwrap());
                for offer in offers {
                    offer
                        .revoke()
                        .await
                        .ok_or_else(|| Status::internal("buffer lost"))?;
                }
            }
        }
        Ok(out)
    }
}

impl Service for Remote {
    fn name(&self) -> &'static str {
        "Remote"
    }

    fn endpoints(&self) -> &'static [EndpointDef] {
        ENDPOINTS
    }

    fn call<'a>(
        &'a self,
        index: usize,
        call: ServerCall<'a>,
    ) -> BoxFuture<'a, Result<Bytes, Status>> {
        match call {
            ServerCall::Inbound { request, .. } => Box::pin(async move {
                let request = decode_request::<RemoteRequest>(request)?;
                Ok(encode_message(&self.run(index, request).await?))
            }),
            call => mismatched_call("Remote", index, call),
        }
    }
}

async fn serve(b: &Backend) -> String {
    let server = Server::builder()
        .transport(b.transport.clone())
        .add_service(Remote::default())
        .bind(&b.bind)
        .await
        .expect("bind");
    let addr = server.local_addr();
    tokio::spawn(server.serve());
    addr
}

async fn connect(b: &Backend, addr: &str) -> Client {
    Client::builder()
        .transport(b.transport.clone())
        .connect(addr)
        .await
        .expect("connect")
}

pub(crate) async fn call(
    client: &Client,
    index: usize,
    req: RemoteRequest,
) -> Result<RemoteResponse, Status> {
    let metadata = encode_message(&req);
    let (response, _) = client
        .call_raw(&ENDPOINTS[index], metadata, Some(Bytes::new()), None)
        .await?;
    Ok(prost::Message::decode(response).expect("a response message"))
}

/// The handle of `len` bytes of the pattern `seed` that a `LEND` handler offers.
pub(crate) async fn lent_by_the_handler(client: &Client, len: u64, seed: u32) -> RemoteBuf {
    let request = RemoteRequest {
        len,
        seed,
        ..Default::default()
    };
    call(client, LEND, request)
        .await
        .unwrap()
        .lent
        .expect("a handle")
}

pub(crate) fn req(buf: &RemoteBuf, offset: u64, len: u64, seed: u32) -> RemoteRequest {
    RemoteRequest {
        buf: Some(buf.clone()),
        offset,
        len,
        seed,
        gated: false,
    }
}

pub(crate) async fn remote_buffers_are_read_written_and_updated_in_place_on(b: &Backend) {
    let addr = serve(b).await;
    let client = connect(b, &addr).await;
    let memory = client.remote_memory();
    let region = MemoryRegion::new(1 << 20).unwrap();

    // The server reads a block straight from the client's region, at an offset.
    let mut block = region.lease(4096, 64 << 10).unwrap();
    block.as_mut_slice()[100..100 + 5000].copy_from_slice(&pattern(5000, 1));
    let (pulled, back) = memory
        .lend(block, Access::REMOTE_READ, |handle| {
            let client = client.clone();
            async move { call(&client, PULL, req(&handle, 100, 5000, 1)).await }
        })
        .await
        .unwrap();
    assert!(pulled.unwrap().exact, "the handler read the client's bytes");
    assert!(back.is_some(), "lent for the call, then back");
    drop(back);

    // The server writes into it.
    let offer = memory
        .offer(region.lease(0, 4096).unwrap(), Access::REMOTE_WRITE)
        .unwrap();
    call(&client, PUSH, req(&offer.handle(), 96, 3000, 2))
        .await
        .unwrap();
    let back = offer.revoke().await.expect("the buffer comes back");
    assert_eq!(&back.as_slice()[96..3096], &pattern(3000, 2)[..]);
    assert!(
        back.as_slice()[..96].iter().all(|&x| x == 0),
        "nothing before"
    );
    assert!(
        back.as_slice()[3096..].iter().all(|&x| x == 0),
        "nothing after"
    );
    drop(back);

    // Atomics.
    let mut counter = region.lease(8192, 64).unwrap();
    counter.as_mut_slice()[8..16].copy_from_slice(&40u64.to_ne_bytes());
    let offer = memory.offer(counter, Access::REMOTE_ATOMIC).unwrap();
    let counted = call(&client, COUNT, req(&offer.handle(), 8, 2, 0))
        .await
        .unwrap();
    assert_eq!((counted.added_to, counted.swapped), (40, 42));
    let counter = offer.revoke().await.unwrap();
    assert_eq!(&counter.as_slice()[8..16], &7u64.to_ne_bytes());
    drop(counter);

    // The other way: the server lends its memory, the client reads it, the server revokes.
    let lent = lent_by_the_handler(&client, 10_000, 3).await;
    let got = memory
        .read(&lent, 0, region.lease(65536, 10_000).unwrap())
        .await
        .unwrap();
    assert_eq!(got.as_slice(), &pattern(10_000, 3)[..]);
    drop(got);
    call(&client, RECLAIM, RemoteRequest::default())
        .await
        .unwrap();
    let late = memory
        .read(
            &lent,
            0,
            RegisteredBuf::new(8, Access::LOCAL_WRITE).unwrap(),
        )
        .await;
    assert_eq!(
        late.unwrap_err().code(),
        Code::FailedPrecondition,
        "revoked by the server"
    );
    assert_eq!(region.leased(), 0, "every lease came back");
}

pub(crate) async fn remote_buffer_misuse_gets_statuses_and_touches_nothing_on(b: &Backend) {
    let addr = serve(b).await;
    let client = connect(b, &addr).await;
    let other = connect(b, &addr).await;
    let memory = client.remote_memory();
    let region = MemoryRegion::new(64 << 10).unwrap();
    let untouched = |buf: &RegisteredBuf| buf.as_slice().iter().all(|&x| x == 0);
    let code = |r: Result<RemoteResponse, Status>| r.unwrap_err().code();

    let offer = memory
        .offer(region.lease(0, 4096).unwrap(), Access::REMOTE_WRITE)
        .unwrap();
    let h = offer.handle();
    // Outside the window, and a read of a write-only window.
    assert_eq!(
        code(call(&client, PUSH, req(&h, 4000, 200, 1)).await),
        Code::OutOfRange
    );
    assert_eq!(
        code(call(&client, PULL, req(&h, 0, 16, 1)).await),
        Code::PermissionDenied
    );
    assert_eq!(
        code(call(&client, COUNT, req(&h, 0, 1, 0)).await),
        Code::PermissionDenied
    );
    // Handed to the server over another connection.
    let status = call(&other, PUSH, req(&h, 0, 100, 1)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status}");
    assert!(status.message().contains("another connection"), "{status}");
    let buf = offer.revoke().await.unwrap();
    assert!(untouched(&buf), "no refused use wrote a byte");
    drop(buf);
    // After revocation: refused, and the connection serves on.
    let status = call(&client, PUSH, req(&h, 0, 100, 1)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status}");
    assert!(status.message().contains("revoked"), "{status}");
    assert!(untouched(&region.lease(0, 4096).unwrap()));
    // Rights the buffer does not have, rights that are not remote.
    let read_only = RegisteredBuf::new(64, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    assert_eq!(
        memory
            .offer(read_only, Access::REMOTE_WRITE)
            .unwrap_err()
            .code(),
        Code::InvalidArgument
    );
    let lease = region.lease(0, 64).unwrap();
    assert_eq!(
        memory.offer(lease, Access::LOCAL_WRITE).unwrap_err().code(),
        Code::InvalidArgument
    );
    // Misaligned atomics.
    let offer = memory
        .offer(region.lease(0, 64).unwrap(), Access::REMOTE_ATOMIC)
        .unwrap();
    assert_eq!(
        code(call(&client, COUNT, req(&offer.handle(), 4, 1, 0)).await),
        Code::InvalidArgument
    );
    drop(offer.revoke().await);
    let pulled = call(&other, PULL, RemoteRequest::default()).await;
    assert_eq!(
        code(pulled),
        Code::InvalidArgument,
        "the other connection serves on"
    );

    // A forged handle: a longer window than offered. The holder's checks pass; the offerer's
    // transport refuses, which ends that connection (as on RDMA) and writes nothing. Over DOCA
    // the write lands in the connection's bounce memory instead: the window's own 64 bytes
    // come back with the revocation, the rest never reaches the region.
    let offer = memory
        .offer(region.lease(8192, 64).unwrap(), Access::REMOTE_WRITE)
        .unwrap();
    let forged = offer.handle().with_len(8192);
    let pushed = call(&client, PUSH, req(&forged, 0, 4096, 1)).await;
    let fenced = b.transport.fencing() == crate::transport::Fencing::Revocable;
    assert!(
        pushed.is_err() || !fenced,
        "refused where the transport can"
    );
    let window = offer.revoke().await;
    if pushed.is_ok() {
        let window = window.as_ref().expect("the connection is up");
        assert_eq!(
            window.as_slice(),
            &pattern(4096, 1)[..64],
            "the window's own bytes"
        );
    }
    drop(window);
    let all = region.lease(0, 64 << 10).unwrap();
    assert!(
        all.as_slice()[..8192].iter().all(|&x| x == 0)
            && all.as_slice()[8192 + 64..].iter().all(|&x| x == 0)
            && (!fenced || untouched(&all)),
        "nothing written outside the window (nothing at all where the transport refuses)"
    );
    drop(all);
    assert!(call(&other, PULL, RemoteRequest::default())
        .await
        .is_err_and(|s| s.code() == Code::InvalidArgument));
}

/// Leases of a shared region go where leases go (offers, results landed in them), in place
/// on the connection the region is shared with and through bounce memory on another; their
/// bytes are read and written by copies (`SharedBuf` has no slices).
pub(crate) async fn shared_regions_are_lent_in_place_and_copied_locally_on(b: &Backend) {
    use super::e2e::{req as test_req, BLOB_READ};
    use super::service::ENDPOINTS as TEST;
    let h = super::Harness::start_built(b, crate::ServerConfig::default(), |builder| {
        builder.add_service(Remote::default())
    })
    .await;
    let shared_with = h.client().await;
    let other = h.client().await;
    let region = crate::SharedRegion::new(1 << 20).unwrap();
    let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
    let share = shared_with.remote_memory().share(&region, rw).unwrap();
    assert!(
        shared_with
            .remote_memory()
            .share(&region, Access::LOCAL_WRITE)
            .is_err(),
        "remote rights only"
    );
    for (client, at) in [(&shared_with, 0usize), (&other, 512 << 10)] {
        let memory = client.remote_memory();
        let mut block = region.lease(at, 5000).unwrap();
        block.write(&pattern(5000, 1)).unwrap();
        let (pulled, back) = memory
            .lend(block, Access::REMOTE_READ, |handle| async move {
                call(client, PULL, req(&handle, 0, 5000, 1)).await
            })
            .await
            .unwrap();
        assert!(pulled.unwrap().exact, "the handler read the shared lease");
        drop(back);
        let offer = memory
            .offer(region.lease(at + 8192, 4096).unwrap(), Access::REMOTE_WRITE)
            .unwrap();
        call(client, PUSH, req(&offer.handle(), 96, 3000, 2))
            .await
            .unwrap();
        let back = offer.revoke().await.expect("the lease comes back");
        let mut got = vec![0u8; 3000];
        back.read_at(96, &mut got).unwrap();
        assert!(got == pattern(3000, 2), "written into the shared lease");
        drop(back);
        let dst = region.lease(at + 65536, 100_000).unwrap();
        let (_, dst) = client
            .call_raw_into(
                &TEST[BLOB_READ],
                encode_message(&test_req(70_000, 3)),
                dst,
                None,
            )
            .await
            .unwrap();
        assert_eq!(dst.len(), 70_000);
        assert!(
            dst.to_vec() == pattern(70_000, 3),
            "the result landed in the lease"
        );
    }
    // The whole region in one handle, offered once, used by offset while local code leases
    // and copies parts of it.
    let all = share.offer_all(rw).unwrap();
    assert!(
        share.offer_all(Access::REMOTE_ATOMIC).is_err(),
        "no more rights than the share"
    );
    let handle = all.handle();
    assert_eq!(handle.len(), 1 << 20);
    // Writes awaited, then posted ahead of the response: either way the bytes are in place
    // when the response arrives.
    for round in 0..4u32 {
        let push = [PUSH, PUSH_POSTED][round as usize % 2];
        let at = 300_000 + round as usize * 10_000;
        let mut part = region.lease(at, 5000).unwrap();
        part.write(&pattern(5000, 10 + round)).unwrap();
        let pulled = call(
            &shared_with,
            PULL,
            req(&handle, at as u64, 5000, 10 + round),
        )
        .await
        .unwrap();
        assert!(
            pulled.exact,
            "the handler read the part at {at} through the whole"
        );
        call(
            &shared_with,
            push,
            req(&handle, at as u64 + 100, 3000, 20 + round),
        )
        .await
        .unwrap();
        let mut got = vec![0u8; 3000];
        part.read_at(100, &mut got).unwrap();
        assert!(
            got == pattern(3000, 20 + round),
            "written in place at {at} (posted: {})",
            push == PUSH_POSTED
        );
    }
    all.revoke().await;
    assert!(
        call(&shared_with, PULL, req(&handle, 0, 100, 1))
            .await
            .is_err(),
        "a revoked whole-region offer reaches nothing"
    );
    drop(share);
    assert_eq!(region.leased(), 0, "every lease came back");
}

#[tokio::test]
async fn shared_regions_are_lent_in_place_and_copied_locally() {
    shared_regions_are_lent_in_place_and_copied_locally_on(&tcp_backend()).await;
}

#[tokio::test]
async fn remote_buffers_are_read_written_and_updated_in_place() {
    remote_buffers_are_read_written_and_updated_in_place_on(&tcp_backend()).await;
}

#[tokio::test]
async fn remote_buffer_misuse_gets_statuses_and_touches_nothing() {
    remote_buffer_misuse_gets_statuses_and_touches_nothing_on(&tcp_backend()).await;
}

/// Write and read endpoints with user memory: bytes frozen from a lease are sent from where
/// they are, and a result lands straight in the lease given for it (pushed, or copied from
/// the response when small); a result larger than the lease is refused with the sizes named.
pub(crate) async fn region_leases_travel_through_write_and_read_endpoints_on(b: &Backend) {
    use super::e2e::{req, BLOB_READ, BLOB_WRITE, MSG_RECEIVE};
    use super::service::{TestResponse, ENDPOINTS as TEST};
    let h = super::Harness::default_on(b).await;
    let client = h.client().await;
    let region = MemoryRegion::new(1 << 20).unwrap();
    let metadata = |len: usize, seed: u32| encode_message(&req(len, seed));
    let response = |bytes: Bytes| -> TestResponse { prost::Message::decode(bytes).unwrap() };

    for len in [100usize, 200_000] {
        let mut lease = region.lease(4096, len).unwrap();
        lease.as_mut_slice().copy_from_slice(&pattern(len, 9));
        let sent = lease.freeze();
        let (got, _) = client
            .call_raw(
                &TEST[BLOB_WRITE],
                metadata(len, 9),
                Some(sent.clone()),
                None,
            )
            .await
            .unwrap();
        assert!(response(got).exact, "{len} bytes written from a lease");
        drop(sent);

        for ep in [BLOB_READ, MSG_RECEIVE] {
            let dst = region.lease(300_000, 250_000).unwrap();
            let (got, dst) = client
                .call_raw_into(&TEST[ep], metadata(len, 11), dst, None)
                .await
                .unwrap();
            assert_eq!(response(got).len, len as u64);
            assert!(
                dst.as_slice() == &pattern(len, 11)[..],
                "{len} bytes landed in the lease"
            );
        }
    }
    assert_eq!(region.leased(), 0, "every lease came back");
    let small = region.lease(0, 1000).unwrap();
    let status = client
        .call_raw_into(&TEST[BLOB_READ], metadata(200_000, 1), small, None)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status}");
    assert!(status.message().contains("200000"), "{status}");
    // (The refused call's window stays the server's until it answers: other ranges below.)
    let dst = region.lease(2000, 100).unwrap();
    let inbound = client
        .call_raw_into(&TEST[BLOB_WRITE], Bytes::new(), dst, None)
        .await;
    assert_eq!(inbound.unwrap_err().code(), Code::InvalidArgument);
    // The connection serves on.
    let dst = region.lease(3000, 64).unwrap();
    let (_, dst) = client
        .call_raw_into(&TEST[MSG_RECEIVE], metadata(64, 2), dst, None)
        .await
        .unwrap();
    assert!(dst.as_slice() == &pattern(64, 2)[..]);
}

#[tokio::test]
async fn region_leases_travel_through_write_and_read_endpoints() {
    region_leases_travel_through_write_and_read_endpoints_on(&tcp_backend()).await;
}
