//! RDMA contexts (`doca_rdma`) and RDMA CM addresses (`doca_rdma_addr`).

use std::ptr::{self, NonNull};
use std::sync::Arc;

use doca_sys as sys;

use super::device::Device;
use super::pe::Pe;
use super::{check, doca_error};
use crate::error::Result;

/// An RDMA context (`doca_rdma`) connected to a progress engine.
pub(in crate::transport::doca) struct Rdma {
    raw: NonNull<sys::doca_rdma>,
    /// Whether the context reached IDLE after a stop (or was never started); only then may
    /// it be destroyed.
    pub(in crate::transport::doca) destroyable: bool,
    // Parents, declared after `raw`: they outlive the context. `pe` is the engine the context
    // is (or will be) connected to.
    pub(super) pe: Arc<Pe>,
    dev: Arc<Device>,
}

// SAFETY: the context is touched only by its progress owner (one thread at a time).
unsafe impl Send for Rdma {}

impl Rdma {
    pub(in crate::transport::doca) fn new(dev: &Arc<Device>, pe: &Arc<Pe>) -> Result<Rdma> {
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

    pub(in crate::transport::doca) fn raw(&self) -> *mut sys::doca_rdma {
        self.raw.as_ptr()
    }

    pub(in crate::transport::doca) fn ctx(&self) -> *mut sys::doca_ctx {
        // SAFETY: a live context.
        unsafe { sys::doca_rdma_as_ctx(self.raw()) }
    }

    pub(in crate::transport::doca) fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    pub(in crate::transport::doca) fn state(&self) -> sys::doca_ctx_states {
        let mut state = sys::DOCA_CTX_STATE_IDLE;
        // SAFETY: live context; valid out-pointer.
        let _ = unsafe { sys::doca_ctx_get_state(self.ctx(), &mut state) };
        state
    }

    /// Hands the tasks submitted without `DOCA_TASK_SUBMIT_FLAG_FLUSH` to the hardware: one
    /// doorbell for all of them (`doca_ctx_flush_tasks`).
    pub(in crate::transport::doca) fn flush_tasks(&self) {
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
pub(in crate::transport::doca) struct RdmaAddr {
    raw: NonNull<sys::doca_rdma_addr>,
}

// SAFETY: an address is immutable after creation and only passed to DOCA by the progress
// owner of the context that connects with it.
unsafe impl Send for RdmaAddr {}

impl RdmaAddr {
    pub(in crate::transport::doca) fn new(ip: std::net::IpAddr, port: u16) -> Result<RdmaAddr> {
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

    pub(in crate::transport::doca) fn raw(&self) -> *mut sys::doca_rdma_addr {
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
