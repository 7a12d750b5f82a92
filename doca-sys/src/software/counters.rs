//! What the provider counts per device: the calls that are cheap here and expensive on a NIC,
//! and buffers taken from inventories (work per operation where an application keeps them).
//!
//! On hardware, `doca_mmap_start` pins pages and creates a memory key, destroying a started
//! mmap unpins and invalidates it, each export and each import creates an object, each
//! doorbell is an MMIO write across PCIe, and each receiver-not-ready retry costs a round trip
//! and a timer period. The provider does all of that for free, so it counts it
//! instead: tests assert the counts (zero per call on a hot path) the way they count
//! allocations. Counters are per device (every opening of `mlx5_0` counts together), lock-free
//! and never reset: readers take differences.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

use super::device::{device_index, NUM_DEVS};
use super::H;
use crate::Counters;

/// One device's counters.
struct DeviceCounters {
    registrations: AtomicU64,
    registered_bytes: AtomicU64,
    pinned_bytes: AtomicI64,
    deregistrations: AtomicU64,
    exports: AtomicU64,
    imports: AtomicU64,
    imports_destroyed: AtomicU64,
    task_submissions: AtomicU64,
    doorbells: AtomicU64,
    rnr_waits: AtomicU64,
    rnr_retries: AtomicU64,
    rnr_failures: AtomicU64,
    buffers_taken: AtomicU64,
}

impl DeviceCounters {
    const fn new() -> DeviceCounters {
        DeviceCounters {
            registrations: AtomicU64::new(0),
            registered_bytes: AtomicU64::new(0),
            pinned_bytes: AtomicI64::new(0),
            deregistrations: AtomicU64::new(0),
            exports: AtomicU64::new(0),
            imports: AtomicU64::new(0),
            imports_destroyed: AtomicU64::new(0),
            task_submissions: AtomicU64::new(0),
            doorbells: AtomicU64::new(0),
            rnr_waits: AtomicU64::new(0),
            rnr_retries: AtomicU64::new(0),
            rnr_failures: AtomicU64::new(0),
            buffers_taken: AtomicU64::new(0),
        }
    }

    fn read(&self) -> Counters {
        Counters {
            registrations: self.registrations.load(Relaxed),
            registered_bytes: self.registered_bytes.load(Relaxed),
            pinned_bytes: self.pinned_bytes.load(Relaxed).max(0) as u64,
            deregistrations: self.deregistrations.load(Relaxed),
            exports: self.exports.load(Relaxed),
            imports: self.imports.load(Relaxed),
            imports_destroyed: self.imports_destroyed.load(Relaxed),
            task_submissions: self.task_submissions.load(Relaxed),
            doorbells: self.doorbells.load(Relaxed),
            rnr_waits: self.rnr_waits.load(Relaxed),
            rnr_retries: self.rnr_retries.load(Relaxed),
            rnr_failures: self.rnr_failures.load(Relaxed),
            buffers_taken: self.buffers_taken.load(Relaxed),
        }
    }
}

static DEVICES: [DeviceCounters; NUM_DEVS] = [const { DeviceCounters::new() }; NUM_DEVS];

/// The counters of the device an open device handle belongs to.
fn of(dev: H) -> Option<&'static DeviceCounters> {
    // SAFETY: callers pass device handles the provider checked (an mmap's added devices, a
    // context's device, an argument already validated as open).
    unsafe { device_index(dev) }.map(|i| &DEVICES[i])
}

/// `doca_mmap_start` registered `len` bytes for `dev`.
pub(super) fn registered(dev: H, len: usize) {
    if let Some(c) = of(dev) {
        c.registrations.fetch_add(1, Relaxed);
        c.registered_bytes.fetch_add(len as u64, Relaxed);
        c.pinned_bytes.fetch_add(len as i64, Relaxed);
    }
}

/// A started local mmap of `len` bytes was stopped or destroyed: its pages are unpinned.
pub(super) fn deregistered(dev: H, len: usize) {
    if let Some(c) = of(dev) {
        c.deregistrations.fetch_add(1, Relaxed);
        c.pinned_bytes.fetch_sub(len as i64, Relaxed);
    }
}

/// `doca_mmap_export_rdma` exported an mmap for `dev`.
pub(super) fn exported(dev: H) {
    if let Some(c) = of(dev) {
        c.exports.fetch_add(1, Relaxed);
    }
}

/// `doca_mmap_create_from_export` created an mmap on `dev`.
pub(super) fn imported(dev: H) {
    if let Some(c) = of(dev) {
        c.imports.fetch_add(1, Relaxed);
    }
}

/// An mmap created from an export on `dev` was destroyed.
pub(super) fn import_destroyed(dev: H) {
    if let Some(c) = of(dev) {
        c.imports_destroyed.fetch_add(1, Relaxed);
    }
}

/// `doca_task_submit` or `doca_task_submit_ex` accepted a task of a context on `dev`.
pub(super) fn submitted(dev: H) {
    if let Some(c) = of(dev) {
        c.task_submissions.fetch_add(1, Relaxed);
    }
}

/// A context on `dev` handed tasks to the hardware: a flushing submit, or a
/// `doca_ctx_flush_tasks` that had tasks to flush.
pub(super) fn doorbell(dev: H) {
    if let Some(c) = of(dev) {
        c.doorbells.fetch_add(1, Relaxed);
    }
}

/// A send-like task of a context on `dev` found no receive posted on the peer when it started.
pub(super) fn rnr_wait(dev: H) {
    if let Some(c) = of(dev) {
        c.rnr_waits.fetch_add(1, Relaxed);
    }
}

/// A receiver-not-ready timer period of a waiting send of a context on `dev` ended with a
/// retry left: it tries again.
pub(super) fn rnr_retry(dev: H) {
    if let Some(c) = of(dev) {
        c.rnr_retries.fetch_add(1, Relaxed);
    }
}

/// A send-like task of a context on `dev` failed: receiver not ready, retries used up.
pub(super) fn rnr_failure(dev: H) {
    if let Some(c) = of(dev) {
        c.rnr_failures.fetch_add(1, Relaxed);
    }
}

/// The counters of the device named `ibdev_name` (`mlx5_0`), `None` for an unknown name.
pub fn counters(ibdev_name: &str) -> Option<Counters> {
    super::device::index_by_name(ibdev_name).map(|i| DEVICES[i].read())
}

/// An inventory handed out a buffer over an mmap of `dev`.
pub(super) fn buffer_taken(dev: H) {
    if let Some(c) = of(dev) {
        c.buffers_taken.fetch_add(1, Relaxed);
    }
}
