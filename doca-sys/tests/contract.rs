//! The provider contract (`CONTRACT.md`): one test per row of the table, each proving what the
//! provider does for one DOCA function, and a meta test that keeps the table complete.
#![cfg(doca_sys_software)]
#![allow(missing_docs)]

mod common;

use common::*;
use doca_sys::*;
use std::ffi::{c_char, CStr};
use std::ptr::{null, null_mut};

const ND: doca_data = doca_data { u64_: 0 };

// ------------------------------------------------------------------------------------------
// Meta
// ------------------------------------------------------------------------------------------

/// Every function of `signature_list.rs` has a row in CONTRACT.md, and every test the table
/// names exists as `fn <name>` in `tests/*.rs`.
#[test]
fn contract_table_covers_every_function() {
    let root = env!("CARGO_MANIFEST_DIR");
    let read = |p: &str| std::fs::read_to_string(format!("{root}/{p}")).expect(p);
    let functions: Vec<String> = read("src/software/signature_list.rs")
        .lines()
        .map(|l| l.trim().trim_end_matches(',').to_owned())
        .filter(|l| l.starts_with("doca_"))
        .collect();
    assert!(
        functions.len() > 100,
        "parsed {} functions",
        functions.len()
    );

    let mut rows = std::collections::HashMap::new();
    // The contract table comes before the first second-level section (the sections after it,
    // "Cost on hardware" among them, have tables of their own).
    let contract = read("CONTRACT.md");
    for line in contract.lines().take_while(|l| !l.starts_with("## ")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | function | documented | provider | tests |
        if cells.len() < 6 || !cells[1].starts_with('`') {
            continue;
        }
        let function = cells[1].trim_matches('`').to_owned();
        let tests: Vec<String> = cells[4]
            .split(',')
            .map(|t| t.trim().trim_matches('`').to_owned())
            .filter(|t| !t.is_empty())
            .collect();
        assert!(!tests.is_empty(), "row {function} names no test");
        assert!(
            rows.insert(function.clone(), tests).is_none(),
            "two rows for {function}"
        );
    }
    let missing: Vec<&String> = functions
        .iter()
        .filter(|f| !rows.contains_key(*f))
        .collect();
    assert!(missing.is_empty(), "functions without a row: {missing:?}");
    let extra: Vec<&String> = rows.keys().filter(|f| !functions.contains(f)).collect();
    assert!(
        extra.is_empty(),
        "rows for functions not in signature_list.rs: {extra:?}"
    );

    let mut sources = String::new();
    for entry in std::fs::read_dir(format!("{root}/tests")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            sources.push_str(&std::fs::read_to_string(path).unwrap());
        }
    }
    for (function, tests) in &rows {
        for test in tests {
            assert!(
                sources.contains(&format!("fn {test}(")),
                "row {function}: no `fn {test}` in doca-sys/tests/*.rs"
            );
        }
    }
}

// ------------------------------------------------------------------------------------------
// Errors and devices
// ------------------------------------------------------------------------------------------

#[test]
fn error_names_and_descriptions() {
    // SAFETY: both return static C strings for any code.
    unsafe {
        let n = |e| CStr::from_ptr(doca_error_get_name(e)).to_str().unwrap();
        let d = |e| CStr::from_ptr(doca_error_get_descr(e)).to_str().unwrap();
        assert_eq!(n(DOCA_SUCCESS), "DOCA_SUCCESS");
        assert_eq!(n(DOCA_ERROR_IN_PROGRESS), "DOCA_ERROR_IN_PROGRESS");
        assert_eq!(n(DOCA_ERROR_SKIPPED), "DOCA_ERROR_SKIPPED");
        assert!(!d(DOCA_ERROR_DRIVER).is_empty());
        // A code newer than the provider still gets a string.
        assert!(!n(1000).is_empty());
        assert!(!d(1000).is_empty());
    }
}

#[test]
fn devinfo_create_list_lists_three_devices() {
    let mut list: *mut *mut doca_devinfo = null_mut();
    let mut n = 0;
    // SAFETY: out-pointers to locals (or NULL on purpose).
    unsafe {
        assert_eq!(
            doca_devinfo_create_list(null_mut(), &mut n),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            doca_devinfo_create_list(&mut list, null_mut()),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_devinfo_create_list(&mut list, &mut n));
        assert_eq!(n, 3);
        let mut name = [0 as c_char; 64];
        let names: Vec<String> = (0..3)
            .map(|i| {
                ok(doca_devinfo_get_ibdev_name(
                    *list.add(i),
                    name.as_mut_ptr(),
                    64,
                ));
                CStr::from_ptr(name.as_ptr()).to_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(names, ["mlx5_0", "mlx5_1", "mlx5_2"]);
        ok(doca_devinfo_destroy_list(list));
    }
}

#[test]
fn devinfo_destroy_list_checks_its_argument() {
    let mut list: *mut *mut doca_devinfo = null_mut();
    let mut n = 0;
    // SAFETY: a list from create_list, destroyed once; NULL on purpose.
    unsafe {
        assert_eq!(
            doca_devinfo_destroy_list(null_mut()),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_devinfo_create_list(&mut list, &mut n));
        ok(doca_devinfo_destroy_list(list));
    }
}

#[test]
fn devinfo_get_ibdev_name_needs_64_bytes() {
    let info = devinfo(1);
    let mut name = [0 as c_char; 64];
    // SAFETY: a list entry; buffers of the stated sizes.
    unsafe {
        assert_eq!(
            doca_devinfo_get_ibdev_name(info, name.as_mut_ptr(), 63),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            doca_devinfo_get_ibdev_name(null(), name.as_mut_ptr(), 64),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            doca_devinfo_get_ibdev_name(info, null_mut(), 64),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_devinfo_get_ibdev_name(info, name.as_mut_ptr(), 64));
        assert_eq!(CStr::from_ptr(name.as_ptr()), c"mlx5_1");
    }
}

#[test]
fn devinfo_get_pci_addr_str_reports_bdf() {
    let mut pci = [0 as c_char; 13];
    // SAFETY: list entries; a buffer of DOCA_DEVINFO_PCI_ADDR_SIZE bytes.
    unsafe {
        assert_eq!(
            doca_devinfo_get_pci_addr_str(null(), pci.as_mut_ptr()),
            DOCA_ERROR_INVALID_VALUE
        );
        for (i, want) in [c"0000:03:00.0", c"0000:03:00.1", c"0000:03:00.2"]
            .iter()
            .enumerate()
        {
            ok(doca_devinfo_get_pci_addr_str(devinfo(i), pci.as_mut_ptr()));
            assert_eq!(CStr::from_ptr(pci.as_ptr()), *want);
        }
    }
}

#[test]
fn dev_open_opens_any_listed_device() {
    let mut dev = null_mut();
    // SAFETY: list entries; out-pointers to locals.
    unsafe {
        assert_eq!(
            doca_dev_open(null_mut(), &mut dev),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            doca_dev_open(devinfo(0), null_mut()),
            DOCA_ERROR_INVALID_VALUE
        );
        // Even the device without RDMA opens: its capabilities say what it cannot do.
        ok(doca_dev_open(devinfo(2), &mut dev));
        ok(doca_dev_close(dev));
    }
}

#[test]
fn dev_close_refuses_while_in_use() {
    let dev = open_dev();
    let mut rdma = null_mut();
    let mut mmap = null_mut();
    let mut mem = [0u64; 8];
    // SAFETY: an open device; objects created and destroyed here.
    unsafe {
        assert_eq!(doca_dev_close(null_mut()), DOCA_ERROR_INVALID_VALUE);
        ok(doca_rdma_create(dev, &mut rdma));
        assert_eq!(
            doca_dev_close(dev),
            DOCA_ERROR_IN_USE,
            "an RDMA context uses it"
        );
        ok(doca_rdma_destroy(rdma));
        ok(doca_mmap_create(&mut mmap));
        ok(doca_mmap_set_memrange(mmap, mem.as_mut_ptr().cast(), 64));
        ok(doca_mmap_add_dev(mmap, dev));
        assert_eq!(doca_dev_close(dev), DOCA_ERROR_IN_USE, "an mmap holds it");
        ok(doca_mmap_destroy(mmap));
        ok(doca_dev_close(dev));
    }
}

#[test]
fn dev_as_devinfo_returns_the_listed_entry() {
    let mut dev = null_mut();
    // SAFETY: an entry of the list; the device is opened and closed here.
    unsafe {
        assert!(doca_dev_as_devinfo(null()).is_null());
        ok(doca_dev_open(devinfo(1), &mut dev));
        assert_eq!(doca_dev_as_devinfo(dev), devinfo(1));
        ok(doca_dev_close(dev));
    }
}

/// All eight `doca_rdma_cap_task_*_is_supported`: SUCCESS on mlx5_0 and mlx5_1,
/// NOT_SUPPORTED on mlx5_2, INVALID_VALUE for NULL.
#[test]
fn cap_task_is_supported_per_device() {
    type Cap = unsafe extern "C" fn(*const doca_devinfo) -> doca_error_t;
    let caps: [Cap; 8] = [
        doca_rdma_cap_task_receive_is_supported,
        doca_rdma_cap_task_send_is_supported,
        doca_rdma_cap_task_send_imm_is_supported,
        doca_rdma_cap_task_read_is_supported,
        doca_rdma_cap_task_write_is_supported,
        doca_rdma_cap_task_write_imm_is_supported,
        doca_rdma_cap_task_atomic_cmp_swp_is_supported,
        doca_rdma_cap_task_atomic_fetch_add_is_supported,
    ];
    for cap in caps {
        // SAFETY: list entries, or NULL on purpose.
        unsafe {
            ok(cap(devinfo(0)));
            ok(cap(devinfo(1)));
            assert_eq!(cap(devinfo(2)), DOCA_ERROR_NOT_SUPPORTED);
            assert_eq!(cap(null()), DOCA_ERROR_INVALID_VALUE);
        }
    }
}

/// `doca_rdma_cap_get_max_{message,send_queue,recv_queue}_size`: 1 GiB / 32768 / 32768 on
/// mlx5_0 and mlx5_1; DRIVER (capability query failed) on mlx5_2; INVALID_VALUE for NULL.
#[test]
fn cap_get_max_sizes_per_device() {
    type Cap = unsafe extern "C" fn(*const doca_devinfo, *mut u32) -> doca_error_t;
    let caps: [(Cap, u32); 3] = [
        (doca_rdma_cap_get_max_message_size, 1 << 30),
        (doca_rdma_cap_get_max_send_queue_size, 32768),
        (doca_rdma_cap_get_max_recv_queue_size, 32768),
    ];
    for (cap, want) in caps {
        let mut v = 0;
        // SAFETY: list entries and a local, or NULL on purpose.
        unsafe {
            for i in 0..2 {
                ok(cap(devinfo(i), &mut v));
                assert_eq!(v, want);
            }
            assert_eq!(cap(devinfo(2), &mut v), DOCA_ERROR_DRIVER);
            assert_eq!(cap(null(), &mut v), DOCA_ERROR_INVALID_VALUE);
            assert_eq!(cap(devinfo(0), null_mut()), DOCA_ERROR_INVALID_VALUE);
        }
    }
}

/// A caller that walks the device list and skips devices whose capability query fails still
/// finds both RDMA devices; an RDMA context on mlx5_2 does not start.
#[test]
fn third_device_without_rdma_is_skippable() {
    let usable: Vec<usize> = (0..3)
        .filter(|&i| {
            let mut max = 0;
            // SAFETY: list entries and a local.
            unsafe {
                doca_rdma_cap_task_send_is_supported(devinfo(i)) == DOCA_SUCCESS
                    && doca_rdma_cap_get_max_send_queue_size(devinfo(i), &mut max) == DOCA_SUCCESS
            }
        })
        .collect();
    assert_eq!(usable, [0, 1]);
    let (mut dev, mut pe, mut rdma) = (null_mut(), null_mut(), null_mut());
    // SAFETY: objects created, used and destroyed here.
    unsafe {
        ok(doca_dev_open(devinfo(2), &mut dev));
        ok(doca_pe_create(&mut pe));
        ok(doca_rdma_create(dev, &mut rdma));
        ok(doca_pe_connect_ctx(pe, doca_rdma_as_ctx(rdma)));
        assert_eq!(
            doca_ctx_start(doca_rdma_as_ctx(rdma)),
            DOCA_ERROR_NOT_SUPPORTED
        );
        ok(doca_rdma_destroy(rdma));
        ok(doca_pe_destroy(pe));
        ok(doca_dev_close(dev));
    }
}

// ------------------------------------------------------------------------------------------
// Progress engine and context
// ------------------------------------------------------------------------------------------

fn readable(fd: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut pfd, 1, 0) };
    n == 1 && pfd.revents & libc::POLLIN != 0
}

fn handle(side: &Side) -> i32 {
    let mut fd = -1;
    // SAFETY: live progress engine; out-pointer to a local.
    unsafe { ok(doca_pe_get_notification_handle(side.pe, &mut fd)) };
    fd
}

#[test]
fn pe_create_checks_its_argument() {
    let mut pe = null_mut();
    // SAFETY: out-pointer to a local, or NULL on purpose.
    unsafe {
        assert_eq!(doca_pe_create(null_mut()), DOCA_ERROR_INVALID_VALUE);
        ok(doca_pe_create(&mut pe));
        ok(doca_pe_destroy(pe));
    }
}

#[test]
fn pe_destroy_refuses_with_contexts() {
    let side = Side::new(Config {
        start: false,
        ..Config::default()
    });
    // SAFETY: live objects of `side`, destroyed in order.
    unsafe {
        assert_eq!(doca_pe_destroy(null_mut()), DOCA_ERROR_INVALID_VALUE);
        assert_eq!(doca_pe_destroy(side.pe), DOCA_ERROR_IN_USE);
        ok(doca_rdma_destroy(side.rdma));
        ok(doca_pe_destroy(side.pe));
    }
}

#[test]
fn pe_connect_ctx_once_and_idle_only() {
    let side = Side::new(Config {
        start: false,
        ..Config::default()
    });
    let mut other = null_mut();
    // SAFETY: live objects; `other` is created and destroyed here.
    unsafe {
        ok(doca_pe_create(&mut other));
        assert_eq!(
            doca_pe_connect_ctx(other, side.ctx),
            DOCA_ERROR_NOT_PERMITTED,
            "already connected"
        );
        assert_eq!(
            doca_pe_connect_ctx(side.pe, side.ctx),
            DOCA_ERROR_NOT_PERMITTED,
            "already connected, to this engine too"
        );
        assert_eq!(
            doca_pe_connect_ctx(null_mut(), side.ctx),
            DOCA_ERROR_INVALID_VALUE
        );
        side.start();
        assert_eq!(doca_pe_connect_ctx(other, side.ctx), DOCA_ERROR_BAD_STATE);
        ok(doca_pe_destroy(other));
    }
}

static REENTRY: std::sync::Mutex<Option<(usize, u8)>> = std::sync::Mutex::new(None);

unsafe extern "C" fn reentrant_state_cb(
    ud: doca_data,
    _ctx: *mut doca_ctx,
    _prev: doca_ctx_states,
    _next: doca_ctx_states,
) {
    // SAFETY: the user data is the progress engine of the test; progressing it here is the
    // misuse under test (the provider refuses it).
    let (pe, got) = unsafe { (ud.ptr, doca_pe_progress(ud.ptr.cast())) };
    *REENTRY.lock().unwrap() = Some((pe as usize, got));
}

#[test]
fn pe_progress_runs_callbacks_and_refuses_reentry() {
    let side = Side::new(Config {
        start: false,
        ..Config::default()
    });
    // SAFETY: live objects; the callback's user data is the live progress engine.
    unsafe {
        assert_eq!(doca_pe_progress(null_mut()), 0);
        ok(doca_ctx_set_state_changed_cb(
            side.ctx,
            Some(reentrant_state_cb),
        ));
        ok(doca_ctx_set_user_data(
            side.ctx,
            doca_data {
                ptr: side.pe.cast(),
            },
        ));
        assert_eq!(doca_ctx_start(side.ctx), DOCA_ERROR_IN_PROGRESS);
        assert_eq!(
            side.state(),
            DOCA_CTX_STATE_STARTING,
            "callbacks need progress"
        );
        assert_eq!(doca_pe_progress(side.pe), 1);
        assert_eq!(*REENTRY.lock().unwrap(), Some((side.pe as usize, 0)));
        assert!(violated("doca_pe_progress", side.pe as usize));
        while doca_pe_progress(side.pe) != 0 {}
        assert_eq!(side.state(), DOCA_CTX_STATE_RUNNING);
        assert_eq!(doca_pe_progress(side.pe), 0, "nothing left");
    }
}

/// One call delivers one callback (doca_pe.h: a call serves the next context with a completed
/// task, running that task's callback), never a batch.
#[test]
fn pe_progress_runs_one_callback_per_call() {
    let a = Side::new(Config::default());
    let b = Side::new(Config::default());
    let (aconn, _) = oob_pair(&a, &b);
    // Two writes of no data complete at once: two completions are pending.
    let w1 = a.write(aconn, null_mut(), null_mut());
    let w2 = a.write(aconn, null_mut(), null_mut());
    // SAFETY: a live engine, not called from a callback.
    unsafe {
        assert_eq!(doca_pe_progress(a.pe), 1);
        assert_eq!(a.take(), vec![Ev::Ok(w1 as usize)], "one callback");
        assert_eq!(doca_pe_progress(a.pe), 1);
        assert_eq!(a.take(), vec![Ev::Ok(w2 as usize)]);
        assert_eq!(doca_pe_progress(a.pe), 0, "nothing left");
    }
}

/// (previous state, next state, state seen inside the callback, what allocating a receive
/// there answered) per state callback, by context.
type StateSeen = (
    usize,
    doca_ctx_states,
    doca_ctx_states,
    doca_ctx_states,
    doca_error_t,
);
static STATE_SEEN: std::sync::Mutex<Vec<StateSeen>> = std::sync::Mutex::new(Vec::new());

unsafe extern "C" fn observing_state_cb(
    ud: doca_data,
    ctx: *mut doca_ctx,
    prev: doca_ctx_states,
    next: doca_ctx_states,
) {
    let mut state = 99;
    let mut t = null_mut();
    // SAFETY: the user data is the test's RDMA context, `ctx` its context; a receive allocated
    // here is freed at once.
    let allocated = unsafe {
        ok(doca_ctx_get_state(ctx, &mut state));
        let rdma = ud.ptr.cast::<doca_rdma>();
        let status = doca_rdma_task_receive_allocate_init(rdma, null_mut(), ND, &mut t);
        if status == DOCA_SUCCESS {
            doca_task_free(doca_rdma_task_receive_as_task(t));
        }
        status
    };
    STATE_SEEN
        .lock()
        .unwrap()
        .push((ctx as usize, prev, next, state, allocated));
}

/// A state callback runs while the context is in the state it announces (doca_ctx.h: the
/// callback type says the context is already in its new state), so a context is STARTING
/// during its IDLE -> STARTING callback and cannot allocate tasks there (doca_ctx.h: STARTING).
#[test]
fn ctx_state_callbacks_run_in_the_announced_state() {
    let side = idle_side();
    let mut t = null_mut();
    // SAFETY: live context; the callback's user data is this context.
    unsafe {
        ok(doca_ctx_set_state_changed_cb(
            side.ctx,
            Some(observing_state_cb),
        ));
        ok(doca_ctx_set_user_data(
            side.ctx,
            doca_data {
                ptr: side.rdma.cast(),
            },
        ));
        assert_eq!(doca_ctx_start(side.ctx), DOCA_ERROR_IN_PROGRESS);
        side.progress();
        assert_eq!(side.state(), DOCA_CTX_STATE_RUNNING);
        // A task allocated before stopping makes the stop asynchronous; freed before the next
        // progress, the context could go idle at once, but not before its STOPPING callback.
        ok(doca_rdma_task_receive_allocate_init(
            side.rdma,
            null_mut(),
            ND,
            &mut t,
        ));
        assert_eq!(doca_ctx_stop(side.ctx), DOCA_ERROR_IN_PROGRESS);
        doca_task_free(doca_rdma_task_receive_as_task(t));
        side.progress();
        assert_eq!(side.state(), DOCA_CTX_STATE_IDLE);
    }
    let me = side.ctx as usize;
    let seen: Vec<_> = STATE_SEEN
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.0 == me)
        .map(|s| (s.1, s.2, s.3, s.4))
        .collect();
    use DOCA_ERROR_BAD_STATE as BAD;
    assert_eq!(
        seen,
        [
            (
                DOCA_CTX_STATE_IDLE,
                DOCA_CTX_STATE_STARTING,
                DOCA_CTX_STATE_STARTING,
                BAD
            ),
            (
                DOCA_CTX_STATE_STARTING,
                DOCA_CTX_STATE_RUNNING,
                DOCA_CTX_STATE_RUNNING,
                DOCA_SUCCESS
            ),
            (
                DOCA_CTX_STATE_RUNNING,
                DOCA_CTX_STATE_STOPPING,
                DOCA_CTX_STATE_STOPPING,
                BAD
            ),
            (
                DOCA_CTX_STATE_STOPPING,
                DOCA_CTX_STATE_IDLE,
                DOCA_CTX_STATE_IDLE,
                BAD
            ),
        ]
    );
}

#[test]
fn pe_get_notification_handle_is_stable() {
    let side = Side::new(Config::default());
    let mut fd = -1;
    // SAFETY: live engine; out-pointers to locals, or NULL on purpose.
    unsafe {
        assert_eq!(
            doca_pe_get_notification_handle(side.pe, null_mut()),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            doca_pe_get_notification_handle(null(), &mut fd),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_pe_get_notification_handle(side.pe, &mut fd));
    }
    assert!(fd >= 0);
    assert_eq!(handle(&side), fd);
}

/// Armed, the handle is signalled by task completions only: not by connection requests,
/// establishment, disconnection, or context state changes (which `doca_pe_progress` still
/// delivers).
#[test]
fn pe_notification_only_for_task_completions() {
    let server = Side::new(Config::default());
    let client = Side::new(Config {
        start: false,
        ..Config::default()
    });
    let (sfd, cfd) = (handle(&server), handle(&client));
    // SAFETY: live engines and contexts.
    unsafe {
        ok(doca_pe_request_notification(client.pe));
        assert_eq!(doca_ctx_start(client.ctx), DOCA_ERROR_IN_PROGRESS);
        assert!(!readable(cfd), "a state change does not signal");
        assert!(client.progress(), "but progress delivers it");
        assert_eq!(client.state(), DOCA_CTX_STATE_RUNNING);
        client.take();

        server.listen(18010);
        ok(doca_pe_request_notification(server.pe));
        ok(doca_pe_request_notification(client.pe));
        client.connect(18010);
        assert!(!readable(sfd), "a connection request does not signal");
        assert!(server.progress());
        assert!(!readable(cfd), "establishment does not signal");
        assert!(client.progress());
        let sev = server.take();
        let cev = client.take();
        assert!(matches!(
            sev.as_slice(),
            [Ev::Request(_), Ev::Established(_)]
        ));
        let Ev::Established(c) = cev[0] else {
            panic!("{cev:?}")
        };
        let cconn = c as *mut doca_rdma_connection;

        // A task completion signals.
        ok(doca_pe_clear_notification(server.pe, sfd));
        ok(doca_pe_request_notification(server.pe));
        let recv = server.post_recv(server.buf(0, 64, 0));
        let send = client.send(cconn, client.buf(0, 8, 8));
        assert!(readable(sfd), "the receive completed");
        ok(doca_pe_clear_notification(server.pe, sfd));
        assert!(server.progress());
        assert_eq!(server.take(), vec![Ev::Ok(recv as usize)]);
        client.progress();
        assert_eq!(client.take(), vec![Ev::Ok(send as usize)]);

        // A disconnection does not signal.
        ok(doca_pe_request_notification(server.pe));
        ok(doca_rdma_connection_disconnect(cconn));
        assert!(!readable(sfd), "a disconnection does not signal");
        assert!(server.progress());
        assert!(matches!(server.take().as_slice(), [Ev::Disconnect(_)]));
    }
}

#[test]
fn pe_clear_notification_drains_the_handle() {
    let a = Side::new(Config::default());
    let b = Side::new(Config::default());
    let (aconn, _) = oob_pair(&a, &b);
    let fd = handle(&a);
    // SAFETY: live engine and its handle.
    unsafe {
        ok(doca_pe_request_notification(a.pe));
        let w = a.write(aconn, null_mut(), null_mut());
        assert!(readable(fd));
        ok(doca_pe_clear_notification(a.pe, fd));
        assert!(!readable(fd));
        assert_eq!(
            doca_pe_clear_notification(a.pe, fd + 1000),
            DOCA_ERROR_INVALID_VALUE,
            "not this engine's handle"
        );
        a.progress();
        assert_eq!(a.take(), vec![Ev::Ok(w as usize)]);
    }
}

#[test]
fn ctx_start_is_asynchronous() {
    let side = Side::new(Config {
        start: false,
        ..Config::default()
    });
    let mut rdma = null_mut();
    // SAFETY: live objects; `rdma` is created and destroyed here.
    unsafe {
        assert_eq!(doca_ctx_start(null_mut()), DOCA_ERROR_INVALID_VALUE);
        ok(doca_rdma_create(side.dev, &mut rdma));
        assert_eq!(
            doca_ctx_start(doca_rdma_as_ctx(rdma)),
            DOCA_ERROR_NOT_CONNECTED,
            "no progress engine"
        );
        ok(doca_rdma_destroy(rdma));

        assert_eq!(doca_ctx_start(side.ctx), DOCA_ERROR_IN_PROGRESS);
        assert_eq!(side.state(), DOCA_CTX_STATE_STARTING);
        assert_eq!(doca_ctx_start(side.ctx), DOCA_ERROR_BAD_STATE);
        let mut t = null_mut();
        assert_eq!(
            doca_rdma_task_receive_allocate_init(side.rdma, null_mut(), ND, &mut t),
            DOCA_ERROR_BAD_STATE,
            "no task allocation while starting"
        );
        assert_eq!(side.take(), vec![], "callbacks run only from progress");
        side.progress();
        assert_eq!(side.state(), DOCA_CTX_STATE_RUNNING);
        assert_eq!(
            side.take(),
            vec![
                Ev::State(DOCA_CTX_STATE_IDLE, DOCA_CTX_STATE_STARTING),
                Ev::State(DOCA_CTX_STATE_STARTING, DOCA_CTX_STATE_RUNNING)
            ]
        );
        assert_eq!(doca_ctx_start(side.ctx), DOCA_ERROR_BAD_STATE);
    }
}

#[test]
fn ctx_stop_waits_for_tasks_to_be_freed() {
    let side = Side::new(Config::default());
    let peer = Side::new(Config::default());
    cm_pair(&side, &peer, 18020);
    let mut rdma = null_mut();
    // SAFETY: live objects; `rdma` is created and destroyed here.
    unsafe {
        assert_eq!(doca_ctx_stop(null_mut()), DOCA_ERROR_INVALID_VALUE);
        ok(doca_rdma_create(side.dev, &mut rdma));
        assert_eq!(
            doca_ctx_stop(doca_rdma_as_ctx(rdma)),
            DOCA_ERROR_NOT_CONNECTED
        );
        ok(doca_rdma_destroy(rdma));

        let recv = side.post_recv(side.buf(0, 64, 0));
        assert_eq!(doca_ctx_stop(side.ctx), DOCA_ERROR_IN_PROGRESS);
        assert_eq!(side.state(), DOCA_CTX_STATE_STOPPING);
        assert_eq!(doca_ctx_stop(side.ctx), DOCA_ERROR_IN_PROGRESS);
        side.progress();
        let events = side.take();
        assert!(events.contains(&Ev::Err(recv as usize, DOCA_ERROR_CONNECTION_ABORTED)));
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
        assert_eq!(doca_ctx_stop(side.ctx), DOCA_ERROR_BAD_STATE);
        // The peer heard of the disconnection.
        peer.progress();
        assert!(matches!(peer.take().as_slice(), [Ev::Disconnect(_)]));

        // Nothing allocated: stops at once.
        side.start();
        ok(doca_ctx_stop(side.ctx));
        assert_eq!(side.state(), DOCA_CTX_STATE_IDLE);
    }
}

#[test]
fn ctx_get_state_checks_arguments() {
    let side = Side::new(Config {
        start: false,
        ..Config::default()
    });
    let mut state = 9;
    // SAFETY: live context; out-pointer to a local, or NULL on purpose.
    unsafe {
        assert_eq!(
            doca_ctx_get_state(side.ctx, null_mut()),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            doca_ctx_get_state(null(), &mut state),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_ctx_get_state(side.ctx, &mut state));
    }
    assert_eq!(state, DOCA_CTX_STATE_IDLE);
}

#[test]
fn ctx_set_state_changed_cb_idle_only() {
    let side = Side::new(Config::default());
    // SAFETY: live context, or NULL on purpose.
    unsafe {
        assert_eq!(
            doca_ctx_set_state_changed_cb(null_mut(), None),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            doca_ctx_set_state_changed_cb(side.ctx, None),
            DOCA_ERROR_BAD_STATE
        );
    }
}

#[test]
fn ctx_set_user_data_reaches_callbacks() {
    // `Side` sets the context user data to its recorder; the state callbacks of `start`
    // reached it (checked by `Side::start`).
    let side = Side::new(Config::default());
    // SAFETY: live context, or NULL on purpose.
    unsafe {
        assert_eq!(
            doca_ctx_set_user_data(null_mut(), ND),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_ctx_set_user_data(
            side.ctx,
            doca_data {
                ptr: (&*side.rec as *const Rec).cast_mut().cast(),
            },
        ));
        ok(doca_ctx_stop(side.ctx));
        side.progress();
    }
    assert_eq!(
        side.take(),
        vec![Ev::State(DOCA_CTX_STATE_RUNNING, DOCA_CTX_STATE_IDLE)]
    );
}

// ------------------------------------------------------------------------------------------
// RDMA context configuration
// ------------------------------------------------------------------------------------------

fn idle_side() -> Box<Side> {
    Side::new(Config {
        start: false,
        ..Config::default()
    })
}

#[test]
fn rdma_create_checks_arguments() {
    let dev = open_dev();
    let mut rdma = null_mut();
    // SAFETY: an open device; out-pointer to a local, or NULL on purpose.
    unsafe {
        assert_eq!(doca_rdma_create(dev, null_mut()), DOCA_ERROR_INVALID_VALUE);
        assert_eq!(
            doca_rdma_create(null_mut(), &mut rdma),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_rdma_create(dev, &mut rdma));
        ok(doca_rdma_destroy(rdma));
        ok(doca_dev_close(dev));
    }
}

#[test]
fn rdma_destroy_needs_a_stopped_context() {
    let side = Side::new(Config::default());
    // SAFETY: live context, or NULL on purpose.
    unsafe {
        assert_eq!(doca_rdma_destroy(null_mut()), DOCA_ERROR_INVALID_VALUE);
        assert_eq!(doca_rdma_destroy(side.rdma), DOCA_ERROR_BAD_STATE);
        ok(doca_ctx_stop(side.ctx));
        ok(doca_rdma_destroy(side.rdma));
    }
}

/// `doca_rdma_as_ctx` and the eight `*_as_task` conversions (casts; NULL stays NULL).
#[test]
fn as_ctx_and_as_task_conversions() {
    let side = Side::new(Config::default());
    // SAFETY: conversions only; the receive task is allocated and freed here.
    unsafe {
        assert!(doca_rdma_as_ctx(null_mut()).is_null());
        assert_eq!(doca_rdma_as_ctx(side.rdma), side.ctx);
        let mut t = null_mut();
        ok(doca_rdma_task_receive_allocate_init(
            side.rdma,
            null_mut(),
            ND,
            &mut t,
        ));
        let task = doca_rdma_task_receive_as_task(t);
        assert_eq!(task as usize, t as usize);
        assert!(doca_rdma_task_receive_as_task(null_mut()).is_null());
        assert!(doca_rdma_task_send_as_task(null_mut()).is_null());
        assert!(doca_rdma_task_send_imm_as_task(null_mut()).is_null());
        assert!(doca_rdma_task_read_as_task(null_mut()).is_null());
        assert!(doca_rdma_task_write_as_task(null_mut()).is_null());
        assert!(doca_rdma_task_write_imm_as_task(null_mut()).is_null());
        assert!(doca_rdma_task_atomic_cmp_swp_as_task(null_mut()).is_null());
        assert!(doca_rdma_task_atomic_fetch_add_as_task(null_mut()).is_null());
        doca_task_free(task);
    }
}

#[test]
fn rdma_set_permissions_accepts_only_rdma_flags() {
    let side = idle_side();
    // SAFETY: live idle context.
    unsafe {
        for bad in [
            DOCA_ACCESS_FLAG_PCI_READ_ONLY,
            DOCA_ACCESS_FLAG_PCI_READ_WRITE,
            DOCA_ACCESS_FLAG_RDMA_READ | DOCA_ACCESS_FLAG_PCI_RELAXED_ORDERING,
            1 << 7,
        ] {
            assert_eq!(
                doca_rdma_set_permissions(side.rdma, bad),
                DOCA_ERROR_INVALID_VALUE,
                "{bad:#x}"
            );
        }
        // As NVIDIA's samples: LOCAL_READ_WRITE alone, or remote flags alone.
        ok(doca_rdma_set_permissions(
            side.rdma,
            DOCA_ACCESS_FLAG_LOCAL_READ_WRITE,
        ));
        ok(doca_rdma_set_permissions(
            side.rdma,
            DOCA_ACCESS_FLAG_RDMA_WRITE,
        ));
        ok(doca_rdma_set_permissions(side.rdma, ALL_PERMS));
        assert_eq!(
            doca_rdma_set_permissions(null_mut(), ALL_PERMS),
            DOCA_ERROR_INVALID_VALUE
        );
        side.start();
        assert_eq!(
            doca_rdma_set_permissions(side.rdma, ALL_PERMS),
            DOCA_ERROR_BAD_STATE
        );
    }
}

#[test]
fn rdma_set_gid_index_idle_only() {
    let side = idle_side();
    // SAFETY: live context, or NULL on purpose.
    unsafe {
        ok(doca_rdma_set_gid_index(side.rdma, 1));
        assert_eq!(
            doca_rdma_set_gid_index(null_mut(), 0),
            DOCA_ERROR_INVALID_VALUE
        );
        side.start();
        assert_eq!(doca_rdma_set_gid_index(side.rdma, 0), DOCA_ERROR_BAD_STATE);
    }
}

#[test]
fn rdma_set_max_num_connections_limits_connections() {
    let side = idle_side();
    // SAFETY: live context, or NULL on purpose.
    unsafe {
        assert_eq!(
            doca_rdma_set_max_num_connections(side.rdma, 0),
            DOCA_ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            doca_rdma_set_max_num_connections(null_mut(), 1),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_rdma_set_max_num_connections(side.rdma, 1));
        side.start();
        assert_eq!(
            doca_rdma_set_max_num_connections(side.rdma, 2),
            DOCA_ERROR_BAD_STATE
        );
    }
    let (st, _, _) = export_conn(&side);
    ok(st);
    assert_eq!(export_conn(&side).0, DOCA_ERROR_FULL);
}

#[test]
fn rdma_set_send_queue_size_checks_the_device_max() {
    let side = idle_side();
    // SAFETY: live context, or NULL on purpose.
    unsafe {
        assert_eq!(
            doca_rdma_set_send_queue_size(side.rdma, 0),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_rdma_set_send_queue_size(side.rdma, 1000)); // rounded up to 1024
        ok(doca_rdma_set_send_queue_size(side.rdma, 32768));
        assert_eq!(
            doca_rdma_set_send_queue_size(side.rdma, 32769),
            DOCA_ERROR_NOT_SUPPORTED,
            "rounds up to 65536, above the device maximum"
        );
        assert_eq!(
            doca_rdma_set_send_queue_size(null_mut(), 16),
            DOCA_ERROR_INVALID_VALUE
        );
        side.start();
        assert_eq!(
            doca_rdma_set_send_queue_size(side.rdma, 16),
            DOCA_ERROR_BAD_STATE
        );
    }
}

#[test]
fn rdma_set_recv_queue_size_is_not_supported() {
    let side = idle_side();
    // SAFETY: live context, or NULL on purpose.
    unsafe {
        for size in [1, 16, 512, 32768] {
            assert_eq!(
                doca_rdma_set_recv_queue_size(side.rdma, size),
                DOCA_ERROR_NOT_SUPPORTED,
                "CPU data path"
            );
        }
        assert_eq!(
            doca_rdma_set_recv_queue_size(null_mut(), 16),
            DOCA_ERROR_INVALID_VALUE
        );
    }
}

#[test]
fn rdma_set_transport_type_rc_only() {
    let side = idle_side();
    // SAFETY: live context.
    unsafe {
        ok(doca_rdma_set_transport_type(
            side.rdma,
            DOCA_RDMA_TRANSPORT_TYPE_RC,
        ));
        assert_eq!(
            doca_rdma_set_transport_type(side.rdma, DOCA_RDMA_TRANSPORT_TYPE_DC),
            DOCA_ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            doca_rdma_set_transport_type(side.rdma, 7),
            DOCA_ERROR_INVALID_VALUE
        );
        side.start();
        assert_eq!(
            doca_rdma_set_transport_type(side.rdma, DOCA_RDMA_TRANSPORT_TYPE_RC),
            DOCA_ERROR_BAD_STATE
        );
    }
}

#[test]
fn rdma_set_connection_request_timeout_checks() {
    let side = idle_side();
    // SAFETY: live context.
    unsafe {
        assert_eq!(
            doca_rdma_set_connection_request_timeout(side.rdma, 0),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_rdma_set_connection_request_timeout(side.rdma, 500));
        side.start();
        assert_eq!(
            doca_rdma_set_connection_request_timeout(side.rdma, 500),
            DOCA_ERROR_BAD_STATE
        );
    }
}

unsafe extern "C" fn noop_conn_cb(_: *mut doca_rdma_connection, _: doca_data, _: doca_data) {}

#[test]
fn rdma_set_connection_state_callbacks_checks() {
    let side = idle_side();
    let cb = Some(noop_conn_cb as unsafe extern "C" fn(_, _, _));
    // SAFETY: live context.
    unsafe {
        // Only the request callback may be NULL (a client).
        ok(doca_rdma_set_connection_state_callbacks(
            side.rdma, None, cb, cb, cb,
        ));
        assert_eq!(
            doca_rdma_set_connection_state_callbacks(side.rdma, None, None, cb, cb),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            doca_rdma_set_connection_state_callbacks(side.rdma, None, cb, None, cb),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            doca_rdma_set_connection_state_callbacks(side.rdma, None, cb, cb, None),
            DOCA_ERROR_INVALID_VALUE
        );
        side.start();
        assert_eq!(
            doca_rdma_set_connection_state_callbacks(side.rdma, None, cb, cb, cb),
            DOCA_ERROR_BAD_STATE
        );
    }
}

// ------------------------------------------------------------------------------------------
// RDMA CM and out-of-band connections
// ------------------------------------------------------------------------------------------

#[test]
fn rdma_addr_create_parses_addresses() {
    let mut addr = null_mut();
    // SAFETY: static strings; out-pointer to a local.
    unsafe {
        ok(doca_rdma_addr_create(
            DOCA_RDMA_ADDR_TYPE_IPv4,
            c"10.0.0.1".as_ptr(),
            1,
            &mut addr,
        ));
        ok(doca_rdma_addr_destroy(addr));
        ok(doca_rdma_addr_create(
            DOCA_RDMA_ADDR_TYPE_IPv6,
            c"::1".as_ptr(),
            1,
            &mut addr,
        ));
        ok(doca_rdma_addr_destroy(addr));
        for (ty, text) in [
            (DOCA_RDMA_ADDR_TYPE_IPv4, c"::1"),
            (DOCA_RDMA_ADDR_TYPE_IPv6, c"10.0.0.1"),
            (DOCA_RDMA_ADDR_TYPE_IPv4, c"not an address"),
            (9, c"10.0.0.1"),
        ] {
            assert_eq!(
                doca_rdma_addr_create(ty, text.as_ptr(), 1, &mut addr),
                DOCA_ERROR_INVALID_VALUE
            );
        }
        assert_eq!(
            doca_rdma_addr_create(DOCA_RDMA_ADDR_TYPE_IPv4, null(), 1, &mut addr),
            DOCA_ERROR_INVALID_VALUE
        );
    }
}

#[test]
fn rdma_addr_destroy_refuses_while_in_use() {
    let client = Side::new(Config::default());
    let server = Side::new(Config {
        accept: false,
        ..Config::default()
    });
    server.listen(18030);
    let mut addr = null_mut();
    // SAFETY: live objects; the address is destroyed once it is not in use.
    unsafe {
        assert_eq!(doca_rdma_addr_destroy(null_mut()), DOCA_ERROR_INVALID_VALUE);
        ok(doca_rdma_addr_create(
            DOCA_RDMA_ADDR_TYPE_IPv4,
            c"127.0.0.1".as_ptr(),
            18030,
            &mut addr,
        ));
        ok(doca_rdma_connect_to_addr(client.rdma, addr, ND));
        assert_eq!(
            doca_rdma_addr_destroy(addr),
            DOCA_ERROR_BAD_STATE,
            "connecting"
        );
        server.progress(); // rejects
        client.progress();
        assert!(matches!(client.take().as_slice(), [Ev::Failure(_)]));
        ok(doca_rdma_addr_destroy(addr));
    }
}

#[test]
fn rdma_start_listen_to_port_running_and_free_port() {
    let a = idle_side();
    let b = Side::new(Config::default());
    // SAFETY: live contexts.
    unsafe {
        assert_eq!(
            doca_rdma_start_listen_to_port(a.rdma, 18040),
            DOCA_ERROR_BAD_STATE
        );
        assert_eq!(
            doca_rdma_start_listen_to_port(null_mut(), 18040),
            DOCA_ERROR_INVALID_VALUE
        );
        a.start();
        ok(doca_rdma_start_listen_to_port(a.rdma, 18040));
        assert_eq!(
            doca_rdma_start_listen_to_port(a.rdma, 18040),
            DOCA_ERROR_CONNECTION_ABORTED,
            "already bound"
        );
        assert_eq!(
            doca_rdma_start_listen_to_port(b.rdma, 18040),
            DOCA_ERROR_CONNECTION_ABORTED,
            "bound by another context"
        );
    }
}

#[test]
fn rdma_stop_listen_to_port_keeps_connections() {
    let server = Side::new(Config::default());
    let client = Side::new(Config::default());
    let (cconn, _) = cm_pair(&server, &client, 18050);
    // SAFETY: live contexts and connection.
    unsafe {
        assert_eq!(
            doca_rdma_stop_listen_to_port(server.rdma, 18051),
            DOCA_ERROR_INVALID_VALUE,
            "not listening there"
        );
        ok(doca_rdma_stop_listen_to_port(server.rdma, 18050));
        // The established connection still works.
        let recv = server.post_recv(server.buf(0, 64, 0));
        let send = client.send(cconn, client.buf(0, 8, 8));
        assert_eq!(
            wait_events(&[&server, &client], &server, 1),
            [Ev::Ok(recv as usize)]
        );
        assert_eq!(wait_events(&[&client], &client, 1), [Ev::Ok(send as usize)]);
        // New requests fail.
        client.connect(18050);
        assert!(wait_events(&[&client], &client, 1)
            .iter()
            .any(|e| matches!(e, Ev::Failure(_))));
    }
}

#[test]
fn rdma_connect_to_addr_reaches_the_listener() {
    let server = Side::new(Config {
        max_conns: 1,
        ..Config::default()
    });
    let client = idle_side();
    let mut addr = null_mut();
    // SAFETY: live objects; the address is leaked.
    unsafe {
        ok(doca_rdma_addr_create(
            DOCA_RDMA_ADDR_TYPE_IPv4,
            c"127.0.0.1".as_ptr(),
            18060,
            &mut addr,
        ));
        assert_eq!(
            doca_rdma_connect_to_addr(client.rdma, addr, ND),
            DOCA_ERROR_BAD_STATE
        );
        client.start();
        assert_eq!(
            doca_rdma_connect_to_addr(client.rdma, null_mut(), ND),
            DOCA_ERROR_INVALID_VALUE
        );
        // Nobody listens: the failure callback.
        ok(doca_rdma_connect_to_addr(
            client.rdma,
            addr,
            doca_data { u64_: 3 },
        ));
        assert!(matches!(
            wait_events(&[&client], &client, 1).as_slice(),
            [Ev::Failure(_)]
        ));
        // A listener: request on the server, established on both.
        server.listen(18060);
        ok(doca_rdma_connect_to_addr(
            client.rdma,
            addr,
            doca_data { u64_: 4 },
        ));
        let sev = wait_events(&[&server, &client], &server, 2);
        assert!(matches!(
            sev.as_slice(),
            [Ev::Request(_), Ev::Established(_)]
        ));
        let cev = wait_events(&[&client], &client, 1);
        let Ev::Established(c) = cev[0] else {
            panic!("{cev:?}")
        };
        let mut ud = ND;
        ok(doca_rdma_connection_get_user_data(c as *mut _, &mut ud));
        assert_eq!(ud.u64_, 4);
        // The server is full (one connection): the next client fails.
        ok(doca_rdma_connect_to_addr(client.rdma, addr, ND));
        assert!(matches!(
            wait_events(&[&server, &client], &client, 1).as_slice(),
            [Ev::Failure(_)]
        ));
    }
}

/// Connection requests seen by `keep_request_cb`: (context user data, connection).
static REQUEST: std::sync::Mutex<Vec<(usize, usize)>> = std::sync::Mutex::new(Vec::new());

unsafe extern "C" fn keep_request_cb(conn: *mut doca_rdma_connection, ud: doca_data) {
    // SAFETY: reading the pointer view of the user data the test set.
    let ctx = unsafe { ud.ptr } as usize;
    REQUEST.lock().unwrap().push((ctx, conn as usize));
}

/// A server whose request callback only records the request (accept / reject come later).
fn deferring_server(port: u16) -> Box<Side> {
    let server = idle_side();
    let cb = Some(noop_conn_cb as unsafe extern "C" fn(_, _, _));
    // SAFETY: live idle context.
    unsafe {
        ok(doca_rdma_set_connection_state_callbacks(
            server.rdma,
            Some(keep_request_cb),
            cb,
            cb,
            cb,
        ));
    }
    server.start();
    server.listen(port);
    server
}

/// The next connection request `server` (made by `deferring_server`) received.
fn take_request(server: &Side) -> *mut doca_rdma_connection {
    // `Side` sets the context user data to the address of its recorder.
    let me = &*server.rec as *const Rec as usize;
    let mut got = None;
    pump(&[server], || {
        let mut r = REQUEST.lock().unwrap();
        if let Some(i) = r.iter().position(|(ctx, _)| *ctx == me) {
            got = Some(r.remove(i).1);
        }
        got.is_some()
    });
    got.unwrap() as *mut _
}

#[test]
fn rdma_connection_accept_pending_requests_only() {
    let server = deferring_server(18070);
    let client = Side::new(Config::default());
    client.connect(18070);
    let req = take_request(&server);
    let mut private = [1u8; 4];
    // SAFETY: a pending request of a live context.
    unsafe {
        assert_eq!(
            doca_rdma_connection_accept(req, null_mut(), 4),
            DOCA_ERROR_INVALID_VALUE,
            "length without data"
        );
        assert_eq!(
            doca_rdma_connection_accept(req, private.as_mut_ptr().cast(), 0),
            DOCA_ERROR_INVALID_VALUE,
            "data without length"
        );
        assert_eq!(
            doca_rdma_connection_accept(null_mut(), null_mut(), 0),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_rdma_connection_accept(
            req,
            private.as_mut_ptr().cast(),
            4,
        ));
        assert_eq!(
            doca_rdma_connection_accept(req, null_mut(), 0),
            DOCA_ERROR_INVALID_VALUE,
            "no longer a pending request"
        );
    }
    assert!(matches!(
        wait_events(&[&server, &client], &client, 1).as_slice(),
        [Ev::Established(_)]
    ));

    // The client gave up (its context stopped) before the accept: CONNECTION_ABORTED.
    client.connect(18070);
    let req = take_request(&server);
    // SAFETY: live contexts; `req` is a pending request of the server.
    unsafe {
        assert_eq!(doca_ctx_stop(client.ctx), DOCA_SUCCESS);
        assert_eq!(
            doca_rdma_connection_accept(req, null_mut(), 0),
            DOCA_ERROR_CONNECTION_ABORTED
        );
    }

    // Accepting is for a running context only (doca_rdma.h: connection_accept).
    let other = Side::new(Config::default());
    other.connect(18070);
    let req = take_request(&server);
    // SAFETY: live contexts; `req` is a request of the server, whose context stops.
    unsafe {
        assert_eq!(doca_ctx_stop(server.ctx), DOCA_SUCCESS);
        assert_eq!(
            doca_rdma_connection_accept(req, null_mut(), 0),
            DOCA_ERROR_BAD_STATE
        );
    }
}

#[test]
fn rdma_connection_reject_fails_the_client() {
    let server = deferring_server(18080);
    let client = Side::new(Config::default());
    client.connect(18080);
    let req = take_request(&server);
    // SAFETY: a pending request of a live context.
    unsafe {
        assert_eq!(
            doca_rdma_connection_reject(null_mut()),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_rdma_connection_reject(req));
        assert_eq!(
            doca_rdma_connection_reject(req),
            DOCA_ERROR_INVALID_VALUE,
            "no longer a pending request"
        );
    }
    assert!(matches!(
        wait_events(&[&client], &client, 1).as_slice(),
        [Ev::Failure(_)]
    ));

    // Rejecting is for a running context only (doca_rdma.h: connection_reject).
    client.connect(18080);
    let req = take_request(&server);
    // SAFETY: `req` is a request of the server, whose context stops.
    unsafe {
        assert_eq!(doca_ctx_stop(server.ctx), DOCA_SUCCESS);
        assert_eq!(doca_rdma_connection_reject(req), DOCA_ERROR_BAD_STATE);
    }
}

#[test]
fn rdma_connection_disconnect_flushes_and_notifies() {
    let server = Side::new(Config::default());
    let client = Side::new(Config::default());
    let (cconn, sconn) = cm_pair(&server, &client, 18090);
    let sends: Vec<_> = (0..2)
        .map(|i| client.send(cconn, client.buf(i * 8, 8, 8)))
        .collect();
    // SAFETY: live connections.
    unsafe {
        assert_eq!(
            doca_rdma_connection_disconnect(null_mut()),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_rdma_connection_disconnect(cconn));
        let events = wait_events(&[&client], &client, 2);
        for s in &sends {
            assert_eq!(
                count(
                    &events,
                    &Ev::Err(*s as usize, DOCA_ERROR_CONNECTION_ABORTED)
                ),
                1
            );
        }
        assert_eq!(
            wait_events(&[&server], &server, 1),
            [Ev::Disconnect(sconn as usize)]
        );
        ok(doca_rdma_connection_disconnect(sconn));
        assert_eq!(
            doca_rdma_connection_disconnect(cconn),
            DOCA_ERROR_INVALID_VALUE,
            "already disconnected"
        );
        assert_eq!(doca_task_submit(sends[0]), DOCA_ERROR_NOT_CONNECTED);
    }

    // Disconnecting is for a running context only (doca_rdma.h: connection_disconnect): an
    // exported connection of a starting context is refused.
    let starting = idle_side();
    // SAFETY: live context.
    unsafe {
        assert_eq!(doca_ctx_start(starting.ctx), DOCA_ERROR_IN_PROGRESS);
        let (st, conn, _) = export_conn(&starting);
        ok(st);
        assert_eq!(doca_rdma_connection_disconnect(conn), DOCA_ERROR_BAD_STATE);
        starting.progress();
        ok(doca_rdma_connection_disconnect(conn));
    }
}

/// `doca_rdma_connection_set_user_data` and `_get_user_data`.
#[test]
fn rdma_connection_user_data_round_trip() {
    let a = Side::new(Config::default());
    let b = Side::new(Config::default());
    let (aconn, _) = oob_pair(&a, &b);
    let mut ud = ND;
    // SAFETY: a live connection; out-pointer to a local, or NULL on purpose.
    unsafe {
        ok(doca_rdma_connection_set_user_data(
            aconn,
            doca_data { u64_: 42 },
        ));
        ok(doca_rdma_connection_get_user_data(aconn, &mut ud));
        assert_eq!(ud.u64_, 42);
        assert_eq!(
            doca_rdma_connection_get_user_data(aconn, null_mut()),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            doca_rdma_connection_set_user_data(null_mut(), ND),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            doca_rdma_connection_get_user_data(null(), &mut ud),
            DOCA_ERROR_INVALID_VALUE
        );
    }
}

#[test]
fn rdma_connection_get_id_is_unique() {
    let a = Side::new(Config::default());
    let (_, c1, _) = export_conn(&a);
    let (_, c2, _) = export_conn(&a);
    let (mut i1, mut i2) = (0, 0);
    // SAFETY: live connections; out-pointers to locals, or NULL on purpose.
    unsafe {
        ok(doca_rdma_connection_get_id(c1, &mut i1));
        ok(doca_rdma_connection_get_id(c2, &mut i2));
        assert_ne!(i1, i2);
        assert_eq!(
            doca_rdma_connection_get_id(c1, null_mut()),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            doca_rdma_connection_get_id(null(), &mut i1),
            DOCA_ERROR_INVALID_VALUE
        );
    }
}

#[test]
fn rdma_export_needs_a_started_context_and_a_slot() {
    let a = Side::new(Config {
        max_conns: 1,
        start: false,
        ..Config::default()
    });
    let (mut p, mut n, mut c) = (null(), 0, null_mut());
    // SAFETY: live context; out-pointers to locals, or NULL on purpose.
    unsafe {
        assert_eq!(
            doca_rdma_export(a.rdma, &mut p, &mut n, &mut c),
            DOCA_ERROR_BAD_STATE
        );
        assert_eq!(doca_ctx_start(a.ctx), DOCA_ERROR_IN_PROGRESS);
        // Allowed once started (STARTING included).
        ok(doca_rdma_export(a.rdma, &mut p, &mut n, &mut c));
        assert!(n > 0 && !p.is_null() && !c.is_null());
        assert_eq!(
            doca_rdma_export(a.rdma, &mut p, &mut n, &mut c),
            DOCA_ERROR_FULL
        );
        assert_eq!(
            doca_rdma_export(a.rdma, null_mut(), &mut n, &mut c),
            DOCA_ERROR_INVALID_VALUE
        );
    }
}

#[test]
fn rdma_connect_checks_details_and_state() {
    let a = Side::new(Config::default());
    let b = Side::new(Config::default());
    let (_, aconn, ablob) = export_conn(&a);
    let (_, bconn, bblob) = export_conn(&b);
    // SAFETY: live contexts and connections.
    unsafe {
        assert_eq!(
            doca_rdma_connect(a.rdma, null(), 16, aconn),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            oob_connect(&a, bconn, &bblob),
            DOCA_ERROR_INVALID_VALUE,
            "b's connection"
        );
        assert_eq!(
            oob_connect(&a, aconn, &bblob[..8]),
            DOCA_ERROR_CONNECTION_ABORTED,
            "corrupted details"
        );
        let mut garbage = bblob.clone();
        garbage[0] ^= 0xff;
        assert_eq!(
            oob_connect(&a, aconn, &garbage),
            DOCA_ERROR_CONNECTION_ABORTED
        );
        ok(oob_connect(&a, aconn, &bblob));
        assert_eq!(
            oob_connect(&a, aconn, &bblob),
            DOCA_ERROR_BAD_STATE,
            "already connected"
        );
        ok(oob_connect(&b, bconn, &ablob));
        // Receives may be posted once this side connected.
        b.post_recv(b.buf(0, 64, 0));
        ok(doca_ctx_stop(a.ctx));
    }
    assert_eq!(
        oob_connect(&a, aconn, &bblob),
        DOCA_ERROR_BAD_STATE,
        "context stopped"
    );
}

/// Out of band, a task on a connection whose peer has not called `doca_rdma_connect` yet
/// fails (it is not queued until the peer connects) and puts the connection in error.
#[test]
fn oob_task_before_the_peer_connects_fails() {
    let a = Side::new(Config::default());
    let b = Side::new(Config::default());
    let remote = a.import_mmap(&b.export_mmap());
    let (_, aconn, ablob) = export_conn(&a);
    let (_, bconn, bblob) = export_conn(&b);
    ok(oob_connect(&a, aconn, &bblob));
    // `b` has not connected yet. Send, write, read, and atomics all fail; the first one puts the
    // connection in error, so the others fail too.
    let send = a.send(aconn, a.buf(0, 8, 8));
    assert_eq!(
        wait_events(&[&a], &a, 1),
        [Ev::Err(send as usize, DOCA_ERROR_IO_FAILED)]
    );
    let w = a.write(
        aconn,
        a.buf(0, 8, 8),
        a.remote_buf(remote, b.addr(0), 64, 0),
    );
    assert!(matches!(wait_events(&[&a], &a, 1).as_slice(), [Ev::Err(t, _)] if *t == w as usize));
    // Nothing reached b, and b connecting now does not resurrect the sends.
    ok(oob_connect(&b, bconn, &ablob));
    b.post_recv(b.buf(0, 64, 0));
    b.progress();
    assert_eq!(b.take(), vec![]);
    assert_eq!(b.bytes(0, 8), [0; 8]);
}

// ------------------------------------------------------------------------------------------
// Tasks: configuration (one test per task type)
// ------------------------------------------------------------------------------------------

/// NULL callbacks or zero tasks: INVALID_VALUE; not idle: BAD_STATE.
macro_rules! set_conf_case {
    ($set_conf:ident, $ok:ident, $err:ident) => {{
        let side = idle_side();
        // SAFETY: live context; the callbacks are the harness's.
        unsafe {
            assert_eq!(
                $set_conf(side.rdma, Some($ok), Some($err), 0),
                DOCA_ERROR_INVALID_VALUE
            );
            assert_eq!(
                $set_conf(side.rdma, None, Some($err), 4),
                DOCA_ERROR_INVALID_VALUE
            );
            assert_eq!(
                $set_conf(side.rdma, Some($ok), None, 4),
                DOCA_ERROR_INVALID_VALUE
            );
            assert_eq!(
                $set_conf(null_mut(), Some($ok), Some($err), 4),
                DOCA_ERROR_INVALID_VALUE
            );
            ok($set_conf(side.rdma, Some($ok), Some($err), 4));
            side.start();
            assert_eq!(
                $set_conf(side.rdma, Some($ok), Some($err), 4),
                DOCA_ERROR_BAD_STATE
            );
        }
    }};
}

#[test]
fn receive_set_conf_checks() {
    set_conf_case!(doca_rdma_task_receive_set_conf, recv_ok, recv_err);
}

#[test]
fn send_set_conf_checks() {
    set_conf_case!(doca_rdma_task_send_set_conf, send_ok, send_err);
}

#[test]
fn send_imm_set_conf_checks() {
    set_conf_case!(doca_rdma_task_send_imm_set_conf, send_imm_ok, send_imm_err);
}

#[test]
fn read_set_conf_checks() {
    set_conf_case!(doca_rdma_task_read_set_conf, read_ok, read_err);
}

#[test]
fn write_set_conf_checks() {
    set_conf_case!(doca_rdma_task_write_set_conf, write_ok, write_err);
}

#[test]
fn write_imm_set_conf_checks() {
    set_conf_case!(
        doca_rdma_task_write_imm_set_conf,
        write_imm_ok,
        write_imm_err
    );
}

#[test]
fn atomic_cmp_swp_set_conf_checks() {
    set_conf_case!(
        doca_rdma_task_atomic_cmp_swp_set_conf,
        cmp_swp_ok,
        cmp_swp_err
    );
}

#[test]
fn atomic_fetch_add_set_conf_checks() {
    set_conf_case!(
        doca_rdma_task_atomic_fetch_add_set_conf,
        fetch_add_ok,
        fetch_add_err
    );
}

/// Two running sides connected out of band, `a` with `b`'s memory imported.
struct Pair {
    a: Box<Side>,
    b: Box<Side>,
    aconn: *mut doca_rdma_connection,
    remote: *mut doca_mmap,
}

fn pair() -> Pair {
    let a = Side::new(Config::default());
    let b = Side::new(Config::default());
    let (aconn, _) = oob_pair(&a, &b);
    let remote = a.import_mmap(&b.export_mmap());
    Pair {
        a,
        b,
        aconn,
        remote,
    }
}

impl Pair {
    /// A remote buffer over `b`'s memory `[off, off + len)` with `data_len` bytes of data.
    fn rbuf(&self, off: usize, len: usize, data_len: usize) -> *mut doca_buf {
        self.a
            .remote_buf(self.remote, self.b.addr(off), len, data_len)
    }
}

fn submit(task: *mut doca_task) -> doca_error_t {
    // SAFETY: a task of a live context.
    unsafe { doca_task_submit(task) }
}

// ------------------------------------------------------------------------------------------
// Tasks: allocation and what each task type does
// ------------------------------------------------------------------------------------------

#[test]
fn receive_allocate_init_checks_and_pool() {
    let side = idle_side();
    let mut t = null_mut();
    // SAFETY: live context; out-pointers to locals, or NULL on purpose.
    unsafe {
        assert_eq!(
            doca_rdma_task_receive_allocate_init(side.rdma, null_mut(), ND, &mut t),
            DOCA_ERROR_BAD_STATE,
            "idle"
        );
        side.start();
        assert_eq!(
            doca_rdma_task_receive_allocate_init(side.rdma, null_mut(), ND, null_mut()),
            DOCA_ERROR_INVALID_VALUE
        );
        let released = side.buf(0, 8, 0);
        ok(doca_buf_dec_refcount(released, null_mut()));
        assert_eq!(
            doca_rdma_task_receive_allocate_init(side.rdma, released, ND, &mut t),
            DOCA_ERROR_INVALID_VALUE,
            "a released buffer"
        );
        let mut tasks = Vec::new();
        for _ in 0..NUM_TASKS {
            // NULL: a receive for empty messages.
            ok(doca_rdma_task_receive_allocate_init(
                side.rdma,
                null_mut(),
                ND,
                &mut t,
            ));
            tasks.push(t);
        }
        assert_eq!(
            doca_rdma_task_receive_allocate_init(side.rdma, null_mut(), ND, &mut t),
            DOCA_ERROR_NO_MEMORY
        );
        for t in tasks {
            doca_task_free(doca_rdma_task_receive_as_task(t));
        }
    }
}

/// A receive posted before any connection of its context is usable is refused.
#[test]
fn receive_before_any_connection_is_refused() {
    let a = Side::new(Config::default());
    let b = Side::new(Config::default());
    let mut t = null_mut();
    // SAFETY: live context; the task is submitted after connecting.
    unsafe {
        ok(doca_rdma_task_receive_allocate_init(
            a.rdma,
            a.buf(0, 64, 0),
            ND,
            &mut t,
        ));
        let task = doca_rdma_task_receive_as_task(t);
        assert_eq!(submit(task), DOCA_ERROR_NOT_CONNECTED, "no connection");
        let (_, aconn, _) = export_conn(&a);
        assert_eq!(submit(task), DOCA_ERROR_NOT_CONNECTED, "exported only");
        let (_, _, bblob) = export_conn(&b);
        ok(oob_connect(&a, aconn, &bblob));
        ok(submit(task));
    }
}

/// Tries to allocate every task type that takes a connection on `conn` of `side` (with
/// `remote` and `result` as the atomics' buffers); frees what was allocated and returns the
/// seven statuses.
fn allocate_on(
    side: &Side,
    conn: *mut doca_rdma_connection,
    remote: *mut doca_buf,
    result: *mut doca_buf,
) -> [doca_error_t; 7] {
    let r = side.rdma;
    let mut out = [DOCA_SUCCESS; 7];
    // SAFETY: a live context; the buffers are live (NULL where DOCA allows "no data"); every
    // task allocated here is freed at once.
    unsafe {
        macro_rules! try_alloc {
            ($i:expr, $as_task:ident, $alloc:expr) => {{
                let mut t = null_mut();
                out[$i] = $alloc(&mut t);
                if out[$i] == DOCA_SUCCESS {
                    doca_task_free($as_task(t));
                }
            }};
        }
        try_alloc!(0, doca_rdma_task_send_as_task, |t| {
            doca_rdma_task_send_allocate_init(r, conn, null(), ND, t)
        });
        try_alloc!(1, doca_rdma_task_send_imm_as_task, |t| {
            doca_rdma_task_send_imm_allocate_init(r, conn, null(), 7, ND, t)
        });
        try_alloc!(2, doca_rdma_task_read_as_task, |t| {
            doca_rdma_task_read_allocate_init(r, conn, null(), null_mut(), ND, t)
        });
        try_alloc!(3, doca_rdma_task_write_as_task, |t| {
            doca_rdma_task_write_allocate_init(r, conn, null(), null_mut(), ND, t)
        });
        try_alloc!(4, doca_rdma_task_write_imm_as_task, |t| {
            doca_rdma_task_write_imm_allocate_init(r, conn, null(), null_mut(), 7, ND, t)
        });
        try_alloc!(5, doca_rdma_task_atomic_cmp_swp_as_task, |t| {
            doca_rdma_task_atomic_cmp_swp_allocate_init(r, conn, remote, result, 0, 1, ND, t)
        });
        try_alloc!(6, doca_rdma_task_atomic_fetch_add_as_task, |t| {
            doca_rdma_task_atomic_fetch_add_allocate_init(r, conn, remote, result, 1, ND, t)
        });
    }
    out
}

/// Tasks are allocated (and submitted) only on established connections (doca_rdma.h: the
/// entries of connection_accept, connect_to_addr and start_listen_to_port) and, out of band,
/// only after `doca_rdma_connect` (doca_rdma.h: doca_rdma_connect). A server's connection is
/// established for it when its established callback is delivered, not when it accepts.
#[test]
fn allocate_init_needs_an_established_connection() {
    const NC: doca_error_t = DOCA_ERROR_NOT_CONNECTED;
    let server = deferring_server(18150);
    let (c1, c2) = (Side::new(Config::default()), Side::new(Config::default()));
    let remote = server.import_mmap(&c1.export_mmap());
    let (rbuf, result) = (
        server.remote_buf(remote, c1.addr(0), 64, 8),
        server.buf(0, 64, 0),
    );
    c1.connect(18150);
    let s1 = take_request(&server);
    // SAFETY: live contexts; `s1` and `s2` are requests of the server.
    unsafe {
        ok(doca_rdma_connection_accept(s1, null_mut(), 0));
        assert_eq!(
            allocate_on(&server, s1, rbuf, result),
            [NC; 7],
            "accepted, its established callback not delivered yet"
        );
        server.progress();
        assert_eq!(allocate_on(&server, s1, rbuf, result), [DOCA_SUCCESS; 7]);

        // A task moved to a connection not established yet is refused at submit.
        c2.connect(18150);
        let s2 = take_request(&server);
        ok(doca_rdma_connection_accept(s2, null_mut(), 0));
        let mut t = null_mut();
        ok(doca_rdma_task_write_allocate_init(
            server.rdma,
            s1,
            null(),
            null_mut(),
            ND,
            &mut t,
        ));
        doca_rdma_task_write_set_rdma_connection(t, s2);
        let task = doca_rdma_task_write_as_task(t);
        assert_eq!(submit(task), NC);
        server.progress();
        ok(submit(task));
        server.progress();
        doca_task_free(task);

        // Disconnected: no longer.
        ok(doca_rdma_connection_disconnect(s1));
        assert_eq!(allocate_on(&server, s1, rbuf, result), [NC; 7]);
    }

    // Out of band: exported is not connected; `doca_rdma_connect` on this side is.
    let a = Side::new(Config::default());
    let b = Side::new(Config::default());
    let remote = a.import_mmap(&b.export_mmap());
    let (rbuf, result) = (a.remote_buf(remote, b.addr(0), 64, 8), a.buf(0, 64, 0));
    let (_, aconn, _) = export_conn(&a);
    let (_, _, bblob) = export_conn(&b);
    assert_eq!(
        allocate_on(&a, aconn, rbuf, result),
        [NC; 7],
        "exported only"
    );
    ok(oob_connect(&a, aconn, &bblob));
    assert_eq!(allocate_on(&a, aconn, rbuf, result), [DOCA_SUCCESS; 7]);
}

/// NULL source: an empty message (result length 0). A non-NULL source with an empty data
/// section is refused (stricter choice).
#[test]
fn send_allocate_init_and_empty_messages() {
    let p = pair();
    let other = Side::new(Config::default());
    let (oconn, _) = oob_pair(&other, &p.b);
    let mut t = null_mut();
    // SAFETY: live contexts, connections and buffers.
    unsafe {
        assert_eq!(
            doca_rdma_task_send_allocate_init(p.a.rdma, null_mut(), null(), ND, &mut t),
            DOCA_ERROR_INVALID_VALUE,
            "no connection"
        );
        assert_eq!(
            doca_rdma_task_send_allocate_init(p.a.rdma, oconn, null(), ND, &mut t),
            DOCA_ERROR_INVALID_VALUE,
            "another context's connection"
        );
        ok(doca_rdma_task_send_allocate_init(
            p.a.rdma,
            p.aconn,
            p.a.buf(0, 8, 0),
            ND,
            &mut t,
        ));
        let task = doca_rdma_task_send_as_task(t);
        assert_eq!(submit(task), DOCA_ERROR_INVALID_VALUE, "empty data section");
        doca_task_free(task);

        let recv = p.b.post_recv(p.b.buf(0, 64, 0));
        let send = p.a.send(p.aconn, null_mut());
        assert_eq!(wait_events(&[&p.a, &p.b], &p.b, 1), [Ev::Ok(recv as usize)]);
        assert_eq!(wait_events(&[&p.a], &p.a, 1), [Ev::Ok(send as usize)]);
        let r = recv.cast::<doca_rdma_task_receive>();
        assert_eq!(doca_rdma_task_receive_get_result_len(r), 0);
        assert_eq!(
            doca_rdma_task_receive_get_result_opcode(r),
            DOCA_RDMA_OPCODE_RECV_SEND
        );
    }
}

#[test]
fn send_imm_allocate_init_carries_the_immediate() {
    let mut p = pair();
    p.a.write_bytes(0, b"abc");
    let mut t = null_mut();
    // SAFETY: live contexts, connections and buffers.
    unsafe {
        assert_eq!(
            doca_rdma_task_send_imm_allocate_init(p.a.rdma, null_mut(), null(), 1, ND, &mut t),
            DOCA_ERROR_INVALID_VALUE
        );
        let recv = p.b.post_recv(p.b.buf(0, 64, 0));
        ok(doca_rdma_task_send_imm_allocate_init(
            p.a.rdma,
            p.aconn,
            p.a.buf(0, 3, 3),
            0x1234_5678u32.to_be(),
            ND,
            &mut t,
        ));
        ok(submit(doca_rdma_task_send_imm_as_task(t)));
        assert_eq!(wait_events(&[&p.a, &p.b], &p.b, 1), [Ev::Ok(recv as usize)]);
        let r = recv.cast::<doca_rdma_task_receive>();
        assert_eq!(
            doca_rdma_task_receive_get_result_opcode(r),
            DOCA_RDMA_OPCODE_RECV_SEND_WITH_IMM
        );
        assert_eq!(
            doca_rdma_task_receive_get_result_immediate_data(r),
            0x1234_5678u32.to_be()
        );
        assert_eq!(doca_rdma_task_receive_get_result_len(r), 3);
        assert_eq!(p.b.bytes(0, 3), b"abc");
    }
}

#[test]
fn read_allocate_init_copies_remote_data() {
    let mut p = pair();
    p.b.write_bytes(128, b"remote");
    let mut t = null_mut();
    // SAFETY: live contexts, connections and buffers.
    unsafe {
        assert_eq!(
            doca_rdma_task_read_allocate_init(
                p.a.rdma,
                p.aconn,
                p.rbuf(128, 6, 6),
                null_mut(),
                ND,
                &mut t
            ),
            DOCA_ERROR_INVALID_VALUE,
            "a destination is needed when there is a source"
        );
        assert_eq!(
            doca_rdma_task_read_allocate_init(
                p.a.rdma,
                p.aconn,
                p.a.buf(0, 6, 6),
                p.a.buf(0, 8, 0),
                ND,
                &mut t
            ),
            DOCA_ERROR_INVALID_VALUE,
            "the source must be remote"
        );
        ok(doca_rdma_task_read_allocate_init(
            p.a.rdma,
            p.aconn,
            p.rbuf(128, 6, 6),
            p.a.buf(256, 64, 0),
            ND,
            &mut t,
        ));
        ok(submit(doca_rdma_task_read_as_task(t)));
        assert!(matches!(
            wait_events(&[&p.a], &p.a, 1).as_slice(),
            [Ev::Ok(_)]
        ));
        assert_eq!(p.a.bytes(256, 6), b"remote");
        // Nothing to read: both NULL.
        ok(doca_rdma_task_read_allocate_init(
            p.a.rdma,
            p.aconn,
            null(),
            null_mut(),
            ND,
            &mut t,
        ));
        ok(submit(doca_rdma_task_read_as_task(t)));
        assert!(matches!(
            wait_events(&[&p.a], &p.a, 1).as_slice(),
            [Ev::Ok(_)]
        ));
        // A remote source with an empty data section: refused (stricter choice).
        ok(doca_rdma_task_read_allocate_init(
            p.a.rdma,
            p.aconn,
            p.rbuf(128, 6, 0),
            p.a.buf(256, 64, 0),
            ND,
            &mut t,
        ));
        assert_eq!(
            submit(doca_rdma_task_read_as_task(t)),
            DOCA_ERROR_INVALID_VALUE
        );
    }
}

#[test]
fn write_allocate_init_checks_remote_access() {
    let mut p = pair();
    p.a.write_bytes(0, b"payload!");
    // SAFETY: live contexts, connections and buffers.
    unsafe {
        let mut t = null_mut();
        assert_eq!(
            doca_rdma_task_write_allocate_init(
                p.a.rdma,
                p.aconn,
                p.a.buf(0, 8, 8),
                null_mut(),
                ND,
                &mut t
            ),
            DOCA_ERROR_INVALID_VALUE,
            "a destination is needed when there is a source"
        );
        let w = p.a.write(p.aconn, p.a.buf(0, 8, 8), p.rbuf(64, 64, 0));
        assert_eq!(wait_events(&[&p.a], &p.a, 1), [Ev::Ok(w as usize)]);
        assert_eq!(p.b.bytes(64, 8), b"payload!");
        assert_eq!(p.b.take(), vec![], "one-sided");
        // Out of the remote buffer: the task fails, the connection goes to error.
        let w = p.a.write(p.aconn, p.a.buf(0, 8, 8), p.rbuf(0, 4, 0));
        assert_eq!(
            wait_events(&[&p.a], &p.a, 1),
            [Ev::Err(w as usize, DOCA_ERROR_IO_FAILED)]
        );
        let w = p.a.write(p.aconn, null_mut(), null_mut());
        assert_eq!(
            wait_events(&[&p.a], &p.a, 1),
            [Ev::Err(w as usize, DOCA_ERROR_CONNECTION_ABORTED)]
        );
    }
}

/// The remote side's permissions (its mmap and its RDMA context) are enforced.
#[test]
fn write_to_memory_without_remote_write_fails() {
    let a = Side::new(Config::default());
    let b = Side::new(Config {
        mmap_perms: DOCA_ACCESS_FLAG_LOCAL_READ_WRITE | DOCA_ACCESS_FLAG_RDMA_READ,
        ..Config::default()
    });
    let (aconn, _) = oob_pair(&a, &b);
    let remote = a.import_mmap(&b.export_mmap());
    let w = a.write(aconn, a.buf(0, 8, 8), a.remote_buf(remote, b.addr(0), 8, 0));
    assert_eq!(
        wait_events(&[&a], &a, 1),
        [Ev::Err(w as usize, DOCA_ERROR_IO_FAILED)]
    );
}

#[test]
fn write_imm_allocate_init_writes_then_notifies() {
    let mut p = pair();
    p.a.write_bytes(0, b"imm");
    let recv = p.b.post_recv(p.b.buf(512, 64, 0));
    let mut t = null_mut();
    // SAFETY: live contexts, connections and buffers.
    unsafe {
        assert_eq!(
            doca_rdma_task_write_imm_allocate_init(
                p.a.rdma,
                p.aconn,
                p.a.buf(0, 3, 3),
                null_mut(),
                1,
                ND,
                &mut t
            ),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_rdma_task_write_imm_allocate_init(
            p.a.rdma,
            p.aconn,
            p.a.buf(0, 3, 3),
            p.rbuf(64, 64, 0),
            9u32.to_be(),
            ND,
            &mut t,
        ));
        ok(submit(doca_rdma_task_write_imm_as_task(t)));
        assert_eq!(wait_events(&[&p.a, &p.b], &p.b, 1), [Ev::Ok(recv as usize)]);
        assert_eq!(p.b.bytes(64, 3), b"imm");
        let r = recv.cast::<doca_rdma_task_receive>();
        assert_eq!(
            doca_rdma_task_receive_get_result_opcode(r),
            DOCA_RDMA_OPCODE_RECV_WRITE_WITH_IMM
        );
        assert_eq!(doca_rdma_task_receive_get_result_len(r), 0);
        assert_eq!(
            doca_rdma_task_receive_get_result_immediate_data(r),
            9u32.to_be()
        );
    }
}

#[test]
fn atomic_cmp_swp_allocate_init_on_the_first_8_bytes() {
    let mut p = pair();
    p.b.mem[10] = 5;
    let mut t = null_mut();
    // SAFETY: live contexts, connections and buffers.
    unsafe {
        assert_eq!(
            doca_rdma_task_atomic_cmp_swp_allocate_init(
                p.a.rdma,
                p.aconn,
                null_mut(),
                p.a.buf(0, 8, 0),
                5,
                6,
                ND,
                &mut t
            ),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            doca_rdma_task_atomic_cmp_swp_allocate_init(
                p.a.rdma,
                p.aconn,
                p.rbuf(80, 8, 8),
                null_mut(),
                5,
                6,
                ND,
                &mut t
            ),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_rdma_task_atomic_cmp_swp_allocate_init(
            p.a.rdma,
            p.aconn,
            p.rbuf(80, 8, 4),
            p.a.buf(0, 8, 0),
            5,
            6,
            ND,
            &mut t,
        ));
        assert_eq!(
            submit(doca_rdma_task_atomic_cmp_swp_as_task(t)),
            DOCA_ERROR_INVALID_VALUE,
            "fewer than 8 bytes of data"
        );
        ok(doca_rdma_task_atomic_cmp_swp_allocate_init(
            p.a.rdma,
            p.aconn,
            p.rbuf(80, 8, 8),
            p.a.buf(0, 8, 0),
            5,
            6,
            ND,
            &mut t,
        ));
        ok(submit(doca_rdma_task_atomic_cmp_swp_as_task(t)));
        assert!(matches!(
            wait_events(&[&p.a], &p.a, 1).as_slice(),
            [Ev::Ok(_)]
        ));
    }
    assert_eq!(p.b.mem[10], 6);
    assert_eq!(p.a.mem[0], 5, "the previous value");
}

#[test]
fn atomic_fetch_add_allocate_init_on_the_first_8_bytes() {
    let mut p = pair();
    p.b.mem[12] = 40;
    let mut t = null_mut();
    // SAFETY: live contexts, connections and buffers.
    unsafe {
        assert_eq!(
            doca_rdma_task_atomic_fetch_add_allocate_init(
                p.a.rdma,
                p.aconn,
                null_mut(),
                p.a.buf(0, 8, 0),
                2,
                ND,
                &mut t
            ),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_rdma_task_atomic_fetch_add_allocate_init(
            p.a.rdma,
            p.aconn,
            p.rbuf(96, 8, 0),
            p.a.buf(0, 8, 0),
            2,
            ND,
            &mut t,
        ));
        assert_eq!(
            submit(doca_rdma_task_atomic_fetch_add_as_task(t)),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_rdma_task_atomic_fetch_add_allocate_init(
            p.a.rdma,
            p.aconn,
            p.rbuf(96, 8, 8),
            p.a.buf(0, 8, 0),
            2,
            ND,
            &mut t,
        ));
        ok(submit(doca_rdma_task_atomic_fetch_add_as_task(t)));
        assert!(matches!(
            wait_events(&[&p.a], &p.a, 1).as_slice(),
            [Ev::Ok(_)]
        ));
        // Not 8-byte aligned: the task fails.
        ok(doca_rdma_task_atomic_fetch_add_allocate_init(
            p.a.rdma,
            p.aconn,
            p.rbuf(97, 8, 8),
            p.a.buf(8, 8, 0),
            2,
            ND,
            &mut t,
        ));
        ok(submit(doca_rdma_task_atomic_fetch_add_as_task(t)));
        assert!(matches!(
            wait_events(&[&p.a], &p.a, 1).as_slice(),
            [Ev::Err(_, DOCA_ERROR_IO_FAILED)]
        ));
    }
    assert_eq!(p.b.mem[12], 42);
    assert_eq!(p.a.mem[0], 40);
}

// ------------------------------------------------------------------------------------------
// Tasks: setters (a task is reusable: change it and submit again)
// ------------------------------------------------------------------------------------------

/// `doca_rdma_task_receive_set_dst_buf`; on a submitted task it is a recorded violation.
#[test]
fn receive_setters_apply_to_the_next_submission() {
    let mut p = pair();
    p.a.write_bytes(0, b"xy");
    let recv = p.b.post_recv(p.b.buf(0, 64, 0));
    let r = recv.cast::<doca_rdma_task_receive>();
    let other = p.b.buf(128, 64, 0);
    // SAFETY: a receive task of a live context.
    unsafe {
        doca_rdma_task_receive_set_dst_buf(r, other);
        assert!(violated(
            "doca_rdma_task_receive_set_dst_buf",
            recv as usize
        ));
        assert_ne!(
            doca_rdma_task_receive_get_dst_buf(r),
            other,
            "unchanged while submitted"
        );
        p.a.send(p.aconn, p.a.buf(0, 2, 2));
        wait_events(&[&p.a, &p.b], &p.b, 1);
        doca_rdma_task_receive_set_dst_buf(r, other);
        assert_eq!(doca_rdma_task_receive_get_dst_buf(r), other);
        ok(submit(recv));
        p.a.send(p.aconn, p.a.buf(0, 2, 2));
        wait_events(&[&p.a, &p.b], &p.b, 1);
    }
    assert_eq!(p.b.bytes(128, 2), b"xy");
}

/// `doca_rdma_task_send_set_src_buf` and `doca_rdma_task_send_set_rdma_connection`.
#[test]
fn send_setters_apply_to_the_next_submission() {
    let mut p = pair();
    let c = Side::new(Config::default());
    let (aconn2, _) = oob_pair(&p.a, &c);
    p.a.write_bytes(0, b"one");
    p.a.write_bytes(8, b"two");
    let send = p.a.send(p.aconn, null_mut());
    let s = send.cast::<doca_rdma_task_send>();
    p.b.post_recv(p.b.buf(0, 64, 0));
    wait_events(&[&p.a, &p.b], &p.a, 1);
    c.post_recv(c.buf(0, 64, 0));
    // SAFETY: an idle send task of a live context.
    unsafe {
        doca_rdma_task_send_set_src_buf(s, p.a.buf(8, 3, 3));
        doca_rdma_task_send_set_rdma_connection(s, aconn2);
        ok(submit(send));
        wait_events(&[&p.a, &c], &c, 1);
        assert_eq!(c.bytes(0, 3), b"two");
        // A connection of another context: refused at submit (and recorded).
        let (_, foreign, _) = export_conn(&c);
        doca_rdma_task_send_set_rdma_connection(s, foreign);
        assert_eq!(submit(send), DOCA_ERROR_INVALID_VALUE);
        assert!(violated("doca_task_submit", send as usize));
    }
}

/// `doca_rdma_task_send_imm_set_src_buf`, `_set_immediate_data`, `_set_rdma_connection`.
#[test]
fn send_imm_setters_apply_to_the_next_submission() {
    let p = pair();
    let mut t = null_mut();
    let c = Side::new(Config::default());
    let (foreign, _) = oob_pair(&c, &p.b);
    // SAFETY: live context and connection; the task is idle when changed.
    unsafe {
        ok(doca_rdma_task_send_imm_allocate_init(
            p.a.rdma,
            p.aconn,
            null(),
            0,
            ND,
            &mut t,
        ));
        let task = doca_rdma_task_send_imm_as_task(t);
        doca_rdma_task_send_imm_set_rdma_connection(t, foreign);
        assert_eq!(
            submit(task),
            DOCA_ERROR_INVALID_VALUE,
            "another context's connection"
        );
        doca_rdma_task_send_imm_set_rdma_connection(t, p.aconn);
        doca_rdma_task_send_imm_set_immediate_data(t, 77u32.to_be());
        doca_rdma_task_send_imm_set_src_buf(t, null());
        let recv = p.b.post_recv(p.b.buf(0, 64, 0));
        ok(submit(task));
        wait_events(&[&p.a, &p.b], &p.b, 1);
        let r = recv.cast::<doca_rdma_task_receive>();
        assert_eq!(
            doca_rdma_task_receive_get_result_immediate_data(r),
            77u32.to_be()
        );
        assert_eq!(doca_rdma_task_receive_get_result_len(r), 0);
    }
}

/// `doca_rdma_task_read_set_src_buf`, `_set_dst_buf`, `_set_rdma_connection`.
#[test]
fn read_setters_apply_to_the_next_submission() {
    let mut p = pair();
    p.b.write_bytes(0, b"abcdef");
    let mut t = null_mut();
    // SAFETY: live contexts and buffers; the task is idle when changed.
    unsafe {
        ok(doca_rdma_task_read_allocate_init(
            p.a.rdma,
            p.aconn,
            null(),
            null_mut(),
            ND,
            &mut t,
        ));
        doca_rdma_task_read_set_src_buf(t, p.rbuf(2, 4, 4));
        doca_rdma_task_read_set_dst_buf(t, p.a.buf(64, 8, 0));
        doca_rdma_task_read_set_rdma_connection(t, p.aconn);
        ok(submit(doca_rdma_task_read_as_task(t)));
        wait_events(&[&p.a], &p.a, 1);
    }
    assert_eq!(p.a.bytes(64, 4), b"cdef");
}

/// `doca_rdma_task_write_set_src_buf`, `_set_dst_buf`, `_set_rdma_connection`.
#[test]
fn write_setters_apply_to_the_next_submission() {
    let mut p = pair();
    p.a.write_bytes(0, b"wxyz");
    let w = p.a.write(p.aconn, null_mut(), null_mut());
    wait_events(&[&p.a], &p.a, 1);
    let t = w.cast::<doca_rdma_task_write>();
    // SAFETY: an idle write task of a live context.
    unsafe {
        doca_rdma_task_write_set_src_buf(t, p.a.buf(0, 4, 4));
        doca_rdma_task_write_set_dst_buf(t, p.rbuf(32, 8, 0));
        doca_rdma_task_write_set_rdma_connection(t, p.aconn);
        ok(submit(w));
        wait_events(&[&p.a], &p.a, 1);
    }
    assert_eq!(p.b.bytes(32, 4), b"wxyz");
}

/// `doca_rdma_task_write_imm_set_src_buf`, `_set_dst_buf`, `_set_immediate_data`,
/// `_set_rdma_connection`.
#[test]
fn write_imm_setters_apply_to_the_next_submission() {
    let mut p = pair();
    p.a.write_bytes(0, b"qq");
    let mut t = null_mut();
    // SAFETY: live contexts and buffers; the task is idle when changed.
    unsafe {
        ok(doca_rdma_task_write_imm_allocate_init(
            p.a.rdma,
            p.aconn,
            null(),
            null_mut(),
            0,
            ND,
            &mut t,
        ));
        doca_rdma_task_write_imm_set_src_buf(t, p.a.buf(0, 2, 2));
        doca_rdma_task_write_imm_set_dst_buf(t, p.rbuf(40, 8, 0));
        doca_rdma_task_write_imm_set_immediate_data(t, 5u32.to_be());
        doca_rdma_task_write_imm_set_rdma_connection(t, p.aconn);
        let recv = p.b.post_recv(null_mut());
        ok(submit(doca_rdma_task_write_imm_as_task(t)));
        wait_events(&[&p.a, &p.b], &p.b, 1);
        let r = recv.cast::<doca_rdma_task_receive>();
        assert_eq!(
            doca_rdma_task_receive_get_result_immediate_data(r),
            5u32.to_be()
        );
    }
    assert_eq!(p.b.bytes(40, 2), b"qq");
}

/// `doca_rdma_task_atomic_cmp_swp_set_{dst_buf,result_buf,cmp_data,swap_data,rdma_connection}`.
#[test]
fn atomic_cmp_swp_setters_apply_to_the_next_submission() {
    let mut p = pair();
    p.b.mem[20] = 1;
    p.b.mem[21] = 100;
    let mut t = null_mut();
    // SAFETY: live contexts and buffers; the task is idle when changed.
    unsafe {
        ok(doca_rdma_task_atomic_cmp_swp_allocate_init(
            p.a.rdma,
            p.aconn,
            p.rbuf(160, 8, 8),
            p.a.buf(0, 16, 0),
            1,
            2,
            ND,
            &mut t,
        ));
        let task = doca_rdma_task_atomic_cmp_swp_as_task(t);
        ok(submit(task));
        doca_rdma_task_atomic_cmp_swp_set_swap_data(t, 9);
        assert!(violated(
            "doca_rdma_task_atomic_cmp_swp_set_swap_data",
            task as usize
        ));
        wait_events(&[&p.a], &p.a, 1);
        doca_rdma_task_atomic_cmp_swp_set_dst_buf(t, p.rbuf(168, 8, 8));
        doca_rdma_task_atomic_cmp_swp_set_result_buf(t, p.a.buf(64, 8, 0));
        doca_rdma_task_atomic_cmp_swp_set_cmp_data(t, 100);
        doca_rdma_task_atomic_cmp_swp_set_swap_data(t, 200);
        doca_rdma_task_atomic_cmp_swp_set_rdma_connection(t, p.aconn);
        ok(submit(task));
        wait_events(&[&p.a], &p.a, 1);
    }
    assert_eq!(
        p.b.mem[20], 2,
        "the first submission used the original swap value"
    );
    assert_eq!(p.b.mem[21], 200);
    assert_eq!(p.a.mem[8], 100);
}

/// `doca_rdma_task_atomic_fetch_add_set_{dst_buf,result_buf,add_data,rdma_connection}`.
#[test]
fn atomic_fetch_add_setters_apply_to_the_next_submission() {
    let mut p = pair();
    p.b.mem[30] = 7;
    let mut t = null_mut();
    // SAFETY: live contexts and buffers; the task is idle when changed.
    unsafe {
        ok(doca_rdma_task_atomic_fetch_add_allocate_init(
            p.a.rdma,
            p.aconn,
            p.rbuf(0, 8, 8),
            p.a.buf(0, 8, 0),
            1,
            ND,
            &mut t,
        ));
        doca_rdma_task_atomic_fetch_add_set_dst_buf(t, p.rbuf(240, 8, 8));
        doca_rdma_task_atomic_fetch_add_set_result_buf(t, p.a.buf(16, 8, 0));
        doca_rdma_task_atomic_fetch_add_set_add_data(t, 3);
        doca_rdma_task_atomic_fetch_add_set_rdma_connection(t, p.aconn);
        ok(submit(doca_rdma_task_atomic_fetch_add_as_task(t)));
        wait_events(&[&p.a], &p.a, 1);
    }
    assert_eq!(p.b.mem[30], 10);
    assert_eq!(p.a.mem[2], 7);
}

// ------------------------------------------------------------------------------------------
// Tasks: receive results
// ------------------------------------------------------------------------------------------

/// A pair with one completed receive of `msg` (sent with `imm` when given).
fn received(msg: &[u8], imm: Option<u32>) -> (Pair, *mut doca_rdma_task_receive) {
    let mut p = pair();
    p.a.write_bytes(0, msg);
    let recv = p.b.post_recv(p.b.buf(0, 64, 0));
    let src = p.a.buf(0, msg.len(), msg.len());
    let mut t = null_mut();
    // SAFETY: live contexts, connection and buffer.
    unsafe {
        match imm {
            Some(imm) => {
                ok(doca_rdma_task_send_imm_allocate_init(
                    p.a.rdma, p.aconn, src, imm, ND, &mut t,
                ));
                ok(submit(doca_rdma_task_send_imm_as_task(t)));
            }
            None => {
                p.a.send(p.aconn, src);
            }
        }
    }
    wait_events(&[&p.a, &p.b], &p.b, 1);
    (p, recv.cast())
}

#[test]
fn receive_get_dst_buf_returns_the_buffer() {
    let p = pair();
    let buf = p.b.buf(0, 64, 0);
    let mut t = null_mut();
    // SAFETY: a receive task of a live context; a bogus handle on purpose.
    unsafe {
        ok(doca_rdma_task_receive_allocate_init(
            p.b.rdma, buf, ND, &mut t,
        ));
        assert_eq!(doca_rdma_task_receive_get_dst_buf(t), buf);
        let bogus = 8usize as *const doca_rdma_task_receive;
        assert!(doca_rdma_task_receive_get_dst_buf(bogus).is_null());
        assert!(violated("doca_rdma_task_receive_get_dst_buf", 8));
    }
}

#[test]
fn receive_get_result_len_only_after_success() {
    let (p, r) = received(b"12345", None);
    // SAFETY: a receive task of a live context.
    unsafe {
        assert_eq!(doca_rdma_task_receive_get_result_len(r), 5);
        // Submitted again: undefined until it completes.
        ok(submit(doca_rdma_task_receive_as_task(r)));
        assert_eq!(doca_rdma_task_receive_get_result_len(r), 0xDEAD_BEEF);
        assert!(violated(
            "doca_rdma_task_receive_get_result_len",
            r as usize
        ));
        // A failed completion (flushed by stop): still undefined.
        assert_eq!(doca_ctx_stop(p.b.ctx), DOCA_ERROR_IN_PROGRESS);
        assert!(matches!(
            wait_events(&[&p.b], &p.b, 1).as_slice(),
            [Ev::Err(..), ..]
        ));
        assert_eq!(doca_rdma_task_receive_get_result_len(r), 0xDEAD_BEEF);
    }
}

#[test]
fn receive_get_result_opcode_only_after_completion() {
    let (p, r) = received(b"1", Some(3));
    // SAFETY: receive tasks of a live context.
    unsafe {
        assert_eq!(
            doca_rdma_task_receive_get_result_opcode(r),
            DOCA_RDMA_OPCODE_RECV_SEND_WITH_IMM
        );
        let mut t = null_mut();
        ok(doca_rdma_task_receive_allocate_init(
            p.b.rdma,
            null_mut(),
            ND,
            &mut t,
        ));
        assert_eq!(
            doca_rdma_task_receive_get_result_opcode(t),
            0xDEAD_BEEF,
            "never completed"
        );
        assert!(violated(
            "doca_rdma_task_receive_get_result_opcode",
            t as usize
        ));
    }
}

/// Undefined unless the receive succeeded with RECV_SEND_WITH_IMM or RECV_WRITE_WITH_IMM: a
/// poison value and a recorded violation.
#[test]
fn receive_get_result_immediate_data_only_with_imm() {
    let (_p, r) = received(b"plain", None);
    // SAFETY: a completed receive task of a live context.
    unsafe {
        assert_eq!(
            doca_rdma_task_receive_get_result_opcode(r),
            DOCA_RDMA_OPCODE_RECV_SEND
        );
        assert_eq!(
            doca_rdma_task_receive_get_result_immediate_data(r),
            0xDEAD_BEEF
        );
    }
    assert!(violated(
        "doca_rdma_task_receive_get_result_immediate_data",
        r as usize
    ));
    let (_p, r) = received(b"imm", Some(0x0102_0304));
    // SAFETY: a completed receive task of a live context.
    let imm = unsafe { doca_rdma_task_receive_get_result_immediate_data(r) };
    assert_eq!(imm, 0x0102_0304);
}

/// Defined only inside the successful completion callback of the receive.
#[test]
fn receive_get_result_rdma_connection_only_in_the_callback() {
    let p = pair();
    let recv = p.b.post_recv(p.b.buf(0, 64, 0));
    p.a.send(p.aconn, null_mut());
    wait_events(&[&p.a, &p.b], &p.b, 1);
    // The harness's success callback read it: a live connection of b.
    let seen = p.b.rec.recv_conns.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, recv as usize);
    let mut id = 0;
    // SAFETY: the connection was read in the callback; the task is a completed receive.
    unsafe {
        ok(doca_rdma_connection_get_id(seen[0].1 as *const _, &mut id));
        let r = recv.cast::<doca_rdma_task_receive>();
        let outside = doca_rdma_task_receive_get_result_rdma_connection(r);
        assert_eq!(outside as usize, 0xDEAD_BEEF);
    }
    assert!(violated(
        "doca_rdma_task_receive_get_result_rdma_connection",
        recv as usize
    ));
}

// ------------------------------------------------------------------------------------------
// Tasks: generic calls
// ------------------------------------------------------------------------------------------

#[test]
fn task_submit_validates_and_refuses() {
    let p = pair();
    let mut t = null_mut();
    // SAFETY: tasks of live contexts; a bogus handle on purpose.
    unsafe {
        let bogus = 16usize as *mut doca_task;
        assert_eq!(submit(bogus), DOCA_ERROR_INVALID_VALUE);
        assert!(violated("doca_task_submit", 16));
        // A buffer released after allocation.
        let buf = p.a.buf(0, 8, 8);
        ok(doca_rdma_task_send_allocate_init(
            p.a.rdma, p.aconn, buf, ND, &mut t,
        ));
        let send = doca_rdma_task_send_as_task(t);
        ok(doca_buf_dec_refcount(buf, null_mut()));
        assert_eq!(submit(send), DOCA_ERROR_INVALID_VALUE);
        assert!(violated("doca_task_submit", send as usize));
        // Submitted twice.
        doca_rdma_task_send_set_src_buf(t, null());
        ok(submit(send));
        assert_eq!(submit(send), DOCA_ERROR_IN_USE);
        // A remote buffer where a local one is needed.
        let mut w = null_mut();
        ok(doca_rdma_task_write_allocate_init(
            p.a.rdma,
            p.aconn,
            null(),
            null_mut(),
            ND,
            &mut w,
        ));
        doca_rdma_task_write_set_src_buf(w, p.rbuf(0, 8, 8));
        doca_rdma_task_write_set_dst_buf(w, p.rbuf(0, 8, 0));
        assert_eq!(
            submit(doca_rdma_task_write_as_task(w)),
            DOCA_ERROR_INVALID_VALUE
        );
        // Not running.
        assert_eq!(doca_ctx_stop(p.a.ctx), DOCA_ERROR_IN_PROGRESS);
        assert_eq!(
            submit(doca_rdma_task_write_as_task(w)),
            DOCA_ERROR_BAD_STATE
        );
    }
}

#[test]
fn task_free_of_a_submitted_task_is_a_violation() {
    let p = pair();
    let recv = p.b.post_recv(p.b.buf(0, 64, 0));
    // SAFETY: a submitted task, then the same task idle.
    unsafe {
        doca_task_free(recv);
        assert!(violated("doca_task_free", recv as usize));
        p.a.send(p.aconn, null_mut());
        assert_eq!(
            wait_events(&[&p.a, &p.b], &p.b, 1),
            [Ev::Ok(recv as usize)],
            "still alive"
        );
        doca_task_free(recv);
        assert_eq!(
            doca_ctx_stop(p.b.ctx),
            DOCA_SUCCESS,
            "nothing allocated any more"
        );
    }
}

#[test]
fn task_get_status_reports_the_completion() {
    let p = pair();
    let w = p.a.write(p.aconn, p.a.buf(0, 8, 8), p.rbuf(0, 4, 0));
    assert_eq!(
        wait_events(&[&p.a], &p.a, 1),
        [Ev::Err(w as usize, DOCA_ERROR_IO_FAILED)]
    );
    // SAFETY: a completed task; a bogus handle on purpose.
    unsafe {
        assert_eq!(doca_task_get_status(w), DOCA_ERROR_IO_FAILED);
        assert_eq!(
            doca_task_get_status(24usize as *const _),
            DOCA_ERROR_INVALID_VALUE
        );
        assert!(violated("doca_task_get_status", 24));
    }
}

/// `doca_task_set_user_data` and `doca_task_get_user_data`.
#[test]
fn task_user_data_round_trip() {
    let side = Side::new(Config::default());
    let mut t = null_mut();
    // SAFETY: a task of a live context.
    unsafe {
        ok(doca_rdma_task_receive_allocate_init(
            side.rdma,
            null_mut(),
            doca_data { u64_: 4 },
            &mut t,
        ));
        let task = doca_rdma_task_receive_as_task(t);
        assert_eq!(doca_task_get_user_data(task).u64_, 4);
        doca_task_set_user_data(task, doca_data { u64_: 5 });
        assert_eq!(doca_task_get_user_data(task).u64_, 5);
        doca_task_free(task);
    }
}

// ------------------------------------------------------------------------------------------
// Memory maps
// ------------------------------------------------------------------------------------------

/// A 4 KiB, 8-aligned heap region that outlives the mmaps of a test (leaked on purpose).
fn region() -> *mut std::ffi::c_void {
    Box::leak(vec![0u64; 512].into_boxed_slice())
        .as_mut_ptr()
        .cast()
}

fn new_mmap(dev: *mut doca_dev, perms: u32) -> *mut doca_mmap {
    let mut m = null_mut();
    // SAFETY: out-pointer to a local; the region is leaked, so it outlives the mmap.
    unsafe {
        ok(doca_mmap_create(&mut m));
        ok(doca_mmap_set_memrange(m, region(), 4096));
        ok(doca_mmap_set_permissions(m, perms));
        ok(doca_mmap_add_dev(m, dev));
    }
    m
}

#[test]
fn mmap_create_checks_its_argument() {
    let mut m = null_mut();
    // SAFETY: out-pointer to a local, or NULL on purpose.
    unsafe {
        assert_eq!(doca_mmap_create(null_mut()), DOCA_ERROR_INVALID_VALUE);
        ok(doca_mmap_create(&mut m));
        ok(doca_mmap_destroy(m));
    }
}

#[test]
fn mmap_destroy_refuses_with_buffers_out() {
    let side = Side::new(Config::default());
    let buf = side.buf(0, 8, 0);
    // SAFETY: live objects of `side`.
    unsafe {
        assert_eq!(doca_mmap_destroy(null_mut()), DOCA_ERROR_INVALID_VALUE);
        assert_eq!(doca_mmap_destroy(side.mmap), DOCA_ERROR_NOT_PERMITTED);
        ok(doca_buf_dec_refcount(buf, null_mut()));
        // Started and exported: destroy stops it implicitly.
        side.export_mmap();
        ok(doca_mmap_destroy(side.mmap));
    }
}

#[test]
fn mmap_start_checks_configuration() {
    let dev = open_dev();
    let mut m = null_mut();
    // SAFETY: mmaps created here.
    unsafe {
        assert_eq!(doca_mmap_start(null_mut()), DOCA_ERROR_INVALID_VALUE);
        ok(doca_mmap_create(&mut m));
        assert_eq!(
            doca_mmap_start(m),
            DOCA_ERROR_BAD_STATE,
            "no memory range (stricter)"
        );
        ok(doca_mmap_set_memrange(m, region(), 64));
        ok(doca_mmap_start(m));
        assert_eq!(
            doca_mmap_start(m),
            DOCA_ERROR_BAD_STATE,
            "started (stricter)"
        );
        ok(doca_mmap_destroy(m));

        let m = new_mmap(dev, ALL_PERMS);
        ok(doca_mmap_start(m));
        let (mut blob, mut len) = (null(), 0);
        ok(doca_mmap_export_rdma(m, dev, &mut blob, &mut len));
        assert_eq!(doca_mmap_start(m), DOCA_ERROR_NOT_PERMITTED, "exported");
        let mut imported = null_mut();
        ok(doca_mmap_create_from_export(
            null(),
            blob,
            len,
            dev,
            &mut imported,
        ));
        assert_eq!(
            doca_mmap_start(imported),
            DOCA_ERROR_NOT_PERMITTED,
            "from export"
        );
    }
}

#[test]
fn mmap_stop_refuses_exported_and_in_use() {
    let side = Side::new(Config::default());
    let m = new_mmap(side.dev, ALL_PERMS);
    // SAFETY: mmaps of live objects.
    unsafe {
        assert_eq!(doca_mmap_stop(null_mut()), DOCA_ERROR_INVALID_VALUE);
        assert_eq!(
            doca_mmap_stop(m),
            DOCA_ERROR_BAD_STATE,
            "not started (stricter)"
        );
        ok(doca_mmap_start(m));
        ok(doca_mmap_stop(m));
        let buf = side.buf(0, 8, 0);
        assert_eq!(
            doca_mmap_stop(side.mmap),
            DOCA_ERROR_NOT_PERMITTED,
            "a buffer is out"
        );
        ok(doca_buf_dec_refcount(buf, null_mut()));
        let blob = side.export_mmap();
        assert_eq!(
            doca_mmap_stop(side.mmap),
            DOCA_ERROR_NOT_PERMITTED,
            "exported"
        );
        let imported = side.import_mmap(&blob);
        assert_eq!(
            doca_mmap_stop(imported),
            DOCA_ERROR_NOT_PERMITTED,
            "from export"
        );
    }
}

#[test]
fn mmap_set_memrange_once_before_start() {
    let side = Side::new(Config::default());
    let mut m = null_mut();
    let r = region();
    // SAFETY: mmaps created here or of `side`; the region is leaked.
    unsafe {
        ok(doca_mmap_create(&mut m));
        assert_eq!(
            doca_mmap_set_memrange(m, null_mut(), 64),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(doca_mmap_set_memrange(m, r, 0), DOCA_ERROR_INVALID_VALUE);
        assert_eq!(
            doca_mmap_set_memrange(m, usize::MAX as *mut _, 2),
            DOCA_ERROR_INVALID_VALUE,
            "overflows"
        );
        ok(doca_mmap_set_memrange(m, r, 64));
        assert_eq!(
            doca_mmap_set_memrange(m, r, 128),
            DOCA_ERROR_NOT_PERMITTED,
            "only once"
        );
        assert_eq!(
            doca_mmap_set_memrange(side.mmap, r, 64),
            DOCA_ERROR_BAD_STATE,
            "started"
        );
        let imported = side.import_mmap(&side.export_mmap());
        assert_eq!(
            doca_mmap_set_memrange(imported, r, 64),
            DOCA_ERROR_NOT_PERMITTED
        );
        ok(doca_mmap_destroy(m));
    }
}

#[test]
fn mmap_set_permissions_rejects_invalid_masks() {
    let mut m = null_mut();
    // SAFETY: an mmap created here.
    unsafe {
        ok(doca_mmap_create(&mut m));
        for bad in [
            DOCA_ACCESS_FLAG_RDMA_WRITE,
            DOCA_ACCESS_FLAG_RDMA_ATOMIC,
            DOCA_ACCESS_FLAG_RDMA_READ | DOCA_ACCESS_FLAG_RDMA_WRITE,
            DOCA_ACCESS_FLAG_PCI_READ_ONLY | DOCA_ACCESS_FLAG_PCI_READ_WRITE,
            1 << 7,
            DOCA_ACCESS_FLAG_LOCAL_READ_WRITE | (1 << 31),
        ] {
            assert_eq!(
                doca_mmap_set_permissions(m, bad),
                DOCA_ERROR_INVALID_VALUE,
                "{bad:#x}"
            );
        }
        for good in [
            DOCA_ACCESS_FLAG_LOCAL_READ_ONLY,
            DOCA_ACCESS_FLAG_LOCAL_READ_WRITE,
            DOCA_ACCESS_FLAG_RDMA_READ,
            DOCA_ACCESS_FLAG_LOCAL_READ_WRITE | DOCA_ACCESS_FLAG_RDMA_WRITE,
            ALL_PERMS,
            DOCA_ACCESS_FLAG_LOCAL_READ_WRITE | DOCA_ACCESS_FLAG_PCI_RELAXED_ORDERING,
            DOCA_ACCESS_FLAG_PCI_READ_WRITE,
        ] {
            ok(doca_mmap_set_permissions(m, good));
        }
        assert_eq!(
            doca_mmap_set_permissions(null_mut(), 0),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_mmap_set_memrange(m, region(), 64));
        ok(doca_mmap_start(m));
        assert_eq!(
            doca_mmap_set_permissions(m, ALL_PERMS),
            DOCA_ERROR_BAD_STATE
        );
        ok(doca_mmap_destroy(m));
    }
}

#[test]
fn mmap_add_dev_once_before_start() {
    let side = Side::new(Config::default());
    let mut m = null_mut();
    // SAFETY: mmaps created here or of `side`.
    unsafe {
        ok(doca_mmap_create(&mut m));
        assert_eq!(doca_mmap_add_dev(m, null_mut()), DOCA_ERROR_INVALID_VALUE);
        ok(doca_mmap_add_dev(m, side.dev));
        assert_eq!(doca_mmap_add_dev(m, side.dev), DOCA_ERROR_ALREADY_EXIST);
        let again = open_dev();
        assert_eq!(
            doca_mmap_add_dev(m, again),
            DOCA_ERROR_ALREADY_EXIST,
            "another opening of the same device"
        );
        assert_eq!(
            doca_mmap_add_dev(side.mmap, side.dev),
            DOCA_ERROR_NOT_PERMITTED,
            "started"
        );
        let imported = side.import_mmap(&side.export_mmap());
        assert_eq!(
            doca_mmap_add_dev(imported, side.dev),
            DOCA_ERROR_NOT_PERMITTED
        );
        ok(doca_mmap_destroy(m));
    }
}

#[test]
fn mmap_export_rdma_needs_started_rdma_mmap() {
    let dev = open_dev();
    let mut other = null_mut();
    // SAFETY: a list entry; out-pointer to a local.
    unsafe { ok(doca_dev_open(devinfo(1), &mut other)) };
    let (mut blob, mut len) = (null(), 0);
    // SAFETY: mmaps created here; out-pointers to locals.
    unsafe {
        let local_only = new_mmap(dev, DOCA_ACCESS_FLAG_LOCAL_READ_WRITE);
        ok(doca_mmap_start(local_only));
        assert_eq!(
            doca_mmap_export_rdma(local_only, dev, &mut blob, &mut len),
            DOCA_ERROR_NOT_PERMITTED,
            "no RDMA permission"
        );
        let m = new_mmap(dev, ALL_PERMS);
        assert_eq!(
            doca_mmap_export_rdma(m, dev, &mut blob, &mut len),
            DOCA_ERROR_NOT_PERMITTED,
            "not started"
        );
        ok(doca_mmap_start(m));
        assert_eq!(
            doca_mmap_export_rdma(m, other, &mut blob, &mut len),
            DOCA_ERROR_NOT_FOUND,
            "device not added"
        );
        assert_eq!(
            doca_mmap_export_rdma(m, dev, null_mut(), &mut len),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_mmap_export_rdma(m, dev, &mut blob, &mut len));
        let mut imported = null_mut();
        ok(doca_mmap_create_from_export(
            null(),
            blob,
            len,
            dev,
            &mut imported,
        ));
        assert_eq!(
            doca_mmap_export_rdma(imported, dev, &mut blob, &mut len),
            DOCA_ERROR_NOT_PERMITTED,
            "created from an export"
        );
    }
}

#[test]
fn mmap_create_from_export_checks_the_blob() {
    let side = Side::new(Config::default());
    let blob = side.export_mmap();
    let mut m = null_mut();
    let mut no_rdma = null_mut();
    // SAFETY: the blob is readable; out-pointers to locals.
    unsafe {
        ok(doca_dev_open(devinfo(2), &mut no_rdma));
        assert_eq!(
            doca_mmap_create_from_export(
                null(),
                blob.as_ptr().cast(),
                blob.len() - 1,
                side.dev,
                &mut m
            ),
            DOCA_ERROR_INVALID_VALUE
        );
        let mut bad = blob.clone();
        bad[0] ^= 1;
        assert_eq!(
            doca_mmap_create_from_export(null(), bad.as_ptr().cast(), bad.len(), side.dev, &mut m),
            DOCA_ERROR_INVALID_VALUE
        );
        // The descriptor names the device it was exported for (its last 4 bytes): one the
        // device list does not have is not a descriptor of `doca_mmap_export_rdma`.
        let mut bad = blob.clone();
        let n = bad.len();
        bad[n - 4..].copy_from_slice(&7u32.to_le_bytes());
        assert_eq!(
            doca_mmap_create_from_export(null(), bad.as_ptr().cast(), bad.len(), side.dev, &mut m),
            DOCA_ERROR_INVALID_VALUE,
            "names no device"
        );
        assert_eq!(
            doca_mmap_create_from_export(
                null(),
                blob.as_ptr().cast(),
                blob.len(),
                null_mut(),
                &mut m
            ),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            doca_mmap_create_from_export(null(), blob.as_ptr().cast(), blob.len(), no_rdma, &mut m),
            DOCA_ERROR_NOT_SUPPORTED
        );
        ok(doca_mmap_create_from_export(
            null(),
            blob.as_ptr().cast(),
            blob.len(),
            side.dev,
            &mut m,
        ));
        ok(doca_mmap_destroy(m));
        ok(doca_dev_close(no_rdma));
    }
}

/// An export is "for the device provided as dev" (doca_mmap.h: doca_mmap_export_rdma): one
/// descriptor per device, and, as a verbs key in its own protection domain, its key works only
/// for accesses that reach a context on that device. An mmap with two devices exported for the
/// wrong one: the remote access fails the task.
#[test]
fn remote_access_needs_the_exporting_device() {
    let a = Side::new(Config::default());
    let b = Side::new(Config::default());
    let (_, bconn) = oob_pair(&a, &b);
    let mut mem = vec![0u64; 8];
    let mut dev1 = null_mut();
    let mut m = null_mut();
    let (mut p, mut n) = (null(), 0);
    // SAFETY: `mem` outlives the mmap (destroyed below); out-pointers to locals; every blob
    // is copied before the next call.
    unsafe {
        ok(doca_dev_open(devinfo(1), &mut dev1));
        ok(doca_mmap_create(&mut m));
        ok(doca_mmap_set_memrange(m, mem.as_mut_ptr().cast(), 64));
        ok(doca_mmap_set_permissions(m, ALL_PERMS));
        ok(doca_mmap_add_dev(m, a.dev));
        ok(doca_mmap_add_dev(m, dev1));
        ok(doca_mmap_start(m));
        let mut export = |dev| {
            ok(doca_mmap_export_rdma(m, dev, &mut p, &mut n));
            std::slice::from_raw_parts(p.cast::<u8>(), n).to_vec()
        };
        let for_other = export(dev1);
        let for_a = export(a.dev);
        assert_ne!(for_a, for_other, "one descriptor per device");
        assert_eq!(
            export(a.dev),
            for_a,
            "the same one again for the same device"
        );

        // `a`'s context runs on `a.dev`: a write through the right export lands.
        let right = b.import_mmap(&for_a);
        let wrong = b.import_mmap(&for_other);
        let mut b = b;
        b.write_bytes(0, b"12345678");
        let src = b.buf(0, 8, 8);
        let to_right = b.remote_buf(right, mem.as_mut_ptr().cast(), 8, 0);
        let w = b.write(bconn, src, to_right);
        assert_eq!(wait_events(&[&b], &b, 1), [Ev::Ok(w as usize)]);
        assert_eq!(mem[0].to_ne_bytes(), *b"12345678");
        // Through the export for the other device: the key is not valid where it arrives.
        let to_wrong = b.remote_buf(wrong, mem.as_mut_ptr().add(1).cast(), 8, 0);
        let w = b.write(bconn, src, to_wrong);
        assert_eq!(
            wait_events(&[&b], &b, 1),
            [Ev::Err(w as usize, DOCA_ERROR_IO_FAILED)]
        );
        assert_eq!(mem[1], 0);

        for buf in [src, to_right, to_wrong] {
            ok(doca_buf_dec_refcount(buf, null_mut()));
        }
        ok(doca_mmap_destroy(right));
        ok(doca_mmap_destroy(wrong));
        ok(doca_mmap_destroy(m));
        ok(doca_dev_close(dev1));
    }
}

// ------------------------------------------------------------------------------------------
// Buffer inventories and buffers
// ------------------------------------------------------------------------------------------

fn started_inventory(n: usize) -> *mut doca_buf_inventory {
    let mut inv = null_mut();
    // SAFETY: out-pointer to a local.
    unsafe {
        ok(doca_buf_inventory_create(n, &mut inv));
        ok(doca_buf_inventory_start(inv));
    }
    inv
}

fn get_buf(inv: *mut doca_buf_inventory, side: &Side, off: usize, len: usize) -> doca_error_t {
    let mut buf = null_mut();
    // SAFETY: live inventory and mmap; out-pointer to a local.
    unsafe {
        doca_buf_inventory_buf_get_by_args(
            inv,
            side.mmap,
            side.addr(off),
            len,
            side.addr(off),
            0,
            &mut buf,
        )
    }
}

#[test]
fn buf_inventory_create_checks_arguments() {
    let mut inv = null_mut();
    // SAFETY: out-pointer to a local, or NULL on purpose.
    unsafe {
        assert_eq!(
            doca_buf_inventory_create(0, &mut inv),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            doca_buf_inventory_create(4, null_mut()),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_buf_inventory_create(4, &mut inv));
        ok(doca_buf_inventory_destroy(inv));
    }
}

#[test]
fn buf_inventory_destroy_refuses_with_buffers_out() {
    let side = Side::new(Config::default());
    let inv = started_inventory(2);
    let mut buf = null_mut();
    // SAFETY: live inventory and mmap.
    unsafe {
        assert_eq!(
            doca_buf_inventory_destroy(null_mut()),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_buf_inventory_buf_get_by_args(
            inv,
            side.mmap,
            side.addr(0),
            8,
            side.addr(0),
            0,
            &mut buf,
        ));
        assert_eq!(doca_buf_inventory_destroy(inv), DOCA_ERROR_IN_USE);
        ok(doca_buf_dec_refcount(buf, null_mut()));
        ok(doca_buf_inventory_destroy(inv));
    }
}

#[test]
fn buf_inventory_start_enables_retrieval() {
    let side = Side::new(Config::default());
    let mut inv = null_mut();
    // SAFETY: an inventory created here.
    unsafe {
        assert_eq!(
            doca_buf_inventory_start(null_mut()),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_buf_inventory_create(2, &mut inv));
        assert_eq!(
            get_buf(inv, &side, 0, 8),
            DOCA_ERROR_BAD_STATE,
            "not started"
        );
        ok(doca_buf_inventory_start(inv));
        assert_eq!(
            doca_buf_inventory_start(inv),
            DOCA_ERROR_BAD_STATE,
            "started (stricter)"
        );
        ok(get_buf(inv, &side, 0, 8));
    }
}

#[test]
fn buf_inventory_stop_with_buffers_out_succeeds() {
    let side = Side::new(Config::default());
    let inv = started_inventory(2);
    let mut buf = null_mut();
    let mut len = 0;
    // SAFETY: live inventory, mmap and buffer.
    unsafe {
        assert_eq!(
            doca_buf_inventory_stop(null_mut()),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_buf_inventory_buf_get_by_args(
            inv,
            side.mmap,
            side.addr(0),
            8,
            side.addr(0),
            4,
            &mut buf,
        ));
        ok(doca_buf_inventory_stop(inv));
        assert_eq!(
            get_buf(inv, &side, 0, 8),
            DOCA_ERROR_BAD_STATE,
            "stopped: no retrieval"
        );
        ok(doca_buf_get_data_len(buf, &mut len));
        assert_eq!(len, 4, "the buffer that is out stays valid");
        assert_eq!(
            doca_buf_inventory_stop(inv),
            DOCA_ERROR_BAD_STATE,
            "stopped (stricter)"
        );
        assert_eq!(doca_buf_inventory_destroy(inv), DOCA_ERROR_IN_USE);
        ok(doca_buf_dec_refcount(buf, null_mut()));
        ok(doca_buf_inventory_destroy(inv));
    }
}

#[test]
fn buf_inventory_buf_get_by_args_checks_ranges() {
    let side = Side::new(Config::default());
    let inv = started_inventory(1);
    let mut buf = null_mut();
    let mut m = null_mut();
    // SAFETY: live inventory and mmaps; out-pointers to locals.
    unsafe {
        assert_eq!(
            doca_buf_inventory_buf_get_by_args(
                inv,
                side.mmap,
                side.addr(0),
                8,
                side.addr(0),
                0,
                null_mut()
            ),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            doca_buf_inventory_buf_get_by_args(
                inv,
                null_mut(),
                side.addr(0),
                8,
                side.addr(0),
                0,
                &mut buf
            ),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            get_buf(inv, &side, 4000, 200),
            DOCA_ERROR_INVALID_VALUE,
            "no suitable range"
        );
        assert_eq!(
            doca_buf_inventory_buf_get_by_args(
                inv,
                side.mmap,
                side.addr(0),
                8,
                side.addr(4),
                8,
                &mut buf
            ),
            DOCA_ERROR_INVALID_VALUE,
            "data outside the buffer"
        );
        assert!(violated("doca_buf_inventory_buf_get_by_args", inv as usize));
        ok(doca_mmap_create(&mut m));
        ok(doca_mmap_set_memrange(m, region(), 64));
        assert_eq!(
            doca_buf_inventory_buf_get_by_args(inv, m, null_mut(), 0, null_mut(), 0, &mut buf),
            DOCA_ERROR_BAD_STATE,
            "mmap not started"
        );
        ok(get_buf(inv, &side, 0, 8));
        assert_eq!(
            get_buf(inv, &side, 0, 8),
            DOCA_ERROR_NO_MEMORY,
            "inventory empty"
        );
        // The inline helpers are built on it.
        assert_eq!(
            doca_buf_inventory_buf_get_by_data(inv, side.mmap, side.addr(0), 8, &mut buf),
            DOCA_ERROR_NO_MEMORY
        );
    }
}

#[test]
fn buf_dec_refcount_reports_the_previous_count() {
    let side = Side::new(Config::default());
    let buf = side.buf(0, 8, 0);
    let mut before = 0;
    // SAFETY: a live buffer, then a released one.
    unsafe {
        ok(doca_buf_dec_refcount(buf, &mut before));
        assert_eq!(before, 1, "the count before the call");
        assert_eq!(
            doca_buf_dec_refcount(buf, &mut before),
            DOCA_ERROR_BAD_STATE,
            "already 0"
        );
        assert_eq!(
            doca_buf_dec_refcount(null_mut(), null_mut()),
            DOCA_ERROR_INVALID_VALUE
        );
    }
}

#[test]
fn buf_get_data_of_a_released_buffer_is_a_violation() {
    let side = Side::new(Config::default());
    let buf = side.buf(16, 32, 8);
    let mut data = null_mut();
    // SAFETY: a live buffer, then a released one.
    unsafe {
        ok(doca_buf_get_data(buf, &mut data));
        assert_eq!(data, side.addr(16));
        assert_eq!(doca_buf_get_data(buf, null_mut()), DOCA_ERROR_INVALID_VALUE);
        ok(doca_buf_dec_refcount(buf, null_mut()));
        assert_eq!(doca_buf_get_data(buf, &mut data), DOCA_ERROR_INVALID_VALUE);
    }
    assert!(violated("doca_buf_get_data", buf as usize));
}

#[test]
fn buf_get_data_len_reports_the_data_section() {
    let side = Side::new(Config::default());
    let buf = side.buf(16, 32, 8);
    let mut len = 0;
    // SAFETY: a live buffer; NULL on purpose.
    unsafe {
        ok(doca_buf_get_data_len(buf, &mut len));
        assert_eq!(len, 8);
        assert_eq!(
            doca_buf_get_data_len(buf, null_mut()),
            DOCA_ERROR_INVALID_VALUE
        );
    }
    assert!(violated("doca_buf_get_data_len", buf as usize));
}

#[test]
fn buf_set_data_outside_the_buffer_is_a_violation() {
    let side = Side::new(Config::default());
    let buf = side.buf(16, 32, 0);
    let (mut data, mut len) = (null_mut(), 0);
    // SAFETY: a live buffer.
    unsafe {
        ok(doca_buf_set_data(buf, side.addr(24), 24));
        assert_eq!(
            doca_buf_set_data(buf, side.addr(24), 25),
            DOCA_ERROR_INVALID_VALUE
        );
        assert!(violated("doca_buf_set_data", buf as usize));
        assert_eq!(
            doca_buf_set_data(buf, null_mut(), 0),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_buf_get_data(buf, &mut data));
        ok(doca_buf_get_data_len(buf, &mut len));
    }
    assert_eq!(
        (data, len),
        (side.addr(24), 24),
        "left unchanged by the refused calls"
    );
}

#[test]
fn buf_reset_data_len_empties_the_data_section() {
    let side = Side::new(Config::default());
    let buf = side.buf(16, 32, 8);
    let (mut data, mut len) = (null_mut(), 0);
    // SAFETY: a live buffer, then a released one.
    unsafe {
        ok(doca_buf_reset_data_len(buf));
        ok(doca_buf_get_data(buf, &mut data));
        ok(doca_buf_get_data_len(buf, &mut len));
        assert_eq!((data, len), (side.addr(16), 0), "data stays where it was");
        ok(doca_buf_dec_refcount(buf, null_mut()));
        assert_eq!(doca_buf_reset_data_len(buf), DOCA_ERROR_INVALID_VALUE);
    }
    assert!(violated("doca_buf_reset_data_len", buf as usize));
}

#[test]
fn pe_serves_every_context_connected_to_it() {
    let dev = open_dev();
    let mut pe = null_mut();
    let mut rdmas = [null_mut(); 2];
    // SAFETY: every handle is created here, used while live and destroyed at the end.
    unsafe {
        ok(doca_pe_create(&mut pe));
        for rdma in &mut rdmas {
            ok(doca_rdma_create(dev, rdma));
            ok(doca_rdma_set_permissions(*rdma, ALL_PERMS));
            ok(doca_pe_connect_ctx(pe, doca_rdma_as_ctx(*rdma)));
            let started = doca_ctx_start(doca_rdma_as_ctx(*rdma));
            assert!(started == DOCA_SUCCESS || started == DOCA_ERROR_IN_PROGRESS);
        }
        // Progressing the shared engine (until it reports nothing) moves both contexts.
        while doca_pe_progress(pe) != 0 {}
        for rdma in rdmas {
            let mut state = 0;
            ok(doca_ctx_get_state(doca_rdma_as_ctx(rdma), &mut state));
            assert_eq!(state, DOCA_CTX_STATE_RUNNING);
        }
        for rdma in rdmas {
            ok(doca_ctx_stop(doca_rdma_as_ctx(rdma)));
            ok(doca_rdma_destroy(rdma));
        }
        ok(doca_pe_destroy(pe));
        ok(doca_dev_close(dev));
    }
}

// ------------------------------------------------------------------------------------------
// DOCA 3.x: receiver-not-ready retries, inventory growth, submission without a doorbell
// ------------------------------------------------------------------------------------------

#[test]
fn rdma_set_rnr_retry_count_idle_only_and_3_bits() {
    let side = idle_side();
    let mut count = 0xff;
    // SAFETY: a live context; out-pointer to a local, or NULL on purpose.
    unsafe {
        assert_eq!(
            doca_rdma_set_rnr_retry_count(null_mut(), 1),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            doca_rdma_get_rnr_retry_count(null(), &mut count),
            DOCA_ERROR_INVALID_VALUE
        );
        assert_eq!(
            doca_rdma_get_rnr_retry_count(side.rdma, null_mut()),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_rdma_get_rnr_retry_count(side.rdma, &mut count));
        assert_eq!(count, 0, "never set: no retry (provider's choice)");
        assert_eq!(
            doca_rdma_set_rnr_retry_count(side.rdma, 8),
            DOCA_ERROR_INVALID_VALUE,
            "the InfiniBand field is 3 bits (stricter choice)"
        );
        ok(doca_rdma_set_rnr_retry_count(side.rdma, 7));
        ok(doca_rdma_get_rnr_retry_count(side.rdma, &mut count));
        assert_eq!(count, 7);
        side.start();
        assert_eq!(
            doca_rdma_set_rnr_retry_count(side.rdma, 3),
            DOCA_ERROR_BAD_STATE
        );
        ok(doca_rdma_get_rnr_retry_count(side.rdma, &mut count));
        assert_eq!(count, 7, "readable while running, unchanged");
    }
}

#[test]
fn buf_inventory_expand_grows_a_started_inventory() {
    let side = Side::new(Config::default());
    let mut inv = null_mut();
    // SAFETY: an inventory created here, over the side's live mmap.
    unsafe {
        assert_eq!(
            doca_buf_inventory_expand(null_mut(), 1),
            DOCA_ERROR_INVALID_VALUE
        );
        ok(doca_buf_inventory_create(1, &mut inv));
        assert_eq!(
            doca_buf_inventory_expand(inv, 1),
            DOCA_ERROR_BAD_STATE,
            "not started"
        );
        ok(doca_buf_inventory_start(inv));
        ok(get_buf(inv, &side, 0, 8));
        assert_eq!(get_buf(inv, &side, 8, 8), DOCA_ERROR_NO_MEMORY, "full");
        assert_eq!(
            doca_buf_inventory_expand(inv, 0),
            DOCA_ERROR_INVALID_VALUE,
            "nothing to add (stricter choice)"
        );
        assert_eq!(
            doca_buf_inventory_expand(inv, u32::MAX),
            DOCA_ERROR_INVALID_VALUE,
            "more elements than a uint32_t count (stricter choice)"
        );
        // Expanded while a buffer is out: the new elements serve the next retrievals.
        ok(doca_buf_inventory_expand(inv, 2));
        ok(get_buf(inv, &side, 8, 8));
        ok(get_buf(inv, &side, 16, 8));
        assert_eq!(get_buf(inv, &side, 24, 8), DOCA_ERROR_NO_MEMORY);
        ok(doca_buf_inventory_stop(inv));
        assert_eq!(doca_buf_inventory_expand(inv, 1), DOCA_ERROR_BAD_STATE);
    }
}

/// Allocates a write task of `side` (not submitted).
fn alloc_write(
    side: &Side,
    conn: *mut doca_rdma_connection,
    src: *mut doca_buf,
    dst: *mut doca_buf,
) -> *mut doca_task {
    let mut task = null_mut();
    // SAFETY: a live running context, connection and buffers; out-pointer to a local.
    unsafe {
        ok(doca_rdma_task_write_allocate_init(
            side.rdma, conn, src, dst, ND, &mut task,
        ));
        doca_rdma_task_write_as_task(task)
    }
}

/// Allocates a send task of `side` (not submitted).
fn alloc_send(side: &Side, conn: *mut doca_rdma_connection, src: *mut doca_buf) -> *mut doca_task {
    let mut task = null_mut();
    // SAFETY: a live running context, connection and buffer; out-pointer to a local.
    unsafe {
        ok(doca_rdma_task_send_allocate_init(
            side.rdma, conn, src, ND, &mut task,
        ));
        doca_rdma_task_send_as_task(task)
    }
}

/// Allocates a receive task of `side` (not submitted).
fn alloc_recv(side: &Side, dst: *mut doca_buf) -> *mut doca_task {
    let mut task = null_mut();
    // SAFETY: a live running context and buffer; out-pointer to a local.
    unsafe {
        ok(doca_rdma_task_receive_allocate_init(
            side.rdma, dst, ND, &mut task,
        ));
        doca_rdma_task_receive_as_task(task)
    }
}

#[test]
fn task_submit_ex_holds_tasks_until_a_flush() {
    let mut a = Side::new(Config::default());
    let b = Side::new(Config::default());
    let (aconn, _) = oob_pair(&a, &b);
    let remote = a.import_mmap(&b.export_mmap());
    a.write_bytes(0, &[1; 8]);
    a.write_bytes(8, &[2; 8]);
    let w1 = alloc_write(
        &a,
        aconn,
        a.buf(0, 8, 8),
        a.remote_buf(remote, b.addr(0), 64, 0),
    );
    let w2 = alloc_write(
        &a,
        aconn,
        a.buf(8, 8, 8),
        a.remote_buf(remote, b.addr(64), 64, 0),
    );
    let (e1, e2) = (Ev::Ok(w1 as usize), Ev::Ok(w2 as usize));
    // SAFETY: live tasks of a running context.
    unsafe {
        // Accepted (DOCA owns them) but not started: no data moves, nothing completes.
        ok(doca_task_submit_ex(w1, DOCA_TASK_SUBMIT_FLAG_NONE));
        ok(doca_task_submit_ex(
            w2,
            DOCA_TASK_SUBMIT_FLAG_OPTIMIZE_REPORTS,
        ));
        assert!(!a.progress(), "no completion before a flush");
        assert_eq!(b.bytes(0, 8), [0; 8], "no data moved before a flush");
        assert_eq!(
            doca_task_submit_ex(w1, DOCA_TASK_SUBMIT_FLAG_FLUSH),
            DOCA_ERROR_IN_USE,
            "an unflushed task is submitted"
        );
        assert!(violated("doca_task_submit_ex", w1 as usize));

        // The context-level flush starts them in submission order.
        doca_ctx_flush_tasks(a.ctx);
        assert_eq!(wait_events(&[&a], &a, 2), [e1.clone(), e2.clone()]);
        assert_eq!(b.bytes(0, 8), [1; 8]);
        assert_eq!(b.bytes(64, 8), [2; 8]);

        // A submit with FLUSH takes the earlier unflushed tasks along, before itself.
        ok(doca_task_submit_ex(w1, DOCA_TASK_SUBMIT_FLAG_NONE));
        assert!(!a.progress());
        ok(doca_task_submit_ex(
            w2,
            DOCA_TASK_SUBMIT_FLAG_FLUSH | DOCA_TASK_SUBMIT_FLAG_OPTIMIZE_REPORTS,
        ));
        assert_eq!(wait_events(&[&a], &a, 2), [e1.clone(), e2.clone()]);

        // doca_task_submit flushes as well (the default submit behaviour).
        ok(doca_task_submit_ex(w1, DOCA_TASK_SUBMIT_FLAG_NONE));
        ok(doca_task_submit(w2));
        assert_eq!(wait_events(&[&a], &a, 2), [e1, e2]);

        // Unknown flag bits: refused and recorded; the caller keeps the task.
        assert_eq!(doca_task_submit_ex(w1, 1 << 2), DOCA_ERROR_INVALID_VALUE);
        assert!(doca_sys::software::violations()
            .iter()
            .any(|v| v.starts_with("doca_task_submit_ex") && v.contains("unknown flag bits")));
        doca_ctx_flush_tasks(a.ctx);
        assert!(!a.progress(), "the refused task was not accepted");
        a.free(w1);
        assert!(!violated("doca_task_free", w1 as usize));
    }
}

#[test]
fn unflushed_tasks_end_with_their_connection_or_context() {
    let server = Side::new(Config::default());
    let client = Side::new(Config::default());
    let (cconn, sconn) = cm_pair(&server, &client, 18991);
    let posted = server.post_recv(server.buf(0, 64, 0));
    let send = alloc_send(&client, cconn, client.buf(0, 8, 8));
    // SAFETY: live tasks, connections and contexts.
    unsafe {
        ok(doca_task_submit_ex(send, DOCA_TASK_SUBMIT_FLAG_NONE));
        assert!(
            !client.progress() && !server.progress(),
            "the send waits for a flush"
        );

        // Disconnecting completes the unflushed send (once); a later flush finds nothing.
        ok(doca_rdma_connection_disconnect(cconn));
        assert_eq!(
            wait_events(&[&client], &client, 1),
            [Ev::Err(send as usize, DOCA_ERROR_CONNECTION_ABORTED)]
        );
        doca_ctx_flush_tasks(client.ctx);
        assert!(!client.progress(), "completed once");
        assert!(!violated("doca_ctx_flush_tasks", client.ctx as usize));
        assert_eq!(
            wait_events(&[&server], &server, 1),
            [Ev::Disconnect(sconn as usize)]
        );
        ok(doca_rdma_connection_disconnect(sconn));

        // Stopping completes an unflushed receive (once), with the posted one.
        let unflushed = alloc_recv(&server, server.buf(64, 64, 0));
        ok(doca_task_submit_ex(unflushed, DOCA_TASK_SUBMIT_FLAG_NONE));
        assert_eq!(doca_ctx_stop(server.ctx), DOCA_ERROR_IN_PROGRESS);
        server.progress();
        assert_eq!(
            server.take(),
            [
                Ev::Err(posted as usize, DOCA_ERROR_CONNECTION_ABORTED),
                Ev::Err(unflushed as usize, DOCA_ERROR_CONNECTION_ABORTED),
                Ev::State(DOCA_CTX_STATE_RUNNING, DOCA_CTX_STATE_STOPPING),
            ]
        );
        server.free(posted);
        server.free(unflushed);
        server.progress();
        assert_eq!(server.state(), DOCA_CTX_STATE_IDLE);
    }
}

#[test]
fn ctx_flush_tasks_needs_a_context_that_is_not_idle() {
    let running = Side::new(Config::default());
    let idle = idle_side();
    // SAFETY: live contexts, or NULL on purpose (recorded, nothing else happens).
    unsafe {
        doca_ctx_flush_tasks(running.ctx);
        assert!(!running.progress(), "nothing to flush");
        assert!(!violated("doca_ctx_flush_tasks", running.ctx as usize));
        doca_ctx_flush_tasks(idle.ctx);
        assert!(violated("doca_ctx_flush_tasks", idle.ctx as usize));
        doca_ctx_flush_tasks(null_mut());
        assert!(violated("doca_ctx_flush_tasks", 0));
    }
}
