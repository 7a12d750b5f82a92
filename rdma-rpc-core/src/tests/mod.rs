//! End-to-end tests of client, server and protocol, written against `dyn Transport` so the
//! same suite runs over every transport.

/// The end-to-end suite functions (each `async fn(&Backend)`) that every backend runs, handed to
/// `$m!`, after any leading tokens: `with_suite!(m)` is `m!(a_on, b_on, ...)`, and
/// `with_suite!(m, @tests)` is `m!(@tests a_on, ...)`. One list, so a test added to the suite
/// runs over TCP's peers, `mem://` and DOCA alike.
macro_rules! with_suite {
    ($m:ident $(, $($pre:tt)+)?) => {
        $m!($($($pre)+)?
            many_calls_in_flight_on_one_connection_complete_out_of_order_on,
            deadlines_end_calls_with_deadline_exceeded_on,
            graceful_shutdown_drains_calls_in_flight_on,
            calls_without_a_free_slot_take_the_other_path_on,
            slots_off_and_growing_results_stay_exact_on,
            abandoned_reads_keep_their_window_until_the_response_on,
            concurrent_mixed_sizes_on,
            well_behaved_clients_wait_instead_of_exceeding_the_in_flight_limit_on,
            malformed_frames_close_that_connection_only_on,
            frames_a_client_must_not_send_close_the_connection_on,
            unknown_endpoints_wrong_operations_and_oversized_requests_get_statuses_on,
            handler_panic_is_an_internal_error_and_the_server_goes_on_on,
            client_dying_mid_write_never_reaches_the_handler_and_frees_the_buffer_on,
            server_death_ends_pending_calls_promptly_on,
            in_flight_limit_is_enforced_and_named_on,
            connection_limit_is_enforced_and_named_on,
            oversized_metadata_is_refused_with_the_limit_named_on,
            protocol_version_mismatch_is_reported_on,
            silent_clients_time_out_in_the_handshake_on,
            misused_write_slots_get_statuses_on,
            stale_descriptors_never_reach_another_connection_on,
            slot_bytes_never_change_under_a_handler_on,
            a_hello_without_credits_is_refused_on,
            the_count_is_exact_when_clients_leave_on,
            idle_connections_are_closed_on,
            waiting_for_a_buffer_is_bounded_on,
            a_forged_window_ends_the_call_with_a_status_on,
            a_result_window_larger_than_the_endpoint_is_refused_on,
            a_pushed_length_outside_the_window_is_refused_on,
            responses_to_unknown_calls_are_ignored_on,
            frames_a_server_must_not_send_end_the_connection_on,
            a_goaway_right_before_the_close_is_read_on,
            an_unusable_handshake_is_refused_on,
            a_silent_server_is_bounded_by_the_deadline_on,
            a_kept_pull_window_never_shows_another_connections_data_on,
            remote_buffers_are_read_written_and_updated_in_place_on,
            remote_buffer_misuse_gets_statuses_and_touches_nothing_on,
            shared_regions_are_lent_in_place_and_copied_locally_on,
            stray_revocations_are_answered_and_bounded_on,
            region_leases_travel_through_write_and_read_endpoints_on,
            oversized_messages_fail_at_once_naming_the_limit_on,
            buffers_kept_by_handlers_fail_calls_at_once_on,
            metadata_and_interceptors_reach_the_handler_on,
            ping_measures_round_trips_without_a_handler_on,
            a_client_survives_a_server_restart_on,
            a_client_without_reconnection_stays_closed_on,
            failed_reconnections_back_off_and_say_why_on,
            a_cancelled_call_stops_its_handler_and_frees_its_buffer_on,
            a_passed_deadline_stops_the_handler_on,
            the_server_bounds_calls_that_carry_no_deadline_on,
            a_connection_that_ends_stops_its_handlers_on,
            a_response_over_its_limit_is_known_before_and_refused_after_on,
            a_server_streams_a_hundred_thousand_messages_on,
            a_slow_reader_holds_the_server_back_on,
            clients_stream_and_both_sides_stream_on,
            dropping_a_stream_cancels_its_call_on,
            bulk_streams_move_payloads_many_buffers_long_on,
            a_slow_write_handler_holds_the_client_back_on,
            stream_rule_breakers_lose_their_connection_on,
            broken_offers_in_a_request_refuse_the_call_on,
            a_stream_that_never_ends_is_bounded_on,
            a_client_that_stops_reading_loses_its_stream_on,
        );
    };
}

mod balance;
mod credits;
#[cfg(feature = "doca")]
mod doca;
mod e2e;
mod ends;
mod fast_paths;
mod faults;
mod faulty;
mod floods;
mod fuzz;
mod hostile;
mod malicious;
mod mem;
mod raw;
#[cfg(feature = "doca")]
mod registrations;
mod remote;
mod service;
mod sessions;
mod stream_rules;
mod streams;
#[cfg(feature = "tls")]
mod tls;
pub(crate) mod wakes;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::transport::tcp::{TcpConfig, TcpTransport};
use crate::transport::Transport;
use crate::{Client, ClientConfig, Server, ServerConfig};

pub(crate) use service::{pattern, TestService, ENDPOINTS};

/// A running server for one test.
pub(crate) struct Harness {
    pub(crate) addr: String,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) service: TestService,
    /// The server's live connection count.
    pub(crate) count: crate::ConnectionCount,
    /// The server's listing: connections, pools.
    pub(crate) handle: crate::ServerHandle,
    stop: Option<oneshot::Sender<()>>,
    pub(crate) task: JoinHandle<crate::Result<()>>,
}

pub(crate) fn tcp() -> Arc<dyn Transport> {
    Arc::new(TcpTransport::with_config(TcpConfig {
        rnr_timeout: Duration::from_secs(5),
        ..TcpConfig::default()
    }))
}

/// A transport and the address a test server binds with it.
#[derive(Clone)]
pub(crate) struct Backend {
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) bind: String,
}

/// The software transport on loopback.
pub(crate) fn tcp_backend() -> Backend {
    Backend {
        transport: tcp(),
        bind: "tcp://127.0.0.1:0".into(),
    }
}

impl Harness {
    pub(crate) async fn start(transport: Arc<dyn Transport>, config: ServerConfig) -> Harness {
        Harness::start_on(
            &Backend {
                transport,
                bind: "tcp://127.0.0.1:0".into(),
            },
            config,
        )
        .await
    }

    /// A server on `backend` (any transport).
    pub(crate) async fn start_on(backend: &Backend, config: ServerConfig) -> Harness {
        Harness::start_built(backend, config, |builder| builder).await
    }

    /// A server on `backend`, with more set on its builder by `build`.
    pub(crate) async fn start_built(
        backend: &Backend,
        config: ServerConfig,
        build: impl FnOnce(crate::ServerBuilder) -> crate::ServerBuilder,
    ) -> Harness {
        Harness::start_serving(backend, config, TestService::default(), build).await
    }

    /// [`start_built`](Self::start_built) with a test service made beforehand.
    pub(crate) async fn start_serving(
        backend: &Backend,
        config: ServerConfig,
        service: TestService,
        build: impl FnOnce(crate::ServerBuilder) -> crate::ServerBuilder,
    ) -> Harness {
        let transport = backend.transport.clone();
        let server = build(Server::builder())
            .config(config)
            .transport(transport.clone())
            .add_service(service.clone())
            .bind(&backend.bind)
            .await
            .expect("bind");
        let addr = server.local_addr();
        let count = server.connection_count();
        let handle = server.handle();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server.serve_with_shutdown(async move {
            let _ = stopped.await;
        }));
        Harness {
            addr,
            transport,
            service,
            count,
            handle,
            stop: Some(stop),
            task,
        }
    }

    pub(crate) async fn tcp_default() -> Harness {
        Harness::start(tcp(), ServerConfig::default()).await
    }

    /// A server with the default configuration on `backend`.
    pub(crate) async fn default_on(backend: &Backend) -> Harness {
        Harness::start_on(backend, ServerConfig::default()).await
    }

    pub(crate) async fn client(&self) -> Client {
        self.client_with(ClientConfig::default()).await
    }

    pub(crate) async fn client_with(&self, config: ClientConfig) -> Client {
        Client::builder()
            .config(config)
            .transport(self.transport.clone())
            .connect(&self.addr)
            .await
            .expect("connect")
    }

    /// The error of a connection the server refuses.
    pub(crate) async fn refused(&self) -> crate::Error {
        Client::builder()
            .transport(self.transport.clone())
            .connect(&self.addr)
            .await
            .map(drop)
            .unwrap_err()
    }

    /// Starts a graceful shutdown.
    pub(crate) fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Runs the future `make` builds on a one-thread runtime on a thread of its own, and fails the
/// test if that has not finished within a generous bound (or panicked). For tests of whether
/// tasks yield: a task that never yields stops its runtime's timers too, so [`bounded`] could
/// not end such a test; this fails it instead of hanging it.
pub(crate) fn on_a_thread_of_its_own<F>(what: &str, make: impl FnOnce() -> F + Send + 'static)
where
    F: std::future::Future<Output = ()>,
{
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(make());
        let _ = done.send(());
    });
    finished
        .recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what} did not finish (a task kept its thread, or panicked)"));
}

/// With `RDMA_RPC_TEST_LOG` set to a level (`debug`, `trace`, ...), logs every test of this
/// process that calls this (the DOCA suites do) to stderr, with times and thread names,
/// through one global subscriber; nothing without it. Run one suite at a time and match a slow
/// test's lines by its start and end: how a lost wake-up in the client's handshake (a 10 s
/// stall once in about 40 runs) and an abort as threads ended were found.
#[cfg(feature = "doca")]
pub(crate) fn log_if_asked() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Ok(level) = std::env::var("RDMA_RPC_TEST_LOG") else {
            return;
        };
        let level = level.parse().unwrap_or(tracing::Level::DEBUG);
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_thread_names(true)
            .with_ansi(false)
            .with_writer(std::io::stderr)
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
}

/// Fails the test instead of hanging it (a generous bound, not a performance assertion).
/// At the bound the future is not polled again: one that lost a wake-up and would be found
/// ready by that poll fails here instead of passing late (`tokio::time::timeout` polls its
/// future before its deadline, which hid such a bug for as long as the deadline).
pub(crate) async fn bounded<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::select! {
        biased; // the deadline first
        () = tokio::time::sleep(Duration::from_secs(60)) => panic!("{what} hung"),
        out = fut => out,
    }
}
