//! RDMA CM, emulated by port number: addresses, listening, connecting to an address, and
//! accepting or rejecting a connection request.

use super::connection::conn_ctx_running;
use super::rdma::running;
use super::*;
use std::ffi::{c_char, CStr};

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
