//! RDMA context configuration, RDMA CM emulation and out-of-band connections.

use super::*;
use std::ffi::{c_char, CStr};

const CONN_BLOB_MAGIC: &[u8; 8] = b"DSWCONN1";

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

#[no_mangle]
#[allow(non_upper_case_globals)] // DOCA's own spelling: DOCA_RDMA_ADDR_TYPE_IPv4
pub(crate) unsafe extern "C" fn doca_rdma_addr_create(
    addr_type: doca_rdma_addr_type,
    address: *const c_char,
    port: u16,
    addr: *mut *mut doca_rdma_addr,
) -> doca_error_t {
    if address.is_null() || addr.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    // SAFETY: a NUL-terminated string per the contract.
    let Ok(text) = unsafe { CStr::from_ptr(address) }.to_str() else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    let valid = match addr_type {
        DOCA_RDMA_ADDR_TYPE_IPv4 => text.parse::<std::net::Ipv4Addr>().is_ok(),
        DOCA_RDMA_ADDR_TYPE_IPv6 => text.parse::<std::net::Ipv6Addr>().is_ok(),
        DOCA_RDMA_ADDR_TYPE_GID => !text.is_empty(),
        _ => false,
    };
    if !valid {
        return DOCA_ERROR_INVALID_VALUE;
    }
    let h = new_handle();
    world().addrs.insert(h, Addr { port, in_use: 0 });
    // SAFETY: checked non-null; writable per the contract.
    unsafe { *addr = h as *mut doca_rdma_addr };
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_addr_destroy(addr: *mut doca_rdma_addr) -> doca_error_t {
    let mut w = world();
    match w.addrs.get(&(addr as H)) {
        None => return DOCA_ERROR_INVALID_VALUE,
        Some(a) if a.in_use > 0 => return DOCA_ERROR_BAD_STATE,
        Some(_) => {}
    }
    w.addrs.remove(&(addr as H));
    free_handle(addr as H);
    DOCA_SUCCESS
}

/// Checks that `rdma` exists and is running.
fn running(w: &World, rdma: H) -> Result<&Rdma, doca_error_t> {
    match w.rdmas.get(&rdma) {
        None => Err(DOCA_ERROR_INVALID_VALUE),
        Some(r) if r.state != DOCA_CTX_STATE_RUNNING => Err(DOCA_ERROR_BAD_STATE),
        Some(r) => Ok(r),
    }
}

/// Checks that `rdma` exists and was started (`STARTING` or `RUNNING`).
fn started(w: &World, rdma: H) -> Result<&Rdma, doca_error_t> {
    match w.rdmas.get(&rdma) {
        None => Err(DOCA_ERROR_INVALID_VALUE),
        Some(r) if r.state != DOCA_CTX_STATE_RUNNING && r.state != DOCA_CTX_STATE_STARTING => {
            Err(DOCA_ERROR_BAD_STATE)
        }
        Some(r) => Ok(r),
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_start_listen_to_port(
    rdma: *mut doca_rdma,
    port: u16,
) -> doca_error_t {
    let h = rdma as H;
    let mut w = world();
    if let Err(e) = running(&w, h) {
        return e;
    }
    if w.listeners.contains_key(&port) {
        // The port is taken (by this context or another): binding it fails, reported with the
        // documented "connection failed" code.
        return DOCA_ERROR_CONNECTION_ABORTED;
    }
    w.listeners.insert(port, h);
    w.rdmas.get_mut(&h).expect("running").listening.push(port);
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_stop_listen_to_port(
    rdma: *mut doca_rdma,
    port: u16,
) -> doca_error_t {
    let h = rdma as H;
    let mut w = world();
    let Some(r) = w.rdmas.get_mut(&h) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if !r.listening.contains(&port) {
        return DOCA_ERROR_INVALID_VALUE;
    }
    r.listening.retain(|&p| p != port);
    w.listeners.remove(&port);
    DOCA_SUCCESS
}

impl World {
    /// Creates a connection of `rdma` (slot availability checked by the caller).
    fn new_conn(&mut self, rdma: H, state: ConnState, user_data: UserData, oob: bool) -> H {
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

    fn has_free_slot(&self, rdma: H) -> bool {
        self.rdmas
            .get(&rdma)
            .is_some_and(|r| r.used_slots(self) < usize::from(r.max_conns))
    }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_connect_to_addr(
    rdma: *mut doca_rdma,
    addr: *mut doca_rdma_addr,
    connection_user_data: doca_data,
) -> doca_error_t {
    let h = rdma as H;
    let mut w = world();
    if let Err(e) = running(&w, h) {
        return e;
    }
    let Some(port) = w.addrs.get(&(addr as H)).map(|a| a.port) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if !w.has_free_slot(h) {
        return DOCA_ERROR_FULL;
    }
    let client = w.new_conn(
        h,
        ConnState::Connecting,
        UserData(connection_user_data),
        false,
    );
    w.conns.get_mut(&client).expect("just created").addr = Some(addr as H);
    w.addrs.get_mut(&(addr as H)).expect("checked").in_use += 1;
    let server_rdma = w.listeners.get(&port).copied();
    match server_rdma {
        Some(s) if w.has_free_slot(s) => {
            let server = w.new_conn(s, ConnState::Requested, UserData::NULL, false);
            w.conns.get_mut(&server).expect("just created").peer = Some(client);
            w.conns.get_mut(&client).expect("just created").peer = Some(server);
            w.enqueue_ctx(s, Event::Request(server));
        }
        _ => w.fail_client(client),
    }
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_connection_accept(
    rdma_connection: *mut doca_rdma_connection,
    private_data: *mut c_void,
    private_data_len: u8,
) -> doca_error_t {
    let conn = rdma_connection as H;
    if private_data.is_null() != (private_data_len == 0) {
        // Unused private data is (NULL, 0); used, it is (pointer, length).
        return DOCA_ERROR_INVALID_VALUE;
    }
    let mut w = world();
    if let Err(e) = conn_ctx_running(&w, conn) {
        return e;
    }
    let c = w.conns.get(&conn).expect("checked");
    if c.state != ConnState::Requested {
        // Not a pending connection request.
        return DOCA_ERROR_INVALID_VALUE;
    }
    let peer = c.peer;
    let client = peer.filter(|p| {
        w.conns
            .get(p)
            .is_some_and(|p| p.state == ConnState::Connecting)
    });
    let Some(client) = client else {
        // The client went away meanwhile.
        w.set_conn_state(conn, ConnState::Disconnected);
        return DOCA_ERROR_CONNECTION_ABORTED;
    };
    // Both queue pairs are ready; each side may use its connection once its established
    // callback was delivered (`Conn::usable`).
    w.set_conn_state(conn, ConnState::Established);
    w.set_conn_state(client, ConnState::Established);
    let addr = w.conns.get(&client).and_then(|c| c.addr);
    w.release_addr(addr);
    w.enqueue_conn(conn, Event::Established(conn));
    w.enqueue_conn(client, Event::Established(client));
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_connection_reject(
    rdma_connection: *mut doca_rdma_connection,
) -> doca_error_t {
    let conn = rdma_connection as H;
    let mut w = world();
    if let Err(e) = conn_ctx_running(&w, conn) {
        return e;
    }
    match w.conns.get(&conn) {
        Some(c) if c.state == ConnState::Requested => {}
        // Not a pending connection request.
        _ => return DOCA_ERROR_INVALID_VALUE,
    }
    w.reject(conn);
    DOCA_SUCCESS
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
fn conn_ctx_running(w: &World, conn: H) -> Result<(), doca_error_t> {
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

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_export(
    rdma: *mut doca_rdma,
    local_rdma_conn_details: *mut *const c_void,
    local_rdma_conn_details_size: *mut usize,
    rdma_connection: *mut *mut doca_rdma_connection,
) -> doca_error_t {
    let h = rdma as H;
    if local_rdma_conn_details.is_null()
        || local_rdma_conn_details_size.is_null()
        || rdma_connection.is_null()
    {
        return DOCA_ERROR_INVALID_VALUE;
    }
    let mut w = world();
    if let Err(e) = started(&w, h) {
        return e;
    }
    if !w.has_free_slot(h) {
        return DOCA_ERROR_FULL;
    }
    let conn = w.new_conn(h, ConnState::Exported, UserData::NULL, true);
    let c = w.conns.get_mut(&conn).expect("just created");
    c.blob.extend_from_slice(CONN_BLOB_MAGIC);
    c.blob.extend_from_slice(&(conn as u64).to_le_bytes());
    // SAFETY: out-pointers checked non-null; the blob lives as long as the connection.
    unsafe {
        *local_rdma_conn_details = c.blob.as_ptr().cast();
        *local_rdma_conn_details_size = c.blob.len();
        *rdma_connection = conn as *mut doca_rdma_connection;
    }
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_connect(
    rdma: *mut doca_rdma,
    remote_rdma_conn_details: *const c_void,
    remote_rdma_conn_details_size: usize,
    rdma_connection: *mut doca_rdma_connection,
) -> doca_error_t {
    let (h, conn) = (rdma as H, rdma_connection as H);
    if remote_rdma_conn_details.is_null() || rdma_connection.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    let mut w = world();
    if let Err(e) = started(&w, h) {
        return e;
    }
    match w.conns.get(&conn) {
        Some(c) if c.rdma != h => return DOCA_ERROR_INVALID_VALUE,
        // Already connected (or disconnected).
        Some(c) if c.state != ConnState::Exported => return DOCA_ERROR_BAD_STATE,
        Some(_) => {}
        None => return DOCA_ERROR_INVALID_VALUE,
    }
    // Corrupted details, or details of no exported connection: the connection fails.
    if remote_rdma_conn_details_size != 16 {
        return DOCA_ERROR_CONNECTION_ABORTED;
    }
    // SAFETY: the caller gives `remote_rdma_conn_details_size` (16) readable bytes.
    let blob = unsafe { std::slice::from_raw_parts(remote_rdma_conn_details.cast::<u8>(), 16) };
    if &blob[..8] != CONN_BLOB_MAGIC {
        return DOCA_ERROR_CONNECTION_ABORTED;
    }
    let remote = u64::from_le_bytes(blob[8..].try_into().expect("8 bytes")) as H;
    match w.conns.get(&remote) {
        // The peer's own state does not matter to this side's queue pair set-up (a peer in
        // error just never answers).
        Some(r)
            if r.oob
                && matches!(
                    r.state,
                    ConnState::Exported | ConnState::Established | ConnState::Error
                ) => {}
        _ => return DOCA_ERROR_CONNECTION_ABORTED,
    }
    let c = w.conns.get_mut(&conn).expect("checked");
    c.peer = Some(remote);
    c.state = ConnState::Established;
    // Out of band there is no established callback: this side may use the connection now.
    c.usable = true;
    w.rdmas.get_mut(&h).expect("started").connected_once = true;
    // Nothing waits for this side: a task the peer submitted before this call has already
    // failed (its packets would have reached a queue pair that was not ready).
    DOCA_SUCCESS
}
