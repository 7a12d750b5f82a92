//! The fake device list and RDMA capabilities.

use super::{world, H};
use crate::ffi::*;
use std::ffi::{c_char, CStr};

struct DevInfo {
    name: &'static CStr,
    pci: &'static CStr,
    /// Whether the device supports RDMA. Without it every `doca_rdma_cap_task_*_is_supported`
    /// answers `NOT_SUPPORTED` and the numeric capability queries fail with `DRIVER`.
    rdma: bool,
}

pub(super) const NUM_DEVS: usize = 3;

static DEVINFOS: [DevInfo; NUM_DEVS] = [
    DevInfo {
        name: c"mlx5_0",
        pci: c"0000:03:00.0",
        rdma: true,
    },
    DevInfo {
        name: c"mlx5_1",
        pci: c"0000:03:00.1",
        rdma: true,
    },
    DevInfo {
        name: c"mlx5_2",
        pci: c"0000:03:00.2",
        rdma: false,
    },
];

/// An open device: which entry of `DEVINFOS` it is.
struct Dev {
    info: &'static DevInfo,
}

/// Whether two open device handles are the same device (DOCA hands out one device per
/// devinfo and counts its openings; the provider gives each opening its own handle).
///
/// # Safety
/// Both are open devices of this provider.
pub(super) unsafe fn same_device(a: H, b: H) -> bool {
    // SAFETY: the caller passes open devices (live `Dev`s).
    let info = |d: H| unsafe { (d as *const Dev).as_ref() }.map(|d| d.info as *const DevInfo);
    a == b || (info(a).is_some() && info(a) == info(b))
}

/// The position of an open device's devinfo in the device list.
///
/// # Safety
/// `dev` is an open device of this provider.
pub(super) unsafe fn device_index(dev: H) -> Option<usize> {
    // SAFETY: the caller passes an open device (a live `Dev`).
    let info = unsafe { (dev as *const Dev).as_ref() }?.info;
    DEVINFOS.iter().position(|d| std::ptr::eq(d, info))
}

/// The position of the device named `name` in the device list.
pub(super) fn index_by_name(name: &str) -> Option<usize> {
    DEVINFOS
        .iter()
        .position(|d| d.name.to_bytes() == name.as_bytes())
}

/// Whether an open device supports RDMA.
///
/// # Safety
/// `dev` is an open device of this provider.
pub(super) unsafe fn rdma_supported(dev: H) -> bool {
    // SAFETY: the caller passes an open device (a live `Dev`).
    unsafe { (dev as *const Dev).as_ref() }.is_some_and(|d| d.info.rdma)
}

const MAX_MESSAGE_SIZE: u32 = 1 << 30;
/// Maximum send and receive queue sizes: the provider's choice, the `max_qp_wr` a ConnectX
/// adapter reports.
pub(super) const MAX_QUEUE_SIZE: u32 = 32768;

fn devinfo_ptr(info: &'static DevInfo) -> *mut doca_devinfo {
    (info as *const DevInfo).cast_mut().cast()
}

/// # Safety
/// `devinfo` is null or a pointer from the device list.
unsafe fn devinfo_ref(devinfo: *const doca_devinfo) -> Option<&'static DevInfo> {
    // SAFETY: device list pointers point into the `DEVINFOS` static.
    unsafe { devinfo.cast::<DevInfo>().as_ref() }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_devinfo_create_list(
    dev_list: *mut *mut *mut doca_devinfo,
    nb_devs: *mut u32,
) -> doca_error_t {
    if dev_list.is_null() || nb_devs.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    let list: Box<[*mut doca_devinfo; NUM_DEVS]> =
        Box::new(std::array::from_fn(|i| devinfo_ptr(&DEVINFOS[i])));
    // SAFETY: both out-pointers were checked non-null and the caller gives writable places.
    unsafe {
        *dev_list = Box::into_raw(list).cast();
        *nb_devs = NUM_DEVS as u32;
    }
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_devinfo_destroy_list(
    dev_list: *mut *mut doca_devinfo,
) -> doca_error_t {
    if dev_list.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the list was allocated by `doca_devinfo_create_list` as a boxed array of NUM_DEVS.
    drop(unsafe { Box::from_raw(dev_list.cast::<[*mut doca_devinfo; NUM_DEVS]>()) });
    DOCA_SUCCESS
}

/// Copies a C string, NUL included, into a caller buffer of `size` bytes.
///
/// # Safety
/// `out` is writable for `size` bytes.
unsafe fn copy_cstr(s: &CStr, out: *mut c_char, size: usize) -> doca_error_t {
    let bytes = s.to_bytes_with_nul();
    if out.is_null() || size < bytes.len() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    // SAFETY: `out` holds at least `bytes.len()` bytes (checked above, caller's contract).
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), out, bytes.len()) };
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_devinfo_get_ibdev_name(
    devinfo: *const doca_devinfo,
    ibdev_name: *mut c_char,
    size: u32,
) -> doca_error_t {
    // SAFETY: caller passes a device list pointer.
    let Some(info) = (unsafe { devinfo_ref(devinfo) }) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if size < DOCA_DEVINFO_IBDEV_NAME_SIZE {
        return DOCA_ERROR_INVALID_VALUE;
    }
    // SAFETY: the caller's buffer has `size` bytes.
    unsafe { copy_cstr(info.name, ibdev_name, size as usize) }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_devinfo_get_pci_addr_str(
    devinfo: *const doca_devinfo,
    pci_addr_str: *mut c_char,
) -> doca_error_t {
    // SAFETY: caller passes a device list pointer.
    let Some(info) = (unsafe { devinfo_ref(devinfo) }) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    // SAFETY: DOCA's contract: the buffer holds DOCA_DEVINFO_PCI_ADDR_SIZE bytes.
    unsafe { copy_cstr(info.pci, pci_addr_str, DOCA_DEVINFO_PCI_ADDR_SIZE as usize) }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_dev_open(
    devinfo: *mut doca_devinfo,
    dev: *mut *mut doca_dev,
) -> doca_error_t {
    // SAFETY: caller passes a device list pointer.
    let Some(info) = (unsafe { devinfo_ref(devinfo) }) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if dev.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    // SAFETY: `dev` checked non-null, writable per the contract.
    unsafe { *dev = Box::into_raw(Box::new(Dev { info })).cast() };
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_dev_close(dev: *mut doca_dev) -> doca_error_t {
    if dev.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    {
        // Stricter choice: the device resources cannot be released while an RDMA context
        // created on it or a memory map holding it exists (`IN_USE`, the documented code for
        // "failed to deallocate device resources").
        let d = dev as H;
        let w = world();
        if w.rdmas.values().any(|r| r.dev == d) || w.mmaps.values().any(|m| m.devs.contains(&d)) {
            return DOCA_ERROR_IN_USE;
        }
    }
    // SAFETY: `dev` was created by `doca_dev_open` and is closed once.
    drop(unsafe { Box::from_raw(dev.cast::<Dev>()) });
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_dev_as_devinfo(dev: *const doca_dev) -> *mut doca_devinfo {
    // SAFETY: `dev` is null or an open device.
    match unsafe { dev.cast::<Dev>().as_ref() } {
        Some(d) => devinfo_ptr(d.info),
        None => std::ptr::null_mut(),
    }
}

macro_rules! cap_supported {
    ($($name:ident),* $(,)?) => {$(
        #[no_mangle]
        pub(crate) unsafe extern "C" fn $name(devinfo: *const doca_devinfo) -> doca_error_t {
            // SAFETY: caller passes a device list pointer.
            match unsafe { devinfo_ref(devinfo) } {
                None => DOCA_ERROR_INVALID_VALUE,
                Some(info) if info.rdma => DOCA_SUCCESS,
                Some(_) => DOCA_ERROR_NOT_SUPPORTED,
            }
        }
    )*};
}

cap_supported!(
    doca_rdma_cap_task_receive_is_supported,
    doca_rdma_cap_task_send_is_supported,
    doca_rdma_cap_task_send_imm_is_supported,
    doca_rdma_cap_task_read_is_supported,
    doca_rdma_cap_task_write_is_supported,
    doca_rdma_cap_task_write_imm_is_supported,
    doca_rdma_cap_task_atomic_cmp_swp_is_supported,
    doca_rdma_cap_task_atomic_fetch_add_is_supported,
);

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_cap_get_max_message_size(
    devinfo: *const doca_devinfo,
    max_message_size: *mut u32,
) -> doca_error_t {
    // SAFETY: `max_message_size` is null or writable per the contract.
    unsafe { cap_u32(devinfo, max_message_size, MAX_MESSAGE_SIZE) }
}

/// Writes a capability value of a device.
///
/// # Safety
/// `out` is null or writable.
unsafe fn cap_u32(devinfo: *const doca_devinfo, out: *mut u32, value: u32) -> doca_error_t {
    // SAFETY: caller passes a device list pointer.
    let Some(info) = (unsafe { devinfo_ref(devinfo) }) else {
        return DOCA_ERROR_INVALID_VALUE;
    };
    if out.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    if !info.rdma {
        // The capability query of a device without RDMA fails ("failed to query device
        // capabilities"): callers must skip the device.
        return DOCA_ERROR_DRIVER;
    }
    // SAFETY: checked non-null; writable per the contract.
    unsafe { *out = value };
    DOCA_SUCCESS
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_cap_get_max_send_queue_size(
    devinfo: *const doca_devinfo,
    max_send_queue_size: *mut u32,
) -> doca_error_t {
    // SAFETY: `max_send_queue_size` is null or writable per the contract.
    unsafe { cap_u32(devinfo, max_send_queue_size, MAX_QUEUE_SIZE) }
}

#[no_mangle]
pub(crate) unsafe extern "C" fn doca_rdma_cap_get_max_recv_queue_size(
    devinfo: *const doca_devinfo,
    max_recv_queue_size: *mut u32,
) -> doca_error_t {
    // SAFETY: `max_recv_queue_size` is null or writable per the contract.
    unsafe { cap_u32(devinfo, max_recv_queue_size, MAX_QUEUE_SIZE) }
}
