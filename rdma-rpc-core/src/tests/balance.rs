//! A client of several servers (`client::balance`): calls spread over the servers ready,
//! servers killed, restarted, draining, added and removed while calls run, and resolvers whose
//! answers change. Over `tcp://` and `mem://`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::e2e::{inbound, req, MSG_SEND};
use super::service::{TestResponse, ENDPOINTS};
use super::{bounded, Backend, Harness};
use crate::client::balance::{Addresses, Dns, Resolver, ServerState, ServerStatus};
use crate::codegen::call_inbound;
use crate::{Bytes, Client, Code, Error, Request};

/// Servers, each with its own test service (which counts its calls).
async fn servers(b: &Backend, n: usize) -> Vec<Harness> {
    let mut all = Vec::new();
    for _ in 0..n {
        all.push(Harness::default_on(b).await);
    }
    all
}

fn addrs(servers: &[Harness]) -> Vec<String> {
    servers.iter().map(|h| h.addr.clone()).collect()
}

/// A client of the servers `resolver` names, reconnecting after `backoff`.
async fn client_of(b: &Backend, resolver: impl Resolver, backoff: Duration) -> Client {
    Client::builder()
        .transport(b.transport.clone())
        .reconnect_backoff(backoff)
        .reconnect_backoff_max(backoff * 4)
        .connect_balanced(resolver)
        .await
        .expect("connect to several servers")
}

/// Inbound calls a server's handlers ran.
fn runs(h: &Harness) -> usize {
    h.service.inbound_runs.load(Ordering::SeqCst)
}

fn ready(servers: &[ServerStatus], addr: &str) -> bool {
    servers
        .iter()
        .any(|s| s.addr == addr && s.state == ServerState::Ready)
}

/// `n` calls one after another, each of which must succeed.
async fn calls(client: &Client, n: u32) {
    for seed in 0..n {
        let resp = inbound(client, MSG_SEND, 10, seed).await.expect("a call");
        assert!(resp.exact);
    }
}

/// Kills `h` (its task and every connection, as a crash would) and waits until it is gone;
/// a server started on the returned backend takes its address.
async fn kill(mut h: Harness) -> Backend {
    let backend = Backend {
        transport: h.transport.clone(),
        bind: h.addr.clone(),
    };
    h.task.abort();
    let _ = (&mut h.task).await;
    backend
}

pub(crate) async fn calls_spread_over_every_server_on(b: &Backend) {
    let hs = servers(b, 3).await;
    let client = client_of(b, Addresses::new(addrs(&hs)), Duration::from_millis(10)).await;
    client
        .until_servers(|s| s.iter().all(|s| s.state == ServerState::Ready))
        .await;
    calls(&client, 30).await;
    for h in &hs {
        assert!(runs(h) > 0, "{} got no call of 30", h.addr);
    }
    assert_eq!(hs.iter().map(runs).sum::<usize>(), 30);
    let statuses = client.servers();
    assert_eq!(statuses.iter().map(|s| s.calls).sum::<u64>(), 30);
    for (status, h) in statuses.iter().zip(&hs) {
        assert_eq!(status.calls, runs(h) as u64, "{}", status.addr);
    }
    assert_eq!(
        client.stats().calls,
        30,
        "the client counts every server's calls"
    );
    assert_eq!(client.peer(), addrs(&hs).join(", "));

    // Concurrent calls too, over every server.
    let before: Vec<usize> = hs.iter().map(runs).collect();
    let mut all = Vec::new();
    for seed in 0..64 {
        let client = client.clone();
        all.push(tokio::spawn(async move {
            inbound(&client, MSG_SEND, 5000, seed).await
        }));
    }
    for call in all {
        assert!(call.await.unwrap().expect("a concurrent call").exact);
    }
    assert_eq!(
        hs.iter().map(runs).sum::<usize>(),
        before.iter().sum::<usize>() + 64
    );
    client.shutdown().await;
    let err = inbound(&client, MSG_SEND, 1, 1).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(client.is_closed());
}

pub(crate) async fn a_killed_server_is_skipped_and_rejoins_once_restarted_on(b: &Backend) {
    let mut hs = servers(b, 3).await;
    let client = client_of(b, Addresses::new(addrs(&hs)), Duration::from_millis(10)).await;
    client
        .until_servers(|s| s.iter().all(|s| s.state == ServerState::Ready))
        .await;

    // Calls run on a task of their own while the server is killed; each succeeds, or fails
    // with UNAVAILABLE if it was in flight on the server killed (it is not repeated
    // elsewhere), and they go on succeeding after.
    let (done, mut succeeded) = watch::channel(0usize);
    let (stop, mut stopped) = watch::channel(false);
    let caller = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut failures = Vec::new();
            let mut seed = 0;
            while !*stopped.borrow_and_update() {
                match inbound(&client, MSG_SEND, 10, seed).await {
                    Ok(resp) => {
                        assert!(resp.exact);
                        done.send_modify(|n| *n += 1);
                    }
                    Err(e) => failures.push(e),
                }
                seed += 1;
            }
            failures
        })
    };
    let _ = succeeded.wait_for(|n| *n >= 20).await;

    let killed = hs.remove(1);
    let killed_addr = killed.addr.clone();
    let same_addr = kill(killed).await;
    client.until_servers(|s| !ready(s, &killed_addr)).await;
    // Calls go on over the other two.
    let so_far = *succeeded.borrow();
    let _ = succeeded.wait_for(|n| *n >= so_far + 20).await;
    stop.send_replace(true);
    let failures = bounded("the caller", caller).await.unwrap();
    for e in &failures {
        assert_eq!(e.code(), Code::Unavailable, "{e}");
    }
    let before: usize = hs.iter().map(runs).sum();
    calls(&client, 20).await;
    assert_eq!(hs.iter().map(runs).sum::<usize>(), before + 20);
    let down = client
        .servers()
        .into_iter()
        .find(|s| s.addr == killed_addr)
        .unwrap();
    assert!(
        !matches!(down.state, ServerState::Ready),
        "{down:?} after it was killed"
    );

    // Restarted on the same address, it is dialled again in the background and gets calls.
    let restarted = Harness::default_on(&same_addr).await;
    client.until_servers(|s| ready(s, &killed_addr)).await;
    calls(&client, 30).await;
    assert!(
        runs(&restarted) > 0,
        "the restarted server got no call of 30"
    );
}

pub(crate) async fn a_draining_server_gets_no_new_calls_on(b: &Backend) {
    let mut hs = servers(b, 3).await;
    let client = client_of(b, Addresses::new(addrs(&hs)), Duration::from_millis(10)).await;
    client
        .until_servers(|s| s.iter().all(|s| s.state == ServerState::Ready))
        .await;
    let draining = hs[2].addr.clone();

    // A call held in the third server's handler, sent through that server's own client.
    let third = loop {
        let picked = client.pick().await.expect("a server");
        if picked.servers()[0].addr == draining {
            break picked;
        }
    };
    let held = tokio::spawn(async move {
        let mut r = req(10, 7);
        r.gated = true;
        call_inbound::<_, TestResponse>(
            &third,
            &ENDPOINTS[MSG_SEND],
            Request::new(r),
            Bytes::from(super::pattern(10, 7)),
        )
        .await
    });
    hs[2].service.entered(1).await;
    let holding = |s: &ServerStatus| s.addr == draining && s.in_flight == 1;
    assert!(
        client.servers().iter().any(holding),
        "{:?}",
        client.servers()
    );

    // It shuts down gracefully: it says goaway at once and drains the held call.
    hs[2].shutdown();
    client.until_servers(|s| !ready(s, &draining)).await;
    calls(&client, 30).await;
    assert_eq!(runs(&hs[2]), 1, "the draining server got a new call");
    assert_eq!(runs(&hs[0]) + runs(&hs[1]), 30);

    // Its call in flight still gets its response.
    hs[2].service.open_gate();
    let resp = bounded("the held call", held).await.unwrap();
    assert!(resp.expect("the drained call").exact);
    bounded("the server's exit", &mut hs[2].task)
        .await
        .unwrap()
        .unwrap();
}

pub(crate) async fn with_no_server_ready_calls_fail_naming_each_on(b: &Backend) {
    let mut hs = servers(b, 2).await;
    let all = addrs(&hs);
    // A long backoff: both stay down for the test.
    let client = client_of(b, Addresses::new(all.clone()), Duration::from_secs(600)).await;
    client
        .until_servers(|s| s.iter().all(|s| s.state == ServerState::Ready))
        .await;
    kill(hs.pop().unwrap()).await;
    kill(hs.pop().unwrap()).await;
    client
        .until_servers(|s| {
            s.iter()
                .all(|s| matches!(s.state, ServerState::Down { .. }))
        })
        .await;
    let first = inbound(&client, MSG_SEND, 1, 1).await.unwrap_err();
    assert_eq!(first.code(), Code::Unavailable, "{first}");
    assert!(
        first.message().starts_with("no server is ready: "),
        "{first}"
    );
    for addr in &all {
        assert!(first.message().contains(&format!("{addr}: ")), "{first}");
    }
    assert!(first.retry_after().is_some(), "{first:?}");
    let second = inbound(&client, MSG_SEND, 1, 2).await.unwrap_err();
    assert_eq!(
        first.message(),
        second.message(),
        "the same message for each call"
    );
    assert!(client.is_closed());

    // Nothing to connect to at all: connect_balanced says why for each.
    let err = Client::builder()
        .transport(b.transport.clone())
        .reconnect(false)
        .connect_balanced(Addresses::new(all.clone()))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NoServer { .. }), "{err}");
    for addr in &all {
        assert!(err.to_string().contains(addr.as_str()), "{err}");
    }
}

pub(crate) async fn the_list_changes_while_calls_run_on(b: &Backend) {
    let hs = servers(b, 3).await;
    let (a, bb, c) = (&hs[0], &hs[1], &hs[2]);
    let list = Addresses::new([a.addr.clone(), bb.addr.clone()]);
    let client = client_of(b, list.clone(), Duration::from_millis(10)).await;
    client.until_servers(|s| ready(s, &bb.addr)).await;
    calls(&client, 10).await;
    assert_eq!(runs(c), 0);

    list.insert(c.addr.clone());
    list.insert(c.addr.clone()); // once is enough
    client.until_servers(|s| ready(s, &c.addr)).await;
    assert_eq!(client.servers().len(), 3);
    calls(&client, 30).await;
    assert!(runs(c) > 0, "the added server got no call of 30");

    assert!(list.remove(&a.addr));
    assert!(!list.remove(&a.addr));
    client
        .until_servers(|s| s.iter().all(|s| s.addr != a.addr))
        .await;
    let a_before = runs(a);
    calls(&client, 30).await;
    assert_eq!(runs(a), a_before, "the removed server got a call");
    assert_eq!(list.get(), [bb.addr.clone(), c.addr.clone()]);

    // Emptied, then filled again.
    list.set(Vec::<String>::new());
    client.until_servers(|s| s.is_empty()).await;
    let err = inbound(&client, MSG_SEND, 1, 1).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.message().contains("the resolver named none"), "{err}");
    list.set([a.addr.clone()]);
    client.until_servers(|s| ready(s, &a.addr)).await;
    calls(&client, 3).await;
    assert_eq!(runs(a), a_before + 3);
}

/// A resolver whose answers the test sends.
struct Steps(mpsc::UnboundedReceiver<crate::Result<Vec<String>>>);

impl Resolver for Steps {
    async fn resolve(&mut self) -> crate::Result<Vec<String>> {
        match self.0.recv().await {
            Some(answer) => answer,
            None => std::future::pending().await,
        }
    }
}

pub(crate) async fn a_resolver_whose_answer_changes_on(b: &Backend) {
    let hs = servers(b, 3).await;
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(Ok(vec![hs[0].addr.clone(), hs[1].addr.clone()]))
        .unwrap();
    let client = client_of(b, Steps(rx), Duration::from_millis(10)).await;

    tx.send(Ok(vec![hs[1].addr.clone(), hs[2].addr.clone()]))
        .unwrap();
    let (bb, c) = (hs[1].addr.clone(), hs[2].addr.clone());
    client
        .until_servers(|s| s.len() == 2 && ready(s, &bb) && ready(s, &c))
        .await;
    let a_before = runs(&hs[0]);
    calls(&client, 20).await;
    assert_eq!(
        runs(&hs[0]),
        a_before,
        "a server no longer named got a call"
    );
    assert!(runs(&hs[1]) > 0 && runs(&hs[2]) > 0);

    // A failed answer keeps the servers known; the next one is followed.
    tx.send(Err(Error::Resolve {
        name: "test".into(),
        source: "the discovery service is away".into(),
    }))
    .unwrap();
    tx.send(Ok(vec![hs[0].addr.clone()])).unwrap();
    let a = hs[0].addr.clone();
    client.until_servers(|s| s.len() == 1 && ready(s, &a)).await;
    calls(&client, 5).await;
    assert_eq!(runs(&hs[0]), a_before + 5);

    // A resolver's first error is connect_balanced's.
    let (tx, rx) = mpsc::unbounded_channel();
    tx.send(Err(Error::Resolve {
        name: "test".into(),
        source: "no such service".into(),
    }))
    .unwrap();
    let err = Client::builder()
        .transport(b.transport.clone())
        .connect_balanced(Steps(rx))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no such service"), "{err}");
}

/// Every `host:port` record of `localhost`: one is the server's (IPv4); an IPv6 one, if the
/// system has it, stays down and gets no calls.
#[tokio::test]
async fn a_dns_name_gives_every_address_it_has() {
    let h = Harness::tcp_default().await;
    let port = h.addr.rsplit_once(':').unwrap().1;
    let dns = Dns::new(&format!("tcp://localhost:{port}"))
        .unwrap()
        .every(Duration::from_millis(50));
    let client = bounded(
        "dns",
        client_of(&super::tcp_backend(), dns, Duration::from_millis(10)),
    )
    .await;
    let servers = client.servers();
    assert!(
        servers.iter().any(|s| s.addr == h.addr),
        "{servers:?} lacks {}",
        h.addr
    );
    calls(&client, 5).await;
    assert_eq!(runs(&h), 5);
    let err = bounded(
        "no such name",
        Client::builder().connect_balanced(Dns::new("tcp://no-such-host.invalid:7470").unwrap()),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::Resolve { .. }), "{err}");
    assert!(err.to_string().contains("no-such-host.invalid"), "{err}");
}

/// A test per transport for each test above.
macro_rules! over_tcp_and_mem {
    ($($name:ident),* $(,)?) => {
        mod tcp {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let b = crate::tests::tcp_backend();
                    crate::tests::bounded(stringify!($name), super::$name(&b)).await;
                }
            )*
        }
        mod mem {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let b = crate::tests::Backend {
                        transport: std::sync::Arc::new(crate::transport::mem::MemTransport::new()),
                        bind: "mem://".into(),
                    };
                    crate::tests::bounded(stringify!($name), super::$name(&b)).await;
                }
            )*
        }
    };
}

over_tcp_and_mem!(
    calls_spread_over_every_server_on,
    a_killed_server_is_skipped_and_rejoins_once_restarted_on,
    a_draining_server_gets_no_new_calls_on,
    with_no_server_ready_calls_fail_naming_each_on,
    the_list_changes_while_calls_run_on,
    a_resolver_whose_answer_changes_on,
);
