//! Registration of [`Region`]s with DOCA: one mmap per region and set of rights, made on
//! first use and cached in the region's registration slot, so nothing is registered per
//! request.

use std::sync::{Arc, Mutex};

use super::sys::{Device, Mmap};
use crate::error::{Error, Result};
use crate::memory::{Access, Region, RegisteredBuf};

/// What a region keeps in its registration slot.
struct DocaRegistration {
    dev: Arc<Device>,
    /// At most one mmap per access mask (16 possible masks), each exported once if it grants
    /// remote rights.
    mmaps: Mutex<Vec<(u32, Arc<Mmap>)>>,
}

/// The mmap of `buf`'s region with exactly `access` (DOCA's access flags have the same bits
/// as [`Access`]).
pub(super) fn mmap_for(
    dev: &Arc<Device>,
    buf: &RegisteredBuf,
    access: Access,
) -> Result<Arc<Mmap>> {
    mmap_of(dev, buf.region(), access)
}

/// The mmap of `region` with exactly `access`, made (registered) the first time it is asked.
pub(super) fn mmap_of(
    dev: &Arc<Device>,
    region: &Arc<Region>,
    access: Access,
) -> Result<Arc<Mmap>> {
    let reg = region.registration(|| {
        Ok(DocaRegistration {
            dev: dev.clone(),
            mmaps: Mutex::new(Vec::new()),
        })
    })?;
    if !Arc::ptr_eq(&reg.dev, dev) {
        return Err(Error::InvalidArgument(format!(
            "this buffer is registered with DOCA device {}, not {}",
            reg.dev.info().name,
            dev.info().name
        )));
    }
    let mut mmaps = reg.mmaps.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, m)) = mmaps.iter().find(|(bits, _)| *bits == access.bits()) {
        return Ok(m.clone());
    }
    // The whole region, whatever part of it `buf` is: every view of a region shares its mmap.
    // SAFETY: the region's allocation (at least one byte, hence `max(1)`) lives as long as the
    // region, which owns the registration slot that keeps this mmap.
    let mmap = unsafe {
        Mmap::local(
            dev,
            region.ptr_at(0),
            region.capacity().max(1),
            access.bits(),
        )
    }?;
    if !mmap.export().is_empty() {
        // Exported: whoever gets the blob can reach these bytes until the region is freed.
        region.expose();
    }
    let mmap = Arc::new(mmap);
    mmaps.push((access.bits(), mmap.clone()));
    Ok(mmap)
}
