//! A connection's life in both modes (RDMA CM and out of band): its creation against the
//! context's connection slots, its disconnection, its user data and its id.

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
