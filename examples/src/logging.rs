//! Logs for the example binaries: `tracing` to stderr, filtered by `RUST_LOG` (warnings by
//! default, so a dropped connection or a refused call shows up with its reason).

/// Installs the subscriber once; later calls do nothing.
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
