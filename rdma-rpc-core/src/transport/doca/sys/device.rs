//! The device list and open devices: what `list_devices` reports about each device (its
//! names, RDMA task types and limits), and `Device`, an open `doca_dev` that mmaps and
//! contexts hold.

use std::ffi::CStr;
use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use doca_sys as sys;

use super::{check, doca_error};
use crate::error::{Error, Result};

/// What [`list_devices`](crate::transport::doca::list_devices) reports about one device.
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
pub(in crate::transport::doca) fn list_devices() -> Result<Vec<DeviceInfo>> {
    let list = DevInfoList::new()?;
    Ok(usable(&list).into_iter().map(|(_, info)| info).collect())
}

/// An open device (`doca_dev`).
pub(in crate::transport::doca) struct Device {
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
    pub(in crate::transport::doca) fn open(selector: Option<&str>) -> Result<Arc<Device>> {
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

    pub(in crate::transport::doca) fn raw(&self) -> *mut sys::doca_dev {
        self.raw.as_ptr()
    }

    pub(in crate::transport::doca) fn info(&self) -> &DeviceInfo {
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
