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
use super::fast_paths::*;
use super::faults::*;
use super::{bounded, Backend, Harness};
use crate::transport::doca::{DocaConfig, DocaTransport};

fn config() -> DocaConfig {
    DocaConfig {
        rnr_timeout: Duration::from_secs(5),
        ..DocaConfig::from_env()
    }
}

/// DOCA over RDMA CM on loopback (software provider).
fn doca() -> Backend {
    Backend {
        transport: Arc::new(DocaTransport::new(config()).expect("a DOCA device")),
        bind: "doca://127.0.0.1:0".into(),
    }
}

/// DOCA out of band (blobs over a TCP side channel).
fn doca_oob() -> Backend {
    Backend {
        bind: "doca+oob://127.0.0.1:0".into(),
        ..doca()
    }
}

#[test]
fn the_suite_runs_on_the_expected_provider() {
    // The default build has no SDK; a build with `doca-sys/sdk` reports the SDK.
    println!("DOCA provider: {}", doca_sys::provider());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doca_all_operations_all_sizes_byte_exact() {
    let h = Harness::default_on(&doca()).await;
    bounded("all operations", all_operations_all_sizes(&h)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doca_oob_all_operations_all_sizes_byte_exact() {
    let h = Harness::default_on(&doca_oob()).await;
    bounded("all operations", all_operations_all_sizes(&h)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doca_64_connections_mixed_operations() {
    let h = Harness::default_on(&doca()).await;
    bounded("64 connections", many_connections_mixed(&h)).await;
}

macro_rules! doca_suite {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            bounded(stringify!($name), super::$name(&doca())).await;
        }
    )*};
}

mod e2e {
    use super::*;

    doca_suite!(
        many_calls_in_flight_on_one_connection_complete_out_of_order_on,
        deadlines_end_calls_with_deadline_exceeded_on,
        graceful_shutdown_drains_calls_in_flight_on,
    );
}

mod fast_paths {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn round_trips_per_path_with_pulled_writes() {
        bounded("round trips", round_trips_per_path_on(&doca(), true)).await;
    }

    doca_suite!(
        calls_without_a_free_slot_take_the_other_path_on,
        slots_off_and_growing_results_stay_exact_on,
        abandoned_reads_keep_their_window_until_the_response_on,
        concurrent_mixed_sizes_on,
    );
}

mod faults {
    use super::*;

    // The DOCA path is fast enough to catch a call still counted in flight after its
    // response; the server now leaves the in-flight set before answering (server/call.rs).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn well_behaved_clients_wait_instead_of_exceeding_the_in_flight_limit_on() {
        bounded(
            "in-flight limit",
            super::well_behaved_clients_wait_instead_of_exceeding_the_in_flight_limit_on(&doca()),
        )
        .await;
    }

    doca_suite!(
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
    );
}

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
