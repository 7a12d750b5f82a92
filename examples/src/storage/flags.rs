//! What the storage binaries share on their command lines (parsed by clap): sizes with binary
//! units (`64KiB`), durations (`5s`), counts of at least one (which `bench` and `callcost`
//! use too), the machine's cores, and what every one of them does at the end (exit codes,
//! serving until told to stop).

use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use rdma_rpc_core::server::ServerBuilder;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

use super::cores::{serve_on, CoreThreads};

/// A count that must be at least 1 (clap parser): `--cores 0` or `--blocks 0` is refused at
/// once rather than run as something else.
pub fn at_least_one<T>(v: &str) -> Result<T, String>
where
    T: std::str::FromStr + Default + PartialEq,
    T::Err: std::fmt::Display,
{
    match v.parse::<T>() {
        Ok(n) if n == T::default() => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

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

/// The addresses a binary listens on, one per core: each of `listen` when several are given
/// (then `cores`, if given, must be their number), or `cores` (default: this machine's)
/// consecutive ports from the one given (`tcp://0.0.0.0:7481` and 2 cores: ports 7481 and
/// 7482; port 0: a port of its own each).
pub fn listen_addrs(listen: &[String], cores: Option<usize>) -> Result<Vec<String>, String> {
    match (listen, cores) {
        ([], _) => Err("give an address to listen on (--listen)".to_owned()),
        ([one], cores) => {
            let cores = cores.unwrap_or_else(self::cores);
            if cores == 0 {
                return Err("--cores must be at least 1".to_owned());
            }
            if cores == 1 {
                return Ok(vec![one.clone()]);
            }
            let (head, port) = split_port(one).ok_or_else(|| {
                format!(
                    "`{one}` has no port to count {cores} listeners from: give one --listen \
                     per core, or --cores 1"
                )
            })?;
            (0..cores)
                .map(|k| match port {
                    0 => Ok(one.clone()),
                    _ => u16::try_from(u32::from(port) + k as u32)
                        .map(|p| format!("{head}:{p}"))
                        .map_err(|_| format!("{cores} ports from {port} go beyond 65535")),
                })
                .collect()
        }
        (several, Some(cores)) if cores != several.len() => Err(format!(
            "{} addresses to listen on and --cores {cores}: give one address (one port per \
             core counts from it) or one per core",
            several.len()
        )),
        (several, _) => Ok(several.to_vec()),
    }
}

/// `scheme://host` and the port of `scheme://host:port` (IPv6 hosts in brackets).
fn split_port(addr: &str) -> Option<(&str, u16)> {
    let (head, port) = addr.rsplit_once(':')?;
    if head.ends_with(':') || !head.contains("://") || head.ends_with('/') {
        return None;
    }
    Some((head, port.parse().ok()?))
}

/// A binary's listeners, one per core, each served on its core's thread.
#[derive(Debug)]
pub struct Listeners {
    /// Where each listens, in core order.
    pub addrs: Vec<String>,
    tasks: Vec<JoinHandle<rdma_rpc_core::Result<()>>>,
    stop: watch::Sender<bool>,
}

impl Listeners {
    /// Binds one server per address of `binds` on the core of the same index (`server` makes
    /// each one's builder), and serves until [`Listeners::serve_until`] stops them.
    pub async fn bind(
        threads: &CoreThreads,
        binds: &[String],
        mut server: impl FnMut() -> ServerBuilder,
    ) -> Result<Listeners, String> {
        let (stop, stopped) = watch::channel(false);
        let mut listeners = Listeners {
            addrs: Vec::new(),
            tasks: Vec::new(),
            stop,
        };
        for (core, bind) in binds.iter().enumerate() {
            let mut stopped = stopped.clone();
            let shutdown = async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            let (addr, task) = serve_on(Some(threads), core, server(), bind, shutdown)
                .await
                .map_err(|e| format!("cannot listen on {bind}: {e}"))?;
            listeners.addrs.push(addr);
            listeners.tasks.push(task);
        }
        Ok(listeners)
    }

    /// Serves until `down` resolves (`by` asked for it), Ctrl-C, or a listener ends; calls in
    /// flight finish first. A listener that ended on its own, or any listener's error, is an
    /// error.
    pub async fn serve_until(
        self,
        down: impl Future<Output = ()> + Send,
        by: &str,
    ) -> Result<(), String> {
        let mut running = JoinSet::new();
        for (core, task) in self.tasks.into_iter().enumerate() {
            running.spawn(async move { (core, task.await) });
        }
        let mut first = tokio::select! {
            _ = down => { println!("shut down by {by}"); None }
            _ = tokio::signal::ctrl_c() => { println!("interrupted"); None }
            Some(Ok((core, ended))) = running.join_next() => {
                Some(format!("the listener of core {core} stopped: {}", outcome(ended)))
            }
        };
        self.stop.send_replace(true);
        while let Some(joined) = running.join_next().await {
            let problem = match joined {
                Ok((_, Ok(Ok(())))) => continue,
                Ok((core, ended)) => format!("the listener of core {core}: {}", outcome(ended)),
                Err(e) => e.to_string(),
            };
            first.get_or_insert(problem);
        }
        first.map_or(Ok(()), Err)
    }
}

fn outcome(ended: Result<rdma_rpc_core::Result<()>, tokio::task::JoinError>) -> String {
    match ended {
        Ok(Ok(())) => "ended on its own".to_owned(),
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    }
}

/// How many data paths `--cores` and `--cpu` ask for: one per `--cpu` when any is given (then
/// `--cores`, if given, must be as many), else `--cores` (`None`: the default).
pub fn cores_for(cores: Option<usize>, cpus: &[usize]) -> Result<Option<usize>, String> {
    match (cores, cpus.len()) {
        (cores, 0) => Ok(cores),
        (Some(n), pinned) if n != pinned => Err(format!(
            "--cores {n} and {pinned} --cpu: one data path runs per --cpu, so give as many or \
             only one of the two"
        )),
        (_, pinned) => Ok(Some(pinned)),
    }
}

/// The data paths' threads: one pinned to each CPU of `cpus` when any is given (`cores` is
/// then their number, as [`cores_for`] made it), else `cores` wherever the OS schedules them.
pub fn core_threads(cores: usize, cpus: &[usize]) -> Result<Arc<CoreThreads>, String> {
    if cpus.is_empty() {
        return CoreThreads::start(cores).map_err(|e| format!("starting {cores} threads: {e}"));
    }
    if cpus.len() != cores {
        return Err(format!(
            "{} --cpu for {cores} data paths: give one --cpu per data path",
            cpus.len()
        ));
    }
    CoreThreads::start_pinned(cpus).map_err(|e| e.to_string())
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

    #[test]
    fn counts_start_at_one() {
        assert_eq!(at_least_one::<usize>("2").unwrap(), 2);
        assert_eq!(at_least_one::<u64>("8000").unwrap(), 8000);
        assert_eq!(at_least_one::<u32>("0").unwrap_err(), "must be at least 1");
        assert!(at_least_one::<usize>("-1").is_err());
        assert!(at_least_one::<u64>("many").is_err());
    }

    #[test]
    fn cpus_set_the_number_of_data_paths() {
        assert_eq!(cores_for(None, &[]).unwrap(), None);
        assert_eq!(cores_for(Some(3), &[]).unwrap(), Some(3));
        assert_eq!(cores_for(None, &[2, 5]).unwrap(), Some(2));
        assert_eq!(cores_for(Some(2), &[2, 5]).unwrap(), Some(2));
        let e = cores_for(Some(3), &[2, 5]).unwrap_err();
        assert!(e.contains("--cores 3 and 2 --cpu"), "{e}");
        let e = core_threads(3, &[0]).unwrap_err();
        assert!(e.contains("1 --cpu for 3 data paths"), "{e}");
    }

    #[test]
    fn listeners_count_ports_from_the_one_given_or_take_one_address_per_core() {
        let one = |a: &str, cores| listen_addrs(&[a.to_owned()], cores);
        assert_eq!(
            one("tcp://0.0.0.0:7481", Some(3)).unwrap(),
            [
                "tcp://0.0.0.0:7481",
                "tcp://0.0.0.0:7482",
                "tcp://0.0.0.0:7483"
            ]
        );
        assert_eq!(
            one("doca://[fe80::1]:9000", Some(2)).unwrap(),
            ["doca://[fe80::1]:9000", "doca://[fe80::1]:9001"]
        );
        // Port 0: each listener takes a port of its own.
        assert_eq!(
            one("tcp://127.0.0.1:0", Some(2)).unwrap(),
            ["tcp://127.0.0.1:0"; 2]
        );
        // One core needs no port to count from.
        assert_eq!(one("mem://storage", Some(1)).unwrap(), ["mem://storage"]);
        assert_eq!(one("tcp://h:7481", None).unwrap().len(), cores());

        let several = ["tcp://a:1".to_owned(), "tcp://b:2".to_owned()];
        assert_eq!(listen_addrs(&several, None).unwrap(), several);
        assert_eq!(listen_addrs(&several, Some(2)).unwrap(), several);

        let refused = [
            (
                one("mem://storage", Some(2)),
                "no port to count 2 listeners from",
            ),
            (one("tcp://h", Some(2)), "no port"),
            (one("tcp://h:65535", Some(2)), "beyond 65535"),
            (one("tcp://h:7481", Some(0)), "at least 1"),
            (
                listen_addrs(&several, Some(3)),
                "2 addresses to listen on and --cores 3",
            ),
            (listen_addrs(&[], None), "give an address"),
        ];
        for (outcome, expected) in refused {
            let e = outcome.unwrap_err();
            assert!(e.contains(expected), "{e:?} should say {expected:?}");
        }
    }
}
