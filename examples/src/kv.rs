//! An in-memory implementation of the generated `KvStore` service (`specs/kv_store.yaml`):
//! blocks are written and read by RDMA, control and statistics are small messages.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use rdma_rpc_core::{RegisteredBuf, Request, Status};
use tokio::sync::watch;

use crate::generated::kv_store::{
    Action, ClientStats, ControlCommand, GetBlockRequest, GetBlockResponse, KvStore,
    PutBlockRequest, PutBlockResponse, Stats, Status as BlockStatus,
};

#[derive(Debug, Default)]
struct State {
    blocks: HashMap<Vec<u8>, (u64, Bytes)>,
    per_client: HashMap<String, (u64, u64)>,
}

/// Holds every `put_block` of the stores it is given to until it is opened (to show
/// deadlines at work, with no guess at how long anything takes).
#[derive(Debug, Clone)]
pub struct PutGate {
    open: Arc<watch::Sender<bool>>,
    arrived: Arc<watch::Sender<usize>>,
}

impl Default for PutGate {
    fn default() -> Self {
        PutGate {
            open: Arc::new(watch::channel(false).0),
            arrived: Arc::new(watch::channel(0).0),
        }
    }
}

impl PutGate {
    /// A closed gate.
    pub fn new() -> PutGate {
        PutGate::default()
    }

    /// Lets every put through, those waiting and those to come.
    pub fn open(&self) {
        self.open.send_replace(true);
    }

    /// Waits until `n` puts have reached the gate.
    pub async fn arrived(&self, n: usize) {
        let _ = self.arrived.subscribe().wait_for(|a| *a >= n).await;
    }

    async fn pass(&self) {
        self.arrived.send_modify(|a| *a += 1);
        let _ = self.open.subscribe().wait_for(|open| *open).await;
    }
}

/// Blocks in memory, with versions.
#[derive(Debug)]
pub struct MemoryKv {
    state: Mutex<State>,
    started: Instant,
    capacity: usize,
    put_gate: Option<PutGate>,
}

impl MemoryKv {
    /// A store that holds at most `capacity` blocks.
    pub fn new(capacity: usize) -> MemoryKv {
        MemoryKv {
            state: Mutex::new(State::default()),
            started: Instant::now(),
            capacity,
            put_gate: None,
        }
    }

    /// Makes every `put_block` wait at `gate` until it is opened.
    pub fn with_put_gate(mut self, gate: PutGate) -> MemoryKv {
        self.put_gate = Some(gate);
        self
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn client_of<T>(request: &Request<T>) -> String {
    request.peer().unwrap_or("unknown").to_owned()
}

impl KvStore for MemoryKv {
    async fn put_block(
        &self,
        request: Request<PutBlockRequest>,
        data: Bytes,
    ) -> Result<PutBlockResponse, Status> {
        let client = client_of(&request);
        let req = request.into_inner();
        if let Some(gate) = &self.put_gate {
            gate.pass().await;
        }
        if req.length as usize != data.len() {
            return Err(Status::invalid_argument(format!(
                "length says {} bytes, {} arrived",
                req.length,
                data.len()
            )));
        }
        let mut state = self.state();
        state.per_client.entry(client).or_default().0 += 1;
        let full = state.blocks.len() >= self.capacity && !state.blocks.contains_key(&req.key);
        let mut response = PutBlockResponse::default();
        if full {
            response.set_status(BlockStatus::NoSpace);
            return Ok(response);
        }
        let entry = state.blocks.entry(req.key).or_insert((0, Bytes::new()));
        entry.0 += 1;
        // A copy: `data` is a lease of one of the path's pooled buffers, and a store that
        // kept it would hold every buffer after a few puts.
        entry.1 = Bytes::copy_from_slice(&data);
        response.version = entry.0;
        Ok(response)
    }

    async fn get_block(
        &self,
        request: Request<GetBlockRequest>,
        buf: &mut RegisteredBuf,
    ) -> Result<GetBlockResponse, Status> {
        let client = client_of(&request);
        let req = request.into_inner();
        let mut state = self.state();
        state.per_client.entry(client).or_default().1 += 1;
        let mut response = GetBlockResponse::default();
        match state.blocks.get(&req.key) {
            None => response.set_status(BlockStatus::NotFound),
            Some((version, _)) if req.min_version.is_some_and(|min| *version < min) => {
                response.set_status(BlockStatus::Stale);
                response.version = *version;
            }
            Some((version, data)) => {
                buf.fill_from(data).map_err(Status::from)?;
                response.length = data.len() as u32;
                response.version = *version;
            }
        }
        Ok(response)
    }

    async fn control(&self, request: Request<ControlCommand>) -> Result<(), Status> {
        let command = request.into_inner();
        if command.action() == Action::Evict {
            let mut state = self.state();
            if command.keys.is_empty() {
                state.blocks.clear();
            }
            for key in &command.keys {
                state.blocks.remove(key);
            }
        }
        Ok(())
    }

    async fn stats(&self, _: Request<()>) -> Result<Stats, Status> {
        let state = self.state();
        Ok(Stats {
            blocks: state.blocks.len() as u64,
            bytes_stored: state.blocks.values().map(|(_, d)| d.len() as u64).sum(),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            per_client: state
                .per_client
                .iter()
                .map(|(client, (puts, gets))| ClientStats {
                    client_id: client.clone(),
                    puts: *puts,
                    gets: *gets,
                })
                .collect(),
        })
    }
}
