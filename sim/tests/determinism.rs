//! A seed reproduces everything: the same seed twice gives the same event log (compared by
//! its FNV-1a hash), whatever is kept of the log.

use sim::{faults_of, run_seed, LogMode, Options};

fn run(seed: u64, log: LogMode) -> (u64, String) {
    let opts = Options {
        log,
        ..Options::default()
    };
    match run_seed(seed, &opts) {
        Ok(o) => (o.hash, format!("{:?}", o.stats)),
        Err(f) => (0, f.to_string()),
    }
}

#[test]
fn the_same_seed_gives_the_same_event_log() {
    for seed in [0, 1, 42, 4242, 9_999, 123_456_789] {
        let a = run(seed, LogMode::Hash);
        let b = run(seed, LogMode::Hash);
        assert_eq!(a, b, "seed {seed} ran two different ways");
        assert_ne!(a.0, 0, "seed {seed}: {}", a.1);
    }
}

#[test]
fn different_seeds_give_different_logs() {
    let hashes: std::collections::BTreeSet<u64> =
        (100..120).map(|s| run(s, LogMode::Hash).0).collect();
    assert_eq!(hashes.len(), 20);
}

#[test]
fn keeping_the_log_as_text_changes_nothing() {
    for seed in [7, 77] {
        assert_eq!(run(seed, LogMode::Hash), run(seed, LogMode::Text));
        let off = run_seed(seed, &Options::default()).map(|o| o.stats);
        let hashed = run_seed(
            seed,
            &Options {
                log: LogMode::Hash,
                ..Options::default()
            },
        )
        .map(|o| o.stats);
        assert_eq!(off.ok(), hashed.ok());
    }
}

#[test]
fn a_failure_is_one_line_that_replays_it() {
    let (faults, limits) = faults_of(31);
    let f = sim::Failure {
        seed: 31,
        step: 9,
        phase: sim::Phase::Chaos,
        invariant: "something\nbroke".to_string(),
        faults,
        limits,
        log_tail: Vec::new(),
    };
    let line = f.to_string();
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(
        line.starts_with("sim failed: seed=31 step=9 phase=chaos"),
        "{line}"
    );
    assert!(
        line.contains("replay: PADDOCK_SIM_SEED=31 cargo test -p sim"),
        "{line}"
    );
    assert!(line.contains(&faults.to_string()), "{line}");
    let o = run_seed(31, &Options::default());
    if let Ok(o) = o {
        assert_eq!(o.faults, faults);
    }
}
