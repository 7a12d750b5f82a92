//! Safe wrappers over the raw `doca-sys` handles: devices, memory maps, buffer inventories
//! and buffers, progress engines and RDMA contexts.
//!
//! Each wrapper owns one raw pointer and destroys it in `Drop`; a child holds an `Arc` of its
//! parent (an mmap holds its device, a context its device and progress engine), so drop order
//! is right by construction. Destruction failures are logged and the handle leaked: `Drop`
//! never panics.

use std::cell::Cell;
use std::ffi::{c_void, CStr};
use std::fmt;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use doca_sys as sys;

use crate::error::{Error, Result};

/// The name DOCA gives an error code.
pub(super) fn error_name(code: sys::doca_error_t) -> String {
    // SAFETY: `doca_error_get_name` returns a static NUL-terminated string (or null for codes
    // it does not know, handled below).
    let name = unsafe { sys::doca_error_get_name(code) };
    if name.is_null() {
        return format!("DOCA_ERROR_{code}");
    }
    // SAFETY: non-null, static and NUL-terminated per DOCA's contract.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

/// `Err(Error::Doca)` unless `code` is `DOCA_SUCCESS`.
pub(super) fn check(call: &'static str, code: sys::doca_error_t) -> Result<()> {
    if code == sys::DOCA_SUCCESS {
        Ok(())
    } else {
        Err(doca_error(call, code))
    }
}

pub(super) fn doca_error(call: &'static str, code: sys::doca_error_t) -> Error {
    Error::Doca {
        call,
        name: error_name(code),
        code: code as i32,
    }
}

/// What [`list_devices`](super::list_devices) reports about one device.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceInfo {
    /// InfiniBand device name (`mlx5_0`).
    pub name: String,
    /// PCI address (`0000:03:00.0`).
    pub pci_addr: String,
    /// Which RDMA task types the device supports.
    pub capabilities: Capabilities,
    /// Largest message (send, write, read) the device moves in one task.
    pub max_message_size: u32,
    /// Deepest send queue of one connection (`doca_rdma_cap_get_max_send_queue_size`).
    pub max_send_queue_size: u32,
    /// Deepest receive queue (`doca_rdma_cap_get_max_recv_queue_size`).
    pub max_recv_queue_size: u32,
}

/// RDMA task types a device supports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Receive, send and send with immediate.
    pub send_recv: bool,
    /// Write and write with immediate.
    pub write: bool,
    /// Read.
    pub read: bool,
    /// Compare-and-swap and fetch-and-add.
    pub atomics: bool,
}

impl Capabilities {
    fn all(self) -> bool {
        self.send_recv && self.write && self.read && self.atomics
    }
}

/// The device list of `doca_devinfo_create_list`, destroyed on drop.
struct DevInfoList {
    list: *mut *mut sys::doca_devinfo,
    len: usize,
}

impl DevInfoList {
    fn new() -> Result<DevInfoList> {
        let mut list = ptr::null_mut();
        let mut n = 0u32;
        // SAFETY: both out-pointers are valid locals.
        check("doca_devinfo_create_list", unsafe {
            sys::doca_devinfo_create_list(&mut list, &mut n)
        })?;
        Ok(DevInfoList {
            list,
            len: n as usize,
        })
    }

    fn get(&self, i: usize) -> *mut sys::doca_devinfo {
        assert!(i < self.len);
        // SAFETY: the list holds `len` entries and lives until `self` is dropped.
        unsafe { *self.list.add(i) }
    }
}

impl Drop for DevInfoList {
    fn drop(&mut self) {
        // SAFETY: created by `doca_devinfo_create_list`, destroyed once; devices opened from
        // its entries stay valid (DOCA keeps opened devices independent of the list).
        let code = unsafe { sys::doca_devinfo_destroy_list(self.list) };
        if let Err(e) = check("doca_devinfo_destroy_list", code) {
            tracing::warn!(error = %e, "leaking the DOCA device list");
        }
    }
}

fn describe(info: *const sys::doca_devinfo) -> Result<DeviceInfo> {
    let mut name = [0 as std::ffi::c_char; 64];
    // SAFETY: `info` is a live devinfo; the buffer has the documented 64 bytes.
    check("doca_devinfo_get_ibdev_name", unsafe {
        sys::doca_devinfo_get_ibdev_name(info, name.as_mut_ptr(), name.len() as u32)
    })?;
    let mut pci = [0 as std::ffi::c_char; 13];
    // SAFETY: `info` is a live devinfo; the buffer has the documented 13 bytes.
    check("doca_devinfo_get_pci_addr_str", unsafe {
        sys::doca_devinfo_get_pci_addr_str(info, pci.as_mut_ptr())
    })?;
    let supported = |f: unsafe extern "C" fn(*const sys::doca_devinfo) -> sys::doca_error_t| {
        // SAFETY: `info` is a live devinfo.
        unsafe { f(info) == sys::DOCA_SUCCESS }
    };
    let capabilities = Capabilities {
        send_recv: supported(sys::doca_rdma_cap_task_receive_is_supported)
            && supported(sys::doca_rdma_cap_task_send_is_supported)
            && supported(sys::doca_rdma_cap_task_send_imm_is_supported),
        write: supported(sys::doca_rdma_cap_task_write_is_supported)
            && supported(sys::doca_rdma_cap_task_write_imm_is_supported),
        read: supported(sys::doca_rdma_cap_task_read_is_supported),
        atomics: supported(sys::doca_rdma_cap_task_atomic_cmp_swp_is_supported)
            && supported(sys::doca_rdma_cap_task_atomic_fetch_add_is_supported),
    };
    let query =
        |call, f: unsafe extern "C" fn(*const sys::doca_devinfo, *mut u32) -> sys::doca_error_t| {
            let mut value = 0u32;
            // SAFETY: `info` is a live devinfo; the out-pointer is a valid local.
            check(call, unsafe { f(info, &mut value) }).map(|()| value)
        };
    let max_message_size = query(
        "doca_rdma_cap_get_max_message_size",
        sys::doca_rdma_cap_get_max_message_size,
    )?;
    let max_send_queue_size = query(
        "doca_rdma_cap_get_max_send_queue_size",
        sys::doca_rdma_cap_get_max_send_queue_size,
    )?;
    let max_recv_queue_size = query(
        "doca_rdma_cap_get_max_recv_queue_size",
        sys::doca_rdma_cap_get_max_recv_queue_size,
    )?;
    let text = |b: &[std::ffi::c_char]| {
        // SAFETY: DOCA NUL-terminates both strings within the buffers.
        unsafe { CStr::from_ptr(b.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    };
    Ok(DeviceInfo {
        name: text(&name),
        pci_addr: text(&pci),
        capabilities,
        max_message_size,
        max_send_queue_size,
        max_recv_queue_size,
    })
}

/// The devices of the list whose capabilities could be read, with their list index. A device
/// whose query fails (DOCA documents `DOCA_ERROR_DRIVER` for that) is skipped, not fatal: a
/// host may have functions this transport cannot use next to ones it can.
fn usable(list: &DevInfoList) -> Vec<(usize, DeviceInfo)> {
    (0..list.len)
        .filter_map(|i| match describe(list.get(i)) {
            Ok(info) => Some((i, info)),
            Err(e) => {
                tracing::debug!(index = i, error = %e, "skipping a DOCA device");
                None
            }
        })
        .collect()
}

/// Every DOCA device whose capabilities could be read.
pub(super) fn list_devices() -> Result<Vec<DeviceInfo>> {
    let list = DevInfoList::new()?;
    Ok(usable(&list).into_iter().map(|(_, info)| info).collect())
}

/// An open device (`doca_dev`).
pub(super) struct Device {
    raw: NonNull<sys::doca_dev>,
    info: DeviceInfo,
}

// SAFETY: a `doca_dev` is a handle to an opened device with no thread affinity; DOCA allows
// using it (adding it to mmaps, creating contexts) from any thread.
unsafe impl Send for Device {}
// SAFETY: shared use only passes the pointer to DOCA calls that take it as input and do not
// mutate the device object (mmap add_dev, export, context creation).
unsafe impl Sync for Device {}

impl Device {
    /// Opens the device whose IB name or PCI address is `selector`, or the first device with
    /// every RDMA capability when `selector` is `None`.
    pub(super) fn open(selector: Option<&str>) -> Result<Arc<Device>> {
        let list = DevInfoList::new()?;
        let mut seen = Vec::new();
        for (i, info) in usable(&list) {
            let wanted = match selector {
                Some(s) => info.name == s || info.pci_addr.eq_ignore_ascii_case(s),
                None => info.capabilities.all(),
            };
            if !wanted {
                seen.push(info.name);
                continue;
            }
            if !info.capabilities.all() {
                return Err(Error::InvalidArgument(format!(
                    "DOCA device {} lacks RDMA capabilities this transport needs: {:?}",
                    info.name, info.capabilities
                )));
            }
            let mut raw = ptr::null_mut();
            // SAFETY: the devinfo is a live entry of the list; `raw` is a valid out-pointer.
            check("doca_dev_open", unsafe {
                sys::doca_dev_open(list.get(i), &mut raw)
            })?;
            let raw = NonNull::new(raw).ok_or_else(|| doca_error("doca_dev_open", 1))?;
            return Ok(Arc::new(Device { raw, info }));
        }
        Err(Error::InvalidArgument(match selector {
            Some(s) => format!("no DOCA device named {s} (found: {seen:?})"),
            None => "no DOCA device with RDMA support found".into(),
        }))
    }

    pub(super) fn raw(&self) -> *mut sys::doca_dev {
        self.raw.as_ptr()
    }

    pub(super) fn info(&self) -> &DeviceInfo {
        &self.info
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: opened in `open`, closed once; every child (mmap, context) holds an `Arc`
        // of this device and is gone by now.
        let code = unsafe { sys::doca_dev_close(self.raw()) };
        if let Err(e) = check("doca_dev_close", code) {
            tracing::warn!(error = %e, device = %self.info.name, "leaking a DOCA device");
        }
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device").field("info", &self.info).finish()
    }
}

/// A memory map: local (over registered memory, exportable) or imported from a peer's export.
pub(super) struct Mmap {
    raw: NonNull<sys::doca_mmap>,
    /// Exported blob of a local mmap with remote rights (empty otherwise).
    export: bytes::Bytes,
    // Declared last: the device outlives the mmap.
    _dev: Arc<Device>,
}

// SAFETY: an mmap is immutable after start; DOCA allows taking buffers from a started mmap and
// exporting it from any thread. Destruction happens once, in `Drop`.
unsafe impl Send for Mmap {}
// SAFETY: see `Send`: shared use only passes the started mmap to DOCA as an input.
unsafe impl Sync for Mmap {}

impl Mmap {
    /// Registers `[addr, addr + len)` with `access` (DOCA access flags) and exports it when
    /// it grants remote rights.
    ///
    /// # Safety
    /// The memory stays allocated for the mmap's whole life.
    pub(super) unsafe fn local(
        dev: &Arc<Device>,
        addr: *mut u8,
        len: usize,
        access: u32,
    ) -> Result<Mmap> {
        // Remote write or atomic access without local write is an invalid combination
        // (`doca_mmap_set_permissions`, as `ibv_reg_mr`): grant local write with them.
        let access =
            if access & (sys::DOCA_ACCESS_FLAG_RDMA_WRITE | sys::DOCA_ACCESS_FLAG_RDMA_ATOMIC) != 0
            {
                access | sys::DOCA_ACCESS_FLAG_LOCAL_READ_WRITE
            } else {
                access
            };
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        check("doca_mmap_create", unsafe {
            sys::doca_mmap_create(&mut raw)
        })?;
        let raw = NonNull::new(raw).ok_or_else(|| doca_error("doca_mmap_create", 1))?;
        let mut mmap = Mmap {
            raw,
            export: bytes::Bytes::new(),
            _dev: dev.clone(),
        };
        let m = mmap.raw.as_ptr();
        // SAFETY: `m` is a new, stopped mmap; the range is valid memory per the caller.
        unsafe {
            check(
                "doca_mmap_set_memrange",
                sys::doca_mmap_set_memrange(m, addr.cast::<c_void>(), len),
            )?;
            check(
                "doca_mmap_set_permissions",
                sys::doca_mmap_set_permissions(m, access),
            )?;
            check("doca_mmap_add_dev", sys::doca_mmap_add_dev(m, dev.raw()))?;
            check("doca_mmap_start", sys::doca_mmap_start(m))?;
        }
        let remote = sys::DOCA_ACCESS_FLAG_RDMA_READ
            | sys::DOCA_ACCESS_FLAG_RDMA_WRITE
            | sys::DOCA_ACCESS_FLAG_RDMA_ATOMIC;
        if access & remote != 0 {
            let mut blob = ptr::null();
            let mut blob_len = 0usize;
            // SAFETY: started mmap with the device added and remote rights; out-pointers are
            // valid locals. The blob is owned by the mmap: copied at once.
            check("doca_mmap_export_rdma", unsafe {
                sys::doca_mmap_export_rdma(m, dev.raw(), &mut blob, &mut blob_len)
            })?;
            // SAFETY: DOCA returned `blob_len` readable bytes at `blob`.
            let bytes = unsafe { std::slice::from_raw_parts(blob.cast::<u8>(), blob_len) };
            mmap.export = bytes::Bytes::copy_from_slice(bytes);
        }
        Ok(mmap)
    }

    /// Imports a peer's export.
    pub(super) fn import(dev: &Arc<Device>, blob: &[u8]) -> Result<Mmap> {
        let mut raw = ptr::null_mut();
        // SAFETY: `blob` is readable for its length; `raw` is a valid out-pointer.
        check("doca_mmap_create_from_export", unsafe {
            sys::doca_mmap_create_from_export(
                ptr::null(),
                blob.as_ptr().cast(),
                blob.len(),
                dev.raw(),
                &mut raw,
            )
        })?;
        let raw = NonNull::new(raw).ok_or_else(|| doca_error("doca_mmap_create_from_export", 1))?;
        Ok(Mmap {
            raw,
            export: bytes::Bytes::new(),
            _dev: dev.clone(),
        })
    }

    pub(super) fn raw(&self) -> *mut sys::doca_mmap {
        self.raw.as_ptr()
    }

    pub(super) fn export(&self) -> &bytes::Bytes {
        &self.export
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: created in `local`/`import`, destroyed once. Buffers taken from it hold an
        // `Arc` of it (see `Buf`), so none is outstanding.
        let code = unsafe { sys::doca_mmap_destroy(self.raw()) };
        if let Err(e) = check("doca_mmap_destroy", code) {
            tracing::warn!(error = %e, "leaking a DOCA mmap");
        }
    }
}

impl fmt::Debug for Mmap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mmap")
            .field("exported", &!self.export.is_empty())
            .finish()
    }
}

/// A buffer inventory that grows on demand (`doca_buf_inventory_expand`): it starts small
/// and doubles when it runs out, up to its maximum, instead of holding the worst case from
/// the start.
pub(super) struct Inventory {
    raw: NonNull<sys::doca_buf_inventory>,
    /// Elements so far, and the most it may grow to.
    elements: std::cell::Cell<usize>,
    max: usize,
}

// SAFETY: an inventory is used only by the progress owner of its context (one thread at a
// time); moving it between threads is allowed by DOCA.
unsafe impl Send for Inventory {}

impl Inventory {
    /// An inventory of `initial` buffers that may grow to `max`.
    pub(super) fn new(initial: usize, max: usize) -> Result<Inventory> {
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        check("doca_buf_inventory_create", unsafe {
            sys::doca_buf_inventory_create(initial, &mut raw)
        })?;
        let raw = NonNull::new(raw).ok_or_else(|| doca_error("doca_buf_inventory_create", 1))?;
        let inv = Inventory {
            raw,
            elements: std::cell::Cell::new(initial),
            max: max.max(initial),
        };
        // SAFETY: a new inventory.
        check("doca_buf_inventory_start", unsafe {
            sys::doca_buf_inventory_start(inv.raw.as_ptr())
        })?;
        Ok(inv)
    }

    /// Doubles the inventory, within its maximum; whether it grew.
    fn expand(&self) -> bool {
        let now = self.elements.get();
        let add = now.min(self.max - now).min(u32::MAX as usize);
        if add == 0 {
            return false;
        }
        // SAFETY: a started inventory of this owner.
        let code = unsafe { sys::doca_buf_inventory_expand(self.raw.as_ptr(), add as u32) };
        if code != sys::DOCA_SUCCESS {
            tracing::debug!(error = %error_name(code), "doca_buf_inventory_expand");
            return false;
        }
        self.elements.set(now + add);
        true
    }

    /// A buffer over `[addr, addr + len)` of `mmap` whose data section is
    /// `[data, data + data_len)`. An inventory with every buffer out grows (doubling, up to
    /// its maximum) before it answers `NO_MEMORY`.
    ///
    /// # Safety
    /// The memory must stay valid and not be accessed by anything else while DOCA uses the
    /// buffer (the caller keeps the owning `RegisteredBuf` or window alive).
    pub(super) unsafe fn buf(
        &self,
        mmap: &Arc<Mmap>,
        addr: u64,
        len: usize,
        data_len: usize,
    ) -> Result<Buf> {
        let p = addr as usize as *mut c_void;
        loop {
            let mut raw = ptr::null_mut();
            // SAFETY: live inventory and mmap; the range is checked by DOCA against the mmap.
            let code = unsafe {
                sys::doca_buf_inventory_buf_get_by_args(
                    self.raw.as_ptr(),
                    mmap.raw(),
                    p,
                    len,
                    p,
                    data_len,
                    &mut raw,
                )
            };
            if code == sys::DOCA_ERROR_NO_MEMORY && self.expand() {
                continue;
            }
            check("doca_buf_inventory_buf_get_by_args", code)?;
            let raw = NonNull::new(raw)
                .ok_or_else(|| doca_error("doca_buf_inventory_buf_get_by_args", 1))?;
            return Ok(Buf {
                raw,
                _mmap: mmap.clone(),
            });
        }
    }
}

impl Drop for Inventory {
    fn drop(&mut self) {
        let inv = self.raw.as_ptr();
        // SAFETY: created in `new`; every `Buf` was released before the owner drops the
        // inventory (they live in operations that completed).
        let code = unsafe { sys::doca_buf_inventory_stop(inv) };
        let code = if code == sys::DOCA_SUCCESS {
            // SAFETY: stopped above, destroyed once.
            unsafe { sys::doca_buf_inventory_destroy(inv) }
        } else {
            code
        };
        if let Err(e) = check("doca_buf_inventory_destroy", code) {
            tracing::warn!(error = %e, "leaking a DOCA buffer inventory");
        }
    }
}

/// One `doca_buf`, released (refcount decremented) on drop. Holds its mmap alive.
pub(super) struct Buf {
    raw: NonNull<sys::doca_buf>,
    _mmap: Arc<Mmap>,
}

// SAFETY: a buffer is only used by the progress owner of one context (one thread at a time).
unsafe impl Send for Buf {}

impl Buf {
    pub(super) fn raw(&self) -> *mut sys::doca_buf {
        self.raw.as_ptr()
    }

    /// Empties the data section (for reposting a receive).
    pub(super) fn reset(&self) {
        // SAFETY: a live buffer not in use by a task (the caller only resets idle receives).
        let code = unsafe { sys::doca_buf_reset_data_len(self.raw()) };
        if let Err(e) = check("doca_buf_reset_data_len", code) {
            tracing::warn!(error = %e, "could not reset a DOCA buffer");
        }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: taken from an inventory in `Inventory::buf`, released once, after the task
        // that used it completed.
        let code = unsafe { sys::doca_buf_dec_refcount(self.raw(), ptr::null_mut()) };
        if let Err(e) = check("doca_buf_dec_refcount", code) {
            tracing::warn!(error = %e, "leaking a DOCA buffer");
        }
    }
}

/// A progress engine (`doca_pe`), destroyed when its last `Arc` goes: the contexts connected
/// to it hold one (so it outlives them), and so does its [`PeDriver`].
///
/// A shared `Pe` gives access to nothing that drives the engine: every DOCA call on it goes
/// through its one [`PeDriver`]. An engine may be used from any thread, but from one at a time,
/// and never from its own callbacks.
pub(super) struct Pe {
    raw: NonNull<sys::doca_pe>,
}

// SAFETY: a `doca_pe` has no thread affinity: it may be created on one thread, driven from
// another (one at a time, which `PeDriver` ensures) and destroyed on a third (in `Drop`, with
// exclusive access).
unsafe impl Send for Pe {}
// SAFETY: `Pe` has no method: outside this module a shared `Pe` is only an identity (the
// contexts and the polling thread's handle keep it alive). Inside, its pointer is passed to
// DOCA by its one `PeDriver` only, which never runs two calls at once (it is not `Sync`, and
// its driving calls take `&mut self`), and by `Drop`, which has exclusive access. Sharing a
// `Pe` therefore shares nothing DOCA could see.
unsafe impl Sync for Pe {}

impl Drop for Pe {
    fn drop(&mut self) {
        // SAFETY: created in `PeDriver::new`, destroyed once; every context connected to it
        // held an `Arc` of it and was destroyed before this last one went.
        let code = unsafe { sys::doca_pe_destroy(self.raw.as_ptr()) };
        if let Err(e) = check("doca_pe_destroy", code) {
            tracing::warn!(error = %e, "leaking a DOCA progress engine");
        }
    }
}

/// The right to drive a progress engine: connect contexts to it, progress it, arm and clear
/// its notification. Exactly one exists per engine (`PeDriver::new` makes both), every call
/// that drives takes `&mut self`, and it is not `Sync`, so no two calls on the engine ever
/// overlap: DOCA's single-driver rule in types. Whoever holds it is the engine's progress owner
/// (an event-mode owner for its own engine, a polling thread for the engine its transport's
/// contexts share); it moves between threads with its owner (`Send`).
pub(super) struct PeDriver {
    pe: Arc<Pe>,
    /// Not `Sync`: even the calls that take `&self` run on one thread at a time.
    _one_thread: PhantomData<Cell<()>>,
}

impl PeDriver {
    /// Creates a progress engine and its driver.
    pub(super) fn new() -> Result<PeDriver> {
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer.
        check("doca_pe_create", unsafe { sys::doca_pe_create(&mut raw) })?;
        let raw = NonNull::new(raw).ok_or_else(|| doca_error("doca_pe_create", 1))?;
        Ok(PeDriver {
            pe: Arc::new(Pe { raw }),
            _one_thread: PhantomData,
        })
    }

    /// The engine, for the contexts that will be connected to it (they keep it alive).
    pub(super) fn engine(&self) -> &Arc<Pe> {
        &self.pe
    }

    fn raw(&self) -> *mut sys::doca_pe {
        self.pe.raw.as_ptr()
    }

    /// Connects `rdma`, which must have been created for this engine (it holds it), to it.
    pub(super) fn connect(&mut self, rdma: &Rdma) -> Result<()> {
        if !Arc::ptr_eq(&rdma.pe, &self.pe) {
            return Err(Error::InvalidArgument(
                "a DOCA context can only be connected to the progress engine it was created for"
                    .into(),
            ));
        }
        // SAFETY: a live engine and a live context; `&mut self` means nothing drives the
        // engine meanwhile. DOCA refuses a context that is not idle or already connected.
        check("doca_pe_connect_ctx", unsafe {
            sys::doca_pe_connect_ctx(self.raw(), rdma.ctx())
        })
    }

    /// One `doca_pe_progress`: runs the callbacks the engine has ready (the software provider:
    /// one per call); true if anything happened.
    pub(super) fn progress(&mut self) -> bool {
        // SAFETY: a live engine. `&mut self` means no other call drives it meanwhile. The
        // callbacks it runs (`engine::callbacks`) only record events and never progress; they
        // cannot reach this driver, borrowed here, so it is never called re-entrantly.
        unsafe { sys::doca_pe_progress(self.raw()) != 0 }
    }

    /// The engine's notification handle (it never changes).
    pub(super) fn notification_fd(&self) -> Result<i32> {
        let mut fd = 0;
        // SAFETY: a live engine; valid out-pointer. No other call on the engine runs meanwhile:
        // driving calls need `&mut self`, and the driver is not `Sync`.
        check("doca_pe_get_notification_handle", unsafe {
            sys::doca_pe_get_notification_handle(self.raw(), &mut fd)
        })?;
        Ok(fd)
    }

    /// Arms the notification (the next completion makes the handle readable).
    pub(super) fn arm(&mut self) -> Result<()> {
        // SAFETY: a live engine, driven by this call alone (`&mut self`).
        check("doca_pe_request_notification", unsafe {
            sys::doca_pe_request_notification(self.raw())
        })
    }

    /// Clears the notification handle `fd` (from [`PeDriver::notification_fd`]).
    pub(super) fn clear(&mut self, fd: i32) -> Result<()> {
        // SAFETY: a live engine, driven by this call alone (`&mut self`); `fd` is its handle.
        check("doca_pe_clear_notification", unsafe {
            sys::doca_pe_clear_notification(self.raw(), fd)
        })
    }
}

/// An RDMA context (`doca_rdma`) connected to a progress engine.
pub(super) struct Rdma {
    raw: NonNull<sys::doca_rdma>,
    /// Whether the context reached IDLE after a stop (or was never started); only then may
    /// it be destroyed.
    pub(super) destroyable: bool,
    // Parents, declared after `raw`: they outlive the context. `pe` is the engine the context
    // is (or will be) connected to.
    pe: Arc<Pe>,
    dev: Arc<Device>,
}

// SAFETY: the context is touched only by its progress owner (one thread at a time).
unsafe impl Send for Rdma {}

impl Rdma {
    pub(super) fn new(dev: &Arc<Device>, pe: &Arc<Pe>) -> Result<Rdma> {
        let mut raw = ptr::null_mut();
        // SAFETY: live device; valid out-pointer.
        check("doca_rdma_create", unsafe {
            sys::doca_rdma_create(dev.raw(), &mut raw)
        })?;
        let raw = NonNull::new(raw).ok_or_else(|| doca_error("doca_rdma_create", 1))?;
        Ok(Rdma {
            raw,
            destroyable: true,
            pe: pe.clone(),
            dev: dev.clone(),
        })
    }

    pub(super) fn raw(&self) -> *mut sys::doca_rdma {
        self.raw.as_ptr()
    }

    pub(super) fn ctx(&self) -> *mut sys::doca_ctx {
        // SAFETY: a live context.
        unsafe { sys::doca_rdma_as_ctx(self.raw()) }
    }

    pub(super) fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    pub(super) fn state(&self) -> sys::doca_ctx_states {
        let mut state = sys::DOCA_CTX_STATE_IDLE;
        // SAFETY: live context; valid out-pointer.
        let _ = unsafe { sys::doca_ctx_get_state(self.ctx(), &mut state) };
        state
    }

    /// Hands the tasks submitted without `DOCA_TASK_SUBMIT_FLAG_FLUSH` to the hardware: one
    /// doorbell for all of them (`doca_ctx_flush_tasks`).
    pub(super) fn flush_tasks(&self) {
        // SAFETY: a live context of this owner; DOCA flushes only tasks submitted to it.
        unsafe { sys::doca_ctx_flush_tasks(self.ctx()) }
    }
}

impl Drop for Rdma {
    fn drop(&mut self) {
        if !self.destroyable {
            tracing::warn!("leaking a DOCA RDMA context that did not stop");
            return;
        }
        // SAFETY: created in `new`, destroyed once, idle (checked by `destroyable`) with every
        // task freed by the owner.
        let code = unsafe { sys::doca_rdma_destroy(self.raw()) };
        if let Err(e) = check("doca_rdma_destroy", code) {
            tracing::warn!(error = %e, "leaking a DOCA RDMA context");
        }
    }
}

/// An RDMA CM address (`doca_rdma_addr`), kept alive while a connection uses it.
pub(super) struct RdmaAddr {
    raw: NonNull<sys::doca_rdma_addr>,
}

// SAFETY: an address is immutable after creation and only passed to DOCA by the progress
// owner of the context that connects with it.
unsafe impl Send for RdmaAddr {}

impl RdmaAddr {
    pub(super) fn new(ip: std::net::IpAddr, port: u16) -> Result<RdmaAddr> {
        let kind = match ip {
            std::net::IpAddr::V4(_) => sys::DOCA_RDMA_ADDR_TYPE_IPv4,
            std::net::IpAddr::V6(_) => sys::DOCA_RDMA_ADDR_TYPE_IPv6,
        };
        let text = std::ffi::CString::new(ip.to_string()).expect("an IP address has no NUL");
        let mut raw = ptr::null_mut();
        // SAFETY: `text` is NUL-terminated and outlives the call; valid out-pointer.
        check("doca_rdma_addr_create", unsafe {
            sys::doca_rdma_addr_create(kind, text.as_ptr(), port, &mut raw)
        })?;
        let raw = NonNull::new(raw).ok_or_else(|| doca_error("doca_rdma_addr_create", 1))?;
        Ok(RdmaAddr { raw })
    }

    pub(super) fn raw(&self) -> *mut sys::doca_rdma_addr {
        self.raw.as_ptr()
    }
}

impl Drop for RdmaAddr {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once, after the connection that used it ended.
        let code = unsafe { sys::doca_rdma_addr_destroy(self.raw()) };
        if let Err(e) = check("doca_rdma_addr_destroy", code) {
            tracing::debug!(error = %e, "leaking a DOCA RDMA CM address");
        }
    }
}
