//! The software provider against DOCA semantics, through the raw `extern "C"` functions only.
#![cfg(doca_sys_software)]
#![allow(missing_docs)]

mod common;

use common::*;
use doca_sys::*;
use std::time::Duration;

#[test]
fn provider_is_software() {
    assert_eq!(provider(), Provider::Software);
    assert_eq!(provider().to_string(), "software provider");
    assert_eq!(name(DOCA_ERROR_BAD_STATE), "DOCA_ERROR_BAD_STATE");
    assert_eq!(name(DOCA_SUCCESS), "DOCA_SUCCESS");
}

#[test]
fn devices_and_caps() {
    let mut list: *mut *mut doca_devinfo = std::ptr::null_mut();
    let mut n = 0;
    let mut name = [0 as std::ffi::c_char; 64];
    let mut pci = [0 as std::ffi::c_char; 13];
    let mut max = 0;
    // SAFETY: out-pointers to locals of the documented sizes; list entries used before destroy.
    unsafe {
        ok(doca_devinfo_create_list(&mut list, &mut n));
        assert_eq!(n, 3, "mlx5_0, mlx5_1, and mlx5_2 without RDMA support");
        ok(doca_devinfo_get_ibdev_name(
            *list.add(1),
            name.as_mut_ptr(),
            64,
        ));
        ok(doca_devinfo_get_pci_addr_str(
            *list.add(1),
            pci.as_mut_ptr(),
        ));
        ok(doca_rdma_cap_task_atomic_fetch_add_is_supported(*list));
        ok(doca_rdma_cap_get_max_message_size(*list, &mut max));
        assert_eq!(std::ffi::CStr::from_ptr(name.as_ptr()), c"mlx5_1");
        assert_eq!(std::ffi::CStr::from_ptr(pci.as_ptr()), c"0000:03:00.1");
        ok(doca_devinfo_destroy_list(list));
    }
    assert_eq!(max, 1 << 30);
}

#[test]
fn state_errors_and_state_callbacks() {
    let side = Side::new(Config {
        start: false,
        ..Config::default()
    });
    // SAFETY: live handles of `side`; out-pointers to locals.
    unsafe {
        let mut rdma = std::ptr::null_mut();
        ok(doca_rdma_create(side.dev, &mut rdma));
        assert_eq!(
            doca_ctx_start(doca_rdma_as_ctx(rdma)),
            DOCA_ERROR_NOT_CONNECTED
        );
        ok(doca_rdma_destroy(rdma));

        assert_eq!(doca_ctx_start(side.ctx), DOCA_ERROR_IN_PROGRESS);
        assert_eq!(side.state(), DOCA_CTX_STATE_STARTING);
        // Listening needs RUNNING.
        assert_eq!(
            doca_rdma_start_listen_to_port(side.rdma, 17001),
            DOCA_ERROR_BAD_STATE
        );
        assert_eq!(side.take(), vec![], "callbacks only run from progress");
        side.progress();
        assert_eq!(side.state(), DOCA_CTX_STATE_RUNNING);
        assert_eq!(
            side.take(),
            vec![
                Ev::State(DOCA_CTX_STATE_IDLE, DOCA_CTX_STATE_STARTING),
                Ev::State(DOCA_CTX_STATE_STARTING, DOCA_CTX_STATE_RUNNING)
            ]
        );
        assert_eq!(
            doca_rdma_set_permissions(side.rdma, ALL_PERMS),
            DOCA_ERROR_BAD_STATE
        );
        assert_eq!(
            doca_rdma_set_max_num_connections(side.rdma, 2),
            DOCA_ERROR_BAD_STATE
        );
        assert_eq!(
            doca_rdma_task_send_set_conf(side.rdma, Some(send_ok), Some(send_err), 4),
            DOCA_ERROR_BAD_STATE
        );
        assert_eq!(doca_pe_connect_ctx(side.pe, side.ctx), DOCA_ERROR_BAD_STATE);
        assert_eq!(doca_ctx_start(side.ctx), DOCA_ERROR_BAD_STATE);
        assert_eq!(doca_rdma_destroy(side.rdma), DOCA_ERROR_BAD_STATE);
        assert_eq!(doca_pe_destroy(side.pe), DOCA_ERROR_IN_USE);
        assert_eq!(
            doca_mmap_set_permissions(side.mmap, 0),
            DOCA_ERROR_BAD_STATE
        );

        // Nothing allocated: stops at once.
        ok(doca_ctx_stop(side.ctx));
        assert_eq!(side.state(), DOCA_CTX_STATE_IDLE);
        side.progress();
        assert_eq!(
            side.take(),
            vec![Ev::State(DOCA_CTX_STATE_RUNNING, DOCA_CTX_STATE_IDLE)]
        );
        assert_eq!(doca_ctx_stop(side.ctx), DOCA_ERROR_BAD_STATE);
        ok(doca_rdma_destroy(side.rdma));
    }
}

#[test]
fn task_pool_and_inventory_limits() {
    let side = Side::new(Config::default());
    let buf = side.buf(0, 64, 0);
    let mut tasks = Vec::new();
    // SAFETY: live running context and buffer; out-pointers to locals.
    unsafe {
        for _ in 0..NUM_TASKS {
            let mut t = std::ptr::null_mut();
            ok(doca_rdma_task_receive_allocate_init(
                side.rdma,
                buf,
                doca_data { u64_: 0 },
                &mut t,
            ));
            tasks.push(t);
        }
        let mut t = std::ptr::null_mut();
        assert_eq!(
            doca_rdma_task_receive_allocate_init(side.rdma, buf, doca_data { u64_: 0 }, &mut t),
            DOCA_ERROR_NO_MEMORY
        );
        doca_task_free(doca_rdma_task_receive_as_task(tasks.pop().unwrap()));
        ok(doca_rdma_task_receive_allocate_init(
            side.rdma,
            buf,
            doca_data { u64_: 5 },
            &mut t,
        ));
        assert_eq!(
            doca_task_get_user_data(doca_rdma_task_receive_as_task(t)).u64_,
            5
        );
        tasks.push(t);
        for t in tasks {
            doca_task_free(doca_rdma_task_receive_as_task(t));
        }

        // Inventory capacity (64, one already out).
        let mut bufs = vec![buf];
        for i in 1..64 {
            bufs.push(side.buf(i * 8, 8, 0));
        }
        let mut extra = std::ptr::null_mut();
        assert_eq!(
            doca_buf_inventory_buf_get_by_args(
                side.inv,
                side.mmap,
                side.addr(0),
                8,
                side.addr(0),
                0,
                &mut extra
            ),
            DOCA_ERROR_NO_MEMORY
        );
        // Out of the mmap's range.
        ok(doca_buf_dec_refcount(
            bufs.pop().unwrap(),
            std::ptr::null_mut(),
        ));
        assert_eq!(
            doca_buf_inventory_buf_get_by_args(
                side.inv,
                side.mmap,
                side.addr(4000),
                200,
                side.addr(4000),
                0,
                &mut extra
            ),
            DOCA_ERROR_INVALID_VALUE
        );
        // Data pointer and length; the inline helpers.
        ok(doca_buf_inventory_buf_get_by_data(
            side.inv,
            side.mmap,
            side.addr(8),
            16,
            &mut extra,
        ));
        let (mut data, mut len) = (std::ptr::null_mut(), 0);
        ok(doca_buf_get_data(extra, &mut data));
        ok(doca_buf_get_data_len(extra, &mut len));
        assert_eq!((data, len), (side.addr(8), 16));
        assert_eq!(
            doca_buf_set_data(extra, side.addr(8), 17),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_buf_set_data(extra, side.addr(12), 4));
        assert!(
            doca_sys::software::violations()
                .iter()
                .any(|v| v.contains(&format!("{:#x}", extra as usize))),
            "a data section outside the buffer is undefined: recorded"
        );
        ok(doca_buf_reset_data_len(extra));
        ok(doca_buf_get_data_len(extra, &mut len));
        assert_eq!(len, 0);
        assert_eq!(doca_buf_inventory_destroy(side.inv), DOCA_ERROR_IN_USE);
        for b in bufs {
            ok(doca_buf_dec_refcount(b, std::ptr::null_mut()));
        }
        let mut before = 9;
        ok(doca_buf_dec_refcount(extra, &mut before));
        assert_eq!(before, 1, "DOCA reports the count before the call");
    }
}

#[test]
fn cm_callbacks_and_send_receive() {
    let server = Side::new(Config::default());
    let client = Side::new(Config::default());
    server.listen(17010);
    client.connect(17010);
    pump(&[&server, &client], || {
        let s = server.rec.events.lock().unwrap().len();
        let c = client.rec.events.lock().unwrap().len();
        s >= 2 && c >= 1
    });
    let sev = server.take();
    let cev = client.take();
    let sconn = match sev.as_slice() {
        [Ev::Request(a), Ev::Established(b)] if a == b => *b as *mut doca_rdma_connection,
        other => panic!("server events: {other:?}"),
    };
    let cconn = match cev.as_slice() {
        [Ev::Established(c)] => *c as *mut doca_rdma_connection,
        other => panic!("client events: {other:?}"),
    };
    // SAFETY: live connections; out-pointers to locals.
    unsafe {
        let mut ud = doca_data { u64_: 0 };
        ok(doca_rdma_connection_get_user_data(sconn, &mut ud));
        assert_eq!(ud.u64_, 7);
        ok(doca_rdma_connection_get_user_data(cconn, &mut ud));
        assert_eq!(ud.u64_, 9);
        let mut id = 99;
        ok(doca_rdma_connection_get_id(sconn, &mut id));
    }

    // send -> receive, appended after the receive buffer's data section.
    let mut client = client;
    client.write_bytes(0, b"hello");
    let rbuf = server.buf(0, 64, 0);
    let recv = server.post_recv(rbuf);
    let send = client.send(cconn, client.buf(0, 64, 5));
    pump(&[&server, &client], || {
        server.rec.events.lock().unwrap().len() == 1 && client.rec.events.lock().unwrap().len() == 1
    });
    assert_eq!(server.take(), vec![Ev::Ok(recv as usize)]);
    assert_eq!(client.take(), vec![Ev::Ok(send as usize)]);
    // SAFETY: completed receive task; its result getters are valid.
    unsafe {
        let r = recv.cast::<doca_rdma_task_receive>();
        assert_eq!(doca_rdma_task_receive_get_result_len(r), 5);
        assert_eq!(
            doca_rdma_task_receive_get_result_opcode(r),
            DOCA_RDMA_OPCODE_RECV_SEND
        );
        assert_eq!(
            server.rec.recv_conns.lock().unwrap().as_slice(),
            [(recv as usize, sconn as usize)],
            "read in the successful completion callback"
        );
        assert_eq!(doca_rdma_task_receive_get_dst_buf(r), rbuf);
        // Reuse the receive: the next message is appended.
        ok(doca_task_submit(recv));
    }
    assert_eq!(server.bytes(0, 5), b"hello");

    // send with immediate, reusing the send task's buffer through a new task.
    let mut imm_task = std::ptr::null_mut();
    let imm = 0xdead_beef_u32.to_be();
    // SAFETY: live running context, connection and buffer.
    unsafe {
        ok(doca_rdma_task_send_imm_allocate_init(
            client.rdma,
            cconn,
            client.buf(0, 64, 3),
            imm,
            doca_data { u64_: 0 },
            &mut imm_task,
        ));
        ok(doca_task_submit(doca_rdma_task_send_imm_as_task(imm_task)));
    }
    pump(&[&server, &client], || {
        server.rec.events.lock().unwrap().len() == 1
    });
    assert_eq!(server.take(), vec![Ev::Ok(recv as usize)]);
    // SAFETY: completed receive task; buffer live.
    unsafe {
        let r = recv.cast::<doca_rdma_task_receive>();
        assert_eq!(
            doca_rdma_task_receive_get_result_opcode(r),
            DOCA_RDMA_OPCODE_RECV_SEND_WITH_IMM
        );
        assert_eq!(doca_rdma_task_receive_get_result_immediate_data(r), imm);
        assert_eq!(doca_rdma_task_receive_get_result_len(r), 3);
        let mut len = 0;
        ok(doca_buf_get_data_len(rbuf, &mut len));
        assert_eq!(len, 8);
    }
    assert_eq!(server.bytes(0, 8), b"hellohel");
}

#[test]
fn connect_without_listener_or_when_full_fails() {
    let client = Side::new(Config::default());
    client.connect(17020);
    pump(&[&client], || !client.rec.events.lock().unwrap().is_empty());
    assert!(matches!(client.take().as_slice(), [Ev::Failure(_)]));

    let server = Side::new(Config {
        max_conns: 1,
        ..Config::default()
    });
    let client2 = Side::new(Config::default());
    cm_pair(&server, &client, 17021);
    client2.connect(17021);
    pump(&[&server, &client2], || {
        !client2.rec.events.lock().unwrap().is_empty()
    });
    assert!(matches!(client2.take().as_slice(), [Ev::Failure(_)]));

    // A rejecting server.
    let rejecting = Side::new(Config {
        accept: false,
        ..Config::default()
    });
    rejecting.listen(17022);
    client2.connect(17022);
    pump(&[&rejecting, &client2], || {
        !client2.rec.events.lock().unwrap().is_empty()
    });
    assert!(matches!(client2.take().as_slice(), [Ev::Failure(_)]));
    assert!(matches!(rejecting.take().as_slice(), [Ev::Request(_)]));
}

/// One receiver-not-ready timer period of the provider (`DOCA_SYS_SW_RNR_TIMEOUT_MS`, 20 ms
/// unless set).
fn rnr_period() -> Duration {
    let ms = std::env::var("DOCA_SYS_SW_RNR_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    Duration::from_millis(ms)
}

/// A send that finds no receive is retried, not failed at once: with the context's retry
/// count at 0 (never set) it fails after one timer period. The period is read off the clock
/// as a lower bound (the send's failure cannot be seen before a period has passed since it
/// was submitted, however slow the machine), never by sleeping and then looking.
#[test]
fn receiver_not_ready_fails_the_send_and_the_connection() {
    let server = Side::new(Config::default());
    let client = Side::new(Config::default());
    let (cconn, _sconn) = cm_pair(&server, &client, 17030);
    let submitted = std::time::Instant::now();
    let send = client.send(cconn, client.buf(0, 64, 4));
    pump(&[&client], || !client.rec.events.lock().unwrap().is_empty());
    let waited = submitted.elapsed();
    assert!(
        waited >= rnr_period(),
        "the send failed after {waited:?}, before one timer period ({:?}): it was not retried",
        rnr_period()
    );
    assert_eq!(
        client.take(),
        vec![Ev::Err(send as usize, DOCA_ERROR_IO_FAILED)]
    );
    // The connection is in error: later tasks complete with an error, and a receive posted
    // now does not resurrect it.
    server.post_recv(server.buf(0, 64, 0));
    // SAFETY: completed task, resubmitted.
    unsafe { ok(doca_task_submit(send)) };
    pump(&[&client], || !client.rec.events.lock().unwrap().is_empty());
    assert_eq!(
        client.take(),
        vec![Ev::Err(send as usize, DOCA_ERROR_CONNECTION_ABORTED)]
    );
    server.progress();
    assert_eq!(server.take(), vec![]);
}

struct Remote {
    mmap: *mut doca_mmap,
}

fn import(server: &Side, client: &Side) -> Remote {
    Remote {
        mmap: client.import_mmap(&server.export_mmap()),
    }
}

#[test]
fn write_read_and_atomics_move_data() {
    let mut server = Side::new(Config::default());
    let mut client = Side::new(Config::default());
    let (cconn, _) = cm_pair(&server, &client, 17040);
    let remote = import(&server, &client);

    // write
    client.write_bytes(0, b"written!");
    let dst = client.remote_buf(remote.mmap, server.addr(64), 64, 0);
    let w = client.write(cconn, client.buf(0, 8, 8), dst);
    pump(&[&client], || !client.rec.events.lock().unwrap().is_empty());
    assert_eq!(client.take(), vec![Ev::Ok(w as usize)]);
    assert_eq!(server.bytes(64, 8), b"written!");
    assert_eq!(server.take(), vec![], "one-sided: no peer task");

    // read
    server.write_bytes(256, b"readme");
    let src = client.remote_buf(remote.mmap, server.addr(256), 6, 6);
    let local = client.buf(512, 64, 0);
    let mut task = std::ptr::null_mut();
    // SAFETY: live running context, connection and buffers.
    unsafe {
        ok(doca_rdma_task_read_allocate_init(
            client.rdma,
            cconn,
            src,
            local,
            doca_data { u64_: 0 },
            &mut task,
        ));
        ok(doca_task_submit(doca_rdma_task_read_as_task(task)));
    }
    pump(&[&client], || !client.rec.events.lock().unwrap().is_empty());
    assert!(matches!(client.take().as_slice(), [Ev::Ok(_)]));
    assert_eq!(client.bytes(512, 6), b"readme");

    // atomics on server.mem[100] (the first 8 bytes of the target's data)
    server.mem[100] = 41;
    let target = client.remote_buf(remote.mmap, server.addr(800), 8, 8);
    let result = client.buf(1024, 16, 0);
    let mut fa = std::ptr::null_mut();
    let mut cs = std::ptr::null_mut();
    // SAFETY: live running context, connection and buffers.
    unsafe {
        ok(doca_rdma_task_atomic_fetch_add_allocate_init(
            client.rdma,
            cconn,
            target,
            result,
            1,
            doca_data { u64_: 0 },
            &mut fa,
        ));
        ok(doca_task_submit(doca_rdma_task_atomic_fetch_add_as_task(
            fa,
        )));
        ok(doca_rdma_task_atomic_cmp_swp_allocate_init(
            client.rdma,
            cconn,
            target,
            result,
            42,
            1000,
            doca_data { u64_: 0 },
            &mut cs,
        ));
        ok(doca_task_submit(doca_rdma_task_atomic_cmp_swp_as_task(cs)));
    }
    pump(&[&client], || client.rec.events.lock().unwrap().len() == 2);
    assert!(client.take().iter().all(|e| matches!(e, Ev::Ok(_))));
    assert_eq!(server.mem[100], 1000);
    assert_eq!(
        client.mem[128..130],
        [41, 42],
        "previous values appended to the result buffer"
    );

    // write with immediate: data lands and a receive on the server gets the immediate.
    let recv = server.post_recv(server.buf(2048, 64, 0));
    let dst2 = client.remote_buf(remote.mmap, server.addr(1536), 64, 0);
    let mut wi = std::ptr::null_mut();
    client.write_bytes(0, b"imm");
    // SAFETY: live running context, connection and buffers.
    unsafe {
        ok(doca_rdma_task_write_imm_allocate_init(
            client.rdma,
            cconn,
            client.buf(0, 3, 3),
            dst2,
            7u32.to_be(),
            doca_data { u64_: 0 },
            &mut wi,
        ));
        ok(doca_task_submit(doca_rdma_task_write_imm_as_task(wi)));
    }
    pump(&[&client, &server], || {
        !client.rec.events.lock().unwrap().is_empty()
            && !server.rec.events.lock().unwrap().is_empty()
    });
    assert_eq!(server.take(), vec![Ev::Ok(recv as usize)]);
    assert_eq!(server.bytes(1536, 3), b"imm");
    // SAFETY: completed receive.
    unsafe {
        let r = recv.cast::<doca_rdma_task_receive>();
        assert_eq!(
            doca_rdma_task_receive_get_result_opcode(r),
            DOCA_RDMA_OPCODE_RECV_WRITE_WITH_IMM
        );
        assert_eq!(
            doca_rdma_task_receive_get_result_immediate_data(r),
            7u32.to_be()
        );
    }
}

#[test]
fn permission_violation_only_breaks_its_connection() {
    // The server exports read-only memory.
    let server = Side::new(Config {
        mmap_perms: DOCA_ACCESS_FLAG_LOCAL_READ_WRITE | DOCA_ACCESS_FLAG_RDMA_READ,
        ..Config::default()
    });
    let client = Side::new(Config::default());
    let (bad, _) = cm_pair(&server, &client, 17050);
    let (good, _) = cm_pair(&server, &client, 17051);
    let remote = import(&server, &client);

    // An outstanding send on the bad connection (no receive posted), then the violation.
    let pending = client.send(bad, client.buf(0, 8, 8));
    let dst = client.remote_buf(remote.mmap, server.addr(0), 64, 0);
    let w = client.write(bad, client.buf(0, 8, 8), dst);
    pump(&[&client], || client.rec.events.lock().unwrap().len() == 2);
    let events = client.take();
    assert_eq!(
        count(&events, &Ev::Err(w as usize, DOCA_ERROR_IO_FAILED)),
        1
    );
    assert_eq!(
        count(
            &events,
            &Ev::Err(pending as usize, DOCA_ERROR_CONNECTION_ABORTED)
        ),
        1
    );
    assert_eq!(server.bytes(0, 8), [0; 8], "nothing written");

    // Reading over the good connection still works.
    let src = client.remote_buf(remote.mmap, server.addr(0), 8, 8);
    let mut task = std::ptr::null_mut();
    // SAFETY: live running context, connection and buffers.
    unsafe {
        ok(doca_rdma_task_read_allocate_init(
            client.rdma,
            good,
            src,
            client.buf(64, 8, 0),
            doca_data { u64_: 0 },
            &mut task,
        ));
        ok(doca_task_submit(doca_rdma_task_read_as_task(task)));
    }
    pump(&[&client], || !client.rec.events.lock().unwrap().is_empty());
    assert!(matches!(client.take().as_slice(), [Ev::Ok(_)]));
    // The bad connection must be disconnected; the server hears of it.
    // SAFETY: live connection.
    unsafe { ok(doca_rdma_connection_disconnect(bad)) };
    pump(&[&server], || !server.rec.events.lock().unwrap().is_empty());
    assert!(matches!(server.take().as_slice(), [Ev::Disconnect(_)]));
    client.progress();
    assert_eq!(client.take(), vec![], "no completion twice");
}

#[test]
fn bounds_violations_fail_the_task() {
    let server = Side::new(Config::default());
    let client = Side::new(Config::default());
    let (conn, _) = cm_pair(&server, &client, 17060);
    let remote = import(&server, &client);
    // 16 bytes into an 8-byte remote buffer.
    let dst = client.remote_buf(remote.mmap, server.addr(0), 8, 0);
    let w = client.write(conn, client.buf(0, 16, 16), dst);
    pump(&[&client], || !client.rec.events.lock().unwrap().is_empty());
    assert_eq!(
        client.take(),
        vec![Ev::Err(w as usize, DOCA_ERROR_IO_FAILED)]
    );

    // The exporter's memory map is gone: remote access error.
    let (conn2, _) = cm_pair(&server, &client, 17061);
    let dst2 = client.remote_buf(remote.mmap, server.addr(0), 8, 0);
    // SAFETY: the server's mmap has no buffers out; it is not used after this.
    unsafe {
        // An exported mmap cannot be stopped, only destroyed.
        assert_eq!(doca_mmap_stop(server.mmap), DOCA_ERROR_NOT_PERMITTED);
        ok(doca_mmap_destroy(server.mmap));
    }
    let w2 = client.write(conn2, client.buf(0, 8, 8), dst2);
    pump(&[&client], || !client.rec.events.lock().unwrap().is_empty());
    assert_eq!(
        client.take(),
        vec![Ev::Err(w2 as usize, DOCA_ERROR_IO_FAILED)]
    );
}

#[test]
fn disconnect_flushes_outstanding_tasks_once() {
    let server = Side::new(Config::default());
    let client = Side::new(Config::default());
    let (cconn, sconn) = cm_pair(&server, &client, 17070);
    let sends: Vec<_> = (0..3)
        .map(|i| client.send(cconn, client.buf(i * 8, 8, 8)))
        .collect();
    // SAFETY: live connection.
    unsafe { ok(doca_rdma_connection_disconnect(cconn)) };
    pump(&[&client, &server], || {
        client.rec.events.lock().unwrap().len() == 3
            && !server.rec.events.lock().unwrap().is_empty()
    });
    let events = client.take();
    for s in &sends {
        assert_eq!(
            count(
                &events,
                &Ev::Err(*s as usize, DOCA_ERROR_CONNECTION_ABORTED)
            ),
            1
        );
    }
    assert_eq!(server.take(), vec![Ev::Disconnect(sconn as usize)]);
    // SAFETY: live connections.
    unsafe {
        ok(doca_rdma_connection_disconnect(sconn));
        assert_eq!(
            doca_rdma_connection_disconnect(cconn),
            DOCA_ERROR_INVALID_VALUE
        );
        // Submitting on a disconnected connection.
        assert_eq!(doca_task_submit(sends[0]), DOCA_ERROR_NOT_CONNECTED);
    }
    client.progress();
    server.progress();
    assert_eq!(client.take(), vec![]);
    assert_eq!(server.take(), vec![]);
}

#[test]
fn stop_with_tasks_in_flight() {
    let side = Side::new(Config::default());
    let peer = Side::new(Config::default());
    // Receives are posted once a connection is established.
    cm_pair(&side, &peer, 17100);
    let recv = side.post_recv(side.buf(0, 64, 0));
    // SAFETY: live context.
    unsafe { assert_eq!(doca_ctx_stop(side.ctx), DOCA_ERROR_IN_PROGRESS) };
    assert_eq!(side.state(), DOCA_CTX_STATE_STOPPING);
    // SAFETY: allocation needs RUNNING.
    unsafe {
        let mut t = std::ptr::null_mut();
        assert_eq!(
            doca_rdma_task_receive_allocate_init(
                side.rdma,
                side.buf(64, 8, 0),
                doca_data { u64_: 0 },
                &mut t
            ),
            DOCA_ERROR_BAD_STATE
        );
    }
    side.progress();
    let events = side.take();
    assert_eq!(
        count(
            &events,
            &Ev::Err(recv as usize, DOCA_ERROR_CONNECTION_ABORTED)
        ),
        1
    );
    assert_eq!(
        side.state(),
        DOCA_CTX_STATE_STOPPING,
        "the task is still allocated"
    );
    side.free(recv);
    side.progress();
    assert_eq!(side.state(), DOCA_CTX_STATE_IDLE);
    assert_eq!(
        side.take(),
        vec![Ev::State(DOCA_CTX_STATE_STOPPING, DOCA_CTX_STATE_IDLE)]
    );
}

#[test]
fn out_of_band_export_and_connect() {
    let a = Side::new(Config {
        max_conns: 1,
        ..Config::default()
    });
    let mut b = Side::new(Config::default());
    let export = |s: &Side| {
        let (mut p, mut n, mut c) = (std::ptr::null(), 0, std::ptr::null_mut());
        // SAFETY: live running context; out-pointers to locals; blob copied at once.
        unsafe {
            let status = doca_rdma_export(s.rdma, &mut p, &mut n, &mut c);
            (
                status,
                c,
                if status == DOCA_SUCCESS {
                    std::slice::from_raw_parts(p.cast::<u8>(), n).to_vec()
                } else {
                    vec![]
                },
            )
        }
    };
    let (st, aconn, ablob) = export(&a);
    ok(st);
    let (st, bconn, bblob) = export(&b);
    ok(st);
    assert_eq!(export(&a).0, DOCA_ERROR_FULL);
    // SAFETY: live contexts and connections; blobs are readable.
    unsafe {
        ok(doca_rdma_connect(
            a.rdma,
            bblob.as_ptr().cast(),
            bblob.len(),
            aconn,
        ));
        ok(doca_rdma_connect(
            b.rdma,
            ablob.as_ptr().cast(),
            ablob.len(),
            bconn,
        ));
    }
    b.write_bytes(0, b"oob");
    let recv = a.post_recv(a.buf(0, 16, 0));
    let send = b.send(bconn, b.buf(0, 3, 3));
    pump(&[&a, &b], || {
        !a.rec.events.lock().unwrap().is_empty() && !b.rec.events.lock().unwrap().is_empty()
    });
    assert_eq!(a.take(), vec![Ev::Ok(recv as usize)]);
    assert_eq!(b.take(), vec![Ev::Ok(send as usize)]);
    assert_eq!(a.bytes(0, 3), b"oob");
}

fn readable(fd: i32) -> bool {
    readable_within(fd, Duration::ZERO)
}

/// Whether `fd` becomes readable within `limit`: poll(2) blocks until it does (or the limit,
/// a bound on failure only, passes).
fn readable_within(fd: i32, limit: Duration) -> bool {
    let mut pfd = libc_pollfd {
        fd,
        events: 1,
        revents: 0,
    };
    let timeout = i32::try_from(limit.as_millis()).unwrap_or(i32::MAX);
    loop {
        // SAFETY: one valid pollfd.
        let n = unsafe { poll(&mut pfd, 1, timeout) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        return n == 1 && pfd.revents & 1 != 0;
    }
}

#[repr(C)]
struct libc_pollfd {
    fd: i32,
    events: i16,
    revents: i16,
}

unsafe extern "C" {
    fn poll(fds: *mut libc_pollfd, nfds: u64, timeout: i32) -> i32;
}

#[test]
fn notification_fd_becomes_readable() {
    let server = Side::new(Config::default());
    let mut client = Side::new(Config::default());
    let (cconn, _) = cm_pair(&server, &client, 17080);
    let mut fd = -1;
    // SAFETY: live progress engine; out-pointer to a local.
    unsafe {
        ok(doca_pe_get_notification_handle(server.pe, &mut fd));
        ok(doca_pe_request_notification(server.pe));
    }
    assert!(!readable(fd), "nothing pending yet");
    let _recv = server.post_recv(server.buf(0, 64, 0));
    client.write_bytes(0, b"ping");
    client.send(cconn, client.buf(0, 4, 4));
    assert!(readable(fd), "a completion is pending for the server");
    // SAFETY: live progress engine and its handle.
    unsafe { ok(doca_pe_clear_notification(server.pe, fd)) };
    assert!(!readable(fd));
    assert!(server.progress());
    assert_eq!(server.take().len(), 1);

    // Receiver-not-ready deadline wakes the armed client engine later.
    let mut cfd = -1;
    // SAFETY: live progress engine; out-pointer to a local.
    unsafe {
        ok(doca_pe_get_notification_handle(client.pe, &mut cfd));
        client.progress();
        client.take();
        client.send(cconn, client.buf(0, 4, 4));
        ok(doca_pe_request_notification(client.pe));
    }
    // Nobody progresses the client meanwhile: only the provider's deadline can signal it.
    assert!(readable_within(cfd, BOUND), "RNR deadline never signalled");
    client.progress();
    assert!(matches!(
        client.take().as_slice(),
        [Ev::Err(_, DOCA_ERROR_IO_FAILED)]
    ));
}

#[test]
fn contexts_progressed_from_two_threads() {
    let server = Side::new(Config::default());
    let mut client = Side::new(Config::default());
    let (cconn, _) = cm_pair(&server, &client, 17090);
    client.write_bytes(0, b"x");
    const N: usize = 200;
    let server_ptr = &*server as *const Side as usize;
    let t = std::thread::spawn(move || {
        // SAFETY: `server` outlives the thread (joined below) and is only progressed here.
        let server = unsafe { &*(server_ptr as *const Side) };
        let bufs: Vec<_> = (0..8).map(|i| server.buf(i * 64, 64, 0)).collect();
        let recvs: Vec<_> = bufs.iter().map(|b| server.post_recv(*b)).collect();
        let mut got = 0;
        while got < N {
            server.progress();
            for e in server.take() {
                let Ev::Ok(task) = e else { panic!("{e:?}") };
                got += 1;
                let dst = recvs.iter().position(|r| *r as usize == task).unwrap();
                // SAFETY: completed receive, resubmitted with an emptied buffer.
                unsafe {
                    ok(doca_buf_reset_data_len(bufs[dst]));
                    ok(doca_task_submit(task as *mut doca_task));
                }
            }
        }
    });
    let buf = client.buf(0, 1, 1);
    let mut task = std::ptr::null_mut();
    // SAFETY: live running context, connection and buffer.
    unsafe {
        ok(doca_rdma_task_send_allocate_init(
            client.rdma,
            cconn,
            buf,
            doca_data { u64_: 0 },
            &mut task,
        ));
    }
    for _ in 0..N {
        // SAFETY: the task is idle (its previous completion was delivered).
        unsafe { ok(doca_task_submit(doca_rdma_task_send_as_task(task))) };
        pump(&[&client], || !client.rec.events.lock().unwrap().is_empty());
        assert!(matches!(client.take().as_slice(), [Ev::Ok(_)]));
    }
    t.join().unwrap();
}
