//! The storage application as separate processes, as on separate machines: three
//! `storage-target`s, a `storage-service` and a `storage-initiator`, each with a data path per
//! core (`--cores 2`), over TCP on loopback. Every block is read back exactly, the initiator
//! shuts the others down, and each of them says that its work ran on its cores' threads and
//! on both of them.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const TARGET_SECRET: &str = "a-target-secret-for-this-test";
const SERVICE_SECRET: &str = "a-service-secret-for-this-test";
/// Longest a process may take to print its address or to exit once told to: far beyond
/// what a debug build on a loaded machine needs, so only a hang reaches it.
const PATIENCE: Duration = Duration::from_secs(120);

/// A process of the test, killed if the test ends before it exits.
struct Process {
    name: String,
    child: Child,
    stdout: Option<BufReader<ChildStdout>>,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Process {
    fn start(bin: &str, args: &[&str]) -> Process {
        let mut child = Command::new(bin)
            .args(args)
            .env("STORAGE_TARGET_SECRET", TARGET_SECRET)
            .env("STORAGE_SERVICE_SECRET", SERVICE_SECRET)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        let stdout = child.stdout.take().map(BufReader::new);
        Process {
            name: format!("{bin} {}", args.join(" ")),
            child,
            stdout,
        }
    }

    /// The addresses of the first line it prints, `... on ADDR,ADDR: ...`, read within
    /// [`PATIENCE`].
    fn addresses(&mut self) -> String {
        let mut stdout = self.stdout.take().expect("read once");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let read = stdout.read_line(&mut line).map(|_| line);
            let _ = tx.send((read, stdout));
        });
        let (line, stdout) = rx
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("{}: printed no address", self.name));
        self.stdout = Some(stdout);
        let line = line.unwrap();
        let addrs = line
            .split_once(" on ")
            .and_then(|(_, rest)| rest.split_once(": "))
            .map(|(addrs, _)| addrs.to_owned())
            .unwrap_or_else(|| panic!("{}: no addresses in {line:?}", self.name));
        assert_eq!(
            addrs.split(',').count(),
            2,
            "{}: a listener per core: {line:?}",
            self.name
        );
        addrs
    }

    /// Waits (within [`PATIENCE`]) for it to exit on its own: the rest of what it printed.
    fn finish(mut self) -> String {
        let mut stdout = self.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = tx.send(stdout.read_to_string(&mut rest).map(|_| rest));
        });
        // Its stdout closes when it exits.
        let rest = rx
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("{}: did not exit", self.name))
            .unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{}: {status}; printed {rest}", self.name);
        rest
    }
}

/// The counts of a `... on each core's thread: 3, 4 (elsewhere: 0)` line of `out`.
fn per_core(out: &str, what: &str) -> (Vec<u64>, u64) {
    let line = out
        .lines()
        .find(|l| l.starts_with(what) && l.contains(" on each core's thread: "))
        .unwrap_or_else(|| panic!("no `{what}` line in {out}"));
    let (_, counts) = line.split_once(": ").unwrap();
    let (by_core, elsewhere) = counts.split_once(" (elsewhere: ").unwrap();
    let by_core = by_core.split(", ").map(|n| n.parse().unwrap()).collect();
    (by_core, elsewhere.trim_end_matches(')').parse().unwrap())
}

#[test]
fn the_binaries_run_a_data_path_per_core() {
    let blocks = 120u64;
    let mut targets: Vec<Process> = ["data1", "data2", "parity"]
        .into_iter()
        .map(|slot| {
            Process::start(
                env!("CARGO_BIN_EXE_storage-target"),
                &[
                    "--listen",
                    "tcp://127.0.0.1:0",
                    "--cores",
                    "2",
                    "--slot",
                    slot,
                    "--block-count",
                    "256",
                ],
            )
        })
        .collect();
    let addrs: Vec<String> = targets.iter_mut().map(Process::addresses).collect();
    let mut service = Process::start(
        env!("CARGO_BIN_EXE_storage-service"),
        &[
            "--listen",
            "tcp://127.0.0.1:0",
            "--cores",
            "2",
            "--data-1-storage",
            &addrs[0],
            "--data-2-storage",
            &addrs[1],
            "--data-p-storage",
            &addrs[2],
            "--trigger-recovery-read-every-n",
            "4",
        ],
    );
    let service_addrs = service.addresses();
    let initiator = Process::start(
        env!("CARGO_BIN_EXE_storage-initiator"),
        &[
            "--storage-server",
            &service_addrs,
            "--cores",
            "2",
            "--blocks",
            &blocks.to_string(),
            "--transactions-per-core",
            "4",
            "--shutdown",
            "yes",
        ],
    );
    let report = initiator.finish();
    assert!(
        report.contains(&format!("all {blocks} blocks verified")),
        "{report}"
    );

    let out = service.finish();
    let (by_core, elsewhere) = per_core(&out, "I/Os the service started");
    assert_eq!(elsewhere, 0, "every I/O on a core's thread: {out}");
    assert_eq!(by_core.iter().sum::<u64>(), 2 * blocks, "{out}");
    assert!(
        by_core.iter().all(|&n| n > 0),
        "both cores served I/O: {out}"
    );

    // Data 1 moves a half in every write and read, data 2 in the reads that do not recover,
    // the parity in those that do (every 4th).
    let recoveries = blocks / 4;
    let moved = [2 * blocks, 2 * blocks - recoveries, blocks + recoveries];
    for ((target, slot), moved) in targets
        .into_iter()
        .zip(["data 1", "data 2", "parity"])
        .zip(moved)
    {
        let out = target.finish();
        assert!(out.contains("shut down by the service"), "{out}");
        let (by_core, elsewhere) = per_core(&out, &format!("{slot} halves moved"));
        assert_eq!(elsewhere, 0, "{slot}: every half on a core's thread: {out}");
        assert_eq!(by_core.iter().sum::<u64>(), moved, "{slot}: {out}");
        assert!(by_core.iter().all(|&n| n > 0), "{slot}: both cores: {out}");
    }
}
