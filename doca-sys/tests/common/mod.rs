//! Test harness over the raw DOCA functions: one "side" is a device, a progress engine, an
//! RDMA context, a registered memory region and a buffer inventory.
#![allow(dead_code, unreachable_pub, missing_docs)]

use doca_sys::*;
use std::ffi::c_void;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const MEM_WORDS: usize = 512; // 4 KiB, 8-aligned
pub const NUM_TASKS: u32 = 16;
pub const ALL_PERMS: u32 = DOCA_ACCESS_FLAG_LOCAL_READ_WRITE
    | DOCA_ACCESS_FLAG_RDMA_READ
    | DOCA_ACCESS_FLAG_RDMA_WRITE
    | DOCA_ACCESS_FLAG_RDMA_ATOMIC;

/// What the callbacks saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ev {
    State(u32, u32),
    Request(usize),
    Established(usize),
    Failure(usize),
    Disconnect(usize),
    Ok(usize),
    Err(usize, doca_error_t),
}

#[derive(Default)]
pub struct Rec {
    pub events: Mutex<Vec<Ev>>,
    /// (receive task, connection) read in each successful receive callback, where
    /// `doca_rdma_task_receive_get_result_rdma_connection` is defined.
    pub recv_conns: Mutex<Vec<(usize, usize)>>,
    /// Accept requests from the request callback (else reject).
    pub accept: bool,
}

impl Rec {
    fn push(&self, ev: Ev) {
        self.events.lock().unwrap().push(ev);
    }
}

/// # Safety
/// `ud` holds the `Rec` of a live `Side`.
unsafe fn rec<'a>(ud: doca_data) -> &'a Rec {
    // SAFETY: every context's user data is the address of its side's boxed `Rec`.
    unsafe { &*(ud.ptr as *const Rec) }
}

unsafe extern "C" fn state_cb(
    ud: doca_data,
    _ctx: *mut doca_ctx,
    prev: doca_ctx_states,
    next: doca_ctx_states,
) {
    // SAFETY: see `rec`.
    unsafe { rec(ud) }.push(Ev::State(prev, next));
}

unsafe extern "C" fn request_cb(conn: *mut doca_rdma_connection, ud: doca_data) {
    // SAFETY: see `rec`.
    let r = unsafe { rec(ud) };
    r.push(Ev::Request(conn as usize));
    // SAFETY: `conn` is the connection the callback is about.
    let status = unsafe {
        if r.accept {
            doca_rdma_connection_set_user_data(conn, doca_data { u64_: 7 });
            doca_rdma_connection_accept(conn, std::ptr::null_mut(), 0)
        } else {
            doca_rdma_connection_reject(conn)
        }
    };
    assert_eq!(status, DOCA_SUCCESS);
}

unsafe extern "C" fn established_cb(
    conn: *mut doca_rdma_connection,
    _cud: doca_data,
    ud: doca_data,
) {
    // SAFETY: see `rec`.
    unsafe { rec(ud) }.push(Ev::Established(conn as usize));
}

unsafe extern "C" fn failure_cb(conn: *mut doca_rdma_connection, _cud: doca_data, ud: doca_data) {
    // SAFETY: see `rec`.
    unsafe { rec(ud) }.push(Ev::Failure(conn as usize));
}

unsafe extern "C" fn disconnect_cb(
    conn: *mut doca_rdma_connection,
    _cud: doca_data,
    ud: doca_data,
) {
    // SAFETY: see `rec`.
    unsafe { rec(ud) }.push(Ev::Disconnect(conn as usize));
}

macro_rules! task_cbs {
    ($($task:ident, $as_task:ident, $ok:ident, $err:ident;)*) => {$(
        pub unsafe extern "C" fn $ok(task: *mut $task, _tud: doca_data, ud: doca_data) {
            // SAFETY: `task` is the completed task; see `rec` for the user data.
            unsafe { rec(ud).push(Ev::Ok($as_task(task) as usize)) };
        }
        pub unsafe extern "C" fn $err(task: *mut $task, _tud: doca_data, ud: doca_data) {
            // SAFETY: `task` is the completed task; see `rec` for the user data.
            unsafe {
                let t = $as_task(task);
                rec(ud).push(Ev::Err(t as usize, doca_task_get_status(t)));
            }
        }
    )*};
}

/// Successful receive: also records the connection the message arrived on.
pub unsafe extern "C" fn recv_ok(
    task: *mut doca_rdma_task_receive,
    _tud: doca_data,
    ud: doca_data,
) {
    // SAFETY: `task` is the completed receive, inside its successful completion callback;
    // see `rec` for the user data.
    unsafe {
        let r = rec(ud);
        let conn = doca_rdma_task_receive_get_result_rdma_connection(task);
        let t = doca_rdma_task_receive_as_task(task) as usize;
        r.recv_conns.lock().unwrap().push((t, conn as usize));
        r.push(Ev::Ok(t));
    }
}

/// Failed receive.
pub unsafe extern "C" fn recv_err(
    task: *mut doca_rdma_task_receive,
    _tud: doca_data,
    ud: doca_data,
) {
    // SAFETY: `task` is the completed task; see `rec` for the user data.
    unsafe {
        let t = doca_rdma_task_receive_as_task(task);
        rec(ud).push(Ev::Err(t as usize, doca_task_get_status(t)));
    }
}

task_cbs! {
    doca_rdma_task_send, doca_rdma_task_send_as_task, send_ok, send_err;
    doca_rdma_task_send_imm, doca_rdma_task_send_imm_as_task, send_imm_ok, send_imm_err;
    doca_rdma_task_read, doca_rdma_task_read_as_task, read_ok, read_err;
    doca_rdma_task_write, doca_rdma_task_write_as_task, write_ok, write_err;
    doca_rdma_task_write_imm, doca_rdma_task_write_imm_as_task, write_imm_ok, write_imm_err;
    doca_rdma_task_atomic_cmp_swp, doca_rdma_task_atomic_cmp_swp_as_task, cmp_swp_ok, cmp_swp_err;
    doca_rdma_task_atomic_fetch_add, doca_rdma_task_atomic_fetch_add_as_task, fetch_add_ok, fetch_add_err;
}

#[track_caller]
pub fn ok(status: doca_error_t) {
    assert_eq!(
        status,
        DOCA_SUCCESS,
        "expected DOCA_SUCCESS, got {}",
        name(status)
    );
}

pub fn name(status: doca_error_t) -> String {
    // SAFETY: returns a static C string for any code.
    unsafe { std::ffi::CStr::from_ptr(doca_error_get_name(status)) }
        .to_string_lossy()
        .into_owned()
}

pub struct Side {
    pub dev: *mut doca_dev,
    pub pe: *mut doca_pe,
    pub rdma: *mut doca_rdma,
    pub ctx: *mut doca_ctx,
    pub rec: Box<Rec>,
    pub mem: Vec<u64>,
    pub mmap: *mut doca_mmap,
    pub inv: *mut doca_buf_inventory,
}

pub struct Config {
    pub max_conns: u16,
    pub rdma_perms: u32,
    pub mmap_perms: u32,
    pub accept: bool,
    pub start: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            max_conns: 4,
            rdma_perms: ALL_PERMS,
            mmap_perms: ALL_PERMS,
            accept: true,
            start: true,
        }
    }
}

pub fn open_dev() -> *mut doca_dev {
    let mut list: *mut *mut doca_devinfo = std::ptr::null_mut();
    let mut n = 0u32;
    let mut dev = std::ptr::null_mut();
    // SAFETY: out-pointers to locals; the list is destroyed after opening its first entry.
    unsafe {
        ok(doca_devinfo_create_list(&mut list, &mut n));
        assert!(n >= 1);
        ok(doca_dev_open(*list, &mut dev));
        ok(doca_devinfo_destroy_list(list));
    }
    dev
}

impl Side {
    pub fn new(cfg: Config) -> Box<Side> {
        let mut side = Box::new(Side {
            dev: open_dev(),
            pe: std::ptr::null_mut(),
            rdma: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
            rec: Box::new(Rec {
                accept: cfg.accept,
                ..Rec::default()
            }),
            mem: vec![0u64; MEM_WORDS],
            mmap: std::ptr::null_mut(),
            inv: std::ptr::null_mut(),
        });
        let ud = doca_data {
            ptr: (&*side.rec as *const Rec).cast_mut().cast(),
        };
        // SAFETY: every handle is created here before use; out-pointers are fields of `side`;
        // the registered memory is `side.mem`, which outlives the mmap (dropped in `Drop`).
        unsafe {
            ok(doca_pe_create(&mut side.pe));
            ok(doca_rdma_create(side.dev, &mut side.rdma));
            side.ctx = doca_rdma_as_ctx(side.rdma);
            ok(doca_rdma_set_permissions(side.rdma, cfg.rdma_perms));
            ok(doca_rdma_set_max_num_connections(side.rdma, cfg.max_conns));
            ok(doca_rdma_set_gid_index(side.rdma, 0));
            ok(doca_rdma_set_transport_type(
                side.rdma,
                DOCA_RDMA_TRANSPORT_TYPE_RC,
            ));
            ok(doca_rdma_task_receive_set_conf(
                side.rdma,
                Some(recv_ok),
                Some(recv_err),
                NUM_TASKS,
            ));
            ok(doca_rdma_task_send_set_conf(
                side.rdma,
                Some(send_ok),
                Some(send_err),
                NUM_TASKS,
            ));
            ok(doca_rdma_task_send_imm_set_conf(
                side.rdma,
                Some(send_imm_ok),
                Some(send_imm_err),
                NUM_TASKS,
            ));
            ok(doca_rdma_task_read_set_conf(
                side.rdma,
                Some(read_ok),
                Some(read_err),
                NUM_TASKS,
            ));
            ok(doca_rdma_task_write_set_conf(
                side.rdma,
                Some(write_ok),
                Some(write_err),
                NUM_TASKS,
            ));
            ok(doca_rdma_task_write_imm_set_conf(
                side.rdma,
                Some(write_imm_ok),
                Some(write_imm_err),
                NUM_TASKS,
            ));
            ok(doca_rdma_task_atomic_cmp_swp_set_conf(
                side.rdma,
                Some(cmp_swp_ok),
                Some(cmp_swp_err),
                NUM_TASKS,
            ));
            ok(doca_rdma_task_atomic_fetch_add_set_conf(
                side.rdma,
                Some(fetch_add_ok),
                Some(fetch_add_err),
                NUM_TASKS,
            ));
            ok(doca_ctx_set_state_changed_cb(side.ctx, Some(state_cb)));
            ok(doca_ctx_set_user_data(side.ctx, ud));
            ok(doca_rdma_set_connection_state_callbacks(
                side.rdma,
                Some(request_cb),
                Some(established_cb),
                Some(failure_cb),
                Some(disconnect_cb),
            ));
            ok(doca_pe_connect_ctx(side.pe, side.ctx));

            ok(doca_mmap_create(&mut side.mmap));
            ok(doca_mmap_set_memrange(
                side.mmap,
                side.mem.as_mut_ptr().cast(),
                MEM_WORDS * 8,
            ));
            ok(doca_mmap_set_permissions(side.mmap, cfg.mmap_perms));
            ok(doca_mmap_add_dev(side.mmap, side.dev));
            ok(doca_mmap_start(side.mmap));
            ok(doca_buf_inventory_create(64, &mut side.inv));
            ok(doca_buf_inventory_start(side.inv));
        }
        if cfg.start {
            side.start();
        }
        side
    }

    pub fn start(&self) {
        // SAFETY: live context with a progress engine.
        let status = unsafe { doca_ctx_start(self.ctx) };
        // DOCA documents both results; an RDMA context starts asynchronously (IN_PROGRESS).
        assert!(
            status == DOCA_SUCCESS || status == DOCA_ERROR_IN_PROGRESS,
            "doca_ctx_start: {}",
            name(status)
        );
        let deadline = Instant::now() + BOUND;
        while self.state() != DOCA_CTX_STATE_RUNNING {
            assert!(Instant::now() < deadline, "context did not start");
            self.progress();
        }
        assert_eq!(
            self.take(),
            vec![
                Ev::State(DOCA_CTX_STATE_IDLE, DOCA_CTX_STATE_STARTING),
                Ev::State(DOCA_CTX_STATE_STARTING, DOCA_CTX_STATE_RUNNING)
            ]
        );
    }

    pub fn state(&self) -> doca_ctx_states {
        let mut state = 0;
        // SAFETY: live context, out-pointer to a local.
        unsafe { ok(doca_ctx_get_state(self.ctx, &mut state)) };
        state
    }

    /// Progresses until nothing happens; returns whether anything did.
    pub fn progress(&self) -> bool {
        let mut any = false;
        // SAFETY: live progress engine, not called from a callback.
        while unsafe { doca_pe_progress(self.pe) } != 0 {
            any = true;
        }
        any
    }

    pub fn take(&self) -> Vec<Ev> {
        std::mem::take(&mut *self.rec.events.lock().unwrap())
    }

    pub fn addr(&self, byte_offset: usize) -> *mut c_void {
        // SAFETY: offsets used by tests stay inside `mem`.
        unsafe {
            self.mem
                .as_ptr()
                .cast::<u8>()
                .add(byte_offset)
                .cast_mut()
                .cast()
        }
    }

    /// A buffer over `[off, off + len)` of this side's memory with `data_len` bytes of data.
    pub fn buf(&self, off: usize, len: usize, data_len: usize) -> *mut doca_buf {
        let mut buf = std::ptr::null_mut();
        // SAFETY: live inventory and mmap; the range is inside the registered memory.
        unsafe {
            ok(doca_buf_inventory_buf_get_by_args(
                self.inv,
                self.mmap,
                self.addr(off),
                len,
                self.addr(off),
                data_len,
                &mut buf,
            ))
        };
        buf
    }

    pub fn bytes(&self, off: usize, len: usize) -> &[u8] {
        // SAFETY: inside `mem`; the provider writes it only inside `doca_*` calls.
        unsafe { std::slice::from_raw_parts(self.addr(off).cast::<u8>(), len) }
    }

    pub fn write_bytes(&mut self, off: usize, data: &[u8]) {
        // SAFETY: inside `mem`, exclusively borrowed.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.addr(off).cast::<u8>(), data.len())
        };
    }

    pub fn listen(&self, port: u16) {
        // SAFETY: live, running context.
        unsafe { ok(doca_rdma_start_listen_to_port(self.rdma, port)) };
    }

    /// Starts a CM connection to `port`.
    pub fn connect(&self, port: u16) {
        let mut addr = std::ptr::null_mut();
        // SAFETY: static C string, out-pointer to a local; the address stays alive (leaked).
        unsafe {
            ok(doca_rdma_addr_create(
                DOCA_RDMA_ADDR_TYPE_IPv4,
                c"127.0.0.1".as_ptr(),
                port,
                &mut addr,
            ));
            ok(doca_rdma_connect_to_addr(
                self.rdma,
                addr,
                doca_data { u64_: 9 },
            ));
        }
    }

    /// Exports this side's memory; returns the blob.
    pub fn export_mmap(&self) -> Vec<u8> {
        let mut blob = std::ptr::null();
        let mut len = 0;
        // SAFETY: live started mmap; the blob is copied before any other call.
        unsafe {
            ok(doca_mmap_export_rdma(
                self.mmap, self.dev, &mut blob, &mut len,
            ));
            std::slice::from_raw_parts(blob.cast::<u8>(), len).to_vec()
        }
    }

    /// Imports a peer's export; returns the remote mmap.
    pub fn import_mmap(&self, blob: &[u8]) -> *mut doca_mmap {
        let mut mmap = std::ptr::null_mut();
        // SAFETY: the blob is readable; out-pointer to a local.
        unsafe {
            ok(doca_mmap_create_from_export(
                std::ptr::null(),
                blob.as_ptr().cast(),
                blob.len(),
                self.dev,
                &mut mmap,
            ))
        };
        mmap
    }

    /// A buffer of this side's inventory over remote memory `[addr, addr + len)`.
    pub fn remote_buf(
        &self,
        mmap: *mut doca_mmap,
        addr: *mut c_void,
        len: usize,
        data_len: usize,
    ) -> *mut doca_buf {
        let mut buf = std::ptr::null_mut();
        // SAFETY: live inventory and imported mmap; the range is inside it.
        unsafe {
            ok(doca_buf_inventory_buf_get_by_args(
                self.inv, mmap, addr, len, addr, data_len, &mut buf,
            ))
        };
        buf
    }

    pub fn post_recv(&self, buf: *mut doca_buf) -> *mut doca_task {
        let mut task = std::ptr::null_mut();
        // SAFETY: live running context and buffer; out-pointer to a local.
        unsafe {
            ok(doca_rdma_task_receive_allocate_init(
                self.rdma,
                buf,
                doca_data { u64_: 1 },
                &mut task,
            ));
            let t = doca_rdma_task_receive_as_task(task);
            ok(doca_task_submit(t));
            t
        }
    }

    pub fn send(&self, conn: *mut doca_rdma_connection, buf: *mut doca_buf) -> *mut doca_task {
        let mut task = std::ptr::null_mut();
        // SAFETY: live running context, connection and buffer; out-pointer to a local.
        unsafe {
            ok(doca_rdma_task_send_allocate_init(
                self.rdma,
                conn,
                buf,
                doca_data { u64_: 2 },
                &mut task,
            ));
            let t = doca_rdma_task_send_as_task(task);
            ok(doca_task_submit(t));
            t
        }
    }

    pub fn write(
        &self,
        conn: *mut doca_rdma_connection,
        src: *mut doca_buf,
        dst: *mut doca_buf,
    ) -> *mut doca_task {
        let mut task = std::ptr::null_mut();
        // SAFETY: live running context, connection and buffers; out-pointer to a local.
        unsafe {
            ok(doca_rdma_task_write_allocate_init(
                self.rdma,
                conn,
                src,
                dst,
                doca_data { u64_: 3 },
                &mut task,
            ));
            let t = doca_rdma_task_write_as_task(task);
            ok(doca_task_submit(t));
            t
        }
    }

    pub fn free(&self, task: *mut doca_task) {
        // SAFETY: a completed task of this side.
        unsafe { doca_task_free(task) };
    }
}

/// How long a wait for a condition may take before the test fails: a bound on failure only,
/// generous so that a loaded machine never reaches it (nothing is timed by it).
pub const BOUND: Duration = Duration::from_secs(60);

/// Progresses all sides until `done` (the test fails after [`BOUND`]).
#[track_caller]
pub fn pump(sides: &[&Side], mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + BOUND;
    loop {
        for s in sides {
            s.progress();
        }
        if done() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for a condition"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Connects `client` to `server` (listening on `port`); returns (client conn, server conn).
pub fn cm_pair(
    server: &Side,
    client: &Side,
    port: u16,
) -> (*mut doca_rdma_connection, *mut doca_rdma_connection) {
    server.listen(port);
    client.connect(port);
    let (mut c, mut s) = (0usize, 0usize);
    let mut sev = Vec::new();
    pump(&[server, client], || {
        for e in client.take() {
            if let Ev::Established(x) = e {
                c = x;
            }
        }
        for e in server.take() {
            if let Ev::Established(x) = e {
                s = x;
            }
            sev.push(e);
        }
        c != 0 && s != 0
    });
    (c as *mut _, s as *mut _)
}

/// Count of events equal to `ev`.
pub fn count(events: &[Ev], ev: &Ev) -> usize {
    events.iter().filter(|e| *e == ev).count()
}

/// Out of band: `doca_rdma_export` on `side`; returns (status, connection, blob copy).
pub fn export_conn(side: &Side) -> (doca_error_t, *mut doca_rdma_connection, Vec<u8>) {
    let (mut p, mut n, mut c) = (std::ptr::null(), 0, std::ptr::null_mut());
    // SAFETY: live context; out-pointers to locals; the blob is copied at once.
    unsafe {
        let status = doca_rdma_export(side.rdma, &mut p, &mut n, &mut c);
        let blob = if status == DOCA_SUCCESS {
            std::slice::from_raw_parts(p.cast::<u8>(), n).to_vec()
        } else {
            Vec::new()
        };
        (status, c, blob)
    }
}

/// Out of band: `doca_rdma_connect` of `side`'s `conn` to the peer's `blob`.
pub fn oob_connect(side: &Side, conn: *mut doca_rdma_connection, blob: &[u8]) -> doca_error_t {
    // SAFETY: live context and connection; the blob is readable.
    unsafe { doca_rdma_connect(side.rdma, blob.as_ptr().cast(), blob.len(), conn) }
}

/// Connects `a` and `b` out of band; returns (a's connection, b's connection).
pub fn oob_pair(a: &Side, b: &Side) -> (*mut doca_rdma_connection, *mut doca_rdma_connection) {
    let (st, aconn, ablob) = export_conn(a);
    ok(st);
    let (st, bconn, bblob) = export_conn(b);
    ok(st);
    ok(oob_connect(a, aconn, &bblob));
    ok(oob_connect(b, bconn, &ablob));
    (aconn, bconn)
}

/// Whether a contract violation naming `function` and the object `handle` was recorded.
pub fn violated(function: &str, handle: usize) -> bool {
    let handle = format!("{handle:#x}");
    doca_sys::software::violations()
        .iter()
        .any(|v| v.starts_with(function) && v.contains(&handle))
}

/// The device list entry `i` (the list itself is leaked: its entries are static).
pub fn devinfo(i: usize) -> *mut doca_devinfo {
    let mut list: *mut *mut doca_devinfo = std::ptr::null_mut();
    let mut n = 0u32;
    // SAFETY: out-pointers to locals; `i` is checked against the count.
    unsafe {
        ok(doca_devinfo_create_list(&mut list, &mut n));
        assert!(i < n as usize);
        *list.add(i)
    }
}

/// Waits (progressing `sides`) until `side` recorded `n` events; returns them.
#[track_caller]
pub fn wait_events(sides: &[&Side], side: &Side, n: usize) -> Vec<Ev> {
    pump(sides, || side.rec.events.lock().unwrap().len() >= n);
    side.take()
}
