//! The simulated applications on both ends, the schedule that interleaves them with the link,
//! and the checks of what they saw (the rules are listed in the module docs of `sim`).
//!
//! Every step, the schedule picks one thing that may happen: the client opens a call, gives up
//! on one, pings, offers or revokes memory; the server answers a call (after a grant round
//! trip, sometimes), refuses one, uses the client's memory, shuts down; a frame arrives on
//! either side; time passes; the link fails. Wake-ups are checked too: the client looks at a
//! call, a ping or its place in line only when the protocol woke it, so a lost wake-up stalls
//! the run, which fails it.

use std::collections::{BTreeMap as HashMap, BTreeSet as HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::link::{journal, CallEvent, Journal, Link, Shared, Sim, SimCall, SimWindow};
use super::rng::Rng;
use crate::memory::Access;
use crate::protocol::connection::{
    ClientSettings, Connection, Incoming, ServerEvent, ServerSettings,
};
use crate::protocol::frames::{
    AckFrame, DescriptorFrame, GrantFrame, Kind, RequestFrame, ResponseFrame, StatusFrame,
};
use crate::protocol::handles::{AccessKind, HandleView, Refusal};
use crate::protocol::mailbox::EndReason;
use crate::status::Status;
use crate::transport::Descriptor;

/// What one run does.
#[derive(Debug, Clone)]
pub(crate) struct Scenario {
    /// Calls the client makes in all.
    pub(crate) calls: usize,
    /// Calls it keeps in flight at most.
    pub(crate) depth: usize,
    /// Receives each side starts with and grows to (client, server).
    pub(crate) receives: [(u32, u32); 2],
    /// The server's limit of calls in flight.
    pub(crate) max_in_flight: u32,
    /// The client gives up on a call one time in this many (0: never).
    pub(crate) cancel_one_in: u64,
    /// The server asks for a grant round trip one time in this many (0: never).
    pub(crate) grant_one_in: u64,
    /// The server refuses a call one time in this many (0: never).
    pub(crate) refuse_one_in: u64,
    /// The link fails at a step one time in this many (0: never).
    pub(crate) fail_one_in: u64,
    /// The server shuts down once it started this many calls.
    pub(crate) shutdown_after: Option<usize>,
    /// Write slots of the server.
    pub(crate) slots: u32,
    /// The client offers memory the server uses, and revokes it.
    pub(crate) offers: bool,
    /// The client pings.
    pub(crate) pings: bool,
    /// The client leaves (says goodbye) once its calls are done.
    pub(crate) leave_at_end: bool,
    /// Each call's deadline, from when it opens: half to twice this (time passes by 0 to 19 ms
    /// at a step).
    pub(crate) deadline: Option<Duration>,
    /// Each call's deadline on the server, from when its request arrived: half to twice this.
    pub(crate) server_deadline: Option<Duration>,
}

impl Scenario {
    /// Many calls, all the features, nothing failing.
    pub(crate) fn busy() -> Scenario {
        Scenario {
            calls: 200,
            depth: 16,
            receives: [(4, 64), (4, 64)],
            max_in_flight: 128,
            cancel_one_in: 12,
            grant_one_in: 6,
            refuse_one_in: 20,
            fail_one_in: 0,
            shutdown_after: None,
            slots: 4,
            offers: true,
            pings: true,
            leave_at_end: true,
            deadline: None,
            server_deadline: None,
        }
    }
}

/// What a run saw, for the caller's own checks and the summary.
#[derive(Debug, Default, Clone)]
pub(crate) struct Outcome {
    /// Calls answered with a response (a status or not).
    pub(crate) responses: usize,
    /// Calls that ended with the connection.
    pub(crate) ended: usize,
    /// Calls the client gave up on.
    pub(crate) abandoned: usize,
    /// Calls the connection told their deadline passed (the client then gave them up).
    pub(crate) expired: usize,
    /// Calls the server's connection told their deadline passed (the server then answered).
    pub(crate) server_expired: usize,
    /// Calls refused before they were opened (the connection was over for new calls).
    pub(crate) not_opened: usize,
    /// Frames delivered, both ways.
    pub(crate) frames: u64,
    /// Steps taken.
    pub(crate) steps: u64,
    /// Revocations confirmed.
    pub(crate) revocations: usize,
    /// Pongs received.
    pub(crate) pongs: usize,
    /// How the server's side ended, if it did (`Some(None)`: as it should).
    pub(crate) server_end: Option<Option<String>>,
}

/// A waker that sets a flag.
#[derive(Debug, Default)]
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Something the client waits on: woken, or not yet.
#[derive(Debug, Clone)]
struct Wait(Arc<Flag>);

impl Wait {
    /// A wait that looks at once.
    fn new() -> Wait {
        let w = Wait(Arc::new(Flag::default()));
        w.0 .0.store(true, Ordering::SeqCst);
        w
    }

    /// Whether it was woken since it last looked; looking clears it.
    fn woken(&self) -> bool {
        self.0 .0.swap(false, Ordering::SeqCst)
    }

    fn waker(&self) -> Waker {
        Waker::from(self.0.clone())
    }
}

/// A call of the client.
#[derive(Debug)]
struct ClientCall {
    wait: Wait,
    deadline: Option<Instant>,
}

/// The client application.
struct ClientApp {
    to_open: usize,
    /// Waiting for room in the window: its place in line.
    line: Option<(Option<u64>, Wait)>,
    calls: HashMap<u64, ClientCall>,
    /// How each call ended, by id: more than one end is a rule broken.
    ends: HashMap<u64, u32>,
    /// Calls that ended with their response.
    responded: HashSet<u64>,
    /// Calls the client gave up on.
    abandoned: HashSet<u64>,
    pings: HashMap<u64, Wait>,
    /// Offers made: id → revoking (with its wait), or live.
    offers: HashMap<u64, Option<Wait>>,
    left: bool,
    /// Pings sent and offers made (each run makes a bounded number).
    pinged: u32,
    offered: u32,
}

/// A call the server started.
#[derive(Debug)]
struct ServerCall {
    events: SimCall,
    /// A grant was sent: the call waits for the client's ack.
    granted: bool,
    /// The call ended early (cancelled, its deadline passed, or its connection ended): it
    /// answers at once.
    ended: bool,
    deadline: Option<Instant>,
}

/// The server application.
struct ServerApp {
    calls: HashMap<u64, ServerCall>,
    started: usize,
    /// Calls answered, by id: more than once is a rule broken.
    answered: HashMap<u64, u32>,
    stopping: bool,
    /// Uses in flight of the client's offers, by offer.
    uses: HashMap<u64, u32>,
}

/// Everything one run holds.
struct World {
    rng: Rng,
    scenario: Scenario,
    client: Connection<Sim>,
    server: Connection<Sim>,
    link: Link,
    c: ClientApp,
    s: ServerApp,
    now: Instant,
    journal: Shared,
    out: Outcome,
    /// Offers the client made, as the server learns them (out of band, as in a message).
    handles: Vec<HandleView>,
    /// Offers whose revocation the client saw confirmed.
    confirmed: HashSet<u64>,
}

const INLINE: u32 = 1024;
const SLOT: u64 = 4096;

/// Runs `scenario` under the schedule of `seed`. `Err` says which rule broke, and when.
pub(crate) fn run(seed: u64, scenario: &Scenario) -> Result<Outcome, String> {
    let now = Instant::now();
    let journal: Shared = Arc::new(std::sync::Mutex::new(Journal::default()));
    let client = Connection::client(
        ClientSettings {
            max_frame: 4096,
            initial_receives: scenario.receives[0].0,
            recv_credits: scenario.receives[0].1,
            max_in_flight: scenario.depth as u32,
            inline_threshold: INLINE,
            stream_window: 0,
            token: 0xc11e,
        },
        Arc::from("server"),
    );
    let server = Connection::server(
        ServerSettings {
            max_frame: 4096,
            initial_receives: scenario.receives[1].0,
            recv_credits: scenario.receives[1].1,
            max_in_flight: scenario.max_in_flight,
            inline_threshold: INLINE,
            pull_writes: false,
            stream_window: 0,
            token: 0x5e7e,
            write_slots: scenario.slots,
            handshake_timeout: Duration::from_secs(5),
            idle_timeout: None,
            max_pings_per_second: 0,
            refusal: None,
        },
        Arc::from("client"),
        now,
    );
    let link = Link {
        posted: [
            scenario.receives[0].0.min(scenario.receives[0].1),
            scenario.receives[1].0.min(scenario.receives[1].1),
        ],
        ..Link::default()
    };
    let mut world = World {
        rng: Rng::new(seed),
        scenario: scenario.clone(),
        client,
        server,
        link,
        c: ClientApp {
            to_open: scenario.calls,
            line: None,
            calls: HashMap::new(),
            ends: HashMap::new(),
            responded: HashSet::new(),
            abandoned: HashSet::new(),
            pings: HashMap::new(),
            offers: HashMap::new(),
            left: false,
            pinged: 0,
            offered: 0,
        },
        s: ServerApp {
            calls: HashMap::new(),
            started: 0,
            answered: HashMap::new(),
            stopping: false,
            uses: HashMap::new(),
        },
        now,
        journal,
        out: Outcome::default(),
        handles: Vec::new(),
        confirmed: HashSet::new(),
    };
    world.run().map_err(|e| format!("seed {seed}: {e}"))?;
    Ok(world.out)
}

impl World {
    fn run(&mut self) -> Result<(), String> {
        let mut idle = 0u32;
        loop {
            self.out.steps += 1;
            if self.out.steps > 2_000_000 {
                return Err("no end after 2,000,000 steps".into());
            }
            let progressed = self.step()?;
            self.flush()?;
            self.check_journal()?;
            self.check_deadlines()?;
            if self.done() {
                return self.finish();
            }
            idle = if progressed { 0 } else { idle + 1 };
            if idle > 10_000 {
                return Err(format!(
                    "stalled: {} calls open, {} to open, frames in flight {:?}, posted {:?}, \
                     client {:?}, server {:?}",
                    self.c.calls.len(),
                    self.c.to_open,
                    [self.link.in_flight[0].len(), self.link.in_flight[1].len()],
                    self.link.posted,
                    self.client,
                    self.server
                ));
            }
        }
    }

    /// Whether the run is over: every call ended, and the connection ended or nothing is in
    /// flight any more.
    fn done(&self) -> bool {
        let calls_done = self.c.to_open == 0 && self.c.calls.is_empty() && self.c.line.is_none();
        let quiet = self.link.in_flight.iter().all(|q| q.is_empty());
        let over = self.link.seen_end[0] && self.link.seen_end[1];
        calls_done && (over || (quiet && !self.scenario.leave_at_end && self.s.calls.is_empty()))
    }

    fn step(&mut self) -> Result<bool, String> {
        if self.scenario.fail_one_in > 0
            && self.rng.one_in(self.scenario.fail_one_in)
            && !self.link.failed
        {
            self.link.failed = true;
            self.link.in_flight = Default::default();
            return Ok(true);
        }
        Ok(match self.rng.below(10) {
            0 | 1 => self.client_step()?,
            2 | 3 => self.server_step()?,
            4..=6 => self.deliver(1)?,
            7..=8 => self.deliver(0)?,
            _ => {
                self.now += Duration::from_millis(self.rng.below(20));
                // Each side's timer, as its connection task keeps it: at the instant the state
                // asks for.
                if self.server.poll_timeout().is_some_and(|at| at <= self.now) {
                    self.server.handle_timeout(self.now);
                }
                if self.client.poll_timeout().is_some_and(|at| at <= self.now) {
                    self.client.handle_timeout(self.now);
                }
                true
            }
        })
    }

    /// Every call whose deadline passed was woken (to be told, or to take its response, or to
    /// learn the connection ended), and the client's timer comes no later than the deadline of
    /// any call still waiting.
    fn check_deadlines(&self) -> Result<(), String> {
        let timer = self.client.poll_timeout();
        for (id, call) in &self.c.calls {
            let Some(deadline) = call.deadline else {
                continue;
            };
            if call.wait.0 .0.load(Ordering::SeqCst) || self.link.seen_end[0] {
                continue; // it looks at its events at its next turn
            }
            deadline_kept(("call", "woken", "client"), *id, deadline, self.now, timer)
                .map_err(|e| format!("step {}: {e}", self.out.steps))?;
        }
        // The server's calls: told once their deadline passed (an end in their events), and
        // the server's timer no later than the deadline of any call still running.
        let timer = self.server.poll_timeout();
        for (id, call) in &self.s.calls {
            let Some(deadline) = call.deadline else {
                continue;
            };
            if call.ended || self.link.seen_end[1] || self.server.end().is_some() {
                continue;
            }
            let told = call
                .events
                .0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .any(|e| matches!(e, CallEvent::End(_)));
            if told {
                continue;
            }
            deadline_kept(
                ("server call", "told", "server"),
                *id,
                deadline,
                self.now,
                timer,
            )
            .map_err(|e| format!("step {}: {e}", self.out.steps))?;
        }
        Ok(())
    }

    /// Moves both sides' frames to the link, and tells each side that saw its connection end.
    fn flush(&mut self) -> Result<(), String> {
        for _ in 0..3 {
            self.link.flush(0, &mut self.client);
            self.link.flush(1, &mut self.server);
        }
        for side in 0..2 {
            if let Some(error) = self.link.ended_for(side) {
                self.link.seen_end[side] = true;
                let conn = if side == 0 {
                    &mut self.client
                } else {
                    &mut self.server
                };
                // Before the windows go: a connection that ended reaches no memory any more.
                journal(&self.journal).over = true;
                conn.handle_lost(error);
                conn.closed();
            }
        }
        Ok(())
    }

    fn check_journal(&self) -> Result<(), String> {
        let j = journal(&self.journal);
        match j.broken.first() {
            Some(broken) => Err(format!("step {}: {broken}", self.out.steps)),
            None => Ok(()),
        }
    }

    fn deliver(&mut self, to: usize) -> Result<bool, String> {
        let conn = if to == 0 {
            &mut self.client
        } else {
            &mut self.server
        };
        let incoming = self
            .link
            .deliver(to, conn, self.now)
            .map_err(|e| format!("step {}: {e}", self.out.steps))?;
        if let Some(incoming) = incoming {
            self.server_incoming(incoming)?;
        }
        Ok(true)
    }

    fn end(&mut self, id: u64, how: &str) -> Result<(), String> {
        let n = self.c.ends.entry(id).or_default();
        *n += 1;
        if *n > 1 {
            return Err(format!("call {id} ended twice (the second time: {how})"));
        }
        Ok(())
    }

    // The client application.

    /// The client gives call `id` up (`how`): the server is told, the window the call offered
    /// stays up until its answer.
    fn give_up(&mut self, id: u64, how: &str) -> Result<(), String> {
        let window = SimWindow {
            len: 64,
            call: Some(id),
            journal: self.journal.clone(),
        };
        self.client.abandon(id, [window]);
        self.c.calls.remove(&id);
        self.c.abandoned.insert(id);
        self.end(id, how)
    }

    fn client_step(&mut self) -> Result<bool, String> {
        let mut progressed = false;
        // Calls woken: take their events.
        let ids: Vec<u64> = self.c.calls.keys().copied().collect();
        for id in ids {
            let wait = self.c.calls[&id].wait.clone();
            if !wait.woken() {
                continue;
            }
            let waker = wait.waker();
            let cx = Context::from_waker(&waker);
            loop {
                match self.client.poll_event(id, &cx) {
                    Poll::Pending => break,
                    Poll::Ready(None) => {
                        self.c.calls.remove(&id);
                        self.out.ended += 1;
                        self.end(id, "connection over")?;
                        progressed = true;
                        break;
                    }
                    Poll::Ready(Some(ServerEvent::Grant(g))) => {
                        let _ = self.client.send(Kind::Ack(AckFrame {
                            id: g.id,
                            reply_to: None,
                        }));
                        progressed = true;
                    }
                    Poll::Ready(Some(ServerEvent::DeadlinePassed)) => {
                        let deadline = self.c.calls[&id].deadline;
                        if deadline.is_none_or(|d| d > self.now) {
                            return Err(format!(
                                "call {id} was told its deadline ({deadline:?}) passed before it \
                                 did"
                            ));
                        }
                        // As the client's call does: it gives the call up.
                        self.give_up(id, "deadline passed")?;
                        self.out.expired += 1;
                        progressed = true;
                        break;
                    }
                    Poll::Ready(Some(ServerEvent::Response(r))) => {
                        if r.id != id {
                            return Err(format!("call {id} got the response of call {}", r.id));
                        }
                        if r.status
                            .as_ref()
                            .is_some_and(|s| s.message.contains("write slot"))
                        {
                            return Err(format!("call {id}'s slot was refused: {:?}", r.status));
                        }
                        self.c.calls.remove(&id);
                        self.c.responded.insert(id);
                        self.out.responses += 1;
                        self.end(id, "response")?;
                        progressed = true;
                        break;
                    }
                }
            }
        }
        // Pings woken.
        let pings: Vec<u64> = self.c.pings.keys().copied().collect();
        for id in pings {
            let wait = self.c.pings[&id].clone();
            if !wait.woken() {
                continue;
            }
            let waker = wait.waker();
            match self.client.poll_pong(id, &Context::from_waker(&waker)) {
                Poll::Pending => {}
                Poll::Ready(answered) => {
                    self.c.pings.remove(&id);
                    if answered.is_ok() {
                        self.out.pongs += 1;
                    }
                    progressed = true;
                }
            }
        }
        // Revocations woken.
        let revoking: Vec<(u64, Wait)> = self
            .c
            .offers
            .iter()
            .filter_map(|(&o, w)| w.clone().map(|w| (o, w)))
            .collect();
        for (offer, wait) in revoking {
            if !wait.woken() {
                continue;
            }
            let waker = wait.waker();
            if self
                .client
                .poll_revoked(offer, &Context::from_waker(&waker))
                .is_ready()
            {
                self.client.forget_offer(offer);
                self.c.offers.remove(&offer);
                if self.client.end().is_none() {
                    // Confirmed by the peer: it has no use of it in flight, and takes no
                    // new one.
                    if self.s.uses.get(&offer).copied().unwrap_or(0) > 0 {
                        return Err(format!(
                            "offer {offer}'s revocation confirmed with uses in flight"
                        ));
                    }
                    self.confirmed.insert(offer);
                    self.out.revocations += 1;
                }
                progressed = true;
            }
        }
        progressed |= self.client_act()?;
        Ok(progressed)
    }

    /// One thing the client application decides to do.
    fn client_act(&mut self) -> Result<bool, String> {
        if self.c.left {
            return Ok(false);
        }
        match self.rng.below(8) {
            0..=3 => self.open_call(),
            4 if self.scenario.cancel_one_in > 0
                && self.rng.one_in(self.scenario.cancel_one_in) =>
            {
                let Some(&id) = self
                    .c
                    .calls
                    .keys()
                    .nth(self.rng.below(self.c.calls.len().max(1) as u64) as usize)
                else {
                    return Ok(false);
                };
                self.give_up(id, "abandoned")?;
                self.out.abandoned += 1;
                Ok(true)
            }
            5 if self.scenario.pings && self.c.pings.len() < 4 && self.c.pinged < 40 => {
                match self.client.ping() {
                    Ok(id) => {
                        self.c.pinged += 1;
                        self.c.pings.insert(id, Wait::new());
                        Ok(true)
                    }
                    Err(_) => Ok(false),
                }
            }
            6 if self.scenario.offers => Ok(self.offer_or_revoke()),
            7 if self.scenario.leave_at_end
                && self.c.to_open == 0
                && self.c.calls.is_empty()
                && self.c.line.is_none() =>
            {
                self.c.left = true;
                // Leaving closes the connection: the server reaches none of its memory after.
                journal(&self.journal).over = true;
                self.client.leave();
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn open_call(&mut self) -> Result<bool, String> {
        if self.c.to_open == 0 || self.c.calls.len() >= self.scenario.depth {
            return Ok(false);
        }
        let (mut ticket, wait) = self.c.line.take().unwrap_or((None, Wait::new()));
        if !wait.woken() {
            self.c.line = Some((ticket, wait));
            return Ok(false);
        }
        let waker = wait.waker();
        match self
            .client
            .poll_room(&mut ticket, &Context::from_waker(&waker))
        {
            Poll::Pending => {
                self.c.line = Some((ticket, wait));
                Ok(false)
            }
            Poll::Ready(Err(_)) => {
                self.c.to_open -= 1;
                self.out.not_opened += 1;
                Ok(true)
            }
            Poll::Ready(Ok(())) => {
                self.c.to_open -= 1;
                // Half to twice the scenario's: a later call's deadline may come first.
                let deadline = self
                    .scenario
                    .deadline
                    .map(|d| self.now + d * (1 + self.rng.below(4) as u32) / 2);
                let id = self.client.open_call(None, deadline);
                let len = match self.rng.below(3) {
                    0 => 64,
                    1 => u64::from(INLINE) + 1 + self.rng.below(SLOT - u64::from(INLINE)),
                    _ => SLOT * 2,
                };
                let mut request = RequestFrame {
                    id,
                    path: Bytes::from_static(b"/sim"),
                    op: 1,
                    payload_len: len,
                    ..Default::default()
                };
                if len <= u64::from(INLINE) {
                    request.inline_payload = Some(Bytes::from(vec![7u8; len as usize]));
                } else if let Some((index, window)) = self.client.take_slot(len as usize) {
                    if window.len < len {
                        return Err("a slot too small was handed out".into());
                    }
                    request.slot = Some(index);
                }
                if self.client.send(Kind::Request(request)).is_err() {
                    // The connection ended between the room and the request.
                }
                self.c.calls.insert(
                    id,
                    ClientCall {
                        wait: Wait::new(),
                        deadline,
                    },
                );
                Ok(true)
            }
        }
    }

    fn offer_or_revoke(&mut self) -> bool {
        if self.client.end().is_some() || !self.client.is_open() {
            return false;
        }
        let live: Vec<u64> = self
            .c
            .offers
            .iter()
            .filter(|(_, w)| w.is_none())
            .map(|(&o, _)| o)
            .collect();
        if live.len() < 3 && self.c.offered < 40 && self.rng.one_in(2) {
            self.c.offered += 1;
            let (offer, token) = self.client.new_offer();
            self.handles.push(HandleView {
                offer,
                connection: token,
                descriptor: Descriptor {
                    addr: offer * 4096,
                    len: 4096,
                    rkey: 1,
                    access: Access::REMOTE_READ | Access::REMOTE_WRITE,
                    blob: Bytes::new(),
                },
            });
            self.c.offers.insert(offer, None);
            return true;
        }
        let Some(&offer) = live.first() else {
            return false;
        };
        if self.client.revoke_offer(offer).is_ok() {
            self.c.offers.insert(offer, Some(Wait::new()));
            return true;
        }
        false
    }

    // The server application.

    fn server_incoming(&mut self, incoming: Incoming<Sim>) -> Result<(), String> {
        let now = self.now;
        let journal = self.journal.clone();
        let mut make = slot_windows(journal);
        match incoming {
            Incoming::Refused { id, status } => {
                if status.message().contains("write slot") {
                    return Err(format!("an honest client's slot was refused: {status}"));
                }
                self.answer_once(id)?;
                let _ = self.server.refuse(id, &status, &mut make);
            }
            Incoming::Request(admitted) => {
                let id = admitted.request.id;
                drop(admitted.slot); // revoked before the bytes are read
                if admitted.request.payload_len > u64::from(INLINE) {
                    self.server.want_slots();
                }
                if self.scenario.refuse_one_in > 0 && self.rng.one_in(self.scenario.refuse_one_in) {
                    self.answer_once(id)?;
                    let status = Status::permission_denied("the simulated application says no");
                    let _ = self.server.refuse(id, &status, &mut make);
                    return Ok(());
                }
                let events = SimCall::default();
                let deadline = self
                    .scenario
                    .server_deadline
                    .map(|d| admitted.arrived + d * (1 + self.rng.below(4) as u32) / 2);
                self.server.start_call(id, events.clone(), None, deadline);
                self.s.started += 1;
                self.s.calls.insert(
                    id,
                    ServerCall {
                        events,
                        granted: false,
                        ended: false,
                        deadline,
                    },
                );
                if self
                    .scenario
                    .shutdown_after
                    .is_some_and(|n| self.s.started >= n)
                    && !self.s.stopping
                {
                    self.s.stopping = true;
                    self.server.shutdown();
                }
            }
        }
        let _ = now;
        Ok(())
    }

    fn answer_once(&mut self, id: u64) -> Result<(), String> {
        let n = self.s.answered.entry(id).or_default();
        *n += 1;
        if *n > 1 {
            return Err(format!("the server answered call {id} twice"));
        }
        journal(&self.journal).answered.insert(id);
        Ok(())
    }

    fn server_step(&mut self) -> Result<bool, String> {
        // The client's frames about calls.
        let mut progressed = false;
        for (id, call) in self.s.calls.iter_mut() {
            while let Some(event) = call.events.take() {
                progressed = true;
                match event {
                    CallEvent::Ack(_) => call.granted = false,
                    CallEvent::End(EndReason::DeadlinePassed) => {
                        if call.deadline.is_none_or(|d| d > self.now) {
                            return Err(format!(
                                "server call {id} was told its deadline ({:?}) passed before \
                                 it did",
                                call.deadline
                            ));
                        }
                        if !call.ended {
                            self.out.server_expired += 1;
                        }
                        call.ended = true;
                    }
                    CallEvent::End(_) => call.ended = true,
                }
            }
        }
        // A use of the client's memory begins or ends.
        if self.scenario.offers && !self.handles.is_empty() && self.rng.one_in(3) {
            let h = self.handles[self.rng.below(self.handles.len() as u64) as usize].clone();
            let in_use = self.s.uses.get(&h.offer).copied().unwrap_or(0);
            if in_use > 0 && self.rng.one_in(2) {
                self.server.end_use(h.offer);
                *self.s.uses.entry(h.offer).or_default() -= 1;
            } else {
                match self.server.begin_use(&h, 0, 64, AccessKind::Write) {
                    Ok(_) => {
                        if self.confirmed.contains(&h.offer) {
                            return Err(format!(
                                "offer {} used after its revocation was confirmed",
                                h.offer
                            ));
                        }
                        *self.s.uses.entry(h.offer).or_default() += 1;
                    }
                    Err(Refusal::Revoked) => {}
                    Err(other) => {
                        return Err(format!("a use of offer {} refused: {other:?}", h.offer))
                    }
                }
            }
            progressed = true;
        }
        // Answer a call.
        let ready: Vec<u64> = self
            .s
            .calls
            .iter()
            .filter(|(_, c)| !c.granted || c.ended)
            .map(|(&id, _)| id)
            .collect();
        if ready.is_empty() {
            return Ok(progressed);
        }
        let id = ready[self.rng.below(ready.len() as u64) as usize];
        let call = &self.s.calls[&id];
        let ended = call.ended;
        if !ended
            && self.scenario.grant_one_in > 0
            && self.rng.one_in(self.scenario.grant_one_in)
            && self.server.end().is_none()
        {
            let grant = GrantFrame {
                id,
                window: Some(DescriptorFrame {
                    addr: 0x1000,
                    len: 64,
                    rkey: 9,
                    access: Access::REMOTE_WRITE.bits(),
                    blob: Bytes::new(),
                }),
                need_buffer: 0,
            };
            if self.server.send(Kind::Grant(grant)).is_ok() {
                self.s.calls.get_mut(&id).expect("listed above").granted = true;
                return Ok(true);
            }
        }
        self.s.calls.remove(&id);
        self.answer_once(id)?;
        let response = if ended {
            ResponseFrame {
                id,
                status: Some(StatusFrame::from(&Status::cancelled("ended early"))),
                ..Default::default()
            }
        } else {
            ResponseFrame {
                id,
                metadata: Bytes::from_static(b"ok"),
                ..Default::default()
            }
        };
        let mut make = slot_windows(self.journal.clone());
        let now = self.now;
        let _ = self.server.respond(response, || now, &mut make);
        Ok(true)
    }

    fn finish(&mut self) -> Result<(), String> {
        self.out.frames = self.link.delivered;
        let opened = self.scenario.calls - self.out.not_opened;
        let ended: usize = self.c.ends.values().map(|&n| n as usize).sum();
        if ended != opened {
            return Err(format!("{opened} calls opened, {ended} ended"));
        }
        // Reading the clock costs a small call a fiftieth of its time: the client's frames
        // (responses, grants, pongs, goodbyes) need none.
        if self.link.clock_reads[0] > 0 {
            return Err(format!(
                "the client read the clock {} times to handle frames",
                self.link.clock_reads[0]
            ));
        }
        if let Some(end) = self.server.end() {
            self.out.server_end = Some(end.error.as_ref().map(|e| e.to_string()));
            if let Some(e) = &end.error {
                if !self.link.failed && !self.link.closed_by[0] {
                    return Err(format!("the server ended with an error: {e}"));
                }
            }
        }
        if self.s.stopping && !self.link.failed {
            // Every call the server started was answered.
            let unanswered: Vec<&u64> = self.s.calls.keys().collect();
            if !unanswered.is_empty() && !self.link.closed_by[0] {
                return Err(format!("shut down with calls unanswered: {unanswered:?}"));
            }
            // A graceful end loses nothing: every answer the server gave reached the client
            // (short of credits or not), unless the client gave up on the call.
            if !self.link.closed_by[0] {
                let answered = journal(&self.journal).answered.clone();
                let lost: Vec<u64> = answered
                    .into_iter()
                    .filter(|id| !self.c.responded.contains(id) && !self.c.abandoned.contains(id))
                    .collect();
                if !lost.is_empty() {
                    return Err(format!(
                        "the server shut down and its answers to {lost:?} never reached the \
                         client"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A call still waiting (not woken, not told) with `deadline`: the deadline has not passed,
/// and its side's `timer` comes no later. `who` names the call, what it should have been, and
/// its side.
fn deadline_kept(
    (call, missed, side): (&str, &str, &str),
    id: u64,
    deadline: Instant,
    now: Instant,
    timer: Option<Instant>,
) -> Result<(), String> {
    if deadline <= now {
        return Err(format!(
            "{call} {id}'s deadline passed and it was not {missed}"
        ));
    }
    if timer.is_none_or(|at| at > deadline) {
        return Err(format!(
            "{call} {id}'s deadline comes before the {side}'s timer ({timer:?})"
        ));
    }
    Ok(())
}

/// Windows for the write slots the server arms.
fn slot_windows(journal: Shared) -> impl FnMut() -> Option<(SimWindow, DescriptorFrame)> {
    let mut n = 0u64;
    move || {
        n += 1;
        Some((
            SimWindow {
                len: SLOT,
                call: None,
                journal: journal.clone(),
            },
            DescriptorFrame {
                addr: 0x10_0000 + n * SLOT,
                len: SLOT,
                rkey: 3,
                access: Access::REMOTE_WRITE.bits(),
                blob: Bytes::new(),
            },
        ))
    }
}
