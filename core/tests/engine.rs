//! The engine, transition by transition: each test feeds inputs and checks the effects the
//! shell would carry out. (The simulator explores the same machine at scale; these tests pin
//! the exact behaviour of each rule.)

use paddock_core::*;

/// Milliseconds on the tests' one clock (both readings of [`Now`] move together here).
type Millis = u64;

const T0: Millis = 1_000_000;

/// The same reading on both clocks, `ms` after their origins.
fn now(ms: Millis) -> Now {
    Now::new(Instant::from_millis(ms), Timestamp::from_millis(ms))
}

fn ts(ms: Millis) -> Timestamp {
    Timestamp::from_millis(ms)
}

/// The engine rebuilt from these stored sessions and requests, with these agents surviving.
fn restore_with(
    limits: Limits,
    at: Millis,
    sessions: impl IntoIterator<Item = SessionRecord>,
    approvals: impl IntoIterator<Item = Approval>,
    agents: &std::collections::BTreeMap<SessionId, (RunId, Option<u32>)>,
) -> (Engine, Vec<Effect>) {
    let stored = Stored {
        sessions: sessions.into_iter().collect(),
        approvals: approvals.into_iter().collect(),
        ..Stored::default()
    };
    let surviving = Surviving {
        agents: agents
            .iter()
            .map(|(id, (run, pid))| ((id.clone(), *run), *pid))
            .collect(),
        ..Surviving::default()
    };
    Engine::restore(limits, now(at), stored, &surviving)
}

struct Rig {
    engine: Engine,
    now: Millis,
    next_req: RequestId,
}

fn limits() -> Limits {
    Limits {
        stop_grace: Duration::from_millis(5_000),
        kill_grace: Duration::from_millis(1_000),
        startup_timeout: Duration::from_millis(3_000),
        max_live_sessions: 2,
        ..Limits::default()
    }
}

fn sid() -> SessionId {
    SessionId::from("sess_1")
}

impl Rig {
    /// The engine's next deadline, a session's: when (ms) and which timer.
    fn next_deadline(&self) -> (u64, Timer) {
        match self.engine.poll_timeout() {
            Some((at, Deadline::Session(_, timer))) => (at.millis(), timer),
            other => panic!("a session deadline, not {other:?}"),
        }
    }

    fn new() -> Self {
        Rig {
            engine: Engine::new(limits()),
            now: T0,
            next_req: 1,
        }
    }

    fn req(&mut self) -> RequestId {
        self.next_req += 1;
        self.next_req
    }

    fn at(&mut self, dt: Millis, input: Input) -> Vec<Effect> {
        self.now += dt;
        self.engine.handle(now(self.now), input)
    }

    fn create(&mut self, config: SessionConfig) -> (RequestId, Vec<Effect>) {
        let req = self.req();
        let fx = self.at(
            0,
            Input::Create {
                req,
                id: sid(),
                config: config.into(),
            },
        );
        (req, fx)
    }

    fn provider(&mut self, run: RunId, event: ProviderEvent) -> Vec<Effect> {
        self.at(
            1,
            Input::Provider {
                id: sid(),
                run,
                cursor: None,
                event,
            },
        )
    }

    fn send(&mut self, text: &str) -> (RequestId, Vec<Effect>) {
        let req = self.req();
        let fx = self.at(
            1,
            Input::Send {
                req,
                id: sid(),
                text: text.into(),
            },
        );
        (req, fx)
    }

    fn stop(&mut self, graceful: bool) -> (RequestId, Vec<Effect>) {
        let req = self.req();
        let fx = self.at(
            1,
            Input::Stop {
                req,
                id: sid(),
                graceful,
            },
        );
        (req, fx)
    }

    fn status(&self) -> Status {
        self.engine.session(&sid()).unwrap().status()
    }

    fn record(&self) -> SessionRecord {
        self.engine.session(&sid()).unwrap().record.clone()
    }

    /// A running session (run 1, pid 42).
    fn running(config: SessionConfig) -> Self {
        let mut r = Rig::new();
        r.create(config);
        r.provider(1, ProviderEvent::Started { pid: Some(42) });
        r.provider(1, ProviderEvent::Ready);
        assert_eq!(r.status(), Status::Running);
        r
    }

    /// Run `run` started (pid `pid`) and said it is ready: the effects of both.
    fn start(&mut self, run: RunId, pid: u32) -> Vec<Effect> {
        let mut fx = self.provider(run, ProviderEvent::Started { pid: Some(pid) });
        assert!(
            fx.iter()
                .any(|e| matches!(e, Effect::AskReady { run: r, .. } if *r == run)),
            "a started agent is asked whether it is ready: {fx:?}"
        );
        fx.extend(self.provider(run, ProviderEvent::Ready));
        fx
    }
}

fn config() -> SessionConfig {
    SessionConfig::new("camp_1", Provider::Scripted, "/tmp")
}

fn act(kind: ActivityKind, tin: u64, tout: u64) -> ProviderEvent {
    ProviderEvent::Activity(Activity::new(kind, "x").with_tokens(tin, tout))
}

fn statuses(fx: &[Effect]) -> Vec<(Option<Status>, Status)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::EmitStatus(ev) => Some((ev.previous, ev.new)),
            _ => None,
        })
        .collect()
}

fn reply(fx: &[Effect], req: RequestId) -> Option<Result<SessionRecord, Error>> {
    fx.iter().find_map(|e| match e {
        Effect::Reply { req: r, result } if *r == req => Some(result.clone().map(|r| *r)),
        _ => None,
    })
}

fn err_code(fx: &[Effect], req: RequestId) -> ErrorCode {
    reply(fx, req)
        .expect("a reply")
        .expect_err("an error reply")
        .code
}

fn activities(fx: &[Effect]) -> Vec<ActivityEvent> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::EmitActivity(a) => Some(ActivityEvent::clone(a)),
            _ => None,
        })
        .collect()
}

fn signals(fx: &[Effect]) -> Vec<Signal> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Signal { signal, .. } => Some(*signal),
            _ => None,
        })
        .collect()
}

fn exited() -> ProviderEvent {
    ProviderEvent::Exited {
        code: None,
        signal: Some(15),
        stderr_tail: String::new(),
    }
}

/// The drain rule: persists first.
fn assert_drain_rule(fx: &[Effect]) {
    let first_other = fx.iter().position(|e| !e.is_persist()).unwrap_or(fx.len());
    assert!(
        fx[first_other..].iter().all(|e| !e.is_persist()),
        "a Persist after a non-persist effect: {fx:#?}"
    );
}

#[test]
fn create_spawns_and_answers_once_started() {
    let mut r = Rig::new();
    let (req, fx) = r.create(config());
    assert_drain_rule(&fx);
    assert_eq!(
        statuses(&fx),
        vec![
            (None, Status::Created),
            (Some(Status::Created), Status::Starting)
        ]
    );
    assert!(fx.iter().any(|e| matches!(e, Effect::Spawn { run: 1, .. })));
    assert!(
        reply(&fx, req).is_none(),
        "no answer before the provider started"
    );
    let fx = r.provider(1, ProviderEvent::Started { pid: Some(42) });
    assert!(
        reply(&fx, req).is_none(),
        "a started process is not yet an agent that takes messages"
    );
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::AskReady { run: 1, .. })));
    assert_eq!(r.status(), Status::Starting);
    let fx = r.provider(1, ProviderEvent::Ready);
    let rec = reply(&fx, req).unwrap().unwrap();
    assert_eq!(rec.status, Status::Running);
    assert_eq!(rec.pid, Some(42));
    assert_eq!(rec.started_at, Some(ts(T0 + 2)));
}

#[test]
fn initial_message_starts_a_turn_right_away() {
    let mut c = config();
    c.initial_message = "hello".into();
    let mut r = Rig::new();
    let (req, _) = r.create(c);
    let fx = r.start(1, 7);
    assert_eq!(reply(&fx, req).unwrap().unwrap().status, Status::Working);
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::Write { text, .. } if text == "hello")));
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::Persist(Record::UserMessage(m)) if m.text == "hello")));
}

#[test]
fn a_turn_streams_and_ends_with_completion() {
    let mut r = Rig::running(config());
    let (req, fx) = r.send("hi");
    assert_eq!(reply(&fx, req).unwrap().unwrap().status, Status::Working);
    let fx = r.provider(1, act(ActivityKind::Thinking, 10, 1));
    assert_drain_rule(&fx);
    let a = activities(&fx);
    assert_eq!((a[0].seq, a[0].turn, a[0].ends_turn), (1, Some(1), false));
    let fx = r.provider(1, act(ActivityKind::Completion, 5, 4));
    let a = activities(&fx);
    assert!(a[0].ends_turn);
    assert_eq!(
        statuses(&fx),
        vec![(Some(Status::Working), Status::Running)]
    );
    let rec = r.record();
    assert_eq!((rec.tokens_input, rec.tokens_output), (15, 5));
}

#[test]
fn one_message_at_a_time() {
    let mut r = Rig::running(config());
    r.send("one");
    let (req, fx) = r.send("two");
    assert_eq!(err_code(&fx, req), ErrorCode::WrongState);
}

#[test]
fn a_turn_that_reaches_the_budget_fails_the_session() {
    let mut c = config();
    c.max_tokens = 100;
    let mut r = Rig::running(c);
    r.send("hi");
    let fx = r.provider(1, act(ActivityKind::Thinking, 60, 50));
    let a = activities(&fx);
    assert_eq!(a.len(), 2);
    assert_eq!(a[1].activity.kind(), ActivityKind::Error);
    assert!(a[1].ends_turn);
    assert!(a[1].activity.content.starts_with("OBEY-2013"));
    assert_eq!(r.status(), Status::Failed);
    assert_eq!(r.record().error.unwrap().code, ErrorCode::BudgetExceeded);
    assert_eq!(signals(&fx), vec![Signal::Term]);
    // Nothing the dying process still says is counted.
    r.provider(1, act(ActivityKind::Thinking, 500, 500));
    assert_eq!(r.record().tokens_total(), 110);
    r.provider(1, exited());
    assert_eq!(r.record().pid, None);
}

#[test]
fn an_exhausted_budget_refuses_the_next_message() {
    let mut c = config();
    c.max_tokens = 100;
    let mut r = Rig::running(c);
    r.send("hi");
    r.provider(1, act(ActivityKind::Completion, 50, 50));
    assert_eq!(r.status(), Status::Running);
    let (req, fx) = r.send("more");
    assert_eq!(err_code(&fx, req), ErrorCode::BudgetExceeded);
}

#[test]
fn the_session_timeout_fails_it_with_2014() {
    let mut c = config();
    c.timeout_ms = 10_000;
    let mut r = Rig::running(c);
    r.send("hi");
    let (at, timer) = r.next_deadline();
    assert_eq!(timer, Timer::SessionTimeout);
    assert_eq!(at, T0 + 2 + 10_000, "counted from the agent being ready");
    let fx = r.at(at - r.now, Input::Tick);
    let a = activities(&fx);
    assert!(a[0].activity.content.starts_with("OBEY-2014"));
    assert_eq!(r.status(), Status::Failed);
    assert_eq!(r.record().ended_at, Some(ts(at)));
}

#[test]
fn a_graceful_stop_waits_for_the_turn() {
    let mut r = Rig::running(config());
    r.send("hi");
    let (req, fx) = r.stop(true);
    assert!(signals(&fx).is_empty(), "the turn may finish first");
    assert_eq!(r.status(), Status::Stopping);
    let fx = r.provider(1, act(ActivityKind::Completion, 1, 1));
    // The turn is done: the agent is asked to end its own way (its input closed), no signal.
    assert!(signals(&fx).is_empty(), "{fx:?}");
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::CloseInput { run: 1, .. })),
        "{fx:?}"
    );
    let fx = r.provider(1, exited());
    let rec = reply(&fx, req).unwrap().unwrap();
    assert_eq!(rec.status, Status::Stopped);
    assert!(rec.ended_at.is_some());
    assert_eq!(rec.tokens_total(), 2);
}

#[test]
fn an_agent_that_does_not_end_its_own_way_is_termed_then_killed() {
    let mut r = Rig::running(config());
    let (req, fx) = r.stop(true);
    assert!(
        signals(&fx).is_empty(),
        "idle: its input is closed first: {fx:?}"
    );
    assert!(fx.iter().any(|e| matches!(e, Effect::CloseInput { .. })));
    let (at, timer) = r.next_deadline();
    assert_eq!(timer, Timer::Kill);
    assert_eq!(at - r.now, Limits::default().end_grace.millis());
    let fx = r.at(at - r.now, Input::Tick);
    assert_eq!(signals(&fx), vec![Signal::Term]);
    let (at, _) = r.next_deadline();
    assert_eq!(at - r.now, limits().kill_grace.millis());
    let fx = r.at(at - r.now, Input::Tick);
    assert_eq!(signals(&fx), vec![Signal::Kill]);
    let fx = r.provider(1, exited());
    assert_eq!(reply(&fx, req).unwrap().unwrap().status, Status::Stopped);

    // A forced stop while it ends its own way does not wait: TERM at once; a second
    // graceful one changes nothing.
    let mut r = Rig::running(config());
    r.stop(true);
    let (_, fx) = r.stop(true);
    assert!(signals(&fx).is_empty(), "{fx:?}");
    let (_, fx) = r.stop(false);
    assert_eq!(signals(&fx), vec![Signal::Term]);

    // Without an end grace (`end_grace` 0), a graceful stop of an idle agent is TERM at once,
    // its input left open.
    let mut r = Rig {
        engine: Engine::new(Limits {
            end_grace: Duration::ZERO,
            ..limits()
        }),
        now: T0,
        next_req: 1,
    };
    r.create(config());
    r.start(1, 42);
    let (_, fx) = r.stop(true);
    assert_eq!(signals(&fx), vec![Signal::Term]);
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::CloseInput { .. })),
        "{fx:?}"
    );
}

#[test]
fn a_graceful_stop_that_waits_too_long_forces_and_answers_2021() {
    let mut r = Rig::running(config());
    r.send("hi");
    let (req, _) = r.stop(true);
    let (at, timer) = r.next_deadline();
    assert_eq!(timer, Timer::StopGrace);
    let fx = r.at(at - r.now, Input::Tick);
    let a = activities(&fx);
    assert!(a[0].activity.content.starts_with("OBEY-2021"));
    assert_eq!(signals(&fx), vec![Signal::Term]);
    let fx = r.provider(1, exited());
    assert_eq!(err_code(&fx, req), ErrorCode::GracefulStopTimedOut);
    assert_eq!(r.status(), Status::Stopped);
}

#[test]
fn a_forced_stop_interrupts_and_escalates_to_kill() {
    let mut r = Rig::running(config());
    r.send("hi");
    let (req, fx) = r.stop(false);
    let a = activities(&fx);
    assert_eq!(a[0].activity.kind(), ActivityKind::Error);
    assert!(a[0].ends_turn);
    assert_eq!(signals(&fx), vec![Signal::Term]);
    let (at, timer) = r.next_deadline();
    assert_eq!(timer, Timer::Kill);
    let fx = r.at(at - r.now, Input::Tick);
    assert_eq!(signals(&fx), vec![Signal::Kill]);
    assert!(r.engine.poll_timeout().is_none());
    let fx = r.provider(1, exited());
    assert_eq!(reply(&fx, req).unwrap().unwrap().status, Status::Stopped);
}

#[test]
fn stopping_a_stopped_session_is_2020() {
    let mut r = Rig::running(config());
    r.stop(false);
    r.provider(1, exited());
    let (req, fx) = r.stop(true);
    assert_eq!(err_code(&fx, req), ErrorCode::AlreadyStopped);
    let (req, fx) = r.send("hi");
    assert_eq!(err_code(&fx, req), ErrorCode::WrongState);
}

#[test]
fn an_unexpected_exit_is_2031_with_the_stderr_tail() {
    let mut r = Rig::running(config());
    r.send("hi");
    let fx = r.provider(
        1,
        ProviderEvent::Exited {
            code: Some(3),
            signal: None,
            stderr_tail: "boom".into(),
        },
    );
    let a = activities(&fx);
    assert!(a[0].activity.content.contains("OBEY-2031"));
    let e = r.record().error.unwrap();
    assert_eq!(e.code, ErrorCode::ProviderCrashed);
    assert!(e.message.contains("exit code 3") && e.message.contains("boom"));
    assert!(signals(&fx).is_empty(), "no signal to a reaped process");
}

#[test]
fn a_spawn_failure_is_2004() {
    let mut r = Rig::new();
    let (req, _) = r.create(config());
    let fx = r.provider(
        1,
        ProviderEvent::SpawnFailed {
            reason: "no such file".into(),
        },
    );
    assert_eq!(err_code(&fx, req), ErrorCode::CreationFailed);
    // Refused means nothing written: the caller never got an id, so nothing of it stays.
    assert!(r.engine.session(&sid()).is_none());
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::Persist(Record::Delete(id)) if *id == sid())));
}

#[test]
fn a_restart_whose_spawn_fails_is_failed_and_kept() {
    let mut r = Rig::running(config());
    let (_, _) = r.stop(false);
    r.provider(
        1,
        ProviderEvent::Exited {
            code: None,
            signal: Some(9),
            stderr_tail: String::new(),
        },
    );
    assert_eq!(r.status(), Status::Stopped);
    let req = r.req();
    r.at(
        2,
        Input::Restart {
            req,
            id: sid(),
            provider_config: None,
        },
    );
    let fx = r.provider(
        2,
        ProviderEvent::SpawnFailed {
            reason: "no such file".into(),
        },
    );
    assert_eq!(err_code(&fx, req), ErrorCode::CreationFailed);
    assert_eq!(r.status(), Status::Failed);
}

#[test]
fn a_provider_that_never_starts_times_out() {
    let mut r = Rig::new();
    let (req, _) = r.create(config());
    let (at, timer) = r.next_deadline();
    assert_eq!(timer, Timer::Startup);
    let fx = r.at(at - r.now, Input::Tick);
    assert_eq!(err_code(&fx, req), ErrorCode::CreationFailed);
    let e = reply(&fx, req).unwrap().unwrap_err();
    assert!(
        e.message.starts_with("the provider did not start within"),
        "{}",
        e.message
    );
    // If it reports it started after all, it is terminated at once.
    let fx = r.provider(1, ProviderEvent::Started { pid: Some(9) });
    assert_eq!(signals(&fx), vec![Signal::Term]);
    assert_eq!(r.status(), Status::Failed);
}

/// An agent that exits before it says it is ready (a CLI that dies at start) refuses the
/// create with OBEY-2004 and its stderr, and leaves nothing: the session is deleted in the
/// same input.
#[test]
fn an_agent_that_exits_before_it_is_ready_refuses_the_create_and_leaves_nothing() {
    let mut r = Rig::new();
    let (req, _) = r.create(config());
    r.provider(1, ProviderEvent::Started { pid: Some(42) });
    assert_eq!(r.status(), Status::Starting);
    let fx = r.provider(
        1,
        ProviderEvent::Exited {
            code: Some(1),
            signal: None,
            stderr_tail: "error: unknown option '--bad'".into(),
        },
    );
    let e = reply(&fx, req).unwrap().unwrap_err();
    assert_eq!(e.code, ErrorCode::CreationFailed);
    assert!(
        e.message.contains("exited before it was ready") && e.message.contains("--bad"),
        "{e:?}"
    );
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::Persist(Record::Delete(id)) if *id == sid())));
    assert!(r.engine.session(&sid()).is_none());
}

/// An agent that runs but never answers the ready request fails at the start-up deadline: it
/// is TERMed, the create is refused saying why, and a late answer changes nothing.
#[test]
fn an_agent_that_never_says_it_is_ready_fails_at_the_start_up_deadline() {
    let mut r = Rig::new();
    let (req, _) = r.create(config());
    r.provider(1, ProviderEvent::Started { pid: Some(42) });
    let (at, timer) = r.next_deadline();
    assert_eq!(timer, Timer::Startup);
    let fx = r.at(at - r.now, Input::Tick);
    let e = reply(&fx, req).unwrap().unwrap_err();
    assert_eq!(e.code, ErrorCode::CreationFailed);
    assert!(e.message.contains("never answered"), "{e:?}");
    assert_eq!(signals(&fx), vec![Signal::Term]);
    assert_eq!(r.status(), Status::Failed);
    let fx = r.provider(1, ProviderEvent::Ready);
    assert!(statuses(&fx).is_empty(), "{fx:?}");
    assert_eq!(r.status(), Status::Failed);
}

/// A ready answer counts only while the session is STARTING: one that comes while it stops
/// changes nothing.
#[test]
fn a_ready_answer_outside_starting_changes_nothing() {
    let mut r = Rig::running(config());
    r.stop(true);
    assert_eq!(r.status(), Status::Stopping);
    let fx = r.provider(1, ProviderEvent::Ready);
    assert!(
        statuses(&fx).is_empty() && reply(&fx, 0).is_none(),
        "{fx:?}"
    );
    assert_eq!(r.status(), Status::Stopping);
}

#[test]
fn restart_of_a_running_session_stops_then_starts_the_same_id() {
    let mut r = Rig::running(config());
    let req = r.req();
    let fx = r.at(
        1,
        Input::Restart {
            req,
            id: sid(),
            provider_config: None,
        },
    );
    assert_eq!(signals(&fx), vec![Signal::Term]);
    let fx = r.provider(1, exited());
    assert!(fx.iter().any(|e| matches!(e, Effect::Spawn { run: 2, .. })));
    assert_eq!(r.record().restart_count, 1);
    let fx = r.start(2, 43);
    let rec = reply(&fx, req).unwrap().unwrap();
    assert_eq!(
        (rec.status, rec.restart_count, rec.pid),
        (Status::Running, 1, Some(43))
    );
    // Input from the old process is ignored.
    assert!(r.provider(1, act(ActivityKind::Thinking, 1, 1)).is_empty());
}

#[test]
fn restart_is_the_way_out_of_failed() {
    let mut r = Rig::running(config());
    r.provider(1, exited());
    assert_eq!(r.status(), Status::Failed);
    let req = r.req();
    let mut pc = std::collections::BTreeMap::new();
    pc.insert("k".to_string(), "v".to_string());
    let fx = r.at(
        1,
        Input::Restart {
            req,
            id: sid(),
            provider_config: Some(paddock_core::ProviderConfig::parse(pc).unwrap()),
        },
    );
    assert_eq!(
        statuses(&fx),
        vec![(Some(Status::Failed), Status::Starting)]
    );
    let rec = r.record();
    assert_eq!(rec.error, None);
    assert_eq!(rec.ended_at, None);
    assert_eq!(rec.config.provider_config.get("k").unwrap(), "v");
}

#[test]
fn unknown_sessions_are_2010_and_the_live_limit_is_2004() {
    let mut r = Rig::new();
    let fx = r.at(
        0,
        Input::Send {
            req: 5,
            id: SessionId::from("nope"),
            text: "x".into(),
        },
    );
    assert_eq!(err_code(&fx, 5), ErrorCode::SessionNotFound);
    for i in 0..3 {
        let fx = r.at(
            0,
            Input::Create {
                req: 10 + i,
                id: SessionId(format!("s{i}")),
                config: config().into(),
            },
        );
        if i < 2 {
            assert!(reply(&fx, 10 + i).is_none());
        } else {
            assert_eq!(err_code(&fx, 12), ErrorCode::CreationFailed);
        }
    }
}

#[test]
fn restore_fails_what_was_active_with_2032() {
    let mut r = Rig::running(config());
    r.send("hi");
    let rec = r.record();
    let (engine, fx) = restore_with(limits(), T0 + 100, vec![rec], vec![], &Default::default());
    assert_drain_rule(&fx);
    let s = engine.session(&sid()).unwrap();
    assert_eq!(s.status(), Status::Failed);
    assert_eq!(
        s.record.error.as_ref().unwrap().code,
        ErrorCode::ConnectionLost
    );
    assert_eq!(s.record.pid, None);
    assert_eq!(statuses(&fx), vec![(Some(Status::Working), Status::Failed)]);
    // The turn the old daemon left open ends in the store, with the reason.
    let a = activities(&fx);
    assert_eq!(a.len(), 1);
    assert!(a[0].ends_turn && a[0].activity.content.starts_with("OBEY-2032"));
    assert!(!s.record.turn_open);
}

/// A batch the crash lost may have started a process (a restart's new run beside the old one,
/// a create's first run): the runner lists it, no record names it, and the new daemon kills it
/// instead of leaving it running unowned; the run the record names is adopted as ever.
#[test]
fn restore_kills_the_runs_no_record_names_and_adopts_the_one_it_does() {
    let mut r = Rig::running(config());
    r.send("hi");
    let rec = r.record();
    assert_eq!(rec.run, Some(1));
    let lost = SessionId("s-lost".into());
    let surviving = Surviving {
        agents: [
            ((sid(), 1), Some(42)),
            ((sid(), 2), Some(43)),
            // Finished, with output: nothing to kill.
            ((sid(), 3), None),
            ((lost.clone(), 4), Some(44)),
        ]
        .into_iter()
        .collect(),
        ..Surviving::default()
    };
    let stored = Stored {
        sessions: vec![rec],
        ..Stored::default()
    };
    let (engine, fx) = Engine::restore(limits(), now(T0 + 100), stored, &surviving);
    let s = engine.session(&sid()).unwrap();
    assert_eq!(s.run().id(), Some(1));
    assert_eq!(s.status(), Status::Working);
    let kills: Vec<(SessionId, RunId, Option<u32>)> = fx
        .iter()
        .filter_map(|e| match e {
            Effect::Signal {
                id,
                run,
                pid,
                signal: Signal::Kill,
            } => Some((id.clone(), *run, *pid)),
            _ => None,
        })
        .collect();
    assert_eq!(kills, vec![(lost, 4, Some(44)), (sid(), 2, Some(43))]);
    assert_eq!(
        signals(&fx),
        vec![Signal::Kill, Signal::Kill],
        "and nothing else"
    );
}

#[test]
fn restore_adopts_a_process_that_outlived_the_daemon() {
    let mut r = Rig::running(config());
    r.send("hi");
    r.provider(1, act(ActivityKind::Thinking, 3, 3));
    let rec = r.record();
    assert_eq!((rec.run, rec.turn_open), (Some(1), true));
    let mut surviving = std::collections::BTreeMap::new();
    surviving.insert(sid(), (1, Some(42)));
    let (mut engine, fx) = restore_with(limits(), T0 + 100, vec![rec], vec![], &surviving);
    assert!(
        statuses(&fx).is_empty(),
        "nothing changes for an adopted session"
    );
    let s = engine.session(&sid()).unwrap();
    assert_eq!((s.status(), s.turn()), (Status::Working, Some(1)));
    // The turn goes on and ends normally; new runs get fresh ids.
    let fx = engine.handle(
        now(T0 + 200),
        Input::Provider {
            id: sid(),
            run: 1,
            cursor: Some(10),
            event: act(ActivityKind::Completion, 1, 1),
        },
    );
    assert!(activities(&fx)[0].ends_turn);
    assert_eq!(engine.session(&sid()).unwrap().status(), Status::Running);
    // Output at or before the applied cursor is recognised as already applied.
    let fx = engine.handle(
        now(T0 + 300),
        Input::Provider {
            id: sid(),
            run: 1,
            cursor: Some(10),
            event: act(ActivityKind::Thinking, 1, 1),
        },
    );
    assert!(fx.is_empty());
    let fx = engine.handle(
        now(T0 + 300),
        Input::Restart {
            req: 99,
            id: sid(),
            provider_config: None,
        },
    );
    assert_eq!(signals(&fx), vec![Signal::Term]);
    let fx = engine.handle(
        now(T0 + 400),
        Input::Provider {
            id: sid(),
            run: 1,
            cursor: None,
            event: exited(),
        },
    );
    assert!(fx.iter().any(|e| matches!(e, Effect::Spawn { run: 2, .. })));
}

#[test]
fn restore_adopting_a_first_start_sends_the_initial_message() {
    // The daemon died before it read `Started` (which is when the initial message goes): the
    // adopted session must still get its first turn.
    let mut config = config();
    config.initial_message = "begin".into();
    let mut r = Rig::new();
    r.create(config);
    let rec = r.record();
    assert_eq!((rec.status, rec.run), (Status::Starting, Some(1)));
    let mut surviving = std::collections::BTreeMap::new();
    surviving.insert(sid(), (1, Some(42)));
    let (engine, fx) = restore_with(limits(), T0 + 100, vec![rec], vec![], &surviving);
    assert_eq!(
        statuses(&fx),
        vec![
            (Some(Status::Starting), Status::Running),
            (Some(Status::Running), Status::Working)
        ]
    );
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::Write { run: 1, text, .. } if text == "begin")));
    let s = engine.session(&sid()).unwrap();
    assert_eq!(
        (s.turn(), s.record.turns, s.record.turn_open),
        (Some(1), 1, true)
    );
}

#[test]
fn restore_finishes_a_stop_the_old_daemon_began() {
    let mut r = Rig::running(config());
    r.send("hi");
    r.stop(true);
    let rec = r.record();
    assert_eq!(rec.status, Status::Stopping);
    let mut surviving = std::collections::BTreeMap::new();
    surviving.insert(sid(), (1, Some(42)));
    let (mut engine, fx) = restore_with(limits(), T0 + 100, vec![rec], vec![], &surviving);
    assert_eq!(signals(&fx), vec![Signal::Term]);
    assert!(activities(&fx)[0].ends_turn);
    engine.handle(
        now(T0 + 200),
        Input::Provider {
            id: sid(),
            run: 1,
            cursor: None,
            event: exited(),
        },
    );
    assert_eq!(engine.session(&sid()).unwrap().status(), Status::Stopped);
}

#[test]
fn time_never_goes_backwards() {
    let mut r = Rig::running(config());
    let late = r.now;
    r.engine.handle(now(late - 500), Input::Tick);
    let (req, fx) = r.send("hi");
    assert!(reply(&fx, req).unwrap().is_ok());
    assert!(r.record().last_activity_at.unwrap() >= ts(late));
}

#[test]
fn architecture_md_shows_the_current_transition_table() {
    let doc = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../ARCHITECTURE.md"));
    let table = paddock_core::session::table::render();
    assert!(
        doc.contains(&table),
        "ARCHITECTURE.md must contain the transition table exactly as table::render() prints it:\n{table}"
    );
}

#[test]
fn a_shutdown_stops_every_live_session_and_refuses_creates() {
    let mut r = Rig::running(config());
    assert!(!r.engine.is_shutting_down());
    let fx = r.at(
        1,
        Input::Shutdown {
            req: 77,
            graceful: false,
        },
    );
    assert_drain_rule(&fx);
    assert!(r.engine.is_shutting_down());
    assert_eq!(
        fx.last(),
        Some(&Effect::ReplyShutdown { req: 77, live: 1 }),
        "answered with the number of sessions it stops"
    );
    assert_eq!(
        statuses(&fx),
        vec![(Some(Status::Running), Status::Stopping)]
    );
    assert!(signals(&fx).contains(&Signal::Term), "{fx:?}");
    let req = r.req();
    let fx = r.at(
        1,
        Input::Create {
            req,
            id: SessionId::from("sess_2"),
            config: config().into(),
        },
    );
    assert_eq!(err_code(&fx, req), ErrorCode::ShuttingDown);
    assert!(r.engine.session(&SessionId::from("sess_2")).is_none());
}

#[test]
fn lost_output_is_recorded_and_noticed_never_silent() {
    let mut r = Rig::running(config());
    let fx = r.provider(
        1,
        ProviderEvent::OutputLost {
            dropped: 35_405,
            first: 3,
            next: 35_408,
        },
    );
    let recorded = fx.iter().find_map(|e| match e {
        Effect::Persist(Record::Activity(a)) => Some(a.clone()),
        _ => None,
    });
    let a = recorded.expect("the gap is stored as an activity");
    assert_eq!(a.activity.kind(), ActivityKind::Status);
    assert!(a.activity.content.contains("35405 chunk(s)"), "{a:?}");
    assert!(
        a.activity.content.contains("runner events 3..35407"),
        "{a:?}"
    );
    assert!(fx.iter().any(|e| matches!(e,
        Effect::Notice(n) if n.session == sid() && n.status == Status::Running)));
    assert_eq!(r.status(), Status::Running, "a loss is not a failure");
    assert_eq!(r.record().last_activity_seq, 1);
}

#[test]
fn a_dropped_connection_marks_the_session_until_it_is_back_or_the_run_ends() {
    let mut r = Rig::running(config());
    let conn = |connected: bool, note: &str| ProviderEvent::Connection {
        connected,
        note: note.into(),
    };
    let noted = |fx: &[Effect], what: &str| {
        let stored = fx.iter().any(|e| {
            matches!(e,
            Effect::Persist(Record::Activity(a))
                if a.activity.kind() == ActivityKind::Status && a.activity.content == what)
        });
        let noticed = fx
            .iter()
            .any(|e| matches!(e, Effect::Notice(n) if n.message == what));
        stored && noticed
    };
    let fx = r.provider(1, conn(false, "lost"));
    assert!(noted(&fx, "lost"), "{fx:?}");
    assert!(r.record().disconnected);
    assert_eq!(r.status(), Status::Running, "the agent works on there");
    // Said again: nothing new.
    let fx = r.provider(1, conn(false, "lost again"));
    assert!(
        !noted(&fx, "lost again") && r.record().disconnected,
        "{fx:?}"
    );
    let fx = r.provider(1, conn(true, "back"));
    assert!(noted(&fx, "back"), "{fx:?}");
    assert!(!r.record().disconnected);
    let fx = r.provider(1, conn(true, "back again"));
    assert!(
        !noted(&fx, "back again") && !r.record().disconnected,
        "{fx:?}"
    );
    // A connection belongs to its run: the mark goes with the run.
    r.provider(1, conn(false, "lost"));
    assert!(r.record().disconnected);
    r.provider(1, exited());
    assert!(!r.record().disconnected);
    // A terminal session hears nothing of it.
    let fx = r.provider(1, conn(false, "late"));
    assert!(!noted(&fx, "late") && !r.record().disconnected);
}

// ── environments ────────────────────────────────────────────────────────────

fn sandboxed() -> SessionConfig {
    let mut c = config();
    c.env = EnvSpec {
        driver: Driver::Bubblewrap,
        worktree: true,
        ..EnvSpec::default()
    };
    c
}

fn environment(r: &mut Rig, event: EnvEvent) -> Vec<Effect> {
    r.at(1, Input::Environment { id: sid(), event })
}

fn spawns(fx: &[Effect]) -> usize {
    fx.iter()
        .filter(|e| matches!(e, Effect::Spawn { .. }))
        .count()
}

#[test]
fn a_sandboxed_agent_starts_only_once_its_environment_is_made() {
    let mut r = Rig::new();
    let (req, fx) = r.create(sandboxed());
    assert_drain_rule(&fx);
    assert!(fx.iter().any(
        |e| matches!(e, Effect::Provision { id, config } if *id == sid() && config.env.worktree)
    ));
    assert_eq!(spawns(&fx), 0, "nothing runs before its environment exists");
    assert!(reply(&fx, req).is_none(), "the create waits for the agent");
    assert_eq!(r.status(), Status::Created);
    assert_eq!(r.record().env_state, EnvState::Creating);
    // Requests that need an agent are refused meanwhile.
    let (send, fx) = r.send("hi");
    assert_eq!(err_code(&fx, send), ErrorCode::WrongState);

    let fx = environment(&mut r, EnvEvent::Provisioned);
    assert_eq!(spawns(&fx), 1);
    assert_eq!(r.record().env_state, EnvState::Ready);
    assert_eq!(
        statuses(&fx),
        vec![(Some(Status::Created), Status::Starting)]
    );
    let fx = r.start(1, 7);
    assert!(reply(&fx, req).unwrap().is_ok());
    // A second report changes nothing.
    let fx = environment(&mut r, EnvEvent::Provisioned);
    assert_eq!(spawns(&fx), 0);
    assert_eq!(r.status(), Status::Running);
}

#[test]
fn an_environment_that_cannot_be_made_refuses_the_create_and_leaves_nothing() {
    let mut r = Rig::new();
    let (req, _) = r.create(sandboxed());
    let fx = environment(
        &mut r,
        EnvEvent::ProvisionFailed {
            reason: "bwrap is not installed".into(),
        },
    );
    let e = reply(&fx, req).unwrap().unwrap_err();
    assert_eq!(e.code, ErrorCode::SandboxInitFailed);
    assert!(e.message.contains("bubblewrap") && e.message.contains("bwrap is not installed"));
    assert!(r.engine.session(&sid()).is_none());
    assert_eq!(r.engine.live_sessions(), 0);
    let persists: Vec<_> = fx.iter().filter(|e| e.is_persist()).collect();
    assert_eq!(persists, vec![&Effect::Persist(Record::Delete(sid()))]);
    assert!(
        fx.iter().any(|e| matches!(e, Effect::Forget(_))),
        "what the driver made is removed"
    );
}

#[test]
fn a_stop_while_the_environment_is_made_ends_the_session_before_it_starts() {
    let mut r = Rig::new();
    let (create, _) = r.create(sandboxed());
    let (stop, fx) = r.stop(false);
    assert_eq!(err_code(&fx, create), ErrorCode::CreationFailed);
    assert!(reply(&fx, stop).unwrap().is_ok());
    assert_eq!(r.status(), Status::Stopped);
    assert_eq!(r.record().env_state, EnvState::Failed);
    // The driver's late report starts nothing.
    let fx = environment(&mut r, EnvEvent::Provisioned);
    assert_eq!(spawns(&fx), 0);
    // A restart starts the agent (the shell makes the environment as it starts it).
    let req = r.req();
    let fx = r.at(
        1,
        Input::Restart {
            req,
            id: sid(),
            provider_config: None,
        },
    );
    assert_eq!(spawns(&fx), 1);
    let run = r.record().run.unwrap();
    r.provider(run, ProviderEvent::Started { pid: Some(8) });
    assert_eq!(r.record().env_state, EnvState::Ready);
}

#[test]
fn making_an_environment_counts_against_the_startup_timeout() {
    let mut r = Rig::new();
    let (req, _) = r.create(sandboxed());
    assert_eq!(r.next_deadline(), (T0 + 3_000, Timer::Startup));
    let fx = r.at(3_000, Input::Tick);
    let e = reply(&fx, req).unwrap().unwrap_err();
    assert_eq!(e.code, ErrorCode::SandboxInitFailed);
    assert_eq!(r.status(), Status::Failed);
    assert_eq!(r.record().env_state, EnvState::Failed);
    assert!(r.engine.poll_timeout().is_none());
}

#[test]
fn a_restart_of_the_daemon_while_an_environment_is_made_fails_the_session() {
    let mut r = Rig::new();
    r.create(sandboxed());
    let stored = r.record();
    let (engine, _) = restore_with(limits(), T0 + 10, [stored], [], &Default::default());
    let s = engine.session(&sid()).unwrap();
    assert_eq!(s.status(), Status::Failed);
    assert_eq!(s.record.env_state, EnvState::Failed);
}

#[test]
fn a_shutdown_ends_a_session_whose_environment_is_being_made() {
    let mut r = Rig::new();
    let (create, _) = r.create(sandboxed());
    let req = r.req();
    let fx = r.at(
        1,
        Input::Shutdown {
            req,
            graceful: true,
        },
    );
    assert_eq!(err_code(&fx, create), ErrorCode::CreationFailed);
    assert_eq!(r.status(), Status::Stopped);
    assert_eq!(r.engine.live_sessions(), 0);
}

#[test]
fn no_agent_starts_after_a_shutdown_neither_by_restart_nor_by_a_waiting_one() {
    let mut r = Rig::running(config());
    // The session fails while its process is still there (a TERM on the way): a restart asked
    // now waits for that process to be gone.
    r.send("hi");
    let fx = r.at(
        1,
        Input::Provider {
            id: sid(),
            run: 1,
            cursor: None,
            event: ProviderEvent::DeliveryFailed {
                reason: "broken pipe".into(),
            },
        },
    );
    assert_eq!(r.status(), Status::Failed, "{fx:?}");
    let restart = r.req();
    let fx = r.at(
        1,
        Input::Restart {
            req: restart,
            id: sid(),
            provider_config: None,
        },
    );
    assert_eq!(spawns(&fx), 0, "it waits for the old process");
    let fx = r.at(
        1,
        Input::Shutdown {
            req: 90,
            graceful: true,
        },
    );
    assert_eq!(err_code(&fx, restart), ErrorCode::ShuttingDown);
    let fx = r.provider(1, exited());
    assert_eq!(spawns(&fx), 0, "the waiting restart was dropped");
    let again = r.req();
    let fx = r.at(
        1,
        Input::Restart {
            req: again,
            id: sid(),
            provider_config: None,
        },
    );
    assert_eq!(err_code(&fx, again), ErrorCode::ShuttingDown);
    assert_eq!(spawns(&fx), 0);
}

#[test]
fn a_task_that_never_reached_an_agent_is_sent_by_the_restart() {
    let mut r = Rig::new();
    let mut c = sandboxed();
    c.initial_message = "fix the tests".into();
    r.create(c);
    r.stop(true);
    assert_eq!(r.status(), Status::Stopped);
    let req = r.req();
    r.at(
        1,
        Input::Restart {
            req,
            id: sid(),
            provider_config: None,
        },
    );
    let run = r.record().run.unwrap();
    let fx = r.start(run, 9);
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::Write { text, .. } if text == "fix the tests")),
        "{fx:?}"
    );
    assert_eq!(r.status(), Status::Working);
}

/// The engine's next deadline is the earliest of its sessions' and its tasks', whichever kind
/// comes first (the simulator's two sweeps each drive one kind).
#[test]
fn the_next_deadline_is_the_earliest_of_sessions_and_tasks() {
    use paddock_core::task::{TaskInput, TaskSpec, TaskTimer};
    let mut c = config();
    c.timeout_ms = 10_000;
    let mut r = Rig::running(c);
    r.send("hi");
    let (session_at, timer) = r.next_deadline();
    assert_eq!(timer, Timer::SessionTimeout);
    let launch = |r: &mut Rig, id: &str, timeout_ms: u64| {
        let req = r.req();
        let spec = TaskSpec {
            command: vec!["work".into()],
            timeout_ms,
            ..TaskSpec::default()
        };
        let id = id.to_string();
        r.at(
            0,
            Input::Task(TaskInput::Launch {
                req,
                id: id.clone(),
                spec: spec.into(),
            }),
        );
        r.at(0, Input::Task(TaskInput::Started { id, pid: 7 }));
    };
    // A task due after the session: the session's deadline stays the next.
    launch(&mut r, "task_late", 20_000);
    assert_eq!(r.next_deadline(), (session_at, Timer::SessionTimeout));
    // One due when the session is: a tie goes to the session.
    let tie = session_at - r.now;
    launch(&mut r, "task_tie", tie);
    assert_eq!(r.next_deadline(), (session_at, Timer::SessionTimeout));
    let held = |r: &Rig| -> Vec<String> { r.engine.tasks().map(|t| t.id.clone()).collect() };
    assert_eq!(
        held(&r),
        ["task_late", "task_tie"],
        "every task, in id order"
    );
    let sessions: Vec<_> = r.engine.sessions().map(|s| s.record.id.clone()).collect();
    assert_eq!(sessions, [sid()]);
    // One due before it: the task's is the next, then the session's again once it is past.
    launch(&mut r, "task_early", 3_000);
    let task_at = r.now + 3_000;
    assert!(task_at < session_at);
    match r.engine.poll_timeout() {
        Some((at, Deadline::Task(id, TaskTimer::Timeout))) => {
            assert_eq!((at.millis(), id.as_str()), (task_at, "task_early"));
        }
        other => panic!("the early task's timeout, not {other:?}"),
    }
    r.at(task_at - r.now, Input::Tick);
    r.at(
        0,
        Input::Task(TaskInput::Exited {
            id: "task_early".into(),
            code: None,
            signal: Some(15),
        }),
    );
    assert_eq!(r.next_deadline(), (session_at, Timer::SessionTimeout));
}

/// The code of the `ReplyContainer` answering `req`.
fn container_refusal(fx: &[Effect], req: RequestId) -> Option<ErrorCode> {
    fx.iter().find_map(|e| match e {
        Effect::ReplyContainer { req: r, result } if *r == req => {
            result.as_ref().err().map(|e| e.code)
        }
        _ => None,
    })
}

#[test]
fn a_container_bound_to_an_unknown_session_or_asked_for_during_a_shutdown_is_refused() {
    use paddock_core::container::{ContainerRequest, ContainerSpec};
    let mut r = Rig::new();
    let spec = |session: Option<&str>| {
        ContainerRequest::Create(Box::new(ContainerSpec {
            name: "build".into(),
            session: session.map(SessionId::from),
            ..ContainerSpec::default()
        }))
    };
    let fx = r.at(
        0,
        Input::Container {
            req: 1,
            id: "c1".into(),
            request: spec(Some("nope")),
        },
    );
    assert_eq!(container_refusal(&fx, 1), Some(ErrorCode::SessionNotFound));
    assert!(r.engine.containers().get("c1").is_none());
    // One of no session is made (the driver's report finishes it).
    let fx = r.at(
        0,
        Input::Container {
            req: 2,
            id: "c2".into(),
            request: spec(None),
        },
    );
    assert_eq!(container_refusal(&fx, 2), None);
    assert!(r.engine.containers().get("c2").is_some());
    r.at(
        0,
        Input::Shutdown {
            req: 3,
            graceful: true,
        },
    );
    let fx = r.at(
        0,
        Input::Container {
            req: 4,
            id: "c3".into(),
            request: spec(None),
        },
    );
    assert_eq!(container_refusal(&fx, 4), Some(ErrorCode::ShuttingDown));
}

#[test]
fn the_shell_reads_live_tasks_and_the_trace_of_table_lookups() {
    let mut r = Rig::new();
    let launch = Input::Task(paddock_core::task::TaskInput::Launch {
        req: 1,
        id: "task_1".into(),
        spec: Box::new(paddock_core::task::TaskSpec {
            command: vec!["true".into()],
            ..Default::default()
        }),
    });
    r.at(0, launch);
    assert_eq!(r.engine.live_tasks(), 1);
    r.create(config());
    r.engine.set_trace(true);
    r.stop(false);
    assert!(
        !r.engine.take_trace().is_empty(),
        "a stop looks its rule up"
    );
    assert!(r.engine.take_trace().is_empty(), "taken");
}

#[test]
fn a_task_bound_to_a_session_lives_while_it_does_and_ends_with_it() {
    use paddock_core::task::{TaskInput, TaskSpec};
    let mut r = Rig::running(config());
    // `exec_1` bound to the session, and a task of no session running next to it.
    for (req, id, session, pid) in [
        (90, "exec_1", sid().0, 77),
        (91, "task_free", String::new(), 78),
    ] {
        let spec = TaskSpec {
            session_id: session,
            command: vec!["sleep".into(), "60".into()],
            ..Default::default()
        };
        r.at(
            0,
            Input::Task(TaskInput::Launch {
                req,
                id: id.into(),
                spec: spec.into(),
            }),
        );
        r.at(0, Input::Task(TaskInput::Started { id: id.into(), pid }));
    }
    let signalled = |fx: &[Effect], task: &str| {
        fx.iter()
            .any(|e| matches!(e, Effect::SignalTask { id, .. } if id == task))
    };
    // Its session works on: the task is left alone.
    let (_, fx) = r.send("hi");
    assert!(!signalled(&fx, "exec_1"), "{fx:?}");
    assert_eq!(r.engine.live_tasks(), 2);
    // Its session ends: so does the task, and only the session's task.
    let (_, mut fx) = r.stop(false);
    fx.extend(r.provider(1, exited()));
    assert_eq!(r.status(), Status::Stopped);
    assert!(signalled(&fx, "exec_1"), "{fx:?}");
    assert!(!signalled(&fx, "task_free"), "{fx:?}");
}

/// sunbeam's EndSession: a close marks the session for good and stops it gracefully in the same
/// step (stored with the stop's first transition); one of a session that had ended already is
/// refused as a stop is (OBEY-2020) and closes it all the same; and a closed session is never
/// the one a project resumes.
#[test]
fn a_close_marks_the_session_and_stops_it_in_one_step() {
    let mut config = config();
    config.provider_config = paddock_core::ProviderConfig::parse(
        [(paddock_core::PROJECT_KEY.to_string(), "/p".to_string())].into(),
    )
    .unwrap();
    let mut r = Rig::running(config);
    let resumable = r.record();
    assert!(resumable.resumable_for("/p") && !resumable.resumable_for("/q"));

    let req = r.req();
    let fx = r.at(1, Input::Close { req, id: sid() });
    assert_eq!(
        statuses(&fx),
        vec![(Some(Status::Running), Status::Stopping)]
    );
    let stored = fx.iter().find_map(|e| match e {
        Effect::Persist(Record::Session(rec)) => Some(rec.closed_by_client),
        _ => None,
    });
    assert_eq!(stored, Some(true), "closed in the stop's own transaction");
    r.provider(1, exited());
    assert_eq!(r.status(), Status::Stopped);
    let closed = r.record();
    assert!(closed.closed_by_client && !closed.resumable_for("/p"));
    assert_eq!(
        reply(&fx, req),
        None,
        "answered when stopped, as a graceful stop"
    );

    // Already ended: refused like a stop; nothing more to store.
    let req = r.req();
    let fx = r.at(1, Input::Close { req, id: sid() });
    assert_eq!(
        reply(&fx, req).unwrap().unwrap_err().code,
        ErrorCode::AlreadyStopped
    );
    assert!(!fx.iter().any(Effect::is_persist), "{fx:?}");

    // Which one a project resumes: the newest it may, never a closed one.
    let mut older = resumable.clone();
    older.id = SessionId("sess_0".into());
    older.created_at = Timestamp::from_millis(resumable.created_at.millis() - 1);
    let all = [older.clone(), closed.clone()];
    assert_eq!(
        paddock_core::session_to_resume("/p", &all).map(|r| &r.id),
        Some(&older.id)
    );
    assert_eq!(paddock_core::session_to_resume("/p", &all[1..]), None);
    let newer = resumable;
    let both = [older, newer.clone()];
    assert_eq!(
        paddock_core::session_to_resume("/p", &both).map(|r| &r.id),
        Some(&newer.id)
    );
}

/// A close of a session that had ended, and was never closed, is stored with the refusal.
#[test]
fn a_close_of_an_ended_session_is_refused_and_still_closes_it() {
    let mut r = Rig::running(config());
    r.stop(false);
    r.provider(1, exited());
    assert_eq!(r.status(), Status::Stopped);
    let req = r.req();
    let fx = r.at(1, Input::Close { req, id: sid() });
    assert_eq!(
        reply(&fx, req).unwrap().unwrap_err().code,
        ErrorCode::AlreadyStopped
    );
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::Persist(Record::Session(rec)) if rec.closed_by_client)));
    assert!(r.record().closed_by_client);
}

fn attach(
    r: &mut Rig,
    id: &str,
    config: Result<Box<SessionConfig>, Error>,
) -> (RequestId, Vec<Effect>) {
    let req = r.req();
    let fx = r.at(
        1,
        Input::Attach {
            req,
            project: "/p".into(),
            context: format!("context {req}"),
            id: SessionId::from(id),
            config,
        },
    );
    (req, fx)
}

/// An attach makes the project's session when it has none, joins it while it is live,
/// restarts it with the new context once it has ended, and makes a new one once it is closed.
#[test]
fn an_attach_resumes_the_projects_session_or_makes_one() {
    let mut r = Rig::new();
    // None yet: a refused configuration refuses the attach.
    let refused = Error::new(ErrorCode::CreationFailed, "no such script");
    let (req, fx) = attach(&mut r, "sess_1", Err(refused.clone()));
    assert_eq!(reply(&fx, req), Some(Err(refused.clone())));
    assert!(r.engine.session(&sid()).is_none());

    // Made, marked as the project's, the context its system prompt.
    let (_, fx) = attach(&mut r, "sess_1", Ok(Box::new(config())));
    assert!(
        fx.iter().any(|e| matches!(e, Effect::Spawn { .. })),
        "{fx:?}"
    );
    r.start(1, 42);
    let made = r.record();
    assert!(made.resumable_for("/p"));
    assert_eq!(
        made.config.provider_config.system_prompt(),
        Some("context 3")
    );

    // Live: joined as it is (at once, nothing stored), whatever its configuration.
    let (req, fx) = attach(&mut r, "sess_2", Err(refused));
    assert_eq!(reply(&fx, req).unwrap().unwrap().id, sid());
    assert!(!fx.iter().any(Effect::is_persist), "{fx:?}");
    assert!(r.engine.session(&SessionId::from("sess_2")).is_none());

    // Ended: restarted with this attach's context.
    r.stop(false);
    r.provider(1, exited());
    assert_eq!(r.status(), Status::Stopped);
    let (req, fx) = attach(&mut r, "sess_3", Ok(Box::new(config())));
    assert!(
        fx.iter().any(|e| matches!(e, Effect::Spawn { run: 2, .. })),
        "{fx:?}"
    );
    let fx = r.start(2, 43);
    assert_eq!(reply(&fx, req).unwrap().unwrap().id, sid());
    assert_eq!(
        r.record().config.provider_config.system_prompt(),
        Some(&*format!("context {req}"))
    );

    // Closed: never resumed; a new one is made.
    let req = r.req();
    r.at(1, Input::Close { req, id: sid() });
    let (_, fx) = attach(&mut r, "sess_4", Ok(Box::new(config())));
    assert!(
        r.engine.session(&SessionId::from("sess_4")).is_some(),
        "{fx:?}"
    );
}

/// An agent with no channel for a system prompt gets it ahead of its session's first
/// message; the message is stored as the client sent it, and later turns go as they are.
#[test]
fn the_system_prompt_goes_with_the_first_message_to_an_agent_without_one() {
    let writes = |fx: &[Effect]| -> Vec<String> {
        fx.iter()
            .filter_map(|e| match e {
                Effect::Write { text, .. } => Some(text.clone()),
                _ => None,
            })
            .collect()
    };
    let stored = |fx: &[Effect]| -> Vec<String> {
        fx.iter()
            .filter_map(|e| match e {
                Effect::Persist(Record::UserMessage(m)) => Some(m.text.clone()),
                _ => None,
            })
            .collect()
    };
    for (provider, carried) in [(Provider::Codex, true), (Provider::Scripted, false)] {
        let mut c = SessionConfig::new("camp_1", provider, "/tmp");
        c.provider_config = ProviderConfig::parse(
            [(SYSTEM_PROMPT_KEY.to_string(), "the rules".to_string())].into(),
        )
        .unwrap();
        let mut r = Rig::running(c);
        let (_, fx) = r.send("hello");
        let want = if carried {
            paddock_core::provider_config::with_system_prompt("the rules", "hello")
        } else {
            "hello".to_string()
        };
        assert_eq!(writes(&fx), vec![want], "{provider:?}");
        assert_eq!(stored(&fx), vec!["hello"]);
        assert_eq!(
            paddock_core::provider_config::without_system_prompt(&writes(&fx)[0]),
            "hello"
        );
        r.provider(1, act(ActivityKind::Completion, 1, 1));
        let (_, fx) = r.send("again");
        assert_eq!(writes(&fx), vec!["again"], "{provider:?}");
    }
}

#[test]
fn a_sessions_task_has_the_sessions_variables_under_its_own() {
    use paddock_core::task::{TaskInput, TaskSpec};
    let mut c = config();
    c.environment = [("SHARED", "session"), ("ONLY_SESSION", "s")]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut r = Rig::running(c);
    let spec = TaskSpec {
        session_id: sid().0,
        command: vec!["env".into()],
        environment: [("SHARED".to_string(), "command".to_string())]
            .into_iter()
            .collect(),
        ..Default::default()
    };
    let fx = r.at(
        1,
        Input::Task(TaskInput::Launch {
            req: 90,
            id: "exec_1".into(),
            spec: spec.into(),
        }),
    );
    let spawned = fx
        .iter()
        .find_map(|e| match e {
            Effect::SpawnTask { spec, .. } => Some(spec.environment.clone()),
            _ => None,
        })
        .expect("launched");
    let got: Vec<(&str, &str)> = spawned
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(got, [("ONLY_SESSION", "s"), ("SHARED", "command")]);
}

#[test]
fn a_campaign_is_neither_added_nor_removed_during_a_shutdown() {
    use paddock_core::campaign::{CampaignError, NewCampaign};
    let mut r = Rig::new();
    let add = |req, id: &str, name: &str| Input::AddCampaign {
        req,
        id: id.into(),
        root: "/srv/p".into(),
        how: NewCampaign::Named(name.into()),
    };
    let fx = r.at(0, add(1, "camp_a", "a"));
    assert!(
        fx.iter().any(|e| matches!(
            e,
            Effect::ReplyAddCampaign {
                req: 1,
                result: Ok(_)
            }
        )),
        "{fx:?}"
    );
    r.at(
        0,
        Input::Shutdown {
            req: 2,
            graceful: true,
        },
    );
    // Each refused as the daemon shutting down.
    let refused = |fx: &[Effect], want: RequestId| {
        fx.iter().any(|e| match e {
            Effect::ReplyAddCampaign { req, result } => {
                *req == want && result == &Err(CampaignError::ShuttingDown)
            }
            Effect::ReplyRemoveCampaign { req, result } => {
                *req == want && result == &Err(CampaignError::ShuttingDown)
            }
            _ => false,
        })
    };
    let fx = r.at(0, add(3, "camp_b", "b"));
    assert!(refused(&fx, 3), "{fx:?}");
    let remove = Input::RemoveCampaign {
        req: 4,
        key: "a".into(),
    };
    let fx = r.at(0, remove);
    assert!(refused(&fx, 4), "{fx:?}");
    assert!(
        !fx.iter().any(|e| matches!(e, Effect::Persist(_))),
        "{fx:?}"
    );
    assert!(r.engine.campaigns().get("a").is_some() && r.engine.campaigns().get("b").is_none());
}
