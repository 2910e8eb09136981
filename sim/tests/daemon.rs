//! The daemon's other parts (tasks, campaigns, crashes, the shutdown) over many seeds:
//! `sim::daemon`. With `PADDOCK_SIM_SEED=N` it replays that one seed.
//!
//! - `PADDOCK_SIM_SEED=N`: replay seed N only.
//! - `PADDOCK_SIM_DAEMON_SEEDS=N`: explore N seeds (default 2,000: the CI set, ~0.8 M steps,
//!   ~30 s in a debug build).

use sim::daemon::{run_daemon_seed, DaemonStats};

/// The CI set: seeds 0..2_000.
const CI_SEEDS: u64 = 2_000;

#[allow(
    clippy::disallowed_methods,
    reason = "the sweep's seeds come from the environment; the runs do not"
)]
fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    match v.trim().parse() {
        Ok(n) => Some(n),
        Err(_) => panic!("{name}={v:?} is not a number"),
    }
}

#[test]
fn tasks_campaigns_crashes_and_the_shutdown() {
    let seeds = match env_u64("PADDOCK_SIM_SEED") {
        Some(seed) => seed..seed + 1,
        None => 0..env_u64("PADDOCK_SIM_DAEMON_SEEDS").unwrap_or(CI_SEEDS),
    };
    let n = seeds.end - seeds.start;
    let mut total = DaemonStats::default();
    for seed in seeds {
        match run_daemon_seed(seed) {
            Ok(s) => total.add(&s),
            Err(e) => panic!("{e}"),
        }
    }
    println!("daemon sim: {n} seeds: {total:?}");
    if n == CI_SEEDS {
        // The sweep reaches every way a task ends, the escalation, orphans and refusals.
        for (what, count) in [
            ("completed", total.completed),
            ("failed", total.failed),
            ("cancelled", total.cancelled),
            ("timed out", total.timed_out),
            ("TERMs", total.terms),
            ("KILLs after the grace", total.kills),
            (
                "orphaned task processes killed at start-up",
                total.orphans_killed,
            ),
            ("launches refused", total.refused),
            ("campaign names refused", total.campaigns_refused),
        ] {
            assert!(count > 0, "the CI seeds never reach: {what} ({total:?})");
        }
    }
}
