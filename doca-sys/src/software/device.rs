//! The fake device list and RDMA capabilities.

use crate::ffi::*;
use std::ffi::{c_char, CStr};

struct DevInfo {
    name: &'static CStr,
    pci: &'static CStr,
}

const NUM_DEVS: usize = 2;

static DEVINFOS: [DevInfo; NUM_DEVS] = [
    DevInfo {
        name: c"mlx5_0",
        pci: c"0000:03:00.0",
    },
    DevInfo {
        name: c"mlx5_1",
        pci: c"0000:03:00.1",
    },
];

/// An open device: which entry of `DEVINFOS` it is.
struct Dev {
    info: &'static DevInfo,
}

const MAX_MESSAGE_SIZE: u32 = 1 << 30;

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
            if devinfo.is_null() { DOCA_ERROR_INVALID_VALUE } else { DOCA_SUCCESS }
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
    if devinfo.is_null() || max_message_size.is_null() {
        return DOCA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; writable per the contract.
    unsafe { *max_message_size = MAX_MESSAGE_SIZE };
    DOCA_SUCCESS
}
