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
    use std::sync::{Mutex, PoisonError, RwLock};
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
    pub(crate) struct Series<T> {
        held: RwLock<Option<(usize, T)>>,
    }

    impl<T> Default for Series<T> {
        fn default() -> Series<T> {
            Series {
                held: RwLock::new(None),
            }
        }
    }

    impl<T> Series<T> {
        /// Records into the series with `record`, registering it with `register` first if
        /// it has no handle for the recorder in use.
        pub(crate) fn with(&self, register: impl FnOnce() -> T, record: impl FnOnce(&T)) {
            let now = recorder();
            {
                let held = self.held.read().unwrap_or_else(PoisonError::into_inner);
                if let Some((id, handle)) = held.as_ref() {
                    if *id == now {
                        record(handle);
                        return;
                    }
                }
            }
            describe(now);
            let handle = register();
            record(&handle);
            *self.held.write().unwrap_or_else(PoisonError::into_inner) = Some((now, handle));
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

        pub(crate) fn answered(&self, code: Code, bytes: u64, elapsed: Duration) {
            let (service, method) = (self.service, self.endpoint.method);
            self.calls[code as usize].with(
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
                || metrics::gauge!("rdma_rpc_server_pool_buffers_in_use", "path" => path),
                |g| g.set(value),
            );
        }
    }

    /// The series of a client's endpoints: a short list searched by the address of the
    /// endpoint's path (no hashing per call; endpoints are few).
    #[derive(Default)]
    pub(crate) struct ClientEndpoints(Mutex<Vec<((usize, u32), ClientEndpoint)>>);

    #[derive(Default)]
    struct ClientEndpoint {
        calls: ByCode<Counter>,
        duration: Series<Histogram>,
    }

    /// Endpoints remembered per client; beyond, each call registers its series again (the
    /// recorder finds the same ones).
    const REMEMBERED: usize = 256;

    impl ClientEndpoints {
        pub(crate) fn called(&self, endpoint: &EndpointDef, code: Code, elapsed: Duration) {
            let (path, op) = (endpoint.path, endpoint.op.as_str());
            let key = (path.as_ptr() as usize, endpoint.op.as_u32());
            let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
            let at = match all.iter().position(|(k, _)| *k == key) {
                Some(at) => at,
                None if all.len() < REMEMBERED => {
                    all.push((key, ClientEndpoint::default()));
                    all.len() - 1
                }
                None => {
                    drop(all);
                    describe(recorder());
                    let code = code.as_str();
                    metrics::counter!("rdma_rpc_client_calls_total", "path" => path, "op" => op, "code" => code)
                        .increment(1);
                    metrics::histogram!("rdma_rpc_client_call_duration_seconds", "path" => path, "op" => op)
                        .record(elapsed.as_secs_f64());
                    return;
                }
            };
            let series = &all[at].1;
            series.calls[code as usize].with(
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
            series.duration.with(
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

        pub(crate) fn answered(&self, _: Code, _: u64, _: Duration) {}
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
        pub(crate) fn called(&self, _: &EndpointDef, _: Code, _: Duration) {}
    }

    pub(crate) fn server_refused(_: Code) {}
    pub(crate) fn connection_opened() {}
    pub(crate) fn connection_closed() {}
    pub(crate) fn connection_dropped(_: &'static str) {}
    pub(crate) fn reconnect(_: bool) {}
}

pub(crate) use on::*;

/// Whether metrics are recorded (the `metrics` feature).
pub(crate) const METRICS: bool = cfg!(feature = "metrics");

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
