//! The world around the engine: the fault settings a seed picks, the fake store (what the
//! daemon's database has committed) and the fake provider processes.
//!
//! The clock itself is one `Millis` in the driver: it only moves forward, and it jumps from one
//! event to the next (the next provider line, or the engine's next deadline).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use paddock_core::{
    Activity, ActivityKind, Effect, Limits, Millis, ProviderEvent, Record, RunId, SessionId,
    SessionRecord, Signal, SpawnSpec,
};

use crate::rng::Rng;

/// Where simulated time starts (an arbitrary Unix time); logs print offsets from it.
pub const T0: Millis = 1_700_000_000_000;

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
        Faults {
            spawn_fail: f(20, 300),
            exit_at_startup: f(20, 300),
            slow_start: f(20, 400),
            crash_mid_turn: f(20, 300),
            hang: f(20, 300),
            garbage: f(20, 300),
            slow_output: f(20, 500),
            usage_jump: f(20, 300),
            provider_error: f(20, 300),
            ignore_term: f(50, 700),
            stray_output: f(20, 400),
            daemon_crash: f(10, 300),
            crash_mid_step: f(100, 900),
            runner_survives: f(200, 1000),
        }
    }
}

impl fmt::Display for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "spawn_fail={} exit_at_startup={} slow_start={} crash_mid_turn={} hang={} \
             garbage={} slow_output={} usage_jump={} provider_error={} ignore_term={} \
             stray_output={} (per mille) daemon_crash={}/10k steps crash_mid_step={} \
             runner_survives={}",
            self.spawn_fail,
            self.exit_at_startup,
            self.slow_start,
            self.crash_mid_turn,
            self.hang,
            self.garbage,
            self.slow_output,
            self.usage_jump,
            self.provider_error,
            self.ignore_term,
            self.stray_output,
            self.daemon_crash,
            self.crash_mid_step,
            self.runner_survives
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
    Limits {
        stop_grace_ms,
        kill_grace_ms,
        startup_timeout_ms,
        max_live_sessions,
    }
}

// ── the fake store ────────────────────────────────────────────────────────

/// Row counters of one session's append-only tables.
#[derive(Debug, Clone, Copy, Default)]
struct Rows {
    status_seq: u64,
    activity_seq: u64,
    message_turn: u64,
}

/// What the daemon's database has committed. The driver commits a step's persists at the end
/// of the step, as the shell does (one transaction); a crash loses exactly the uncommitted
/// step, never anything committed.
#[derive(Debug, Clone, Default)]
pub struct Store {
    pub sessions: BTreeMap<SessionId, SessionRecord>,
    rows: BTreeMap<SessionId, Rows>,
    /// Rows committed so far (records, activities, status changes, messages).
    pub committed: u64,
}

impl Store {
    /// Applies the persists among `effects` as one transaction. Appends must continue their
    /// table's sequence exactly (no gap, no repeat).
    pub fn commit(&mut self, effects: &[Effect]) -> Result<(), String> {
        for e in effects {
            let Effect::Persist(r) = e else { continue };
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
            }
        }
        // Every session row written in this transaction must agree with the appends.
        for e in effects {
            if let Effect::Persist(Record::Session(rec)) = e {
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
        }
        Ok(())
    }

    /// Every committed session record, in id order (what a restarted daemon loads).
    pub fn records(&self) -> Vec<SessionRecord> {
        self.sessions.values().cloned().collect()
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
    startup_timeout_ms: u64,
    kill_grace_ms: u64,
    /// Counters for the run summary.
    pub spawns: u64,
    pub turns_scripted: u64,
    /// Exits lost with the daemon that read them, still held by the surviving runner.
    pub exits_revived: u64,
}

impl World {
    pub fn new(faults: Faults, rng: Rng, limits: &Limits) -> Self {
        World {
            procs: BTreeMap::new(),
            gone: None,
            known: BTreeSet::new(),
            faults,
            healed: false,
            rng,
            last_run: 0,
            next_pid: 4000,
            next_conversation: 1,
            startup_timeout_ms: limits.startup_timeout_ms,
            kill_grace_ms: limits.kill_grace_ms,
            spawns: 0,
            turns_scripted: 0,
            exits_revived: 0,
        }
    }

    fn faults(&self) -> Faults {
        if self.healed {
            Faults::default()
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
    pub fn crash(&mut self, runner_survives: bool, in_flight_exit: bool) {
        self.last_run = 0;
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
            matches!(e, ProviderEvent::Activity(_) | ProviderEvent::SessionRef(_))
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

    /// The time of the earliest queued line.
    pub fn next_at(&self) -> Option<Millis> {
        self.procs
            .values()
            .filter_map(|p| p.queue.front().map(|l| l.at))
            .min()
    }

    /// Takes one line that is due at `now`, from a process chosen at random among those with
    /// a due line (each process's lines stay in order; processes interleave).
    pub fn pop_due(&mut self, now: Millis, rng: &mut Rng) -> Option<Delivery> {
        let due: Vec<RunId> = self
            .procs
            .iter()
            .filter(|(_, p)| p.queue.front().is_some_and(|l| l.at <= now))
            .map(|(r, _)| *r)
            .collect();
        if due.is_empty() {
            return None;
        }
        let run = *rng.pick(&due);
        let p = self.procs.get_mut(&run).expect("due process");
        let mut line = p.queue.pop_front().expect("due line");
        let id = p.session.clone();
        match line.event {
            ProviderEvent::Started { .. } => p.started = true,
            ProviderEvent::Exited { .. } | ProviderEvent::SpawnFailed { .. } => {
                debug_assert!(p.queue.is_empty(), "a process's last word is its last");
                let mut p = self.procs.remove(&run).expect("due process");
                p.queue.push_front(line.clone());
                self.gone = Some((run, p));
            }
            ProviderEvent::Activity(_) | ProviderEvent::SessionRef(_) => {
                if line.cursor.is_none() {
                    p.cursor += 1;
                    line.cursor = Some(p.cursor);
                    p.delivered.push_back(line.clone());
                    if p.delivered.len() > KEPT_OUTPUT {
                        p.delivered.pop_front();
                    }
                }
            }
        }
        Some(Delivery {
            id,
            run,
            cursor: line.cursor,
            event: line.event,
        })
    }

    /// Heals every fault: new processes behave, hung turns finish, slow lines come promptly,
    /// TERM is obeyed from now on.
    pub fn heal(&mut self, now: Millis) {
        self.healed = true;
        for p in self.procs.values_mut() {
            p.ignore_term = false;
            if p.turn_open && !p.exiting {
                p.turn_open = false;
                let at = p.queue.back().map_or(now, |l| l.at.max(now));
                p.queue.push_back(Line {
                    at,
                    event: ProviderEvent::Activity(
                        Activity::new(ActivityKind::Completion, "recovered").with_tokens(10, 10),
                    ),
                    of_turn: true,
                    cursor: None,
                });
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
        };
        let rng = &mut self.rng;
        let quick = |rng: &mut Rng| rng.range(1, 400);
        let mut t = now;
        // A slow start delays the first answer, whatever it is (a loaded machine, a slow
        // runner): it may come after the start-up timeout.
        let slow = rng.per_mille(f.slow_start);
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

    /// `Effect::Write`: one user message; the provider scripts its answer (and its faults).
    pub fn write(&mut self, now: Millis, id: &SessionId, run: RunId) -> Result<(), String> {
        let f = self.faults();
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
        if p.exiting {
            return Ok(()); // it is dying; the message is lost with it
        }
        self.turns_scripted += 1;
        let rng = &mut self.rng;
        let slow = rng.per_mille(f.slow_output);
        let mut lines: Vec<ProviderEvent> = Vec::new();
        for _ in 0..rng.range(0, 3) {
            if rng.chance(1, 2) {
                let a = Activity::new(ActivityKind::Thinking, "considering the request")
                    .with_tokens(0, rng.range(5, 300));
                lines.push(ProviderEvent::Activity(a));
            } else {
                p.calls += 1;
                let call = format!("call-{}", p.calls);
                let tool = *rng.pick(&["Read", "Bash", "Edit", "Grep"]);
                let a = Activity::new(ActivityKind::ToolCall, "{\"path\":\"src/lib.rs\"}")
                    .with_tool(tool, call.clone())
                    .with_tokens(rng.range(50, 3000), rng.range(5, 200));
                lines.push(ProviderEvent::Activity(a));
                let mut r = Activity::new(ActivityKind::ToolResult, "ok").with_tool(tool, call);
                r.tool_success = rng.chance(9, 10);
                lines.push(ProviderEvent::Activity(r));
            }
        }
        let last = if rng.per_mille(f.provider_error) {
            Activity::new(ActivityKind::Error, "rate limited").with_tokens(rng.range(10, 200), 0)
        } else {
            Activity::new(ActivityKind::Completion, "done: the change is in")
                .with_tokens(rng.range(100, 2000), rng.range(20, 800))
        };
        lines.push(ProviderEvent::Activity(last));
        if rng.per_mille(f.usage_jump) {
            let i = rng.index(lines.len());
            if let ProviderEvent::Activity(a) = &mut lines[i] {
                a.tokens_output += rng.range(50_000, 500_000);
            }
        }
        // Faults that cut the turn short.
        let mut turn_ends = true;
        let mut crash = false;
        if rng.per_mille(f.crash_mid_turn) {
            lines.truncate(rng.index(lines.len()));
            crash = true;
        } else if rng.per_mille(f.hang) {
            lines.truncate(rng.index(lines.len()));
            turn_ends = false;
        } else if rng.per_mille(f.garbage) {
            let i = rng.index(lines.len());
            if i == lines.len() - 1 {
                turn_ends = false;
            }
            lines.remove(i);
        }
        let mut t = p.queue.back().map_or(now, |l| l.at.max(now));
        let gap = |rng: &mut Rng| {
            if slow {
                rng.range(1_000, 30_000)
            } else {
                rng.range(1, 800)
            }
        };
        for ev in lines {
            t += gap(rng);
            push(p, t, ev, true);
        }
        if crash {
            t += gap(rng);
            let ev = if rng.chance(1, 2) {
                exited(None, Some(11), "segmentation fault")
            } else {
                exited(Some(101), None, "panicked at 'index out of bounds'")
            };
            push(p, t, ev, false);
            p.exiting = true;
            p.exit_at = t;
        } else if !turn_ends {
            p.turn_open = true;
        } else if rng.per_mille(f.stray_output) {
            t += gap(rng);
            let ev = if rng.chance(1, 2) {
                // A duplicated final line (with its usage).
                Activity::new(ActivityKind::Completion, "done: the change is in")
                    .with_tokens(rng.range(100, 2000), rng.range(20, 800))
            } else {
                // A late usage report between turns (it may be what crosses the budget).
                Activity::new(ActivityKind::Status, "idle")
                    .with_tokens(rng.range(0, 3000), rng.range(0, 800))
            };
            push(p, t, ProviderEvent::Activity(ev), false);
        }
        Ok(())
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
            Signal::Term => (self.rng.range(1, 2_000), 15),
            Signal::Kill => (self.rng.range(0, 50), 9),
        };
        let at = now + delay;
        if p.exiting && p.exit_at <= at {
            return Ok(());
        }
        p.queue
            .retain(|l| l.at <= at && !matches!(l.event, ProviderEvent::Exited { .. }));
        p.turn_open = false;
        p.exiting = true;
        p.exit_at = p.queue.back().map_or(at, |l| l.at.max(at));
        let ev = exited(None, Some(sig), "");
        let exit_at = p.exit_at;
        push(p, exit_at, ev, false);
        Ok(())
    }
}

impl World {
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
    });
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
