//! Receiver-not-ready retries (`doca_rdma_set_rnr_retry_count`) and doorbells
//! (`doca_task_submit_ex`, `doca_ctx_flush_tasks`), proven on the provider's counters. Its own
//! test binary (one process, one test), so no other test's calls land between two readings,
//! and so it can shorten the provider's receiver-not-ready timer before the first call.
//!
//! Nothing here measures time: a retry budget is proven by counting the timer periods that
//! ended with a retry (`rnr_retries`), not by how long they took.
#![cfg(doca_sys_software)]
#![allow(missing_docs)]

mod common;

use common::*;
use doca_sys::*;
use std::ptr::null_mut;

fn read() -> Counters {
    counters("mlx5_0").expect("the software provider counts mlx5_0")
}

/// A server and a client connected over RDMA CM on `port`; the client's context has the
/// receiver-not-ready retry count `rnr` (`None`: never set).
fn pair(port: u16, rnr: Option<u8>) -> (Box<Side>, Box<Side>, *mut doca_rdma_connection) {
    let server = Side::new(Config::default());
    let client = Side::new(Config {
        start: false,
        ..Config::default()
    });
    if let Some(n) = rnr {
        // SAFETY: a live idle context.
        unsafe { ok(doca_rdma_set_rnr_retry_count(client.rdma, n)) };
    }
    client.start();
    let (cconn, _) = cm_pair(&server, &client, port);
    (server, client, cconn)
}

/// With no receive ever posted, a send fails after its first try and `retries` retries.
fn send_fails_after(port: u16, rnr: Option<u8>, retries: u64) {
    let (server, client, cconn) = pair(port, rnr);
    let before = read();
    let send = client.send(cconn, client.buf(0, 8, 8));
    assert_eq!(
        wait_events(&[&client, &server], &client, 1),
        [Ev::Err(send as usize, DOCA_ERROR_IO_FAILED)],
        "receiver not ready, retry count {rnr:?}"
    );
    let d = read().since(&before);
    assert_eq!(
        (d.rnr_waits, d.rnr_retries, d.rnr_failures),
        (1, retries, 1),
        "retry count {rnr:?}"
    );
    assert_eq!((d.task_submissions, d.doorbells), (1, 1));
}

#[test]
fn rnr_retries_and_doorbells_are_counted() {
    // One short timer period per try, set before the provider reads it (first call below).
    std::env::set_var("DOCA_SYS_SW_RNR_TIMEOUT_MS", "2");

    // Receiver not ready: the budget is the first try plus `rnr_retry_count` retries.
    send_fails_after(18201, None, 0);
    send_fails_after(18202, Some(0), 0);
    send_fails_after(18203, Some(3), 3);
    send_fails_after(18204, Some(6), 6);

    // 7 retries forever: the send outlives any finite budget, then meets a receive.
    let (server, client, cconn) = pair(18205, Some(7));
    let before = read();
    let send = client.send(cconn, client.buf(0, 8, 8));
    pump(&[&client, &server], || {
        read().since(&before).rnr_retries > 6
    });
    assert!(client.take().is_empty(), "still waiting");
    let recv = server.post_recv(server.buf(0, 64, 0));
    assert_eq!(
        wait_events(&[&client, &server], &client, 1),
        [Ev::Ok(send as usize)]
    );
    assert_eq!(wait_events(&[&server], &server, 1), [Ev::Ok(recv as usize)]);
    let d = read().since(&before);
    assert_eq!((d.rnr_waits, d.rnr_failures), (1, 0));

    // A send that finds its receive waits for nothing.
    let before = read();
    let recv = server.post_recv(server.buf(64, 64, 0));
    let send = client.send(cconn, client.buf(8, 8, 8));
    assert_eq!(
        wait_events(&[&client, &server], &client, 1),
        [Ev::Ok(send as usize)]
    );
    assert_eq!(wait_events(&[&server], &server, 1), [Ev::Ok(recv as usize)]);
    let d = read().since(&before);
    assert_eq!((d.rnr_waits, d.rnr_retries, d.rnr_failures), (0, 0, 0));
    assert_eq!((d.task_submissions, d.doorbells), (2, 2));

    // Doorbells: one per flushing submit or flush that had work, none per unflushed submit.
    let a = Side::new(Config::default());
    let b = Side::new(Config::default());
    let (aconn, _) = oob_pair(&a, &b);
    let remote = a.import_mmap(&b.export_mmap());
    let writes: Vec<*mut doca_task> = (0..3)
        .map(|i| {
            let mut task = null_mut();
            let dst = a.remote_buf(remote, b.addr(i * 64), 64, 0);
            // SAFETY: a live running context, connection and buffers; out-pointer to a local.
            unsafe {
                ok(doca_rdma_task_write_allocate_init(
                    a.rdma,
                    aconn,
                    a.buf(i * 8, 8, 8),
                    dst,
                    doca_data { u64_: 0 },
                    &mut task,
                ));
                doca_rdma_task_write_as_task(task)
            }
        })
        .collect();
    let before = read();
    // SAFETY: live tasks of a running context; each is resubmitted only after its callback.
    unsafe {
        for &w in &writes {
            ok(doca_task_submit_ex(w, DOCA_TASK_SUBMIT_FLAG_NONE));
        }
        let d = read().since(&before);
        assert_eq!((d.task_submissions, d.doorbells), (3, 0));
        doca_ctx_flush_tasks(a.ctx);
        wait_events(&[&a], &a, 3);
        doca_ctx_flush_tasks(a.ctx);
        assert_eq!(read().since(&before).doorbells, 1, "nothing left to flush");

        ok(doca_task_submit_ex(writes[0], DOCA_TASK_SUBMIT_FLAG_NONE));
        ok(doca_task_submit_ex(writes[1], DOCA_TASK_SUBMIT_FLAG_FLUSH));
        ok(doca_task_submit(writes[2]));
        wait_events(&[&a], &a, 3);
    }
    let d = read().since(&before);
    assert_eq!((d.task_submissions, d.doorbells), (6, 3));
    assert!(doca_sys::software::violations().is_empty());
}
