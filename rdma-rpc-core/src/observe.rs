//! Metrics, through the [`metrics`](https://docs.rs/metrics) facade when the `metrics`
//! feature is on (nothing otherwise). Install any recorder (a Prometheus exporter, say) and
//! these appear:
//!
//! | name | kind | labels | what |
//! | --- | --- | --- | --- |
//! | `rdma_rpc_server_calls_total` | counter | `service`, `method`, `code` | calls answered, by status |
//! | `rdma_rpc_server_call_duration_seconds` | histogram | `service`, `method` | request to response |
//! | `rdma_rpc_server_bytes_total` | counter | `service`, `method`, `direction` (`in`, `out`) | payload bytes of successful calls |
//! | `rdma_rpc_server_calls_refused_total` | counter | `code` | calls refused before a handler ran (unknown path, limits, interceptors) |
//! | `rdma_rpc_server_connections` | gauge | | handshaken connections (of every server of the process) |
//! | `rdma_rpc_server_connections_dropped_total` | counter | `reason` (`closed`, `protocol`, `other`) | connections that ended without the client's goodbye: lost (the peer went away: a crash, a reset, a network), misbehaving peer, a limit or a timeout. A client that closes or drops its `Client` says goodbye and is not counted |
//! | `rdma_rpc_server_pool_buffers_in_use` | gauge | `path` | pool buffers taken now (set as each is taken and given back: what `ServerHandle::pools` says) |
//! | `rdma_rpc_client_calls_total` | counter | `path`, `op`, `code` | calls made, by status |
//! | `rdma_rpc_client_call_duration_seconds` | histogram | `path`, `op` | as the caller saw it |
//! | `rdma_rpc_client_reconnects_total` | counter | `outcome` (`ok`, `failed`) | reconnection attempts |
//!
//! Label values are static strings (names from the specs, status codes), so the series are
//! bounded by the endpoints a server has. Each series is registered with the recorder in use
//! on its first use and kept (no allocation per call), and registered again when the recorder
//! in use changes: a recorder installed after the first calls gets every series from the next
//! event on (counters count from then; the gauges are set to their whole value at their next
//! change). Each recorder is given every series' description and unit once.

pub(crate) mod logs;

#[cfg(feature = "metrics")]
mod on {
    use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
    use std::sync::{Mutex, OnceLock, PoisonError};
    use std::time::Duration;

    use metrics::{Counter, Gauge, Histogram, Unit};

    use crate::service::EndpointDef;
    use crate::status::Code;

    /// The recorder the `metrics` macros use now (a thread's local one, else the global one,
    /// else the no-op), as an identity: its address. A handle registered with one recorder
    /// records nothing into another, so a cached handle is only good while this stays the
    /// same: a recorder installed after the first calls is seen at the next one.
    fn recorder() -> usize {
        metrics::with_recorder(|r| (r as *const dyn metrics::Recorder).cast::<()>() as usize)
    }

    /// The recorder in use (as [`recorder`] names it), unless it is known to be `metrics`'
    /// no-op one (no recorder installed): then nothing a call records would be kept, and a
    /// call reads no clock for its duration (a read costs about 40 ns on the development VM).
    /// A one-way test: it compares the recorder's vtable with the no-op recorder's, which an
    /// optimized build merges into one; where they are not merged (a debug build) it names
    /// the no-op recorder and calls record as before, into its handles.
    pub(crate) fn recording() -> Option<usize> {
        metrics::with_recorder(|r| {
            let r: *const dyn metrics::Recorder = r;
            let noop: *const dyn metrics::Recorder = &metrics::NoopRecorder;
            // Same address: equal only if the vtables are.
            (!std::ptr::eq(r, noop.with_addr(r.addr()))).then(|| r.cast::<()>() as usize)
        })
    }

    /// The recorder the descriptions were last given to.
    static DESCRIBED: AtomicUsize = AtomicUsize::new(0);

    /// Gives the recorder `now` the unit and help text of every series (once per recorder;
    /// called whenever a series registers, which is rare).
    fn describe(now: usize) {
        if DESCRIBED.swap(now, Ordering::AcqRel) == now {
            return;
        }
        use metrics::{describe_counter, describe_gauge, describe_histogram};
        describe_counter!(
            "rdma_rpc_server_calls_total",
            "Calls answered by the server, by service, method and status code."
        );
        describe_histogram!(
            "rdma_rpc_server_call_duration_seconds",
            Unit::Seconds,
            "Time from a call's request to its response, on the server."
        );
        describe_counter!(
            "rdma_rpc_server_bytes_total",
            Unit::Bytes,
            "Payload bytes of successful calls, by direction."
        );
        describe_counter!(
            "rdma_rpc_server_calls_refused_total",
            "Calls refused before a handler ran (unknown path, limits, interceptors)."
        );
        describe_gauge!(
            "rdma_rpc_server_connections",
            "Handshaken connections the process's servers hold."
        );
        describe_counter!(
            "rdma_rpc_server_connections_dropped_total",
            "Connections that ended without the client's goodbye: lost (closed), misbehaving \
             peer (protocol), limit or timeout (other)."
        );
        describe_gauge!(
            "rdma_rpc_server_pool_buffers_in_use",
            "Buffers of a path's pool taken now."
        );
        describe_counter!(
            "rdma_rpc_client_calls_total",
            "Calls made by clients, by path, operation and status code."
        );
        describe_histogram!(
            "rdma_rpc_client_call_duration_seconds",
            Unit::Seconds,
            "Call latency as the caller saw it."
        );
        describe_counter!(
            "rdma_rpc_client_reconnects_total",
            "Reconnection attempts of clients, by outcome."
        );
    }

    /// One series' handle, registered on first use and again whenever the recorder in use
    /// changes (one installed after the first calls, a test's local one): never a handle
    /// kept from a recorder that is no longer the one in use.
    ///
    /// Recording takes no lock and no atomic read-modify-write when the recorder is the one
    /// the series first met (a process's one recorder, or none): a call records several
    /// series, and an uncontended lock still costs two of those atomic instructions, about
    /// 7 ns each on the development VM. A later recorder's handle is kept behind a lock.
    pub(crate) struct Series<T> {
        first: OnceLock<(usize, T)>,
        later: Mutex<Option<(usize, T)>>,
    }

    impl<T> Default for Series<T> {
        fn default() -> Series<T> {
            Series {
                first: OnceLock::new(),
                later: Mutex::new(None),
            }
        }
    }

    impl<T> Series<T> {
        /// Records into the series with `record`, registering it with `register` first if
        /// it has no handle for the recorder `now` (see [`recorder`]).
        pub(crate) fn with(&self, now: usize, register: impl Fn() -> T, record: impl FnOnce(&T)) {
            let (id, handle) = self.first.get_or_init(|| {
                describe(now);
                (now, register())
            });
            if *id == now {
                record(handle);
                return;
            }
            let mut later = self.later.lock().unwrap_or_else(PoisonError::into_inner);
            match &*later {
                Some((id, handle)) if *id == now => record(handle),
                _ => {
                    describe(now);
                    let handle = register();
                    record(&handle);
                    *later = Some((now, handle));
                }
            }
        }
    }

    /// One handle per status code.
    type ByCode<T> = [Series<T>; 17];

    /// The series of one server endpoint.
    pub(crate) struct ServerEndpoint {
        service: &'static str,
        endpoint: EndpointDef,
        calls: ByCode<Counter>,
        duration: Series<Histogram>,
        bytes: Series<Counter>,
    }

    impl ServerEndpoint {
        pub(crate) fn new(service: &'static str, endpoint: EndpointDef) -> ServerEndpoint {
            ServerEndpoint {
                service,
                endpoint,
                calls: Default::default(),
                duration: Series::default(),
                bytes: Series::default(),
            }
        }

        /// Records a call answered with `code`, into the series of recorder `now` (see
        /// [`recording`]).
        pub(crate) fn answered(&self, now: usize, code: Code, bytes: u64, elapsed: Duration) {
            let (service, method) = (self.service, self.endpoint.method);
            self.calls[code as usize].with(
                now,
                || {
                    metrics::counter!(
                        "rdma_rpc_server_calls_total",
                        "service" => service,
                        "method" => method,
                        "code" => code.as_str()
                    )
                },
                |c| c.increment(1),
            );
            self.duration.with(
                now,
                || {
                    metrics::histogram!(
                        "rdma_rpc_server_call_duration_seconds",
                        "service" => service,
                        "method" => method
                    )
                },
                |h| h.record(elapsed.as_secs_f64()),
            );
            if bytes > 0 {
                let direction = if self.endpoint.op.is_inbound() {
                    "in"
                } else {
                    "out"
                };
                self.bytes.with(
                    now,
                    || {
                        metrics::counter!(
                            "rdma_rpc_server_bytes_total",
                            "service" => service,
                            "method" => method,
                            "direction" => direction
                        )
                    },
                    |c| c.increment(bytes),
                );
            }
        }
    }

    /// The `pool_buffers_in_use` gauge of one path's pool, set by the pool itself each time
    /// a buffer is taken or given back.
    pub(crate) struct PoolGauge {
        path: &'static str,
        /// Held while a value is read and set: the last of two racing updates reads the
        /// later state, so the gauge ends at the pool's count, never at a stale one.
        gauge: Mutex<Series<Gauge>>,
    }

    impl PoolGauge {
        pub(crate) fn new(path: &'static str) -> PoolGauge {
            PoolGauge {
                path,
                gauge: Mutex::new(Series::default()),
            }
        }

        /// Sets the gauge to `in_use()`, read under the gauge's lock.
        pub(crate) fn update(&self, in_use: impl FnOnce() -> usize) {
            let path = self.path;
            let series = self.gauge.lock().unwrap_or_else(PoisonError::into_inner);
            let value = in_use() as f64;
            series.with(
                recorder(),
                || metrics::gauge!("rdma_rpc_server_pool_buffers_in_use", "path" => path),
                |g| g.set(value),
            );
        }
    }

    /// The series of a client's endpoints, found by the address of the endpoint's path (no
    /// hashing per call; endpoints are few). The first [`UNLOCKED`] endpoints a client calls
    /// are found without a lock; later ones in a list behind one.
    #[derive(Default)]
    pub(crate) struct ClientEndpoints {
        unlocked: [OnceLock<Box<ClientEndpoint>>; UNLOCKED],
        locked: Mutex<Vec<ClientEndpoint>>,
    }

    struct ClientEndpoint {
        /// The endpoint: its path's address and its operation.
        key: (usize, u32),
        calls: ByCode<Counter>,
        duration: Series<Histogram>,
    }

    impl ClientEndpoint {
        fn new(key: (usize, u32)) -> ClientEndpoint {
            ClientEndpoint {
                key,
                calls: Default::default(),
                duration: Series::default(),
            }
        }

        fn record(&self, endpoint: &EndpointDef, now: usize, code: Code, elapsed: Duration) {
            let (path, op) = (endpoint.path, endpoint.op.as_str());
            self.calls[code as usize].with(
                now,
                || {
                    metrics::counter!(
                        "rdma_rpc_client_calls_total",
                        "path" => path,
                        "op" => op,
                        "code" => code.as_str()
                    )
                },
                |c| c.increment(1),
            );
            self.duration.with(
                now,
                || {
                    metrics::histogram!(
                        "rdma_rpc_client_call_duration_seconds",
                        "path" => path,
                        "op" => op
                    )
                },
                |h| h.record(elapsed.as_secs_f64()),
            );
        }
    }

    /// Endpoints found without a lock, per client.
    const UNLOCKED: usize = 8;

    /// Endpoints remembered per client in all; beyond, each call registers its series again
    /// (the recorder finds the same ones).
    const REMEMBERED: usize = 256;

    impl ClientEndpoints {
        /// Records a call of `endpoint` that ended with `code`, into the series of recorder
        /// `now` (see [`recording`]).
        pub(crate) fn called(
            &self,
            now: usize,
            endpoint: &EndpointDef,
            code: Code,
            elapsed: Duration,
        ) {
            let key = (endpoint.path.as_ptr() as usize, endpoint.op.as_u32());
            for slot in &self.unlocked {
                // A free slot is taken for this endpoint; a slot another call took at the
                // same moment for another endpoint is passed by.
                let series = slot.get_or_init(|| Box::new(ClientEndpoint::new(key)));
                if series.key == key {
                    return series.record(endpoint, now, code, elapsed);
                }
            }
            let mut all = self.locked.lock().unwrap_or_else(|e| e.into_inner());
            let at = match all.iter().position(|series| series.key == key) {
                Some(at) => at,
                None if all.len() < REMEMBERED - UNLOCKED => {
                    all.push(ClientEndpoint::new(key));
                    all.len() - 1
                }
                None => {
                    drop(all);
                    describe(now);
                    let (path, op, code) = (endpoint.path, endpoint.op.as_str(), code.as_str());
                    metrics::counter!("rdma_rpc_client_calls_total", "path" => path, "op" => op, "code" => code)
                        .increment(1);
                    metrics::histogram!("rdma_rpc_client_call_duration_seconds", "path" => path, "op" => op)
                        .record(elapsed.as_secs_f64());
                    return;
                }
            };
            all[at].record(endpoint, now, code, elapsed);
        }
    }

    // The rare events below register their series each time: the recorder in use then gets
    // them, whenever it was installed.

    pub(crate) fn server_refused(code: Code) {
        describe(recorder());
        metrics::counter!("rdma_rpc_server_calls_refused_total", "code" => code.as_str())
            .increment(1);
    }

    /// Handshaken connections of every server of the process: the gauge is set to it, not
    /// moved by one, so a recorder installed while connections are open reads the truth at
    /// the next change.
    static OPEN: AtomicI64 = AtomicI64::new(0);

    /// Held while the count is read and set (see [`PoolGauge`]).
    static SETTING: Mutex<()> = Mutex::new(());

    pub(crate) fn connection_opened() {
        OPEN.fetch_add(1, Ordering::AcqRel);
        set_connections();
    }

    pub(crate) fn connection_closed() {
        OPEN.fetch_sub(1, Ordering::AcqRel);
        set_connections();
    }

    fn set_connections() {
        describe(recorder());
        let _setting = SETTING.lock().unwrap_or_else(PoisonError::into_inner);
        metrics::gauge!("rdma_rpc_server_connections").set(OPEN.load(Ordering::Acquire) as f64);
    }

    pub(crate) fn connection_dropped(reason: &'static str) {
        describe(recorder());
        metrics::counter!("rdma_rpc_server_connections_dropped_total", "reason" => reason)
            .increment(1);
    }

    pub(crate) fn reconnect(ok: bool) {
        describe(recorder());
        let outcome = if ok { "ok" } else { "failed" };
        metrics::counter!("rdma_rpc_client_reconnects_total", "outcome" => outcome).increment(1);
    }

    #[cfg(test)]
    mod tests {
        use std::cell::Cell;
        use std::time::Duration;

        use metrics_util::debugging::{DebugValue, DebuggingRecorder};

        use super::{ClientEndpoints, Series, UNLOCKED};
        use crate::service::{EndpointDef, OpKind, StreamKind};
        use crate::status::Code;

        /// A series registers once per recorder it meets, records into the handle of the
        /// recorder in use, and keeps the first one's handle while a later one comes and
        /// goes.
        #[test]
        fn a_series_records_into_the_handle_of_the_recorder_in_use() {
            let series: Series<(usize, u32)> = Series::default();
            let registered = Cell::new(0u32);
            let mut seen = Vec::new();
            for now in [1, 1, 2, 2, 1, 3, 2, 1] {
                series.with(
                    now,
                    || {
                        registered.set(registered.get() + 1);
                        (now, registered.get())
                    },
                    |&(made_for, nth)| seen.push((now, made_for, nth)),
                );
            }
            // Recorder 1's handle is made once and kept; 2, then 3, then 2 again take
            // turns behind the lock, each registered again when it comes back.
            assert_eq!(
                seen,
                [
                    (1, 1, 1),
                    (1, 1, 1),
                    (2, 2, 2),
                    (2, 2, 2),
                    (1, 1, 1),
                    (3, 3, 3),
                    (2, 2, 4),
                    (1, 1, 1),
                ]
            );
        }

        fn endpoint(path: &'static str) -> EndpointDef {
            EndpointDef {
                path,
                op: OpKind::Send,
                buffer_size: 64,
                method: "m",
                timeout_ms: None,
                stream: StreamKind::Unary,
            }
        }

        /// A recorder in use is never taken for the no-op one.
        #[test]
        fn an_installed_recorder_is_recording() {
            let recorder = DebuggingRecorder::new();
            assert!(metrics::with_local_recorder(&recorder, super::recording).is_some());
        }

        /// Every endpoint a client calls, the unlocked ones and those beyond, counts its
        /// own calls.
        #[test]
        fn each_endpoint_counts_its_own_calls_past_the_unlocked_ones() {
            const PATHS: [&str; UNLOCKED + 3] = [
                "/e0", "/e1", "/e2", "/e3", "/e4", "/e5", "/e6", "/e7", "/e8", "/e9", "/e10",
            ];
            let recorder = DebuggingRecorder::new();
            let snapshotter = recorder.snapshotter();
            let endpoints = ClientEndpoints::default();
            metrics::with_local_recorder(&recorder, || {
                for (i, path) in PATHS.iter().enumerate() {
                    for _ in 0..=i {
                        let now = super::recorder();
                        endpoints.called(now, &endpoint(path), Code::Ok, Duration::ZERO);
                    }
                }
            });
            let mut counted: Vec<(String, u64)> = snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .filter(|(key, ..)| key.key().name() == "rdma_rpc_client_calls_total")
                .map(|(key, _, _, value)| {
                    let path = key
                        .key()
                        .labels()
                        .find(|l| l.key() == "path")
                        .map(|l| l.value().to_owned())
                        .unwrap_or_default();
                    let DebugValue::Counter(n) = value else {
                        panic!("a counter")
                    };
                    (path, n)
                })
                .collect();
            counted.sort_by_key(|(_, n)| *n);
            let want: Vec<(String, u64)> = PATHS
                .iter()
                .enumerate()
                .map(|(i, p)| ((*p).to_owned(), i as u64 + 1))
                .collect();
            assert_eq!(counted, want);
            assert!(endpoints.unlocked.iter().all(|slot| slot.get().is_some()));
            assert_eq!(
                endpoints.locked.lock().unwrap().len(),
                PATHS.len() - UNLOCKED
            );
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod on {
    //! Without the feature every hook is empty and compiles away.
    use std::time::Duration;

    use crate::service::EndpointDef;
    use crate::status::Code;

    pub(crate) struct ServerEndpoint;

    impl ServerEndpoint {
        pub(crate) fn new(_: &'static str, _: EndpointDef) -> ServerEndpoint {
            ServerEndpoint
        }

        pub(crate) fn answered(&self, _: usize, _: Code, _: u64, _: Duration) {}
    }

    pub(crate) struct PoolGauge;

    impl PoolGauge {
        pub(crate) fn new(_: &'static str) -> PoolGauge {
            PoolGauge
        }

        pub(crate) fn update(&self, _: impl FnOnce() -> usize) {}
    }

    #[derive(Default)]
    pub(crate) struct ClientEndpoints;

    impl ClientEndpoints {
        pub(crate) fn called(&self, _: usize, _: &EndpointDef, _: Code, _: Duration) {}
    }

    pub(crate) fn server_refused(_: Code) {}
    pub(crate) fn connection_opened() {}
    pub(crate) fn connection_closed() {}
    pub(crate) fn connection_dropped(_: &'static str) {}
    pub(crate) fn reconnect(_: bool) {}

    pub(crate) fn recording() -> Option<usize> {
        None
    }
}

pub(crate) use on::*;

/// Counts a handshaken connection in the connections gauge until dropped.
pub(crate) struct OpenConnection(());

impl OpenConnection {
    pub(crate) fn new() -> OpenConnection {
        connection_opened();
        OpenConnection(())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        connection_closed();
    }
}
