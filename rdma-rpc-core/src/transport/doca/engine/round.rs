//! What an owner does each round, in either mode: progress the context's engine (its own,
//! or the polling thread's), act on the events its callbacks recorded, and carry out the
//! commands other tasks sent.

use std::time::Instant;

use super::super::sys::PeDriver;
use super::callbacks::{self, Event};
use super::task::Kind;
use super::{receive, Cmd, Owner, PROGRESS_ROUNDS};
use crate::transport::RecvOpcode;

/// Callbacks gathered before their events are handled. DOCA's progress runs one callback per
/// call (the provider's strict reading of `doca_pe_progress`), so handling after each call
/// worked on one message at a time; with many connections each waited for its own cache
/// misses. Gathered, a first pass asks for every message's lines ([`Owner::handle_events`])
/// and the misses overlap. Small enough that a batch's messages are still in the cache when
/// the tasks it woke read them (see `event_loop::DELIVER_BATCH`, a multiple of it).
pub(in crate::transport::doca) const GATHER: usize = 16;

/// What a bounded round of progress did.
#[derive(Debug, Clone, Copy)]
pub(super) struct Progressed {
    /// Anything happened (a callback ran or an event was handled).
    pub(super) any: bool,
    /// The bound ran out while the engine still had work.
    pub(super) more: bool,
}

impl Owner {
    /// Progresses the owner's own engine until nothing happens; returns whether anything
    /// did. The event loop arms the engine's notification only after this (DOCA's loop:
    /// progress until it returns 0, then arm).
    pub(super) fn progress_all(&mut self) -> bool {
        self.progress_up_to(None, usize::MAX)
    }

    /// Progresses the context's engine at most `rounds` times, handling the events after each
    /// call; whether anything happened. The engine is the owner's own, or else `shared`, the
    /// polling thread's (lent by the thread, which drives it); with neither, only the events
    /// already recorded are handled. On an engine shared with other contexts, their events
    /// wait in their own sinks for their owners, and a busy neighbour is why `rounds` bounds
    /// the loop.
    pub(super) fn progress_up_to(&mut self, shared: Option<&mut PeDriver>, rounds: usize) -> bool {
        self.progress_bounded(shared, rounds).any
    }

    /// As [`Owner::progress_up_to`], also saying whether `rounds` ran out while the engine
    /// still had work.
    pub(super) fn progress_bounded(
        &mut self,
        shared: Option<&mut PeDriver>,
        rounds: usize,
    ) -> Progressed {
        let progressed = if let Some(mut own) = self.own_pe.take() {
            let progressed = self.drive(&mut own, rounds);
            self.own_pe = Some(own);
            progressed
        } else {
            match shared {
                Some(pe) => self.drive(pe, rounds),
                None => Progressed {
                    any: self.handle_events(),
                    more: false,
                },
            }
        };
        // What the completions of this round freed goes out together, with one doorbell.
        self.drain_freed();
        progressed
    }

    /// Up to `rounds` progress calls, their events handled [`GATHER`] at a time.
    fn drive(&mut self, pe: &mut PeDriver, rounds: usize) -> Progressed {
        let mut any = false;
        let mut calls = 0;
        let mut next_drain = PROGRESS_ROUNDS;
        while calls < rounds {
            let mut progressed = false;
            let gathered = calls + GATHER.min(rounds - calls);
            while calls < gathered {
                calls += 1;
                if !pe.progress() {
                    break;
                }
                progressed = true;
            }
            if !self.handle_events() && !progressed {
                return Progressed { any, more: false };
            }
            any = true;
            if calls >= next_drain {
                // A context that never runs dry still submits what its completions freed.
                self.drain_freed();
                next_drain = calls + PROGRESS_ROUNDS;
            }
        }
        Progressed { any, more: true }
    }

    /// Acts on the events the callbacks recorded, after a first pass that asks for their lines
    /// ([`Owner::prefetch`]); whether there were any.
    fn handle_events(&mut self) -> bool {
        if !self.sink.has_events() {
            return false;
        }
        let mut events = std::mem::take(&mut self.events);
        self.sink.swap_into(&mut events);
        #[cfg(test)]
        if let Some(shared) = self.shared.upgrade() {
            shared
                .gathered
                .fetch_max(events.len(), std::sync::atomic::Ordering::Relaxed);
        }
        if events.len() > 1 {
            self.prefetch(&events);
        }
        for e in events.drain(..) {
            self.on_event(e);
        }
        self.events = events;
        true
    }

    /// The first pass over a batch of events: asks for what handling each will touch of its
    /// connection, so that with many connections the batch's cache misses overlap (see
    /// [`crate::prefetch`]). Changes nothing.
    fn prefetch(&self, events: &[Event]) {
        for e in events {
            let Event::Task {
                kind: Kind::Receive,
                user,
                recv: Some(r),
                ..
            } = e
            else {
                continue;
            };
            if let Some(shared) = self.live.get(&r.conn) {
                shared.prefetch(r.len as usize);
            }
            self.staging.prefetch(*user, r.len as usize);
        }
    }

    pub(super) fn expire_deadlines(&mut self) {
        if self.deadlines.next().is_some() {
            self.deadlines
                .expire(Instant::now(), self.config.rnr_timeout);
        }
    }

    fn on_event(&mut self, e: Event) {
        match e {
            Event::Task {
                kind: Kind::Receive,
                user,
                status,
                recv,
            } => self.on_receive(user, status, recv),
            Event::Task {
                kind, user, status, ..
            } => self.on_completion(kind, user, status),
            Event::Requested { conn, id, accepted } => self.on_requested(conn, id, accepted),
            Event::Established { conn, id } => self.on_established(conn, id),
            Event::Failed { id } => self.on_failed(id),
            Event::Disconnected { id } => self.on_disconnected(id),
        }
    }

    /// Handles a command. `shared` is the polling thread's engine driver when the owner is
    /// visited by the thread (busy-poll mode), `None` for an owner with an engine of its own.
    pub(super) fn handle(&mut self, cmd: Cmd, shared: Option<&mut PeDriver>) {
        // Counted off while the seat is held (see `EngineShared::post`).
        self.queued
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        match cmd {
            Cmd::Listen {
                port,
                accepted,
                reply,
            } => {
                let _ = reply.send(self.listen(port, accepted));
            }
            Cmd::StopListen { port } => self.stop_listen(port),
            Cmd::Connect {
                ip,
                port,
                peer,
                reply,
            } => self.connect(ip, port, peer, reply),
            Cmd::Export { reply } => {
                let _ = reply.send(self.export());
            }
            Cmd::ConnectOob {
                id,
                blob,
                peer,
                reply,
            } => {
                let _ = reply.send(self.connect_oob(id, &blob, peer));
            }
            Cmd::Op { id, op } => self.post(id, op),
            Cmd::Grow => self.grow_receives(),
            Cmd::Close { id, err } => {
                // Completions already in DOCA's queues come first: what the peer sent before
                // the connection ended is delivered, not dropped.
                self.progress_up_to(shared, PROGRESS_ROUNDS);
                self.fail_conn(id, err);
            }
        }
    }

    /// Registers and posts the staging receives the context's connections reserved.
    pub(super) fn grow_receives(&mut self) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let wanted = shared.receives.reserved();
        if let Err(e) = self.staging.ensure(wanted, &self.rdma, &self.inv) {
            // The reservations stand, so a peer may find no receive: say so loudly once.
            tracing::error!(
                error = %e,
                wanted,
                posted = self.staging.slots(),
                "could not register more DOCA staging receives"
            );
        }
    }

    /// A staging receive completed: hand its message to its connection, then repost it.
    fn on_receive(
        &mut self,
        user: u64,
        status: doca_sys::doca_error_t,
        recv: Option<callbacks::RecvResult>,
    ) {
        if let (true, Some(r)) = (status == doca_sys::DOCA_SUCCESS, recv) {
            // Borrowed, not cloned: a reference count written per message is one more
            // cache line made dirty, and with many connections it is cold.
            let shared = self.live.get(&r.conn);
            let (opcode, len) = match r.opcode {
                doca_sys::DOCA_RDMA_OPCODE_RECV_SEND => (RecvOpcode::Send, r.len as usize),
                doca_sys::DOCA_RDMA_OPCODE_RECV_SEND_WITH_IMM => {
                    (RecvOpcode::SendWithImm, r.len as usize)
                }
                _ => (RecvOpcode::WriteWithImm, 0),
            };
            match (shared, self.staging.message(user, len)) {
                (Some(shared), Some(data)) => receive::deliver(
                    shared,
                    data,
                    opcode,
                    r.imm,
                    &mut self.deadlines,
                    self.config.rnr_timeout,
                ),
                _ => tracing::debug!("DOCA receive for an unknown or closed connection dropped"),
            }
        } else if status != doca_sys::DOCA_ERROR_CONNECTION_ABORTED {
            tracing::debug!(
                error = %super::super::sys::error_name(status),
                "a DOCA receive failed (a message larger than max_recv_size?)"
            );
        }
        // Not `doca_ctx_get_state` per message: the context runs from the end of its setup until
        // the owner stops it, and a context that stops on its own refuses the repost.
        self.staging.recycle(user, !self.stop_begun);
    }
}
