//! The engine's cost per agent event as stored history grows (issue 16's P6, the core's part;
//! performance review B1): one live session's activity plus the loop's tick, after 10,000
//! sessions ended, against the same with none, in one run.
//!
//! The daemon lets the engine go of a session once it settled (`Engine::evict_settled`, after
//! each commit), so its history is in the store, not in the engine: that is the row with the
//! target (≤ 1.2×). The second row keeps the 10,000 in the engine, for reference: a lookup in
//! its ordered maps then takes a dozen id comparisons instead of one.
//!
//! `cargo bench -p paddock-core --bench engine` prints the table.

// A benchmark measures the wall clock; the core itself never reads one (clippy.toml).
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::time::Instant as Wall;

use paddock_core::*;

fn now(ms: u64) -> Now {
    Now::new(Instant::from_millis(ms), Timestamp::from_millis(ms))
}

/// An engine after `ended` sessions stopped, with one running session, `live`; the ended ones
/// are let go as the daemon does (`let_go`) or held.
fn engine_with(ended: usize, let_go: bool) -> (Engine, u64) {
    let limits = Limits {
        max_live_sessions: 64,
        ..Limits::default()
    };
    let mut e = Engine::new(limits);
    let mut t = 1_000u64;
    let mut req = 0;
    let mut run = 0;
    let config = || SessionConfig::new("camp_1", Provider::Scripted, "/tmp");
    let mut start = |e: &mut Engine, id: &SessionId, t: &mut u64| {
        req += 1;
        run += 1;
        *t += 1;
        e.handle(
            now(*t),
            Input::Create {
                req,
                id: id.clone(),
                config: config().into(),
            },
        );
        e.handle(
            now(*t),
            Input::Provider {
                id: id.clone(),
                run,
                cursor: None,
                event: ProviderEvent::Started { pid: Some(100) },
            },
        );
        run
    };
    for i in 0..ended {
        let id = SessionId::from(format!("sess_ended_{i:06}").as_str());
        let r = start(&mut e, &id, &mut t);
        e.handle(
            now(t),
            Input::Stop {
                req: 0,
                id: id.clone(),
                graceful: false,
            },
        );
        e.handle(
            now(t),
            Input::Provider {
                id,
                run: r,
                cursor: None,
                event: ProviderEvent::Exited {
                    code: None,
                    signal: Some(15),
                    stderr_tail: String::new(),
                },
            },
        );
    }
    if let_go {
        assert_eq!(
            e.evict_settled().len(),
            ended,
            "every ended session settled"
        );
    }
    let live = SessionId::from("sess_live");
    let r = start(&mut e, &live, &mut t);
    e.handle(
        now(t),
        Input::Send {
            req: 0,
            id: live,
            text: "go".into(),
        },
    );
    assert_eq!(e.live_sessions(), 1);
    (e, r)
}

/// Nanoseconds per event: an activity of the live session, then the loop's tick.
fn per_event(e: &mut Engine, run: u64, events: u64) -> f64 {
    let live = SessionId::from("sess_live");
    let start = Wall::now();
    for i in 0..events {
        let t = 10_000_000 + i;
        let ev = ProviderEvent::Activity(
            Activity::new(ActivityKind::Thinking, "step").with_tokens(1, 1),
        );
        std::hint::black_box(e.handle(
            now(t),
            Input::Provider {
                id: live.clone(),
                run,
                cursor: None,
                event: ev,
            },
        ));
        std::hint::black_box(e.handle(now(t), Input::Tick));
        std::hint::black_box(e.poll_timeout());
    }
    start.elapsed().as_nanos() as f64 / events as f64
}

/// Nanoseconds per event with no history and with `ended` ended sessions (measured
/// alternately: noise hits both alike).
fn compare(ended: usize, let_go: bool) -> (f64, f64) {
    const EVENTS: u64 = 200_000;
    let (mut base, r0) = engine_with(0, let_go);
    let (mut big, r1) = engine_with(ended, let_go);
    per_event(&mut base, r0, 10_000);
    per_event(&mut big, r1, 10_000);
    let (mut b, mut p) = (0.0, 0.0);
    for _ in 0..3 {
        b += per_event(&mut base, r0, EVENTS / 3);
        p += per_event(&mut big, r1, EVENTS / 3);
    }
    (b / 3.0, p / 3.0)
}

fn main() {
    println!("| measure | baseline | paddock | ratio | target | met |");
    println!("|---|---|---|---|---|---|");
    let (b, p) = compare(10_000, true);
    let ratio = p / b;
    println!(
        "| engine ns/event, 10,000 ended sessions let go once settled ÷ none | {b:.0} ns | {p:.0} ns | {ratio:.2}× | ≤ 1.20× | {} |",
        if ratio <= 1.2 { "yes" } else { "no" }
    );
    let (b, p) = compare(10_000, false);
    println!(
        "| the same, the 10,000 held by the engine (reference) | {b:.0} ns | {p:.0} ns | {:.2}× | - | - |",
        p / b
    );
}
