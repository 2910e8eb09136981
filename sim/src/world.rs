//! The world around the engine: the fault settings a seed picks, the fake store (what the
//! daemon's database has committed) and the fake provider processes.
//!
//! The clock itself is one `Millis` in the driver: it only moves forward, and it jumps from one
//! event to the next (the next provider line, or the engine's next deadline).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use paddock_core::session::machine::RESOLVED_KEPT;
use paddock_core::{
    Activity, ActivityKind, Approval, ApprovalId, AskKind, Duration, EnvEvent, EnvState, Instant,
    Limits, Now, ProviderEvent, Record, RunId, SessionConfig, SessionId, SessionRecord, Signal,
    SpawnSpec, Timestamp,
};

use crate::rng::Rng;

/// Where simulated time starts (an arbitrary Unix time); logs print offsets from it.
/// The simulator's one clock, in milliseconds: it feeds the engine both readings of [`Now`]
/// (the monotonic instant and the wall clock) from it, equal in number.
pub type Millis = u64;

pub const T0: Millis = 1_700_000_000_000;

/// The engine's reading of the fake clock at `ms`.
pub fn now(ms: Millis) -> Now {
    Now::new(at(ms), ts(ms))
}

/// The fake clock at `ms`, as a deadline.
pub fn at(ms: Millis) -> Instant {
    Instant::from_millis(ms)
}

/// The fake clock at `ms`, as a record says it.
pub fn ts(ms: Millis) -> Timestamp {
    Timestamp::from_millis(ms)
}

// ── faults ────────────────────────────────────────────────────────────────

/// The fault rates one seed runs with (swarm testing: each seed switches every fault on or off
/// and picks its own rate, so that some seeds hammer one fault and others mix them all).
/// Rates are per mille of the chances the fault has (per spawn, per turn, per line), except
/// `daemon_crash`, which is per 10,000 steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Faults {
    /// Spawn fails outright (`SpawnFailed`).
    pub spawn_fail: u32,
    /// The process exits during start-up (before or right after it reported `Started`).
    pub exit_at_startup: u32,
    /// `Started` comes late: from half to twice the start-up timeout.
    pub slow_start: u32,
    /// The process crashes in the middle of a turn.
    pub crash_mid_turn: u32,
    /// The process stops producing output mid-turn (no output, no exit).
    pub hang: u32,
    /// One garbage or truncated line: the adapter drops it (if it was the turn's last line the
    /// turn never ends on its own).
    pub garbage: u32,
    /// Seconds between lines instead of milliseconds.
    pub slow_output: u32,
    /// One event reports a huge token usage, far past any budget.
    pub usage_jump: u32,
    /// The connection to the agent's machine drops mid-turn and comes back (an ssh relay's
    /// `paddock_connection` lines), the agent working on meanwhile.
    pub disconnect: u32,
    /// The turn ends with an ERROR instead of a COMPLETION.
    pub provider_error: u32,
    /// The process ignores TERM (only KILL ends it).
    pub ignore_term: u32,
    /// Lines outside a turn: a status line, a duplicated final line.
    pub stray_output: u32,
    /// The daemon crashes (per 10,000 steps).
    pub daemon_crash: u32,
    /// Of those crashes, how many (per mille) hit with an input in flight: its effects are
    /// lost with the uncommitted transaction.
    pub crash_mid_step: u32,
    /// Of those crashes, how many (per mille) the runner survives: the provider processes
    /// keep running through the daemon's downtime, and the new daemon adopts them.
    pub runner_survives: u32,
    /// Turns (per mille) that ask something (a permission, a question, a client-side tool)
    /// and wait for the answer. Not a fault (healing keeps it): the agent's way of working.
    pub ask: u32,
    /// Of the asks, how many (per mille) the agent does not wait for: its turn goes on (and
    /// may end) with the request still open.
    pub abandon_ask: u32,
    /// Turns (per mille) followed by an ask outside any turn (a stray permission prompt).
    pub stray_ask: u32,
    /// Messages (per mille) that cannot be written: the agent closed its stdin (it goes on
    /// running and never answers).
    pub stdin_closed: u32,
    /// Environments (per mille of those made) that cannot be made (`ProvisionFailed`: bwrap
    /// missing, the worktree's branch taken).
    pub provision_fail: u32,
    /// Environments whose making never reports at all (a hung `git worktree add`): the
    /// start-up timeout ends the session.
    pub provision_hang: u32,
    /// The report comes late: from half to twice the start-up timeout.
    pub slow_provision: u32,
}

impl Faults {
    /// The seed's fault rates: each fault on with probability 1/2, at a rate of its own.
    pub fn pick(rng: &mut Rng) -> Faults {
        let mut f = |lo: u64, hi: u64| -> u32 {
            if rng.chance(1, 2) {
                rng.range(lo, hi) as u32
            } else {
                0
            }
        };
        let mut faults = Faults {
            spawn_fail: f(20, 300),
            exit_at_startup: f(20, 300),
            slow_start: f(20, 400),
            crash_mid_turn: f(20, 300),
            hang: f(20, 300),
            garbage: f(20, 300),
            slow_output: f(20, 500),
            usage_jump: f(20, 300),
            disconnect: f(20, 300),
            provider_error: f(20, 300),
            ignore_term: f(50, 700),
            stray_output: f(20, 400),
            daemon_crash: f(10, 300),
            crash_mid_step: f(100, 900),
            runner_survives: f(200, 1000),
            ask: 0,
            abandon_ask: f(20, 300),
            stray_ask: f(50, 500),
            stdin_closed: f(10, 200),
            provision_fail: f(20, 400),
            provision_hang: f(20, 300),
            slow_provision: f(20, 400),
        };
        // Most seeds ask: approvals are much of what a session does.
        if rng.chance(3, 4) {
            faults.ask = rng.range(50, 800) as u32;
        }
        faults
    }

    /// What is left once every fault healed: the agents still ask (and wait for the answer).
    pub fn healed(&self) -> Faults {
        Faults {
            ask: self.ask,
            ..Faults::default()
        }
    }
}

impl fmt::Display for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "spawn_fail={} exit_at_startup={} slow_start={} crash_mid_turn={} hang={} \
             garbage={} slow_output={} usage_jump={} disconnect={} provider_error={} ignore_term={} \
             stray_output={} (per mille) daemon_crash={}/10k steps crash_mid_step={} \
             runner_survives={} ask={} abandon_ask={} stray_ask={} stdin_closed={} \
             provision_fail={} provision_hang={} slow_provision={}",
            self.spawn_fail,
            self.exit_at_startup,
            self.slow_start,
            self.crash_mid_turn,
            self.hang,
            self.garbage,
            self.slow_output,
            self.usage_jump,
            self.disconnect,
            self.provider_error,
            self.ignore_term,
            self.stray_output,
            self.daemon_crash,
            self.crash_mid_step,
            self.runner_survives,
            self.ask,
            self.abandon_ask,
            self.stray_ask,
            self.stdin_closed,
            self.provision_fail,
            self.provision_hang,
            self.slow_provision
        )
    }
}

/// The engine's limits for one seed: short and long grace periods, a small or large live
/// session limit, and now and then a zero (a grace period of 0 fires at once).
pub fn pick_limits(rng: &mut Rng) -> Limits {
    let mut ms = |zero_per_mille: u32, lo: u64, hi: u64| {
        if rng.per_mille(zero_per_mille) {
            0
        } else {
            rng.range(lo, hi)
        }
    };
    let stop_grace_ms = ms(50, 200, 60_000);
    let kill_grace_ms = ms(50, 100, 15_000);
    let startup_timeout_ms = ms(0, 500, 60_000);
    let max_live_sessions = if rng.chance(1, 2) {
        64
    } else {
        rng.range(1, 6) as usize
    };
    let end_grace_ms = if rng.per_mille(100) {
        0
    } else {
        rng.range(50, 10_000)
    };
    Limits {
        stop_grace: Duration::from_millis(stop_grace_ms),
        kill_grace: Duration::from_millis(kill_grace_ms),
        end_grace: Duration::from_millis(end_grace_ms),
        startup_timeout: Duration::from_millis(startup_timeout_ms),
        max_live_sessions,
        ..Limits::default()
    }
}

// ── the fake store ────────────────────────────────────────────────────────

/// Row counters of one session's append-only tables.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Rows {
    status_seq: u64,
    activity_seq: u64,
    message_turn: u64,
}

/// What the daemon's database has committed. The driver commits a step's persists at the end
/// of the step, as the shell does (one transaction); a crash loses exactly the uncommitted
/// step, never anything committed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Store {
    pub sessions: BTreeMap<SessionId, SessionRecord>,
    rows: BTreeMap<SessionId, Rows>,
    /// Requests for a human, upserted by id.
    pub approvals: BTreeMap<ApprovalId, Approval>,
    /// The ids of the open ones.
    pub open: BTreeSet<ApprovalId>,
    /// Rows committed so far (records, activities, status changes, messages, approvals).
    pub committed: u64,
}

impl Store {
    /// Applies a batch's records as one transaction. Appends must continue their table's
    /// sequence exactly (no gap, no repeat); a request for a human is written once open and
    /// once resolved, never again (its state never goes back), and a session is deleted (with
    /// everything stored about it) only once it ended and has no process.
    pub fn commit(&mut self, records: &[Record]) -> Result<(), String> {
        for (at, r) in records.iter().enumerate() {
            self.committed += 1;
            match r {
                Record::Session(rec) => {
                    if let Some(old) = self.sessions.get(&rec.id) {
                        if rec.created_at != old.created_at {
                            return Err(format!(
                                "store: session {} was persisted with another created_at",
                                rec.id
                            ));
                        }
                    }
                    self.sessions.insert(rec.id.clone(), (**rec).clone());
                }
                Record::Status(ev) => {
                    let rows = self.rows.entry(ev.session.clone()).or_default();
                    if ev.seq != rows.status_seq + 1 {
                        return Err(format!(
                            "store: status event of {} has seq {} after seq {}",
                            ev.session, ev.seq, rows.status_seq
                        ));
                    }
                    rows.status_seq = ev.seq;
                }
                Record::Activity(ev) => {
                    let rows = self.rows.entry(ev.session.clone()).or_default();
                    if ev.seq != rows.activity_seq + 1 {
                        return Err(format!(
                            "store: activity of {} has seq {} after seq {}",
                            ev.session, ev.seq, rows.activity_seq
                        ));
                    }
                    rows.activity_seq = ev.seq;
                }
                Record::UserMessage(m) => {
                    let rows = self.rows.entry(m.session.clone()).or_default();
                    if m.turn != rows.message_turn + 1 {
                        return Err(format!(
                            "store: user message of {} for turn {} after turn {}",
                            m.session, m.turn, rows.message_turn
                        ));
                    }
                    rows.message_turn = m.turn;
                }
                Record::Approval(a) => self.put_approval(a)?,
                Record::Delete(id) => {
                    // The delete replaces whatever its input would have stored of the
                    // session: nothing of it comes after the delete (other sessions' rows may
                    // share its batch, and rows of it an earlier input stored go with it).
                    let of_it = |r: &Record| match r {
                        Record::Session(rec) => &rec.id == id,
                        Record::Activity(ev) => &ev.session == id,
                        Record::Status(ev) => &ev.session == id,
                        Record::UserMessage(m) => &m.session == id,
                        Record::Approval(a) => &a.session == id,
                        Record::Delete(d) => d == id,
                        _ => false,
                    };
                    if records[at + 1..].iter().any(of_it) {
                        return Err(format!(
                            "store: rows of {id} come after its delete in one transaction: \
                             {records:?}"
                        ));
                    }
                    match self.sessions.get(id) {
                        Some(rec) if rec.status.is_terminal() && rec.run.is_none() => {}
                        // A create whose provider could not be started: refused, so nothing
                        // of it stays.
                        Some(rec)
                            if rec.status == paddock_core::Status::Starting
                                && rec.restart_count == 0
                                && rec.started_at.is_none() => {}
                        // A create whose environment could not be made: refused too.
                        Some(rec)
                            if rec.status == paddock_core::Status::Created
                                && rec.env_state == EnvState::Creating
                                && rec.run.is_none() => {}
                        Some(rec) => {
                            return Err(format!(
                                "store: {id} deleted while {} with run {:?} (only an ended \
                                 session without a process may be)",
                                rec.status, rec.run
                            ))
                        }
                        None => return Err(format!("store: {id} deleted, but never stored")),
                    }
                    if self
                        .approvals
                        .values()
                        .any(|a| &a.session == id && a.is_pending())
                    {
                        return Err(format!("store: {id} deleted with a request still open"));
                    }
                    self.sessions.remove(id);
                    self.rows.remove(id);
                    self.approvals.retain(|_, a| &a.session != id);
                }
                // The driver sends no task or campaign input.
                Record::Task(_)
                | Record::TaskOutput(_)
                | Record::Campaign(_)
                | Record::RemoveCampaign(_)
                | Record::Container(_)
                | Record::RemoveContainer(_) => {
                    return Err(format!("store: a row of no session: {r:?}"))
                }
            }
        }
        // Every session row written in this transaction must agree with the appends.
        for r in records {
            if let Record::Session(rec) = r {
                if (rec.turn_open && rec.turns == 0)
                    || (rec.run.is_none() && (rec.provider_cursor != 0 || rec.pid.is_some()))
                {
                    return Err(format!(
                        "store: record of {} says turn_open={} of {} turns, run {:?}, cursor {}, \
                         pid {:?}",
                        rec.id, rec.turn_open, rec.turns, rec.run, rec.provider_cursor, rec.pid
                    ));
                }
                let rows = self.rows.get(&rec.id).copied().unwrap_or_default();
                if rec.last_status_seq != rows.status_seq
                    || rec.last_activity_seq != rows.activity_seq
                    || rec.turns != rows.message_turn
                {
                    return Err(format!(
                        "store: record of {} says status seq {}, activity seq {}, turns {}; \
                         the tables hold {}, {}, {}",
                        rec.id,
                        rec.last_status_seq,
                        rec.last_activity_seq,
                        rec.turns,
                        rows.status_seq,
                        rows.activity_seq,
                        rows.message_turn
                    ));
                }
            }
            if let Record::Approval(a) = r {
                if !self.sessions.contains_key(&a.session) {
                    return Err(format!(
                        "store: approval {} belongs to {}, which is not stored",
                        a.id, a.session
                    ));
                }
            }
        }
        Ok(())
    }

    /// Upserts one request for a human: opened once (pending), resolved once (same request,
    /// now settled), and never written again.
    fn put_approval(&mut self, a: &Approval) -> Result<(), String> {
        match (self.approvals.get(&a.id), a.is_pending()) {
            (None, true) => {}
            (None, false) => {
                return Err(format!(
                    "store: approval {} is stored for the first time already {} (it was never \
                     open)",
                    a.id,
                    a.state.name()
                ))
            }
            (Some(old), _) if !old.is_pending() => {
                return Err(format!(
                    "store: approval {} was {} already and is written again as {}: a request \
                     is resolved exactly once and never goes back",
                    a.id,
                    old.state.name(),
                    a.state.name()
                ))
            }
            (Some(_), true) => {
                return Err(format!("store: approval {} is opened twice", a.id));
            }
            (Some(old), false) => {
                let same = old.session == a.session
                    && old.run == a.run
                    && old.key == a.key
                    && old.kind == a.kind
                    && old.tool == a.tool
                    && old.input == a.input
                    && old.turn == a.turn
                    && old.created_at == a.created_at
                    && old.expires_at == a.expires_at;
                if !same || a.resolved_at.is_none() {
                    return Err(format!(
                        "store: approval {} is resolved as another request (or without a time): \
                         {old:?} -> {a:?}",
                        a.id
                    ));
                }
            }
        }
        if a.is_pending() {
            self.open.insert(a.id.clone());
        } else {
            self.open.remove(&a.id);
        }
        self.approvals.insert(a.id.clone(), a.clone());
        Ok(())
    }

    /// Every committed session record, in id order (what a restarted daemon loads).
    pub fn records(&self) -> Vec<SessionRecord> {
        self.sessions.values().cloned().collect()
    }

    /// The newest resolved requests of one session, oldest first: what a recall gives back
    /// (the shell's `Store::resolved_approvals`).
    pub fn resolved_of(&self, session: &SessionId) -> Vec<Approval> {
        let mut mine: Vec<&Approval> = self
            .approvals
            .values()
            .filter(|a| &a.session == session && !a.is_pending())
            .collect();
        mine.sort_by(|a, b| {
            (a.resolved_at, a.created_at, &a.id).cmp(&(b.resolved_at, b.created_at, &b.id))
        });
        let skip = mine.len().saturating_sub(RESOLVED_KEPT);
        mine.into_iter().skip(skip).cloned().collect()
    }

    /// The requests a restarted daemon loads, as the shell's store gives them: every open
    /// one, and the [`RESOLVED_KEPT`] most recently resolved ones of each session.
    pub fn approvals_to_load(&self) -> Vec<Approval> {
        let mut all: Vec<&Approval> = self.approvals.values().collect();
        all.sort_by(|a, b| {
            (a.resolved_at, a.created_at, &a.id).cmp(&(b.resolved_at, b.created_at, &b.id))
        });
        let mut kept: BTreeMap<&SessionId, usize> = BTreeMap::new();
        let mut out: Vec<Approval> = Vec::new();
        for a in all.into_iter().rev() {
            if !a.is_pending() {
                let n = kept.entry(&a.session).or_default();
                if *n == RESOLVED_KEPT {
                    continue;
                }
                *n += 1;
            }
            out.push(a.clone());
        }
        out.reverse();
        out
    }
}

// ── fake providers ────────────────────────────────────────────────────────

/// One line a fake provider will produce, and when.
#[derive(Debug, Clone)]
struct Line {
    at: Millis,
    event: ProviderEvent,
    /// Part of the turn being answered (a Write must not arrive while one is still queued).
    of_turn: bool,
    /// Its position in the run's output (output lines only), given when it is first
    /// delivered; a redelivered line keeps it.
    cursor: Option<u64>,
    /// An `Ask` the agent waits for: the rest of its turn is held until it is answered.
    blocks: bool,
}

/// One step of a scripted turn: a line, or a point where the agent waits until every ask it
/// made is answered.
#[derive(Debug, Clone)]
enum Script {
    Line {
        event: ProviderEvent,
        of_turn: bool,
        blocks: bool,
    },
    Wait,
}

impl Script {
    fn line(event: ProviderEvent, of_turn: bool) -> Script {
        Script::Line {
            event,
            of_turn,
            blocks: false,
        }
    }

    fn is_ask(&self) -> bool {
        matches!(
            self,
            Script::Line {
                event: ProviderEvent::Ask(_),
                ..
            }
        )
    }
}

/// How many delivered output lines a process keeps for redelivery (the runner's buffer).
/// A daemon commits every line it reads in the same step, so after a crash at most the one in
/// flight is unapplied, plus the few already applied that are replayed to test the dedupe.
const KEPT_OUTPUT: usize = 8;

/// One fake provider process: a queue of timed lines, and how it reacts to signals.
#[derive(Debug, Clone)]
struct Proc {
    session: SessionId,
    pid: u32,
    queue: VecDeque<Line>,
    /// `Started` was delivered to the engine.
    started: bool,
    /// It was asked whether it is ready (`AskReady`), once.
    asked_ready: bool,
    /// A slow start: its answer to the ready request comes late too.
    slow_start: bool,
    /// `Exited` (or `SpawnFailed`) is queued: nothing else will be said.
    exiting: bool,
    exit_at: Millis,
    /// TERM does nothing; only KILL ends it.
    ignore_term: bool,
    /// When TERM was sent (KILL must follow after the kill grace period, not before).
    term_at: Option<Millis>,
    killed: bool,
    /// A turn is in progress whose end was never queued (it hung, or its last line was
    /// garbage): the provider says nothing more about it until healed.
    turn_open: bool,
    /// The provider's conversation id (reported with `SessionRef`).
    conversation: String,
    calls: u64,
    /// The cursor of the last output line delivered (output is numbered 1, 2, 3, … per run).
    cursor: u64,
    /// The last output lines delivered, with their cursors (what the runner would replay).
    delivered: VecDeque<Line>,
    /// The rest of the current turn, held back while the agent waits for answers; times are
    /// given when it is released.
    held: VecDeque<Script>,
    /// The current turn's lines come seconds apart.
    slow: bool,
    /// Asks delivered that the agent waits for and has no answer to yet: key → the Ask
    /// line's cursor.
    blocked: BTreeMap<String, u64>,
    /// The keys of every Ask delivered, and the one answer each got (the agent's record:
    /// a second answer to one key is a bug).
    asked: BTreeSet<String>,
    answers: BTreeMap<String, Approval>,
    /// Answers the daemon sent at once (its policy's, stored nowhere) in a batch that its
    /// crash then lost: the ask is read again by the new daemon, which may answer otherwise
    /// (a stop came meanwhile). The agent keeps the first, as real agents ignore an answer to
    /// a request they no longer wait for.
    lost_answers: BTreeSet<String>,
}

/// What one delivered line was, for the driver's bookkeeping.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub id: SessionId,
    pub run: RunId,
    /// The line's position in the run's output (`None` for start, spawn failure, exit).
    pub cursor: Option<u64>,
    pub event: ProviderEvent,
}

/// What is due next in the world: a provider's line, or the driver's report on an environment.
#[derive(Debug, Clone)]
pub enum Due {
    Provider(Delivery),
    Environment { id: SessionId, event: EnvEvent },
}

/// An environment being made (`Effect::Provision`): when its report comes, and what it says
/// (`None`: it never comes).
#[derive(Debug, Clone)]
struct Making {
    at: Millis,
    event: Option<EnvEvent>,
}

/// The fake provider processes, keyed by run id, as the runner holds them.
///
/// When the daemon crashes, the runner either dies with it (every process dies unheard:
/// [`World::crash`] drops them) or survives it: then the processes go on in simulated time,
/// and the new daemon adopts them ([`World::alive`]) and has their output redelivered from
/// its committed cursor ([`World::redeliver`]); a process it does not adopt is stopped
/// ([`World::reap`]) and nothing it says reaches the new engine.
///
/// A process is alive, as the runner lists it, until the daemon has read its exit: a process
/// that exits while the daemon is down is still listed, with its last output and its exit
/// waiting to be read.
#[derive(Debug, Clone)]
pub struct World {
    procs: BTreeMap<RunId, Proc>,
    /// Environments the daemon is making (its own work: it dies with the daemon).
    making: BTreeMap<SessionId, Making>,
    /// The process whose exit (or spawn failure) was delivered last, as it was just before:
    /// if that delivery was the input a crash lost, the runner still has it.
    gone: Option<(RunId, Proc)>,
    /// Every (session, run) the runner has run since it last started: it refuses to start a
    /// run under an id it knows (a new daemon reserves them, `Engine::reserve_runs_through`).
    known: BTreeSet<(SessionId, RunId)>,
    faults: Faults,
    healed: bool,
    rng: Rng,
    /// The largest run id spawned by this daemon (spawns must use fresh ids).
    last_run: RunId,
    next_pid: u32,
    next_conversation: u64,
    /// Numbers the asks: approval ids and agent keys are unique across the whole run (the
    /// shell makes ULIDs), across daemon crashes too.
    next_ask: u64,
    startup_timeout_ms: u64,
    kill_grace_ms: u64,
    /// Counters for the run summary.
    pub spawns: u64,
    pub turns_scripted: u64,
    /// Exits lost with the daemon that read them, still held by the surviving runner.
    pub exits_revived: u64,
    /// Asks scripted, and answers the agents received.
    pub asks_scripted: u64,
    pub answers_received: u64,
    /// Answers sent again after a restart (and ignored by the agent).
    pub answers_repeated: u64,
    /// Second answers, different from the first, to an ask whose first answer went out in a
    /// batch a crash lost (ignored by the agent).
    pub answers_superseded: u64,
    /// Environments asked for, and how their making went.
    pub provisions: u64,
    pub provisions_failed: u64,
    pub provisions_hung: u64,
    /// Reports dropped with a daemon that crashed while it made them, or with the session's
    /// deletion.
    pub provisions_dropped: u64,
}

impl World {
    pub fn new(faults: Faults, rng: Rng, limits: &Limits) -> Self {
        World {
            procs: BTreeMap::new(),
            making: BTreeMap::new(),
            gone: None,
            known: BTreeSet::new(),
            faults,
            healed: false,
            rng,
            last_run: 0,
            next_pid: 4000,
            next_conversation: 1,
            next_ask: 0,
            startup_timeout_ms: limits.startup_timeout.millis(),
            kill_grace_ms: limits.kill_grace.millis(),
            spawns: 0,
            turns_scripted: 0,
            exits_revived: 0,
            asks_scripted: 0,
            answers_received: 0,
            answers_repeated: 0,
            answers_superseded: 0,
            provisions: 0,
            provisions_failed: 0,
            provisions_hung: 0,
            provisions_dropped: 0,
        }
    }

    fn faults(&self) -> Faults {
        if self.healed {
            self.faults.healed()
        } else {
            self.faults
        }
    }

    /// The daemon died. If the runner died with it, so did every process (PR_SET_PDEATHSIG),
    /// unheard. If the runner survived, its processes go on: one whose exit was the input in
    /// flight (`in_flight_exit`) is still listed, its exit unread; one that was only being
    /// spawned is listed if it exists at all (a spawn that fails never made a process), as
    /// started; and the signals the old daemon sent are its own business (the new one cannot
    /// know of them).
    /// The daemon crashed after it answered `key` of `run` at once, before that batch was
    /// stored (see `Proc::lost_answers`).
    pub fn answer_lost(&mut self, run: RunId, key: &str) {
        if let Some(p) = self.procs.get_mut(&run) {
            if p.answers.contains_key(key) {
                p.lost_answers.insert(key.to_string());
            }
        }
    }

    pub fn crash(&mut self, runner_survives: bool, in_flight_exit: bool) {
        self.last_run = 0;
        // The daemon made the environments itself: their making died with it (the new daemon
        // fails every session still CREATED).
        self.provisions_dropped += self.making.len() as u64;
        self.making.clear();
        let gone = self.gone.take();
        if !runner_survives {
            self.procs.clear();
            self.known.clear();
            return;
        }
        if let (true, Some((run, p))) = (in_flight_exit, gone) {
            self.procs.insert(run, p);
            self.exits_revived += 1;
        }
        self.procs.retain(|_, p| {
            !matches!(
                p.queue.front(),
                Some(Line {
                    event: ProviderEvent::SpawnFailed { .. },
                    ..
                })
            )
        });
        for p in self.procs.values_mut() {
            if !p.started {
                if let Some(Line {
                    event: ProviderEvent::Started { .. },
                    ..
                }) = p.queue.front()
                {
                    p.queue.pop_front();
                }
                p.started = true;
            }
            p.term_at = None;
            p.killed = false;
        }
    }

    /// What the surviving runner lists: every live process, as (run, session, pid).
    /// The largest run id the runner knows (run since it last started) that `named` does not
    /// contain, if any.
    pub fn max_known_run_except(&self, named: &BTreeSet<RunId>) -> Option<RunId> {
        self.known
            .iter()
            .map(|(_, r)| *r)
            .filter(|r| !named.contains(r))
            .max()
    }

    pub fn alive(&self) -> Vec<(RunId, SessionId, u32)> {
        self.procs
            .iter()
            .map(|(r, p)| (*r, p.session.clone(), p.pid))
            .collect()
    }

    /// Whether `run` has exited by `now` (its exit is waiting to be read).
    pub fn exited_by(&self, run: RunId, now: Millis) -> bool {
        self.procs
            .get(&run)
            .is_some_and(|p| p.exiting && p.exit_at <= now)
    }

    /// How many output lines of `run` the daemon has not applied (`committed` is its applied
    /// cursor): still queued, or delivered and lost with the crash.
    pub fn unread_output(&self, run: RunId, committed: u64) -> u64 {
        let Some(p) = self.procs.get(&run) else {
            return 0;
        };
        let output = |e: &ProviderEvent| {
            matches!(
                e,
                ProviderEvent::Activity(_)
                    | ProviderEvent::SessionRef(_)
                    | ProviderEvent::Ask(_)
                    | ProviderEvent::Connection { .. }
            )
        };
        let queued = p
            .queue
            .iter()
            .filter(|l| output(&l.event) && l.cursor.is_none())
            .count();
        let unapplied = p
            .delivered
            .iter()
            .filter(|l| l.cursor.is_some_and(|c| c > committed))
            .count();
        (queued + unapplied) as u64
    }

    /// A process the new daemon did not adopt is stopped, unheard.
    pub fn reap(&mut self, run: RunId) {
        self.procs.remove(&run);
    }

    /// The new daemon adopted `run` at `now`, having applied its output up to `committed`:
    /// the runner replays every output line after `from` (at most `committed`: a replay from
    /// before it tests that what was applied is not applied twice), then the rest. Returns
    /// how many lines are replayed.
    pub fn redeliver(
        &mut self,
        now: Millis,
        run: RunId,
        from: u64,
        committed: u64,
    ) -> Result<usize, String> {
        let Some(p) = self.procs.get_mut(&run) else {
            return Ok(0);
        };
        // The runner still has everything the daemon did not apply.
        let oldest = p.delivered.front().and_then(|l| l.cursor).unwrap_or(1);
        if p.cursor > committed && oldest > committed + 1 {
            return Err(format!(
                "the runner kept run {run}'s output from cursor {oldest}, but the daemon applied \
                 it only up to {committed}"
            ));
        }
        // Lines queued for redelivery by an earlier restart are replayed from the log again.
        p.queue.retain(|l| l.cursor.is_none());
        for l in p.queue.iter_mut() {
            l.at = l.at.max(now);
        }
        if p.exiting {
            p.exit_at = p.exit_at.max(now);
        }
        let mut n = 0;
        for l in p.delivered.iter().rev() {
            let c = l.cursor.expect("a delivered output line has its cursor");
            if c <= from {
                break;
            }
            let mut l = l.clone();
            l.at = now;
            // What was applied belongs to no turn the provider is still answering.
            l.of_turn = l.of_turn && c > committed;
            p.queue.push_front(l);
            n += 1;
        }
        Ok(n)
    }

    /// The run of `session` that is still alive as far as the engine can know (its last line,
    /// `Exited` or `SpawnFailed`, not yet delivered), and whether it reported `Started`.
    pub fn live_run(&self, session: &SessionId) -> Vec<(RunId, u32, bool)> {
        self.procs
            .iter()
            .filter(|(_, p)| &p.session == session)
            .map(|(r, p)| (*r, p.pid, p.started))
            .collect()
    }

    /// Every live run: (run, session).
    pub fn runs(&self) -> impl Iterator<Item = (RunId, &SessionId)> {
        self.procs.iter().map(|(r, p)| (*r, &p.session))
    }

    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// The time of the earliest queued line or environment report.
    pub fn next_at(&self) -> Option<Millis> {
        self.procs
            .values()
            .filter_map(|p| p.queue.front().map(|l| l.at))
            .chain(
                self.making
                    .values()
                    .filter(|m| m.event.is_some())
                    .map(|m| m.at),
            )
            .min()
    }

    /// Takes one line or environment report that is due at `now`, from a process (or making)
    /// chosen at random among those with one due (each process's lines stay in order;
    /// processes interleave).
    pub fn pop_due(&mut self, now: Millis, rng: &mut Rng) -> Option<Due> {
        self.pop(now, rng, None)
    }

    /// One more due output line for the daemon's batch: of a process whose session is none of
    /// `taken`, and not a process's last word (an exit is delivered in a step of its own, so
    /// a crash can catch it in flight).
    pub fn pop_more(&mut self, now: Millis, rng: &mut Rng, taken: &[SessionId]) -> Option<Due> {
        self.pop(now, rng, Some(taken))
    }

    fn pop(&mut self, now: Millis, rng: &mut Rng, taken: Option<&[SessionId]>) -> Option<Due> {
        let mut due: Vec<Option<RunId>> = self
            .procs
            .iter()
            .filter(|(_, p)| p.queue.front().is_some_and(|l| l.at <= now))
            .filter(|(_, p)| {
                taken.is_none_or(|t| {
                    !t.contains(&p.session)
                        && !matches!(
                            p.queue.front().map(|l| &l.event),
                            Some(ProviderEvent::Exited { .. } | ProviderEvent::SpawnFailed { .. })
                        )
                })
            })
            .map(|(r, _)| Some(*r))
            .collect();
        let envs: Vec<SessionId> = self
            .making
            .iter()
            .filter(|(_, m)| taken.is_none() && m.event.is_some() && m.at <= now)
            .map(|(id, _)| id.clone())
            .collect();
        due.extend(envs.iter().map(|_| None));
        if due.is_empty() {
            return None;
        }
        let i = rng.index(due.len());
        let Some(run) = due[i] else {
            let id = envs[i - (due.len() - envs.len())].clone();
            let m = self.making.remove(&id).expect("due making");
            let event = m.event.expect("a due making reports");
            return Some(Due::Environment { id, event });
        };
        let p = self.procs.get_mut(&run).expect("due process");
        let mut line = p.queue.pop_front().expect("due line");
        let id = p.session.clone();
        match line.event {
            ProviderEvent::Started { .. } => p.started = true,
            // The answer to the ready request: a control line the reader consumes (not output
            // kept for a reattach; a surviving agent is adopted as ready).
            ProviderEvent::Ready => {}
            // Not output (the daemon's write failed): no cursor, nothing to redeliver.
            ProviderEvent::DeliveryFailed { .. } => {}
            ProviderEvent::Exited { .. } | ProviderEvent::SpawnFailed { .. } => {
                debug_assert!(p.queue.is_empty(), "a process's last word is its last");
                let mut p = self.procs.remove(&run).expect("due process");
                p.queue.push_front(line.clone());
                self.gone = Some((run, p));
            }
            ProviderEvent::Activity(_)
            | ProviderEvent::SessionRef(_)
            | ProviderEvent::Ask(_)
            | ProviderEvent::OutputLost { .. }
            | ProviderEvent::Connection { .. } => {
                if line.cursor.is_none() {
                    p.cursor += 1;
                    line.cursor = Some(p.cursor);
                    p.delivered.push_back(line.clone());
                    if p.delivered.len() > KEPT_OUTPUT {
                        p.delivered.pop_front();
                    }
                }
                if let ProviderEvent::Ask(paddock_core::Ask { key, .. }) = &line.event {
                    p.asked.insert(key.clone());
                    if line.blocks && !p.answers.contains_key(key) {
                        let c = line.cursor.expect("an output line has its cursor");
                        p.blocked.insert(key.clone(), c);
                    }
                }
                // The agent's own pace: the world's stream, not the scheduler's.
                maybe_release(p, now, self.healed, &mut self.rng);
            }
        }
        Some(Due::Provider(Delivery {
            id,
            run,
            cursor: line.cursor,
            event: line.event,
        }))
    }

    /// Heals every fault: new processes behave, hung turns finish, slow lines come promptly,
    /// TERM is obeyed from now on.
    pub fn heal(&mut self, now: Millis) {
        self.healed = true;
        // A slow making reports promptly now (a hung one still never does: the start-up
        // timeout ends its session).
        for m in self.making.values_mut() {
            m.at = m.at.min(now + 20);
        }
        for p in self.procs.values_mut() {
            p.ignore_term = false;
            if p.turn_open && !p.exiting {
                p.turn_open = false;
                let done = ProviderEvent::Activity(
                    Activity::new(ActivityKind::Completion, "recovered").with_tokens(10, 10),
                );
                let waits =
                    !p.held.is_empty() || !p.blocked.is_empty() || p.queue.iter().any(|l| l.blocks);
                if !waits {
                    let at = p.queue.back().map_or(now, |l| l.at.max(now));
                    push(p, at, done, true);
                } else {
                    // It waits (or will) for answers: the turn ends after them (a hang may
                    // have cut the wait after its last ask).
                    p.held.push_back(Script::Wait);
                    p.held.push_back(Script::line(done, true));
                }
            }
            // Promptly, in order: the minimum of two non-decreasing sequences is one.
            for (i, l) in p.queue.iter_mut().enumerate() {
                l.at = l.at.min(now + 20 * (i as u64 + 1));
            }
            if let Some(last) = p.queue.back() {
                p.exit_at = p.exit_at.min(last.at);
            }
        }
    }

    // ── actions: the engine's effects, carried out ───────────────────────

    /// `Effect::Provision`: the daemon makes session `id`'s environment; the seed's faults
    /// decide now how (and whether) its report comes.
    pub fn provision(
        &mut self,
        now: Millis,
        id: &SessionId,
        config: &SessionConfig,
    ) -> Result<(), String> {
        if !config.env.needs_provisioning() {
            return Err(format!(
                "Provision for {id}, whose environment {:?} needs nothing made",
                config.env
            ));
        }
        if self.procs.values().any(|p| &p.session == id) {
            return Err(format!(
                "Provision for {id} while a process of it is still alive"
            ));
        }
        let f = self.faults();
        self.provisions += 1;
        let s = self.startup_timeout_ms.max(2);
        let at = if self.rng.per_mille(f.slow_provision) {
            now + self.rng.range(s / 2, s * 2)
        } else {
            now + self.rng.range(1, 800)
        };
        let event = if self.rng.per_mille(f.provision_hang) {
            self.provisions_hung += 1;
            None
        } else if self.rng.per_mille(f.provision_fail) {
            self.provisions_failed += 1;
            let reason = if config.env.worktree && self.rng.chance(1, 2) {
                "git worktree add: a branch named 'paddock/s' already exists"
            } else {
                "bwrap: No such file or directory (is bubblewrap installed?)"
            };
            Some(EnvEvent::ProvisionFailed {
                reason: reason.to_string(),
            })
        } else {
            Some(EnvEvent::Provisioned)
        };
        if self
            .making
            .insert(id.clone(), Making { at, event })
            .is_some()
        {
            return Err(format!(
                "Provision for {id} while its environment is still being made"
            ));
        }
        Ok(())
    }

    /// `Effect::Forget`: what the session kept outside the store is removed, its environment
    /// (and a making still under way) included.
    pub fn forget(&mut self, rec: &SessionRecord) -> Result<(), String> {
        if self.procs.values().any(|p| p.session == rec.id) {
            return Err(format!(
                "Forget of {} while a process of it is still alive",
                rec.id
            ));
        }
        if self.making.remove(&rec.id).is_some() {
            self.provisions_dropped += 1;
        }
        Ok(())
    }

    /// `Effect::Spawn`: a new process whose fate the seed's faults decide now.
    pub fn spawn(
        &mut self,
        now: Millis,
        id: &SessionId,
        run: RunId,
        spec: &SpawnSpec,
    ) -> Result<(), String> {
        if run <= self.last_run {
            return Err(format!(
                "Spawn for {id} reuses run id {run} (the last one was {})",
                self.last_run
            ));
        }
        if let Some((old, _)) = self.procs.iter().find(|(_, p)| &p.session == id) {
            return Err(format!(
                "Spawn of run {run} for {id} while its run {old} is still alive (no Exited \
                 delivered): two processes for one session"
            ));
        }
        if let Some(p) = self.procs.get(&run) {
            return Err(format!(
                "Spawn for {id} reuses run id {run}, which names a live process of {} that \
                 outlived a daemon (run ids must stay unique across restarts)",
                p.session
            ));
        }
        if let Some((s, _)) = self.known.iter().find(|(_, r)| *r == run) {
            return Err(format!(
                "Spawn for {id} reuses run id {run}, which the surviving runner remembers (a run \
                 of {s}): a new daemon must reserve every id the runner knows"
            ));
        }
        self.known.insert((id.clone(), run));
        self.last_run = run;
        self.spawns += 1;
        let f = self.faults();
        let pid = self.next_pid;
        self.next_pid += 1;
        let conversation = match &spec.resume {
            Some(c) => c.clone(),
            None => {
                self.next_conversation += 1;
                format!("conv-{}", self.next_conversation)
            }
        };
        let mut p = Proc {
            session: id.clone(),
            pid,
            queue: VecDeque::new(),
            started: false,
            asked_ready: false,
            slow_start: false,
            exiting: false,
            exit_at: Millis::MAX,
            ignore_term: self.rng.per_mille(f.ignore_term),
            term_at: None,
            killed: false,
            turn_open: false,
            conversation,
            calls: 0,
            cursor: 0,
            delivered: VecDeque::new(),
            held: VecDeque::new(),
            slow: false,
            blocked: BTreeMap::new(),
            asked: BTreeSet::new(),
            answers: BTreeMap::new(),
            lost_answers: BTreeSet::new(),
        };
        let rng = &mut self.rng;
        let quick = |rng: &mut Rng| rng.range(1, 400);
        let mut t = now;
        // A slow start delays the first answer, whatever it is (a loaded machine, a slow
        // runner): it may come after the start-up timeout.
        let slow = rng.per_mille(f.slow_start);
        p.slow_start = slow;
        let s = self.startup_timeout_ms.max(2);
        let first = |rng: &mut Rng| {
            if slow {
                rng.range(s / 2, s * 2)
            } else {
                rng.range(1, 400)
            }
        };
        if rng.per_mille(f.spawn_fail) {
            t += first(rng);
            push(&mut p, t, spawn_failed(), false);
            p.exiting = true;
        } else if rng.per_mille(f.exit_at_startup) {
            t += first(rng);
            if rng.chance(1, 2) {
                // The adapter's handshake failed: the process is gone before it was "started".
                push(&mut p, t, exited(Some(1), None, "handshake failed"), false);
            } else {
                push(&mut p, t, started(pid), false);
                t += quick(rng);
                push(&mut p, t, exited(Some(2), None, "bad flag"), false);
            }
            p.exiting = true;
        } else {
            t += first(rng);
            push(&mut p, t, started(pid), false);
            if rng.chance(3, 4) {
                t += quick(rng);
                let r = ProviderEvent::SessionRef(p.conversation.clone());
                push(&mut p, t, r, false);
            }
            if rng.per_mille(f.stray_output) {
                t += quick(rng);
                let a = Activity::new(ActivityKind::Status, "ready");
                push(&mut p, t, ProviderEvent::Activity(a), false);
            }
        }
        if p.exiting {
            p.exit_at = t;
        }
        self.procs.insert(run, p);
        Ok(())
    }

    /// `Effect::AskReady`: the agent answers once it reads its input (late, on a slow start:
    /// perhaps after the start-up timeout); one on its way out never does.
    pub fn ask_ready(&mut self, now: Millis, id: &SessionId, run: RunId) -> Result<(), String> {
        let s = self.startup_timeout_ms.max(2);
        let Some(p) = self.procs.get_mut(&run) else {
            return Err(format!(
                "AskReady to run {run} of {id}, which has exited, failed to spawn or never existed"
            ));
        };
        if &p.session != id || !p.started {
            return Err(format!(
                "AskReady for {id} addressed run {run} of {} (started: {})",
                p.session, p.started
            ));
        }
        if std::mem::replace(&mut p.asked_ready, true) {
            return Err(format!("AskReady to run {run} of {id} twice"));
        }
        if p.exiting {
            return Ok(());
        }
        let gap = if p.slow_start {
            self.rng.range(s / 2, s * 2)
        } else {
            self.rng.range(1, 400)
        };
        let at = p.queue.back().map_or(now, |l| l.at.max(now)) + gap;
        push(p, at, ProviderEvent::Ready, false);
        Ok(())
    }

    /// `Effect::Write`: one user message; the provider scripts its answer (and its faults).
    pub fn write(&mut self, now: Millis, id: &SessionId, run: RunId) -> Result<(), String> {
        let f = self.faults();
        let healed = self.healed;
        let Some(p) = self.procs.get_mut(&run) else {
            return Err(format!(
                "Write to run {run} of {id}, which has exited, failed to spawn or never existed"
            ));
        };
        if &p.session != id {
            return Err(format!(
                "Write for {id} addressed run {run} of {}",
                p.session
            ));
        }
        if !p.started {
            return Err(format!(
                "Write to run {run} of {id} before it reported Started"
            ));
        }
        // A stray final line (a duplicate) still queued from before is stale now: the adapter
        // knows a new message began and discards it, as it cannot end the new turn. One being
        // replayed after a restart is discarded from the replay too (it was read, and dropped).
        let stale: Vec<u64> = p
            .queue
            .iter()
            .filter(|l| !l.of_turn && ends_turn(&l.event))
            .filter_map(|l| l.cursor)
            .collect();
        p.queue.retain(|l| l.of_turn || !ends_turn(&l.event));
        p.delivered
            .retain(|l| !l.cursor.is_some_and(|c| stale.contains(&c)));
        if p.turn_open || p.queue.iter().any(|l| l.of_turn) {
            return Err(format!(
                "Write to run {run} of {id} while the provider is still answering the previous \
                 message: two turns at once"
            ));
        }
        if !p.held.is_empty() || !p.blocked.is_empty() {
            return Err(format!(
                "Write to run {run} of {id} while the agent waits for the answers to {:?}: a \
                 message reached a session that is WAITING",
                p.blocked.keys().collect::<Vec<_>>()
            ));
        }
        if p.exiting {
            return Ok(()); // it is dying; the message is lost with it
        }
        if self.rng.per_mille(f.stdin_closed) {
            // The write fails at once; the agent never sees the message.
            p.turn_open = true;
            let ev = ProviderEvent::DeliveryFailed {
                reason: "Broken pipe (os error 32)".into(),
            };
            queue_script(p, now, vec![Script::line(ev, false)], healed, &mut self.rng);
            return Ok(());
        }
        self.turns_scripted += 1;
        let rng = &mut self.rng;
        let mut script: Vec<Script> = Vec::new();
        for _ in 0..rng.range(0, 3) {
            if rng.chance(1, 2) {
                let a = Activity::new(ActivityKind::Thinking, "considering the request")
                    .with_tokens(0, rng.range(5, 300));
                script.push(Script::line(ProviderEvent::Activity(a), true));
            } else {
                p.calls += 1;
                let call = format!("call-{}", p.calls);
                let tool = *rng.pick(&["Read", "Bash", "Edit", "Grep"]);
                let a = Activity::new(ActivityKind::ToolCall, "{\"path\":\"src/lib.rs\"}")
                    .with_tool(tool, call.clone())
                    .with_tokens(rng.range(50, 3000), rng.range(5, 200));
                script.push(Script::line(ProviderEvent::Activity(a), true));
                let mut r = Activity::new(ActivityKind::ToolResult, "ok").with_tool(tool, call);
                r.tool_success = rng.chance(9, 10);
                script.push(Script::line(ProviderEvent::Activity(r), true));
            }
        }
        let last = if rng.per_mille(f.provider_error) {
            Activity::new(ActivityKind::Error, "rate limited").with_tokens(rng.range(10, 200), 0)
        } else {
            Activity::new(ActivityKind::Completion, "done: the change is in")
                .with_tokens(rng.range(100, 2000), rng.range(20, 800))
        };
        script.push(Script::line(ProviderEvent::Activity(last), true));
        if rng.per_mille(f.usage_jump) {
            let i = rng.index(script.len());
            if let Script::Line {
                event: ProviderEvent::Activity(a),
                ..
            } = &mut script[i]
            {
                a.tokens_output += rng.range(50_000, 500_000);
            }
        }
        if rng.per_mille(f.disconnect) {
            // Lost before some line of the turn, back before the same or a later one; both
            // before the turn's last line.
            let n = script.len();
            let lost = rng.index(n);
            let back = lost + rng.index(n - lost);
            let line = |connected: bool| {
                let note = if connected {
                    "reconnected"
                } else {
                    "connection lost"
                };
                Script::line(
                    ProviderEvent::Connection {
                        connected,
                        note: note.into(),
                    },
                    true,
                )
            };
            script.insert(back, line(true));
            script.insert(lost, line(false));
        }
        // The agent asks, at one or two points of the turn (before its last line): one or two
        // requests at once (a question and a permission, parallel tool calls), maybe a line
        // while it waits, then it waits for every answer — unless it does not wait at all.
        if rng.per_mille(f.ask) {
            for _ in 0..rng.range(1, 2) {
                let abandon = rng.per_mille(f.abandon_ask);
                let mut point = Vec::new();
                for _ in 0..rng.range(1, 2) {
                    self.next_ask += 1;
                    self.asks_scripted += 1;
                    point.push(Script::Line {
                        event: ask_event(self.next_ask, &[6, 2, 2], rng),
                        of_turn: true,
                        blocks: !abandon,
                    });
                }
                if rng.chance(1, 4) {
                    let a = Activity::new(ActivityKind::Status, "waiting for the user");
                    point.push(Script::line(ProviderEvent::Activity(a), true));
                }
                if !abandon {
                    point.push(Script::Wait);
                }
                let at = rng.index(script.len());
                script.splice(at..at, point);
            }
        }
        // Faults that cut the turn short.
        let mut turn_ends = true;
        let mut crash = false;
        if rng.per_mille(f.crash_mid_turn) {
            // It dies wherever it was, waiting or not.
            script.truncate(rng.index(script.len()));
            script.retain(|s| !matches!(s, Script::Wait));
            crash = true;
        } else if rng.per_mille(f.hang) {
            script.truncate(rng.index(script.len()));
            turn_ends = false;
        } else if rng.per_mille(f.garbage) {
            // One line the adapter cannot read (never an ask: an unreadable prompt is one the
            // agent is not waiting on).
            let lines: Vec<usize> = (0..script.len())
                .filter(|i| matches!(script[*i], Script::Line { .. }) && !script[*i].is_ask())
                .collect();
            let i = *rng.pick(&lines);
            if i == script.len() - 1 {
                turn_ends = false;
            }
            script.remove(i);
        }
        if crash {
            let ev = if rng.chance(1, 2) {
                exited(None, Some(11), "segmentation fault")
            } else {
                exited(Some(101), None, "panicked at 'index out of bounds'")
            };
            script.push(Script::line(ev, false));
        } else if !turn_ends {
            p.turn_open = true;
        } else if rng.per_mille(f.stray_output) {
            let ev = if rng.chance(1, 2) {
                // A duplicated final line (with its usage).
                Activity::new(ActivityKind::Completion, "done: the change is in")
                    .with_tokens(rng.range(100, 2000), rng.range(20, 800))
            } else {
                // A late usage report between turns (it may be what crosses the budget).
                Activity::new(ActivityKind::Status, "idle")
                    .with_tokens(rng.range(0, 3000), rng.range(0, 800))
            };
            script.push(Script::line(ProviderEvent::Activity(ev), false));
        }
        if turn_ends && !crash && rng.per_mille(f.stray_ask) {
            // A request outside any turn (a background tool's permission, a client-side tool
            // run for a hook): the agent does not block on it, but it gets its answer.
            self.next_ask += 1;
            self.asks_scripted += 1;
            script.push(Script::line(
                ask_event(self.next_ask, &[1, 0, 1], rng),
                false,
            ));
        }
        p.slow = rng.per_mille(f.slow_output);
        // Up to the first wait now; the rest when the agent has its answers.
        let wait = script
            .iter()
            .position(|s| matches!(s, Script::Wait))
            .unwrap_or(script.len());
        p.held = script.split_off(wait).into();
        p.held.pop_front(); // the wait itself
        queue_script(p, now, script, healed, rng);
        Ok(())
    }

    /// `Effect::Answer`: the agent gets the answer to its request `key`. Only the process
    /// that asked may get it, once; once every request it waits for is answered, its turn
    /// goes on.
    pub fn answer(
        &mut self,
        now: Millis,
        id: &SessionId,
        run: RunId,
        approval: &Approval,
    ) -> Result<(), String> {
        let healed = self.healed;
        let Some(p) = self.procs.get_mut(&run) else {
            return Err(format!(
                "Answer to {} ({}) for run {run} of {id}, which has exited, failed to spawn or \
                 never existed",
                approval.key, approval.id
            ));
        };
        if &p.session != id || approval.session != *id || approval.run != run {
            return Err(format!(
                "Answer for {id} addressed run {run} of {}: {approval:?}",
                p.session
            ));
        }
        if !p.asked.contains(&approval.key) {
            return Err(format!(
                "Answer to run {run} of {id} for {}, which that run never asked: {approval:?}",
                approval.key
            ));
        }
        if let Some(first) = p.answers.get(&approval.key) {
            // An answer sent again after a daemon restart (at least once): the same answer is
            // ignored, as real agents ignore an answer to a request they no longer wait for.
            if first.id == approval.id
                && first.state == approval.state
                && first.allowed == approval.allowed
                && first.answer == approval.answer
            {
                self.answers_repeated += 1;
                return Ok(());
            }
            if p.lost_answers.contains(&approval.key) {
                self.answers_superseded += 1;
                return Ok(());
            }
            return Err(format!(
                "a second Answer to run {run} of {id} for {}: first {} ({}), now {} ({})",
                approval.key,
                first.state.name(),
                first.resolved_by,
                approval.state.name(),
                approval.resolved_by
            ));
        }
        self.answers_received += 1;
        p.answers.insert(approval.key.clone(), approval.clone());
        p.blocked.remove(&approval.key);
        maybe_release(p, now, healed, &mut self.rng);
        Ok(())
    }

    /// Every ask an agent waits on and has no answer to: (run, session, key, the cursor of its
    /// line). The driver checks the engine holds each one open once it applied that line.
    pub fn blocked(&self) -> Vec<(RunId, SessionId, String, u64)> {
        let mut out = Vec::new();
        for (run, p) in &self.procs {
            for (key, c) in &p.blocked {
                out.push((*run, p.session.clone(), key.clone(), *c));
            }
        }
        out
    }

    /// `Effect::Signal`: TERM ends the process after a moment (unless it ignores TERM); KILL
    /// ends it at once. What it had written before it died is still read.
    pub fn signal(
        &mut self,
        now: Millis,
        id: &SessionId,
        run: RunId,
        pid: Option<u32>,
        signal: Signal,
    ) -> Result<(), String> {
        let healed = self.healed;
        let Some(p) = self.procs.get_mut(&run) else {
            return Err(format!(
                "Signal {signal:?} to run {run} of {id}, which has exited, failed to spawn or \
                 never existed"
            ));
        };
        if &p.session != id {
            return Err(format!(
                "Signal for {id} addressed run {run} of {}",
                p.session
            ));
        }
        if !p.started {
            return Err(format!(
                "Signal {signal:?} to run {run} of {id} before it reported Started"
            ));
        }
        if pid != Some(p.pid) {
            return Err(format!(
                "Signal {signal:?} to run {run} of {id} names pid {pid:?}; the process is {}",
                p.pid
            ));
        }
        match (signal, p.term_at) {
            (Signal::Term, None) => p.term_at = Some(now),
            (Signal::Term, Some(_)) => {
                return Err(format!("a second TERM to run {run} of {id}"));
            }
            (Signal::Kill, Some(t)) if now >= t + self.kill_grace_ms && !p.killed => {
                p.killed = true;
            }
            (Signal::Hup, _) => {
                return Err(format!(
                    "HUP to run {run} of {id}: a session's process is only ever TERMed and KILLed"
                ));
            }
            (Signal::Kill, t) => {
                return Err(format!(
                    "KILL to run {run} of {id} at {now}: TERM was sent at {t:?}, the kill grace \
                     period is {} ms (and KILL comes once)",
                    self.kill_grace_ms
                ));
            }
        }
        let (delay, sig) = match signal {
            Signal::Term if p.ignore_term && !healed => return Ok(()),
            Signal::Term => (self.rng.range(1, 2_000), signal.number()),
            // (HUP was refused above.)
            Signal::Kill | Signal::Hup => (self.rng.range(0, 50), signal.number()),
        };
        let at = now + delay;
        if p.exiting && p.exit_at <= at {
            return Ok(());
        }
        p.queue
            .retain(|l| l.at <= at && !matches!(l.event, ProviderEvent::Exited { .. }));
        p.turn_open = false;
        p.held.clear();
        p.blocked.clear();
        p.exiting = true;
        p.exit_at = p.queue.back().map_or(at, |l| l.at.max(at));
        let ev = exited(None, Some(sig), "");
        let exit_at = p.exit_at;
        push(p, exit_at, ev, false);
        Ok(())
    }
}

impl World {
    /// `Effect::CloseInput`: the end of the agent's input. Most agents read it and exit, at
    /// once or after what they still had to say; one that ignores TERM ignores this too.
    pub fn close_input(&mut self, now: Millis, id: &SessionId, run: RunId) -> Result<(), String> {
        let healed = self.healed;
        let Some(p) = self.procs.get_mut(&run) else {
            return Err(format!(
                "CloseInput to run {run} of {id}, which has exited, failed to spawn or never \
                 existed"
            ));
        };
        if &p.session != id || !p.started {
            return Err(format!(
                "CloseInput for {id} addressed run {run} of {} (started: {})",
                p.session, p.started
            ));
        }
        if p.term_at.is_some() {
            return Err(format!("CloseInput to run {run} of {id} after its TERM"));
        }
        if p.exiting || (p.ignore_term && !healed) || p.turn_open {
            return Ok(()); // gone soon anyway, or it does not listen (TERM will come)
        }
        let at = now + self.rng.range(0, 1_500);
        p.exiting = true;
        p.exit_at = p.queue.back().map_or(at, |l| l.at.max(at));
        let exit_at = p.exit_at;
        push(p, exit_at, exited(Some(0), None, ""), false);
        Ok(())
    }

    /// After a Tick: every process TERMed a kill grace period ago and not yet reaped was KILLed.
    pub fn check_kills(&self, now: Millis) -> Result<(), String> {
        for (run, p) in &self.procs {
            if let (Some(t), false) = (p.term_at, p.killed) {
                if now >= t + self.kill_grace_ms {
                    return Err(format!(
                        "run {run} of {} was TERMed at {t} and is not reaped, but no KILL came by \
                         {now} (kill grace {} ms)",
                        p.session, self.kill_grace_ms
                    ));
                }
            }
        }
        Ok(())
    }
}

fn push(p: &mut Proc, at: Millis, event: ProviderEvent, of_turn: bool) {
    debug_assert!(p.queue.back().is_none_or(|l| l.at <= at));
    p.queue.push_back(Line {
        at,
        event,
        of_turn,
        cursor: None,
        blocks: false,
    });
}

/// Queues the lines of `script` (no waits in it) after whatever is queued, each a gap after the
/// one before; an exit among them is the process's last word.
fn queue_script(p: &mut Proc, now: Millis, script: Vec<Script>, healed: bool, rng: &mut Rng) {
    let slow = p.slow && !healed;
    let mut t = p.queue.back().map_or(now, |l| l.at.max(now));
    for s in script {
        let Script::Line {
            event,
            of_turn,
            blocks,
        } = s
        else {
            continue;
        };
        t += if slow {
            rng.range(1_000, 30_000)
        } else if healed {
            rng.range(1, 20)
        } else {
            rng.range(1, 800)
        };
        let exit = matches!(event, ProviderEvent::Exited { .. });
        p.queue.push_back(Line {
            at: t,
            event,
            of_turn,
            cursor: None,
            blocks,
        });
        if exit {
            p.exiting = true;
            p.exit_at = t;
            p.held.clear();
            return;
        }
    }
}

/// The agent goes on with its turn once every request it waits for is answered and the part
/// of the turn before the wait is all out.
fn maybe_release(p: &mut Proc, now: Millis, healed: bool, rng: &mut Rng) {
    if p.held.is_empty() || !p.blocked.is_empty() || p.exiting || p.queue.iter().any(|l| l.of_turn)
    {
        return;
    }
    let mut next = Vec::new();
    while let Some(s) = p.held.pop_front() {
        if matches!(s, Script::Wait) {
            // Two ask points spliced into one place wait once.
            if next.is_empty() {
                continue;
            }
            p.held.push_front(s);
            break;
        }
        next.push(s);
    }
    queue_script(p, now, next, healed, rng);
}

/// A request the agent makes: permission prompts for tools (some a policy allows, denies or
/// asks about), questions, client-side tools, in proportion to `weights`.
fn ask_event(n: u64, weights: &[u32; 3], rng: &mut Rng) -> ProviderEvent {
    let kind = match rng.weighted(weights) {
        0 => AskKind::Permission,
        1 => AskKind::Question,
        _ => AskKind::ClientTool,
    };
    let tool = match kind {
        AskKind::Permission => *rng.pick(&["Read", "Bash", "Edit", "Grep", "Write"]),
        AskKind::Question => "AskUserQuestion",
        AskKind::ClientTool => "client.open_file",
    };
    ProviderEvent::Ask(paddock_core::Ask {
        approval: format!("ap{n:05}"),
        key: format!("k{n}"),
        kind,
        tool: tool.to_string(),
        input: "{\"command\":\"cargo test\"}".to_string(),
        summary: format!("{tool}: cargo test"),
    })
}

fn ends_turn(e: &ProviderEvent) -> bool {
    matches!(e, ProviderEvent::Activity(a) if a.kind().ends_turn())
}

fn started(pid: u32) -> ProviderEvent {
    ProviderEvent::Started { pid: Some(pid) }
}

fn spawn_failed() -> ProviderEvent {
    ProviderEvent::SpawnFailed {
        reason: "No such file or directory (os error 2)".to_string(),
    }
}

fn exited(code: Option<i32>, signal: Option<i32>, stderr: &str) -> ProviderEvent {
    ProviderEvent::Exited {
        code,
        signal,
        stderr_tail: stderr.to_string(),
    }
}
