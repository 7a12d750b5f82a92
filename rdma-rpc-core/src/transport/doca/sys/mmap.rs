//! Memory maps (`doca_mmap`): local ones over registered memory (exported when they grant
//! remote rights), and ones imported from a peer's export.

use std::ffi::c_void;
use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use doca_sys as sys;

use super::device::Device;
use super::{check, doca_error};
use crate::error::Result;

/// A memory map: local (over registered memory, exportable) or imported from a peer's export.
pub(in crate::transport::doca) struct Mmap {
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
    pub(in crate::transport::doca) unsafe fn local(
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
    pub(in crate::transport::doca) fn import(dev: &Arc<Device>, blob: &[u8]) -> Result<Mmap> {
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

    pub(in crate::transport::doca) fn raw(&self) -> *mut sys::doca_mmap {
        self.raw.as_ptr()
    }

    pub(in crate::transport::doca) fn export(&self) -> &bytes::Bytes {
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
