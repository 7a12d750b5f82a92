//! An object store on rdma-rpc streams (`specs/object_store.yaml`), kept in memory: objects of
//! up to 1 GiB arrive and leave as bulk streams through the path's 4 MiB buffers (no
//! multipart by hand: the handler takes the chunks as they come, and sends them back chunk by
//! chunk); listings, the log and change notifications are message streams.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use rdma_rpc_core::stream::{ChunkSink, Chunks, Streaming};
use rdma_rpc_core::{Request, Status};

pub use crate::generated::object_store::*;

/// An object as stored.
#[derive(Debug, Clone)]
struct Stored {
    data: Bytes,
    crc32c: u32,
}

/// The store: objects by key, the log, and the watchers of changes.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    objects: Arc<Mutex<BTreeMap<String, Stored>>>,
    log: Arc<Mutex<Vec<String>>>,
    events: tokio::sync::broadcast::Sender<ObjectEvent>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore {
            objects: Arc::default(),
            log: Arc::default(),
            events: tokio::sync::broadcast::channel(1024).0,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> MemoryStore {
        MemoryStore::default()
    }

    /// Stores `data` under `key` directly (to fill a store for a demo or a test).
    pub fn insert(&self, key: impl Into<String>, data: Bytes) {
        let crc32c = crc32c(0, &data);
        lock(&self.objects).insert(key.into(), Stored { data, crc32c });
    }

    /// The lines appended to the log so far.
    pub fn log(&self) -> Vec<String> {
        lock(&self.log).clone()
    }

    fn info(key: &str, stored: &Stored) -> ObjectInfo {
        ObjectInfo {
            key: key.to_owned(),
            size: stored.data.len() as u64,
            crc32c: stored.crc32c,
        }
    }

    fn changed(&self, kind: EventKind, object: ObjectInfo) {
        let mut event = ObjectEvent {
            object: Some(object),
            ..Default::default()
        };
        event.set_kind(kind);
        // Nobody watching is fine.
        let _ = self.events.send(event);
    }
}

impl ObjectStore for MemoryStore {
    async fn put_object(
        &self,
        request: Request<PutObjectRequest>,
        mut chunks: Chunks,
    ) -> Result<ObjectInfo, Status> {
        let PutObjectRequest { key, crc32c: want } = request.into_inner();
        if key.is_empty() {
            return Err(Status::invalid_argument("an object needs a key"));
        }
        // The chunks are pool buffers: copied into the object's own memory as they come, and
        // dropped (which frees each buffer for the next chunk).
        let mut data = BytesMut::with_capacity(chunks.len() as usize);
        let mut crc = 0;
        while let Some(chunk) = chunks.chunk().await? {
            crc = crc32c(crc, &chunk);
            data.extend_from_slice(&chunk);
        }
        if let Some(want) = want.filter(|&w| w != crc) {
            return Err(Status::data_loss(format!(
                "object {key}: CRC32C {crc:#010x} of the bytes received, {want:#010x} announced"
            )));
        }
        let stored = Stored {
            data: data.freeze(),
            crc32c: crc,
        };
        let info = MemoryStore::info(&key, &stored);
        lock(&self.objects).insert(key, stored);
        self.changed(EventKind::Stored, info.clone());
        Ok(info)
    }

    async fn get_object(
        &self,
        request: Request<GetObjectRequest>,
        sink: &mut ChunkSink,
    ) -> Result<ObjectInfo, Status> {
        let key = request.into_inner().key;
        let stored = lock(&self.objects)
            .get(&key)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("no object {key}")))?;
        sink.send_bytes(&stored.data).await?;
        Ok(MemoryStore::info(&key, &stored))
    }

    type ListObjectsStream = tokio_stream::Iter<std::vec::IntoIter<Result<ObjectInfo, Status>>>;

    async fn list_objects(
        &self,
        request: Request<ListRequest>,
    ) -> Result<Self::ListObjectsStream, Status> {
        let ListRequest { prefix, limit } = request.into_inner();
        let objects = lock(&self.objects);
        let listed: Vec<_> = objects
            .range(prefix.clone()..)
            .take_while(|(key, _)| key.starts_with(&prefix))
            .take(limit.map_or(usize::MAX, |l| l as usize))
            .map(|(key, stored)| Ok(MemoryStore::info(key, stored)))
            .collect();
        Ok(tokio_stream::iter(listed))
    }

    async fn append_log(
        &self,
        request: Request<Streaming<LogLine>>,
    ) -> Result<AppendSummary, Status> {
        let mut lines = request.into_inner();
        let mut summary = AppendSummary::default();
        while let Some(line) = lines.message().await? {
            summary.lines += 1;
            summary.bytes += line.text.len() as u64;
            lock(&self.log).push(line.text);
        }
        Ok(summary)
    }

    type WatchStream = tokio_stream::wrappers::ReceiverStream<Result<ObjectEvent, Status>>;

    async fn watch(
        &self,
        request: Request<Streaming<WatchRequest>>,
    ) -> Result<Self::WatchStream, Status> {
        let mut requests = request.into_inner();
        let mut changes = self.events.subscribe();
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        // Runs until the client's stream ends or the call's stream of events is dropped.
        tokio::spawn(async move {
            let mut watched = BTreeSet::new();
            let mut requests_open = true;
            loop {
                tokio::select! {
                    () = tx.closed() => return,
                    next = requests.message(), if requests_open => match next {
                        Ok(Some(WatchRequest { prefix, stop })) => {
                            if stop {
                                watched.remove(&prefix);
                            } else {
                                watched.insert(prefix);
                            }
                        }
                        // The client's stream ended: its watches stay until the call ends.
                        Ok(None) => requests_open = false,
                        Err(status) => {
                            let _ = tx.send(Err(status)).await;
                            return;
                        }
                    },
                    change = changes.recv() => match change {
                        Ok(event) => {
                            let key = event.object.as_ref().map_or("", |o| o.key.as_str());
                            if watched.iter().any(|p| key.starts_with(p.as_str()))
                                && tx.send(Ok(event)).await.is_err()
                            {
                                return;
                            }
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                            let status = Status::data_loss(format!(
                                "{missed} changes were missed: the watcher fell behind"
                            ));
                            let _ = tx.send(Err(status)).await;
                            return;
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                }
            }
        });
        Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
    }

    async fn delete_object(
        &self,
        request: Request<DeleteObjectRequest>,
    ) -> Result<DeleteObjectResponse, Status> {
        let key = request.into_inner().key;
        let removed = lock(&self.objects).remove(&key);
        if let Some(stored) = &removed {
            self.changed(EventKind::Deleted, MemoryStore::info(&key, stored));
        }
        Ok(DeleteObjectResponse {
            existed: removed.is_some(),
        })
    }
}

/// CRC32C (Castagnoli) of `data`, continuing from `crc` (0 to start). With the CPU's CRC32C
/// instruction where there is one (SSE 4.2), else a table a byte at a time.
pub fn crc32c(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        // SAFETY: the CPU has SSE 4.2 (checked just above), the only requirement of the
        // function's `target_feature`.
        return !unsafe { crc32c_sse42(!crc, data) };
    }
    !crc32c_table(!crc, data)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
fn crc32c_sse42(mut crc: u32, data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    // SAFETY: every 8 bytes are a valid `u64`.
    let (head, words, tail) = unsafe { data.align_to::<u64>() };
    for &byte in head {
        crc = _mm_crc32_u8(crc, byte);
    }
    // Aligned words walked by index: debug builds (the tests check gibibytes) pay a call or
    // two per word for iterators, slice conversions and unaligned reads, ten times the
    // instruction's own work. x86-64 is little-endian, as the CRC takes its words.
    let mut wide = u64::from(crc);
    let mut i = 0;
    while i < words.len() {
        wide = _mm_crc32_u64(wide, words[i]);
        i += 1;
    }
    crc = wide as u32;
    for &byte in tail {
        crc = _mm_crc32_u8(crc, byte);
    }
    crc
}

fn crc32c_table(mut crc: u32, data: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut table = [0u32; 256];
        for (i, entry) in table.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 == 1 {
                    (c >> 1) ^ 0x82F6_3B78
                } else {
                    c >> 1
                };
            }
            *entry = c;
        }
        table
    });
    for &byte in data {
        crc = (crc >> 8) ^ table[((crc ^ u32::from(byte)) & 0xff) as usize];
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_known_values_both_ways() {
        // The check value of CRC-32C, and the values of RFC 3720 (iSCSI), appendix B.4.
        assert_eq!(crc32c(0, b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(0, &[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(0, &[0xffu8; 32]), 0x62A8_AB43);
        let ascending: Vec<u8> = (0..32).collect();
        assert_eq!(crc32c(0, &ascending), 0x46DD_794E);
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        assert_eq!(crc32c(0, &data), !crc32c_table(!0, &data));
        // In parts, as chunks arrive.
        let (a, b) = data.split_at(4099);
        assert_eq!(crc32c(crc32c(0, a), b), crc32c(0, &data));
        // Every alignment, and every length around the 8-byte words.
        for start in 0..8 {
            for len in 0..100 {
                let part = &data[start..start + len];
                assert_eq!(crc32c(0, part), !crc32c_table(!0, part), "{start} + {len}");
            }
        }
    }
}
