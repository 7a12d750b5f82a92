//! Buffer inventories (`doca_buf_inventory`), which grow on demand, and the buffers
//! (`doca_buf`) they hand out over an mmap.

use std::ffi::c_void;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use doca_sys as sys;

use super::mmap::Mmap;
use super::{check, doca_error, error_name};
use crate::error::Result;

/// A buffer inventory that grows on demand (`doca_buf_inventory_expand`): it starts small
/// and doubles when it runs out, up to its maximum, instead of holding the worst case from
/// the start.
pub(in crate::transport::doca) struct Inventory {
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
    pub(in crate::transport::doca) fn new(initial: usize, max: usize) -> Result<Inventory> {
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
    /// `[addr, addr + data_len)`. An inventory with every buffer out grows (doubling, up to
    /// its maximum) before it answers `NO_MEMORY`.
    ///
    /// # Safety
    /// The memory must stay valid and not be accessed by anything else while DOCA uses the
    /// buffer (the caller keeps the owning `RegisteredBuf` or window alive).
    pub(in crate::transport::doca) unsafe fn buf(
        &self,
        mmap: &Arc<Mmap>,
        addr: u64,
        len: usize,
        data_len: usize,
    ) -> Result<Buf> {
        // SAFETY: as this function's.
        unsafe { self.buf_over(mmap, (addr, len), addr, data_len) }
    }

    /// A buffer over `head = (addr, len)` of `mmap` whose data section is
    /// `[data, data + data_len)`, which must lie inside it.
    ///
    /// # Safety
    /// As [`buf`](Self::buf), for the whole of `head`.
    pub(in crate::transport::doca) unsafe fn buf_over(
        &self,
        mmap: &Arc<Mmap>,
        head: (u64, usize),
        data: u64,
        data_len: usize,
    ) -> Result<Buf> {
        let p = head.0 as usize as *mut c_void;
        let d = data as usize as *mut c_void;
        loop {
            let mut raw = ptr::null_mut();
            // SAFETY: live inventory and mmap; the ranges are checked by DOCA against the mmap.
            let code = unsafe {
                sys::doca_buf_inventory_buf_get_by_args(
                    self.raw.as_ptr(),
                    mmap.raw(),
                    p,
                    head.1,
                    d,
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
                mmap: mmap.clone(),
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
pub(in crate::transport::doca) struct Buf {
    raw: NonNull<sys::doca_buf>,
    mmap: Arc<Mmap>,
}

// SAFETY: a buffer is only used by the progress owner of one context (one thread at a time).
unsafe impl Send for Buf {}

impl Buf {
    pub(in crate::transport::doca) fn raw(&self) -> *mut sys::doca_buf {
        self.raw.as_ptr()
    }

    /// The mmap the buffer was taken over.
    pub(in crate::transport::doca) fn mmap(&self) -> &Arc<Mmap> {
        &self.mmap
    }

    /// Moves the data section to `[data, data + len)`, which must lie inside the buffer
    /// (`doca_buf_set_data`): a buffer over a whole slab serves each of its slots in turn.
    ///
    /// # Safety
    /// The buffer is not in use by a submitted task, and the caller owns the new data range
    /// as [`Inventory::buf`] requires.
    pub(in crate::transport::doca) unsafe fn set_data(&self, data: u64, len: usize) -> Result<()> {
        // SAFETY: per the caller; DOCA checks the range against the buffer.
        let code = unsafe { sys::doca_buf_set_data(self.raw(), data as usize as *mut c_void, len) };
        check("doca_buf_set_data", code)
    }

    /// Empties the data section (for reposting a receive).
    pub(in crate::transport::doca) fn reset(&self) {
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
