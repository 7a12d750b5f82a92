//! Per-connection write slots: server buffers a client may RDMA-write without asking first.
//!
//! When the first payload too large to travel inline arrives on a connection, the server
//! registers `write_slots` buffers of `slot_size` bytes for it, arms each with a write-only
//! window, and sends their descriptors with that call's response; a connection that only
//! makes small calls (or none) never holds them. A client with a payload that fits a free slot
//! writes it there and then sends a request naming the slot: one round trip instead of two.
//! The server takes the slot (revoking its window; over a transport that cannot revoke,
//! `Fencing::Unfenced`, the handler gets a copy instead, since the client could still write
//! the slot) and owes the client a new slot of the same index; it arms one as soon as a buffer
//! is free again and sends its descriptor in its next response.
//!
//! Which slots are armed and owed is the protocol state's (`protocol::slot_book`, kept by
//! `protocol::connection`); this file holds their memory and makes their windows.
//!
//! The buffers belong to this connection only: no other client ever gets a descriptor of
//! them, which is what keeps a peer from reaching another connection's data on transports
//! that cannot revoke a window (DOCA). A slot's old descriptor stays valid there, so only this
//! connection's own peer can write its slots, and only bytes the handler never sees.

use std::sync::OnceLock;

use crate::memory::{Access, BufferPool};
use crate::protocol::frames::DescriptorFrame;
use crate::transport::{Connection, Grant};

/// The memory of one connection's write slots.
pub(super) struct Slots {
    count: u32,
    size: usize,
    /// Registered when the connection first arms slots (`None`: registering failed, or the
    /// connection has none).
    pool: OnceLock<Option<BufferPool>>,
}

impl Slots {
    /// `count` slots of `size` bytes (none when either is 0), registered only once armed.
    pub(super) fn new(count: u32, size: usize) -> Slots {
        Slots {
            count,
            size,
            pool: OnceLock::new(),
        }
    }

    fn pool(&self) -> Option<&BufferPool> {
        self.pool
            .get_or_init(|| {
                if self.count == 0 || self.size == 0 {
                    return None;
                }
                let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
                match BufferPool::new(self.size, self.count as usize, access) {
                    Ok(pool) => Some(pool),
                    Err(e) => {
                        tracing::warn!(error = %e, "write slots not registered; payloads take the other paths");
                        None
                    }
                }
            })
            .as_ref()
    }

    /// A window of a free slot buffer, for the state to arm a slot with; `None` when no buffer
    /// is free.
    pub(super) fn window(&self, conn: &dyn Connection) -> Option<(Grant, DescriptorFrame)> {
        let pool = self.pool()?;
        let buf = pool.try_acquire()?;
        match conn.grant(buf, 0, pool.buf_size(), Access::REMOTE_WRITE) {
            Ok(grant) => {
                let descriptor = DescriptorFrame::from(grant.descriptor());
                Some((grant, descriptor))
            }
            Err(e) => {
                tracing::debug!(error = %e, "write slot not armed");
                None
            }
        }
    }
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("count", &self.count)
            .field("size", &self.size)
            .finish()
    }
}
