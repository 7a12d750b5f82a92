//! The standard health service end to end (issue 30, item 4): `check`, a `watch` that sees
//! each change, an unknown service, the server's interceptors applied to health calls, and a
//! watch ended by the server's shutdown.

mod common;

use rdma_rpc_core::health::{
    HealthCheckRequest, HealthCheckResponse, HealthClient, HealthReporter, ServingStatus,
    SERVICE_NAME,
};
use rdma_rpc_core::interceptor::{IncomingCall, OutgoingCall};
use rdma_rpc_core::{Client, ClientConfig, Code, Request, Server, ServerConfig, Status, Streaming};

const TOKEN: &str = "Bearer 0123";

/// A failure bound for each test, never what it asserts.
async fn bounded<F: std::future::Future>(test: F) -> F::Output {
    common::bounded("the test", 60, test).await
}

/// The Echo service and health, behind an interceptor that wants a token on every call.
async fn server(health: &HealthReporter) -> (String, tokio::sync::oneshot::Sender<()>) {
    server_with(health, ServerConfig::default()).await
}

/// [`server`] with `config`.
async fn server_with(
    health: &HealthReporter,
    config: ServerConfig,
) -> (String, tokio::sync::oneshot::Sender<()>) {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = Server::builder()
        .config(config)
        .interceptor(
            |call: &mut IncomingCall<'_>| match call.metadata().get_str("authorization") {
                Some(TOKEN) => Ok(()),
                _ => Err(Status::new(Code::Unauthenticated, "no valid token")),
            },
        )
        .add_service(common::Echo)
        .add_health(health)
        .bind("tcp://127.0.0.1:0")
        .await
        .unwrap();
    let addr = server.local_addr();
    tokio::spawn(server.serve_with_shutdown(async {
        let _ = stopped.await;
    }));
    (addr, stop)
}

/// A health client whose calls carry the token.
async fn client(addr: &str) -> HealthClient {
    client_with(addr, ClientConfig::default()).await
}

/// [`client`] with `config`.
async fn client_with(addr: &str, config: ClientConfig) -> HealthClient {
    let client = Client::builder()
        .config(config)
        .interceptor(|call: &mut OutgoingCall<'_>| {
            call.metadata_mut().insert("authorization", TOKEN);
            Ok(())
        })
        .connect(addr)
        .await
        .unwrap();
    HealthClient::new(client)
}

/// The next status a watch streams; `None` once it ended.
async fn next(stream: &mut Streaming<HealthCheckResponse>) -> Option<ServingStatus> {
    stream.message().await.unwrap().map(|r| r.status())
}

async fn check(health: &HealthClient, service: &str) -> ServingStatus {
    health
        .check(HealthCheckRequest::new(service))
        .await
        .unwrap()
        .status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_answers_per_service_and_for_the_server() {
    bounded(async {
        let reporter = HealthReporter::new();
        reporter.set_not_serving("Storage"); // set before the server binds: kept
        let (addr, _stop) = server(&reporter).await;
        let health = client(&addr).await;
        assert_eq!(check(&health, "").await, ServingStatus::Serving);
        assert_eq!(
            check(&health, "Echo").await,
            ServingStatus::Serving,
            "added"
        );
        assert_eq!(check(&health, "Storage").await, ServingStatus::NotServing);
        assert_eq!(
            check(&health, "Nope").await,
            ServingStatus::ServiceUnknown,
            "a name never set"
        );
        assert_eq!(reporter.status(SERVICE_NAME), ServingStatus::ServiceUnknown);
        reporter.set_not_serving("");
        assert_eq!(check(&health, "").await, ServingStatus::NotServing);
        reporter.clear_status("Echo");
        assert_eq!(check(&health, "Echo").await, ServingStatus::ServiceUnknown);
        health.inner().shutdown().await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_each_change_and_the_shutdown() {
    watch_sees_each_change_and_the_shutdown_with(4, 64).await;
}

/// With 4 receives on each side and no growth, the server's last messages wait for credits
/// when it shuts down: they still reach the client before the connection ends. (They were
/// dropped before a graceful end drained them; and the client stopped reading its connection
/// once the goaway came, so the end of the first watch never arrived.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_each_change_and_the_shutdown_with_four_receives() {
    watch_sees_each_change_and_the_shutdown_with(4, 4).await;
}

async fn watch_sees_each_change_and_the_shutdown_with(initial: u32, most: u32) {
    bounded(async {
        let reporter = HealthReporter::new();
        let mut server_config = ServerConfig::default();
        server_config.initial_receives = initial;
        server_config.recv_credits = most;
        let mut client_config = ClientConfig::default();
        client_config.initial_receives = initial;
        client_config.recv_credits = most;
        let (addr, stop) = server_with(&reporter, server_config).await;
        let health = client_with(&addr, client_config).await;
        let mut echo = health.watch(HealthCheckRequest::new("Echo")).await.unwrap();
        let mut later = health
            .watch(HealthCheckRequest::new("Later"))
            .await
            .unwrap();
        assert_eq!(
            next(&mut echo).await,
            Some(ServingStatus::Serving),
            "at once"
        );
        assert_eq!(next(&mut later).await, Some(ServingStatus::ServiceUnknown));

        reporter.set_not_serving("Echo");
        assert_eq!(next(&mut echo).await, Some(ServingStatus::NotServing));
        // A status set again unchanged sends nothing: the next message is the next change.
        reporter.set_not_serving("Echo");
        reporter.set_serving("Later");
        assert_eq!(next(&mut later).await, Some(ServingStatus::Serving));
        reporter.set_serving("Echo");
        assert_eq!(next(&mut echo).await, Some(ServingStatus::Serving));

        // The server shuts down: NOT_SERVING, then the end of each watch.
        stop.send(()).unwrap();
        assert_eq!(next(&mut echo).await, Some(ServingStatus::NotServing));
        assert_eq!(next(&mut echo).await, None);
        assert_eq!(next(&mut later).await, Some(ServingStatus::NotServing));
        assert_eq!(next(&mut later).await, None);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_interceptors_apply_to_health_calls() {
    bounded(async {
        let reporter = HealthReporter::new();
        let (addr, _stop) = server(&reporter).await;
        let bare = HealthClient::connect(&addr).await.unwrap();
        let err = bare.check(HealthCheckRequest::new("")).await.unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{err}");
        let err = match bare.watch(HealthCheckRequest::new("Echo")).await {
            Err(err) => err,
            Ok(mut stream) => stream.message().await.unwrap_err(),
        };
        assert_eq!(err.code(), Code::Unauthenticated, "{err}");
        // The token in the request's own metadata does as well as a client interceptor.
        let mut request = Request::new(HealthCheckRequest::new(""));
        request.metadata_mut().insert("authorization", TOKEN);
        let response = bare.check(request).await.unwrap();
        assert_eq!(response.status(), ServingStatus::Serving);
        bare.inner().shutdown().await;
    })
    .await;
}
