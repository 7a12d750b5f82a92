//! The command line of the storage binaries: `--name value` pairs, sizes with binary units
//! (`64KiB`), durations (`5s`), a usage text on `--help` or on a mistake, and what every one
//! of them does at the end (exit codes, serving until told to stop).

use std::collections::HashMap;
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

/// Parsed flags.
#[derive(Debug)]
pub struct Flags {
    values: HashMap<String, String>,
    usage: &'static str,
}

impl Flags {
    /// Parses the process arguments against `known` flag names (each takes a value). `Err`
    /// holds the message to print (the usage text for `--help`).
    pub fn parse(known: &[&str], usage: &'static str) -> Result<Flags, String> {
        Flags::from_args(std::env::args().skip(1), known, usage)
    }

    /// As [`parse`](Self::parse), from given arguments.
    pub fn from_args(
        args: impl IntoIterator<Item = String>,
        known: &[&str],
        usage: &'static str,
    ) -> Result<Flags, String> {
        let mut values = HashMap::new();
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "--help" || arg == "-h" {
                return Err(usage.to_owned());
            }
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
                None => (arg.clone(), None),
            };
            if !known.contains(&name.as_str()) {
                return Err(format!("unknown argument `{arg}`\n\n{usage}"));
            }
            let value = match inline.or_else(|| args.next()) {
                Some(v) => v,
                None => return Err(format!("{name} needs a value\n\n{usage}")),
            };
            values.insert(name, value);
        }
        Ok(Flags { values, usage })
    }

    /// The value of `name`, if given.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// The value of `name`, or `default`.
    pub fn string(&self, name: &str, default: &str) -> String {
        self.get(name).unwrap_or(default).to_owned()
    }

    /// A required value.
    pub fn required(&self, name: &str) -> Result<String, String> {
        self.get(name)
            .map(str::to_owned)
            .ok_or_else(|| format!("{name} is required\n\n{}", self.usage))
    }

    /// A number.
    pub fn number(&self, name: &str, default: u64) -> Result<u64, String> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("{name}: `{v}` is not a whole number")),
        }
    }

    /// A size: a whole number of bytes, or with `KiB`, `MiB`, `GiB`.
    pub fn size(&self, name: &str, default: usize) -> Result<usize, String> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => parse_size(v).ok_or_else(|| {
                format!("{name}: `{v}` is not a size (a number of bytes, or with KiB, MiB, GiB)")
            }),
        }
    }

    /// A duration: a whole number with `ms`, `s` or `m`.
    pub fn duration(&self, name: &str, default: Duration) -> Result<Duration, String> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => parse_duration(v)
                .ok_or_else(|| format!("{name}: `{v}` is not a duration (like 500ms, 5s, 2m)")),
        }
    }
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

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn values_sizes_durations_and_mistakes() {
        let known = ["--block-size", "--control-timeout", "--blocks"];
        let f = Flags::from_args(
            args(&["--block-size", "64KiB", "--control-timeout=2s"]),
            &known,
            "usage",
        )
        .unwrap();
        assert_eq!(f.size("--block-size", 0).unwrap(), 65536);
        assert_eq!(
            f.duration("--control-timeout", Duration::ZERO).unwrap(),
            Duration::from_secs(2)
        );
        assert_eq!(f.number("--blocks", 7).unwrap(), 7);
        assert!(Flags::from_args(args(&["--nope", "1"]), &known, "usage")
            .unwrap_err()
            .contains("unknown"));
        assert!(Flags::from_args(args(&["--blocks"]), &known, "usage")
            .unwrap_err()
            .contains("needs a value"));
        assert_eq!(
            Flags::from_args(args(&["--help"]), &known, "usage").unwrap_err(),
            "usage"
        );
        for bad in ["64KB", "4K", "x", ""] {
            assert_eq!(parse_size(bad), None, "{bad}");
        }
        assert_eq!(parse_duration("5"), None);
    }
}
