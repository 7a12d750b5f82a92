//! The simulated NIC: what a submitted task does. Sends wait for a receive on the peer context
//! (receiver not ready past the retry budget), receives take the oldest waiting send, and
//! reads, writes and atomics move bytes between registered memories as a NIC would, checked
//! against the exporting mmap. The C ABI that gets tasks here is in `tasks.rs`.

use super::memory::contains;
use super::tasks::check_bufs;
use super::*;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of data a (non-NULL) buffer describes.
fn data_len(w: &World, buf: H) -> usize {
    w.live_buf(buf).map_or(0, |b| b.data_len)
}

impl World {
    /// `doca_task_submit` (`flush`) and `doca_task_submit_ex`: validates and accepts the task
    /// (DOCA owns it from here on); with `flush`, starts every unflushed task of its context
    /// and then this one (one doorbell), otherwise leaves it unflushed.
    pub(super) fn submit(&mut self, function: &str, task: H, flush: bool) -> doca_error_t {
        // `doca_task_submit` does not validate the task: an invalid one is undefined on DOCA.
        // The provider refuses it (INVALID_VALUE) and records the call.
        let invalid = |why: &str| {
            violation(format!("{function}(task {task:#x}): {why}"));
            DOCA_ERROR_INVALID_VALUE
        };
        let Some(t) = self.tasks.get(&task) else {
            return invalid("not an allocated task");
        };
        if t.phase != Phase::Idle {
            violation(format!(
                "{function}(task {task:#x}): the task is already submitted"
            ));
            return DOCA_ERROR_IN_USE;
        }
        let (kind, rdma, conn) = (t.kind, t.rdma, t.conn);
        let (src, dst, result) = (t.src, t.dst, t.result);
        let Some(r) = self.rdmas.get(&rdma) else {
            return invalid("its context is gone");
        };
        if r.state != DOCA_CTX_STATE_RUNNING {
            return DOCA_ERROR_BAD_STATE;
        }
        let connected_once = r.connected_once;
        // A connection set with `*_set_rdma_connection` must be one of the task's context.
        if conn.is_some_and(|c| self.conns.get(&c).is_none_or(|c| c.rdma != rdma)) {
            return invalid("its connection is not a connection of the task's context");
        }
        if let Err(why) = check_bufs(self, kind, src, dst, result) {
            return invalid(why);
        }
        // Stricter choice: "no data" is spelled with a NULL buffer (documented); a non-NULL
        // buffer with an empty data section is refused.
        let empty_source = match kind {
            Kind::Send | Kind::SendImm | Kind::Write | Kind::WriteImm | Kind::Read => {
                src != 0 && data_len(self, src) == 0
            }
            _ => false,
        };
        // Atomics act on the first 8 bytes of the destination's data.
        let short_target = matches!(kind, Kind::CmpSwp | Kind::FetchAdd) && data_len(self, dst) < 8;
        if empty_source || short_target {
            return DOCA_ERROR_INVALID_VALUE;
        }
        if conn.is_some_and(|c| !self.conn_ready(c)) {
            // Not established as this side knows it (its established callback not delivered,
            // or `doca_rdma_connect` not called), or disconnected.
            return DOCA_ERROR_NOT_CONNECTED;
        }
        if conn.is_none() && !connected_once {
            // A receive before any connection of the context is usable.
            return DOCA_ERROR_NOT_CONNECTED;
        }
        let t = self.tasks.get_mut(&task).expect("checked");
        t.phase = Phase::Submitted;
        t.completed = false;
        t.status = DOCA_SUCCESS;
        (t.res_len, t.res_opcode, t.res_imm, t.res_conn) = (0, 0, 0, 0);
        let r = self.rdmas.get_mut(&rdma).expect("checked");
        r.inflight += 1;
        counters::submitted(r.dev);
        if let Some(conn) = conn {
            // Outstanding from now on: an error or a disconnection of the connection completes
            // it (once), flushed to the hardware or not.
            self.conns
                .get_mut(&conn)
                .expect("checked")
                .outstanding
                .push(task);
        }
        let r = self.rdmas.get_mut(&rdma).expect("checked");
        if !flush {
            r.unflushed.push(task);
            return DOCA_SUCCESS;
        }
        counters::doorbell(r.dev);
        let earlier = std::mem::take(&mut r.unflushed);
        for t in earlier.into_iter().chain([task]) {
            self.start(t);
        }
        DOCA_SUCCESS
    }

    /// `doca_ctx_flush_tasks` of a context that is not idle: starts its unflushed tasks in
    /// submission order, one doorbell for all of them (none when there are none).
    pub(super) fn flush_unflushed(&mut self, rdma: H) {
        let Some(r) = self.rdmas.get_mut(&rdma) else {
            return;
        };
        if r.unflushed.is_empty() {
            return;
        }
        counters::doorbell(r.dev);
        for task in std::mem::take(&mut r.unflushed) {
            self.start(task);
        }
    }

    /// Hands an accepted task to the "hardware": posts a receive, queues a send-like task for
    /// a receive on the peer, or performs a one-sided operation. A task completed meanwhile
    /// (its connection failed or was disconnected while it waited for a flush) is skipped.
    fn start(&mut self, task: H) {
        let Some(t) = self
            .tasks
            .get(&task)
            .filter(|t| t.phase == Phase::Submitted)
        else {
            return;
        };
        let (kind, rdma, conn) = (t.kind, t.rdma, t.conn);
        let Some(conn) = conn else {
            // A receive: post it, then let waiting sends of any connection's peer match it.
            let Some(r) = self.rdmas.get_mut(&rdma) else {
                return;
            };
            r.recvs.push_back(task);
            // Only peers with a send waiting (usually none anywhere: nothing to look at).
            if self.contexts_with_waiting_sends == 0 {
                return;
            }
            let r = self.rdmas.get(&rdma).expect("checked");
            let peers: Vec<H> = r
                .conns
                .iter()
                .filter_map(|c| self.conns.get(c)?.peer)
                .filter(|p| self.conns.get(p).is_some_and(|p| !p.pending.is_empty()))
                .collect();
            for peer in peers {
                self.try_deliver(peer);
            }
            return;
        };
        if self.conn_state(Some(conn)) != Some(ConnState::Established) {
            self.complete(task, ERR_FLUSH);
            return;
        }
        // Out of band, the peer may not have called `doca_rdma_connect` yet: its queue pair is
        // not ready, the packets are dropped and retried until the retry budget runs out, and
        // the task fails. The provider fails it at once.
        let c = self.conns.get(&conn).expect("checked");
        if c.oob && self.conn_state(c.peer) != Some(ConnState::Established) {
            self.complete(task, ERR_TASK);
            self.conn_error(conn);
            return;
        }
        match kind {
            Kind::Send | Kind::SendImm | Kind::WriteImm => {
                let (dev, retries) = self
                    .rdmas
                    .get(&rdma)
                    .map(|r| (r.dev, r.rnr_retry_count))
                    .expect("a submitted task's context exists");
                // One receiver-not-ready timer period per try: the first try, then
                // `retries` more, without end for 7 (InfiniBand's "retry forever").
                let t = self.tasks.get_mut(&task).expect("checked");
                t.deadline = Some(Instant::now() + rnr_timeout());
                t.rnr_retries_left = (retries < super::rdma::RNR_RETRY_FOREVER).then_some(retries);
                self.conns
                    .get_mut(&conn)
                    .expect("checked")
                    .pending
                    .push_back(task);
                self.try_deliver(conn);
                let c = self.conns.get(&conn).expect("checked");
                if !c.pending.is_empty() {
                    // This send (the newest) found no receive on the peer.
                    counters::rnr_wait(dev);
                    self.set_sends_wait(c.rdma, true);
                }
            }
            _ => {
                let status = self.one_sided(task, conn);
                self.complete(task, status);
                if status != DOCA_SUCCESS {
                    self.conn_error(conn);
                }
            }
        }
    }

    /// Moves the waiting sends of `conn` into receives posted on its peer, oldest first.
    pub(super) fn try_deliver(&mut self, conn: H) {
        loop {
            let Some(c) = self.conns.get(&conn) else {
                return;
            };
            let (Some(&task), Some(peer)) = (c.pending.front(), c.peer) else {
                return;
            };
            if c.state != ConnState::Established {
                return;
            }
            let Some(peer_rdma) = self
                .conns
                .get(&peer)
                .filter(|p| p.state == ConnState::Established)
                .map(|p| p.rdma)
            else {
                return;
            };
            let Some(&recv) = self.rdmas.get(&peer_rdma).and_then(|r| r.recvs.front()) else {
                return;
            };
            self.conns
                .get_mut(&conn)
                .expect("checked")
                .pending
                .pop_front();
            self.rdmas
                .get_mut(&peer_rdma)
                .expect("checked")
                .recvs
                .pop_front();
            match self.deliver(task, conn, recv, peer) {
                Ok(()) => {
                    self.complete_dequeued(recv, DOCA_SUCCESS);
                    self.complete_dequeued(task, DOCA_SUCCESS);
                }
                Err(RecvFailure::Sender) => {
                    // Remote access error of a write-with-immediate: the receive stays posted.
                    self.rdmas
                        .get_mut(&peer_rdma)
                        .expect("checked")
                        .recvs
                        .push_front(recv);
                    self.complete_dequeued(task, ERR_TASK);
                    self.conn_error(conn);
                }
                Err(RecvFailure::Both) => {
                    self.complete_dequeued(recv, ERR_TASK);
                    self.complete_dequeued(task, ERR_TASK);
                    self.conn_error(conn);
                    self.conn_error(peer);
                }
            }
        }
    }

    /// Whether `buf` is local memory the context `rdma` may use: from a local mmap that has the
    /// context's device added and, when the operation writes it, local write access.
    fn local_ok(&self, rdma: H, buf: &Buf, write: bool) -> bool {
        let Some(dev) = self.rdmas.get(&rdma).map(|r| r.dev) else {
            return false;
        };
        self.mmaps.get(&buf.mmap).is_some_and(|m| {
            m.remote.is_none()
                && m.started
                && m.has_device(dev)
                && (!write || m.permissions & DOCA_ACCESS_FLAG_LOCAL_READ_WRITE != 0)
        })
    }

    /// Performs one send-like task into one receive.
    fn deliver(&mut self, task: H, conn: H, recv: H, peer: H) -> Result<(), RecvFailure> {
        let t = self.tasks.get(&task).expect("pending task exists");
        let (kind, imm, src, rdma) = (t.kind, t.imm, t.src, t.rdma);
        let r = self.tasks.get(&recv).expect("posted receive exists");
        let (dst, peer_rdma) = (r.dst, r.rdma);
        let (len, opcode) = match kind {
            Kind::WriteImm => {
                if self.one_sided(task, conn) != DOCA_SUCCESS {
                    return Err(RecvFailure::Sender);
                }
                (0, DOCA_RDMA_OPCODE_RECV_WRITE_WITH_IMM)
            }
            _ => {
                let s = if src == 0 {
                    None
                } else {
                    match self.live_buf(src) {
                        Some(s) if self.local_ok(rdma, s, false) => Some(s),
                        _ => return Err(RecvFailure::Both),
                    }
                };
                let len = s.map_or(0, |s| s.data_len);
                if len > 0 {
                    let d = match self.live_buf(dst) {
                        Some(d) if self.local_ok(peer_rdma, d, true) => d,
                        _ => return Err(RecvFailure::Both),
                    };
                    if len > d.tail_room() || len > u32::MAX as usize {
                        return Err(RecvFailure::Both);
                    }
                    let (from, to) = (s.expect("len > 0").data, d.data + d.data_len);
                    // SAFETY: both ranges lie inside registered memory (buffer ranges are
                    // checked against their mmaps); DOCA's contract keeps it valid while
                    // registered.
                    unsafe { std::ptr::copy(from as *const u8, to as *mut u8, len) };
                    self.bufs.get_mut(&dst).expect("checked").data_len += len;
                }
                let op = if kind == Kind::SendImm {
                    DOCA_RDMA_OPCODE_RECV_SEND_WITH_IMM
                } else {
                    DOCA_RDMA_OPCODE_RECV_SEND
                };
                (len as u32, op)
            }
        };
        let r = self.tasks.get_mut(&recv).expect("checked");
        r.res_len = len;
        r.res_opcode = opcode;
        r.res_imm = if kind == Kind::Send { 0 } else { imm };
        r.res_conn = peer;
        Ok(())
    }

    /// Checks a remote access of `len` bytes at `addr` through the remote buffer `buf`.
    fn remote_ok(&self, conn: H, buf: &Buf, addr: usize, len: usize, need: u32) -> bool {
        let Some(imported) = self.mmaps.get(&buf.mmap) else {
            return false;
        };
        let Some(c) = self.conns.get(&conn) else {
            return false;
        };
        // The imported mmap must be usable by the context's device.
        let dev_ok = self
            .rdmas
            .get(&c.rdma)
            .is_some_and(|r| imported.has_device(r.dev));
        let exporter = imported
            .remote
            .and_then(|id| self.mmap_ids.get(&id))
            .and_then(|h| self.mmaps.get(h));
        let peer = c
            .peer
            .and_then(|p| self.conns.get(&p))
            .filter(|p| p.state == ConnState::Established)
            .and_then(|p| self.rdmas.get(&p.rdma));
        let peer_perms = peer.map(|r| r.permissions);
        // The key of an export is valid only on the device it was exported for (verbs: an
        // rkey belongs to its protection domain): the access must reach a peer context on
        // that device.
        let key_ok = peer.is_some_and(|r| {
            // SAFETY: a context's device stays open while the context exists
            // (`doca_dev_close` refuses).
            let peer_dev = unsafe { super::device::device_index(r.dev) };
            peer_dev.is_some() && peer_dev == imported.exported_for
        });
        match (exporter, peer_perms) {
            (Some(m), Some(perms)) => {
                dev_ok
                    && key_ok
                    && m.started
                    && m.permissions & need != 0
                    && perms & need != 0
                    && contains(m.addr, m.len, addr, len)
                    && contains(buf.addr, buf.len, addr, len)
            }
            _ => false,
        }
    }

    /// Performs a read, write (also the write of a write-with-immediate) or atomic.
    fn one_sided(&mut self, task: H, conn: H) -> doca_error_t {
        let t = self.tasks.get(&task).expect("submitted task exists");
        let (kind, rdma, src, dst, result) = (t.kind, t.rdma, t.src, t.dst, t.result);
        let (cmp, swap, add) = (t.cmp, t.swap, t.add);
        match kind {
            Kind::Write | Kind::WriteImm => {
                if src == 0 {
                    // No data: nothing to write, no remote access.
                    return DOCA_SUCCESS;
                }
                let (Some(s), Some(d)) = (self.live_buf(src), self.live_buf(dst)) else {
                    return ERR_TASK;
                };
                let (from, to, len) = (s.data, d.data + d.data_len, s.data_len);
                if !self.local_ok(rdma, s, false)
                    || !self.remote_ok(conn, d, to, len, DOCA_ACCESS_FLAG_RDMA_WRITE)
                {
                    return ERR_TASK;
                }
                // SAFETY: the source is local registered memory and the target lies inside
                // the exporting mmap's registered memory (checked above).
                unsafe { std::ptr::copy(from as *const u8, to as *mut u8, len) };
                self.bufs.get_mut(&dst).expect("checked").data_len += len;
            }
            Kind::Read => {
                if src == 0 {
                    return DOCA_SUCCESS;
                }
                let (Some(s), Some(d)) = (self.live_buf(src), self.live_buf(dst)) else {
                    return ERR_TASK;
                };
                let (from, to, len) = (s.data, d.data + d.data_len, s.data_len);
                if len > d.tail_room()
                    || !self.local_ok(rdma, d, true)
                    || !self.remote_ok(conn, s, from, len, DOCA_ACCESS_FLAG_RDMA_READ)
                {
                    return ERR_TASK;
                }
                // SAFETY: the source lies inside the exporting mmap's registered memory
                // (checked above) and the target inside the local buffer's tail room.
                unsafe { std::ptr::copy(from as *const u8, to as *mut u8, len) };
                self.bufs.get_mut(&dst).expect("checked").data_len += len;
            }
            Kind::CmpSwp | Kind::FetchAdd => {
                let (Some(d), Some(res)) = (self.live_buf(dst), self.live_buf(result)) else {
                    return ERR_TASK;
                };
                let target = d.data;
                if target % 8 != 0
                    || res.tail_room() < 8
                    || !self.local_ok(rdma, res, true)
                    || !self.remote_ok(conn, d, target, 8, DOCA_ACCESS_FLAG_RDMA_ATOMIC)
                {
                    return ERR_TASK;
                }
                // SAFETY: 8 aligned bytes inside the exporting mmap's registered memory
                // (checked above); accessed atomically as the hardware would.
                let cell = unsafe { AtomicU64::from_ptr(target as *mut u64) };
                let old = if kind == Kind::CmpSwp {
                    cell.compare_exchange(cmp, swap, Ordering::SeqCst, Ordering::SeqCst)
                        .unwrap_or_else(|v| v)
                } else {
                    cell.fetch_add(add, Ordering::SeqCst)
                };
                let to = res.data + res.data_len;
                // SAFETY: 8 bytes of tail room in the local result buffer (checked above).
                unsafe { std::ptr::write_unaligned(to as *mut u64, old) };
                self.bufs.get_mut(&result).expect("checked").data_len += 8;
            }
            _ => unreachable!("send-like tasks are delivered by try_deliver"),
        }
        DOCA_SUCCESS
    }
}

/// Which side a failed delivery fails.
enum RecvFailure {
    /// Only the sender (write-with-immediate remote access error).
    Sender,
    /// The receive and the send (length or local access error).
    Both,
}
