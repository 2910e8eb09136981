//! The simulation loop: one seed, three phases.
//!
//! 1. **Chaos.** Each step does one thing: the daemon crashes (maybe with an input in flight),
//!    the client acts, a due provider line or deadline is fed, or the clock jumps to the next
//!    one and it is fed. After every step every invariant is checked.
//! 2. **Liveness.** Every fault heals; the client only stops sessions. Within a bounded number of
//!    steps every session must be idle (RUNNING, no turn) or terminal.
//! 3. **Drain.** Every live session is force-stopped. Within a bounded number of steps every
//!    session must be terminal, every process reaped, every deadline gone and every request
//!    answered.

use std::collections::BTreeSet;
use std::fmt;

use paddock_core::session::table::{InputKind, Rule};
use paddock_core::{
    Effect, Engine, ErrorCode, Input, Limits, Millis, ProviderEvent, Run, SessionId, Status, Step,
};

use crate::client::{Action, Client};
use crate::log::{EventLog, LogMode};
use crate::log_entry;
use crate::model::{diff, Cause, EventKind, Model, ModelStats};
use crate::rng::Rng;
use crate::world::{pick_limits, Faults, Store, World, T0};

/// How to run one seed.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub log: LogMode,
    /// Steps of the chaos phase; by default the seed picks (80..=260).
    pub chaos_steps: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            log: LogMode::Off,
            chaos_steps: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Chaos,
    Liveness,
    Drain,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Chaos => "chaos",
            Phase::Liveness => "liveness",
            Phase::Drain => "drain",
        })
    }
}

/// How often each (status, input) pair was looked up in the transition table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coverage {
    hits: [u64; Status::ALL.len() * InputKind::ALL.len()],
}

impl Default for Coverage {
    fn default() -> Self {
        Coverage {
            hits: [0; Status::ALL.len() * InputKind::ALL.len()],
        }
    }
}

impl Coverage {
    fn index(status: Status, input: InputKind) -> usize {
        let s = Status::ALL
            .iter()
            .position(|x| *x == status)
            .expect("status");
        let i = InputKind::ALL
            .iter()
            .position(|x| *x == input)
            .expect("input");
        s * InputKind::ALL.len() + i
    }

    pub fn add(&mut self, step: &Step) {
        self.hits[Self::index(step.status, step.input)] += 1;
    }

    pub fn merge(&mut self, other: &Coverage) {
        for (a, b) in self.hits.iter_mut().zip(other.hits.iter()) {
            *a += b;
        }
    }

    pub fn hits(&self, status: Status, input: InputKind) -> u64 {
        self.hits[Self::index(status, input)]
    }

    /// The transition table as Markdown with, in every legal cell, how often it was reached.
    pub fn render(&self) -> String {
        let mut out = String::from("| status |");
        for i in InputKind::ALL {
            out.push_str(&format!(" {} |", i.name()));
        }
        out.push_str("\n|---|");
        for _ in InputKind::ALL {
            out.push_str("---|");
        }
        out.push('\n');
        for s in Status::ALL {
            out.push_str(&format!("| {} |", s.name()));
            for i in InputKind::ALL {
                let cell = match paddock_core::session::table::rule(s, i) {
                    Rule::Legal => match self.hits(s, i) {
                        0 => "**never**".to_string(),
                        n => n.to_string(),
                    },
                    Rule::Refuse(code) => format!("{code} ({})", self.hits(s, i)),
                    Rule::Ignore => match self.hits(s, i) {
                        0 => "·".to_string(),
                        n => format!("· ({n})"),
                    },
                };
                out.push_str(&format!(" {cell} |"));
            }
            out.push('\n');
        }
        out
    }

    /// The legal pairs of the transition table never reached.
    pub fn unreached(&self) -> Vec<(Status, InputKind)> {
        paddock_core::session::table::legal_pairs()
            .into_iter()
            .filter(|(s, i)| self.hits(*s, *i) == 0)
            .collect()
    }
}

/// What one seed did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub steps: u64,
    pub sessions: u64,
    pub crashes: u64,
    /// Crashes with an input in flight (its transaction lost).
    pub crashes_mid_step: u64,
    pub spawns: u64,
    pub turns_scripted: u64,
    /// Simulated time the run covered.
    pub sim_ms: Millis,
    pub model: ModelStats,
}

/// A seed that passed.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub seed: u64,
    pub faults: Faults,
    pub limits: Limits,
    pub stats: Stats,
    /// The hash of the event log (0 when the log is off).
    pub hash: u64,
    pub coverage: Coverage,
}

/// A seed that broke an invariant. `Display` is the one line that replays it.
#[derive(Debug, Clone)]
pub struct Failure {
    pub seed: u64,
    pub step: u64,
    pub phase: Phase,
    /// What went wrong (one line).
    pub invariant: String,
    pub faults: Faults,
    pub limits: Limits,
    /// The last entries of the event log (only when it was kept as text).
    pub log_tail: Vec<String>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = &self.limits;
        write!(
            f,
            "sim failed: seed={} step={} phase={} | {} | faults: {} | limits: stop_grace={}ms \
             kill_grace={}ms startup={}ms max_live={} | replay: PADDOCK_SIM_SEED={} cargo test \
             -p sim --test sweep",
            self.seed,
            self.step,
            self.phase,
            self.invariant.replace('\n', " "),
            self.faults,
            l.stop_grace_ms,
            l.kill_grace_ms,
            l.startup_timeout_ms,
            l.max_live_sessions,
            self.seed
        )
    }
}

/// Runs one seed to the end (or to its first broken invariant).
pub fn run_seed(seed: u64, opts: &Options) -> Result<Outcome, Box<Failure>> {
    let mut sim = Sim::new(seed, opts);
    let chaos_steps = opts.chaos_steps.unwrap_or_else(|| sim.rng.range(80, 260));
    match sim.run(chaos_steps) {
        Ok(()) => Ok(Outcome {
            seed,
            faults: sim.faults,
            limits: sim.limits.clone(),
            stats: sim.stats(),
            hash: sim.log.hash(),
            coverage: sim.coverage,
        }),
        Err(invariant) => Err(Box::new(Failure {
            seed,
            step: sim.step,
            phase: sim.phase,
            invariant,
            faults: sim.faults,
            limits: sim.limits.clone(),
            log_tail: sim.log.tail(80),
        })),
    }
}

/// The fault settings a seed picks, without running it.
pub fn faults_of(seed: u64) -> (Faults, Limits) {
    let mut root = Rng::new(seed);
    let mut setup = root.fork(1);
    let faults = Faults::pick(&mut setup);
    let limits = pick_limits(&mut setup);
    (faults, limits)
}

/// What one step does. (Built and consumed once per step: boxing the input would buy nothing.)
#[allow(clippy::large_enum_variant)]
enum Next {
    Input(Input, Cause),
    Read(Action),
    Idle,
}

struct Sim {
    /// The scheduler's choices (what happens next).
    rng: Rng,
    faults: Faults,
    limits: Limits,
    now: Millis,
    engine: Engine,
    store: Store,
    world: World,
    client: Client,
    model: Model,
    log: EventLog,
    coverage: Coverage,
    step: u64,
    phase: Phase,
    /// How often (per mille of steps) the client acts in the chaos phase.
    client_rate: u32,
    crashes: u64,
    crashes_mid_step: u64,
}

impl Sim {
    fn new(seed: u64, opts: &Options) -> Sim {
        let mut root = Rng::new(seed);
        let mut setup = root.fork(1);
        let faults = Faults::pick(&mut setup);
        let limits = pick_limits(&mut setup);
        let client_rate = setup.range(150, 500) as u32;
        let world = World::new(faults, root.fork(2), &limits);
        let client = Client::new(root.fork(3));
        let rng = root.fork(4);
        let mut engine = Engine::new(limits.clone());
        engine.set_trace(true);
        let mut log = EventLog::new(opts.log);
        log_entry!(log, "seed {seed} faults: {faults} limits: {limits:?}");
        Sim {
            rng,
            faults,
            model: Model::new(limits.clone()),
            limits,
            now: T0,
            engine,
            store: Store::default(),
            world,
            client,
            log,
            coverage: Coverage::default(),
            step: 0,
            phase: Phase::Chaos,
            client_rate,
            crashes: 0,
            crashes_mid_step: 0,
        }
    }

    fn stats(&self) -> Stats {
        Stats {
            steps: self.step,
            sessions: self.model.sessions().count() as u64,
            crashes: self.crashes,
            crashes_mid_step: self.crashes_mid_step,
            spawns: self.world.spawns,
            turns_scripted: self.world.turns_scripted,
            sim_ms: self.now - T0,
            model: self.model.stats,
        }
    }

    fn run(&mut self, chaos_steps: u64) -> Result<(), String> {
        // 1. Safety under faults.
        for _ in 0..chaos_steps {
            self.step += 1;
            if self.rng.per_10k(self.faults.daemon_crash) {
                let in_flight = if self.rng.per_mille(self.faults.crash_mid_step) {
                    match self.next(self.client_rate) {
                        Next::Input(input, cause) => Some((input, cause)),
                        _ => None,
                    }
                } else {
                    None
                };
                self.crash(in_flight)?;
                continue;
            }
            match self.next(self.client_rate) {
                Next::Input(input, cause) => self.feed(input, cause)?,
                Next::Read(action) => self.read(&action)?,
                Next::Idle => {}
            }
        }

        // 2. Liveness: heal, only stops, everyone settles.
        self.phase = Phase::Liveness;
        log_entry!(self.log, "== liveness: faults healed");
        self.world.heal(self.now);
        self.client.only_stops();
        let bound = 100 + 40 * self.model.sessions().count() as u64;
        let mut steps = 0;
        while !self.model.unsettled().is_empty() {
            if steps == bound {
                return Err(format!(
                    "liveness: {bound} steps after healing, these sessions are neither idle nor \
                     terminal: {:?}",
                    self.model.unsettled()
                ));
            }
            steps += 1;
            self.step += 1;
            match self.next(20) {
                Next::Input(input, cause) => self.feed(input, cause)?,
                Next::Read(action) => self.read(&action)?,
                Next::Idle => {
                    return Err(format!(
                        "liveness: nothing will ever happen again (no process output, no \
                         deadline), yet these sessions are neither idle nor terminal: {:?}",
                        self.model.unsettled()
                    ))
                }
            }
        }

        // 3. Drain: stop everything; every process reaped, every request answered. A session
        // can come back to life after it was passed over (a restart asked for while it was
        // FAILED starts once its old process is gone): it is stopped again, once per start.
        self.phase = Phase::Drain;
        log_entry!(self.log, "== drain: every live session force-stopped");
        let mut stopped: BTreeSet<(SessionId, u32)> = BTreeSet::new();
        let mut steps = 0;
        loop {
            let live: Vec<_> = self
                .model
                .sessions()
                .filter(|(id, s)| {
                    !s.status.is_terminal() && !stopped.contains(&((*id).clone(), s.starts))
                })
                .map(|(id, s)| (id.clone(), s.starts))
                .collect();
            self.step += 1;
            if let Some((id, starts)) = live.into_iter().next() {
                stopped.insert((id.clone(), starts));
                let req = self.client.req();
                let input = Input::Stop {
                    req,
                    id,
                    graceful: false,
                };
                let cause = self.model.on_request(&input);
                self.feed(input, cause)?;
            } else {
                match self.next(0) {
                    Next::Input(input, cause) => self.feed(input, cause)?,
                    Next::Read(action) => self.read(&action)?,
                    Next::Idle => break,
                }
            }
            steps += 1;
            if steps == bound {
                return Err(format!(
                    "drain: {bound} steps after stopping everything, processes or deadlines are \
                     still pending (sessions {:?})",
                    self.model.unsettled()
                ));
            }
        }
        self.check_drained()
    }

    // ── choosing the next step ───────────────────────────────────────────

    fn next(&mut self, client_rate: u32) -> Next {
        if self.rng.per_mille(client_rate) {
            return self.client_action();
        }
        if let Some(n) = self.due() {
            return n;
        }
        let deadline = self.engine.poll_timeout().map(|(at, _, _)| at);
        let next = match (self.world.next_at(), deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if let Some(at) = next {
            self.jump(at);
            return self.due().expect("something is due at the time jumped to");
        }
        if self.phase == Phase::Chaos {
            self.client_action()
        } else {
            Next::Idle
        }
    }

    /// A due provider line or deadline, if any.
    fn due(&mut self) -> Option<Next> {
        let tick_due = self
            .engine
            .poll_timeout()
            .is_some_and(|(at, _, _)| at <= self.now);
        let line_due = self.world.next_at().is_some_and(|at| at <= self.now);
        let tick = match (tick_due, line_due) {
            (false, false) => {
                // Now and then a tick with nothing due (it must change nothing).
                if self.phase == Phase::Chaos && self.rng.chance(1, 100) {
                    true
                } else {
                    return None;
                }
            }
            (true, false) => true,
            (false, true) => false,
            (true, true) => self.rng.chance(1, 3),
        };
        if tick {
            return Some(Next::Input(Input::Tick, Cause::Tick));
        }
        let d = self.world.pop_due(self.now, &mut self.rng)?;
        let (event, activity) = match &d.event {
            ProviderEvent::Started { .. } => (EventKind::Started, None),
            ProviderEvent::SpawnFailed { .. } => (EventKind::SpawnFailed, None),
            ProviderEvent::Activity(a) if a.kind().ends_turn() => {
                (EventKind::TurnEnd, Some(a.clone()))
            }
            ProviderEvent::Activity(a) => (EventKind::Activity, Some(a.clone())),
            ProviderEvent::SessionRef(_) => (EventKind::SessionRef, None),
            ProviderEvent::Exited { .. } => (EventKind::Exited, None),
        };
        let cause = Cause::Provider {
            id: d.id.clone(),
            run: d.run,
            event,
            activity,
        };
        Some(Next::Input(
            Input::Provider {
                id: d.id,
                run: d.run,
                event: d.event,
            },
            cause,
        ))
    }

    fn client_action(&mut self) -> Next {
        // Think time: the clock may move on before the client acts, but never past the next
        // event (the clock jumps from event to event).
        if self.rng.chance(1, 3) {
            let mut until = self.now + self.rng.range(0, 5_000);
            if let Some(at) = self.world.next_at() {
                until = until.min(at.max(self.now));
            }
            if let Some((at, _, _)) = self.engine.poll_timeout() {
                until = until.min(at.max(self.now));
            }
            self.jump(until);
        }
        match self.client.act(&self.model) {
            Action::Request(input) => {
                let cause = self.model.on_request(&input);
                Next::Input(*input, cause)
            }
            action => Next::Read(action),
        }
    }

    fn jump(&mut self, to: Millis) {
        debug_assert!(to >= self.now, "time never goes backwards");
        if to > self.now {
            log_entry!(self.log, "clock +{}ms -> t+{}", to - self.now, to - T0);
            self.now = to;
        }
    }

    // ── doing it ─────────────────────────────────────────────────────────

    fn feed(&mut self, input: Input, cause: Cause) -> Result<(), String> {
        log_entry!(
            self.log,
            "#{} t+{} in {:?}",
            self.step,
            self.now - T0,
            input
        );
        let tick = matches!(input, Input::Tick);
        let due_before = self
            .engine
            .poll_timeout()
            .is_some_and(|(at, _, _)| at <= self.now);
        let effects = self.engine.handle(self.now, input);
        let trace = self.take_trace();
        if tick && !due_before && !effects.is_empty() {
            return Err(format!(
                "a Tick with no deadline due had effects: {effects:?}"
            ));
        }
        check_table(&cause, &trace, &effects)?;
        self.apply(&cause, &effects, tick)?;
        if tick {
            self.world.check_kills(self.now)?;
            if let Some((at, id, t)) = self.engine.poll_timeout() {
                if at <= self.now {
                    return Err(format!(
                        "a Tick at t+{} left a due deadline unfired: {} of {id} at t+{}",
                        self.now - T0,
                        t.reason(),
                        at - T0
                    ));
                }
            }
        }
        Ok(())
    }

    /// One batch of effects: commit its persists (one transaction), check it against the
    /// model, carry out its actions, then check the whole state.
    fn apply(&mut self, cause: &Cause, effects: &[Effect], tick: bool) -> Result<(), String> {
        if self.log.on() {
            for e in effects {
                log_entry!(self.log, "   out {e:?}");
            }
        }
        self.store.commit(effects)?;
        self.model.on_batch(self.now, cause, effects, &self.store)?;
        for e in effects {
            match e {
                Effect::Spawn { id, run, spec } => self.world.spawn(self.now, id, *run, spec)?,
                Effect::Write { id, run, .. } => self.world.write(self.now, id, *run)?,
                Effect::Signal {
                    id,
                    run,
                    pid,
                    signal,
                } => self.world.signal(self.now, id, *run, *pid, *signal)?,
                _ => {}
            }
        }
        self.model.check(&self.engine, &self.store, tick)?;
        self.check_processes()
    }

    fn take_trace(&mut self) -> Vec<Step> {
        let trace = self.engine.take_trace();
        for step in &trace {
            self.coverage.add(step);
        }
        trace
    }

    /// The daemon dies (maybe in the middle of `in_flight`, whose transaction is then lost)
    /// and a new one is built from the store.
    fn crash(&mut self, in_flight: Option<(Input, Cause)>) -> Result<(), String> {
        self.crashes += 1;
        if let Some((input, _)) = in_flight {
            log_entry!(
                self.log,
                "#{} t+{} in {input:?} -- and the daemon crashes before committing",
                self.step,
                self.now - T0
            );
            self.crashes_mid_step += 1;
            let _lost = self.engine.handle(self.now, input);
            let _ = self.take_trace();
        } else {
            log_entry!(
                self.log,
                "#{} t+{} the daemon crashes",
                self.step,
                self.now - T0
            );
        }
        self.world.crash();
        self.model.on_crash(&self.store)?;
        let down = self.rng.range(50, 5_000);
        self.jump(self.now + down);
        let records = self.store.records();
        let (mut engine, effects) = Engine::restore(self.limits.clone(), self.now, records.clone());
        engine.set_trace(true);
        self.engine = engine;
        log_entry!(self.log, "   restored {} sessions", records.len());
        self.check_restored(&records)?;
        self.apply(&Cause::Restore, &effects, false)
    }

    /// The restored engine holds exactly what the store said, with every session that was
    /// active FAILED with OBEY-2032.
    fn check_restored(&self, records: &[paddock_core::SessionRecord]) -> Result<(), String> {
        if self.engine.sessions().count() != records.len() {
            return Err(format!(
                "restore: the store has {} sessions, the rebuilt engine {}",
                records.len(),
                self.engine.sessions().count()
            ));
        }
        for rec in records {
            let Some(s) = self.engine.session(&rec.id) else {
                return Err(format!("restore lost {}", rec.id));
            };
            let mut want = rec.clone();
            // The old daemon's processes died with it: no record names one.
            want.pid = None;
            if !rec.status.is_terminal() {
                want.status = Status::Failed;
                want.ended_at = Some(self.now);
                want.last_status_seq += 1;
                match &s.record.error {
                    Some(e) if e.code == ErrorCode::ConnectionLost => want.error = Some(e.clone()),
                    other => {
                        return Err(format!(
                            "restore: {} was {} and came back with error {other:?}, not \
                             OBEY-2032",
                            rec.id, rec.status
                        ))
                    }
                }
            }
            if s.record != want {
                return Err(format!(
                    "restore: {} differs from what the store said: {}",
                    rec.id,
                    diff(&want, &s.record)
                ));
            }
            if s.run() != Run::Idle || s.turn().is_some() {
                return Err(format!(
                    "restore: {} came back with a process {:?} or a turn {:?}",
                    rec.id,
                    s.run(),
                    s.turn()
                ));
            }
        }
        if let Some((_, id, t)) = self.engine.poll_timeout() {
            return Err(format!(
                "restore: a fresh engine has a deadline: {t:?} of {id}"
            ));
        }
        Ok(())
    }

    /// A read by the client: what the engine reports must be what the client has seen.
    fn read(&mut self, action: &Action) -> Result<(), String> {
        log_entry!(
            self.log,
            "#{} t+{} read {action:?}",
            self.step,
            self.now - T0
        );
        match action {
            Action::Watch(id) => {
                let got = self.engine.session(id).map(|s| s.status());
                if got != self.model.status(id) {
                    return Err(format!(
                        "watch {id}: the engine says {got:?}, the client saw {:?}",
                        self.model.status(id)
                    ));
                }
            }
            Action::List => {
                let ids: Vec<_> = self.engine.sessions().map(|s| &s.record.id).collect();
                let seen: Vec<_> = self.model.sessions().map(|(id, _)| id).collect();
                if ids != seen {
                    return Err(format!(
                        "list: the engine lists {ids:?}, the client saw {seen:?}"
                    ));
                }
                if self.engine.live_sessions() != self.model.live() {
                    return Err(format!(
                        "list: the engine counts {} live sessions, the client saw {}",
                        self.engine.live_sessions(),
                        self.model.live()
                    ));
                }
            }
            Action::Request(_) => unreachable!("requests are fed"),
        }
        Ok(())
    }

    /// Every process the engine believes in exists in the world, in the state it believes,
    /// and the world has no process the engine forgot.
    fn check_processes(&self) -> Result<(), String> {
        for s in self.engine.sessions() {
            let id = &s.record.id;
            let procs = self.world.live_run(id);
            let ok = match (s.run(), procs.as_slice()) {
                (Run::Idle, []) => true,
                (Run::Spawning { run }, [(r, _, false)]) => *r == run,
                (Run::Alive { run, pid } | Run::Terminating { run, pid, .. }, [(r, p, true)]) => {
                    *r == run && pid == Some(*p)
                }
                _ => false,
            };
            if !ok {
                return Err(format!(
                    "{id} ({}): the engine's process is {:?}, the world's (run, pid, started) \
                     {procs:?} — a process the engine lost track of, or one it thinks alive \
                     that is gone",
                    s.status(),
                    s.run()
                ));
            }
        }
        for (run, id) in self.world.runs() {
            if self.engine.session(id).is_none() {
                return Err(format!(
                    "run {run} belongs to {id}, which the engine does not know"
                ));
            }
        }
        Ok(())
    }

    /// The end: everything stopped, reaped, answered.
    fn check_drained(&self) -> Result<(), String> {
        let unanswered = self.model.unanswered();
        if !unanswered.is_empty() {
            return Err(format!("drain: requests never answered: {unanswered:?}"));
        }
        for s in self.engine.sessions() {
            if !s.status().is_terminal() || s.run() != Run::Idle || s.turn().is_some() {
                return Err(format!(
                    "drain: {} ended {} with process {:?} and turn {:?}",
                    s.record.id,
                    s.status(),
                    s.run(),
                    s.turn()
                ));
            }
        }
        if !self.world.is_empty() {
            return Err("drain: provider processes are still running".to_string());
        }
        if let Some((_, id, t)) = self.engine.poll_timeout() {
            return Err(format!(
                "drain: a deadline outlived everything: {t:?} of {id}"
            ));
        }
        Ok(())
    }
}

/// The table is what the engine does: a request the table refuses gets exactly one reply, an
/// error with the table's code, and nothing else; a provider event the table ignores changes
/// nothing.
fn check_table(cause: &Cause, trace: &[Step], effects: &[Effect]) -> Result<(), String> {
    match cause {
        Cause::Request { req, .. } => {
            let refused = trace.iter().find_map(|s| match s.rule {
                Rule::Refuse(code) => Some((s, code)),
                _ => None,
            });
            if let Some((step, code)) = refused {
                let ok = matches!(
                    effects,
                    [Effect::Reply { req: r, result: Err(e) }] if r == req && e.code == code
                );
                if !ok {
                    return Err(format!(
                        "the table refuses ({}, {}) with {code}, but the engine did {effects:?}",
                        step.status,
                        step.input.name()
                    ));
                }
            }
        }
        Cause::Provider { .. } => {
            if let Some(step) = trace.iter().find(|s| s.rule == Rule::Ignore) {
                if !effects.is_empty() {
                    return Err(format!(
                        "the table ignores ({}, {}), but the engine did {effects:?}",
                        step.status,
                        step.input.name()
                    ));
                }
            }
        }
        Cause::Tick | Cause::Restore => {}
    }
    Ok(())
}
