//! The seed sweep: many seeds, every invariant after every step, then the coverage of the
//! transition table. With `PADDOCK_SIM_SEED=N` it replays that one seed instead, printing the
//! tail of its event log if it fails.
//!
//! - `PADDOCK_SIM_SEED=N`: replay seed N only.
//! - `PADDOCK_SIM_SEEDS=N`: explore N seeds (default 10,000: the CI set).
//! - `PADDOCK_SIM_SEED_START=S`: start at seed S (default 0).

use std::sync::mpsc;

use sim::{run_seed, Coverage, Failure, LogMode, Options, Outcome};

/// The CI set: seeds 0..10_000.
const CI_SEEDS: u64 = 10_000;
/// The CI set must simulate at least this many steps in total.
const CI_MIN_STEPS: u64 = 1_000_000;

#[allow(
    clippy::disallowed_methods,
    reason = "the sweep's seeds and tail length come from the environment; the runs do not"
)]
fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    match v.trim().parse() {
        Ok(n) => Some(n),
        Err(_) => panic!("{name}={v:?} is not a number"),
    }
}

#[test]
#[allow(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "the sweep spreads seeds over threads and times itself; each seed runs on one thread"
)]
fn sweep() {
    if let Some(seed) = env_u64("PADDOCK_SIM_SEED") {
        return replay(seed);
    }
    let n = env_u64("PADDOCK_SIM_SEEDS").unwrap_or(CI_SEEDS);
    let start = env_u64("PADDOCK_SIM_SEED_START").unwrap_or(0);
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8) as u64;
    let t0 = std::time::Instant::now();

    let (tx, rx) = mpsc::channel::<Result<Outcome, Box<Failure>>>();
    std::thread::scope(|scope| {
        for k in 0..threads {
            let tx = tx.clone();
            scope.spawn(move || {
                let mut seed = start + k;
                while seed < start + n {
                    let r = run_seed(seed, &Options::default());
                    if tx.send(r).is_err() {
                        return;
                    }
                    seed += threads;
                }
            });
        }
        drop(tx);
    });

    let mut coverage = Coverage::default();
    let mut failures: Vec<Failure> = Vec::new();
    let (mut steps, mut crashes, mut mid, mut sessions, mut turns, mut sim_ms) = (0, 0, 0, 0, 0, 0);
    let (mut requests, mut lost, mut cut) = (0, 0, 0);
    let (mut survived, mut adopted, mut turns_adopted, mut redelivered, mut replays) =
        (0, 0, 0, 0, 0);
    let (mut orphans, mut stale, mut revived, mut recalled, mut evicted) = (0, 0, 0, 0, 0);
    let (mut unlisted, mut unread) = (0, 0);
    let mut m = sim::model::ModelStats::default();
    let (mut scripted, mut received) = (0, 0);
    let (mut provisions, mut provisions_failed, mut provisions_hung, mut provisions_dropped) =
        (0, 0, 0, 0);
    let (mut shutdowns, mut spawns_after_shutdown) = (0, 0);
    let (mut batches, mut batched, mut request_batches) = (0, 0, 0);
    for r in rx {
        match r {
            Ok(o) => {
                steps += o.stats.steps;
                crashes += o.stats.crashes;
                mid += o.stats.crashes_mid_step;
                survived += o.stats.runner_survived;
                adopted += o.stats.adopted;
                turns_adopted += o.stats.model.turns_adopted;
                redelivered += o.stats.redelivered;
                replays += o.stats.model.replays_ignored;
                orphans += o.stats.orphans;
                stale += o.stats.stale_listed;
                recalled += o.stats.recalled;
                evicted += o.stats.evicted;
                revived += o.stats.exits_revived;
                unlisted += o.stats.finished_unlisted;
                unread += o.stats.output_unread;
                sessions += o.stats.sessions;
                turns += o.stats.model.turns_completed + o.stats.model.turns_errored;
                requests += o.stats.model.requests;
                lost += o.stats.model.requests_lost;
                cut += o.stats.model.turns_cut;
                sim_ms += o.stats.sim_ms;
                scripted += o.stats.asks_scripted;
                received += o.stats.answers_received;
                provisions += o.stats.provisions;
                provisions_failed += o.stats.provisions_failed;
                provisions_hung += o.stats.provisions_hung;
                provisions_dropped += o.stats.provisions_dropped;
                shutdowns += o.stats.shutdowns;
                batches += o.stats.batches;
                batched += o.stats.batched;
                request_batches += o.stats.request_batches;
                spawns_after_shutdown += o.stats.spawns_after_shutdown;
                let s = &o.stats.model;
                m.asks += s.asks;
                m.asks_settled += s.asks_settled;
                m.approvals_opened += s.approvals_opened;
                m.approvals_resolved += s.approvals_resolved;
                m.approvals_expired += s.approvals_expired;
                m.approvals_cancelled += s.approvals_cancelled;
                m.resolves_late += s.resolves_late;
                m.resolves_unknown += s.resolves_unknown;
                m.resolves_wrong += s.resolves_wrong;
                m.answers += s.answers;
                m.deleted += s.deleted;
                m.deletes_refused += s.deletes_refused;
                m.creates_discarded += s.creates_discarded;
                m.envs_made += s.envs_made;
                m.resumable_checked += s.resumable_checked;
                m.attaches += s.attaches;
                m.attaches_joined += s.attaches_joined;
                m.attaches_restarted += s.attaches_restarted;
                m.attaches_refused += s.attaches_refused;
                m.prompts_with_message += s.prompts_with_message;
                m.envs_refused += s.envs_refused;
                m.envs_stopped += s.envs_stopped;
                m.envs_shutdown += s.envs_shutdown;
                m.envs_timed_out += s.envs_timed_out;
                m.envs_lost += s.envs_lost;
                m.env_reports_ignored += s.env_reports_ignored;
                m.reports += s.reports;
                m.reports_recorded += s.reports_recorded;
                coverage.merge(&o.coverage);
            }
            Err(f) => failures.push(*f),
        }
    }
    failures.sort_by_key(|f| f.seed);
    let wall = t0.elapsed();
    println!(
        "sim sweep: seeds {start}..{} on {threads} threads in {:.1}s: {steps} steps, {sessions} \
         sessions, {requests} requests ({lost} lost in crashes), {turns} turns ended ({cut} by \
         a restart that lost their process), {crashes} daemon crashes ({mid} mid-step), {:.1} \
         simulated hours; {batches} batches of several inputs ({batched} inputs, one commit \
         each; {request_batches} led by a request); {} failed",
        start + n,
        wall.as_secs_f64(),
        sim_ms as f64 / 3_600_000.0,
        failures.len()
    );
    println!(
        "runner: survived {survived} of the crashes; {adopted} processes adopted ({turns_adopted} \
         with a turn in progress), {orphans} named by no record and killed, {stale} stale runs listed and \
         not adopted, {unlisted} exited meanwhile and not listed ({unread} output lines never read); {redelivered} output lines replayed, {replays} of them recognised as \
         applied already; {revived} exits in flight delivered again; {evicted} settled sessions \
         let go, {recalled} recalled when named again"
    );
    println!(
        "approvals: {scripted} asks scripted, {} applied ({} settled at once by a policy or a \
         stop), {} requests opened: {} resolved by a client, {} expired, {} cancelled; resolves \
         refused: {} already resolved (OBEY-2041), {} unknown (OBEY-2040), {} of the wrong kind \
         (OBEY-2011); {} answers sent, {received} received by agents; {} sessions deleted, {} \
         deletes refused",
        m.asks,
        m.asks_settled,
        m.approvals_opened,
        m.approvals_resolved,
        m.approvals_expired,
        m.approvals_cancelled,
        m.resolves_late,
        m.resolves_unknown,
        m.resolves_wrong,
        m.answers,
        m.deleted,
        m.deletes_refused
    );
    println!(
        "environments: {provisions} asked for ({provisions_failed} to fail, {provisions_hung} \
         never reported, {provisions_dropped} dropped by a crash or a delete); {} made (agent \
         spawned), {} refused (OBEY-2005, create discarded), {} given up by a stop ({} by the \
         shutdown), {} by the start-up timeout, {} by a daemon restart; {} late reports \
         ignored; {} creates discarded in all; {shutdowns} shutdowns ({spawns_after_shutdown} \
         agents spawned after one)",
        m.envs_made,
        m.envs_refused,
        m.envs_stopped,
        m.envs_shutdown,
        m.envs_timed_out,
        m.envs_lost,
        m.env_reports_ignored,
        m.creates_discarded
    );
    println!(
        "projects: {} attaches: {} joined a live session, {} restarted an ended one, {} made a \
         session, {} refused for their configuration; {} checks of the session each project \
         resumes; {} first messages carried the system prompt",
        m.attaches,
        m.attaches_joined,
        m.attaches_restarted,
        m.attaches - m.attaches_joined - m.attaches_restarted - m.attaches_refused,
        m.attaches_refused,
        m.resumable_checked,
        m.prompts_with_message
    );
    println!(
        "agents' reports (StreamAgentActivity): {}, {} of them recorded as their session's \
         activity",
        m.reports, m.reports_recorded
    );
    println!("table lookups reached (legal cells: count; refusals and ignored: (count)):");
    println!("{}", coverage.render());
    println!("restart cases reached:");
    println!("{}", coverage.render_restores());
    for f in failures.iter().take(20) {
        println!("{f}");
    }
    if !failures.is_empty() {
        panic!(
            "{} of {n} seeds failed (each printed above as one `sim failed:` line{})",
            failures.len(),
            if failures.len() > 20 {
                "; the first 20"
            } else {
                ""
            }
        );
    }

    if n >= CI_SEEDS && start == 0 {
        assert!(
            steps >= CI_MIN_STEPS,
            "the CI set simulated only {steps} steps (at least {CI_MIN_STEPS} are required)"
        );
        let unreached = coverage.unreached();
        if !unreached.is_empty() {
            panic!(
                "legal (status, input) pairs never reached by {n} seeds: {}\n\nthe transition \
                 table:\n{}",
                unreached
                    .iter()
                    .map(|(s, i)| format!("({s}, {})", i.name()))
                    .collect::<Vec<_>>()
                    .join(", "),
                paddock_core::session::table::render()
            );
        }
        // Every way an environment's making ends is reached (the table's pairs cover the
        // inputs; a stop by the shutdown and a daemon restart are not pairs of their own).
        for (what, n) in [
            ("an environment made", m.envs_made),
            ("a project's session to resume", m.resumable_checked),
            (
                "an attach that made its project's session",
                m.attaches - m.attaches_joined - m.attaches_restarted - m.attaches_refused,
            ),
            ("an attach that joined a live session", m.attaches_joined),
            (
                "an attach that restarted an ended session",
                m.attaches_restarted,
            ),
            (
                "an attach refused for its configuration",
                m.attaches_refused,
            ),
            ("an environment that could not be made", m.envs_refused),
            ("a stop while an environment is made", m.envs_stopped),
            ("a shutdown while an environment is made", m.envs_shutdown),
            (
                "the start-up timeout while an environment is made",
                m.envs_timed_out,
            ),
            ("a daemon restart while an environment is made", m.envs_lost),
            (
                "a report after the making was given up",
                m.env_reports_ignored,
            ),
            (
                "an agent's report recorded as its session's activity",
                m.reports_recorded,
            ),
            ("a settled session let go", evicted),
            ("a settled session recalled when named", recalled),
            ("a run no record names killed at a restart", orphans),
            ("a batch of several inputs in one commit", batches),
            (
                "a client's request batched with output lines",
                request_batches,
            ),
        ] {
            assert!(n > 0, "the CI set never reached {what}");
        }
        let unreached = coverage.unreached_restores();
        if !unreached.is_empty() {
            panic!(
                "restart cases never reached by {n} seeds (committed status, adopted, turn \
                 open): {unreached:?}\n\n{}",
                coverage.render_restores()
            );
        }
    }
}

fn replay(seed: u64) {
    let opts = Options {
        log: LogMode::Text,
        log_tail_entries: env_u64("PADDOCK_SIM_TAIL").map_or(80, |n| n as usize),
        ..Options::default()
    };
    match run_seed(seed, &opts) {
        Ok(o) => println!(
            "seed {seed} passed: {:?}; faults: {}; log hash {:016x}",
            o.stats, o.faults, o.hash
        ),
        Err(f) => {
            eprintln!("the last {} entries of the event log:", f.log_tail.len());
            for line in &f.log_tail {
                eprintln!("  {line}");
            }
            panic!("{f}");
        }
    }
}

/// The coverage's denominator is the table itself: `legal_pairs` lists exactly the cells the
/// table makes legal (none missing, none extra), so "every legal pair reached" means it.
#[test]
fn coverage_counts_every_legal_cell() {
    use paddock_core::session::table::{legal_pairs, rule, InputKind, Rule};
    use paddock_core::Status;
    let cells: Vec<_> = Status::ALL
        .into_iter()
        .flat_map(|s| InputKind::ALL.into_iter().map(move |i| (s, i)))
        .filter(|(s, i)| rule(*s, *i) == Rule::Legal)
        .collect();
    assert_eq!(legal_pairs(), cells);
}
