//! Human approvals, rule by rule: a request the policy does not settle makes the session
//! WAITING until it is resolved exactly once (approve, deny, answer, expiry), and a stop,
//! restart, failure or daemon restart closes it.

use std::collections::BTreeMap;

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

fn sid() -> SessionId {
    SessionId::from("sess_1")
}

struct Rig {
    engine: Engine,
    now: Millis,
    req: RequestId,
}

impl Rig {
    /// A session (run 1, pid 42) with `permissions` and a 60 s approval timeout, working on a
    /// turn.
    fn working(permissions: &str) -> Rig {
        Rig::working_with(&[("permissions", permissions)])
    }

    /// The same with these settings besides the 60 s approval timeout.
    fn working_with(settings: &[(&str, &str)]) -> Rig {
        let mut config = SessionConfig::new("camp", Provider::Scripted, "/tmp");
        config.provider_config = paddock_core::ProviderConfig::parse(
            [("approval_timeout", "60s")]
                .iter()
                .chain(settings)
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
        .expect("valid settings");
        let mut r = Rig {
            engine: Engine::new(Limits::default()),
            now: T0,
            req: 0,
        };
        let req = r.next_req();
        r.at(
            0,
            Input::Create {
                req,
                id: sid(),
                config: config.into(),
            },
        );
        r.provider(ProviderEvent::Started { pid: Some(42) });
        r.provider(ProviderEvent::Ready);
        let req = r.next_req();
        r.at(
            1,
            Input::Send {
                req,
                id: sid(),
                text: "go".into(),
            },
        );
        assert_eq!(r.status(), Status::Working);
        r
    }

    fn next_req(&mut self) -> RequestId {
        self.req += 1;
        self.req
    }

    fn at(&mut self, dt: Millis, input: Input) -> Vec<Effect> {
        self.now += dt;
        self.engine.handle(now(self.now), input)
    }

    fn provider(&mut self, event: ProviderEvent) -> Vec<Effect> {
        self.at(
            1,
            Input::Provider {
                id: sid(),
                run: 1,
                cursor: None,
                event,
            },
        )
    }

    fn ask(&mut self, id: &str, kind: AskKind, tool: &str) -> Vec<Effect> {
        self.provider(ProviderEvent::Ask(paddock_core::Ask {
            approval: id.into(),
            key: format!("key-{id}"),
            kind,
            tool: tool.into(),
            input: r#"{"command":"rm -rf build"}"#.into(),
            summary: format!("{tool}: rm -rf build"),
        }))
    }

    fn resolve(&mut self, id: &str, decision: Decision) -> (Vec<Effect>, Result<Approval, Error>) {
        let req = self.next_req();
        let fx = self.at(
            1,
            Input::Resolve {
                req,
                approval: id.into(),
                session: None,
                decision,
                by: "cli".into(),
                stored: None,
            },
        );
        let result = fx
            .iter()
            .find_map(|e| match e {
                Effect::ReplyApproval { req: r, result } if *r == req => {
                    Some(result.clone().map(|a| *a))
                }
                _ => None,
            })
            .expect("a Resolve is always answered");
        (fx, result)
    }

    fn status(&self) -> Status {
        self.engine.session(&sid()).unwrap().status()
    }
}

fn answers(fx: &[Effect]) -> Vec<(String, bool, String)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Answer { approval, .. } => Some((
                approval.key.clone(),
                approval.allowed,
                approval.answer.clone(),
            )),
            _ => None,
        })
        .collect()
}

fn stored(fx: &[Effect]) -> Vec<(String, ApprovalState)> {
    fx.iter()
        .filter_map(|e| match e {
            Effect::Persist(Record::Approval(a)) => Some((a.id.clone(), a.state)),
            _ => None,
        })
        .collect()
}

#[test]
fn the_policy_settles_what_it_can_without_a_human() {
    let mut r = Rig::working("ask:Read");
    let fx = r.ask("a1", AskKind::Permission, "Read");
    assert_eq!(answers(&fx), [("key-a1".to_string(), true, String::new())]);
    assert!(stored(&fx).is_empty(), "a policy decision is not a request");
    assert_eq!(r.status(), Status::Working);

    let mut r = Rig::working("allow:Read");
    let fx = r.ask("a2", AskKind::Permission, "Bash");
    let a = answers(&fx);
    assert!(!a[0].1 && a[0].2.contains("denies Bash"), "{a:?}");
    assert_eq!(r.status(), Status::Working);
}

#[test]
fn an_approval_waits_then_the_answer_reaches_the_agent_once() {
    let mut r = Rig::working("ask");
    let fx = r.ask("a1", AskKind::Permission, "Bash");
    assert_eq!(stored(&fx), [("a1".to_string(), ApprovalState::Pending)]);
    assert!(answers(&fx).is_empty());
    assert_eq!(r.status(), Status::Waiting);
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::EmitApproval(a) if a.is_pending())));
    // A message now is refused, saying why.
    let req = r.next_req();
    let fx = r.at(
        1,
        Input::Send {
            req,
            id: sid(),
            text: "x".into(),
        },
    );
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::Reply { result: Err(e), .. }
        if e.code == ErrorCode::WrongState && e.message.contains("approvals"))));

    let (fx, result) = r.resolve("a1", Decision::Approve);
    let a = result.unwrap();
    assert_eq!(
        (a.state, a.allowed, a.resolved_by.as_str()),
        (ApprovalState::Approved, true, "cli")
    );
    assert_eq!(answers(&fx), [("key-a1".to_string(), true, String::new())]);
    assert_eq!(stored(&fx), [("a1".to_string(), ApprovalState::Approved)]);
    assert!(
        fx.contains(&Effect::EmitApproval(Box::new(a.clone()))),
        "the reply is the request as stored"
    );
    assert_eq!(r.status(), Status::Working);

    // A second answer is refused with OBEY-2041 and changes nothing.
    let (fx, result) = r.resolve(
        "a1",
        Decision::Deny {
            reason: "no".into(),
        },
    );
    let e = result.unwrap_err();
    assert_eq!(e.code, ErrorCode::ApprovalResolved);
    assert!(e.message.contains("already approved"), "{e}");
    assert!(answers(&fx).is_empty() && stored(&fx).is_empty());
    // An unknown one with OBEY-2040.
    let (_, result) = r.resolve("nope", Decision::Approve);
    assert_eq!(result.unwrap_err().code, ErrorCode::ApprovalNotFound);
}

#[test]
fn deny_and_answers_carry_their_text_and_the_session_waits_for_the_last_request() {
    let mut r = Rig::working("ask");
    r.ask("a1", AskKind::Permission, "Bash");
    r.ask("q1", AskKind::Question, "AskUserQuestion");
    assert_eq!(r.engine.pending_approvals().count(), 2);
    let (fx, _) = r.resolve(
        "a1",
        Decision::Deny {
            reason: "not here".into(),
        },
    );
    assert_eq!(
        answers(&fx),
        [("key-a1".to_string(), false, "not here".to_string())]
    );
    assert_eq!(r.status(), Status::Waiting, "the question is still open");
    // A permission cannot be "answered", nor a question... approved is fine (empty answer).
    let (_, result) = r.resolve(
        "q1",
        Decision::Answer {
            text: "Postgres 15".into(),
            is_error: false,
        },
    );
    assert_eq!(result.unwrap().answer, "Postgres 15");
    assert_eq!(r.status(), Status::Working);
}

#[test]
fn a_permission_cannot_be_answered_with_text() {
    let mut r = Rig::working("ask");
    r.ask("a1", AskKind::Permission, "Bash");
    let (_, result) = r.resolve(
        "a1",
        Decision::Answer {
            text: "sure".into(),
            is_error: false,
        },
    );
    assert_eq!(result.unwrap_err().code, ErrorCode::WrongState);
    assert_eq!(r.status(), Status::Waiting);
}

#[test]
fn an_unanswered_request_expires_with_the_sessions_default() {
    let mut r = Rig::working("ask");
    r.ask("a1", AskKind::Permission, "Bash");
    let (at, Deadline::Session(_, timer)) = r
        .engine
        .poll_timeout()
        .map(|(at, d)| (at.millis(), d))
        .unwrap()
    else {
        panic!("a session deadline")
    };
    assert_eq!(timer, Timer::ApprovalExpiry);
    r.now = at;
    let fx = r.engine.handle(now(at), Input::Tick);
    let a = answers(&fx);
    assert_eq!(a.len(), 1);
    assert!(
        !a[0].1 && a[0].2.contains("nobody answered within 60 s"),
        "{a:?}"
    );
    assert_eq!(stored(&fx), [("a1".to_string(), ApprovalState::Expired)]);
    assert_eq!(r.status(), Status::Working);
    let (_, result) = r.resolve("a1", Decision::Approve);
    assert!(result.unwrap_err().message.contains("already expired"));
}

/// Deadlines run on the monotonic clock; the wall clock is only recorded. A wall clock set an
/// hour back (or forward) neither delays nor hastens an expiry, and a restarted daemon, whose
/// monotonic clock starts again, brings the stored expiry (wall clock) onto its own clock.
#[test]
fn expiry_runs_on_the_monotonic_clock_and_a_restart_converts_it() {
    let mut r = Rig::working("ask");
    let fx = r.ask("a1", AskKind::Permission, "Bash");
    let Some(Effect::Persist(Record::Approval(pending))) = fx
        .iter()
        .find(|e| matches!(e, Effect::Persist(Record::Approval(_))))
        .cloned()
    else {
        unreachable!()
    };
    let pending = *pending;
    let asked = r.now;
    assert_eq!(
        (pending.created_at, pending.expires_at),
        (ts(asked), ts(asked + 60_000)),
        "recorded on the wall clock"
    );
    let due = Instant::from_millis(asked + 60_000);
    assert_eq!(
        r.engine.poll_timeout(),
        Some((due, Deadline::Session(sid(), Timer::ApprovalExpiry)))
    );
    // 59 s later on the monotonic clock, the wall clock an hour ahead: not due.
    let hour = 3_600_000;
    let skewed = |mono: Millis, wall: Millis| Now::new(Instant::from_millis(mono), ts(wall));
    let fx = r
        .engine
        .handle(skewed(asked + 59_000, asked + 59_000 + hour), Input::Tick);
    assert!(fx.is_empty(), "{fx:?}");
    assert_eq!(r.status(), Status::Waiting);
    // At the deadline, the wall clock set back below where it was: due all the same, and
    // the record keeps the latest wall-clock time seen (time never goes back in the core).
    let fx = r.engine.handle(skewed(asked + 60_000, asked), Input::Tick);
    let expired = fx
        .iter()
        .find_map(|e| match e {
            Effect::Persist(Record::Approval(a)) if a.state == ApprovalState::Expired => {
                Some(a.clone())
            }
            _ => None,
        })
        .expect("expired at its monotonic deadline");
    assert_eq!(expired.resolved_at, Some(ts(asked + 59_000 + hour)));

    // A new daemon: its monotonic clock starts at 0, the wall clock is 20 s past the ask.
    let record = r.engine.session(&sid()).unwrap().record.clone();
    let waiting = SessionRecord {
        status: Status::Waiting,
        ..record
    };
    let stored = Stored {
        sessions: vec![waiting],
        approvals: vec![pending],
        ..Stored::default()
    };
    let surviving = Surviving {
        agents: [((sid(), 1), Some(42))].into_iter().collect(),
        ..Surviving::default()
    };
    let (engine, _) = Engine::restore(
        Limits::default(),
        Now::new(Instant::ORIGIN, ts(asked + 20_000)),
        stored,
        &surviving,
    );
    assert_eq!(
        engine.poll_timeout(),
        Some((
            Instant::from_millis(40_000),
            Deadline::Session(sid(), Timer::ApprovalExpiry)
        )),
        "40 s left, on the new clock"
    );
}

#[test]
fn a_graceful_stop_tells_the_agent_no_and_a_turn_end_closes_what_is_open() {
    let mut r = Rig::working("ask");
    r.ask("a1", AskKind::Permission, "Bash");
    let req = r.next_req();
    let fx = r.at(
        1,
        Input::Stop {
            req,
            id: sid(),
            graceful: true,
        },
    );
    assert_eq!(answers(&fx)[0].2, "the session is stopping");
    assert_eq!(stored(&fx), [("a1".to_string(), ApprovalState::Cancelled)]);
    assert_eq!(r.status(), Status::Stopping);
    // The turn, still finishing, asks again: told no at once.
    let fx = r.ask("a2", AskKind::Permission, "Bash");
    assert_eq!(answers(&fx)[0].2, "the session is stopping");
    assert!(stored(&fx).is_empty());

    let mut r = Rig::working("ask");
    r.ask("a1", AskKind::Permission, "Bash");
    let fx = r.provider(ProviderEvent::Activity(Activity::new(
        ActivityKind::Completion,
        "gave up",
    )));
    assert_eq!(stored(&fx), [("a1".to_string(), ApprovalState::Cancelled)]);
    assert_eq!(r.status(), Status::Running);
}

#[test]
fn a_crash_while_waiting_fails_the_session_and_cancels_the_request() {
    let mut r = Rig::working("ask");
    r.ask("a1", AskKind::Permission, "Bash");
    let fx = r.provider(ProviderEvent::Exited {
        code: Some(1),
        signal: None,
        stderr_tail: String::new(),
    });
    assert_eq!(stored(&fx), [("a1".to_string(), ApprovalState::Cancelled)]);
    assert_eq!(r.status(), Status::Failed);
    let (_, result) = r.resolve("a1", Decision::Approve);
    assert!(result.unwrap_err().message.contains("already cancelled"));
}

#[test]
fn an_open_request_survives_a_daemon_restart_when_the_agent_does() {
    let mut r = Rig::working("ask");
    let fx = r.ask("a1", AskKind::Permission, "Bash");
    let Some(Effect::Persist(Record::Approval(pending))) = fx
        .iter()
        .find(|e| matches!(e, Effect::Persist(Record::Approval(_))))
        .cloned()
    else {
        unreachable!()
    };
    let pending = *pending;
    let record = r.engine.session(&sid()).unwrap().record.clone();
    assert_eq!(record.status, Status::Waiting);

    // Adopted: still waiting, still answerable, and the answer goes to the same run.
    let mut surviving = BTreeMap::new();
    surviving.insert(sid(), (1, Some(42)));
    let (mut engine, _) = restore_with(
        Limits::default(),
        r.now + 5,
        [record.clone()],
        [pending.clone()],
        &surviving,
    );
    assert_eq!(engine.session(&sid()).unwrap().status(), Status::Waiting);
    let fx = engine.handle(
        now(r.now + 10),
        Input::Resolve {
            req: 99,
            approval: "a1".into(),
            session: Some(sid()),
            decision: Decision::Approve,
            by: "cli".into(),
            stored: None,
        },
    );
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::Answer { run: 1, approval, .. } if approval.key == "key-a1")));
    assert_eq!(engine.session(&sid()).unwrap().status(), Status::Working);

    // Not adopted (the agent is gone): FAILED, the request cancelled.
    let (engine, fx) = restore_with(
        Limits::default(),
        r.now + 5,
        [record],
        [pending],
        &BTreeMap::new(),
    );
    assert_eq!(engine.session(&sid()).unwrap().status(), Status::Failed);
    assert_eq!(stored(&fx), [("a1".to_string(), ApprovalState::Cancelled)]);
}

#[test]
fn only_a_terminal_session_is_deleted() {
    let mut r = Rig::working("allow-all");
    let req = r.next_req();
    let fx = r.at(1, Input::Delete { req, id: sid() });
    assert!(fx.iter().any(
        |e| matches!(e, Effect::Reply { result: Err(e), .. } if e.code == ErrorCode::WrongState)
    ));
    let req = r.next_req();
    r.at(
        1,
        Input::Stop {
            req,
            id: sid(),
            graceful: false,
        },
    );
    // Still stopping: not yet.
    let req = r.next_req();
    let fx = r.at(1, Input::Delete { req, id: sid() });
    assert!(fx.iter().any(
        |e| matches!(e, Effect::Reply { result: Err(e), .. } if e.code == ErrorCode::WrongState)
    ));
    r.provider(ProviderEvent::Exited {
        code: None,
        signal: Some(15),
        stderr_tail: String::new(),
    });
    assert_eq!(r.status(), Status::Stopped);
    let req = r.next_req();
    let fx = r.at(1, Input::Delete { req, id: sid() });
    assert!(matches!(&fx[0], Effect::Persist(Record::Delete(id)) if *id == sid()));
    assert!(r.engine.session(&sid()).is_none());
    let req = r.next_req();
    let fx = r.at(1, Input::Delete { req, id: sid() });
    assert!(fx.iter().any(|e| matches!(e, Effect::Reply { result: Err(e), .. } if e.code == ErrorCode::SessionNotFound)));
}

#[test]
fn an_adopted_agent_is_sent_its_answers_again_and_run_ids_stay_unique() {
    // Answers go out after their resolution is stored: a daemon that died in between leaves
    // an agent that never got its answer. The new daemon sends it again (the agent ignores an
    // answer it already has).
    let mut r = Rig::working("ask");
    r.ask("a1", AskKind::Permission, "Bash");
    let (fx, result) = r.resolve("a1", Decision::Approve);
    let resolved = result.unwrap();
    assert!(fx.iter().any(|e| matches!(e, Effect::Answer { .. })));
    let record = r.engine.session(&sid()).unwrap().record.clone();
    let mut surviving = BTreeMap::new();
    surviving.insert(sid(), (1, Some(42)));
    let (engine, fx) = restore_with(
        Limits::default(),
        r.now + 5,
        [record.clone()],
        [resolved.clone()],
        &surviving,
    );
    assert!(
        fx.iter().any(
            |e| matches!(e, Effect::Answer { run: 1, approval, .. } if **approval == resolved)
        ),
        "{fx:?}"
    );
    assert_eq!(engine.session(&sid()).unwrap().status(), Status::Working);

    // A request's run id is never handed to another process, even when no record names it.
    let mut old = resolved;
    old.run = 40;
    let (mut engine, _) = restore_with(
        Limits::default(),
        r.now + 5,
        [record],
        [old],
        &BTreeMap::new(),
    );
    let fx = engine.handle(
        now(r.now + 10),
        Input::Restart {
            req: 1,
            id: sid(),
            provider_config: None,
        },
    );
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::Spawn { run, .. } if *run > 40)),
        "{fx:?}"
    );
}

#[test]
fn expiry_allows_only_permissions_and_open_requests_are_bounded() {
    // approval_default=allow lets a permission go ahead on expiry, never makes up an answer.
    let mut r = {
        let mut config = SessionConfig::new("camp", Provider::Scripted, "/tmp");
        config.provider_config = paddock_core::ProviderConfig::parse(
            [
                ("permissions", "ask"),
                ("approval_timeout", "10s"),
                ("approval_default", "allow"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        )
        .expect("valid settings");
        let mut r = Rig {
            engine: Engine::new(Limits::default()),
            now: T0,
            req: 0,
        };
        r.at(
            0,
            Input::Create {
                req: 1,
                id: sid(),
                config: config.into(),
            },
        );
        r.provider(ProviderEvent::Started { pid: Some(1) });
        r.provider(ProviderEvent::Ready);
        r.at(
            1,
            Input::Send {
                req: 2,
                id: sid(),
                text: "go".into(),
            },
        );
        r
    };
    r.ask("p", AskKind::Permission, "Bash");
    r.ask("q", AskKind::Question, "AskUserQuestion");
    r.ask("c", AskKind::ClientTool, "run_tests");
    let (at, _) = r
        .engine
        .poll_timeout()
        .map(|(at, d)| (at.millis(), d))
        .unwrap();
    let fx = r.engine.handle(now(at + 10), Input::Tick);
    let told = answers(&fx);
    assert_eq!(told.len(), 3);
    assert!(told[0].1, "the permission is allowed by the default");
    assert!(!told[1].1 && !told[2].1, "{told:?}");
    assert_eq!(told[1].2, "nobody answered within 10 s");

    // At most MAX_OPEN_REQUESTS wait; the next ask is told no at once, nothing stored.
    let mut r = Rig::working("ask");
    for i in 0..paddock_core::approval::MAX_OPEN_REQUESTS {
        r.ask(&format!("a{i}"), AskKind::Permission, "Bash");
    }
    let fx = r.ask("over", AskKind::Permission, "Bash");
    let told = answers(&fx);
    assert!(
        !told[0].1 && told[0].2.contains("already waiting"),
        "{told:?}"
    );
    assert!(stored(&fx).is_empty());
    assert!(fx
        .iter()
        .any(|e| matches!(e, Effect::Answer { at_once: true, .. })));

    // An answer beyond ANSWER_MAX is refused; the request stays open.
    let (_, result) = r.resolve(
        "a0",
        Decision::Deny {
            reason: "x".repeat(paddock_core::approval::ANSWER_MAX + 1),
        },
    );
    assert_eq!(result.unwrap_err().code, ErrorCode::WrongState);
    assert_eq!(r.status(), Status::Waiting);
    // A client scoped to another session does not find it.
    let req = r.next_req();
    let fx = r.at(
        1,
        Input::Resolve {
            req,
            approval: "a0".into(),
            session: Some(SessionId::from("other")),
            decision: Decision::Approve,
            by: "sunbeam".into(),
            stored: None,
        },
    );
    assert!(fx.iter().any(|e| matches!(e, Effect::ReplyApproval { result: Err(e), .. } if e.code == ErrorCode::ApprovalNotFound)));
}

#[test]
fn a_request_resolved_beyond_the_engines_memory_is_still_a_second_answer() {
    let mut r = Rig::working("ask");
    r.ask("old", AskKind::Permission, "Bash");
    let (_, first) = r.resolve("old", Decision::Approve);
    let old = first.unwrap();
    // Push it out of the window of remembered requests.
    for i in 0..paddock_core::session::machine::RESOLVED_KEPT {
        r.ask(&format!("n{i}"), AskKind::Permission, "Bash");
        r.resolve(&format!("n{i}"), Decision::Approve).1.unwrap();
    }
    let (_, forgotten) = r.resolve("old", Decision::Approve);
    assert_eq!(forgotten.unwrap_err().code, ErrorCode::ApprovalNotFound);
    // With the store's copy (as the shell passes it): OBEY-2041, saying how it ended.
    let req = r.next_req();
    let fx = r.at(
        1,
        Input::Resolve {
            req,
            approval: "old".into(),
            session: None,
            decision: Decision::Deny {
                reason: "no".into(),
            },
            by: "cli".into(),
            stored: Some(Box::new(old)),
        },
    );
    assert!(fx.iter().any(|e| matches!(e, Effect::ReplyApproval { result: Err(e), .. }
        if e.code == ErrorCode::ApprovalResolved && e.message.contains("already approved (by cli)"))),
        "{fx:?}");
}

#[test]
fn a_settled_session_recalled_later_answers_as_if_it_had_been_restored() {
    let mut r = Rig::working("ask");
    r.ask("a1", AskKind::Permission, "Bash");
    let resolved = r.resolve("a1", Decision::Approve).1.unwrap();
    let req = r.next_req();
    r.at(
        1,
        Input::Stop {
            req,
            id: sid(),
            graceful: false,
        },
    );
    r.provider(ProviderEvent::Exited {
        code: None,
        signal: Some(15),
        stderr_tail: String::new(),
    });
    let record = r.engine.session(&sid()).unwrap().record.clone();
    assert!(record.is_settled(), "{record:?}");
    // One daemon restores it at start-up; the other starts without it and recalls it when an
    // input names it. Every input after that is answered the same by both.
    let at = r.now + 10;
    let (mut restored, fx) = restore_with(
        Limits::default(),
        at,
        vec![record.clone()],
        vec![resolved.clone()],
        &BTreeMap::new(),
    );
    assert!(fx.is_empty(), "a settled session needs no decision: {fx:?}");
    let (mut recalled, fx) = restore_with(Limits::default(), at, vec![], vec![], &BTreeMap::new());
    assert!(fx.is_empty());
    assert!(recalled.session(&sid()).is_none());
    // The shell reserves the run ids the store names (its requests' runs among them).
    recalled.reserve_runs_through(resolved.run);
    recalled.recall(record.clone(), vec![resolved]);
    assert_eq!(recalled.live_sessions(), 0);
    assert_eq!(recalled.poll_timeout(), None);
    let second_answer = Input::Resolve {
        req: 100,
        approval: "a1".into(),
        session: None,
        decision: Decision::Approve,
        by: "cli".into(),
        stored: None,
    };
    let inputs = [
        second_answer,
        Input::Send {
            req: 101,
            id: sid(),
            text: "hi".into(),
        },
        Input::Stop {
            req: 102,
            id: sid(),
            graceful: true,
        },
        Input::Restart {
            req: 103,
            id: sid(),
            provider_config: None,
        },
    ];
    for input in inputs {
        let a = restored.handle(now(at + 1), input.clone());
        let b = recalled.handle(now(at + 1), input);
        assert_eq!(a, b);
        assert!(!a.is_empty());
    }
    assert_eq!(
        restored.session(&sid()).unwrap().record,
        recalled.session(&sid()).unwrap().record
    );
}

#[test]
#[should_panic(expected = "only a settled session is recalled")]
fn a_session_with_something_to_decide_is_never_recalled() {
    let r = Rig::working("ask");
    let record = r.engine.session(&sid()).unwrap().record.clone();
    Engine::new(Limits::default()).recall(record, vec![]);
}

#[test]
fn a_settled_session_is_let_go_and_recalled_with_the_same_answers() {
    let mut r = Rig::working("ask");
    r.ask("a1", AskKind::Permission, "Bash");
    let resolved = r.resolve("a1", Decision::Approve).1.unwrap();
    // Live, or ending: nothing to let go.
    assert_eq!(r.engine.evict_settled().len(), 0);
    let req = r.next_req();
    r.at(
        1,
        Input::Stop {
            req,
            id: sid(),
            graceful: false,
        },
    );
    assert_eq!(
        r.engine.evict_settled().len(),
        0,
        "its process is still being ended"
    );
    r.provider(ProviderEvent::Exited {
        code: None,
        signal: Some(15),
        stderr_tail: String::new(),
    });
    let record = r.engine.session(&sid()).unwrap().record.clone();
    let kept = r.engine.clone();
    assert_eq!(r.engine.evict_settled().len(), 1);
    assert!(r.engine.session(&sid()).is_none());
    assert_eq!(r.engine.evict_settled().len(), 0);
    // Named again, it comes back from what the store holds and answers as the kept one does.
    r.engine.recall(record, vec![resolved]);
    let mut kept = kept;
    let at = now(r.now + 1);
    for input in [
        Input::Resolve {
            req: 100,
            approval: "a1".into(),
            session: None,
            decision: Decision::Approve,
            by: "cli".into(),
            stored: None,
        },
        Input::Stop {
            req: 101,
            id: sid(),
            graceful: true,
        },
        Input::Restart {
            req: 102,
            id: sid(),
            provider_config: None,
        },
    ] {
        assert_eq!(kept.handle(at, input.clone()), r.engine.handle(at, input));
    }
    // Restarted: live again, so kept.
    assert_eq!(r.engine.evict_settled().len(), 0);
    assert_eq!(r.engine.live_sessions(), 1);
}

#[test]
fn only_the_stores_resolved_copy_of_that_request_and_session_is_a_second_answer() {
    let mut r = Rig::working("ask");
    r.ask("old", AskKind::Permission, "Bash");
    let old = r.resolve("old", Decision::Approve).1.unwrap();
    for i in 0..paddock_core::session::machine::RESOLVED_KEPT {
        r.ask(&format!("n{i}"), AskKind::Permission, "Bash");
        r.resolve(&format!("n{i}"), Decision::Approve).1.unwrap();
    }
    let mut answer = |session: Option<SessionId>, stored: Approval| {
        let req = r.next_req();
        let fx = r.at(
            1,
            Input::Resolve {
                req,
                approval: "old".into(),
                session,
                decision: Decision::Approve,
                by: "cli".into(),
                stored: Some(Box::new(stored)),
            },
        );
        fx.iter()
            .find_map(|e| match e {
                Effect::ReplyApproval { req: q, result } if *q == req => {
                    Some(result.as_ref().map(|_| ()).map_err(|e| e.code))
                }
                _ => None,
            })
            .expect("answered")
    };
    // Of this session, asked by it: a second answer.
    assert_eq!(
        answer(Some(sid()), old.clone()),
        Err(ErrorCode::ApprovalResolved)
    );
    // Asked by a client of another session: not found there.
    assert_eq!(
        answer(Some(SessionId::from("other")), old.clone()),
        Err(ErrorCode::ApprovalNotFound)
    );
    // A copy of another request, or one the store still has open, settles nothing.
    let mut other = old.clone();
    other.id = "else".into();
    assert_eq!(answer(None, other), Err(ErrorCode::ApprovalNotFound));
    let mut open = old.clone();
    open.state = ApprovalState::Pending;
    open.resolved_at = None;
    assert_eq!(answer(None, open), Err(ErrorCode::ApprovalNotFound));
}

/// An answer (or a deny's reason) of up to `ANSWER_MAX` bytes is passed on whole; a longer one
/// is refused and the request stays open.
#[test]
fn an_answer_of_at_most_answer_max_bytes_is_passed_on() {
    let mut r = Rig::working("ask");
    r.ask("q1", AskKind::Question, "AskUserQuestion");
    let answer = |n| Decision::Answer {
        text: "x".repeat(n),
        is_error: false,
    };
    let (_, result) = r.resolve("q1", answer(paddock_core::approval::ANSWER_MAX + 1));
    let e = result.unwrap_err();
    assert_eq!(e.code, ErrorCode::WrongState);
    assert!(e.message.contains("at most 262144 are passed on"), "{e:?}");
    assert_eq!(r.status(), Status::Waiting, "still open");
    let (fx, result) = r.resolve("q1", answer(paddock_core::approval::ANSWER_MAX));
    assert_eq!(
        result.unwrap().answer.len(),
        paddock_core::approval::ANSWER_MAX
    );
    assert_eq!(answers(&fx).len(), 1);
}

/// What an expiry tells the agent: a permission the session's default allows goes ahead (no
/// error); a permission it denies, and a question (nobody can make up its answer), are errors.
#[test]
fn an_expiry_is_an_error_unless_the_default_allows() {
    for (default, kind, allowed) in [
        ("deny", AskKind::Permission, false),
        ("deny", AskKind::Question, false),
        ("allow", AskKind::Permission, true),
        ("allow", AskKind::Question, false),
    ] {
        let mut r = Rig::working_with(&[("permissions", "ask"), ("approval_default", default)]);
        r.ask("a1", kind, "Bash");
        let (at, _) = r.engine.poll_timeout().unwrap();
        r.now = at.millis();
        let fx = r.engine.handle(now(r.now), Input::Tick);
        let expired = fx
            .iter()
            .find_map(|e| match e {
                Effect::Answer { approval, .. } => Some(approval.clone()),
                _ => None,
            })
            .expect("the agent is told");
        assert_eq!(expired.state, ApprovalState::Expired);
        assert_eq!(
            (expired.allowed, expired.is_error),
            (allowed, !allowed),
            "default {default}, {kind:?}"
        );
    }
}

/// A loss of the agent's output while the daemon was away is recorded once, on a live session;
/// a report of nothing lost, or one for an ended session, records nothing.
#[test]
fn output_lost_is_recorded_only_when_something_was_lost_on_a_live_session() {
    let lost = |dropped| ProviderEvent::OutputLost {
        dropped,
        first: 3,
        next: 3 + dropped,
    };
    let recorded = |fx: &[Effect]| fx.iter().filter(|e| matches!(e, Effect::Notice(_))).count();
    let mut r = Rig::working("allow-all");
    assert_eq!(recorded(&r.provider(lost(0))), 0, "nothing lost");
    assert_eq!(recorded(&r.provider(lost(2))), 1);
    r.provider(ProviderEvent::Exited {
        code: Some(1),
        signal: None,
        stderr_tail: String::new(),
    });
    assert!(r.status().is_terminal());
    assert_eq!(recorded(&r.provider(lost(2))), 0, "an ended session");
}

/// A message refused says why: a session waiting for a human names the way out; one that is
/// busy says what a message needs.
#[test]
fn a_refused_message_says_what_the_session_waits_for() {
    let mut r = Rig::working("ask");
    let send = |r: &mut Rig| {
        let req = r.next_req();
        let fx = r.at(
            1,
            Input::Send {
                req,
                id: sid(),
                text: "more".into(),
            },
        );
        fx.iter()
            .find_map(|e| match e {
                Effect::Reply { req: q, result } if *q == req => Some(result.clone()),
                _ => None,
            })
            .expect("a Send is answered")
            .unwrap_err()
            .message
    };
    let busy = send(&mut r);
    assert!(
        busy.contains("SendMessage needs a RUNNING session"),
        "{busy}"
    );
    r.ask("a1", AskKind::Permission, "Bash");
    let waiting = send(&mut r);
    assert!(
        waiting.contains("answer its open request first"),
        "{waiting}"
    );
}
