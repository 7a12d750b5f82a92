//! The routing table: which service, endpoint and buffer pool a request's path and operation
//! name, and the calls of each path that hold a pool buffer.

use std::collections::HashMap;
use std::sync::Arc;

use super::ServerConfig;
use crate::error::{Error, Result};
use crate::memory::{Access, BufferPool};
use crate::service::{EndpointDef, OpKind, Service};

/// Where calls for one (path, operation) go. Shared by the route's calls (one reference
/// each, not one per part).
pub(crate) struct Route {
    pub(crate) service: Arc<dyn Service>,
    pub(crate) index: usize,
    pub(crate) endpoint: EndpointDef,
    pub(crate) pool: BufferPool,
    /// The path's place among the server's paths (0 up to their count): what a connection's
    /// per-path state is indexed by, with no hashing per call.
    pub(crate) path_index: usize,
    /// The calls of the path holding (or taking) one of `pool`'s buffers.
    pub(crate) holders: Holders,
    /// The endpoint's metrics series.
    pub(crate) metrics: crate::observe::ServerEndpoint,
}

/// The calls of one path that hold one of its pool buffers, or are taking one. Tells a pool
/// drained by calls in flight (worth waiting for) from one drained by handlers that returned
/// and kept their `data` (not worth waiting for: nothing gives a buffer back).
#[derive(Clone, Default)]
pub(crate) struct Holders(Arc<std::sync::atomic::AtomicUsize>);

/// One holder, counted until dropped.
pub(crate) struct Holding(Arc<std::sync::atomic::AtomicUsize>);

impl Holders {
    pub(crate) fn enter(&self) -> Holding {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Holding(self.0.clone())
    }

    pub(crate) fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The routing table: path → operations, with one buffer pool per path (the operations of a
/// path share its buffers, as in doca-cpp).
pub(crate) struct Routes {
    /// By path, as its bytes: a request's path is looked up as it came, valid UTF-8 or not.
    paths: crate::protocol::PathMap<[Option<Arc<Route>>; 4]>,
}

fn op_slot(op: OpKind) -> usize {
    op.as_u32() as usize - 1
}

impl Routes {
    /// How many paths (a route's [`path_index`](Route::path_index) is below it).
    pub(super) fn path_count(&self) -> usize {
        self.paths.len()
    }

    /// Every path's pool, once each.
    pub(super) fn pools(&self) -> Vec<&BufferPool> {
        let mut pools: Vec<&BufferPool> = Vec::new();
        for route in self.paths.values().flatten().flatten() {
            if !pools.iter().any(|p| p.same_pool(&route.pool)) {
                pools.push(&route.pool);
            }
        }
        pools
    }

    pub(super) fn build(services: &[Arc<dyn Service>], config: &ServerConfig) -> Result<Routes> {
        if services.is_empty() {
            return Err(Error::InvalidArgument(
                "the server has no service: call add_service first".into(),
            ));
        }
        let mut sizes: HashMap<&'static str, u64> = HashMap::new();
        let mut owner: HashMap<(&'static str, OpKind), &'static str> = HashMap::new();
        for service in services {
            for ep in service.endpoints() {
                ep.check().map_err(Error::InvalidArgument)?;
                if let Some(first) = owner.insert((ep.path, ep.op), service.name()) {
                    return Err(Error::InvalidArgument(format!(
                        "endpoint {} {} is registered twice (services {first} and {})",
                        ep.op,
                        ep.path,
                        service.name()
                    )));
                }
                if ep.buffer_size > crate::memory::MAX_BUFFER as u64 {
                    return Err(Error::LimitExceeded {
                        limit: "buffer_size",
                        max: crate::memory::MAX_BUFFER as u64,
                        actual: ep.buffer_size,
                    });
                }
                let size = sizes.entry(ep.path).or_default();
                *size = (*size).max(ep.buffer_size);
            }
        }
        let mut pools = HashMap::new();
        let mut holders: HashMap<&'static str, Holders> = HashMap::new();
        for (path_index, (path, size)) in sizes.iter().enumerate() {
            let count = (config.pool_budget / (*size).max(1) as usize)
                .clamp(config.min_buffers.max(1), config.max_buffers.max(1));
            let access = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
            let pool = BufferPool::new(*size as usize, count, access)?;
            pool.observe(path);
            pools.insert(*path, (pool, path_index));
        }
        let mut paths: crate::protocol::PathMap<[Option<Arc<Route>>; 4]> = Default::default();
        for service in services {
            for (index, ep) in service.endpoints().iter().enumerate() {
                let (pool, path_index) = &pools[ep.path];
                paths.entry(ep.path.as_bytes()).or_default()[op_slot(ep.op)] =
                    Some(Arc::new(Route {
                        service: service.clone(),
                        index,
                        endpoint: *ep,
                        pool: pool.clone(),
                        path_index: *path_index,
                        holders: holders.entry(ep.path).or_default().clone(),
                        metrics: crate::observe::ServerEndpoint::new(service.name(), *ep),
                    }));
            }
        }
        Ok(Routes { paths })
    }

    /// One route per path (the operations of a path share its pool).
    pub(crate) fn each_path(&self) -> impl Iterator<Item = &Route> {
        self.paths
            .values()
            .filter_map(|ops| ops.iter().flatten().next().map(|route| &**route))
    }

    /// The route of a request (its path as it came), or the status that explains why there
    /// is none.
    pub(crate) fn find(
        &self,
        path: &[u8],
        op: u32,
    ) -> std::result::Result<&Arc<Route>, crate::Status> {
        // As gRPC answers an unknown method: the server does not implement it. NOT_FOUND is
        // the applications' own (a missing key, a missing block).
        let Some(ops) = self.paths.get(path) else {
            let Ok(path) = std::str::from_utf8(path) else {
                return Err(crate::Status::invalid_argument(
                    "the request's path is not UTF-8",
                ));
            };
            // The path is the client's: shown cut short, never longer than it came.
            return Err(crate::Status::unimplemented(format!(
                "no endpoint at path `{}` on this server",
                crate::observe::logs::shown(path)
            )));
        };
        let Some(op) = OpKind::from_u32(op) else {
            return Err(crate::Status::invalid_argument(format!(
                "unknown operation code {op} (send 1, receive 2, write 3, read 4)"
            )));
        };
        ops[op_slot(op)].as_ref().ok_or_else(|| {
            let supported: Vec<&str> = ops
                .iter()
                .flatten()
                .map(|r| r.endpoint.op.as_str())
                .collect();
            let path = ops.iter().flatten().next().map_or("", |r| r.endpoint.path);
            crate::Status::unimplemented(format!(
                "endpoint {path} has no {op} operation (it supports: {})",
                supported.join(", ")
            ))
        })
    }
}
