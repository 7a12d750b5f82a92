//! Receive matching.
//!
//! DOCA's receives belong to the context and match a send from any of its connections, while
//! the transport traits give each connection its own posted receive buffers. So the owner
//! keeps staging receives posted on the context ([`Staging`]), and for each message that
//! arrives copies it into the next buffer its connection posted ([`ConnShared::on_message`]).
//! A message for a connection with no posted buffer waits, within the RNR budget, for one:
//! the owner keeps one deadline per early message ([`Deadlines`]) and fails the connection
//! with receiver-not-ready when it passes; no timer task per message.
//!
//! Staging receives are posted when the context's first connection is established (NVIDIA's
//! CPU samples post receives after establishment, never on a context with no connection).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use doca_sys as sys;
use tokio::sync::watch;

use super::super::sys::{Buf, Inventory, Mmap, Rdma};
use super::task::{Doorbell, Source, Submitted, Task, TaskBufs};
use super::{Cmd, ConnId, EngineShared};
use crate::error::{Error, Result};
use crate::memory::{Access, RegisteredBuf};
use crate::transport::common::RecvQueue;
use crate::transport::{RecvCompletion, RecvOpcode};

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A message that arrived for a connection with no posted receive yet.
struct Arrival {
    seq: u64,
    data: Vec<u8>,
    opcode: RecvOpcode,
    imm: Option<u32>,
}

/// In this order (`repr(C)`), behind its lock word, in the line-aligned `ConnShared::state`:
/// what every message and every posted receive reads (the posted receives, the reservation,
/// `taken`, the staging receive size, and the start of the error, which a message checks)
/// comes first, in the lock's own cache line (`a_connections_hot_fields_share_their_cache_lines`).
/// Laid out by the compiler, the error fell in the next line, and with 1,000 connections each
/// message missed the cache twice on the state before anything else.
#[repr(C)]
struct ConnState {
    posted: VecDeque<Posted>,
    /// Staging receives of the context this connection reserved: the most receives it had
    /// posted at once (at least one), so never fewer than the credits its peer may hold.
    reserved: usize,
    /// The application posted a receive. Until then it is still taking the connection (a
    /// server accepting it): the peer's first message, its handshake, may come first and
    /// waits for that receive without the RNR budget, which would otherwise end connections
    /// that a busy server takes late (a burst of a thousand connects on a loaded machine).
    taken: bool,
    /// Bytes of the context's staging receives (`Receives::slot_size`), copied here so that
    /// a posted receive is checked against them in this line.
    slot_size: u32,
    error: Option<Error>,
    arrived: VecDeque<Arrival>,
    next_seq: u64,
}

/// A posted receive, and the address of its first byte (taken when it is posted, while the
/// poster has the buffer in its cache: reading it off the buffer later costs its region).
struct Posted {
    data: usize,
    buf: RegisteredBuf,
}

/// Where the next message for a connection will be copied: its first posted receive's bytes,
/// its region (whose header the copy checks) and its entry in the queue of posted receives.
/// Written under the state's lock whenever the first posted receive changes, read without it
/// by the owner's first pass over a batch of events (`Owner::prefetch`), which only asks the
/// CPU for those lines: a value read while it changes costs a useless prefetch, nothing else.
#[derive(Default)]
struct NextReceive {
    data: AtomicUsize,
    region: AtomicUsize,
    entry: AtomicUsize,
}

impl NextReceive {
    /// Records `first`, the first posted receive now (`None`: no receive is posted).
    fn set(&self, first: Option<&Posted>) {
        let (data, region, entry) = first.map_or((0, 0, 0), |p| {
            (p.data, p.buf.region_addr(), std::ptr::from_ref(p) as usize)
        });
        self.data.store(data, Ordering::Relaxed);
        self.region.store(region, Ordering::Relaxed);
        self.entry.store(entry, Ordering::Relaxed);
    }

    /// Asks for the lines of the next message's copy, `len` bytes.
    fn prefetch(&self, len: usize) {
        let data = self.data.load(Ordering::Relaxed);
        if data == 0 {
            return;
        }
        crate::prefetch::bytes(data as *const u8, len);
        crate::prefetch::line(self.region.load(Ordering::Relaxed) as *const u8);
        crate::prefetch::bytes(
            self.entry.load(Ordering::Relaxed) as *const u8,
            std::mem::size_of::<Posted>(),
        );
    }
}

/// A value that starts a cache line.
#[repr(align(64))]
struct LineAligned<T>(T);

/// The state of one connection shared by its application handle and the owner.
///
/// Laid out in cache lines (`repr(C)`; the state and the completions start lines of their
/// own): the first holds what every operation reads without a lock (the engine, the id, and
/// whether the connection failed) and where the next message goes (`NextReceive`); the next,
/// the lock of the receive state and what each message reads under it (see `ConnState`); then
/// the completions (see `RecvQueue`); the peer's name, for errors, last. With 1,000
/// connections a message touches each of them once, and each costs a cache miss.
#[repr(C)]
pub(in super::super) struct ConnShared {
    pub(in super::super) engine: Arc<EngineShared>,
    pub(in super::super) id: ConnId,
    /// Set (under the state's lock) with the state's error: lets an operation check that the
    /// connection has not failed without taking the lock.
    failed: AtomicBool,
    pub(in super::super) closed: watch::Sender<bool>,
    next: NextReceive,
    state: LineAligned<Mutex<ConnState>>,
    pub(in super::super) completions: RecvQueue,
    pub(in super::super) peer: String,
}

impl ConnShared {
    pub(super) fn new(id: ConnId, peer: String, engine: Arc<EngineShared>) -> Arc<ConnShared> {
        // Staging receives are at most `MAX_BUFFER` (1 GiB) each.
        let slot_size = u32::try_from(engine.receives.slot_size).unwrap_or(u32::MAX);
        Arc::new(ConnShared {
            engine,
            id,
            failed: AtomicBool::new(false),
            closed: watch::channel(false).0,
            next: NextReceive::default(),
            peer,
            state: LineAligned(Mutex::new(ConnState {
                posted: VecDeque::new(),
                reserved: 1,
                taken: false,
                slot_size,
                error: None,
                arrived: VecDeque::new(),
                next_seq: 0,
            })),
            completions: RecvQueue::new(),
        })
    }

    /// The error the connection ended with (or a generic one while it is alive).
    pub(in super::super) fn error(&self) -> Error {
        match &lock(&self.state.0).error {
            Some(e) => e.duplicate(),
            None => Error::ConnectionClosed {
                peer: self.peer.clone(),
                reason: "the operation was dropped".into(),
            },
        }
    }

    /// Asks for the lines a message of `len` bytes for this connection touches: its receive
    /// state (the lock and the posted receives), its completion queue, and the posted receive
    /// it will be copied into (see [`crate::prefetch`]).
    pub(super) fn prefetch(&self, len: usize) {
        crate::prefetch::line(&self.state);
        self.completions.prefetch();
        self.next.prefetch(len);
    }

    /// Where the owner's first pass expects this connection's next message to be copied (0
    /// for nowhere).
    #[cfg(test)]
    pub(in super::super) fn next_receive(&self) -> usize {
        self.next.data.load(Ordering::Relaxed)
    }

    pub(in super::super) fn current_error(&self) -> Option<Error> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.state.0).error.as_ref().map(Error::duplicate)
    }

    /// Messages that arrived before a receive was posted for them, kept until one is (for
    /// tests that must see a message arrive early).
    #[cfg(test)]
    pub(in super::super) fn early_messages(&self) -> usize {
        lock(&self.state.0).arrived.len()
    }

    /// Records the first error: posted receives are dropped and `closed` resolves. Returns
    /// whether this was the first error.
    pub(in super::super) fn fail(&self, err: Error) -> bool {
        let (posted, arrived) = {
            let mut st = lock(&self.state.0);
            if st.error.is_some() {
                return false;
            }
            tracing::debug!(peer = %self.peer, error = %err, "DOCA connection in error");
            st.error = Some(err);
            self.failed.store(true, Ordering::Release);
            self.next.set(None);
            (
                std::mem::take(&mut st.posted),
                std::mem::take(&mut st.arrived),
            )
        };
        drop((posted, arrived));
        self.completions.close();
        self.closed.send_replace(true);
        true
    }

    /// Fails the connection and tells the owner to disconnect it.
    pub(in super::super) fn fail_and_close(&self, err: Error) {
        if self.fail(err.duplicate()) {
            self.engine.send(Cmd::Close { id: self.id, err });
        }
    }

    /// A posted receive buffer from the application. A receive beyond the connection's
    /// earlier peak reserves one more staging receive of the context first (the peer may
    /// now hold one more credit), or fails if the context has none left to reserve.
    pub(in super::super) fn post_recv(&self, buf: RegisteredBuf) -> Result<()> {
        let mut st = lock(&self.state.0);
        if buf.capacity() > st.slot_size as usize {
            // The peer is told it may send this much, and DOCA's receives hold less.
            return Err(Error::LimitExceeded {
                limit: "DocaConfig::max_recv_size (a receive larger than the DOCA transport's \
                        staging receives: raise max_recv_size or lower max_frame)",
                max: u64::from(st.slot_size),
                actual: buf.capacity() as u64,
            });
        }
        if let Some(e) = &st.error {
            return Err(e.duplicate());
        }
        st.taken = true;
        let mut grew = false;
        match st.arrived.pop_front() {
            Some(a) => {
                let result = self.fill(buf, &a.data, a.opcode, a.imm);
                drop(st);
                if let Err(e) = result {
                    self.fail_and_close(e);
                }
            }
            None => {
                if st.posted.len() >= st.reserved {
                    let receives = &self.engine.receives;
                    if !receives.reserve(1) {
                        return Err(Error::LimitExceeded {
                            limit: "DocaConfig::recv_queue_size (staging receives of one DOCA \
                                    context, all reserved by its connections)",
                            max: receives.max as u64,
                            actual: receives.max as u64 + 1,
                        });
                    }
                    st.reserved += 1;
                    grew = true;
                }
                let data = buf.addr() as usize;
                st.posted.push_back(Posted { data, buf });
                if st.posted.len() == 1 {
                    self.next.set(st.posted.front());
                }
            }
        }
        if grew {
            // Ahead of any operation that could tell the peer about this receive.
            self.engine.send(Cmd::Grow);
        }
        Ok(())
    }

    /// The staging receives this connection reserved, given back once (it ended).
    pub(super) fn give_back_reserved(&self) -> usize {
        std::mem::take(&mut lock(&self.state.0).reserved)
    }

    fn fill(
        &self,
        mut buf: RegisteredBuf,
        data: &[u8],
        opcode: RecvOpcode,
        imm: Option<u32>,
    ) -> Result<()> {
        if data.len() > buf.capacity() {
            return Err(Error::ReceiveTooSmall {
                len: data.len() as u64,
                capacity: buf.capacity() as u64,
            });
        }
        buf.fill_from(data)?;
        self.completions.push(RecvCompletion {
            buf,
            opcode,
            imm,
            write_len: 0,
        });
        Ok(())
    }

    /// A message the context received for this connection (called by the owner with the
    /// bytes still in the staging receive). Copies it into the next posted receive, or keeps
    /// it until one is posted; then returns its sequence number, for the owner's deadline
    /// (none for the first message of a connection its application has not taken yet: see
    /// `ConnState::taken`; a second one before then has the RNR budget as any other).
    fn on_message(&self, data: &[u8], opcode: RecvOpcode, imm: Option<u32>) -> Option<u64> {
        let mut st = lock(&self.state.0);
        if st.error.is_some() {
            return None;
        }
        if let Some(Posted { buf, .. }) = st.posted.pop_front() {
            self.next.set(st.posted.front());
            let result = self.fill(buf, data, opcode, imm);
            drop(st);
            if let Err(e) = result {
                self.fail_and_close(e);
            }
            return None;
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        st.arrived.push_back(Arrival {
            seq,
            data: data.to_vec(),
            opcode,
            imm,
        });
        if !st.taken && st.arrived.len() == 1 {
            return None;
        }
        Some(seq)
    }

    /// The deadline of the early message `seq` passed: receiver not ready, unless a buffer
    /// was posted for it meanwhile.
    fn expire(&self, seq: u64, rnr: Duration) {
        let expired = lock(&self.state.0)
            .arrived
            .front()
            .is_some_and(|a| a.seq <= seq);
        if expired {
            self.fail_and_close(Error::ReceiverNotReady {
                retry_ms: rnr.as_millis() as u64,
            });
        }
    }
}

/// Deadlines of early messages, in arrival order (one RNR budget for all, so the order of
/// arrival is the order of expiry).
#[derive(Default)]
pub(super) struct Deadlines {
    queue: VecDeque<(Instant, Weak<ConnShared>, u64)>,
}

impl Deadlines {
    /// The earliest pending deadline.
    pub(super) fn next(&self) -> Option<Instant> {
        self.queue.front().map(|(at, _, _)| *at)
    }

    /// Fails the connections whose early messages waited past their deadline.
    pub(super) fn expire(&mut self, now: Instant, rnr: Duration) {
        while let Some((at, _, _)) = self.queue.front() {
            if *at > now {
                break;
            }
            let (_, conn, seq) = self.queue.pop_front().expect("checked");
            if let Some(conn) = conn.upgrade() {
                conn.expire(seq, rnr);
            }
        }
    }
}

/// Hands a received message to its connection.
pub(super) fn deliver(
    conn: &Arc<ConnShared>,
    data: &[u8],
    opcode: RecvOpcode,
    imm: Option<u32>,
    deadlines: &mut Deadlines,
    rnr: Duration,
) {
    if let Some(seq) = conn.on_message(data, opcode, imm) {
        deadlines
            .queue
            .push_back((Instant::now() + rnr, Arc::downgrade(conn), seq));
    }
}

/// User data of staging receives: this bit set, and the slot index.
pub(super) const RECV_TAG: u64 = 1 << 63;

/// Staging receives registered together: one registration (and one doorbell) per chunk.
pub(super) const CHUNK_SLOTS: usize = 64;

/// Staging receives kept posted beyond what the context's connections reserved: room for a
/// connection's first message while its reservation travels to the owner.
pub(super) const SPARE_SLOTS: usize = 16;

/// One staging receive: posted (owned by DOCA) or not yet posted.
struct Slot {
    chunk: usize,
    offset: usize,
    /// `None` before posting and once freed (after its flushed completion during a stop).
    task: Option<Submitted>,
}

/// Registered memory of [`CHUNK_SLOTS`] staging receives.
struct Chunk {
    // The mmap goes before the memory it covers.
    mmap: Arc<Mmap>,
    memory: RegisteredBuf,
}

/// The context's staging receives: slots of `slot_size` bytes, registered a chunk at a time
/// as the context's connections reserve them ([`Staging::ensure`]), never more than `max`.
/// Receives match any connection of the context, so what matters is the sum: the owner keeps
/// at least as many posted as its connections promised their peers (their posted receives),
/// and a peer that respects its credits can never find none (receiver not ready).
pub(super) struct Staging {
    slots: Vec<Slot>,
    slot_size: usize,
    max: usize,
    /// Whether receives may be posted (a connection of the context was established).
    open: bool,
    // Declared after the slots: their buffers go before the mmaps, the mmaps before the
    // memory.
    chunks: Vec<Chunk>,
}

impl Staging {
    pub(super) fn new(slot_size: usize, max: usize) -> Staging {
        Staging {
            slots: Vec::new(),
            slot_size,
            max,
            open: false,
            chunks: Vec::new(),
        }
    }

    /// Staging receives registered so far.
    pub(super) fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Receives may be posted from now on (the context's first established connection, as
    /// NVIDIA's CPU samples post them): posts every slot registered so far.
    pub(super) fn open(&mut self, rdma: &Rdma, inv: &Inventory) -> Result<()> {
        if std::mem::replace(&mut self.open, true) {
            return Ok(());
        }
        self.post_from(0, rdma, inv)
    }

    /// Makes sure `wanted` receives (plus [`SPARE_SLOTS`]) are registered, and posted once
    /// receives may be posted, up to the context's maximum: one registration per
    /// [`CHUNK_SLOTS`] slots, and one doorbell per chunk.
    pub(super) fn ensure(&mut self, wanted: usize, rdma: &Rdma, inv: &Inventory) -> Result<()> {
        let target = wanted.saturating_add(SPARE_SLOTS).min(self.max);
        while self.slots.len() < target {
            let first = self.slots.len();
            let count = CHUNK_SLOTS.min(self.max - first);
            let memory = RegisteredBuf::new(self.slot_size * count, Access::LOCAL_WRITE)?;
            // SAFETY: the chunk's memory is owned by its `Chunk` together with this mmap and
            // outlives it (field order in `Chunk`, chunks dropped after the slots).
            let mmap = Arc::new(unsafe {
                Mmap::local(
                    rdma.device(),
                    memory.ptr_at(0),
                    memory.capacity(),
                    sys::DOCA_ACCESS_FLAG_LOCAL_READ_WRITE,
                )
            }?);
            let chunk = self.chunks.len();
            self.chunks.push(Chunk { mmap, memory });
            self.slots.extend((0..count).map(|i| Slot {
                chunk,
                offset: i * self.slot_size,
                task: None,
            }));
            if self.open {
                self.post_from(first, rdma, inv)?;
            }
        }
        Ok(())
    }

    /// Posts the slots from index `first` on, ringing one doorbell for all of them.
    fn post_from(&mut self, first: usize, rdma: &Rdma, inv: &Inventory) -> Result<()> {
        let mut batch = Doorbell::new(rdma);
        for (i, slot) in self.slots.iter_mut().enumerate().skip(first) {
            let chunk = &self.chunks[slot.chunk];
            // SAFETY: the slot lies inside its chunk's memory, which only receives write into
            // and which outlives every buffer taken from it (field order above).
            let buf: Buf = unsafe {
                inv.buf(
                    &chunk.mmap,
                    chunk.memory.addr() + slot.offset as u64,
                    self.slot_size,
                    0,
                )
            }?;
            let task = Task::receive(rdma, &buf)?;
            match batch.submit(
                task,
                RECV_TAG | i as u64,
                TaskBufs::of(Some(Source::Own(buf)), None),
            ) {
                Ok(submitted) => slot.task = Some(submitted),
                Err((_task, code)) => {
                    batch.ring();
                    return Err(super::super::sys::doca_error("doca_task_submit_ex", code));
                }
            }
        }
        batch.ring();
        Ok(())
    }

    /// Whether the receives were posted (a stop must wait for their flushed completions).
    pub(super) fn outstanding(&self) -> usize {
        self.slots.iter().filter(|s| s.task.is_some()).count()
    }

    /// Asks for the record of slot `user` and the first lines of its message, `len` bytes.
    pub(super) fn prefetch(&self, user: u64, len: usize) {
        let Some(slot) = self.slots.get((user & !RECV_TAG) as usize) else {
            return;
        };
        if let Some(chunk) = self.chunks.get(slot.chunk) {
            let at = chunk.memory.addr() as usize + slot.offset;
            crate::prefetch::bytes(at as *const u8, len.min(self.slot_size));
        }
    }

    /// The bytes of a completed receive of slot `user`, still in place.
    pub(super) fn message(&self, user: u64, len: usize) -> Option<&[u8]> {
        let slot = self.slots.get((user & !RECV_TAG) as usize)?;
        let chunk = self.chunks.get(slot.chunk)?;
        let len = len.min(self.slot_size);
        // SAFETY: the receive completed, so DOCA is done writing its slot, which lies inside
        // its chunk's memory; the slot is not reposted before the caller is done.
        Some(unsafe { std::slice::from_raw_parts(chunk.memory.ptr_at(slot.offset), len) })
    }

    /// After a receive's completion: reposts it (`running`: the owner has not begun to stop
    /// the context) or frees it.
    pub(super) fn recycle(&mut self, user: u64, running: bool) {
        let Some(slot) = self.slots.get_mut((user & !RECV_TAG) as usize) else {
            return;
        };
        let Some(mut task) = slot.task.take() else {
            return;
        };
        if running {
            task.reset_bufs();
            // SAFETY: its completion was just delivered.
            let code = unsafe { task.resubmit() };
            if code == sys::DOCA_SUCCESS {
                slot.task = Some(task);
                return;
            }
            // BAD_STATE: the context left RUNNING on its own (it is stopping).
            if code != sys::DOCA_ERROR_BAD_STATE {
                tracing::warn!(
                    error = %super::super::sys::error_name(code),
                    "could not repost a DOCA receive"
                );
            }
        }
        // SAFETY: its completion was just delivered, and it was not resubmitted.
        drop(unsafe { task.completed() }.0);
    }
}

#[cfg(test)]
mod layout {
    use std::collections::VecDeque;
    use std::mem::{align_of, offset_of, size_of_val};
    use std::sync::Mutex;

    use super::{ConnShared, ConnState, LineAligned};

    /// What an operation reads without the lock is in the connection's first cache line, and
    /// what a message reads under the lock in the lock's own line (see `ConnShared`).
    #[test]
    fn a_connections_hot_fields_share_their_cache_lines() {
        assert_eq!(align_of::<ConnShared>(), 64);
        for (what, at, len) in [
            ("engine", offset_of!(ConnShared, engine), 8),
            ("id", offset_of!(ConnShared, id), 8),
            ("failed", offset_of!(ConnShared, failed), 1),
            (
                "next",
                offset_of!(ConnShared, next),
                std::mem::size_of::<super::NextReceive>(),
            ),
        ] {
            assert!(at + len <= 64, "{what} at {at} is past the first line");
        }
        assert_eq!(offset_of!(ConnShared, state) % 64, 0);
        let state = LineAligned(Mutex::new(ConnState {
            posted: VecDeque::new(),
            reserved: 1,
            taken: false,
            slot_size: 64,
            error: None,
            arrived: VecDeque::new(),
            next_seq: 0,
        }));
        let line = std::ptr::from_ref(&state) as usize;
        assert_eq!(line % 64, 0);
        let st = state.0.lock().unwrap();
        let at = |field: *const u8| field as usize - line;
        // Where in its 8 bytes and more `Option<Error>` keeps its tag is the compiler's
        // choice; the error begins in the line.
        for (what, offset, len) in [
            (
                "posted",
                at(std::ptr::from_ref(&st.posted).cast()),
                size_of_val(&st.posted),
            ),
            ("reserved", at(std::ptr::from_ref(&st.reserved).cast()), 8),
            ("taken", at(std::ptr::from_ref(&st.taken).cast()), 1),
            ("slot_size", at(std::ptr::from_ref(&st.slot_size).cast()), 4),
            ("error", at(std::ptr::from_ref(&st.error).cast()), 8),
        ] {
            assert!(
                offset + len <= 64,
                "{what} at {offset} is past the lock's line"
            );
        }
    }
}
