//! The long-lived memory handles a part keeps from its peers' connections: the service's from
//! each initiator connection (`init_storage`), a target's from each service connection
//! (`init`). Each I/O finds the handle of the connection it came on.
//!
//! A connection is served on one core's thread (a data path per core), and so are the calls
//! that name its handle: handles are kept per core, each list on cache lines of its own, so
//! that an I/O on one core never takes a line the other core's I/Os write (one shared list
//! behind one lock took that line from the other core on every I/O).

use std::sync::{Mutex, MutexGuard};

use rdma_rpc_core::{RemoteBuf, RemoteMemory, Status};

use super::cores::{own_index, Padded};

/// One handle per connection, at most `max` per core (the oldest go first: their connections
/// have most likely ended).
#[derive(Debug)]
pub struct ConnectionHandles {
    /// Per core, and last for threads that are no core's: the handles of the connections
    /// whose `init` ran there.
    lists: Box<[Padded<Mutex<Vec<RemoteBuf>>>]>,
    max: usize,
}

impl ConnectionHandles {
    /// Keeps at most `max` handles per core, for `cores` cores.
    pub fn new(max: usize, cores: usize) -> ConnectionHandles {
        ConnectionHandles {
            lists: (0..=cores).map(|_| Padded::default()).collect(),
            max: max.max(1),
        }
    }

    fn list(&self, i: usize) -> MutexGuard<'_, Vec<RemoteBuf>> {
        self.lists[i].0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The calling thread's list.
    fn own(&self) -> usize {
        own_index(self.lists.len() - 1)
    }

    /// Keeps `handle`, offered on the connection of `memory` (checked), in place of any
    /// earlier one of that connection, in the calling thread's list.
    pub fn remember(&self, memory: &RemoteMemory, handle: RemoteBuf) -> Result<(), Status> {
        if !memory.holds(&handle) {
            return Err(Status::invalid_argument(
                "the memory was not offered on this connection",
            ));
        }
        for i in 0..self.lists.len() {
            self.list(i).retain(|h| !memory.holds(h));
        }
        let mut handles = self.list(self.own());
        if handles.len() >= self.max {
            handles.remove(0);
        }
        handles.push(handle);
        Ok(())
    }

    /// The handle offered on the connection of `memory`; `missing` says what to call first.
    /// The calling thread's list first, where the connection's handle is unless its calls
    /// moved threads.
    pub fn of(&self, memory: &RemoteMemory, missing: &str) -> Result<RemoteBuf, Status> {
        let own = self.own();
        let others = (0..self.lists.len()).filter(|&i| i != own);
        std::iter::once(own)
            .chain(others)
            .find_map(|i| self.list(i).iter().find(|h| memory.holds(h)).cloned())
            .ok_or_else(|| {
                Status::failed_precondition(format!(
                    "no memory was offered on this connection: {missing}"
                ))
            })
    }
}
