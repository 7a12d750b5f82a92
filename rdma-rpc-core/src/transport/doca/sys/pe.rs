//! Progress engines (`doca_pe`): the engine, which contexts hold, and `PeDriver`, the one
//! handle that drives it (connects contexts, progresses, arms and clears its notification).

use std::cell::Cell;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use doca_sys as sys;

use super::rdma::Rdma;
use super::{check, doca_error};
use crate::error::{Error, Result};

/// A progress engine (`doca_pe`), destroyed when its last `Arc` goes: the contexts connected
/// to it hold one (so it outlives them), and so does its [`PeDriver`].
///
/// A shared `Pe` gives access to nothing that drives the engine: every DOCA call on it goes
/// through its one [`PeDriver`]. An engine may be used from any thread, but from one at a time,
/// and never from its own callbacks.
pub(in crate::transport::doca) struct Pe {
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
pub(in crate::transport::doca) struct PeDriver {
    pe: Arc<Pe>,
    /// Not `Sync`: even the calls that take `&self` run on one thread at a time.
    _one_thread: PhantomData<Cell<()>>,
}

impl PeDriver {
    /// Creates a progress engine and its driver.
    pub(in crate::transport::doca) fn new() -> Result<PeDriver> {
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
    pub(in crate::transport::doca) fn engine(&self) -> &Arc<Pe> {
        &self.pe
    }

    fn raw(&self) -> *mut sys::doca_pe {
        self.pe.raw.as_ptr()
    }

    /// Connects `rdma`, which must have been created for this engine (it holds it), to it.
    pub(in crate::transport::doca) fn connect(&mut self, rdma: &Rdma) -> Result<()> {
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
    pub(in crate::transport::doca) fn progress(&mut self) -> bool {
        // SAFETY: a live engine. `&mut self` means no other call drives it meanwhile. The
        // callbacks it runs (`engine::callbacks`) only record events and never progress; they
        // cannot reach this driver, borrowed here, so it is never called re-entrantly.
        unsafe { sys::doca_pe_progress(self.raw()) != 0 }
    }

    /// The engine's notification handle (it never changes).
    pub(in crate::transport::doca) fn notification_fd(&self) -> Result<i32> {
        let mut fd = 0;
        // SAFETY: a live engine; valid out-pointer. No other call on the engine runs meanwhile:
        // driving calls need `&mut self`, and the driver is not `Sync`.
        check("doca_pe_get_notification_handle", unsafe {
            sys::doca_pe_get_notification_handle(self.raw(), &mut fd)
        })?;
        Ok(fd)
    }

    /// Arms the notification (the next completion makes the handle readable).
    pub(in crate::transport::doca) fn arm(&mut self) -> Result<()> {
        // SAFETY: a live engine, driven by this call alone (`&mut self`).
        check("doca_pe_request_notification", unsafe {
            sys::doca_pe_request_notification(self.raw())
        })
    }

    /// Clears the notification handle `fd` (from [`PeDriver::notification_fd`]).
    pub(in crate::transport::doca) fn clear(&mut self, fd: i32) -> Result<()> {
        // SAFETY: a live engine, driven by this call alone (`&mut self`); `fd` is its handle.
        check("doca_pe_clear_notification", unsafe {
            sys::doca_pe_clear_notification(self.raw(), fd)
        })
    }
}
