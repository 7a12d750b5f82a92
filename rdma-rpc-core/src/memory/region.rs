//! User memory registered once: a [`MemoryRegion`] the application owns, and leases of its
//! byte ranges that calls and one-sided operations use in place, with no staging copy.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use bytes::Bytes;

use super::{Access, Recycle, Region, RegisteredBuf};
use crate::error::{Error, Result};

/// Memory an application registers once and reuses: a block cache, an I/O arena, the buffers
/// of a storage initiator.
///
/// Its bytes are reached through leases: [`lease`](Self::lease) hands out a byte range as a
/// [`RegisteredBuf`] (a view of the region, no copy), which calls send from and read into
/// and which can be offered to a peer as a remote buffer (`Client::offer`). Leases never
/// overlap, so no two owners can touch the same bytes; dropping a lease returns its range.
/// The bytes keep their contents between leases.
///
/// On DOCA the region is registered as one mmap (per set of rights), made the first time a
/// lease of it is used on a connection; nothing is registered per call. Cheap to clone: clones
/// share the memory.
#[derive(Clone)]
pub struct MemoryRegion {
    leases: Arc<Leases>,
}

pub(super) struct Leases {
    region: Arc<Region>,
    /// Leased ranges, `start -> end`, by start: a lease checks and a drop finds its range in
    /// logarithmic time however many are held (a list scanned on every lease made taking
    /// 50,000 of them a quadratic 0.9 s). Empty ranges cover no byte and are not kept.
    taken: Mutex<BTreeMap<usize, usize>>,
}

/// The live memory regions by address, so that bytes frozen from a lease are recognised as
/// registered memory (and sent without a staging copy). Applications have few regions.
static REGIONS: Mutex<BTreeMap<u64, (u64, Weak<Region>)>> = Mutex::new(BTreeMap::new());

fn regions() -> MutexGuard<'static, BTreeMap<u64, (u64, Weak<Region>)>> {
    REGIONS.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for Leases {
    fn drop(&mut self) {
        regions().remove(&self.region.addr());
    }
}

/// Keeps frozen bytes (and so their lease) alive while a view of them is in use.
struct KeepBytes(#[allow(dead_code)] Bytes);

impl Recycle for KeepBytes {
    fn give_back(&self, _: Arc<Region>, _: usize, _: usize) {}
}

/// A read-only view of `bytes` when they lie in a lease of a [`MemoryRegion`] (they were made
/// by [`RegisteredBuf::freeze`] of a lease, or are a slice of such bytes): registered memory
/// that can be sent as it is. The view keeps `bytes` alive, and with them the lease.
///
/// Only for sources of sends and writes: the bytes are frozen, nothing may write them, and the
/// view says so in its type's terms: it is read-only (its access has no write right, so no
/// transport posts a receive, a read or a writable window over it, and its mutable accessors
/// refuse it).
pub(crate) fn frozen_view(bytes: &Bytes) -> Option<RegisteredBuf> {
    if bytes.is_empty() {
        return None;
    }
    let at = bytes.as_ptr() as u64;
    let end = at.checked_add(bytes.len() as u64)?;
    let region = {
        let map = regions();
        let (&base, (len, region)) = map.range(..=at).next_back()?;
        if end > base + len {
            return None;
        }
        region.upgrade()?
    };
    // Frozen bytes of a lease: the lease is held by their owner for as long as they live,
    // so the range is still the region's and nobody writes it.
    let start = (at - region.addr()) as usize;
    Some(RegisteredBuf {
        region,
        start,
        capacity: bytes.len(),
        len: bytes.len(),
        read_only: true,
        pool: Some(Arc::new(KeepBytes(bytes.clone())) as Arc<dyn Recycle>),
    })
}

impl Leases {
    pub(super) fn new(region: Arc<Region>) -> Arc<Leases> {
        Arc::new(Leases {
            region,
            taken: Mutex::new(BTreeMap::new()),
        })
    }

    pub(super) fn region(&self) -> &Arc<Region> {
        &self.region
    }

    fn taken(&self) -> MutexGuard<'_, BTreeMap<usize, usize>> {
        self.taken.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes currently leased.
    pub(super) fn leased(&self) -> usize {
        self.taken().iter().map(|(s, e)| e - s).sum()
    }

    /// A buffer over `[offset, offset + len)` of the region, if that range is in it and free.
    pub(super) fn lease(
        self: &Arc<Self>,
        offset: usize,
        len: usize,
        what: &str,
    ) -> Result<RegisteredBuf> {
        let end = offset
            .checked_add(len)
            .filter(|&end| end <= self.region.capacity())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "range {offset}+{len} outside a {what} of {} bytes",
                    self.region.capacity()
                ))
            })?;
        let mut taken = self.taken();
        // Held ranges never overlap, so of those starting before `end` the last one ends
        // last: the range overlaps a held one only if it overlaps that one.
        if let Some((s, e)) = taken.range(..end).next_back().filter(|&(_, &e)| offset < e) {
            return Err(Error::InvalidArgument(format!(
                "bytes {offset}..{end} of the {what} overlap bytes {s}..{e}, which are \
                 still leased (drop that buffer, or revoke its offer, first)"
            )));
        }
        if end > offset {
            taken.insert(offset, end);
        }
        Ok(RegisteredBuf {
            region: self.region.clone(),
            start: offset,
            capacity: len,
            len,
            read_only: false,
            pool: Some(self.clone() as Arc<dyn Recycle>),
        })
    }
}

impl Recycle for Leases {
    fn give_back(&self, _: Arc<Region>, start: usize, capacity: usize) {
        let mut taken = self.taken();
        if taken.get(&start) == Some(&(start + capacity)) {
            taken.remove(&start);
        }
    }
}

impl MemoryRegion {
    /// Allocates and registers `len` zeroed bytes (at most [`MAX_BUFFER`](super::MAX_BUFFER)),
    /// with every right: which of them a peer gets is decided per offer.
    pub fn new(len: usize) -> Result<MemoryRegion> {
        let region = Region::new(len, Access::ALL)?;
        regions().insert(region.addr(), (len as u64, Arc::downgrade(&region)));
        Ok(MemoryRegion {
            leases: Leases::new(region),
        })
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.leases.region.capacity()
    }

    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes currently leased.
    pub fn leased(&self) -> usize {
        self.leases.leased()
    }

    /// Leases `len` bytes at `offset`: a buffer over exactly those bytes, holding them (its
    /// data length is `len`). Fails if the range leaves the region or overlaps a range still
    /// leased; the range is free again when the buffer (or the `Bytes` it was frozen into) is
    /// dropped.
    pub fn lease(&self, offset: usize, len: usize) -> Result<RegisteredBuf> {
        self.leases.lease(offset, len, "memory region")
    }
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.leases.region.addr()))
            .field("len", &self.len())
            .field("leased", &self.leased())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_views_that_keep_the_bytes() {
        let region = MemoryRegion::new(1 << 16).unwrap();
        let mut a = region.lease(4096, 16).unwrap();
        assert_eq!((a.len(), a.capacity()), (16, 16));
        a.as_mut_slice().copy_from_slice(&[7; 16]);
        assert_eq!(
            a.addr(),
            region.leases.region.addr() + 4096,
            "no copy: a view"
        );
        drop(a);
        let b = region.lease(4096 + 8, 8).unwrap();
        assert_eq!(b.as_slice(), &[7; 8], "the bytes outlive the lease");
    }

    #[test]
    fn overlapping_leases_are_refused_until_the_first_is_dropped() {
        let region = MemoryRegion::new(1024).unwrap();
        let a = region.lease(100, 100).unwrap();
        let _before = region.lease(0, 100).unwrap();
        let _after = region.lease(200, 100).unwrap();
        for (offset, len) in [(150, 10), (50, 60), (199, 1), (0, 1024)] {
            let err = region.lease(offset, len).unwrap_err();
            assert!(err.to_string().contains("still leased"), "{err}");
        }
        assert_eq!(region.leased(), 300);
        drop(a);
        assert_eq!(region.leased(), 200);
        region.lease(150, 10).unwrap();
    }

    proptest::proptest! {
        /// Any sequence of leases and drops: a lease is granted exactly when its range
        /// overlaps no held lease (empty ranges overlap nothing, but not inside another
        /// lease either), and the bytes leased are those of the leases held.
        #[test]
        fn leases_are_granted_as_a_list_of_held_ranges_says(
            steps in proptest::collection::vec((0usize..300, 0usize..40, proptest::bool::ANY), 1..200)
        ) {
            let region = MemoryRegion::new(256).unwrap();
            let mut held: Vec<(usize, usize, RegisteredBuf)> = Vec::new();
            for (offset, len, take) in steps {
                if !take && !held.is_empty() {
                    held.swap_remove(offset % held.len());
                } else {
                    let end = offset + len;
                    // An empty range overlaps nothing, and is refused only strictly inside
                    // a held range.
                    let overlaps = |s: usize, e: usize| {
                        s < e && if len == 0 { s < offset && offset < e } else { offset < e && s < end }
                    };
                    let free = end <= 256 && !held.iter().any(|&(s, e, _)| overlaps(s, e));
                    match region.lease(offset, len) {
                        Ok(buf) => {
                            proptest::prop_assert!(free, "{offset}+{len} granted over {:?}",
                                held.iter().map(|h| (h.0, h.1)).collect::<Vec<_>>());
                            held.push((offset, end, buf));
                        }
                        Err(e) => proptest::prop_assert!(!free, "{offset}+{len} refused: {e}"),
                    }
                }
                proptest::prop_assert_eq!(region.leased(), held.iter().map(|h| h.1 - h.0).sum::<usize>());
            }
        }
    }

    #[test]
    fn fifty_thousand_leases_are_held_and_given_back() {
        // Not timed (the ordered map makes each lease and drop logarithmic; a list made
        // these 50,000 a quadratic 0.9 s): the table stays right at that size.
        let region = MemoryRegion::new(50_000 * 8).unwrap();
        let leases: Vec<_> = (0..50_000)
            .map(|i| region.lease(i * 8, 8).unwrap())
            .collect();
        assert_eq!(region.leased(), 400_000);
        assert!(region.lease(4, 8).is_err());
        drop(leases);
        assert_eq!(region.leased(), 0);
        region.lease(0, 400_000).unwrap();
    }

    #[test]
    fn ranges_outside_the_region_are_refused() {
        let region = MemoryRegion::new(1024).unwrap();
        for (offset, len) in [(1000, 25), (1025, 0), (usize::MAX, 2)] {
            let err = region.lease(offset, len).unwrap_err();
            assert!(err.to_string().contains("outside"), "{err}");
        }
        region.lease(1000, 24).unwrap();
    }

    #[test]
    fn frozen_leases_are_recognised_as_registered_memory() {
        let region = MemoryRegion::new(1 << 16).unwrap();
        let mut lease = region.lease(4096, 1000).unwrap();
        lease.as_mut_slice().fill(9);
        let bytes = lease.freeze();
        let view = frozen_view(&bytes).expect("a lease");
        assert_eq!(
            (view.addr(), view.len()),
            (region.leases.region.addr() + 4096, 1000)
        );
        drop(view);
        let part = bytes.slice(100..200);
        let view = frozen_view(&part).expect("a slice of a lease");
        assert_eq!(
            (view.addr(), view.as_slice()),
            (region.leases.region.addr() + 4196, &[9u8; 100][..])
        );
        drop((bytes, part));
        assert_eq!(region.leased(), 1000, "the view keeps the lease");
        drop(view);
        assert_eq!(region.leased(), 0);
        assert!(
            frozen_view(&Bytes::from(vec![1u8; 64])).is_none(),
            "plain bytes"
        );
        assert!(frozen_view(&Bytes::new()).is_none());
        let gone = {
            let other = MemoryRegion::new(4096).unwrap();
            other.leases.region.addr()
        };
        assert!(
            regions().get(&gone).is_none(),
            "a dropped region is forgotten"
        );
    }

    #[test]
    fn a_frozen_lease_holds_its_range_until_the_bytes_go() {
        let region = MemoryRegion::new(64).unwrap();
        let bytes = region.lease(0, 32).unwrap().freeze();
        assert!(region.lease(0, 1).is_err());
        drop(bytes);
        assert!(region.lease(0, 1).is_ok());
    }
}
