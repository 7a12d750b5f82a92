//! A hostile client against the server's protocol state: after an honest handshake (or in
//! place of one) and a few honest calls, it sends one frame it must not send, picked by the
//! seed with random contents. What each must do: a frame no client may send ends the
//! connection with an error and a goaway saying why; a frame that is only useless (an ack for
//! a call not in flight, a slot never armed, credits beyond what was announced) changes nothing
//! for anyone else, and the next honest call is still answered. Nothing panics.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::link::{Link, Sim, SimCall};
use super::rng::Rng;
use crate::protocol::codec::frame_bytes;
use crate::protocol::connection::{ClientSettings, Connection, Incoming, ServerSettings};
use crate::protocol::frames::{
    AckFrame, CallId, ChunksFrame, Frame, GrantFrame, Hello, Kind, Offers, RequestFrame,
    ResponseFrame, UsedWindow,
};
use crate::protocol::PROTOCOL_VERSION;

/// What a hostile frame must do to the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Must {
    /// End it, with an error.
    End,
    /// Leave it serving.
    Survive,
}

fn server(now: Instant) -> Connection<Sim> {
    Connection::server(
        ServerSettings {
            max_frame: 4096,
            initial_receives: 8,
            recv_credits: 8,
            max_in_flight: 4,
            inline_threshold: 1024,
            pull_writes: false,
            stream_window: 0,
            token: 0x5e7e,
            write_slots: 2,
            handshake_timeout: Duration::from_secs(5),
            idle_timeout: None,
            max_pings_per_second: 5,
            refusal: None,
        },
        Arc::from("hostile client"),
        now,
    )
}

fn client() -> Connection<Sim> {
    Connection::client(
        ClientSettings {
            max_frame: 4096,
            initial_receives: 8,
            recv_credits: 8,
            max_in_flight: 4,
            inline_threshold: 1024,
            stream_window: 0,
            token: 0xc11e,
        },
        Arc::from("server"),
    )
}

/// Encodes a frame as a client that ignores the rules would.
fn raw(kind: Option<Kind>, credits: u32) -> Bytes {
    frame_bytes(kind.as_ref(), credits, false)
}

/// Random bytes that are no frame (an invalid wire type first).
fn garbage(rng: &mut Rng) -> Bytes {
    let mut bytes = vec![0x0f | 0xf0];
    for _ in 0..rng.below(40) {
        bytes.push(rng.next() as u8);
    }
    Bytes::from(bytes)
}

fn request(id: u64, rng: &mut Rng) -> Kind {
    Kind::Request(RequestFrame {
        id,
        path: Bytes::from_static(b"/h"),
        op: 1,
        payload_len: 8,
        inline_payload: Some(Bytes::from(vec![rng.next() as u8; 8])),
        ..Default::default()
    })
}

/// The hostile frames, by what they must do. `in_flight` is a call id the server has in
/// flight.
fn pick(rng: &mut Rng, in_flight: u64) -> (Vec<Bytes>, Must, &'static str) {
    let id = rng.next();
    match rng.below(14) {
        0 => (vec![garbage(rng)], Must::End, "garbage"),
        1 => (
            vec![raw(Some(Kind::HelloAck(Hello::default())), 0)],
            Must::End,
            "a HelloAck",
        ),
        2 => (
            vec![raw(
                Some(Kind::Hello(Hello {
                    version: PROTOCOL_VERSION,
                    ..Default::default()
                })),
                0,
            )],
            Must::End,
            "a second Hello",
        ),
        3 => (
            vec![raw(
                Some(Kind::Grant(GrantFrame {
                    id,
                    ..Default::default()
                })),
                0,
            )],
            Must::End,
            "a Grant",
        ),
        4 => (
            vec![raw(
                Some(Kind::Response(ResponseFrame {
                    id,
                    ..Default::default()
                })),
                0,
            )],
            Must::End,
            "a Response",
        ),
        5 => (
            vec![raw(Some(Kind::Pong(CallId { id })), 0)],
            Must::End,
            "a Pong",
        ),
        6 => (
            vec![raw(
                Some(Kind::Chunks(ChunksFrame {
                    id,
                    offers: Vec::new(),
                    used: vec![UsedWindow::default()],
                })),
                0,
            )],
            Must::End,
            "windows reported used",
        ),
        7 => (
            vec![raw(Some(request(in_flight, rng)), 0)],
            Must::End,
            "a call id reused while in flight",
        ),
        8 => (
            (0..7)
                .map(|_| raw(Some(Kind::Ping(CallId { id })), 0))
                .collect(),
            Must::End,
            "a flood of pings",
        ),
        9 => (
            vec![raw(Some(Kind::Ack(AckFrame { id, reply_to: None })), 0)],
            Must::Survive,
            "an ack for no call",
        ),
        10 => (
            vec![raw(Some(Kind::Cancel(CallId { id })), 0)],
            Must::Survive,
            "a cancel for no call",
        ),
        11 => (
            vec![raw(
                Some(Kind::Revoked(Offers {
                    offers: vec![id, id ^ 1],
                })),
                0,
            )],
            Must::Survive,
            "confirmations of revocations never asked",
        ),
        12 => (
            vec![raw(None, u32::MAX)],
            Must::Survive,
            "credits beyond what the server announced",
        ),
        _ => {
            let mut frame = request(id, rng);
            if let Kind::Request(r) = &mut frame {
                r.inline_payload = None;
                r.payload_len = 2000;
                r.slot = Some(rng.below(4) as u32);
            }
            (
                vec![raw(Some(frame), 0)],
                Must::Survive,
                "a write slot never armed",
            )
        }
    }
}

/// Runs one seed: `Err` says what went wrong.
fn run(seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let now = Instant::now();
    let (mut c, mut s) = (client(), server(now));
    let mut link = Link {
        posted: [8, 8],
        ..Link::default()
    };
    let mut calls = Vec::new();
    let settle = |link: &mut Link,
                  c: &mut Connection<Sim>,
                  s: &mut Connection<Sim>,
                  calls: &mut Vec<(u64, SimCall)>|
     -> Result<(), String> {
        for _ in 0..64 {
            link.flush(0, c);
            link.flush(1, s);
            if let Some(incoming) = link.deliver(1, s, now)? {
                match incoming {
                    Incoming::Request(admitted) => {
                        let events = SimCall::default();
                        s.start_call(admitted.request.id, events.clone(), None, None);
                        calls.push((admitted.request.id, events));
                    }
                    Incoming::Refused { id, status } => {
                        let _ = s.refuse(id, &status, || None);
                    }
                }
            }
            link.deliver(0, c, now)?;
        }
        Ok(())
    };
    settle(&mut link, &mut c, &mut s, &mut calls)?;
    if !s.is_open() || !c.is_open() {
        return Err("the honest handshake failed".into());
    }
    // A few honest calls, left in flight on the server.
    let mut honest = Vec::new();
    for _ in 0..1 + rng.below(3) {
        let id = c.open_call(None, None);
        c.send(request(id, &mut rng)).map_err(|e| e.to_string())?;
        honest.push(id);
    }
    settle(&mut link, &mut c, &mut s, &mut calls)?;
    let in_flight = calls
        .first()
        .map(|(id, _)| *id)
        .ok_or("no call in flight")?;
    let (frames, must, what) = pick(&mut rng, in_flight);
    for frame in frames {
        link.in_flight[1].push_back(frame);
        let _ = link.deliver(1, &mut s, now + Duration::from_millis(1))?;
        link.flush(1, &mut s);
    }
    match (must, s.end()) {
        (Must::End, None) => return Err(format!("{what}: the connection goes on")),
        (Must::End, Some(end)) if end.error.is_none() => {
            return Err(format!("{what}: the connection ended without an error"))
        }
        (Must::End, Some(_)) => {
            // The goaway saying why, as the last frame the client gets.
            let said = link.in_flight[0].iter().any(|f| {
                matches!(
                    prost::Message::decode(f.clone()),
                    Ok(Frame {
                        kind: Some(Kind::Goaway(_)),
                        ..
                    })
                )
            });
            if !said {
                return Err(format!("{what}: no goaway told the client why"));
            }
            if !link.closed_by[1] {
                return Err(format!("{what}: ended but the transport was not closed"));
            }
            for (_, events) in &calls {
                if events.take().is_none() {
                    return Err(format!("{what}: a call in flight was not ended"));
                }
            }
        }
        (Must::Survive, Some(end)) => {
            return Err(format!("{what}: the connection ended: {:?}", end.error))
        }
        (Must::Survive, None) => {
            // The next honest call is still answered: the server answers the calls it has.
            for (id, _) in calls.drain(..) {
                s.respond(
                    ResponseFrame {
                        id,
                        ..Default::default()
                    },
                    || now,
                    || None,
                )
                .map_err(|e| format!("{what}: {e}"))?;
            }
            let mut answered = 0;
            for _ in 0..64 {
                link.flush(1, &mut s);
                if link.deliver(0, &mut c, now)?.is_some() {
                    unreachable!("the client gets no requests");
                }
                link.flush(0, &mut c);
            }
            for &id in &honest {
                let waker = std::task::Waker::noop();
                if let std::task::Poll::Ready(Some(_)) =
                    c.poll_event(id, &std::task::Context::from_waker(waker))
                {
                    answered += 1;
                }
            }
            if answered == 0 {
                return Err(format!("{what}: no honest call was answered after it"));
            }
        }
    }
    Ok(())
}

/// Runs the seeds; the number run.
pub(crate) fn sweep(seeds: std::ops::Range<u64>) -> u64 {
    let count = seeds.end - seeds.start;
    for seed in seeds {
        if let Err(e) = run(seed) {
            panic!("simulation `hostile` failed: seed {seed}: {e}\nreplay: SIM_SEED={seed}");
        }
    }
    count
}
