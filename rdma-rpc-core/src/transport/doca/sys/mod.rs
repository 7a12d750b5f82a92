//! Safe wrappers over the raw `doca-sys` handles: devices, memory maps, buffer inventories
//! and buffers, progress engines and RDMA contexts.
//!
//! Each wrapper owns one raw pointer and destroys it in `Drop`; a child holds an `Arc` of its
//! parent (an mmap holds its device, a context its device and progress engine), so drop order
//! is right by construction. Destruction failures are logged and the handle leaked: `Drop`
//! never panics.
//!
//! One file per wrapped object family: `device.rs` (the device list and open devices),
//! `mmap.rs` (memory maps), `buf.rs` (buffer inventories and buffers), `pe.rs` (progress
//! engines and their driver) and `rdma.rs` (RDMA contexts and RDMA CM addresses). This file
//! holds what they share: turning a DOCA error code into an [`Error`].

mod buf;
mod device;
mod mmap;
mod pe;
mod rdma;

use std::ffi::CStr;

use doca_sys as sys;

use crate::error::{Error, Result};

pub(super) use buf::{Buf, Inventory};
pub(super) use device::{list_devices, Device};
pub use device::{Capabilities, DeviceInfo};
pub(super) use mmap::Mmap;
pub(super) use pe::{Pe, PeDriver};
pub(super) use rdma::{Rdma, RdmaAddr};

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
