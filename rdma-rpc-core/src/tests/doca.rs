//! The end-to-end suite over the DOCA transport: on doca-sys's software provider by default,
//! and on a real device with the `#[ignore]`d hardware tests (see docs/doca.md).
//!
//! DOCA cannot revoke an exported mmap per request, and an export is not bound to one
//! connection. So over DOCA the server pulls large payloads (`ServerConfig::pull_writes`) and
//! pushes results: the only server memory a client ever gets a descriptor of is its own
//! connection's write slots (`stale_descriptors_never_reach_another_connection_on`). Two
//! fault tests are about windows the server grants from shared pools and stay TCP-only:
//! - `descriptors_grant_one_buffer_one_direction_until_the_ack`: the descriptor dies with the
//!   ack (DOCA: it would keep working while the buffer's region lives).
//! - `a_client_cannot_reach_another_connections_buffers`: a second connection cannot use the
//!   first one's window (DOCA: any connection that learns the blob can).

use std::sync::Arc;
use std::time::Duration;

use super::e2e::{
    all_operations_all_sizes, deadlines_end_calls_with_deadline_exceeded_on,
    graceful_shutdown_drains_calls_in_flight_on,
    many_calls_in_flight_on_one_connection_complete_out_of_order_on, many_connections_mixed,
};
use super::ends::*;
use super::fast_paths::*;
use super::faults::*;
use super::hostile::*;
use super::malicious::*;
use super::remote::*;
use super::sessions::*;
use super::stream_rules::{
    a_client_that_stops_reading_loses_its_stream_on, a_stream_that_never_ends_is_bounded_on,
    broken_offers_in_a_request_refuse_the_call_on, stream_rule_breakers_lose_their_connection_on,
};
use super::streams::{
    a_server_streams_a_hundred_thousand_messages_on, a_slow_reader_holds_the_server_back_on,
    a_slow_write_handler_holds_the_client_back_on, bulk_streams_move_payloads_many_buffers_long_on,
    clients_stream_and_both_sides_stream_on, dropping_a_stream_cancels_its_call_on,
};
use super::{bounded, Backend, Harness};
use crate::transport::doca::{DocaConfig, DocaTransport, ProgressMode};

fn config() -> DocaConfig {
    DocaConfig {
        rnr_timeout: Duration::from_secs(5),
        ..DocaConfig::from_env()
    }
}

/// DOCA on loopback (software provider): over RDMA CM or out of band (blobs over a TCP side
/// channel), with the progress engine driven by events or by a polling thread.
fn backend(oob: bool, progress: ProgressMode) -> Backend {
    let config = DocaConfig {
        progress,
        ..config()
    };
    Backend {
        transport: Arc::new(DocaTransport::new(config).expect("a DOCA device")),
        bind: if oob {
            "doca+oob://127.0.0.1:0".into()
        } else {
            "doca://127.0.0.1:0".into()
        },
    }
}

/// Runs one test of the suite (logging with `RDMA_RPC_TEST_LOG`: see
/// [`super::log_if_asked`]), then checks that the software provider saw no call DOCA
/// documents as undefined or forbidden (every test of this process reports what any test
/// caused, so a violation cannot go unnoticed).
async fn checked(what: &str, test: impl std::future::Future<Output = ()>) {
    super::log_if_asked();
    tracing::info!(test = what, "test started");
    bounded(what, test).await;
    tracing::info!(test = what, "test ended");
    let violations = doca_sys::take_contract_violations();
    assert!(
        violations.is_empty(),
        "DOCA contract violations: {violations:#?}"
    );
}

/// The suite runs on the provider the build was asked for: the software provider, unless
/// `DOCA_SYS_PROVIDER=sdk` (the variable that makes a missing SDK a build error) says the SDK
/// is expected. A build that fell back to the software provider when the SDK was asked for,
/// or picked up an SDK nobody asked for, fails here rather than passing on the wrong one.
#[test]
fn the_suite_runs_on_the_expected_provider() {
    let asked = std::env::var("DOCA_SYS_PROVIDER").unwrap_or_default();
    let expected = match asked.as_str() {
        "sdk" => doca_sys::Provider::Sdk,
        _ => doca_sys::Provider::Software,
    };
    assert_eq!(
        doca_sys::provider(),
        expected,
        "the suite runs on the {}, and DOCA_SYS_PROVIDER={asked:?} expects the {expected} \
         (the SDK is expected with DOCA_SYS_PROVIDER=sdk only)",
        doca_sys::provider()
    );
}

/// DOCA cannot revoke a window: configurations whose safety needs it are refused at bind,
/// with the reason; the software transport accepts them.
#[tokio::test]
async fn configurations_that_need_revocable_windows_are_refused() {
    let refused = |config: crate::ServerConfig| async move {
        crate::Server::builder()
            .config(config)
            .add_service(super::TestService::default())
            .transport(backend(false, ProgressMode::Event).transport)
            .bind("doca://127.0.0.1:0")
            .await
            .map(drop)
            .unwrap_err()
            .to_string()
    };
    let grant = refused(crate::ServerConfig {
        pull_writes: Some(false),
        ..Default::default()
    })
    .await;
    assert!(grant.contains("pull_writes = Some(false)"), "{grant}");
    let slots = refused(crate::ServerConfig {
        slot_size: 128 << 10,
        ..Default::default()
    })
    .await;
    assert!(slots.contains("slot_size"), "{slots}");
    crate::Server::builder()
        .config(crate::ServerConfig {
            pull_writes: Some(false),
            slot_size: 128 << 10,
            ..Default::default()
        })
        .add_service(super::TestService::default())
        .transport(super::tcp())
        .bind("tcp://127.0.0.1:0")
        .await
        .expect("the software transport can revoke windows");
}

/// The end-to-end suite over one DOCA mode: every test that does not need windows granted
/// from shared pools (see the module docs).
macro_rules! doca_suite {
    ($mode:ident, $oob:expr, $progress:expr) => {
        mod $mode {
            use super::*;

            fn b() -> Backend {
                backend($oob, $progress)
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn all_operations_all_sizes_byte_exact() {
                let h = Harness::default_on(&b()).await;
                checked("all operations", all_operations_all_sizes(&h)).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn connections_64_mixed_operations() {
                let h = Harness::default_on(&b()).await;
                checked("64 connections", many_connections_mixed(&h)).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn round_trips_per_path_with_pulled_writes() {
                checked("round trips", round_trips_per_path_on(&b(), true)).await;
            }

            with_suite!(doca_suite, @tests);
        }
    };
    (@tests $($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            checked(stringify!($name), super::$name(&b())).await;
        }
    )*};
}

doca_suite!(cm_event, false, ProgressMode::Event);
doca_suite!(cm_busy_poll, false, ProgressMode::BusyPoll);
doca_suite!(oob_event, true, ProgressMode::Event);
doca_suite!(oob_busy_poll, true, ProgressMode::BusyPoll);
doca_suite!(cm_spin, false, ProgressMode::Spin);

/// The hardware suite: set `RDMA_RPC_DOCA_DEVICE` (IB name or PCI address) and
/// `RDMA_RPC_DOCA_PEER` (the `doca://<ip>:<port>` address of that device's interface, where
/// the test server listens and the clients connect), build with a real SDK and run with
/// `--ignored`.
mod hardware {
    use super::*;

    fn backend() -> Option<Backend> {
        let device = std::env::var(crate::transport::doca::DEVICE_ENV).ok()?;
        let peer = std::env::var("RDMA_RPC_DOCA_PEER").ok()?;
        let config = DocaConfig {
            device: Some(device),
            ..config()
        };
        Some(Backend {
            transport: Arc::new(DocaTransport::new(config).expect("open the DOCA device")),
            bind: peer,
        })
    }

    /// The same device and port, out of band (the side channel on the port's IP).
    fn out_of_band(b: Backend) -> Backend {
        let rest = b.bind.split_once("://").map_or(b.bind.as_str(), |(_, r)| r);
        Backend {
            bind: format!("doca+oob://{rest}"),
            ..b
        }
    }

    macro_rules! hardware {
        ($($test:ident => $run:expr),* $(,)?) => {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            #[ignore = "needs an RDMA device: set RDMA_RPC_DOCA_DEVICE and RDMA_RPC_DOCA_PEER"]
            async fn $test() {
                let Some(b) = backend() else {
                    panic!("set RDMA_RPC_DOCA_DEVICE and RDMA_RPC_DOCA_PEER to run the hardware suite");
                };
                assert_eq!(doca_sys::provider(), doca_sys::Provider::Sdk, "build with doca-sys/sdk");
                let run = $run;
                bounded(stringify!($test), run(b)).await;
            }
        )*};
    }

    hardware!(
        hw_all_operations_all_sizes => |b: Backend| async move {
            let h = Harness::default_on(&b).await;
            all_operations_all_sizes(&h).await;
        },
        hw_oob_all_operations_all_sizes => |b: Backend| async move {
            let h = Harness::default_on(&out_of_band(b)).await;
            all_operations_all_sizes(&h).await;
        },
        hw_transport_conformance => |b: Backend| async move {
            use crate::transport::conformance as c;
            let (x, y) = c::pair_on(b.transport.as_ref(), &b.bind).await;
            c::send_with_immediate(&x, &y).await;
            c::write_and_read_exact(&x, &y, |_| {}).await;
            c::write_with_immediate(&x, &y).await;
            c::atomics(&x, &y).await;
            c::writes_land_before_later_sends(&x, &y).await;
        },
        hw_slot_bytes => |b: Backend| async move {
            slot_bytes_never_change_under_a_handler_on(&b).await;
        },
        hw_64_connections_mixed => |b: Backend| async move {
            let h = Harness::default_on(&b).await;
            many_connections_mixed(&h).await;
        },
        hw_out_of_order => |b: Backend| async move {
            many_calls_in_flight_on_one_connection_complete_out_of_order_on(&b).await;
        },
        hw_deadlines => |b: Backend| async move {
            deadlines_end_calls_with_deadline_exceeded_on(&b).await;
        },
        hw_graceful_shutdown => |b: Backend| async move {
            graceful_shutdown_drains_calls_in_flight_on(&b).await;
        },
        hw_malformed_frames => |b: Backend| async move {
            malformed_frames_close_that_connection_only_on(&b).await;
        },
        hw_client_dying_mid_write => |b: Backend| async move {
            client_dying_mid_write_never_reaches_the_handler_and_frees_the_buffer_on(&b).await;
        },
        hw_server_death => |b: Backend| async move {
            server_death_ends_pending_calls_promptly_on(&b).await;
        },
        hw_in_flight_limit => |b: Backend| async move {
            in_flight_limit_is_enforced_and_named_on(&b).await;
        },
        hw_connection_limit => |b: Backend| async move {
            connection_limit_is_enforced_and_named_on(&b).await;
        },
        hw_stale_descriptors => |b: Backend| async move {
            stale_descriptors_never_reach_another_connection_on(&b).await;
        },
        hw_fast_path_round_trips => |b: Backend| async move {
            round_trips_per_path_on(&b, true).await;
        },
        hw_fast_paths_concurrent => |b: Backend| async move {
            concurrent_mixed_sizes_on(&b).await;
        },
    );
}
