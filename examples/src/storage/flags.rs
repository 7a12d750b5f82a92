//! What the storage binaries share on their command lines (parsed by clap): sizes with binary
//! units (`64KiB`), durations (`5s`), the machine's cores, and what every one of them does at
//! the end (exit codes, serving until told to stop).

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use rdma_rpc_core::BoundServer;

/// The exit of binary `name`: 0, or 1 with `name: error` on stderr.
pub fn exit(name: &str, result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Serves until `down` resolves (`by` asked for it) or Ctrl-C; calls in flight finish first.
pub async fn serve_until(
    server: BoundServer,
    down: impl Future<Output = ()> + Send,
    by: &str,
) -> Result<(), String> {
    server
        .serve_with_shutdown(async move {
            tokio::select! {
                _ = down => println!("shut down by {by}"),
                _ = tokio::signal::ctrl_c() => println!("interrupted"),
            }
        })
        .await
        .map_err(|e| e.to_string())
}

/// This machine's cores (what `--cores` defaults to): one data path each.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A clap value parser for sizes: a whole number of bytes, or with `KiB`, `MiB`, `GiB`.
pub fn size(v: &str) -> Result<usize, String> {
    parse_size(v)
        .ok_or_else(|| format!("`{v}` is not a size (a number of bytes, or with KiB, MiB, GiB)"))
}

/// A clap value parser for durations: a whole number with `ms`, `s` or `m`.
pub fn duration(v: &str) -> Result<Duration, String> {
    parse_duration(v).ok_or_else(|| format!("`{v}` is not a duration (like 500ms, 5s, 2m)"))
}

/// `4096`, `64KiB`, `1MiB`.
pub fn parse_size(v: &str) -> Option<usize> {
    let (digits, unit) = v.split_at(v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len()));
    let n: usize = digits.parse().ok()?;
    let scale = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale)
}

/// `500ms`, `5s`, `2m`.
pub fn parse_duration(v: &str) -> Option<Duration> {
    let (digits, unit) = v.split_at(v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len()));
    let n: u64 = digits.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations() {
        assert_eq!(size("64KiB").unwrap(), 65536);
        assert_eq!(size("4096").unwrap(), 4096);
        assert_eq!(duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(duration("500ms").unwrap(), Duration::from_millis(500));
        for bad in ["64KB", "4K", "x", ""] {
            assert!(size(bad).unwrap_err().contains("not a size"), "{bad}");
        }
        assert!(duration("5").unwrap_err().contains("not a duration"));
    }
}
