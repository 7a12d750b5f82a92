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
//! | `rdma_rpc_server_connections` | gauge | | handshaken connections |
//! | `rdma_rpc_server_connections_dropped_total` | counter | `reason` (`closed`, `protocol`, `other`) | connections that ended in error: lost, misbehaving peer, anything else |
//! | `rdma_rpc_server_pool_buffers_in_use` | gauge | `path` | pool buffers taken, after each call |
//! | `rdma_rpc_client_calls_total` | counter | `path`, `op`, `code` | calls made, by status |
//! | `rdma_rpc_client_call_duration_seconds` | histogram | `path`, `op` | as the caller saw it |
//! | `rdma_rpc_client_reconnects_total` | counter | `outcome` (`ok`, `failed`) | reconnection attempts |
//!
//! Label values are static strings (names from the specs, status codes), so the series are
//! bounded by the endpoints a server has. Each series is registered with the recorder on its
//! first use and kept (no allocation per call): install the recorder before the first call.

pub(crate) mod logs;

#[cfg(feature = "metrics")]
mod on {
    use std::sync::{Mutex, OnceLock};
    use std::time::Duration;

    use metrics::{Counter, Gauge, Histogram};

    use crate::service::EndpointDef;
    use crate::status::Code;

    /// One handle per status code, registered on first use.
    type ByCode<T> = [OnceLock<T>; 17];

    /// The series of one server endpoint.
    pub(crate) struct ServerEndpoint {
        service: &'static str,
        endpoint: EndpointDef,
        calls: ByCode<Counter>,
        duration: OnceLock<Histogram>,
        bytes: OnceLock<Counter>,
        pool: OnceLock<Gauge>,
    }

    impl ServerEndpoint {
        pub(crate) fn new(service: &'static str, endpoint: EndpointDef) -> ServerEndpoint {
            ServerEndpoint {
                service,
                endpoint,
                calls: Default::default(),
                duration: OnceLock::new(),
                bytes: OnceLock::new(),
                pool: OnceLock::new(),
            }
        }

        pub(crate) fn answered(&self, code: Code, bytes: u64, elapsed: Duration, in_use: usize) {
            let (service, method) = (self.service, self.endpoint.method);
            self.calls[code as usize]
                .get_or_init(|| {
                    metrics::counter!(
                        "rdma_rpc_server_calls_total",
                        "service" => service,
                        "method" => method,
                        "code" => code.as_str()
                    )
                })
                .increment(1);
            self.duration
                .get_or_init(|| {
                    metrics::histogram!(
                        "rdma_rpc_server_call_duration_seconds",
                        "service" => service,
                        "method" => method
                    )
                })
                .record(elapsed.as_secs_f64());
            if bytes > 0 {
                let direction = if self.endpoint.op.is_inbound() {
                    "in"
                } else {
                    "out"
                };
                self.bytes
                    .get_or_init(|| {
                        metrics::counter!(
                            "rdma_rpc_server_bytes_total",
                            "service" => service,
                            "method" => method,
                            "direction" => direction
                        )
                    })
                    .increment(bytes);
            }
            let path = self.endpoint.path;
            self.pool
                .get_or_init(
                    || metrics::gauge!("rdma_rpc_server_pool_buffers_in_use", "path" => path),
                )
                .set(in_use as f64);
        }
    }

    /// The series of a client's endpoints: a short list searched by the address of the
    /// endpoint's path (no hashing per call; endpoints are few).
    #[derive(Default)]
    pub(crate) struct ClientEndpoints(Mutex<Vec<((usize, u32), ClientEndpoint)>>);

    #[derive(Default)]
    struct ClientEndpoint {
        calls: ByCode<Counter>,
        duration: OnceLock<Histogram>,
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
                    let code = code.as_str();
                    metrics::counter!("rdma_rpc_client_calls_total", "path" => path, "op" => op, "code" => code)
                        .increment(1);
                    metrics::histogram!("rdma_rpc_client_call_duration_seconds", "path" => path, "op" => op)
                        .record(elapsed.as_secs_f64());
                    return;
                }
            };
            let series = &all[at].1;
            series.calls[code as usize]
                .get_or_init(|| {
                    metrics::counter!(
                        "rdma_rpc_client_calls_total",
                        "path" => path,
                        "op" => op,
                        "code" => code.as_str()
                    )
                })
                .increment(1);
            series
                .duration
                .get_or_init(|| {
                    metrics::histogram!(
                        "rdma_rpc_client_call_duration_seconds",
                        "path" => path,
                        "op" => op
                    )
                })
                .record(elapsed.as_secs_f64());
        }
    }

    pub(crate) fn server_refused(code: Code) {
        metrics::counter!("rdma_rpc_server_calls_refused_total", "code" => code.as_str())
            .increment(1);
    }

    pub(crate) fn connection_opened() {
        metrics::gauge!("rdma_rpc_server_connections").increment(1.0);
    }

    pub(crate) fn connection_closed() {
        metrics::gauge!("rdma_rpc_server_connections").decrement(1.0);
    }

    pub(crate) fn connection_dropped(reason: &'static str) {
        metrics::counter!("rdma_rpc_server_connections_dropped_total", "reason" => reason)
            .increment(1);
    }

    pub(crate) fn reconnect(ok: bool) {
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

        pub(crate) fn answered(&self, _: Code, _: u64, _: Duration, _: usize) {}
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

/// The time now, if anything will use a duration: metrics, or a `DEBUG` log. Reading the clock
/// costs more than the rest of a small call's bookkeeping.
pub(crate) fn clock() -> Option<std::time::Instant> {
    (METRICS || tracing::enabled!(tracing::Level::DEBUG)).then(std::time::Instant::now)
}

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
