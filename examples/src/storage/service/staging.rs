//! The service's staging memory: per lane (a data path per core), per transaction, a private
//! block area and three halves in memory shared and offered once to that lane's target
//! connections; the slots transactions take, where each half is, the copies to and from the
//! shared halves (whose bytes local code only copies, since the targets may write them), and
//! which bytes of a half carry data.
//!
//! Each lane has staging of its own, as each of the seed's data-path threads has its own
//! buffers: an I/O on one core takes its slot, leases its areas and counts its permits without
//! touching a line that an I/O on another core writes. With one staging for all lanes, its
//! free list, permits and the regions' lease tables moved between the two cores on every I/O.

use std::cell::RefCell;
use std::sync::{Arc, Mutex};

use rdma_rpc_core::{Access, MemoryRegion, RegionOffer, Share, SharedRegion, Status};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::super::codec::{HEADER_LEN, TRAILER_LEN};
use super::super::cores::PerCore;
use super::{describe, Service};
use crate::generated::storage_target::TargetInit;

/// The staging of every lane.
pub(super) struct StagingSet {
    /// Lane `k`'s staging, offered on lane `k`'s target connections only.
    pub(super) lanes: Vec<Arc<Staging>>,
    /// Transactions in flight it takes, all lanes together.
    pub(super) transactions: usize,
}

/// One lane's staging memory for the I/O in flight: per transaction, a private block area
/// (the initiator's block lands there, a read's block is decoded there) and three halves in
/// memory shared and offered once to the lane's connection to each target.
pub(super) struct Staging {
    /// The lane: the connection to each target that was offered these halves.
    pub(super) lane: usize,
    pub(super) blocks: MemoryRegion,
    halves: SharedRegion,
    /// The share and whole-region offer of `halves` per target, held while staging lives.
    _offers: Vec<(Share, RegionOffer)>,
    free: Mutex<Vec<usize>>,
    permits: Arc<Semaphore>,
    /// Slots taken, by the core thread that took them (all on the lane's own core, with a
    /// thread per core).
    pub(super) taken_on: PerCore,
}

/// A staging slot, back in the free list when dropped.
pub(super) struct StagingSlot<'a> {
    staging: &'a Staging,
    pub(super) index: usize,
    _permit: OwnedSemaphorePermit,
}

impl Drop for StagingSlot<'_> {
    fn drop(&mut self) {
        self.staging.free.lock().unwrap().push(self.index);
    }
}

impl Staging {
    pub(super) async fn slot(&self) -> StagingSlot<'_> {
        self.taken_on.count();
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("never closed");
        let index = self
            .free
            .lock()
            .unwrap()
            .pop()
            .expect("a permit means a free slot");
        StagingSlot {
            staging: self,
            index,
            _permit: permit,
        }
    }
}

/// A thread's three halves (see [`SCRATCH`]).
pub(super) struct Halves {
    pub(super) bytes: [Vec<u8>; 3],
    /// Per half, the bytes from its start that may be other than zero, the trailer apart: a
    /// half copied out of staging then zeroes only what its last use left beyond its data,
    /// not the whole rest of the shard (blocks compress alike, so usually nothing).
    pub(super) dirty: [usize; 3],
}

impl Halves {
    /// Each half `len` bytes long, and any byte of it possibly other than zero (after an
    /// encode, which writes them all).
    pub(super) fn written(&mut self, len: usize) {
        for (h, dirty) in self.bytes.iter_mut().zip(&mut self.dirty) {
            h.resize(len, 0);
            *dirty = len;
        }
    }
}

thread_local! {
    /// Per thread: the three halves a block encodes to, or the halves a read decodes from,
    /// before or after they are copied to or from the shared staging memory (whose bytes
    /// local code only copies, since the targets may write them).
    pub(super) static SCRATCH: RefCell<Halves> = const {
        RefCell::new(Halves { bytes: [Vec::new(), Vec::new(), Vec::new()], dirty: [0; 3] })
    };
}

impl Service {
    /// Staging for `n` transactions, split evenly over the lanes: each lane's halves memory
    /// shared with and offered once to that lane's connection to every target (one
    /// registration and export per connection, here and never per I/O), and each target
    /// told its handle.
    pub(super) async fn make_staging(&self, n: usize) -> Result<StagingSet, Status> {
        let lanes = self.links[0].lanes.len();
        let per_lane = n.div_ceil(lanes).max(1);
        let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
        let mut set = Vec::new();
        for lane in 0..lanes {
            let halves = SharedRegion::new(per_lane * 3 * self.half_size).map_err(Status::from)?;
            let mut offers = Vec::new();
            for link in &self.links {
                let to = &link.lanes[lane];
                let share = to.client.remote_memory().share(&halves, rw)?;
                let offer = share.offer_all(rw)?;
                let init = TargetInit {
                    memory: Some(offer.handle()),
                };
                tokio::time::timeout(self.config.control_timeout, to.stub.init(init))
                    .await
                    .unwrap_or_else(|_| {
                        Err(Status::deadline_exceeded("no answer (control_timeout)"))
                    })
                    .map_err(|s| {
                        Status::unavailable(format!(
                            "the {} target did not take the staging memory: {}",
                            link.slot,
                            describe(&s)
                        ))
                    })?;
                offers.push((share, offer));
            }
            set.push(Arc::new(Staging {
                lane,
                blocks: MemoryRegion::new(per_lane * self.block_size).map_err(Status::from)?,
                halves,
                _offers: offers,
                free: Mutex::new((0..per_lane).collect()),
                permits: Arc::new(Semaphore::new(per_lane)),
                taken_on: PerCore::new(lanes),
            }));
        }
        Ok(StagingSet {
            lanes: set,
            transactions: per_lane * lanes,
        })
    }

    /// Where half `h` (0 data 1, 1 data 2, 2 parity) of staging slot `slot` is in the shared
    /// staging memory.
    pub(super) fn half_offset(&self, slot: usize, h: usize) -> usize {
        (slot * 3 + h) * self.half_size
    }

    /// Copies half `h` of staging slot `slot` out of the shared staging memory into `dst`:
    /// its first `used` bytes and, staged right after them, its trailer, which goes to the
    /// end of `dst`, with zeros between (what a target moves, in one operation). `dirty` is
    /// how far from its start `dst` may hold bytes other than zero (0 for a new `Vec`); it
    /// becomes `used`.
    pub(super) fn copy_half_out(
        &self,
        staging: &Staging,
        slot: usize,
        h: usize,
        used: usize,
        dst: &mut Vec<u8>,
        dirty: &mut usize,
    ) -> Result<(), Status> {
        let trailer = self.half_size - TRAILER_LEN;
        if dst.len() != self.half_size {
            // A half of another size is made anew: all zeros but what is copied below.
            dst.clear();
            dst.resize(self.half_size, 0);
            *dirty = 0;
        }
        let half = staging
            .halves
            .lease(self.half_offset(slot, h), self.half_size)
            .map_err(Status::from)?;
        half.read_at(0, &mut dst[..used]).map_err(Status::from)?;
        zero_after(&mut dst[..trailer], used, dirty);
        half.read_at(used, &mut dst[trailer..])
            .map_err(Status::from)
    }

    /// Copies an encoded half into half `h` of staging slot `slot`: the bytes a target will
    /// take, in one operation (the first `used`, and the trailer right after them).
    pub(super) fn copy_half_in(
        &self,
        staging: &Staging,
        slot: usize,
        h: usize,
        used: usize,
        bytes: &[u8],
    ) -> Result<(), Status> {
        let trailer = self.half_size - TRAILER_LEN;
        let mut half = staging
            .halves
            .lease(self.half_offset(slot, h), self.half_size)
            .map_err(Status::from)?;
        half.write_at(0, &bytes[..used]).map_err(Status::from)?;
        half.write_at(used, &bytes[trailer..]).map_err(Status::from)
    }
}

/// Makes `shard[used..]` zeros, given that only its first `*dirty` bytes may be other than
/// zero; the first `used` bytes may now be: `*dirty` becomes `used`.
fn zero_after(shard: &mut [u8], used: usize, dirty: &mut usize) {
    let end = (*dirty).min(shard.len());
    if end > used {
        shard[used..end].fill(0);
    }
    *dirty = used;
}

/// How many bytes of each shard (data 1, data 2, parity) of a half of `half_size` bytes carry
/// data, for a block whose payload took `payload_len` bytes: the stream (header, payload) fills
/// data 1 first, then data 2; the rest of each shard is zeros, and the parity (data 1 XOR
/// data 2) has no more than data 1. Only these bytes and each half's trailer need to move.
pub fn shards_used(half_size: usize, payload_len: usize) -> [usize; 3] {
    let shard = half_size - TRAILER_LEN;
    let stream = HEADER_LEN + payload_len;
    let data1 = stream.min(shard);
    [data1, stream.saturating_sub(shard).min(shard), data1]
}

#[cfg(test)]
mod tests {
    use super::{shards_used, zero_after};

    /// A shard reused for halves of different lengths is zeros past each one's data, and only
    /// what the last one left is zeroed.
    #[test]
    fn a_reused_shard_is_zeros_past_its_data() {
        let mut shard = vec![0u8; 64];
        let mut dirty = 0;
        for used in [40, 10, 10, 50, 0, 64, 5] {
            let before = dirty;
            // What a copy out of staging puts at the front.
            shard[..used].fill(0xab);
            zero_after(&mut shard, used, &mut dirty);
            assert_eq!(dirty, used);
            assert!(
                shard[..used].iter().all(|&b| b == 0xab),
                "data kept (used {used})"
            );
            assert!(
                shard[used..].iter().all(|&b| b == 0),
                "zeros past {used} bytes after a half of {before}"
            );
        }
        // A shard whose bytes are unknown (after an encode) is zeroed whole past the data.
        let mut shard = vec![0x11u8; 64];
        let mut dirty = 64;
        zero_after(&mut shard, 8, &mut dirty);
        assert!(shard[8..].iter().all(|&b| b == 0));
    }
    use crate::storage::codec::{encode, stored_half_size, TRAILER_LEN};

    /// Past the bytes `shards_used` names, every shard of a half is zeros, for blocks that
    /// compress well, not at all, and in between, of several sizes: moving only those bytes
    /// and the trailer loses nothing.
    #[test]
    fn only_the_used_bytes_of_a_shard_are_not_zero() {
        let mut x = 0x1234_5678_9abc_def1u64;
        for block_size in [512usize, 4096, 65536, 1 << 20] {
            let half = stored_half_size(block_size).unwrap();
            for noise in [0usize, 1, 4, 8] {
                let block: Vec<u8> = (0..block_size)
                    .map(|i| {
                        if i % 8 < noise {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            x as u8
                        } else {
                            (i / 64) as u8
                        }
                    })
                    .collect();
                let encoded = encode(3, &block, block_size).unwrap();
                let used = shards_used(half, encoded.compressed_len);
                for (h, bytes) in [&encoded.data1, &encoded.data2, &encoded.parity]
                    .into_iter()
                    .enumerate()
                {
                    assert!(
                        bytes[used[h]..half - TRAILER_LEN].iter().all(|&b| b == 0),
                        "block {block_size}, noise {noise}/8, half {h}: data past {}",
                        used[h]
                    );
                }
            }
        }
    }
}
