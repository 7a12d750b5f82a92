//! The simulation's runs: thousands of seeds per scenario (`SIM_SEEDS` sets how many,
//! `SIM_SEED` replays one).

use super::model::{run, Scenario};

/// Seeds per scenario: `SIM_SEEDS`, or a default that keeps the suite quick.
fn seeds(default: u64) -> std::ops::Range<u64> {
    if let Some(seed) = std::env::var("SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        return seed..seed + 1;
    }
    let n = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    1..n + 1
}

/// Runs `scenario` over the seeds; prints how many and what they did; fails on the first seed
/// that breaks a rule, naming it.
fn sweep(name: &str, scenario: &Scenario, default: u64) {
    let mut totals = (0usize, 0usize, 0usize, 0u64, 0usize);
    let seeds = seeds(default);
    let count = seeds.end - seeds.start;
    for seed in seeds {
        match run(seed, scenario) {
            Ok(out) => {
                totals.0 += out.responses;
                totals.1 += out.ended;
                totals.2 += out.abandoned;
                totals.3 += out.frames;
                totals.4 += out.revocations;
            }
            Err(e) => panic!("simulation `{name}` failed: {e}\nreplay: SIM_SEED={seed}"),
        }
    }
    println!(
        "simulation `{name}`: {count} seeds; {} responses, {} ended with the connection, {} \
         abandoned, {} frames, {} revocations",
        totals.0, totals.1, totals.2, totals.3, totals.4
    );
}

#[test]
fn busy_connections_keep_every_rule() {
    sweep("busy", &Scenario::busy(), 1000);
}

#[test]
fn connections_short_of_receives_never_overrun_them() {
    let scenario = Scenario {
        calls: 300,
        depth: 32,
        receives: [(4, 4), (4, 4)],
        max_in_flight: 32,
        ..Scenario::busy()
    };
    sweep("tight", &scenario, 500);
}

#[test]
fn links_that_fail_end_every_call_once() {
    let scenario = Scenario {
        fail_one_in: 2000,
        leave_at_end: false,
        ..Scenario::busy()
    };
    sweep("failing", &scenario, 500);
}

#[test]
fn a_server_that_shuts_down_answers_what_it_started() {
    let scenario = Scenario {
        shutdown_after: Some(60),
        leave_at_end: false,
        ..Scenario::busy()
    };
    sweep("shutdown", &scenario, 500);
}

#[test]
fn hostile_clients_lose_their_connection_and_nothing_else() {
    let count = super::hostile::sweep(seeds(2000));
    println!(
        "simulation `hostile`: {count} seeds; every frame no client may send ended its \
         connection with a goaway, every useless one left it serving"
    );
}
