//! The reference model: what a client has seen (every status change, every activity, every
//! reply, delivered only after its transaction committed) and what it may therefore expect.
//! Its invariants are checked on every effect batch and after every step; a broken one is a
//! `String` saying what went wrong, which the driver turns into a failure line.
//!
//! The model is deliberately not a second implementation of the machine: it knows which
//! (previous, new) status pairs a cause may produce, which replies a request may get given the
//! state it was made in, and how turns and tokens add up — not how the engine gets there.

use std::collections::{BTreeMap, BTreeSet};

use paddock_core::{
    Activity, ActivityEvent, ActivityKind, Effect, Engine, Error, ErrorCode, Input, Limits, Millis,
    Record, RequestId, Run, RunId, SessionConfig, SessionId, SessionRecord, Signal, SpawnSpec,
    Status, StatusEvent, Timer,
};

use crate::world::Store;

/// The kind of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqKind {
    Create,
    Send,
    StopGraceful,
    StopForced,
    Restart,
}

/// The kind of a provider event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Started,
    SpawnFailed,
    Activity,
    TurnEnd,
    SessionRef,
    Exited,
}

/// What caused an effect batch.
#[derive(Debug, Clone)]
pub enum Cause {
    Request {
        req: RequestId,
        id: SessionId,
        kind: ReqKind,
    },
    Provider {
        id: SessionId,
        run: RunId,
        /// The event's position in the run's output (output events only).
        cursor: Option<u64>,
        event: EventKind,
        activity: Option<Activity>,
        /// The conversation id a `SessionRef` reports.
        session_ref: Option<String>,
    },
    Tick,
    /// A restarted daemon reconciling what the store says.
    Restore,
}

impl Cause {
    fn req(&self, k: ReqKind) -> bool {
        matches!(self, Cause::Request { kind, .. } if *kind == k)
    }

    fn stop(&self) -> bool {
        self.req(ReqKind::StopGraceful) || self.req(ReqKind::StopForced)
    }

    fn ev(&self, k: EventKind) -> bool {
        matches!(self, Cause::Provider { event, .. } if *event == k)
    }

    fn tick(&self) -> bool {
        matches!(self, Cause::Tick)
    }

    fn restore(&self) -> bool {
        matches!(self, Cause::Restore)
    }

    /// The one session a request or a provider event may change.
    fn session(&self) -> Option<&SessionId> {
        match self {
            Cause::Request { id, .. } | Cause::Provider { id, .. } => Some(id),
            Cause::Tick | Cause::Restore => None,
        }
    }
}

/// What a session does after STOPPING, as far as the requests made so far say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    Stop,
    Restart,
}

/// One session as the client has seen it.
#[derive(Debug, Clone)]
pub struct SessionModel {
    pub config: SessionConfig,
    pub status: Status,
    pub status_seq: u64,
    pub activity_seq: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    /// Transitions into STARTING seen (the first is the creation): `restart_count + 1`.
    pub starts: u32,
    /// Turns started (user messages stored).
    pub turns: u64,
    /// Turns whose stream ended (a COMPLETION or ERROR that ends it), across every daemon.
    pub turns_ended: u64,
    pub open_turn: Option<u64>,
    /// When the status last changed.
    pub since: Millis,
    /// When the provider last reported it started (the session timeout counts from there).
    pub started_at: Option<Millis>,
    /// A restart was asked for while the session was STOPPED or FAILED.
    restart_asked: bool,
    /// What the pending stop leads to.
    after_stop: Option<Then>,
    /// The daemon restarting now adopts this session's process (meaningful in the restore
    /// batch only).
    adopted: bool,
    /// The run whose output the session has applied, and how far (the last cursor applied).
    applied: Option<(RunId, u64)>,
    /// The provider's conversation id, as the runs reported it (`SessionRef`): what the
    /// record keeps and the next `Spawn` resumes.
    pub provider_session: Option<String>,
    /// The process TERMed and not yet gone (nor KILLed): when KILL is due.
    kill_at: Option<(RunId, Millis)>,
}

impl SessionModel {
    pub fn tokens(&self) -> u64 {
        self.tokens_in.saturating_add(self.tokens_out)
    }

    fn exhausted(&self) -> bool {
        self.config.max_tokens > 0 && self.tokens() >= self.config.max_tokens
    }
}

/// A request waiting for its reply, with what the client knew when it made it.
#[derive(Debug, Clone)]
struct Pending {
    kind: ReqKind,
    id: SessionId,
    /// The session's status then (`None`: no such session).
    pre: Option<Status>,
    exhausted: bool,
    /// A create that must be refused: the id exists, or the live-session limit is reached.
    refuse_create: bool,
    config: Option<SessionConfig>,
}

/// Counters for the run summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelStats {
    pub requests: u64,
    pub replies_ok: u64,
    pub replies_err: u64,
    /// Requests in flight when the daemon crashed (their clients saw the connection drop).
    pub requests_lost: u64,
    pub turns_completed: u64,
    pub turns_errored: u64,
    /// Turns a daemon crash left open that the new daemon ended with OBEY-2032 (their
    /// process was lost).
    pub turns_cut: u64,
    /// Turns a daemon crash left open that went on in an adopted process.
    pub turns_adopted: u64,
    /// Output events replayed after a restart that had been applied already (and were
    /// recognised as such).
    pub replays_ignored: u64,
}

#[derive(Debug, Clone)]
pub struct Model {
    sessions: BTreeMap<SessionId, SessionModel>,
    pending: BTreeMap<RequestId, Pending>,
    limits: Limits,
    /// The time of the current batch.
    now: Millis,
    /// In the current batch: the provider's own activity was recorded already.
    provider_activity_seen: bool,
    /// The status of the session the request of the current batch was made for, then.
    pending_pre: Option<Status>,
    pub stats: ModelStats,
}

impl Model {
    pub fn new(limits: Limits) -> Self {
        Model {
            sessions: BTreeMap::new(),
            pending: BTreeMap::new(),
            limits,
            now: 0,
            provider_activity_seen: false,
            pending_pre: None,
            stats: ModelStats::default(),
        }
    }

    pub fn status(&self, id: &SessionId) -> Option<Status> {
        self.sessions.get(id).map(|s| s.status)
    }

    pub fn session(&self, id: &SessionId) -> Option<&SessionModel> {
        self.sessions.get(id)
    }

    pub fn sessions(&self) -> impl Iterator<Item = (&SessionId, &SessionModel)> {
        self.sessions.iter()
    }

    pub fn live(&self) -> usize {
        self.sessions
            .values()
            .filter(|s| !s.status.is_terminal())
            .count()
    }

    /// Requests still waiting for a reply.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    // ── requests ─────────────────────────────────────────────────────────

    /// A request is about to be fed: remember what its reply may be.
    pub fn on_request(&mut self, input: &Input) -> Cause {
        let (req, id, kind) = match input {
            Input::Create { req, id, .. } => (*req, id, ReqKind::Create),
            Input::Send { req, id, .. } => (*req, id, ReqKind::Send),
            Input::Stop { req, id, graceful } => (
                *req,
                id,
                if *graceful {
                    ReqKind::StopGraceful
                } else {
                    ReqKind::StopForced
                },
            ),
            Input::Restart { req, id, .. } => (*req, id, ReqKind::Restart),
            Input::Provider { .. } | Input::Tick => unreachable!("not a request"),
        };
        self.stats.requests += 1;
        let live = self.live();
        let sm = self.sessions.get_mut(id);
        let pre = sm.as_ref().map(|s| s.status);
        let exhausted = sm.as_ref().is_some_and(|s| s.exhausted());
        let mut config = None;
        if let Some(sm) = sm {
            match (input, pre) {
                (Input::Stop { .. }, Some(s)) if !s.is_terminal() => {
                    sm.after_stop = Some(Then::Stop);
                }
                (
                    Input::Restart {
                        provider_config, ..
                    },
                    Some(s),
                ) if s != Status::Stopping => {
                    if s.is_terminal() {
                        sm.restart_asked = true;
                    } else {
                        sm.after_stop = Some(Then::Restart);
                    }
                    if let Some(pc) = provider_config {
                        sm.config.provider_config = pc.clone();
                    }
                }
                _ => {}
            }
        } else if let Input::Create { config: c, .. } = input {
            config = Some(c.clone());
        }
        let refuse_create =
            kind == ReqKind::Create && (pre.is_some() || live >= self.limits.max_live_sessions);
        self.pending_pre = pre;
        self.pending.insert(
            req,
            Pending {
                kind,
                id: id.clone(),
                pre,
                exhausted,
                refuse_create,
                config,
            },
        );
        Cause::Request {
            req,
            id: id.clone(),
            kind,
        }
    }

    // ── effect batches ───────────────────────────────────────────────────

    /// Checks one `handle` result (after its persists were committed to `store`) and learns
    /// from what it delivers to clients.
    pub fn on_batch(
        &mut self,
        now: Millis,
        cause: &Cause,
        effects: &[Effect],
        store: &Store,
    ) -> Result<(), String> {
        self.now = now;
        // The drain rule: every Persist comes before every other effect.
        let rest_at = effects
            .iter()
            .position(|e| !e.is_persist())
            .unwrap_or(effects.len());
        if let Some(i) = effects[rest_at..].iter().position(Effect::is_persist) {
            return Err(format!(
                "drain rule: a Persist (effect #{}) comes after a non-persist effect (#{rest_at}): \
                 {:?}",
                rest_at + i,
                effects[rest_at + i]
            ));
        }
        let (persists, rest) = effects.split_at(rest_at);
        // Nothing reaches a client that is not in this transaction: every emitted status or
        // activity was persisted, in the same order, with the same content.
        let mut p_status: Vec<&StatusEvent> = Vec::new();
        let mut p_activity: Vec<&ActivityEvent> = Vec::new();
        let mut messages: Vec<(&SessionId, u64)> = Vec::new();
        for e in persists {
            match e {
                Effect::Persist(Record::Status(ev)) => p_status.push(ev),
                Effect::Persist(Record::Activity(ev)) => p_activity.push(ev),
                Effect::Persist(Record::UserMessage(m)) => messages.push((&m.session, m.turn)),
                _ => {}
            }
        }
        let e_status: Vec<&StatusEvent> = rest
            .iter()
            .filter_map(|e| match e {
                Effect::EmitStatus(ev) => Some(ev),
                _ => None,
            })
            .collect();
        let e_activity: Vec<&ActivityEvent> = rest
            .iter()
            .filter_map(|e| match e {
                Effect::EmitActivity(ev) => Some(ev),
                _ => None,
            })
            .collect();
        if e_status != p_status {
            return Err(format!(
                "emitted status events {e_status:?} are not the persisted ones {p_status:?}"
            ));
        }
        if e_activity != p_activity {
            return Err(format!(
                "emitted activities {e_activity:?} are not the persisted ones {p_activity:?}"
            ));
        }
        if let Some(id) = cause.session() {
            for e in persists {
                let sid = match e {
                    Effect::Persist(Record::Session(r)) => &r.id,
                    Effect::Persist(Record::Status(ev)) => &ev.session,
                    Effect::Persist(Record::Activity(ev)) => &ev.session,
                    Effect::Persist(Record::UserMessage(m)) => &m.session,
                    _ => continue,
                };
                if sid != id {
                    return Err(format!(
                        "an input for {id} persisted a row of another session, {sid}"
                    ));
                }
            }
        }
        if let Cause::Provider {
            id,
            run,
            cursor: Some(c),
            ..
        } = cause
        {
            self.on_cursor(cause, id, *run, *c, effects)?;
        }
        if let Cause::Provider {
            id,
            run,
            event: EventKind::Exited | EventKind::SpawnFailed,
            ..
        } = cause
        {
            // The process is gone: no KILL is due any more.
            if let Some(sm) = self.sessions.get_mut(id) {
                if sm.kill_at.is_some_and(|(r, _)| r == *run) {
                    sm.kill_at = None;
                }
            }
        }
        self.provider_activity_seen = false;
        for e in rest {
            match e {
                Effect::EmitStatus(ev) => self.on_status(cause, ev, &messages, store)?,
                Effect::EmitActivity(ev) => self.on_activity(cause, ev)?,
                Effect::Reply { req, result } => self.on_reply(cause, *req, result, store)?,
                Effect::Spawn { id, spec, .. } => self.on_spawn(cause, id, spec, store)?,
                Effect::Write { id, .. } => same_session(cause, id)?,
                Effect::Signal {
                    id, run, signal, ..
                } => {
                    same_session(cause, id)?;
                    self.on_signal(id, *run, *signal)?;
                }
                Effect::Persist(_) => unreachable!("persists come first"),
            }
        }
        if cause.tick() {
            // Every due deadline fired: a due KILL was sent (or, the table ignoring it, dropped).
            for sm in self.sessions.values_mut() {
                if sm.kill_at.is_some_and(|(_, at)| at <= now) {
                    sm.kill_at = None;
                }
            }
        }
        self.end_batch(cause)
    }

    /// TERM starts the kill grace period of a process; KILL ends it.
    fn on_signal(&mut self, id: &SessionId, run: RunId, signal: Signal) -> Result<(), String> {
        let Some(sm) = self.sessions.get_mut(id) else {
            return Err(format!("a signal for a session never created: {id}"));
        };
        match signal {
            Signal::Term => {
                sm.kill_at = Some((run, self.now.saturating_add(self.limits.kill_grace_ms)));
            }
            Signal::Kill => {
                if sm.kill_at.is_none_or(|(r, at)| r != run || at > self.now) {
                    return Err(format!(
                        "{id}: KILL to run {run} at {}, but its kill deadline is {:?}",
                        self.now, sm.kill_at
                    ));
                }
                sm.kill_at = None;
            }
        }
        Ok(())
    }

    /// An output event at cursor `c` of `run`: applied exactly once. One the session has
    /// applied already (replayed after a restart) changes nothing; any other is applied, and
    /// the cursor is stored with what it did (in the same transaction).
    fn on_cursor(
        &mut self,
        cause: &Cause,
        id: &SessionId,
        run: RunId,
        c: u64,
        effects: &[Effect],
    ) -> Result<(), String> {
        let Some(sm) = self.sessions.get_mut(id) else {
            return Err(format!(
                "output of run {run} for {id}, which clients never saw"
            ));
        };
        let last = match sm.applied {
            Some((r, n)) if r == run => n,
            _ => 0,
        };
        if c <= last {
            if !effects.is_empty() {
                return Err(format!(
                    "{id}: output at cursor {c} of run {run} was applied already (up to {last}); \
                     replayed after a restart, it was applied again: {effects:?}"
                ));
            }
            self.stats.replays_ignored += 1;
            return Ok(());
        }
        let stored = effects.iter().find_map(|e| match e {
            Effect::Persist(Record::Session(r)) if &r.id == id => Some(r),
            _ => None,
        });
        match stored {
            Some(r) if r.run == Some(run) && r.provider_cursor == c => {}
            other => {
                return Err(format!(
                    "{id}: output at cursor {c} of run {run} (applied up to {last}) was not \
                     applied, or its cursor not stored with it: the record stored is {:?}",
                    other.map(|r| (r.run, r.provider_cursor))
                ))
            }
        }
        sm.applied = Some((run, c));
        if let Cause::Provider {
            session_ref: Some(r),
            ..
        } = cause
        {
            // A conversation id is kept (and resumed) unless the session has ended.
            if !sm.status.is_terminal() {
                sm.provider_session = Some(r.clone());
            }
        }
        Ok(())
    }

    fn on_status(
        &mut self,
        cause: &Cause,
        ev: &StatusEvent,
        messages: &[(&SessionId, u64)],
        store: &Store,
    ) -> Result<(), String> {
        same_session(cause, &ev.session)?;
        let id = &ev.session;
        if ev.at != self.now {
            return Err(format!(
                "status event at {} while the time is {}: {ev:?}",
                ev.at, self.now
            ));
        }
        let Some(prev) = ev.previous else {
            // The first event of a session: its creation.
            let config = match cause {
                Cause::Request {
                    req,
                    kind: ReqKind::Create,
                    ..
                } => self.pending.get(req).and_then(|p| p.config.clone()),
                _ => None,
            };
            let Some(config) = config else {
                return Err(format!(
                    "status event {ev:?} has no previous status, but {cause:?} creates nothing"
                ));
            };
            if self.sessions.contains_key(id) || ev.seq != 1 || ev.new != Status::Created {
                return Err(format!("a second or malformed creation event: {ev:?}"));
            }
            self.sessions.insert(
                id.clone(),
                SessionModel {
                    config,
                    status: Status::Created,
                    status_seq: 1,
                    activity_seq: 0,
                    tokens_in: 0,
                    tokens_out: 0,
                    starts: 0,
                    turns: 0,
                    turns_ended: 0,
                    open_turn: None,
                    since: ev.at,
                    started_at: None,
                    restart_asked: false,
                    after_stop: None,
                    adopted: false,
                    applied: None,
                    provider_session: None,
                    kill_at: None,
                },
            );
            return Ok(());
        };
        let Some(sm) = self.sessions.get_mut(id) else {
            return Err(format!("status event for a session never created: {ev:?}"));
        };
        if ev.seq != sm.status_seq + 1 {
            return Err(format!(
                "status seq of {id} jumps from {} to {}: {ev:?}",
                sm.status_seq, ev.seq
            ));
        }
        if prev != sm.status {
            return Err(format!(
                "status event of {id} says {prev} -> {}, but the last status seen was {}",
                ev.new, sm.status
            ));
        }
        allowed(sm, prev, ev.new, cause).map_err(|why| {
            format!(
                "illegal transition of {id}: {prev} -> {} on {cause:?} ({why}); message {:?}",
                ev.new, ev.message
            )
        })?;
        if cause.tick() && ev.new == Status::Failed {
            // A deadline fired: not before it was due.
            let due = match prev {
                Status::Starting => Some(sm.since + self.limits.startup_timeout_ms),
                // No timeout configured (0): no session deadline exists at all.
                _ => sm
                    .started_at
                    .filter(|_| sm.config.timeout_ms > 0)
                    .map(|t| t + sm.config.timeout_ms),
            };
            if due.is_none_or(|due| self.now < due) {
                return Err(format!(
                    "{id} failed on a deadline at {} that was due at {due:?} ({prev} since {}, \
                     started at {:?})",
                    self.now, sm.since, sm.started_at
                ));
            }
        }
        if ev.new == Status::Failed {
            // Every failure says why, with the code its cause implies.
            use EventKind as E;
            let want = match cause {
                Cause::Tick if prev == Status::Starting => Some(ErrorCode::CreationFailed),
                Cause::Tick => Some(ErrorCode::Timeout),
                Cause::Restore => Some(ErrorCode::ConnectionLost),
                c if c.ev(E::SpawnFailed) => Some(ErrorCode::CreationFailed),
                c if c.ev(E::Exited) => Some(ErrorCode::ProviderCrashed),
                c if c.ev(E::Activity) => Some(ErrorCode::BudgetExceeded),
                _ => None,
            };
            let got = store
                .sessions
                .get(id)
                .and_then(|r| r.error.as_ref())
                .map(|e| e.code);
            if want.is_none() || got != want {
                return Err(format!(
                    "{id} went {prev} -> FAILED on {cause:?} with error {got:?}, not {want:?}"
                ));
            }
        }
        if prev == Status::Starting && ev.new == Status::Running {
            sm.started_at = Some(ev.at);
        }
        sm.status = ev.new;
        sm.status_seq = ev.seq;
        sm.since = ev.at;
        match ev.new {
            Status::Starting => {
                sm.starts += 1;
                sm.after_stop = None;
                sm.restart_asked = false;
            }
            Status::Working => {
                if let Some(t) = sm.open_turn {
                    return Err(format!(
                        "{id} starts a turn while turn {t} is still open: two turns at once"
                    ));
                }
                sm.turns += 1;
                sm.open_turn = Some(sm.turns);
                if !messages.contains(&(id, sm.turns)) {
                    return Err(format!(
                        "{id} went WORKING on turn {} without storing its user message",
                        sm.turns
                    ));
                }
            }
            _ => {}
        }
        if ev.new.is_terminal() {
            sm.after_stop = None;
        }
        if ev.new != Status::Working && ev.new != Status::Stopping {
            if let Some(t) = sm.open_turn {
                return Err(format!(
                    "{id} went {} with turn {t} still open (its stream never ended)",
                    ev.new
                ));
            }
        }
        Ok(())
    }

    fn on_activity(&mut self, cause: &Cause, ev: &ActivityEvent) -> Result<(), String> {
        same_session(cause, &ev.session)?;
        let id = &ev.session;
        let Some(sm) = self.sessions.get_mut(id) else {
            return Err(format!("activity for a session never created: {ev:?}"));
        };
        if ev.seq != sm.activity_seq + 1 {
            return Err(format!(
                "activity seq of {id} jumps from {} to {}",
                sm.activity_seq, ev.seq
            ));
        }
        sm.activity_seq = ev.seq;
        if ev.at != self.now {
            return Err(format!(
                "activity at {} while the time is {}: {ev:?}",
                ev.at, self.now
            ));
        }
        if cause.tick() {
            // A deadline interrupted the turn: the stop's grace period, or the session timeout.
            let due = match sm.status {
                Status::Stopping => Some(sm.since + self.limits.stop_grace_ms),
                // No timeout configured (0): no session deadline exists at all.
                _ => sm
                    .started_at
                    .filter(|_| sm.config.timeout_ms > 0)
                    .map(|t| t + sm.config.timeout_ms),
            };
            if due.is_none_or(|due| self.now < due) {
                return Err(format!(
                    "{id}: a deadline interrupted turn {:?} at {} while it was due at {due:?} \
                     ({} since {})",
                    ev.turn, self.now, sm.status, sm.since
                ));
            }
        }
        if !matches!(
            sm.status,
            Status::Running | Status::Working | Status::Stopping
        ) {
            return Err(format!(
                "{id} recorded an activity while {}: {ev:?}",
                sm.status
            ));
        }
        let a = &ev.activity;
        let delta = a.tokens_input.saturating_add(a.tokens_output);
        let max = sm.config.max_tokens;
        if max > 0 && sm.tokens() >= max && delta > 0 {
            return Err(format!(
                "budget: {id} had already used {} of its {max} tokens, and still {delta} more \
                 were counted (seq {}, {} in {:?} while {}): tokens may pass the budget only by \
                 the event that crossed it",
                sm.tokens(),
                ev.seq,
                a.kind().name(),
                ev.turn,
                sm.status
            ));
        }
        sm.tokens_in = sm.tokens_in.saturating_add(a.tokens_input);
        sm.tokens_out = sm.tokens_out.saturating_add(a.tokens_output);
        let from_provider = match cause {
            Cause::Provider {
                activity: Some(fed),
                ..
            } if !self.provider_activity_seen => {
                self.provider_activity_seen = true;
                if fed != a {
                    return Err(format!(
                        "{id} recorded {a:?}, but the provider said {fed:?}"
                    ));
                }
                true
            }
            _ => false,
        };
        let interruption = a.kind() == ActivityKind::Error && ev.ends_turn && delta == 0;
        if !from_provider
            && interruption
            && !(cause.req(ReqKind::StopForced)
                || cause.req(ReqKind::Restart)
                || cause.tick()
                || cause.ev(EventKind::Exited)
                || cause.ev(EventKind::Activity)
                || cause.restore())
        {
            return Err(format!(
                "{id}: {cause:?} interrupted turn {:?} (only a forced stop, a restart, a deadline,                  the budget, an exit or a daemon restart ends a turn; a graceful stop waits for                  it): {ev:?}",
                ev.turn
            ));
        }
        if !(from_provider || interruption) {
            return Err(format!(
                "{id}: the engine recorded an activity of its own that does not end a turn with \
                 an ERROR: {ev:?}"
            ));
        }
        if cause.restore() {
            // A restart ends a turn the old daemon left open: with OBEY-2032 if its process
            // was lost; an adopted one only if the session was stopping (the stop goes on).
            let lost = ErrorCode::ConnectionLost.to_string();
            if !sm.adopted && !a.content.starts_with(&lost) {
                return Err(format!(
                    "{id}: a restart that lost the process ended turn {:?} without saying \
                     {lost}: {ev:?}",
                    ev.turn
                ));
            }
            if sm.adopted && sm.status != Status::Stopping {
                return Err(format!(
                    "{id}: an adopted {} session had turn {:?} interrupted: {ev:?}",
                    sm.status, ev.turn
                ));
            }
            if !sm.adopted {
                self.stats.turns_cut += 1;
            }
        }
        match ev.turn {
            Some(t) => {
                if sm.open_turn != Some(t) {
                    return Err(format!(
                        "{id}: an activity of turn {t} while the open turn is {:?} (a stream \
                         that ended got more, or one that never started did): {ev:?}",
                        sm.open_turn
                    ));
                }
                if ev.ends_turn {
                    if !a.kind().ends_turn() {
                        return Err(format!("{id}: a {} ends turn {t}", a.kind().name()));
                    }
                    sm.open_turn = None;
                    sm.turns_ended += 1;
                    if a.kind() == ActivityKind::Completion {
                        self.stats.turns_completed += 1;
                    } else {
                        self.stats.turns_errored += 1;
                    }
                } else if a.kind().ends_turn() {
                    return Err(format!(
                        "{id}: a {} inside turn {t} does not end it",
                        a.kind().name()
                    ));
                }
            }
            None => {
                if ev.ends_turn {
                    return Err(format!("{id}: an activity outside any turn ends a turn"));
                }
                if let Some(t) = sm.open_turn {
                    return Err(format!(
                        "{id}: an activity outside any turn while turn {t} is open"
                    ));
                }
            }
        }
        Ok(())
    }

    fn on_reply(
        &mut self,
        cause: &Cause,
        req: RequestId,
        result: &Result<SessionRecord, Error>,
        store: &Store,
    ) -> Result<(), String> {
        let Some(p) = self.pending.remove(&req) else {
            return Err(format!(
                "a reply to request {req}, which is not waiting for one (never made, already \
                 answered, or lost in a crash): {result:?}"
            ));
        };
        match result {
            Ok(_) => self.stats.replies_ok += 1,
            Err(_) => self.stats.replies_err += 1,
        }
        let immediate = matches!(cause, Cause::Request { req: r, .. } if *r == req);
        let what = format!("{:?} {req} for {} (made while {:?})", p.kind, p.id, p.pre);
        if let Ok(rec) = result {
            if rec.id != p.id {
                return Err(format!("{what} was answered with the record of {}", rec.id));
            }
            match store.sessions.get(&rec.id) {
                Some(stored) if stored == rec => {}
                Some(stored) => {
                    return Err(format!(
                        "{what} was answered with a record that is not the committed one: {}",
                        diff(stored, rec)
                    ))
                }
                None => return Err(format!("{what} was answered before its session was stored")),
            }
        }
        let code = result.as_ref().err().map(|e| e.code);
        let now = self.sessions.get(&p.id);
        let now_status = now.map(|s| s.status);
        let bad = |why: &str| Err(format!("{what}: {why}; got {result:?}"));
        let expect_now = |want: ErrorCode| -> Result<(), String> {
            if !immediate {
                return bad("a refusal must come at once");
            }
            if code != Some(want) {
                return bad(&format!("expected {want}"));
            }
            Ok(())
        };
        if p.pre.is_none() && p.kind != ReqKind::Create {
            return expect_now(ErrorCode::SessionNotFound);
        }
        match p.kind {
            ReqKind::Create if p.refuse_create => expect_now(ErrorCode::CreationFailed),
            ReqKind::Create | ReqKind::Restart if p.pre == Some(Status::Stopping) => {
                expect_now(ErrorCode::WrongState)
            }
            ReqKind::Create | ReqKind::Restart => {
                if immediate {
                    return bad("a start is answered when the provider started, not at once");
                }
                match result {
                    Ok(rec) => {
                        if !matches!(rec.status, Status::Running | Status::Working)
                            || now_status != Some(rec.status)
                        {
                            return bad(&format!("started, but the session is {now_status:?}"));
                        }
                    }
                    Err(e) if e.code == ErrorCode::WrongState => {
                        if !matches!(now_status, Some(Status::Stopping | Status::Stopped)) {
                            return bad("superseded by a stop, but no stop is under way");
                        }
                    }
                    Err(e) => {
                        let stored = store.sessions.get(&p.id).and_then(|r| r.error.as_ref());
                        if now_status != Some(Status::Failed) || stored != Some(e) {
                            return bad(&format!(
                                "a failed start must leave the session FAILED with that error \
                                 (it is {now_status:?} with {stored:?})"
                            ));
                        }
                    }
                }
                Ok(())
            }
            ReqKind::Send => {
                let pre = p.pre.expect("known");
                if !immediate {
                    return bad("SendMessage is answered at once");
                }
                if pre != Status::Running {
                    return expect_now(ErrorCode::WrongState);
                }
                if p.exhausted {
                    return expect_now(ErrorCode::BudgetExceeded);
                }
                match result {
                    Ok(rec)
                        if rec.status == Status::Working
                            && now.and_then(|s| s.open_turn) == Some(rec.turns) =>
                    {
                        Ok(())
                    }
                    _ => bad("a message to an idle session within budget starts a turn"),
                }
            }
            ReqKind::StopGraceful | ReqKind::StopForced => {
                let pre = p.pre.expect("known");
                if pre.is_terminal() {
                    return expect_now(ErrorCode::AlreadyStopped);
                }
                let ok = match result {
                    Ok(rec) => rec.status == Status::Stopped,
                    Err(e) => e.code == ErrorCode::GracefulStopTimedOut,
                };
                if !ok || now_status != Some(Status::Stopped) {
                    return bad(&format!(
                        "a stop is answered when the session is STOPPED (it is {now_status:?})"
                    ));
                }
                Ok(())
            }
        }
    }

    fn on_spawn(
        &mut self,
        cause: &Cause,
        id: &SessionId,
        spec: &SpawnSpec,
        store: &Store,
    ) -> Result<(), String> {
        same_session(cause, id)?;
        let Some(sm) = self.sessions.get(id) else {
            return Err(format!("Spawn for a session never created: {id}"));
        };
        if sm.status != Status::Starting {
            return Err(format!("Spawn for {id} while it is {}", sm.status));
        }
        if spec.config != sm.config {
            return Err(format!(
                "Spawn for {id} with config {:?}; the session's is {:?}",
                spec.config, sm.config
            ));
        }
        if spec.restart_count + 1 != sm.starts {
            return Err(format!(
                "Spawn for {id} says restart #{}, but this is start #{}",
                spec.restart_count, sm.starts
            ));
        }
        let stored = store
            .sessions
            .get(id)
            .and_then(|r| r.provider_session.clone());
        if spec.resume != stored || spec.resume != sm.provider_session {
            return Err(format!(
                "Spawn for {id} resumes {:?}, but the stored conversation is {stored:?} and the \
                 last one its runs reported {:?}",
                spec.resume, sm.provider_session
            ));
        }
        Ok(())
    }

    fn end_batch(&mut self, cause: &Cause) -> Result<(), String> {
        let Cause::Request { req, id, kind } = cause else {
            return Ok(());
        };
        if let Some(p) = self.pending.get(req) {
            let must_now = p.kind == ReqKind::Send
                || (p.pre.is_none() && p.kind != ReqKind::Create)
                || p.refuse_create
                || (p.kind == ReqKind::Restart && p.pre == Some(Status::Stopping))
                || (matches!(p.kind, ReqKind::StopGraceful | ReqKind::StopForced)
                    && p.pre.is_some_and(Status::is_terminal));
            if must_now {
                return Err(format!(
                    "{kind:?} {req} for {id} (made while {:?}) was not answered at once",
                    p.pre
                ));
            }
            if p.kind == ReqKind::Create && self.status(id) != Some(Status::Starting) {
                return Err(format!(
                    "an accepted create of {id} left it {:?}, not STARTING",
                    self.status(id)
                ));
            }
        }
        // An accepted forced stop or restart interrupts the turn (a refused one changes
        // nothing: a restart while a graceful stop waits for the turn leaves it open).
        let accepted = self
            .pending_pre
            .is_some_and(|pre| !pre.is_terminal() && pre != Status::Stopping)
            || (*kind == ReqKind::StopForced && self.pending_pre == Some(Status::Stopping));
        if accepted && matches!(kind, ReqKind::StopForced | ReqKind::Restart) {
            if let Some(t) = self.sessions.get(id).and_then(|s| s.open_turn) {
                return Err(format!(
                    "{kind:?} {req} left turn {t} of {id} open (a forced stop or restart \
                     interrupts the turn)"
                ));
            }
        }
        Ok(())
    }

    // ── whole-state checks ───────────────────────────────────────────────

    /// After every step: the engine's state, the store and what clients saw agree.
    pub fn check(&self, engine: &Engine, store: &Store, tick: bool) -> Result<(), String> {
        let n = engine.sessions().count();
        if n != store.sessions.len() || n != self.sessions.len() {
            return Err(format!(
                "the engine has {n} sessions, the store {}, the clients saw {}",
                store.sessions.len(),
                self.sessions.len()
            ));
        }
        for s in engine.sessions() {
            let rec = &s.record;
            let id = &rec.id;
            let Some(stored) = store.sessions.get(id) else {
                return Err(format!("{id} is in the engine but was never stored"));
            };
            if stored != rec {
                return Err(format!(
                    "{id}: the engine's record differs from the committed one (a change that was \
                     never persisted): {}",
                    diff(stored, rec)
                ));
            }
            let Some(sm) = self.sessions.get(id) else {
                return Err(format!("{id} is in the engine but clients never saw it"));
            };
            let mismatch = |what: &str, engine: String, seen: String| {
                Err(format!(
                    "{id}: the engine says {what} {engine}, the clients saw {seen}"
                ))
            };
            if rec.status != sm.status {
                return mismatch("status", rec.status.to_string(), sm.status.to_string());
            }
            if rec.last_status_seq != sm.status_seq || rec.last_activity_seq != sm.activity_seq {
                return mismatch(
                    "status/activity seq",
                    format!("{}/{}", rec.last_status_seq, rec.last_activity_seq),
                    format!("{}/{}", sm.status_seq, sm.activity_seq),
                );
            }
            if rec.tokens_input != sm.tokens_in || rec.tokens_output != sm.tokens_out {
                return mismatch(
                    "tokens in/out",
                    format!("{}/{}", rec.tokens_input, rec.tokens_output),
                    format!("{}/{}", sm.tokens_in, sm.tokens_out),
                );
            }
            if rec.restart_count + 1 != sm.starts {
                return mismatch(
                    "restart_count",
                    rec.restart_count.to_string(),
                    format!("{} starts", sm.starts),
                );
            }
            if sm.turns != sm.turns_ended + u64::from(sm.open_turn.is_some()) {
                return Err(format!(
                    "{id}: {} turns began, {} ended and {:?} is open: every turn ends exactly \
                     once (across daemon restarts too)",
                    sm.turns, sm.turns_ended, sm.open_turn
                ));
            }
            if rec.turns != sm.turns || s.turn() != sm.open_turn {
                return mismatch(
                    "turns/open turn",
                    format!("{}/{:?}", rec.turns, s.turn()),
                    format!("{}/{:?}", sm.turns, sm.open_turn),
                );
            }
            if rec.config != sm.config {
                return mismatch(
                    "config",
                    format!("{:?}", rec.config),
                    format!("{:?}", sm.config),
                );
            }
            if rec.started_at != sm.started_at {
                return mismatch(
                    "started_at",
                    format!("{:?}", rec.started_at),
                    format!("{:?}", sm.started_at),
                );
            }
            if tick {
                self.check_deadlines(id, sm)?;
            }
            let want = self.deadline(sm);
            if s.next_deadline() != want {
                return Err(format!(
                    "{id} ({}, process {:?}): the engine's next deadline is {:?}, the reference \
                     one {want:?} (one next deadline, with its reason; a later one fires late)",
                    sm.status,
                    s.run(),
                    s.next_deadline()
                ));
            }
            if rec.provider_session != sm.provider_session {
                return mismatch(
                    "provider_session",
                    format!("{:?}", rec.provider_session),
                    format!("{:?}", sm.provider_session),
                );
            }
            let run_ok = match rec.status {
                Status::Starting => matches!(s.run(), Run::Spawning { .. }),
                Status::Running | Status::Working => matches!(s.run(), Run::Alive { .. }),
                Status::Stopped => s.run() == Run::Idle,
                _ => true,
            };
            if !run_ok {
                return Err(format!(
                    "{id} is {} with process {:?} (STARTING means a spawn in flight, RUNNING and \
                     WORKING a live process, STOPPED none)",
                    rec.status,
                    s.run()
                ));
            }
            let terminal = rec.status.is_terminal();
            if rec.ended_at.is_some() != terminal {
                return Err(format!(
                    "{id} is {} with ended_at {:?}: ended_at is set exactly when terminal",
                    rec.status, rec.ended_at
                ));
            }
            if rec.error.is_some() != (rec.status == Status::Failed) {
                return Err(format!(
                    "{id} is {} with error {:?}: an error is kept exactly while FAILED",
                    rec.status, rec.error
                ));
            }
            if let Some(t) = sm.open_turn {
                if sm.exhausted() {
                    return Err(format!(
                        "{id}: turn {t} is still open with {} of {} tokens used (a turn that \
                         crosses the budget is interrupted)",
                        sm.tokens(),
                        sm.config.max_tokens
                    ));
                }
            }
            if (rec.status == Status::Working) != sm.open_turn.is_some()
                && rec.status != Status::Stopping
            {
                return Err(format!(
                    "{id} is {} with open turn {:?}: WORKING means a turn is open",
                    rec.status, sm.open_turn
                ));
            }
            if rec.run != s.run().id() {
                return Err(format!(
                    "{id}: the record names run {:?}, its process is {:?} (a restarted daemon \
                     would adopt the wrong one)",
                    rec.run,
                    s.run()
                ));
            }
            if rec.turn_open != s.turn().is_some() {
                return Err(format!(
                    "{id}: the record says turn_open={}, the open turn is {:?} (a restarted \
                     daemon would end or continue the wrong turn)",
                    rec.turn_open,
                    s.turn()
                ));
            }
            let applied = match (sm.applied, rec.run) {
                (Some((r, n)), Some(run)) if r == run => n,
                _ => 0,
            };
            if rec.provider_cursor != applied {
                return mismatch(
                    "output applied up to cursor",
                    format!("{} (run {:?})", rec.provider_cursor, rec.run),
                    applied.to_string(),
                );
            }
            if rec.status == Status::Running
                && rec.restart_count == 0
                && rec.turns == 0
                && !rec.config.initial_message.is_empty()
            {
                return Err(format!(
                    "{id} is RUNNING after its first start and its initial message was never \
                     sent (no turn began)"
                ));
            }
            let run_pid = match s.run() {
                paddock_core::Run::Alive { pid, .. }
                | paddock_core::Run::Terminating { pid, .. } => pid,
                paddock_core::Run::Idle | paddock_core::Run::Spawning { .. } => None,
            };
            if rec.pid != run_pid {
                return Err(format!(
                    "{id}: the record's pid is {:?}, its process's {run_pid:?} ({:?})",
                    rec.pid,
                    s.run()
                ));
            }
        }
        // The engine's next deadline is the earliest of every session's.
        let earliest = self
            .sessions
            .iter()
            .filter_map(|(id, sm)| self.deadline(sm).map(|(at, t)| (at, id, t)))
            .min_by_key(|(at, _, _)| *at);
        let got = engine.poll_timeout();
        let ok = match (&got, earliest) {
            (None, None) => true,
            (Some((at, id, t)), Some((want, _, _))) => {
                *at == want
                    && self.sessions.get(id).and_then(|sm| self.deadline(sm)) == Some((*at, *t))
            }
            _ => false,
        };
        if !ok {
            return Err(format!(
                "the engine's next deadline is {got:?}, the reference earliest {earliest:?}"
            ));
        }
        Ok(())
    }

    /// The reference deadline of a session: the earliest of those it has (the start-up timeout
    /// while STARTING, the session timeout while RUNNING or WORKING, the grace period of a
    /// graceful stop waiting for a turn, the KILL of a TERMed process), ties in `Timer` order.
    fn deadline(&self, sm: &SessionModel) -> Option<(Millis, Timer)> {
        let mut all = Vec::new();
        match sm.status {
            Status::Starting => all.push((
                sm.since.saturating_add(self.limits.startup_timeout_ms),
                Timer::Startup,
            )),
            Status::Running | Status::Working if sm.config.timeout_ms > 0 => {
                if let Some(t) = sm.started_at {
                    all.push((
                        t.saturating_add(sm.config.timeout_ms),
                        Timer::SessionTimeout,
                    ));
                }
            }
            Status::Stopping if sm.open_turn.is_some() => all.push((
                sm.since.saturating_add(self.limits.stop_grace_ms),
                Timer::StopGrace,
            )),
            _ => {}
        }
        if let Some((_, at)) = sm.kill_at {
            all.push((at, Timer::Kill));
        }
        all.into_iter().min()
    }

    /// After a Tick at `now`, no deadline that was due is left unenforced.
    fn check_deadlines(&self, id: &SessionId, sm: &SessionModel) -> Result<(), String> {
        let now = self.now;
        let late = |what: &str, due: Millis| {
            Err(format!(
                "{id} is still {} at {now}, though its {what} was due at {due}",
                sm.status
            ))
        };
        match sm.status {
            Status::Starting => {
                let due = sm.since + self.limits.startup_timeout_ms;
                if now >= due {
                    return late("start-up timeout", due);
                }
            }
            Status::Running | Status::Working if sm.config.timeout_ms > 0 => {
                if let Some(due) = sm.started_at.map(|t| t + sm.config.timeout_ms) {
                    if now >= due {
                        return late("session timeout", due);
                    }
                }
            }
            Status::Stopping if sm.open_turn.is_some() => {
                let due = sm.since + self.limits.stop_grace_ms;
                if now >= due {
                    return late("graceful stop's grace period (the turn is still open)", due);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The daemon crashed. Clients lose their connections: requests in flight get no reply,
    /// turn streams are cut. Everything they saw was committed, so it is what the store says.
    pub fn on_crash(&mut self, store: &Store) -> Result<(), String> {
        self.stats.requests_lost += self.pending.len() as u64;
        self.pending.clear();
        if self.sessions.len() != store.sessions.len() {
            return Err(format!(
                "clients saw {} sessions, the store has {}",
                self.sessions.len(),
                store.sessions.len()
            ));
        }
        for (id, sm) in &mut self.sessions {
            let Some(rec) = store.sessions.get(id) else {
                return Err(format!("clients saw {id}, the store never had it"));
            };
            if rec.status != sm.status || rec.last_status_seq != sm.status_seq {
                return Err(format!(
                    "clients saw {id} {} (seq {}), the store has {} (seq {})",
                    sm.status, sm.status_seq, rec.status, rec.last_status_seq
                ));
            }
            // A turn in progress stays in progress in the store: the new daemon ends it or,
            // adopting its process, lets it go on. Either way it ends exactly once.
            if rec.turn_open != sm.open_turn.is_some() || rec.turns != sm.turns {
                return Err(format!(
                    "clients saw {id} with turn {:?} of {} open, the store says turn_open={} of \
                     {}",
                    sm.open_turn, sm.turns, rec.turn_open, rec.turns
                ));
            }
            if rec.provider_session != sm.provider_session {
                return Err(format!(
                    "clients saw {id} with conversation {:?}, the store has {:?}",
                    sm.provider_session, rec.provider_session
                ));
            }
            // The new daemon TERMs afresh what it must.
            sm.kill_at = None;
            sm.adopted = false;
            sm.after_stop = None;
            sm.restart_asked = false;
            sm.started_at = rec.started_at;
            // A restart's override was only kept if its step committed.
            sm.config = rec.config.clone();
        }
        Ok(())
    }

    /// The new daemon is about to adopt the processes of `adopted`: a stop in progress goes
    /// on (to STOPPED: its requester is gone), and what was applied of their output is what
    /// the store says.
    pub fn on_restore(
        &mut self,
        adopted: &BTreeSet<SessionId>,
        store: &Store,
    ) -> Result<(), String> {
        for (id, sm) in &mut self.sessions {
            sm.adopted = adopted.contains(id);
            if !sm.adopted {
                // Its run is gone (a new daemon may reuse the number for another process).
                sm.applied = None;
                continue;
            }
            let rec = &store.sessions[id];
            let run = rec.run.expect("an adopted session's record names its run");
            let applied = match sm.applied {
                Some((r, n)) if r == run => n,
                _ => 0,
            };
            if rec.provider_cursor != applied {
                return Err(format!(
                    "{id}: the store says run {run}'s output was applied up to cursor {}, the \
                     clients saw it applied up to {applied}",
                    rec.provider_cursor
                ));
            }
            if sm.status == Status::Stopping {
                sm.after_stop = Some(Then::Stop);
            }
            if sm.open_turn.is_some() && sm.status == Status::Working {
                self.stats.turns_adopted += 1;
            }
        }
        Ok(())
    }

    /// Sessions not yet idle (RUNNING with no turn) nor terminal.
    pub fn unsettled(&self) -> Vec<(SessionId, Status)> {
        self.sessions
            .iter()
            .filter(|(_, s)| {
                !(s.status.is_terminal() || (s.status == Status::Running && s.open_turn.is_none()))
            })
            .map(|(id, s)| (id.clone(), s.status))
            .collect()
    }

    /// Requests never answered (the end of the run: every request gets its reply).
    pub fn unanswered(&self) -> Vec<String> {
        self.pending
            .iter()
            .map(|(req, p)| format!("{:?} {req} for {} (made while {:?})", p.kind, p.id, p.pre))
            .collect()
    }
}

/// The reference transition relation: may `cause` move a session from `from` to `to`?
fn allowed(sm: &SessionModel, from: Status, to: Status, cause: &Cause) -> Result<(), &'static str> {
    use EventKind as E;
    use ReqKind as R;
    use Status::*;
    // A restart fails what it did not adopt, and carries on what it did.
    let lost = cause.restore() && !sm.adopted;
    let adopted = cause.restore() && sm.adopted;
    let ok = match (from, to) {
        (Created, Starting) => cause.req(R::Create),
        (Starting, Running) => cause.ev(E::Started) || adopted,
        (Starting, Failed) => {
            cause.ev(E::SpawnFailed) || cause.ev(E::Exited) || cause.tick() || lost
        }
        (Starting | Running | Working, Stopping) => cause.stop() || cause.req(R::Restart),
        (Running, Working) => {
            cause.req(R::Send)
                || ((cause.ev(E::Started) || adopted)
                    && sm.starts == 1
                    && sm.turns == 0
                    && !sm.config.initial_message.is_empty())
        }
        (Running, Failed) => cause.ev(E::Exited) || cause.tick() || lost,
        (Working, Running) => cause.ev(E::TurnEnd),
        (Working, Failed) => {
            // The budget (an activity), a crash, the session timeout, a daemon restart.
            cause.ev(E::Activity) || cause.ev(E::Exited) || cause.tick() || lost
        }
        (Stopping, Stopped) => {
            if sm.after_stop != Some(Then::Stop) {
                return Err("no stop was asked for (or a restart is under way)");
            }
            cause.stop() || cause.ev(E::Exited) || cause.ev(E::SpawnFailed)
        }
        (Stopping, Starting) => {
            if sm.after_stop != Some(Then::Restart) {
                return Err("no restart is under way");
            }
            cause.req(R::Restart) || cause.ev(E::Exited) || cause.ev(E::SpawnFailed)
        }
        (Stopping, Failed) => lost,
        (Stopped | Failed, Starting) => {
            if !sm.restart_asked {
                return Err("a terminal session leaves only through a restart");
            }
            cause.req(R::Restart) || cause.ev(E::Exited) || cause.ev(E::SpawnFailed)
        }
        (Stopped | Failed, _) => return Err("a terminal session leaves only through a restart"),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err("not a transition this cause can make")
    }
}

fn same_session(cause: &Cause, id: &SessionId) -> Result<(), String> {
    match cause.session() {
        Some(c) if c != id => Err(format!(
            "an input for {c} produced an effect for another session, {id}"
        )),
        _ => Ok(()),
    }
}

/// The fields in which two records differ, for failure messages.
pub fn diff(want: &SessionRecord, got: &SessionRecord) -> String {
    let mut out = Vec::new();
    macro_rules! field {
        ($($f:ident),*) => {$(
            if want.$f != got.$f {
                out.push(format!(
                    "{}: {:?} vs {:?}",
                    stringify!($f),
                    want.$f,
                    got.$f
                ));
            }
        )*};
    }
    field!(
        id,
        config,
        status,
        tokens_input,
        tokens_output,
        pid,
        restart_count,
        created_at,
        started_at,
        last_activity_at,
        ended_at,
        error,
        provider_session,
        last_activity_seq,
        last_status_seq,
        turns,
        turn_open,
        run,
        provider_cursor
    );
    format!("[{}]", out.join("; "))
}
