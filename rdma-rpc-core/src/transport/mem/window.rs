//! The windows one end of an in-process connection granted: what the peer's one-sided
//! operations find by key, with rights and bounds checked here, on the target, and the handle
//! that revokes a window.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use bytes::Bytes;

use super::link::lock;
use crate::error::AccessViolation;
use crate::ids::IdMap;
use crate::memory::{Access, RegisteredBuf};
use crate::transport::{BoxFuture, Descriptor, Grant, Revoke, WindowHandle};

/// One granted range of one buffer.
struct Window {
    /// The buffer, `None` once revoked. Every access holds the lock for its whole copy, so a
    /// revocation that takes the buffer waits for the accesses in progress.
    buf: Mutex<Option<RegisteredBuf>>,
    /// Advertised address of the window's first byte.
    base: u64,
    len: u64,
    access: Access,
    /// Offset of the window in its buffer.
    offset: usize,
}

/// The windows of one end, by key.
pub(super) struct WindowTable {
    windows: Mutex<IdMap<u32, Arc<Window>>>,
    next_key: AtomicU32,
    key_salt: u32,
}

impl fmt::Debug for WindowTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowTable")
            .field("windows", &self.table().len())
            .finish()
    }
}

impl WindowTable {
    pub(super) fn new() -> Arc<WindowTable> {
        Arc::new(WindowTable {
            windows: Mutex::new(IdMap::default()),
            next_key: AtomicU32::new(1),
            key_salt: RandomState::new().hash_one(0u8) as u32,
        })
    }

    fn table(&self) -> MutexGuard<'_, IdMap<u32, Arc<Window>>> {
        lock(&self.windows)
    }

    /// Exposes `buf[offset..offset + len]` with `access` under a new key. The range and the
    /// rights were checked by the caller.
    pub(super) fn grant(
        self: &Arc<Self>,
        buf: RegisteredBuf,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Grant {
        let base = buf.addr() + offset as u64;
        // Never reused within a table's first 2^32 grants: a revoked key finds nothing.
        let rkey = self.next_key.fetch_add(1, Ordering::Relaxed) ^ self.key_salt;
        let window = Arc::new(Window {
            buf: Mutex::new(Some(buf)),
            base,
            len: len as u64,
            access,
            offset,
        });
        self.table().insert(rkey, window.clone());
        let descriptor = Descriptor {
            addr: base,
            len: len as u64,
            rkey,
            access,
            blob: Bytes::new(),
        };
        let handle = MemWindow {
            table: Arc::downgrade(self),
            rkey,
            window,
        };
        Grant::new(descriptor, Box::new(handle))
    }

    /// Forgets every window (the connection failed): later accesses find no key. Grants
    /// still give their buffers back.
    pub(super) fn clear(&self) {
        let windows = std::mem::take(&mut *self.table());
        // Buffers of dropped grants are freed here, outside the table's lock.
        drop(windows);
    }

    /// Runs `f` on bytes `[addr, addr + len)` of the window `rkey`, after checking that the
    /// window exists, grants `need` and contains the range. The window's buffer is locked for
    /// the duration of `f`.
    pub(super) fn access<T>(
        &self,
        rkey: u32,
        addr: u64,
        len: u64,
        need: Access,
        f: impl FnOnce(&mut RegisteredBuf, std::ops::Range<usize>) -> T,
    ) -> Result<T, AccessViolation> {
        let window = self
            .table()
            .get(&rkey)
            .cloned()
            .ok_or(AccessViolation::UnknownKey)?;
        if !window.access.contains(need) {
            return Err(AccessViolation::NotPermitted);
        }
        let start = addr
            .checked_sub(window.base)
            .ok_or(AccessViolation::OutOfBounds)?;
        let end = start.checked_add(len).ok_or(AccessViolation::OutOfBounds)?;
        if end > window.len {
            return Err(AccessViolation::OutOfBounds);
        }
        // Within the window, which lies within the buffer (checked at grant).
        let from = window.offset + start as usize;
        let to = window.offset + end as usize;
        let mut guard = lock(&window.buf);
        // Revoked after the lookup: the key is gone now.
        let buf = guard.as_mut().ok_or(AccessViolation::UnknownKey)?;
        Ok(f(buf, from..to))
    }
}

/// The transport half of an in-process [`Grant`].
struct MemWindow {
    table: Weak<WindowTable>,
    rkey: u32,
    window: Arc<Window>,
}

impl fmt::Debug for MemWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemWindow")
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("len", &self.window.len)
            .finish()
    }
}

impl Drop for MemWindow {
    fn drop(&mut self) {
        if let Some(table) = self.table.upgrade() {
            let removed = table.table().remove(&self.rkey);
            // An access in progress holds its own reference: the buffer goes when it ends.
            drop(removed);
        }
    }
}

impl WindowHandle for MemWindow {
    fn revoke(self: Box<Self>, _: Revoke) -> BoxFuture<'static, Option<RegisteredBuf>> {
        let window = self.window.clone();
        // Dropping the handle removes the key: no new access finds the window.
        drop(self);
        // Accesses that found it before copy synchronously under this lock; taking it waits
        // for them (one copy of at most `max_message` bytes).
        let buf = lock(&window.buf).take();
        Box::pin(std::future::ready(buf))
    }
}
