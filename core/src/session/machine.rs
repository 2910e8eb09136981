//! One session's machine: its durable record plus what only lives while the daemon runs (the
//! provider process, the current turn, a pending stop or restart, the deadlines).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use super::effect::{Effect, Record, SpawnSpec};
use super::input::{Ask, ProviderEvent};
use super::table::{rule, InputKind, Rule};
use crate::approval::{Approval, ApprovalId, ApprovalState, AskKind, Decision, PolicyAnswer};
use crate::budget::{timeout_deadline, TokenBudget};
use crate::environment::{EnvEvent, EnvState};
use crate::error::{Error, ErrorCode};
use crate::model::{
    Activity, ActivityEvent, ActivityKind, RequestId, RunId, SessionConfig, SessionRecord, Status,
    StatusEvent, UserMessage,
};
use crate::process::Life;
use crate::time::{Duration, Instant, Now};
use crate::Limits;

/// The provider process of a session, as the core knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Run {
    /// No process.
    Idle,
    /// Run `run`, from its `Spawn` to its exit: its [`Life`] (a graceful stop's `Ending` is
    /// the session's alone).
    Live { run: RunId, life: Life },
}

impl Run {
    pub fn id(self) -> Option<RunId> {
        match self {
            Run::Idle => None,
            Run::Live { run, .. } => Some(run),
        }
    }

    /// The process's life, unless there is none.
    pub fn life(self) -> Option<Life> {
        match self {
            Run::Idle => None,
            Run::Live { life, .. } => Some(life),
        }
    }

    /// Its process runs, as `Alive` (not being spawned, not asked to end, not terminating).
    fn is_alive(self) -> bool {
        matches!(self.life(), Some(Life::Alive { .. }))
    }
}

/// What a session does once its process is gone after a stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AfterStop {
    Stopped,
    Restart,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct StopPlan {
    /// Graceful stop waiting for the current turn until then.
    grace_deadline: Option<Instant>,
    /// The grace period ran out and the turn was interrupted: replies carry OBEY-2021.
    timed_out: bool,
    replies: Vec<RequestId>,
    then: AfterStop,
}

/// Which deadline [`Session::next_deadline`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Timer {
    Startup,
    SessionTimeout,
    StopGrace,
    Kill,
    /// The earliest open request's approval timeout.
    ApprovalExpiry,
}

impl Timer {
    pub fn reason(self) -> &'static str {
        match self {
            Timer::Startup => "provider start-up timeout",
            Timer::SessionTimeout => "session timeout",
            Timer::StopGrace => "graceful-stop grace period",
            Timer::Kill => "TERM to KILL escalation",
            Timer::ApprovalExpiry => "approval timeout",
        }
    }

    fn input_kind(self) -> InputKind {
        match self {
            Timer::Startup => InputKind::StartupTimeout,
            Timer::SessionTimeout => InputKind::SessionTimeout,
            Timer::StopGrace => InputKind::StopGraceTimeout,
            Timer::Kill => InputKind::KillTimeout,
            Timer::ApprovalExpiry => InputKind::ApprovalExpired,
        }
    }
}

/// Effects of one step, persists kept apart so they can be put first (the drain rule).
#[derive(Debug, Default, Clone)]
pub(crate) struct Out {
    pub persist: Vec<Effect>,
    pub rest: Vec<Effect>,
}

/// The room an [`Out`] keeps between steps (the engine's is used again at every step, so
/// that a step's effects are written into memory that is already there and in cache).
const OUT_KEPT: usize = 64;

impl Out {
    /// The step's effects in drain order: every persist before anything else. The pair of
    /// this assertion is [`check_drain`], which checks the order of what comes out.
    pub fn into_effects(mut self) -> Vec<Effect> {
        let mut effects = Vec::with_capacity(self.persist.len() + self.rest.len());
        self.drain_into(&mut effects);
        effects
    }

    /// [`Out::into_effects`], appended to `effects`; this `Out` is left empty, with its room.
    pub fn drain_into(&mut self, effects: &mut Vec<Effect>) {
        debug_assert!(
            self.rest.iter().all(|e| !matches!(e, Effect::Persist(_))),
            "a persist was queued behind the step's other effects"
        );
        let start = effects.len();
        effects.append(&mut self.persist);
        effects.append(&mut self.rest);
        check_drain(&effects[start..]);
        self.persist.shrink_to(OUT_KEPT);
        self.rest.shrink_to(OUT_KEPT);
    }
}

/// The drain rule and the sequence rule, checked on one step's effects: every persist comes
/// before every other effect; per session, status and activity sequence numbers strictly
/// increase, and every emitted event was persisted first in the same step.
fn check_drain(effects: &[Effect]) {
    let first_other = effects
        .iter()
        .position(|e| !matches!(e, Effect::Persist(_)))
        .unwrap_or(effects.len());
    assert!(
        effects[first_other..]
            .iter()
            .all(|e| !matches!(e, Effect::Persist(_))),
        "the drain rule: persists come first"
    );
    if cfg!(debug_assertions) {
        // (session, is_activity) -> the last sequence number persisted in this step.
        let mut last: BTreeMap<(&crate::model::SessionId, bool), u64> = BTreeMap::new();
        for e in &effects[..first_other] {
            let key_seq = match e {
                Effect::Persist(Record::Status(ev)) => Some(((&ev.session, false), ev.seq)),
                Effect::Persist(Record::Activity(ev)) => Some(((&ev.session, true), ev.seq)),
                _ => None,
            };
            if let Some((key, seq)) = key_seq {
                let before = last.insert(key, seq);
                assert!(
                    before.is_none_or(|b| b < seq),
                    "sequence numbers strictly increase: {key:?} went from {before:?} to {seq}"
                );
            }
        }
        for e in &effects[first_other..] {
            let (key, seq) = match e {
                Effect::EmitStatus(ev) => ((&ev.session, false), ev.seq),
                Effect::EmitActivity(ev) => ((&ev.session, true), ev.seq),
                _ => continue,
            };
            assert!(
                last.get(&key).is_some_and(|&p| p >= seq),
                "event {key:?} #{seq} emitted without being persisted first"
            );
        }
    }
}

/// What one step of a session needs from the engine: the time, the limits, the run-id
/// counter, the coverage trace and the effects being collected.
pub(crate) struct Ctx<'a> {
    pub now: Now,
    pub lim: &'a Limits,
    pub next_run: &'a mut RunId,
    pub trace: &'a mut Option<Vec<Step>>,
    pub out: Out,
}

impl Ctx<'_> {
    /// A fresh run id: run ids only increase, across daemon lifetimes too (the engine starts
    /// past every stored one), so an id never names two processes.
    fn take_run(&mut self) -> RunId {
        let r = *self.next_run;
        assert!(r > 0, "run ids start at 1");
        *self.next_run = r.checked_add(1).expect("run ids never run out");
        r
    }
}

/// One session.
#[derive(Debug, Clone)]
pub struct Session {
    pub record: SessionRecord,
    run: Run,
    turn: Option<u64>,
    stop: Option<StopPlan>,
    /// Create / restart requests answered when the agent is ready (or its start failed).
    start_replies: Vec<RequestId>,
    /// A restart asked for while the old process was still going away.
    restart_pending: bool,
    startup_deadline: Option<Instant>,
    timeout_deadline: Option<Instant>,
    /// Requests waiting for a human, oldest first. Not empty ⇔ the session is `WAITING`.
    pending: Vec<Approval>,
    /// When each open request expires, on the monotonic clock (its record says when on the
    /// wall clock, for people): exactly the ids of `pending`.
    expiry: BTreeMap<ApprovalId, Instant>,
    /// The newest resolved requests (at most [`RESOLVED_KEPT`]), so that a second answer is
    /// told it came too late (OBEY-2041) rather than that the request does not exist.
    resolved: VecDeque<Approval>,
    dirty: bool,
    /// A create whose provider could not be started at all: the request was refused, so the
    /// session must not remain (the engine removes it and its rows once this input is done).
    discarded: bool,
}

/// How many resolved requests a session remembers for late answers.
pub const RESOLVED_KEPT: usize = 32;

impl Session {
    /// A session rebuilt from its stored record (no process, no turn).
    pub fn from_record(record: SessionRecord) -> Self {
        Session {
            record,
            run: Run::Idle,
            turn: None,
            stop: None,
            start_replies: Vec::new(),
            restart_pending: false,
            startup_deadline: None,
            timeout_deadline: None,
            pending: Vec::new(),
            expiry: BTreeMap::new(),
            resolved: VecDeque::new(),
            dirty: false,
            discarded: false,
        }
    }

    /// Daemon start-up: a stored request of this session (pending ones are open again;
    /// resolved ones are remembered for late answers).
    /// Its stored expiry (wall clock) is brought onto this daemon's monotonic clock.
    pub(crate) fn restore_approval(&mut self, a: Approval, now: Now) {
        if a.is_pending() {
            self.expiry
                .insert(a.id.clone(), now.instant_of(a.expires_at));
            self.pending.push(a);
        } else {
            self.remember(a);
        }
    }

    // ── getters ────────────────────────────────────────────────────────────

    /// The session was a create refused after all (its provider could not be started): the
    /// engine forgets it and deletes what was stored of it.
    pub fn is_discarded(&self) -> bool {
        self.discarded
    }

    pub fn status(&self) -> Status {
        self.record.status
    }

    pub fn run(&self) -> Run {
        self.run
    }

    /// The turn in progress, if any.
    pub fn turn(&self) -> Option<u64> {
        self.turn
    }

    /// The requests waiting for a human, oldest first.
    pub fn pending(&self) -> &[Approval] {
        &self.pending
    }

    /// An open or recently resolved request of this session.
    pub fn approval(&self, id: &str) -> Option<&Approval> {
        self.pending
            .iter()
            .chain(self.resolved.iter())
            .find(|a| a.id == id)
    }

    pub fn budget(&self) -> TokenBudget {
        TokenBudget {
            max: self.record.config.max_tokens,
        }
    }

    /// The earliest pending deadline and what it is for.
    pub fn next_deadline(&self) -> Option<(Instant, Timer)> {
        let mut best: Option<(Instant, Timer)> = None;
        let mut consider = |at: Option<Instant>, t: Timer| {
            if let Some(at) = at {
                if best.is_none_or(|(b, _)| at < b) {
                    best = Some((at, t));
                }
            }
        };
        consider(self.startup_deadline, Timer::Startup);
        consider(self.timeout_deadline, Timer::SessionTimeout);
        consider(
            self.stop.as_ref().and_then(|s| s.grace_deadline),
            Timer::StopGrace,
        );
        consider(self.run.life().and_then(|l| l.deadline()), Timer::Kill);
        consider(self.expiry.values().min().copied(), Timer::ApprovalExpiry);
        best
    }

    // ── handle_* : one per input ───────────────────────────────────────────

    /// Looks the pair up in the table; `Err` for a refused request, `Ok(false)` for an
    /// ignored input.
    fn check(&self, kind: InputKind, cx: &mut Ctx) -> Result<bool, Error> {
        let status = self.record.status;
        let r = rule(status, kind);
        if let Some(t) = cx.trace.as_mut() {
            t.push(Step {
                status,
                input: kind,
                rule: r,
            });
        }
        match r {
            Rule::Legal => Ok(true),
            Rule::Ignore => Ok(false),
            Rule::Refuse(code) => Err(refusal(code, status, kind, &self.record)),
        }
    }

    pub(crate) fn handle_created(&mut self, req: RequestId, cx: &mut Ctx) {
        self.dirty = true;
        self.status_event(None, Status::Created, "session created", cx);
        self.start_replies.push(req);
        if self.record.env_state == EnvState::Creating {
            // The agent waits for its environment; making it counts against the start-up
            // timeout like the provider's own start.
            self.startup_deadline = Some(cx.now.after(cx.lim.startup_timeout));
            cx.out.rest.push(Effect::Provision {
                id: self.record.id.clone(),
                config: Box::new(SessionConfig::clone(&self.record.config)),
            });
            return;
        }
        let run = cx.take_run();
        self.spawn(run, "starting provider", cx);
    }

    /// The daemon is shutting down: a restart that waits for the old process to be gone is
    /// refused (OBEY-2051) instead of starting an agent after the shutdown.
    pub(crate) fn cancel_pending_restart(&mut self, cx: &mut Ctx) {
        if !std::mem::take(&mut self.restart_pending) {
            return;
        }
        let e = crate::engine::shutting_down();
        for req in std::mem::take(&mut self.start_replies) {
            reply_err(cx, req, e.clone());
        }
    }

    /// Whether a restart waits for the old process to be gone.
    pub fn restart_pending(&self) -> bool {
        self.restart_pending
    }

    /// Its record is [settled](SessionRecord::is_settled) and nothing else is under way: the
    /// session is its record and its resolved requests (what the store keeps).
    pub fn is_settled(&self) -> bool {
        self.record.is_settled()
            && !self.restart_pending
            && self.pending.is_empty()
            && self.turn.is_none()
            && self.stop.is_none()
            && self.start_replies.is_empty()
            && self.run == Run::Idle
    }

    /// What the driver says about the environment being made: once it is ready the agent
    /// starts in it; if it could not be made, the create is refused and nothing of the
    /// session stays (refused means nothing written).
    pub(crate) fn handle_environment(&mut self, event: EnvEvent, cx: &mut Ctx) {
        let kind = match event {
            EnvEvent::Provisioned => InputKind::EnvReady,
            EnvEvent::ProvisionFailed { .. } => InputKind::EnvFailed,
        };
        if !matches!(self.check(kind, cx), Ok(true)) {
            return;
        }
        let next = self.record.env_state.on(&event);
        // The pair of this assertion: only `handle_created` leaves a CREATED session, and it
        // does so with its environment `Creating` (else it spawns at once).
        assert_eq!(
            self.record.env_state,
            EnvState::Creating,
            "a CREATED session is making its environment (session {})",
            self.record.id
        );
        self.record.env_state = next.expect("Creating moves on every report");
        self.dirty = true;
        self.startup_deadline = None;
        match event {
            EnvEvent::Provisioned => {
                let run = cx.take_run();
                self.spawn(run, "environment ready; starting provider", cx);
            }
            EnvEvent::ProvisionFailed { reason } => {
                let e = Error::new(
                    ErrorCode::SandboxInitFailed,
                    format!(
                        "could not make the session's {} environment: {reason}",
                        self.record.config.env.driver
                    ),
                );
                for req in std::mem::take(&mut self.start_replies) {
                    reply_err(cx, req, e.clone());
                }
                self.discarded = true;
            }
        }
    }

    /// A stop (or the daemon's shutdown) while the environment is still being made: the
    /// create is answered with an error, the session ends STOPPED, and whatever the driver
    /// still reports is ignored.
    fn stop_before_start(&mut self, req: RequestId, cx: &mut Ctx) {
        let e = Error::new(
            ErrorCode::CreationFailed,
            format!(
                "session {} was stopped while its environment was being made",
                self.record.id
            ),
        );
        for r in std::mem::take(&mut self.start_replies) {
            reply_err(cx, r, e.clone());
        }
        self.abandon_environment();
        self.record.ended_at = Some(cx.now.wall);
        self.dirty = true;
        self.set_status(
            Status::Stopped,
            "stopped before its environment was made",
            cx,
        );
        cx.out.rest.push(Effect::Reply {
            req,
            result: Ok(Box::new(self.record.clone())),
        });
    }

    /// The environment's making is given up (a stop, the start-up timeout, a daemon restart).
    fn abandon_environment(&mut self) {
        self.startup_deadline = None;
        if self.record.env_state == EnvState::Creating {
            self.record.env_state = EnvState::Failed;
            self.dirty = true;
        }
    }

    pub(crate) fn handle_send(&mut self, req: RequestId, text: String, cx: &mut Ctx) {
        match self.check(InputKind::Send, cx) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => return reply_err(cx, req, e),
        }
        if self.budget().exhausted(self.record.tokens_total()) {
            let e = self.budget().error("exhausted", self.record.tokens_total());
            return reply_err(cx, req, e);
        }
        self.begin_turn(text, cx);
        cx.out.rest.push(Effect::Reply {
            req,
            result: Ok(Box::new(self.record.clone())),
        });
    }

    /// [`Input::Close`]: closed for good, then stopped as a graceful Stop is.
    pub(crate) fn handle_close(&mut self, req: RequestId, cx: &mut Ctx) {
        if !self.record.closed_by_client {
            self.record.closed_by_client = true;
            self.dirty = true;
        }
        self.handle_stop(req, true, cx);
    }

    pub(crate) fn handle_stop(&mut self, req: RequestId, graceful: bool, cx: &mut Ctx) {
        let kind = if graceful {
            InputKind::StopGraceful
        } else {
            InputKind::StopForced
        };
        match self.check(kind, cx) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => return reply_err(cx, req, e),
        }
        if self.record.status == Status::Created {
            return self.stop_before_start(req, cx);
        }
        // Nobody will answer now. A turn a graceful stop waits for hears "no" and can finish.
        self.cancel_pending("the session is stopping", graceful, cx);
        if let Some(mut plan) = self.stop.take() {
            // Already stopping: join it. A stop wins over a restart in progress, and a forced
            // stop cuts a graceful wait short.
            plan.replies.push(req);
            if plan.then == AfterStop::Restart {
                plan.then = AfterStop::Stopped;
                let e = Error::new(
                    ErrorCode::WrongState,
                    format!("restart of {} superseded by a stop", self.record.id),
                );
                for r in std::mem::take(&mut self.start_replies) {
                    reply_err(cx, r, e.clone());
                }
            }
            let cut_short = !graceful && plan.grace_deadline.is_some();
            if cut_short {
                plan.grace_deadline = None;
            }
            self.stop = Some(plan);
            if cut_short {
                self.interrupt_turn("turn interrupted: session force-stopped", cx);
                self.terminate(cx);
            } else if !graceful && matches!(self.run.life(), Some(Life::Ending { .. })) {
                // A forced stop does not wait for the agent to end its own way.
                self.terminate(cx);
            }
            return self.maybe_finish_stop(cx);
        }
        let waiting_for_turn = graceful && self.turn.is_some();
        self.stop = Some(StopPlan {
            grace_deadline: waiting_for_turn.then(|| cx.now.after(cx.lim.stop_grace)),
            timed_out: false,
            replies: vec![req],
            then: AfterStop::Stopped,
        });
        self.startup_deadline = None;
        self.timeout_deadline = None;
        let msg = if waiting_for_turn {
            "stopping: waiting for the current turn to finish"
        } else if graceful {
            "stopping"
        } else {
            "stopping (forced)"
        };
        self.set_status(Status::Stopping, msg, cx);
        // Anyone still waiting for the session to start learns it will not.
        let e = Error::new(
            ErrorCode::WrongState,
            format!("session {} was stopped before it started", self.record.id),
        );
        for r in std::mem::take(&mut self.start_replies) {
            reply_err(cx, r, e.clone());
        }
        if !waiting_for_turn {
            self.interrupt_turn("turn interrupted: session force-stopped", cx);
            if graceful {
                self.end_gracefully(cx);
            } else {
                self.terminate(cx);
            }
        }
        self.maybe_finish_stop(cx);
    }

    pub(crate) fn handle_restart(
        &mut self,
        req: RequestId,
        provider_config: Option<crate::ProviderConfig>,
        cx: &mut Ctx,
    ) {
        match self.check(InputKind::Restart, cx) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => return reply_err(cx, req, e),
        }
        if let Some(mut pc) = provider_config {
            pc.keep_permissions_of(&self.record.config.provider_config);
            Arc::make_mut(&mut self.record.config).provider_config = pc;
            self.dirty = true;
        }
        self.start_replies.push(req);
        self.cancel_pending("the session is restarting", false, cx);
        if self.record.status.is_terminal() {
            if self.run == Run::Idle {
                self.respawn(cx);
            } else {
                // The old process is still going away; start again once it has.
                self.restart_pending = true;
            }
            return;
        }
        self.stop = Some(StopPlan {
            grace_deadline: None,
            timed_out: false,
            replies: Vec::new(),
            then: AfterStop::Restart,
        });
        self.startup_deadline = None;
        self.timeout_deadline = None;
        self.set_status(Status::Stopping, "restarting", cx);
        self.interrupt_turn("turn interrupted: session restarting", cx);
        self.terminate(cx);
        self.maybe_finish_stop(cx);
    }

    pub(crate) fn handle_provider(
        &mut self,
        run: RunId,
        cursor: Option<u64>,
        event: ProviderEvent,
        cx: &mut Ctx,
    ) {
        if self.run.id() != Some(run) {
            return; // input from a process this session no longer has
        }
        if let Some(c) = cursor {
            if c <= self.record.provider_cursor {
                return; // already applied before a daemon restart
            }
            self.record.provider_cursor = c;
            self.dirty = true;
        }
        match event {
            ProviderEvent::Started { pid } => self.on_started(run, pid, cx),
            ProviderEvent::SpawnFailed { reason } => self.on_spawn_failed(reason, cx),
            ProviderEvent::Ready => self.on_ready(cx),
            ProviderEvent::Activity(activity) => self.on_activity(activity, cx),
            ProviderEvent::Ask(ask) => self.on_ask(ask, cx),
            ProviderEvent::SessionRef(r) => {
                if !self.record.status.is_terminal()
                    && self.record.provider_session.as_deref() != Some(r.as_str())
                {
                    self.record.provider_session = Some(r);
                    self.dirty = true;
                }
            }
            ProviderEvent::Exited {
                code,
                signal,
                stderr_tail,
            } => self.on_exited(code, signal, &stderr_tail, cx),
            ProviderEvent::OutputLost {
                dropped,
                first,
                next,
            } => self.on_output_lost(dropped, first, next, cx),
            ProviderEvent::DeliveryFailed { reason } => self.on_delivery_failed(reason, cx),
            ProviderEvent::Connection { connected, note } => {
                self.on_connection(connected, note, cx)
            }
        }
    }

    /// The connection to the agent's machine dropped or came back: the session is marked
    /// disconnected meanwhile (its status does not change: the agent works on there), and each
    /// change is recorded where the user reads the session (a STATUS activity) and told to
    /// those watching for attention (a notice). A repeated report changes nothing.
    fn on_connection(&mut self, connected: bool, note: String, cx: &mut Ctx) {
        if self.record.status.is_terminal() || self.record.disconnected != connected {
            return;
        }
        self.record.disconnected = !connected;
        self.dirty = true;
        self.record_activity(Activity::new(ActivityKind::Status, note.clone()), cx);
        cx.out.rest.push(Effect::Notice(crate::model::Notice {
            session: self.record.id.clone(),
            status: self.record.status,
            message: note,
            at: cx.now.wall,
        }));
    }

    /// The turn's message never reached the agent: an agent that cannot be written to takes
    /// no message again, so the turn ends now (its stream is not left open until the process
    /// exits) and the session fails with OBEY-2012; its process is stopped.
    fn on_delivery_failed(&mut self, reason: String, cx: &mut Ctx) {
        if !matches!(self.check(InputKind::DeliveryFailed, cx), Ok(true)) {
            return;
        }
        let e = Error::new(
            ErrorCode::DeliveryFailed,
            format!("message delivery failed: {reason}"),
        );
        self.fail(e, cx);
    }

    fn on_started(&mut self, run: RunId, pid: Option<u32>, cx: &mut Ctx) {
        if self.run.life() != Some(Life::Starting) {
            return;
        }
        if !matches!(self.check(InputKind::Started, cx), Ok(true)) {
            return;
        }
        if let Run::Live { life, .. } = &mut self.run {
            life.started(pid);
        }
        self.record.pid = pid;
        self.dirty = true;
        // A restart after a making that was given up: the shell makes the environment as it
        // starts the agent in it (idempotently), so an agent that runs has one.
        self.record.env_state = EnvState::Ready;
        if self.record.status != Status::Starting {
            // Stopping or failed while it was being spawned: it goes at once.
            return self.terminate(cx);
        }
        // A process is not yet an agent that takes messages: it is asked to say when it is
        // (the start-up deadline still runs), and the session stays STARTING until then.
        cx.out.rest.push(Effect::AskReady {
            id: self.record.id.clone(),
            run,
        });
    }

    /// The agent answered the ready request: the session runs, the create (or restart) is
    /// answered and the initial message, if any, is sent.
    fn on_ready(&mut self, cx: &mut Ctx) {
        if !matches!(self.check(InputKind::Ready, cx), Ok(true)) {
            return;
        }
        let Some(Life::Alive { pid }) = self.run.life() else {
            return; // only a started process can be ready
        };
        self.startup_deadline = None;
        self.record.started_at = Some(cx.now.wall);
        self.timeout_deadline = timeout_deadline(cx.now.at, self.record.config.timeout_ms);
        self.dirty = true;
        let msg = match pid {
            Some(p) => format!("provider started (pid {p})"),
            None => "provider started".to_string(),
        };
        self.set_status(Status::Running, &msg, cx);
        self.send_initial_message(cx);
        for req in std::mem::take(&mut self.start_replies) {
            cx.out.rest.push(Effect::Reply {
                req,
                result: Ok(Box::new(self.record.clone())),
            });
        }
    }

    /// The provider could not be started (`e`, OBEY-2004): the first start of a create is
    /// refused and leaves nothing; a restart's start fails the session.
    fn start_failed(&mut self, e: Error, cx: &mut Ctx) {
        debug_assert_eq!(self.record.status, Status::Starting);
        debug_assert_eq!(
            self.run,
            Run::Idle,
            "a start fails once its process is gone"
        );
        if self.record.restart_count == 0 && !self.start_replies.is_empty() {
            // The caller is refused and never learns the id, so nothing of it stays (refused
            // means nothing written).
            debug_assert!(self.turn.is_none() && self.pending.is_empty());
            for req in std::mem::take(&mut self.start_replies) {
                reply_err(cx, req, e.clone());
            }
            self.startup_deadline = None;
            self.discarded = true;
        } else {
            self.fail(e, cx);
        }
    }

    fn on_spawn_failed(&mut self, reason: String, cx: &mut Ctx) {
        if !matches!(self.check(InputKind::SpawnFailed, cx), Ok(true)) {
            return;
        }
        self.set_run(Run::Idle);
        self.record.pid = None;
        self.dirty = true;
        let e = || {
            Error::new(
                ErrorCode::CreationFailed,
                format!("could not start the provider: {reason}"),
            )
        };
        match self.record.status {
            Status::Starting => self.start_failed(e(), cx),
            // Failed before its spawn was answered (start-up timeout): a restart asked for
            // meanwhile was waiting for this process to be gone.
            Status::Failed => {
                if std::mem::take(&mut self.restart_pending) {
                    self.respawn(cx);
                }
            }
            _ => self.maybe_finish_stop(cx),
        }
    }

    fn on_activity(&mut self, activity: Activity, cx: &mut Ctx) {
        let kind = if activity.kind().ends_turn() {
            InputKind::TurnEnd
        } else {
            InputKind::Activity
        };
        if !matches!(self.check(kind, cx), Ok(true)) {
            return;
        }
        if self.budget().exhausted(self.record.tokens_total()) {
            // The budget is spent (so no turn is open): what the provider still says — lines of
            // the interrupted turn, output between turns — is not counted, so that the count
            // passes the budget only by the event that crossed it.
            return;
        }
        self.record_activity(activity, cx);
        if kind == InputKind::TurnEnd {
            if self.record.status.in_turn() && self.budget().exceeded(self.record.tokens_total()) {
                // The turn's own report took it past the budget (agents that report usage
                // once per turn): the same end as a crossing mid-turn, after the turn's answer.
                let e = self.budget().error("exceeded", self.record.tokens_total());
                self.fail(e, cx);
            } else if self.record.status.in_turn() {
                // Whatever the turn still asked is moot now.
                self.cancel_pending("the turn ended before it was answered", false, cx);
                self.set_status(Status::Running, "turn completed", cx);
            } else if let Some(plan) = self.stop.as_mut() {
                if plan.grace_deadline.take().is_some() {
                    // The graceful stop's wait is over: now the process goes, its own way
                    // first.
                    self.end_gracefully(cx);
                }
            }
        } else if self.turn.is_some() && self.budget().exhausted(self.record.tokens_total()) {
            let e = self.budget().error("exceeded", self.record.tokens_total());
            if self.record.status == Status::Stopping {
                // A graceful stop was waiting for this turn: it is cut short, the stop goes on.
                if let Some(plan) = self.stop.as_mut() {
                    plan.grace_deadline = None;
                }
                self.interrupt_turn(&e.to_string(), cx);
                self.terminate(cx);
                self.maybe_finish_stop(cx);
            } else {
                self.fail(e, cx);
            }
        }
    }

    /// No loss is silent: the gap is recorded where the user reads the session (a STATUS
    /// activity, which does not end a turn) and told to those watching for attention.
    fn on_output_lost(&mut self, dropped: u64, first: u64, next: u64, cx: &mut Ctx) {
        if self.record.status.is_terminal() || dropped == 0 {
            return;
        }
        let message = format!(
            "output lost: {dropped} chunk(s) of the agent's output (runner events {first}..{}) \
             were dropped from the runner's buffer while the daemon was away; what the agent \
             said in them is not recorded (raise `paddock daemon --runner-buffer-events` / \
             `--runner-buffer-bytes` to keep more)",
            next.saturating_sub(1).max(first)
        );
        self.record_activity(Activity::new(ActivityKind::Status, message.clone()), cx);
        cx.out.rest.push(Effect::Notice(crate::model::Notice {
            session: self.record.id.clone(),
            status: self.record.status,
            message,
            at: cx.now.wall,
        }));
    }

    fn on_exited(&mut self, code: Option<i32>, signal: Option<i32>, stderr: &str, cx: &mut Ctx) {
        if !matches!(self.check(InputKind::Exited, cx), Ok(true)) {
            return;
        }
        self.set_run(Run::Idle);
        self.record.pid = None;
        self.dirty = true;
        let how = crate::process::describe_exit(code, signal);
        let tail = stderr.trim();
        let detail = if tail.is_empty() {
            how
        } else {
            format!("{how}; stderr: {tail}")
        };
        match self.record.status {
            // A CLI that dies at start (a bad flag, a lost conversation, no sign-in).
            Status::Starting => {
                let e = Error::new(
                    ErrorCode::CreationFailed,
                    format!(
                        "could not start the provider: it exited before it was ready ({detail})"
                    ),
                );
                self.start_failed(e, cx);
            }
            Status::Stopping => {
                let text = format!("provider exited during stop ({detail})");
                self.interrupt_turn(&text, cx);
                if let Some(plan) = self.stop.as_mut() {
                    plan.grace_deadline = None;
                }
                self.maybe_finish_stop(cx);
            }
            Status::Failed | Status::Stopped => {
                if std::mem::take(&mut self.restart_pending) {
                    self.respawn(cx);
                }
            }
            _ => {
                let e = Error::new(
                    ErrorCode::ProviderCrashed,
                    format!("provider process exited unexpectedly ({detail})"),
                );
                self.fail(e, cx);
            }
        }
    }

    /// Fires `timer` (its deadline has passed).
    pub(crate) fn handle_timer(&mut self, timer: Timer, cx: &mut Ctx) {
        // The KILL a due termination sends (taken here: it is due only once).
        let mut kill = None;
        // Clear the deadline first, so an ignored timer never fires again.
        match timer {
            Timer::Startup => self.startup_deadline = None,
            Timer::SessionTimeout => self.timeout_deadline = None,
            Timer::StopGrace => {
                if let Some(p) = self.stop.as_mut() {
                    p.grace_deadline = None;
                }
            }
            Timer::Kill => {
                if let Run::Live { life, .. } = &mut self.run {
                    kill = life.tick(cx.now.at);
                }
            }
            Timer::ApprovalExpiry => {}
        }
        if !matches!(self.check(timer.input_kind(), cx), Ok(true)) {
            if timer == Timer::ApprovalExpiry {
                // Only a WAITING session has open requests; should one ever be left elsewhere,
                // it is closed rather than left to fire forever.
                self.cancel_pending("the request was left open", false, cx);
            }
            return;
        }
        match timer {
            Timer::Startup if self.record.status == Status::Created => {
                self.abandon_environment();
                let e = Error::new(
                    ErrorCode::SandboxInitFailed,
                    format!(
                        "the session's {} environment was not made within {} ms",
                        self.record.config.env.driver,
                        cx.lim.startup_timeout.millis()
                    ),
                );
                self.fail(e, cx);
            }
            Timer::Startup => {
                let ms = cx.lim.startup_timeout.millis();
                let e = Error::new(
                    ErrorCode::CreationFailed,
                    if self.run.is_alive() {
                        format!(
                            "the provider started but did not say it was ready within {ms} ms \
                             (it never answered paddock's ready request); session {} is \
                             kept, failed, with what the agent printed",
                            self.record.id
                        )
                    } else {
                        format!("the provider did not start within {ms} ms")
                    },
                );
                self.fail(e, cx);
            }
            Timer::SessionTimeout => {
                let e = Error::new(
                    ErrorCode::Timeout,
                    format!(
                        "session timeout of {} ms reached",
                        self.record.config.timeout_ms
                    ),
                );
                self.fail(e, cx);
            }
            Timer::StopGrace => {
                if let Some(p) = self.stop.as_mut() {
                    p.timed_out = true;
                }
                let text = format!(
                    "{}: the turn did not finish within {} ms; session force-stopped",
                    ErrorCode::GracefulStopTimedOut,
                    cx.lim.stop_grace.millis()
                );
                self.interrupt_turn(&text, cx);
                self.terminate(cx);
                self.maybe_finish_stop(cx);
            }
            // Asked to end its own way, it has not: TERM now (KILL after its grace); or
            // TERMed, it has not exited: KILL.
            Timer::Kill => self.signal(kill, cx),
            Timer::ApprovalExpiry => self.expire_approvals(cx),
        }
    }

    /// The agent asks something: the session's policy settles it at once, or it becomes a
    /// request for a human and the session waits.
    fn on_ask(&mut self, ask: Ask, cx: &mut Ctx) {
        if !matches!(self.check(InputKind::Ask, cx), Ok(true)) {
            return;
        }
        let Run::Live {
            run,
            life: Life::Alive { .. },
        } = self.run
        else {
            return;
        };
        let settings = self.record.config.provider_config.approvals();
        let mut a = Approval {
            id: ask.approval,
            session: self.record.id.clone(),
            run,
            key: ask.key,
            kind: ask.kind,
            tool: ask.tool,
            input: ask.input,
            summary: ask.summary,
            turn: self.turn,
            created_at: cx.now.wall,
            expires_at: cx.now.wall + Duration::from_millis(settings.timeout_ms),
            state: ApprovalState::Pending,
            answer: String::new(),
            is_error: false,
            allowed: false,
            resolved_by: String::new(),
            resolved_at: None,
        };
        let settled = if self.record.status == Status::Stopping {
            Some((false, "the session is stopping".to_string(), "paddock"))
        } else if self.pending.len() >= crate::approval::MAX_OPEN_REQUESTS {
            Some((
                false,
                format!(
                    "paddock: {} requests are already waiting for a human; ask again once they \
                     are answered",
                    self.pending.len()
                ),
                "paddock",
            ))
        } else {
            match self
                .record
                .config
                .provider_config
                .policy()
                .decide(a.kind, &a.tool)
            {
                PolicyAnswer::Allow => Some((true, String::new(), "policy")),
                PolicyAnswer::Deny(reason) => Some((false, reason, "policy")),
                PolicyAnswer::AskHuman => None,
            }
        };
        if let Some((allowed, reason, by)) = settled {
            // Settled without a human: the agent is answered, nothing is kept.
            a.state = if allowed {
                ApprovalState::Approved
            } else {
                ApprovalState::Denied
            };
            a.allowed = allowed;
            a.answer = reason;
            a.resolved_by = by.to_string();
            a.resolved_at = Some(cx.now.wall);
            self.assert_current(run);
            cx.out.rest.push(Effect::Answer {
                id: self.record.id.clone(),
                run,
                approval: Box::new(a),
                at_once: true,
            });
            return;
        }
        let what = match a.kind {
            AskKind::Permission => "approval",
            AskKind::Question => "an answer",
            AskKind::ClientTool => "the client's tool result",
        };
        let note = format!("waiting for {what} ({}): {}", a.id, a.summary);
        let mut activity = Activity::new(ActivityKind::Status, note).with_tool(&a.tool, &a.id);
        activity.tool_success = true;
        self.record_activity(activity, cx);
        cx.out
            .persist
            .push(Effect::Persist(Record::Approval(Box::new(a.clone()))));
        cx.out.rest.push(Effect::EmitApproval(Box::new(a.clone())));
        self.expiry.insert(
            a.id.clone(),
            cx.now.after(Duration::from_millis(settings.timeout_ms)),
        );
        self.pending.push(a);
        self.settle_status("", cx);
    }

    /// A client answers request `approval` (which this session has, open or resolved).
    pub(crate) fn handle_resolve(
        &mut self,
        req: RequestId,
        approval: &ApprovalId,
        decision: Decision,
        by: &str,
        cx: &mut Ctx,
    ) {
        let reply = |cx: &mut Ctx, result| cx.out.rest.push(Effect::ReplyApproval { req, result });
        if let Some(done) = self.resolved.iter().find(|a| &a.id == approval) {
            return reply(cx, Err(already_resolved(done)));
        }
        match self.check(InputKind::Resolve, cx) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => return reply(cx, Err(e)),
        }
        let Some(pos) = self.pending.iter().position(|a| &a.id == approval) else {
            let e = Error::new(
                ErrorCode::ApprovalNotFound,
                format!(
                    "approval {approval} is not open in session {}",
                    self.record.id
                ),
            );
            return reply(cx, Err(e));
        };
        let kind = self.pending[pos].kind;
        let text_len = match &decision {
            Decision::Approve => 0,
            Decision::Deny { reason } => reason.len(),
            Decision::Answer { text, .. } => text.len(),
        };
        if text_len > crate::approval::ANSWER_MAX {
            let e = Error::new(
                ErrorCode::WrongState,
                format!(
                    "the answer to {approval} is {text_len} bytes; at most {} are passed on",
                    crate::approval::ANSWER_MAX
                ),
            );
            return reply(cx, Err(e));
        }
        let (state, allowed, answer, is_error) = match (kind, decision) {
            (AskKind::Permission, Decision::Answer { .. }) => {
                let e = Error::new(
                    ErrorCode::WrongState,
                    format!(
                        "approval {approval} asks permission for {}: approve or deny it",
                        self.pending[pos].tool
                    ),
                );
                return reply(cx, Err(e));
            }
            (AskKind::ClientTool, Decision::Approve) => {
                let e = Error::new(
                    ErrorCode::WrongState,
                    format!("approval {approval} is a client-side tool call: answer it with the tool's result"),
                );
                return reply(cx, Err(e));
            }
            (_, Decision::Approve) => (ApprovalState::Approved, true, String::new(), false),
            (_, Decision::Deny { reason }) => (ApprovalState::Denied, false, reason, true),
            (_, Decision::Answer { text, is_error }) => {
                (ApprovalState::Answered, true, text, is_error)
            }
        };
        let mut a = self.pending.remove(pos);
        self.expiry.remove(&a.id);
        a.state = state;
        a.allowed = allowed;
        a.answer = answer;
        a.is_error = is_error;
        a.resolved_by = by.to_string();
        a.resolved_at = Some(cx.now.wall);
        self.finish_approval(a.clone(), true, cx);
        self.settle_status("", cx);
        reply(cx, Ok(Box::new(a)))
    }

    /// Every open request whose time is up gets the session's default answer.
    fn expire_approvals(&mut self, cx: &mut Ctx) {
        let settings = self.record.config.provider_config.approvals();
        let expiry = &self.expiry;
        let (due, open): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|a| expiry.get(&a.id).is_some_and(|at| *at <= cx.now.at));
        self.pending = open;
        for a in &due {
            self.expiry.remove(&a.id);
        }
        for mut a in due {
            // The default decides a permission; nobody can make up a question's answer or a
            // client tool's result, so those are told no answer came.
            let allow = settings.default_allow && a.kind == AskKind::Permission;
            a.state = ApprovalState::Expired;
            a.allowed = allow;
            a.is_error = !allow;
            a.answer = match a.kind {
                AskKind::Permission => format!(
                    "nobody answered within {} s; the session's default applies: {}",
                    settings.timeout_ms / 1000,
                    if allow { "allow" } else { "deny" }
                ),
                AskKind::Question | AskKind::ClientTool => {
                    format!("nobody answered within {} s", settings.timeout_ms / 1000)
                }
            };
            a.resolved_by = "expiry".to_string();
            self.finish_approval(a, true, cx);
        }
        self.settle_status("", cx);
    }

    /// Closes every open request (the turn, the process or the session is ending); the agent
    /// is told no if `tell_agent` (it may still be listening).
    fn cancel_pending(&mut self, reason: &str, tell_agent: bool, cx: &mut Ctx) {
        self.expiry.clear();
        for mut a in std::mem::take(&mut self.pending) {
            a.state = ApprovalState::Cancelled;
            a.allowed = false;
            a.is_error = true;
            a.answer = reason.to_string();
            a.resolved_by = "paddock".to_string();
            self.finish_approval(a, tell_agent, cx);
        }
    }

    /// Stores a resolved request, tells the agent (if `tell_agent` and the process that asked
    /// is still the session's), and tells watchers.
    fn finish_approval(&mut self, mut a: Approval, tell_agent: bool, cx: &mut Ctx) {
        a.resolved_at = Some(cx.now.wall);
        if tell_agent && a.state != ApprovalState::Cancelled {
            let note = format!(
                "{} {} ({}){}",
                a.id,
                a.state.name(),
                a.resolved_by,
                a.answer_suffix()
            );
            let mut activity = Activity::new(ActivityKind::Status, note).with_tool(&a.tool, &a.id);
            activity.tool_success = a.allowed;
            self.record_activity(activity, cx);
        }
        cx.out
            .persist
            .push(Effect::Persist(Record::Approval(Box::new(a.clone()))));
        if tell_agent {
            if let Run::Live {
                run,
                life: Life::Alive { .. },
            } = self.run
            {
                if run == a.run {
                    self.assert_current(run);
                    cx.out.rest.push(Effect::Answer {
                        id: self.record.id.clone(),
                        run,
                        approval: Box::new(a.clone()),
                        at_once: false,
                    });
                }
            }
        }
        cx.out.rest.push(Effect::EmitApproval(Box::new(a.clone())));
        self.remember(a);
    }

    fn remember(&mut self, a: Approval) {
        if self.resolved.len() >= RESOLVED_KEPT {
            self.resolved.pop_front();
        }
        self.resolved.push_back(a);
    }

    /// A live, idle-or-working session's status follows its open requests and its turn:
    /// `WAITING` while anything is open, else `WORKING` during a turn, else `RUNNING`.
    fn settle_status(&mut self, why: &str, cx: &mut Ctx) {
        if !matches!(
            self.record.status,
            Status::Running | Status::Working | Status::Waiting
        ) {
            return;
        }
        let (new, msg) = match (self.pending.first(), self.turn) {
            (Some(a), _) => {
                let what = match a.kind {
                    AskKind::Permission => "approval",
                    AskKind::Question => "an answer",
                    AskKind::ClientTool => "the client",
                };
                (
                    Status::Waiting,
                    format!("waiting for {what} ({}): {}", a.id, a.summary),
                )
            }
            (None, Some(_)) => (Status::Working, "working on a message".to_string()),
            (None, None) => (Status::Running, "idle".to_string()),
        };
        let msg = if why.is_empty() {
            msg
        } else {
            format!("{why}; {msg}")
        };
        self.set_status(new, &msg, cx);
        assert_eq!(
            self.record.status == Status::Waiting,
            !self.pending.is_empty(),
            "settled: WAITING if and only if a request is open"
        );
    }

    /// DeleteSession: may this session be forgotten now?
    pub(crate) fn check_delete(&self, cx: &mut Ctx) -> Result<(), Error> {
        match self.check(InputKind::Delete, cx) {
            Ok(true) if self.run == Run::Idle => Ok(()),
            Ok(_) => Err(Error::new(
                ErrorCode::WrongState,
                format!(
                    "session {} is {} but its process is still going away; try again shortly",
                    self.record.id, self.record.status
                ),
            )),
            Err(e) => Err(e),
        }
    }

    /// Daemon start-up: a session the store shows as active lost its provider with the old
    /// daemon. It ends FAILED with OBEY-2032.
    pub(crate) fn reconcile(&mut self, cx: &mut Ctx) {
        if self.record.status.is_terminal() {
            self.cancel_pending("the session had ended", false, cx);
            // A session that failed while its process was still being killed: that process
            // died with the old daemon, so its pid names nothing of ours any more.
            if self.record.pid.take().is_some() {
                self.dirty = true;
            }
            self.set_run(Run::Idle);
            return;
        }
        let was = self.record.status;
        self.abandon_environment();
        let e = Error::new(
            ErrorCode::ConnectionLost,
            format!("the daemon restarted while the session was {was}; its provider was lost"),
        );
        self.cancel_pending(&e.to_string(), false, cx);
        self.record.pid = None;
        // A turn the old daemon left open ends here, so every stored turn ends exactly once.
        self.turn = self.record.turn_open.then_some(self.record.turns);
        self.interrupt_turn(&e.to_string(), cx);
        self.set_run(Run::Idle);
        self.record.error = Some(e.clone());
        self.record.ended_at = Some(cx.now.wall);
        self.dirty = true;
        self.set_status(Status::Failed, &e.to_string(), cx);
    }

    /// Appends the record's persist if anything durable changed in this step.
    pub(crate) fn flush(&mut self, cx: &mut Ctx) {
        self.assert_invariants(cx);
        if std::mem::take(&mut self.dirty) {
            cx.out
                .persist
                .push(Effect::Persist(Record::Session(Box::new(
                    self.record.clone(),
                ))));
        }
    }

    /// What holds after every step of this session (each is established where the state
    /// changes; this is the other half of the pair).
    fn assert_invariants(&self, cx: &Ctx) {
        let status = self.record.status;
        assert_eq!(
            status == Status::Waiting,
            !self.pending.is_empty(),
            "WAITING if and only if a request is open (session {}, {status})",
            self.record.id
        );
        assert!(
            self.pending.len() == self.expiry.len()
                && self.pending.iter().all(|a| self.expiry.contains_key(&a.id)),
            "every open request, and only those, has its expiry (session {})",
            self.record.id
        );
        assert_eq!(
            self.record.run,
            self.run.id(),
            "the record names the session's current run"
        );
        assert_eq!(
            self.turn.is_some(),
            self.record.turn_open,
            "the record's open turn is the session's (session {}, {status})",
            self.record.id
        );
        if status.is_terminal() {
            assert!(
                self.turn.is_none() && self.stop.is_none(),
                "an ended session has no turn and no stop in progress"
            );
        }
        if let Some(run) = self.run.id() {
            assert!(
                run < *cx.next_run,
                "a run id is handed out before it is used"
            );
        }
        debug_assert!(
            self.pending.len() <= crate::approval::MAX_OPEN_REQUESTS
                && self.resolved.len() <= RESOLVED_KEPT,
            "the request lists are bounded"
        );
    }

    /// The run an effect is addressed to must be the session's current one: a signal, a
    /// message or an answer to any other process would reach a stranger (or nobody).
    fn assert_current(&self, run: RunId) {
        assert_eq!(
            self.run.id(),
            Some(run),
            "effect for run {run} of session {}, whose run is {:?}",
            self.record.id,
            self.run
        );
    }

    // ── the steps the handlers are made of ─────────────────────────────────

    /// Changes the process, keeping the durable record's run id (and its output cursor) in
    /// step with it.
    fn set_run(&mut self, run: Run) {
        let id = run.id();
        if self.record.run != id {
            self.record.run = id;
            self.record.provider_cursor = 0;
            // A connection is its run's: another run (or none) starts connected.
            self.record.disconnected = false;
            self.dirty = true;
        }
        self.run = run;
    }

    /// Daemon start-up: the session's provider process outlived the previous daemon (the
    /// runner kept it): take it back. A turn in progress goes on; a session that was starting
    /// is now running; a stop in progress, or a session that had already ended, gets its
    /// process terminated.
    pub(crate) fn adopt(&mut self, run: RunId, pid: Option<u32>, cx: &mut Ctx) {
        self.set_run(Run::Live {
            run,
            life: Life::Alive { pid },
        });
        self.record.pid = pid;
        self.dirty = true;
        // Its agent runs, so in its environment (as `on_started` says).
        self.record.env_state = EnvState::Ready;
        match self.record.status {
            Status::Created | Status::Starting => {
                self.record.started_at = Some(cx.now.wall);
                self.timeout_deadline = timeout_deadline(cx.now.at, self.record.config.timeout_ms);
                self.set_status(
                    Status::Running,
                    "provider adopted after a daemon restart",
                    cx,
                );
                // The old daemon never saw it start, so never sent the initial message.
                self.send_initial_message(cx);
            }
            Status::Running | Status::Working | Status::Waiting => {
                // Counted from the start the record has, brought onto this daemon's clock.
                let since = self
                    .record
                    .started_at
                    .map_or(cx.now.at, |t| cx.now.instant_of(t));
                self.timeout_deadline = timeout_deadline(since, self.record.config.timeout_ms);
                self.turn = self.record.turn_open.then_some(self.record.turns);
                // Open requests are still open: the agent still waits for their answers (and
                // their expiry deadlines still hold). The status follows them.
                self.settle_status("provider adopted after a daemon restart", cx);
                // Answers go out only after their resolution was stored, so the old daemon may
                // have died in between: its requests' answers are sent again (an agent ignores
                // an answer to a request it no longer waits for). At least once, never lost.
                for a in &self.resolved {
                    if a.run == run && a.state != ApprovalState::Cancelled {
                        self.assert_current(run);
                        cx.out.rest.push(Effect::Answer {
                            id: self.record.id.clone(),
                            run,
                            approval: Box::new(a.clone()),
                            at_once: false,
                        });
                    }
                }
            }
            Status::Stopping => {
                self.cancel_pending(
                    "the session was stopping when the daemon restarted",
                    false,
                    cx,
                );
                // The stop's requester went with the old daemon; finish the stop now.
                self.turn = self.record.turn_open.then_some(self.record.turns);
                self.interrupt_turn(
                    "turn interrupted: the session was stopping when the daemon restarted",
                    cx,
                );
                self.stop = Some(StopPlan {
                    grace_deadline: None,
                    timed_out: false,
                    replies: Vec::new(),
                    then: AfterStop::Stopped,
                });
                self.terminate(cx);
            }
            Status::Stopped | Status::Failed => {
                self.cancel_pending("the session had ended", false, cx);
                self.terminate(cx);
            }
        }
    }

    fn spawn(&mut self, run: RunId, msg: &str, cx: &mut Ctx) {
        self.set_run(Run::Live {
            run,
            life: Life::Starting,
        });
        self.startup_deadline = Some(cx.now.after(cx.lim.startup_timeout));
        self.set_status(Status::Starting, msg, cx);
        cx.out.rest.push(Effect::Spawn {
            id: self.record.id.clone(),
            run,
            spec: Box::new(SpawnSpec {
                config: SessionConfig::clone(&self.record.config),
                resume: self.record.provider_session.clone(),
                restart_count: self.record.restart_count,
            }),
        });
    }

    fn respawn(&mut self, cx: &mut Ctx) {
        self.record.restart_count = self.record.restart_count.saturating_add(1);
        self.record.error = None;
        self.record.ended_at = None;
        self.stop = None;
        self.dirty = true;
        let msg = format!("restarting (restart #{})", self.record.restart_count);
        let run = cx.take_run();
        self.spawn(run, &msg, cx);
    }

    /// On the provider's first start, the session's initial message (if any) is its first turn.
    fn send_initial_message(&mut self, cx: &mut Ctx) {
        // No turn ever began, so the task never reached an agent (a first start, or a restart
        // after a start that never happened: an environment given up, a spawn that failed).
        let never_sent = self.record.turns == 0;
        let initial = self.record.config.initial_message.clone();
        if never_sent && !initial.is_empty() {
            self.begin_turn(initial, cx);
        }
    }

    fn begin_turn(&mut self, text: String, cx: &mut Ctx) {
        self.record.turns += 1;
        let turn = self.record.turns;
        self.turn = Some(turn);
        self.record.turn_open = true;
        self.record.last_activity_at = Some(cx.now.wall);
        self.dirty = true;
        cx.out
            .persist
            .push(Effect::Persist(Record::UserMessage(UserMessage {
                session: self.record.id.clone(),
                turn,
                text: text.clone(),
                at: cx.now.wall,
            })));
        self.set_status(Status::Working, "working on a message", cx);
        if let Some(run) = self.run.id() {
            self.assert_current(run);
            let config = &self.record.config;
            // An agent with no channel for the system prompt gets it with the first message.
            let text = match config.provider_config.system_prompt() {
                Some(prompt) if turn == 1 && !config.provider.takes_system_prompt() => {
                    crate::provider_config::with_system_prompt(prompt, &text)
                }
                _ => text,
            };
            cx.out.rest.push(Effect::Write {
                id: self.record.id.clone(),
                run,
                text,
            });
        }
    }

    /// An activity an agent reported itself (StreamAgentActivity): recorded with the turn it
    /// came during, if any, but it changes nothing of the session — it ends no turn, and its
    /// tokens are shown on it, not counted (the budget is the supervised agent's own usage, so
    /// a report can never fail a session or swallow its agent's turn end).
    pub(crate) fn handle_report(&mut self, activity: Activity, cx: &mut Ctx) {
        self.record_activity_as(activity, false, cx);
    }

    fn record_activity(&mut self, activity: Activity, cx: &mut Ctx) {
        self.record_activity_as(activity, true, cx);
    }

    /// Numbers, stores and emits one activity. `own`: the session's agent said it (its tokens
    /// count, a COMPLETION or ERROR ends the open turn); else a report (neither).
    fn record_activity_as(&mut self, activity: Activity, own: bool, cx: &mut Ctx) {
        let rec = &mut self.record;
        rec.last_activity_seq = rec
            .last_activity_seq
            .checked_add(1)
            .expect("activity sequence numbers never run out");
        if own {
            rec.tokens_input = rec.tokens_input.saturating_add(activity.tokens_input);
            rec.tokens_output = rec.tokens_output.saturating_add(activity.tokens_output);
        }
        rec.last_activity_at = Some(cx.now.wall);
        self.dirty = true;
        let ends_turn = own && self.turn.is_some() && activity.kind().ends_turn();
        let ev = ActivityEvent {
            session: rec.id.clone(),
            seq: rec.last_activity_seq,
            turn: self.turn,
            ends_turn,
            activity,
            at: cx.now.wall,
        };
        if ends_turn {
            self.turn = None;
            self.record.turn_open = false;
            self.record.last_turn_failed = ev.activity.kind() == ActivityKind::Error;
        }
        let ev = Arc::new(ev);
        cx.out
            .persist
            .push(Effect::Persist(Record::Activity(ev.clone())));
        cx.out.rest.push(Effect::EmitActivity(ev));
    }

    /// Ends the current turn (if any) with an ERROR activity saying why.
    fn interrupt_turn(&mut self, text: &str, cx: &mut Ctx) {
        if self.turn.is_some() {
            self.record_activity(Activity::new(ActivityKind::Error, text), cx);
        }
    }

    /// TERM the process group now, KILL after the grace period (a process being spawned is
    /// terminated once it has started; one already terminating is not signalled again).
    fn terminate(&mut self, cx: &mut Ctx) {
        let signal = match &mut self.run {
            Run::Live { life, .. } if life.has_process() => {
                life.terminate(cx.now.at, cx.lim.kill_grace)
            }
            _ => None,
        };
        self.signal(signal, cx);
    }

    /// Sends `signal`, if any, to the session's process group.
    fn signal(&mut self, signal: Option<crate::process::Signal>, cx: &mut Ctx) {
        if let (Some(signal), Run::Live { run, life }) = (signal, self.run) {
            self.assert_current(run);
            cx.out.rest.push(Effect::Signal {
                id: self.record.id.clone(),
                run,
                pid: life.pid(),
                signal,
            });
        }
    }

    /// A graceful stop's end of the process: first the agent is asked to end its own way (its
    /// input closed), and TERM follows only if it has not after [`Limits::end_grace`]
    /// (`crate::Limits`); then KILL, as for every process.
    fn end_gracefully(&mut self, cx: &mut Ctx) {
        match &mut self.run {
            Run::Live {
                run,
                life: life @ Life::Alive { .. },
            } if cx.lim.end_grace.millis() > 0 => {
                let run = *run;
                life.end(cx.now.at, cx.lim.end_grace, cx.lim.kill_grace);
                self.assert_current(run);
                cx.out.rest.push(Effect::CloseInput {
                    id: self.record.id.clone(),
                    run,
                });
            }
            _ => self.terminate(cx),
        }
    }

    /// The session ends FAILED with `error`: its turn's stream ends with the error, its
    /// process is terminated, anyone waiting for it to start is told.
    fn fail(&mut self, error: Error, cx: &mut Ctx) {
        self.cancel_pending(&error.to_string(), false, cx);
        self.interrupt_turn(&error.to_string(), cx);
        self.terminate(cx);
        self.startup_deadline = None;
        self.timeout_deadline = None;
        self.stop = None;
        self.record.error = Some(error.clone());
        self.record.ended_at = Some(cx.now.wall);
        self.dirty = true;
        self.set_status(Status::Failed, &error.to_string(), cx);
        for req in std::mem::take(&mut self.start_replies) {
            reply_err(cx, req, error.clone());
        }
    }

    /// Once the process is gone and no turn is open, a stop completes: STOPPED (or, for a
    /// restart, STARTING again). Everything the process said was recorded before its exit was
    /// reported, so the final token counts are in the record persisted with this status.
    fn maybe_finish_stop(&mut self, cx: &mut Ctx) {
        if self.record.status != Status::Stopping || self.run != Run::Idle || self.turn.is_some() {
            return;
        }
        let Some(plan) = self.stop.take() else {
            return;
        };
        if plan.then == AfterStop::Restart {
            return self.respawn(cx);
        }
        self.record.ended_at = Some(cx.now.wall);
        self.dirty = true;
        let msg = if plan.timed_out {
            "stopped (graceful stop timed out; force-stopped)"
        } else {
            "stopped"
        };
        self.set_status(Status::Stopped, msg, cx);
        for req in plan.replies {
            let result = if plan.timed_out {
                Err(Error::new(
                    ErrorCode::GracefulStopTimedOut,
                    format!(
                        "the current turn did not finish within {} ms; session {} was force-stopped",
                        cx.lim.stop_grace.millis(), self.record.id
                    ),
                ))
            } else {
                Ok(self.record.clone())
            };
            cx.out.rest.push(Effect::Reply {
                req,
                result: result.map(Box::new),
            });
        }
    }

    fn set_status(&mut self, new: Status, message: &str, cx: &mut Ctx) {
        let previous = self.record.status;
        if previous == new {
            return;
        }
        self.record.status = new;
        self.dirty = true;
        self.status_event(Some(previous), new, message, cx);
    }

    fn status_event(&mut self, previous: Option<Status>, new: Status, msg: &str, cx: &mut Ctx) {
        self.record.last_status_seq = self
            .record
            .last_status_seq
            .checked_add(1)
            .expect("status sequence numbers never run out");
        let ev = StatusEvent {
            session: self.record.id.clone(),
            seq: self.record.last_status_seq,
            previous,
            new,
            message: msg.to_string(),
            at: cx.now.wall,
        };
        cx.out
            .persist
            .push(Effect::Persist(Record::Status(ev.clone())));
        cx.out.rest.push(Effect::EmitStatus(ev));
    }
}

/// One table lookup, recorded when tracing is on (the simulator's coverage).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub status: Status,
    pub input: InputKind,
    pub rule: Rule,
}

/// OBEY-2041 for a second answer to `done`, saying how it ended.
pub(crate) fn already_resolved(done: &Approval) -> Error {
    Error::new(
        ErrorCode::ApprovalResolved,
        format!(
            "approval {} was already {} (by {}){}",
            done.id,
            done.state.name(),
            done.resolved_by,
            done.answer_suffix()
        ),
    )
}

fn reply_err(cx: &mut Ctx, req: RequestId, e: Error) {
    cx.out.rest.push(Effect::Reply {
        req,
        result: Err(e),
    });
}

fn refusal(code: ErrorCode, status: Status, kind: InputKind, rec: &SessionRecord) -> Error {
    let what = match kind {
        InputKind::Send if status == Status::Waiting => {
            "it waits for a human: answer its open request first (`paddock approvals`)"
        }
        InputKind::Send => "SendMessage needs a RUNNING session",
        InputKind::Delete => "only a STOPPED or FAILED session can be deleted; stop it first",
        InputKind::Resolve => "it is not waiting for anyone",
        InputKind::Restart => "RestartSession is not possible while the session is stopping",
        InputKind::StopGraceful | InputKind::StopForced => "nothing to stop",
        _ => "not possible now",
    };
    let mut msg = format!("session {} is {status}: {what}", rec.id);
    if let (true, Some(e)) = (status.is_terminal(), rec.error.as_ref()) {
        msg.push_str(&format!(" (it failed with {e})"));
    }
    Error::new(code, msg)
}

/// Each checker fires on the drift it guards against: the other half of a pair is no check
/// that can never fail.
#[cfg(test)]
mod checks {
    use super::*;
    use crate::model::{Provider, SessionConfig, SessionId};
    use crate::time::Timestamp;

    fn id() -> SessionId {
        SessionId("sess_1".into())
    }

    fn session(status: Status) -> Session {
        let now = Now::new(Instant::from_millis(0), Timestamp::from_millis(0));
        let config = SessionConfig::new("camp_1", Provider::Scripted, "/tmp");
        let mut s = Session::from_record(crate::engine::new_record(id(), config, now));
        s.record.status = status;
        s
    }

    fn status(seq: u64) -> StatusEvent {
        StatusEvent {
            session: id(),
            seq,
            previous: None,
            new: Status::Created,
            message: String::new(),
            at: Timestamp::from_millis(0),
        }
    }

    fn activity(seq: u64) -> ActivityEvent {
        ActivityEvent {
            session: id(),
            seq,
            turn: None,
            ends_turn: false,
            activity: Activity::new(ActivityKind::Thinking, "hm"),
            at: Timestamp::from_millis(0),
        }
    }

    #[test]
    fn the_drain_rule_holds_for_a_step_that_keeps_it() {
        check_drain(&[
            Effect::Persist(Record::Status(status(1))),
            Effect::Persist(Record::Activity(Arc::new(activity(1)))),
            Effect::Persist(Record::Activity(Arc::new(activity(2)))),
            Effect::EmitStatus(status(1)),
            Effect::EmitActivity(Arc::new(activity(2))),
        ]);
    }

    #[test]
    #[should_panic(expected = "persists come first")]
    fn a_persist_after_an_emit_breaks_the_drain_rule() {
        check_drain(&[
            Effect::EmitStatus(status(1)),
            Effect::Persist(Record::Status(status(1))),
        ]);
    }

    #[test]
    #[should_panic(expected = "strictly increase")]
    fn sequence_numbers_going_back_break_the_sequence_rule() {
        check_drain(&[
            Effect::Persist(Record::Activity(Arc::new(activity(2)))),
            Effect::Persist(Record::Activity(Arc::new(activity(2)))),
        ]);
    }

    #[test]
    #[should_panic(expected = "without being persisted first")]
    fn a_status_emitted_unpersisted_is_caught() {
        check_drain(&[
            Effect::Persist(Record::Activity(Arc::new(activity(1)))),
            Effect::EmitStatus(status(1)),
        ]);
    }

    #[test]
    #[should_panic(expected = "without being persisted first")]
    fn an_activity_emitted_unpersisted_is_caught() {
        check_drain(&[
            Effect::Persist(Record::Status(status(1))),
            Effect::EmitActivity(Arc::new(activity(1))),
        ]);
    }

    fn with_cx(f: impl FnOnce(&mut Ctx)) {
        let lim = Limits::default();
        let mut next_run = 1;
        let mut trace = None;
        let mut cx = Ctx {
            now: Now::new(Instant::from_millis(0), Timestamp::from_millis(0)),
            lim: &lim,
            next_run: &mut next_run,
            trace: &mut trace,
            out: Out::default(),
        };
        f(&mut cx)
    }

    fn open_request() -> Approval {
        Approval {
            id: "ap_1".into(),
            session: id(),
            run: 1,
            key: "k".into(),
            kind: AskKind::Permission,
            tool: "Bash".into(),
            input: "{}".into(),
            summary: "Bash".into(),
            turn: None,
            created_at: Timestamp::from_millis(0),
            expires_at: Timestamp::from_millis(1),
            state: ApprovalState::Pending,
            answer: String::new(),
            is_error: false,
            allowed: false,
            resolved_by: String::new(),
            resolved_at: None,
        }
    }

    /// The earliest deadline is the one reported; a tie goes to the first of start-up,
    /// session timeout, stop grace, KILL and request expiry (the start-up's reason, say, not
    /// the timeout's, when both run out at once).
    #[test]
    fn the_earliest_deadline_wins_and_a_tie_goes_to_the_first_kind() {
        let at = Instant::from_millis;
        let mut s = session(Status::Starting);
        s.timeout_deadline = Some(at(5));
        s.startup_deadline = Some(at(9));
        assert_eq!(s.next_deadline(), Some((at(5), Timer::SessionTimeout)));
        s.startup_deadline = Some(at(5));
        assert_eq!(s.next_deadline(), Some((at(5), Timer::Startup)));
        s.startup_deadline = None;
        s.expiry.insert("ap_1".into(), at(5));
        assert_eq!(s.next_deadline(), Some((at(5), Timer::SessionTimeout)));
        s.timeout_deadline = None;
        assert_eq!(s.next_deadline(), Some((at(5), Timer::ApprovalExpiry)));
    }

    /// Settled: its record is (ended, no process, no run) and nothing else is under way. Each
    /// thing under way alone keeps an ended session from being let go.
    #[test]
    fn an_ended_session_is_settled_only_with_nothing_under_way() {
        assert!(session(Status::Stopped).is_settled());
        assert!(!session(Status::Running).is_settled());
        let under_way: [fn(&mut Session); 6] = [
            |s| s.restart_pending = true,
            |s| s.turn = Some(1),
            |s| {
                s.stop = Some(StopPlan {
                    grace_deadline: None,
                    timed_out: false,
                    replies: Vec::new(),
                    then: AfterStop::Stopped,
                })
            },
            |s| s.start_replies.push(7),
            |s| {
                s.run = Run::Live {
                    run: 1,
                    life: Life::Starting,
                }
            },
            |s| s.pending.push(open_request()),
        ];
        for (n, put) in under_way.iter().enumerate() {
            let mut s = session(Status::Stopped);
            put(&mut s);
            assert!(!s.is_settled(), "case {n}");
        }
    }

    #[test]
    fn a_session_as_created_keeps_its_invariants() {
        with_cx(|cx| session(Status::Created).assert_invariants(cx));
    }

    #[test]
    #[should_panic(expected = "WAITING if and only if a request is open")]
    fn waiting_without_an_open_request_is_caught() {
        with_cx(|cx| session(Status::Waiting).assert_invariants(cx));
    }

    #[test]
    #[should_panic(expected = "effect for run 3")]
    fn an_effect_for_a_run_that_is_not_the_sessions_is_caught() {
        session(Status::Running).assert_current(3);
    }
}
