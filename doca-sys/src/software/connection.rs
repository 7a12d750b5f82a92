//! A connection's life in both modes (RDMA CM and out of band): its creation against the
//! context's connection slots, its state changes (error, a client's failure, disconnection)
//! with the flush of its outstanding tasks, and the C calls on an existing connection:
//! disconnect, user data and id.

use super::rdma::running;
use super::*;

impl World {
    /// Creates a connection of `rdma` (slot availability checked by the caller).
    pub(super) fn new_conn(
        &mut self,
        rdma: H,
        state: ConnState,
        user_data: UserData,
        oob: bool,
    ) -> H {
        let h = new_handle();
        let r = self
            .rdmas
            .get_mut(&rdma)
            .expect("caller checked the context");
        let id = r.next_conn_id;
        r.next_conn_id = r.next_conn_id.wrapping_add(1);
        r.conns.push(h);
        self.conns.insert(
            h,
            Conn {
                rdma,
                id,
                state,
                peer: None,
                user_data,
                oob,
                usable: false,
                blob: Vec::new(),
                addr: None,
                pending: VecDeque::new(),
                outstanding: Vec::new(),
            },
        );
        h
    }

    pub(super) fn has_free_slot(&self, rdma: H) -> bool {
        self.rdmas
            .get(&rdma)
            .is_some_and(|r| r.used_slots(self) < usize::from(r.max_conns))
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_connection_disconnect(
    rdma_connection: *mut doca_rdma_connection,
) -> doca_error_t {
    let mut w = world();
    if let Err(e) = conn_ctx_running(&w, rdma_connection as H) {
        return e;
    }
    w.disconnect(rdma_connection as H)
}

/// Checks that `conn` is a connection whose context is running: doca_rdma.h documents accept,
/// reject and disconnect for a running context only. `BAD_STATE` otherwise (stricter choice of
/// code: their entries list none for it).
pub(super) fn conn_ctx_running(w: &World, conn: H) -> Result<(), doca_error_t> {
    let Some(c) = w.conns.get(&conn) else {
        return Err(DOCA_ERROR_INVALID_VALUE);
    };
    running(w, c.rdma).map(|_| ())
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_connection_set_user_data(
    rdma_connection: *mut doca_rdma_connection,
    connection_user_data: doca_data,
) -> doca_error_t {
    match world().conns.get_mut(&(rdma_connection as H)) {
        None => DOCA_ERROR_INVALID_VALUE,
        Some(c) => {
            c.user_data = UserData(connection_user_data);
            DOCA_SUCCESS
        }
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_connection_get_user_data(
    rdma_connection: *const doca_rdma_connection,
    connection_user_data: *mut doca_data,
) -> doca_error_t {
    let w = world();
    let Some(c) = w.conns.get(&(rdma_connection as H)) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if connection_user_data.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; writable per the contract.
    unsafe { *connection_user_data = c.user_data.0 };
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_connection_get_id(
    rdma_connection: *const doca_rdma_connection,
    connection_id: *mut u32,
) -> doca_error_t {
    let w = world();
    let Some(c) = w.conns.get(&(rdma_connection as H)) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if connection_id.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; writable per the contract.
    unsafe { *connection_id = c.id };
    DOCA_SUCCESS
}

impl World {
    /// Whether tasks may use `conn` now: established as its side knows it (see `Conn::usable`)
    /// and not disconnected. A connection in error, or whose peer left, still takes tasks,
    /// which complete with the flush status (verbs: work posted to a queue pair in error).
    pub(super) fn conn_ready(&self, conn: H) -> bool {
        self.conns.get(&conn).is_some_and(|c| {
            c.usable
                && matches!(
                    c.state,
                    ConnState::Established | ConnState::Error | ConnState::PeerGone
                )
        })
    }

    /// Completes every outstanding task of a connection with the flush status.
    pub(super) fn flush_conn(&mut self, conn: H) {
        let tasks = match self.conns.get(&conn) {
            Some(c) => c.outstanding.clone(),
            None => return,
        };
        for t in tasks {
            self.complete(t, ERR_FLUSH);
        }
    }

    /// Moves an established connection to error and flushes its tasks.
    pub(super) fn conn_error(&mut self, conn: H) {
        if let Some(c) = self.conns.get_mut(&conn) {
            if c.state == ConnState::Established {
                c.state = ConnState::Error;
            }
        }
        self.flush_conn(conn);
    }

    pub(super) fn conn_state(&self, conn: Option<H>) -> Option<ConnState> {
        conn.and_then(|c| self.conns.get(&c)).map(|c| c.state)
    }

    /// Disconnects a connection (application call, or context stop).
    pub(super) fn disconnect(&mut self, conn: H) -> doca_error_t {
        let Some(c) = self.conns.get(&conn) else {
            return DOCA_ERROR_INVALID_VALUE;
        };
        let (state, peer, oob, addr) = (c.state, c.peer, c.oob, c.addr);
        match state {
            ConnState::Established | ConnState::Error | ConnState::PeerGone => {
                self.flush_conn(conn);
                self.set_conn_state(conn, ConnState::Disconnected);
                let peer_state = self.conn_state(peer);
                if let (Some(p), Some(ConnState::Established | ConnState::Error)) =
                    (peer, peer_state)
                {
                    self.flush_conn(p);
                    if oob {
                        self.set_conn_state(p, ConnState::Error);
                    } else {
                        self.set_conn_state(p, ConnState::PeerGone);
                        self.enqueue_conn(p, Event::Disconnect(p));
                    }
                }
            }
            ConnState::Requested => {
                self.set_conn_state(conn, ConnState::Disconnected);
                if let Some(p) = peer {
                    self.fail_client(p);
                }
            }
            ConnState::Connecting => {
                // The server's pending request stays: accepting it fails (the client left).
                self.set_conn_state(conn, ConnState::Disconnected);
                self.release_addr(addr);
            }
            ConnState::Exported => self.set_conn_state(conn, ConnState::Disconnected),
            // Not a live connection any more: an invalid parameter (the documented code).
            ConnState::Disconnected | ConnState::Failed => return DOCA_ERROR_INVALID_VALUE,
        }
        DOCA_SUCCESS
    }

    pub(super) fn set_conn_state(&mut self, conn: H, state: ConnState) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.state = state;
        }
    }

    pub(super) fn release_addr(&mut self, addr: Option<H>) {
        if let Some(a) = addr.and_then(|a| self.addrs.get_mut(&a)) {
            a.in_use = a.in_use.saturating_sub(1);
        }
    }

    /// A client's connection attempt failed: failure callback on the client.
    pub(super) fn fail_client(&mut self, client: H) {
        let Some(c) = self.conns.get_mut(&client) else {
            return;
        };
        if c.state != ConnState::Connecting {
            return;
        }
        c.state = ConnState::Failed;
        let addr = c.addr;
        self.release_addr(addr);
        self.enqueue_conn(client, Event::Failure(client));
    }
}
