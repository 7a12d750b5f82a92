//! Per-connection write slots: server buffers a client may RDMA-write without asking first.
//!
//! When the first payload too large to travel inline arrives on a connection, the server
//! registers `write_slots` buffers of `slot_size` bytes for it, arms each with a write-only
//! window, and sends their descriptors with that call's response; a connection that only
//! makes small calls (or none) never holds them. A client with a payload
//! that fits a free slot writes it there and then sends a request naming the slot: one round
//! trip instead of two. The server takes the slot (revoking its window; over a transport that
//! cannot revoke, `Fencing::Unfenced`, the handler gets a copy instead, since the client could
//! still write the slot) and owes the client a new slot of the same index; it arms
//! one as soon as a buffer is free again and sends its descriptor in its next response.
//!
//! The buffers belong to this connection only: no other client ever gets a descriptor of
//! them, which is what keeps a peer from reaching another connection's data on transports
//! that cannot revoke a window (DOCA). A slot's old descriptor stays valid there, so only this
//! connection's own peer can write its slots, and only bytes the handler never sees.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::memory::{Access, BufferPool};
use crate::protocol::frames::{DescriptorFrame, SlotFrame};
use crate::protocol::slot_book::{SlotBook, SlotRefusal};
use crate::status::Status;
use crate::transport::{Connection, Grant};

/// The write slots of one connection.
pub(super) struct Slots {
    count: u32,
    size: usize,
    /// Registered when the connection first needs slots (`None`: registering failed, or
    /// the connection has none).
    pool: OnceLock<Option<BufferPool>>,
    /// A payload too large to travel inline came: slots would have saved a round trip.
    wanted: AtomicBool,
    /// Which slots are armed and which are owed (the rules, without I/O).
    book: Mutex<SlotBook<Grant>>,
}

impl Slots {
    /// `count` slots of `size` bytes (none when either is 0), registered only once wanted.
    pub(super) fn new(count: u32, size: usize) -> Slots {
        Slots {
            count,
            size,
            pool: OnceLock::new(),
            wanted: AtomicBool::new(false),
            book: Mutex::new(SlotBook::new(count)),
        }
    }

    /// The client sent a payload too large to travel inline: arm the slots with the next
    /// response.
    pub(super) fn want(&self) {
        self.wanted.store(true, Ordering::Relaxed);
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

    fn book(&self) -> std::sync::MutexGuard<'_, SlotBook<Grant>> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the slot a request names, holding `len` bytes.
    pub(super) fn take(&self, index: u32, len: u64) -> std::result::Result<Grant, Status> {
        let taken = self.book().take(index, len, |grant| grant.descriptor().len);
        // A refused slot's window (too small for the payload) is dropped here, which revokes it.
        taken.map_err(|(refusal, _window)| match refusal {
            SlotRefusal::NotArmed { index } => Status::invalid_argument(format!(
                "write slot {index} is not armed (never announced, or already used)"
            )),
            SlotRefusal::TooSmall { index, len, size } => Status::invalid_argument(format!(
                "{len} bytes announced in write slot {index} of {size} bytes"
            )),
        })
    }

    /// Arms owed slots for which a buffer is free, as long as their descriptors fit in `room`
    /// bytes of a frame.
    pub(super) fn arm(&self, conn: &dyn Connection, mut room: usize) -> Vec<SlotFrame> {
        if !self.wanted.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let Some(pool) = self.pool() else {
            return Vec::new();
        };
        let mut armed = Vec::new();
        let mut book = self.book();
        while let Some(index) = book.next_owed() {
            let Some(buf) = pool.try_acquire() else { break };
            let size = pool.buf_size();
            let grant = match conn.grant(buf, 0, size, Access::REMOTE_WRITE) {
                Ok(grant) => grant,
                Err(e) => {
                    tracing::debug!(error = %e, "write slot not armed");
                    break;
                }
            };
            let frame = SlotFrame {
                index,
                window: Some(DescriptorFrame::from(grant.descriptor())),
            };
            // A repeated field costs its tag and a length prefix besides the message.
            let cost = prost::Message::encoded_len(&frame) + 4;
            if cost > room {
                break; // the grant is dropped, and with it the window
            }
            room -= cost;
            book.armed(grant);
            armed.push(frame);
        }
        armed
    }
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (armed, owed) = self.book().counts();
        f.debug_struct("Slots")
            .field("armed", &armed)
            .field("owed", &owed)
            .finish()
    }
}

/// Shared by the connection loop and its calls.
pub(super) type SharedSlots = Arc<Slots>;
