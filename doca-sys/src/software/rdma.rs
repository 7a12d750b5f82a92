//! The RDMA context: creation, destruction, configuration while idle (permissions, queue
//! sizes, connection limit, receiver-not-ready retries, connection callbacks), and the checks
//! of its state that the connection calls share. Connections are in `connection.rs` (their
//! life in both modes), `cm.rs` (RDMA CM) and `oob.rs` (out of band).

use super::*;

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_create(
    dev: *mut doca_dev,
    rdma: *mut *mut doca_rdma,
) -> doca_error_t {
    if dev.is_null() || rdma.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    let h = new_handle();
    world().rdmas.insert(
        h,
        Rdma {
            dev: dev as H,
            pe: None,
            state: DOCA_CTX_STATE_IDLE,
            user_data: UserData::NULL,
            state_cb: None,
            permissions: DOCA_ACCESS_FLAG_LOCAL_READ_WRITE,
            max_conns: 1,
            request_cb: None,
            established_cb: None,
            failure_cb: None,
            disconnect_cb: None,
            confs: [TaskConf::default(); 8],
            inflight: 0,
            recvs: VecDeque::new(),
            conns: Vec::new(),
            listening: Vec::new(),
            next_conn_id: 0,
            connected_once: false,
            state_events: 0,
            sends_wait: false,
            rnr_retry_count: 0,
            unflushed: Vec::new(),
        },
    );
    // SAFETY: checked non-null; writable per the contract.
    unsafe { *rdma = h as *mut doca_rdma };
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_destroy(rdma: *mut doca_rdma) -> doca_error_t {
    let h = rdma as H;
    let mut w = world();
    let Some(r) = w.rdmas.get(&h) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if r.state != DOCA_CTX_STATE_IDLE {
        return DOCA_ERROR_BAD_STATE;
    }
    w.set_sends_wait(h, false);
    let r = w.rdmas.remove(&h).expect("checked above");
    for conn in r.conns {
        // A peer may still point at it: make it a dangling peer reference.
        if let Some(c) = w.conns.remove(&conn) {
            if let Some(p) = c.peer.and_then(|p| w.conns.get_mut(&p)) {
                if p.peer == Some(conn) {
                    p.peer = None;
                }
            }
        }
        free_handle(conn);
    }
    if let Some(p) = r.pe.and_then(|p| w.pes.get_mut(&p)) {
        p.ctxs.retain(|&c| c != h);
        p.queue
            .retain(|e| !matches!(e, Event::State { ctx, .. } if *ctx == h));
    }
    free_handle(h);
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_as_ctx(rdma: *mut doca_rdma) -> *mut doca_ctx {
    rdma.cast()
}

/// Runs `f` on an idle RDMA context (`BAD_STATE` otherwise).
fn with_idle(rdma: *mut doca_rdma, f: impl FnOnce(&mut Rdma) -> doca_error_t) -> doca_error_t {
    let mut w = world();
    match w.rdmas.get_mut(&(rdma as H)) {
        None => DOCA_ERROR_INVALID_VALUE,
        Some(r) if r.state != DOCA_CTX_STATE_IDLE => DOCA_ERROR_BAD_STATE,
        Some(r) => f(r),
    }
}

/// The flags `doca_rdma_set_permissions` accepts: the RDMA access flags (NVIDIA's samples also
/// pass `LOCAL_READ_WRITE`).
const RDMA_PERMISSIONS: u32 = DOCA_ACCESS_FLAG_LOCAL_READ_WRITE
    | DOCA_ACCESS_FLAG_RDMA_READ
    | DOCA_ACCESS_FLAG_RDMA_WRITE
    | DOCA_ACCESS_FLAG_RDMA_ATOMIC;

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_set_permissions(
    rdma: *mut doca_rdma,
    permissions: u32,
) -> doca_error_t {
    if permissions & !RDMA_PERMISSIONS != 0 {
        // Non-RDMA (PCI) or undefined access flags.
        return DOCA_ERROR_INVALID_VALUE;
    }
    with_idle(rdma, |r| {
        r.permissions = permissions;
        DOCA_SUCCESS
    })
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_set_gid_index(
    rdma: *mut doca_rdma,
    _gid_index: u32,
) -> doca_error_t {
    with_idle(rdma, |_| DOCA_SUCCESS)
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_set_max_num_connections(
    rdma: *mut doca_rdma,
    max_num_connections: u16,
) -> doca_error_t {
    if max_num_connections == 0 {
        // Below the minimum supported value (1).
        return DOCA_ERROR_NOT_SUPPORTED;
    }
    with_idle(rdma, |r| {
        r.max_conns = max_num_connections;
        DOCA_SUCCESS
    })
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_set_send_queue_size(
    rdma: *mut doca_rdma,
    size: u32,
) -> doca_error_t {
    if size == 0 {
        return DOCA_ERROR_INVALID_VALUE;
    }
    // The size is rounded up to a power of two; above the device maximum it is not supported.
    if size
        .checked_next_power_of_two()
        .is_none_or(|s| s > super::device::MAX_QUEUE_SIZE)
    {
        return DOCA_ERROR_NOT_SUPPORTED;
    }
    with_idle(rdma, |_| DOCA_SUCCESS)
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_set_recv_queue_size(
    rdma: *mut doca_rdma,
    _size: u32,
) -> doca_error_t {
    // Only the GPU and DPA data paths use it: the provider is a CPU data path.
    match world().rdmas.get(&(rdma as H)) {
        None => DOCA_ERROR_INVALID_VALUE,
        Some(_) => DOCA_ERROR_NOT_SUPPORTED,
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_set_transport_type(
    rdma: *mut doca_rdma,
    transport_type: doca_rdma_transport_type,
) -> doca_error_t {
    match transport_type {
        DOCA_RDMA_TRANSPORT_TYPE_RC => with_idle(rdma, |_| DOCA_SUCCESS),
        DOCA_RDMA_TRANSPORT_TYPE_DC => DOCA_ERROR_NOT_SUPPORTED,
        _ => DOCA_ERROR_INVALID_VALUE,
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_set_connection_request_timeout(
    rdma: *mut doca_rdma,
    timeout: u16,
) -> doca_error_t {
    if timeout == 0 {
        // Stricter choice: a zero timeout cannot resolve anything.
        return DOCA_ERROR_INVALID_VALUE;
    }
    with_idle(rdma, |_| DOCA_SUCCESS)
}

/// The InfiniBand `rnr_retry` field is 3 bits; 7 means "retry forever".
pub(super) const RNR_RETRY_FOREVER: u8 = 7;

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_set_rnr_retry_count(
    rdma: *mut doca_rdma,
    rnr_retry_count: u8,
) -> doca_error_t {
    if rnr_retry_count > RNR_RETRY_FOREVER {
        // Stricter choice: the queue pair attribute it sets is 3 bits wide (verbs `rnr_retry`).
        return DOCA_ERROR_INVALID_VALUE;
    }
    with_idle(rdma, |r| {
        r.rnr_retry_count = rnr_retry_count;
        DOCA_SUCCESS
    })
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_get_rnr_retry_count(
    rdma: *const doca_rdma,
    rnr_retry_count: *mut u8,
) -> doca_error_t {
    if rnr_retry_count.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    let Some(count) = world().rdmas.get(&(rdma as H)).map(|r| r.rnr_retry_count) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    // SAFETY: checked non-null; writable per the contract.
    unsafe { *rnr_retry_count = count };
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_set_connection_state_callbacks(
    rdma: *mut doca_rdma,
    request_cb: doca_rdma_connection_request_cb_t,
    established_cb: doca_rdma_connection_established_cb_t,
    failure_cb: doca_rdma_connection_failure_cb_t,
    disconnect_cb: doca_rdma_connection_disconnection_cb_t,
) -> doca_error_t {
    // Only the request callback may be NULL (a client).
    if established_cb.is_none() || failure_cb.is_none() || disconnect_cb.is_none() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    with_idle(rdma, |r| {
        r.request_cb = request_cb;
        r.established_cb = established_cb;
        r.failure_cb = failure_cb;
        r.disconnect_cb = disconnect_cb;
        DOCA_SUCCESS
    })
}

/// Checks that `rdma` exists and is running.
pub(super) fn running(w: &World, rdma: H) -> Result<&Rdma, doca_error_t> {
    match w.rdmas.get(&rdma) {
        None => Err(DOCA_ERROR_INVALID_VALUE),
        Some(r) if r.state != DOCA_CTX_STATE_RUNNING => Err(DOCA_ERROR_BAD_STATE),
        Some(r) => Ok(r),
    }
}

/// Checks that `rdma` exists and was started (`STARTING` or `RUNNING`).
pub(super) fn started(w: &World, rdma: H) -> Result<&Rdma, doca_error_t> {
    match w.rdmas.get(&rdma) {
        None => Err(DOCA_ERROR_INVALID_VALUE),
        Some(r) if r.state != DOCA_CTX_STATE_RUNNING && r.state != DOCA_CTX_STATE_STARTING => {
            Err(DOCA_ERROR_BAD_STATE)
        }
        Some(r) => Ok(r),
    }
}
