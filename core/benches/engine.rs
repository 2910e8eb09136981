//! The engine's cost per agent event as stored history grows (issue 16's P6, the core's part;
//! performance review B1): one live session's activity plus the loop's tick, with 10,000 ended
//! sessions kept by the engine, against the same with none, in one run.
//!
//! `cargo bench -p paddock-core --bench engine` prints the table; the target is ≤ 1.2×.

// A benchmark measures the wall clock; the core itself never reads one (clippy.toml).
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::time::Instant as Wall;

use paddock_core::*;

fn now(ms: u64) -> Now {
    Now::new(Instant::from_millis(ms), Timestamp::from_millis(ms))
}

/// An engine holding `ended` stopped sessions and one running session, `live`.
fn engine_with(ended: usize) -> (Engine, u64) {
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

fn main() {
    const EVENTS: u64 = 200_000;
    let (mut base, r0) = engine_with(0);
    let (mut big, r1) = engine_with(10_000);
    // Warm both, then measure alternately (noise hits both alike).
    per_event(&mut base, r0, 10_000);
    per_event(&mut big, r1, 10_000);
    let (mut b, mut p) = (0.0, 0.0);
    for _ in 0..3 {
        b += per_event(&mut base, r0, EVENTS / 3);
        p += per_event(&mut big, r1, EVENTS / 3);
    }
    let (b, p) = (b / 3.0, p / 3.0);
    let ratio = p / b;
    println!("| measure | baseline | paddock | ratio | target | met |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| engine ns/event, 10,000 ended sessions ÷ none | {b:.0} ns | {p:.0} ns | {ratio:.2}× | ≤ 1.20× | {} |",
        if ratio <= 1.2 { "yes" } else { "no" }
    );
}
