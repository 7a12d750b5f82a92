//! The simulation's runs: thousands of seeds per scenario (`SIM_SEEDS` sets how many,
//! `SIM_SEED` replays one).

use super::model::{run, Scenario};

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::link::{Link, Sim, SimCall};
use crate::protocol::codec::Decoder;
use crate::protocol::connection::{ClientSettings, Connection, ServerSettings};
use crate::protocol::frames::Kind;

/// Seeds per scenario: `SIM_SEEDS`, or a default that keeps the suite quick.
fn seeds(default: u64) -> std::ops::Range<u64> {
    if let Some(seed) = std::env::var("SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        return seed..seed + 1;
    }
    let n = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    1..n + 1
}

/// What the runs of a sweep did together: responses, calls ended with the connection,
/// calls abandoned, frames, revocations, calls past their deadline on the client's side and on
/// the server's.
type Totals = (usize, usize, usize, u64, usize, usize, usize);

/// Runs `scenario` over the seeds; prints how many and what they did; fails on the first seed
/// that breaks a rule, naming it.
fn sweep(name: &str, scenario: &Scenario, default: u64) -> Totals {
    let mut totals = (0usize, 0usize, 0usize, 0u64, 0usize, 0usize, 0usize);
    let seeds = seeds(default);
    let count = seeds.end - seeds.start;
    for seed in seeds {
        match run(seed, scenario) {
            Ok(out) => {
                totals.0 += out.responses;
                totals.1 += out.ended;
                totals.2 += out.abandoned;
                totals.3 += out.frames;
                totals.4 += out.revocations;
                totals.5 += out.expired;
                totals.6 += out.server_expired;
            }
            Err(e) => panic!("simulation `{name}` failed: {e}\nreplay: SIM_SEED={seed}"),
        }
    }
    println!(
        "simulation `{name}`: {count} seeds; {} responses, {} ended with the connection, {} \
         abandoned, {} past their deadline (client), {} past their deadline (server), {} \
         frames, {} revocations",
        totals.0, totals.1, totals.2, totals.5, totals.6, totals.3, totals.4
    );
    totals
}

#[test]
fn busy_connections_keep_every_rule() {
    sweep("busy", &Scenario::busy(), 1000);
}

/// Calls with deadlines, some shorter than the server takes: the connection's one timer tells
/// each call whose deadline passed (never earlier), once; the call is given up and the server
/// told, and the rest end with their responses.
#[test]
fn calls_past_their_deadline_are_told_once_and_given_up() {
    let scenario = Scenario {
        deadline: Some(std::time::Duration::from_millis(40)),
        ..Scenario::busy()
    };
    let totals = sweep("deadlines", &scenario, 500);
    assert!(
        totals.5 > 0,
        "no call went past its deadline: the test shows nothing"
    );
    assert!(totals.0 > 0, "no call had its response");
}

/// The server's side of the same: each call it started with a deadline is told once the
/// deadline passed (never before), by the connection's one timer, and answers.
#[test]
fn server_calls_past_their_deadline_are_told_once() {
    let scenario = Scenario {
        server_deadline: Some(std::time::Duration::from_millis(30)),
        ..Scenario::busy()
    };
    let totals = sweep("server-deadlines", &scenario, 500);
    assert!(
        totals.6 > 0,
        "no server call went past its deadline: the test shows nothing"
    );
    assert!(totals.0 > 0, "no call had its response");
}

#[test]
fn connections_short_of_receives_never_overrun_them() {
    let scenario = Scenario {
        calls: 300,
        depth: 32,
        receives: [(4, 4), (4, 4)],
        max_in_flight: 32,
        ..Scenario::busy()
    };
    sweep("tight", &scenario, 500);
}

#[test]
fn links_that_fail_end_every_call_once() {
    let scenario = Scenario {
        fail_one_in: 2000,
        leave_at_end: false,
        ..Scenario::busy()
    };
    sweep("failing", &scenario, 500);
}

#[test]
fn a_server_that_shuts_down_answers_what_it_started() {
    let scenario = Scenario {
        shutdown_after: Some(60),
        leave_at_end: false,
        ..Scenario::busy()
    };
    sweep("shutdown", &scenario, 500);
}

/// The same, with four receives a side: the server's last answers wait behind credits when it
/// decides to end, and must still reach the client.
#[test]
fn a_server_short_of_receives_that_shuts_down_loses_no_answer() {
    let scenario = Scenario {
        calls: 120,
        depth: 16,
        receives: [(4, 4), (4, 4)],
        max_in_flight: 16,
        shutdown_after: Some(40),
        leave_at_end: false,
        ..Scenario::busy()
    };
    sweep("shutdown-tight", &scenario, 500);
}

#[test]
fn hostile_clients_lose_their_connection_and_nothing_else() {
    let count = super::hostile::sweep(seeds(2000));
    println!(
        "simulation `hostile`: {count} seeds; every frame no client may send ended its \
         connection with a goaway, every useless one left it serving"
    );
}

/// The server's clocks, driven by the simulation's time: a client that never says Hello is
/// closed at the handshake timeout, and an idle connection (no call, no frame) at the idle
/// timeout, each with a goaway naming the setting; a connection with a call in flight is never
/// idle.
#[test]
fn the_servers_timeouts_close_only_what_they_should() {
    let settings = pair_server(4, Some(Duration::from_secs(30)));
    let t0 = Instant::now();

    // No Hello: closed at the handshake timeout, not before.
    let mut silent: Connection<Sim> = Connection::server(settings.clone(), Arc::from("c"), t0);
    assert_eq!(silent.poll_timeout(), Some(t0 + Duration::from_secs(5)));
    silent.handle_timeout(t0 + Duration::from_secs(4));
    assert!(silent.end().is_none());
    silent.handle_timeout(t0 + Duration::from_secs(5));
    let end = silent.end().expect("closed at the handshake timeout");
    assert!(end
        .error
        .as_ref()
        .unwrap()
        .to_string()
        .contains("handshake_timeout"));

    // An honest client: idle only without calls in flight.
    let mut server: Connection<Sim> = Connection::server(settings, Arc::from("c"), t0);
    let mut client = pair_client(4);
    let mut link = pair_link();
    settle(&mut link, &mut client, &mut server, t0);
    assert!(client.is_open() && server.is_open());
    let idle_at = server.poll_timeout().expect("an idle timer");
    assert_eq!(idle_at, t0 + Duration::from_secs(30));
    // A call starts before it: no idle timer while it is in flight.
    let id = client.open_call(None, None);
    client
        .send(Kind::Request(crate::protocol::frames::RequestFrame {
            id,
            path: bytes::Bytes::from_static(b"/x"),
            op: 1,
            ..Default::default()
        }))
        .unwrap();
    let t1 = t0 + Duration::from_secs(10);
    for incoming in settle(&mut link, &mut client, &mut server, t1) {
        if let crate::protocol::connection::Incoming::Request(a) = incoming {
            server.start_call(a.request.id, SimCall::default(), None, None);
        }
    }
    assert_eq!(server.poll_timeout(), None, "a call in flight: never idle");
    server.handle_timeout(t0 + Duration::from_secs(100));
    assert!(server.end().is_none());
    // Answered at t2: idle from then on.
    let t2 = t0 + Duration::from_secs(40);
    server
        .respond(
            crate::protocol::frames::ResponseFrame {
                id,
                ..Default::default()
            },
            || t2,
            || None,
        )
        .unwrap();
    assert_eq!(server.poll_timeout(), Some(t2 + Duration::from_secs(30)));
    server.handle_timeout(t2 + Duration::from_secs(29));
    assert!(server.end().is_none());
    server.handle_timeout(t2 + Duration::from_secs(30));
    let end = server.end().expect("closed when idle");
    assert!(end.error.is_none(), "an idle connection ends as it should");
    // The client hears why.
    link.flush(1, &mut server);
    let said = link.in_flight[0].iter().any(|f| {
        let frame = Decoder::default().decode(f).unwrap();
        matches!(frame.kind, Some(Kind::Goaway(g)) if g.message.contains("idle_timeout"))
    });
    assert!(said, "a goaway naming idle_timeout");
}

/// A server's settings for [`settle`] with a [`pair_client`]: 4 receives of 4 KiB, a 5 s
/// handshake timeout.
fn pair_server(max_in_flight: u32, idle_timeout: Option<Duration>) -> ServerSettings {
    ServerSettings {
        max_frame: 4096,
        initial_receives: 4,
        recv_credits: 4,
        max_in_flight,
        inline_threshold: 1024,
        pull_writes: false,
        stream_window: 0,
        token: 9,
        write_slots: 0,
        handshake_timeout: Duration::from_secs(5),
        idle_timeout,
        max_pings_per_second: 0,
        refusal: None,
    }
}

/// A client that wants `max_in_flight` calls in flight, for [`settle`] with a server.
fn pair_client(max_in_flight: u32) -> Connection<Sim> {
    Connection::client(
        ClientSettings {
            max_frame: 4096,
            initial_receives: 4,
            recv_credits: 4,
            max_in_flight,
            inline_threshold: 1024,
            stream_window: 0,
            token: 7,
        },
        Arc::from("s"),
    )
}

/// A link whose two ends posted the 4 receives [`pair_client`] and the servers here announce.
fn pair_link() -> Link {
    Link {
        posted: [4, 4],
        ..Link::default()
    }
}

/// Moves frames both ways until nothing is left to move: the requests the server got.
fn settle(
    link: &mut Link,
    c: &mut Connection<Sim>,
    s: &mut Connection<Sim>,
    at: Instant,
) -> Vec<crate::protocol::connection::Incoming<Sim>> {
    let mut requests = Vec::new();
    for _ in 0..16 {
        link.flush(0, c);
        link.flush(1, s);
        if let Some(incoming) = link.deliver(1, s, at).unwrap() {
            requests.push(incoming);
        }
        link.deliver(0, c, at).unwrap();
    }
    requests
}

/// Opens a call on `client` and sends its request (to `/x`): its id.
fn open_and_send(client: &mut Connection<Sim>) -> u64 {
    let id = client.open_call(None, None);
    let request = crate::protocol::frames::RequestFrame {
        id,
        path: bytes::Bytes::from_static(b"/x"),
        op: 1,
        ..Default::default()
    };
    client.send_request(id, &request, None).unwrap();
    id
}

/// A call that finds room in the window opens at once, in the same lock as its request
/// (`Connection::room_now`), only when nobody waits for room before it: callers in line keep
/// their turn, and a connection that refuses calls says so.
#[test]
fn a_caller_not_in_line_opens_at_once_only_when_nobody_waits() {
    use crate::protocol::connection::Incoming;
    use crate::protocol::frames::ResponseFrame;
    use std::task::{Context, Poll};

    let t0 = Instant::now();
    let settings = pair_server(2, None);
    let mut server: Connection<Sim> = Connection::server(settings, Arc::from("c"), t0);
    let mut client = pair_client(2);
    let mut link = pair_link();
    settle(&mut link, &mut client, &mut server, t0);
    assert!(client.is_open());
    assert_eq!(client.room_now(), Ok(true));
    let ids: Vec<u64> = (0..2).map(|_| open_and_send(&mut client)).collect();
    assert_eq!(client.room_now(), Ok(false), "the window (2) is full");
    // A caller waits in line.
    let waker = std::task::Waker::noop();
    let mut ticket = None;
    let cx = Context::from_waker(waker);
    assert!(client.poll_room(&mut ticket, &cx).is_pending());
    // One call is answered: room for one, which is the waiting caller's.
    for incoming in settle(&mut link, &mut client, &mut server, t0) {
        if let Incoming::Request(a) = incoming {
            server.start_call(a.request.id, SimCall::default(), None, None);
        }
    }
    let answer = ResponseFrame {
        id: ids[0],
        ..Default::default()
    };
    server.respond(answer, || t0, || None).unwrap();
    settle(&mut link, &mut client, &mut server, t0);
    assert!(client.poll_event(ids[0], &cx).is_ready());
    assert_eq!(
        client.room_now(),
        Ok(false),
        "the room is the waiting caller's"
    );
    assert_eq!(client.poll_room(&mut ticket, &cx), Poll::Ready(Ok(())));
    assert_eq!(
        client.room_now(),
        Ok(true),
        "nobody waits, one call in flight of 2"
    );
    // Once the connection refuses calls: why.
    client.leave();
    assert!(client.room_now().is_err());
    assert!(client.poll_room(&mut None, &cx).is_ready());
}

/// A call set to wait as it is sent (`will_wait`, under the send's lock) is woken by its
/// response without having looked for it first, and is one a reader can hand the connection
/// to (`waiting_call`), as a call that looked and found nothing is.
#[test]
fn a_call_set_to_wait_as_it_is_sent_is_woken_by_its_response() {
    use crate::protocol::connection::Incoming;
    use crate::protocol::frames::ResponseFrame;
    use crate::tests::wakes::Wakes;
    use std::task::Context;

    let t0 = Instant::now();
    let mut server: Connection<Sim> = Connection::server(pair_server(2, None), Arc::from("c"), t0);
    let mut client = pair_client(2);
    let mut link = pair_link();
    settle(&mut link, &mut client, &mut server, t0);
    let mut sent = Vec::new();
    for _ in 0..2 {
        let id = open_and_send(&mut client);
        let (wakes, waker) = Wakes::new();
        client.will_wait(id, waker);
        sent.push((id, wakes));
    }
    let (first, second) = (sent[0].0, sent[1].0);
    assert_eq!(client.waiting_call(first).map(|(id, _)| id), Some(second));
    for incoming in settle(&mut link, &mut client, &mut server, t0) {
        if let Incoming::Request(a) = incoming {
            server.start_call(a.request.id, SimCall::default(), None, None);
        }
    }
    let answer = ResponseFrame {
        id: first,
        ..Default::default()
    };
    server.respond(answer, || t0, || None).unwrap();
    settle(&mut link, &mut client, &mut server, t0);
    assert_eq!(sent[0].1.count(), 1, "the answered call is woken");
    assert_eq!(sent[1].1.count(), 0, "the other is not");
    let cx = Context::from_waker(std::task::Waker::noop());
    assert!(client.poll_event(first, &cx).is_ready());
    assert!(client.poll_event(second, &cx).is_pending());
}
