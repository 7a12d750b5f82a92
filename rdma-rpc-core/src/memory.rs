//! Registered memory: owned, aligned buffers that transports can move bytes into and out of
//! without copies, and pools of them registered once.

// This file holds what the others share: the alignment and size limit of a registration, and
// `Access` rights. One concern a file: `registration` (one registered allocation, `Region`),
// `buf` (`RegisteredBuf`), `pool` (`BufferPool`), `staging` (the runtime's staging buffers),
// `region` (`MemoryRegion` and its leases) and `shared` (`SharedRegion`).

use std::fmt;
use std::ops::{BitOr, BitOrAssign};

mod buf;
mod pool;
mod region;
mod registration;
mod shared;
mod staging;

#[cfg_attr(not(feature = "doca"), allow(unused_imports))]
pub(crate) use buf::copy_between;
use buf::Recycle;
pub use buf::RegisteredBuf;
pub use pool::BufferPool;
pub(crate) use region::frozen_view;
pub use region::MemoryRegion;
pub(crate) use registration::Region;
pub(crate) use shared::{from_registered, into_registered};
pub use shared::{Buffer, SharedBuf, SharedRegion};
pub(crate) use staging::StagingPools;

/// Alignment of every registered buffer (a page, as RDMA registrations like).
pub const BUFFER_ALIGN: usize = 4096;

/// The largest buffer that can be registered (1 GiB).
pub const MAX_BUFFER: usize = 1 << 30;

/// Access rights of memory: what the local side and remote peers may do with it.
///
/// Mirrors DOCA's access flags (`DOCA_ACCESS_FLAG_*`) and verbs' `IBV_ACCESS_*`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// Local read only (no flags).
    pub const LOCAL_READ: Access = Access(0);
    /// Local read and write (receives write into local memory).
    pub const LOCAL_WRITE: Access = Access(1 << 0);
    /// Remote peers may RDMA-read.
    pub const REMOTE_READ: Access = Access(1 << 1);
    /// Remote peers may RDMA-write.
    pub const REMOTE_WRITE: Access = Access(1 << 2);
    /// Remote peers may run atomics.
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);
    /// Every right.
    pub const ALL: Access = Access(0b1111);

    /// The raw bits (the same values as DOCA's access flags).
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Access from raw bits; unknown bits are dropped.
    pub const fn from_bits_truncate(bits: u32) -> Access {
        Access(bits & Self::ALL.0)
    }

    /// Whether every right in `other` is in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Access) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Access::LOCAL_WRITE, "LOCAL_WRITE"),
            (Access::REMOTE_READ, "REMOTE_READ"),
            (Access::REMOTE_WRITE, "REMOTE_WRITE"),
            (Access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        ];
        let mut first = true;
        for (flag, name) in names {
            if self.contains(flag) {
                if !first {
                    f.write_str(" | ")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("LOCAL_READ")?;
        }
        Ok(())
    }
}
