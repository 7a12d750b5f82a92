//! Out-of-band connections: `doca_rdma_export` makes a connection and its blob,
//! `doca_rdma_connect` pairs it with the peer's.

use super::rdma::started;
use super::*;

const CONN_BLOB_MAGIC: &[u8; 8] = b"DSWCONN1";

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
