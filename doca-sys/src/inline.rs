//! DOCA's `static inline` helpers, which have no symbol in the libraries.

use crate::ffi::{
    doca_buf, doca_buf_inventory, doca_buf_inventory_buf_get_by_args, doca_error_t, doca_mmap,
};
use std::ffi::c_void;

/// Takes a buffer describing `[addr, addr + len)` with an empty data section at `addr`.
///
/// Same as DOCA's inline helper: `doca_buf_inventory_buf_get_by_args(inventory, mmap, addr,
/// len, addr, 0, buf)`.
///
/// # Safety
/// Same contract as [`doca_buf_inventory_buf_get_by_args`]: `inventory` and `mmap` are live
/// DOCA objects, `buf` is valid for writes, and the range lies inside the mmap's memory.
pub unsafe extern "C" fn doca_buf_inventory_buf_get_by_addr(
    inventory: *mut doca_buf_inventory,
    mmap: *mut doca_mmap,
    addr: *mut c_void,
    len: usize,
    buf: *mut *mut doca_buf,
) -> doca_error_t {
    // SAFETY: forwarded under the caller's contract, which is the one of get_by_args.
    unsafe { doca_buf_inventory_buf_get_by_args(inventory, mmap, addr, len, addr, 0, buf) }
}

/// Takes a buffer describing `[data, data + data_len)` whose data section is all of it.
///
/// Same as DOCA's inline helper: `doca_buf_inventory_buf_get_by_args(inventory, mmap, data,
/// data_len, data, data_len, buf)`.
///
/// # Safety
/// Same contract as [`doca_buf_inventory_buf_get_by_args`]: `inventory` and `mmap` are live
/// DOCA objects, `buf` is valid for writes, and the range lies inside the mmap's memory.
pub unsafe extern "C" fn doca_buf_inventory_buf_get_by_data(
    inventory: *mut doca_buf_inventory,
    mmap: *mut doca_mmap,
    data: *mut c_void,
    data_len: usize,
    buf: *mut *mut doca_buf,
) -> doca_error_t {
    // SAFETY: forwarded under the caller's contract, which is the one of get_by_args.
    unsafe {
        doca_buf_inventory_buf_get_by_args(inventory, mmap, data, data_len, data, data_len, buf)
    }
}
