//! The long-lived memory handles a part keeps from its peers' connections: the service's from
//! each initiator connection (`init_storage`), a target's from each service connection
//! (`init`). Each I/O finds the handle of the connection it came on.

use std::sync::Mutex;

use rdma_rpc_core::{RemoteBuf, RemoteMemory, Status};

/// One handle per connection, at most `max` (the oldest go first: their connections have most
/// likely ended).
#[derive(Debug)]
pub struct ConnectionHandles {
    handles: Mutex<Vec<RemoteBuf>>,
    max: usize,
}

impl ConnectionHandles {
    /// Keeps at most `max` handles.
    pub fn new(max: usize) -> ConnectionHandles {
        ConnectionHandles {
            handles: Mutex::new(Vec::new()),
            max: max.max(1),
        }
    }

    /// Keeps `handle`, offered on the connection of `memory` (checked), in place of any
    /// earlier one of that connection.
    pub fn remember(&self, memory: &RemoteMemory, handle: RemoteBuf) -> Result<(), Status> {
        if !memory.holds(&handle) {
            return Err(Status::invalid_argument(
                "the memory was not offered on this connection",
            ));
        }
        let mut handles = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        handles.retain(|h| !memory.holds(h));
        if handles.len() >= self.max {
            handles.remove(0);
        }
        handles.push(handle);
        Ok(())
    }

    /// The handle offered on the connection of `memory`; `missing` says what to call first.
    pub fn of(&self, memory: &RemoteMemory, missing: &str) -> Result<RemoteBuf, Status> {
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|h| memory.holds(h))
            .cloned()
            .ok_or_else(|| {
                Status::failed_precondition(format!(
                    "no memory was offered on this connection: {missing}"
                ))
            })
    }
}
