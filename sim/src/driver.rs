//! The simulation loop: one seed, three phases.
//!
//! 1. **Chaos.** Each step does one thing: the daemon crashes (maybe with an input in flight;
//!    its runner surviving or not, see [`crate`]), the client acts, a due provider line or
//!    deadline is fed, or the clock jumps to the next one and it is fed. After every step every
//!    invariant is checked.
//! 2. **Liveness.** Every fault heals; the client only stops sessions. Within a bounded number of
//!    steps every session must be idle (RUNNING, no turn) or terminal.
//! 3. **Drain.** Every live session is force-stopped. Within a bounded number of steps every
//!    session must be terminal, every process reaped, every deadline gone and every request
//!    answered.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use paddock_core::budget::timeout_deadline;
use paddock_core::process::Life;
use paddock_core::session::table::{InputKind, Rule};
use paddock_core::{
    Approval, ApprovalId, Deadline, Effect, Engine, EnvEvent, EnvState, ErrorCode, Input, Instant,
    Limits, ProviderEvent, Run, RunId, SessionId, SessionRecord, Signal, Status, Step, Stored,
    Surviving, Timer,
};

use crate::client::{Action, Client};
use crate::log::{EventLog, LogMode};
use crate::log_entry;
use crate::model::{diff, AskSeen, Cause, EventKind, Model, ModelStats};
use crate::ports::SimPorts;
use crate::rng::Rng;
use crate::world::{at, now, ts, Millis};
use crate::world::{pick_limits, Due, Faults, Store, World, T0};
use paddock_core::Record;
use paddock_exec::Executor;

/// How to run one seed.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    pub log: LogMode,
    /// Steps of the chaos phase; by default the seed picks (80..=260).
    pub chaos_steps: Option<u64>,
    /// How many of the event log's last entries a failure keeps (`PADDOCK_SIM_TAIL` in the
    /// sweep; the library reads no environment).
    pub log_tail_entries: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            log: LogMode::Off,
            chaos_steps: None,
            log_tail_entries: 80,
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

/// How often each (status, input) pair was looked up in the transition table, and how often
/// a restarted daemon found a session in each (status, adopted, turn open) case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coverage {
    hits: [u64; Status::ALL.len() * InputKind::ALL.len()],
    restores: [u64; Status::ALL.len() * 4],
}

impl Default for Coverage {
    fn default() -> Self {
        Coverage {
            hits: [0; Status::ALL.len() * InputKind::ALL.len()],
            restores: [0; Status::ALL.len() * 4],
        }
    }
}

/// The restart cases that can happen: (committed status, process adopted, turn open). Every
/// one must be reached by the CI set. (A STOPPED session has no process to adopt; a turn is
/// open only while WORKING, WAITING or STOPPING; a session WAITING without a turn was asked
/// something between turns; a CREATED one is making its environment and has no process.)
pub const RESTART_CASES: [(Status, bool, bool); 18] = [
    (Status::Starting, true, false),
    (Status::Running, true, false),
    (Status::Working, true, true),
    (Status::Waiting, true, true),
    (Status::Waiting, true, false),
    (Status::Stopping, true, false),
    (Status::Stopping, true, true),
    (Status::Failed, true, false),
    (Status::Created, false, false),
    (Status::Starting, false, false),
    (Status::Running, false, false),
    (Status::Working, false, true),
    (Status::Waiting, false, true),
    (Status::Waiting, false, false),
    (Status::Stopping, false, false),
    (Status::Stopping, false, true),
    (Status::Stopped, false, false),
    (Status::Failed, false, false),
];

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
        for (a, b) in self.restores.iter_mut().zip(other.restores.iter()) {
            *a += b;
        }
    }

    fn restore_index(status: Status, adopted: bool, turn_open: bool) -> usize {
        let s = Status::ALL
            .iter()
            .position(|x| *x == status)
            .expect("status");
        s * 4 + usize::from(adopted) * 2 + usize::from(turn_open)
    }

    pub fn add_restore(&mut self, status: Status, adopted: bool, turn_open: bool) {
        self.restores[Self::restore_index(status, adopted, turn_open)] += 1;
    }

    /// How often a restarted daemon found a session `status` (as committed), its process
    /// adopted or not, with a turn open or not.
    pub fn restores(&self, status: Status, adopted: bool, turn_open: bool) -> u64 {
        self.restores[Self::restore_index(status, adopted, turn_open)]
    }

    /// The restart cases as Markdown: one row per case, with how often it was reached.
    pub fn render_restores(&self) -> String {
        let mut out =
            String::from("| committed status | process | turn | restores |\n|---|---|---|---|\n");
        for (s, adopted, open) in RESTART_CASES {
            out.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                s.name(),
                if adopted { "adopted" } else { "lost" },
                if open { "open" } else { "-" },
                match self.restores(s, adopted, open) {
                    0 => "**never**".to_string(),
                    n => n.to_string(),
                }
            ));
        }
        out
    }

    /// The restart cases never reached.
    pub fn unreached_restores(&self) -> Vec<(Status, bool, bool)> {
        RESTART_CASES
            .into_iter()
            .filter(|(s, a, o)| self.restores(*s, *a, *o) == 0)
            .collect()
    }

    pub fn hits(&self, status: Status, input: InputKind) -> u64 {
        self.hits[Self::index(status, input)]
    }

    /// The transition table as Markdown with, in every legal cell, how often it was reached.
    pub fn render(&self) -> String {
        paddock_core::grid::render(
            "status",
            &Status::ALL,
            &InputKind::ALL,
            Status::name,
            InputKind::name,
            |s, i| match paddock_core::session::table::rule(s, i) {
                Rule::Legal => match self.hits(s, i) {
                    0 => "**never**".to_string(),
                    n => n.to_string(),
                },
                Rule::Refuse(code) => format!("{code} ({})", self.hits(s, i)),
                Rule::Ignore => match self.hits(s, i) {
                    0 => "·".to_string(),
                    n => format!("· ({n})"),
                },
            },
        )
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
    /// Crashes the runner survived (its processes adopted by the new daemon).
    pub runner_survived: u64,
    /// Processes the new daemons adopted.
    pub adopted: u64,
    /// Output lines replayed to a new daemon (applied before the crash, or not).
    pub redelivered: u64,
    /// Processes the runner still had that no record named (stopped unheard).
    pub orphans: u64,
    /// Runs the runner listed that their session no longer had (not to be adopted).
    pub stale_listed: u64,
    /// Settled sessions let go (`Engine::evict_settled`), and recalled when named again.
    pub evicted: u64,
    pub recalled: u64,
    /// Runs that exited while the daemon was down, not listed (only running ones were).
    pub finished_unlisted: u64,
    /// Output lines of those runs that were never applied.
    pub output_unread: u64,
    /// Exits in flight at a crash that the surviving runner delivered again.
    pub exits_revived: u64,
    pub spawns: u64,
    pub turns_scripted: u64,
    /// Asks the fake agents made, and answers they received.
    pub asks_scripted: u64,
    pub answers_received: u64,
    /// Environments asked for; of them, made to fail, never reported, and dropped unreported
    /// (the daemon crashed while it made them, or the session was deleted).
    pub provisions: u64,
    pub provisions_failed: u64,
    pub provisions_hung: u64,
    pub provisions_dropped: u64,
    /// Whether the daemon was shut down (at the end of the chaos phase), and agents spawned
    /// after that.
    pub shutdowns: u64,
    pub spawns_after_shutdown: u64,
    /// Batches of more than one input (one commit for all), and the inputs they held.
    pub batches: u64,
    pub batched: u64,
    /// Of those, batches led by a client's request.
    pub request_batches: u64,
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
            l.stop_grace.millis(),
            l.kill_grace.millis(),
            l.startup_timeout.millis(),
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
            log_tail: sim.log.tail(opts.log_tail_entries),
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
    /// The daemon's executor (`paddock_exec`) with its engine, run on fake ports.
    exec: Executor,
    /// The world of processes and the store, as the executor's ports.
    io: SimPorts,
    client: Client,
    model: Model,
    log: EventLog,
    coverage: Coverage,
    step: u64,
    phase: Phase,
    /// How often (per mille of steps) the client acts in the chaos phase.
    client_rate: u32,
    /// How often (per mille of output lines and requests) the daemon takes more lines of
    /// other sessions due at the same moment into the same batch (0 on half the seeds).
    batching: u32,
    /// Batches of more than one input, and the inputs they held.
    batches: u64,
    batched: u64,
    request_batches: u64,
    /// The chaos phase ends with the daemon's shutdown (graceful or not), on some seeds:
    /// every live session stopped at once, those making their environment included.
    shutdown: Option<bool>,
    /// Agents spawned after the shutdown (a restart that waited for its old process).
    spawns_after_shutdown: u64,
    crashes: u64,
    crashes_mid_step: u64,
    runner_survived: u64,
    adopted: u64,
    redelivered: u64,
    orphans: u64,
    stale_listed: u64,
    evicted: u64,
    finished_unlisted: u64,
    output_unread: u64,
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
        let mut end = root.fork(5);
        let shutdown = end.chance(1, 3).then(|| end.chance(1, 2));
        let mut batch = root.fork(6);
        let batching = if batch.chance(1, 2) {
            batch.range(200, 1000) as u32
        } else {
            0
        };
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
            exec: Executor::new(engine),
            io: SimPorts::new(world),
            client,
            log,
            coverage: Coverage::default(),
            step: 0,
            phase: Phase::Chaos,
            client_rate,
            batching,
            batches: 0,
            batched: 0,
            request_batches: 0,
            shutdown,
            spawns_after_shutdown: 0,
            crashes: 0,
            crashes_mid_step: 0,
            runner_survived: 0,
            adopted: 0,
            redelivered: 0,
            orphans: 0,
            stale_listed: 0,
            evicted: 0,
            finished_unlisted: 0,
            output_unread: 0,
        }
    }

    fn stats(&self) -> Stats {
        Stats {
            steps: self.step,
            sessions: self.model.sessions().count() as u64,
            crashes: self.crashes,
            crashes_mid_step: self.crashes_mid_step,
            runner_survived: self.runner_survived,
            adopted: self.adopted,
            redelivered: self.redelivered,
            orphans: self.orphans,
            stale_listed: self.stale_listed,
            evicted: self.evicted,
            recalled: self.io.recalled,
            finished_unlisted: self.finished_unlisted,
            output_unread: self.output_unread,
            exits_revived: self.io.world.exits_revived,
            spawns: self.io.world.spawns,
            turns_scripted: self.io.world.turns_scripted,
            asks_scripted: self.io.world.asks_scripted,
            answers_received: self.io.world.answers_received,
            provisions: self.io.world.provisions,
            provisions_failed: self.io.world.provisions_failed,
            provisions_hung: self.io.world.provisions_hung,
            provisions_dropped: self.io.world.provisions_dropped,
            shutdowns: u64::from(self.shutdown.is_some()),
            spawns_after_shutdown: self.spawns_after_shutdown,
            batches: self.batches,
            batched: self.batched,
            request_batches: self.request_batches,
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

        // The daemon is asked to shut down (on some seeds): every live session is stopped,
        // nobody waiting for those stops; nothing new is created afterwards.
        if let Some(graceful) = self.shutdown {
            self.step += 1;
            let req = self.client.req();
            let cause = self.model.on_shutdown(req, graceful);
            self.feed(Input::Shutdown { req, graceful }, cause)?;
        }

        // 2. Liveness: heal, only stops, everyone settles.
        self.phase = Phase::Liveness;
        log_entry!(self.log, "== liveness: faults healed");
        self.io.world.heal(self.now);
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
        let deadline = self.engine_deadline().map(|(at, _)| at);
        let next = match (self.io.world.next_at(), deadline) {
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
        let tick_due = self.engine_deadline().is_some_and(|(at, _)| at <= self.now);
        let line_due = self.io.world.next_at().is_some_and(|at| at <= self.now);
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
        let d = match self.io.world.pop_due(self.now, &mut self.rng)? {
            Due::Provider(d) => d,
            Due::Environment { id, event } => {
                let cause = Cause::Environment {
                    id: id.clone(),
                    ok: matches!(event, EnvEvent::Provisioned),
                };
                return Some(Next::Input(Input::Environment { id, event }, cause));
            }
        };
        let (input, cause) = provider_step(d);
        Some(Next::Input(input, cause))
    }

    /// More output lines due by now, of other sessions than `first`'s, for the same batch (as
    /// the daemon takes what is queued, up to its bound, into one commit): on the seed's share
    /// of steps, up to 3 more.
    ///
    /// `first` is an output line or a client's request. After a line, the daemon may be a
    /// moment late and take what came meanwhile. A request takes only lines already due: the
    /// model predicted its outcome from the state before the batch, which is the state it runs
    /// in only because it runs first and at the time it was made. (A request behind other
    /// inputs of its batch would need the model to know their effects before the commit.)
    ///
    /// The lines are of other sessions than the first input's: the model checks each input
    /// against its table from the status before the batch, and the world lets an agent drop a
    /// stray final line still queued when a message is written (a line taken into the batch
    /// ahead of the message's write could not be dropped).
    fn more_due(&mut self, first: &(Input, Cause)) -> Vec<(Input, Cause)> {
        let mut more = Vec::new();
        let own = match first {
            (Input::Provider { id, .. }, _) => id.clone(),
            (_, Cause::Request { id, .. } | Cause::Report { id, .. }) => id.clone(),
            _ => return more,
        };
        if self.phase != Phase::Chaos || !self.rng.per_mille(self.batching) {
            return more;
        }
        if matches!(first.0, Input::Provider { .. }) {
            // The daemon is a moment late to the line: what came meanwhile (but not past a
            // deadline of its own) is queued behind it.
            let mut until = self.now + self.rng.range(0, 250);
            if let Some((at, _)) = self.engine_deadline() {
                until = until.min(at.max(self.now));
            }
            self.jump(until);
        }
        let mut taken = vec![own];
        for _ in 0..self.rng.range(1, 3) {
            let Some(Due::Provider(d)) = self.io.world.pop_more(self.now, &mut self.rng, &taken)
            else {
                break;
            };
            taken.push(d.id.clone());
            more.push(provider_step(d));
        }
        more
    }
}

/// The input and cause of one output line the world delivers.
fn provider_step(d: crate::world::Delivery) -> (Input, Cause) {
    {
        let ask = match &d.event {
            ProviderEvent::Ask(paddock_core::Ask {
                approval,
                key,
                kind,
                tool,
                ..
            }) => Some(Box::new(AskSeen {
                approval: approval.clone(),
                key: key.clone(),
                kind: *kind,
                tool: tool.clone(),
            })),
            _ => None,
        };
        let (event, activity) = match &d.event {
            ProviderEvent::Started { .. } => (EventKind::Started, None),
            ProviderEvent::Ready => (EventKind::Ready, None),
            ProviderEvent::Ask(_) => (EventKind::Ask, None),
            ProviderEvent::SpawnFailed { .. } => (EventKind::SpawnFailed, None),
            ProviderEvent::Activity(a) if a.kind().ends_turn() => {
                (EventKind::TurnEnd, Some(a.clone()))
            }
            ProviderEvent::Activity(a) => (EventKind::Activity, Some(a.clone())),
            ProviderEvent::SessionRef(_) => (EventKind::SessionRef, None),
            ProviderEvent::Exited { .. } => (EventKind::Exited, None),
            ProviderEvent::OutputLost { .. } => (EventKind::OutputLost, None),
            ProviderEvent::DeliveryFailed { .. } => (EventKind::DeliveryFailed, None),
            // A change of the mark is recorded as this STATUS note (and a repeat as nothing).
            ProviderEvent::Connection { note, .. } => (
                EventKind::Connection,
                Some(paddock_core::Activity::new(
                    paddock_core::ActivityKind::Status,
                    note.clone(),
                )),
            ),
        };
        let session_ref = match &d.event {
            ProviderEvent::SessionRef(r) => Some(r.clone()),
            _ => None,
        };
        let cause = Cause::Provider {
            id: d.id.clone(),
            run: d.run,
            cursor: d.cursor,
            event,
            activity,
            session_ref,
            ask,
        };
        (
            Input::Provider {
                id: d.id,
                run: d.run,
                cursor: d.cursor,
                event: d.event,
            },
            cause,
        )
    }
}

impl Sim {
    fn client_action(&mut self) -> Next {
        // Think time: the clock may move on before the client acts, but never past the next
        // event (the clock jumps from event to event).
        if self.rng.chance(1, 3) {
            let mut until = self.now + self.rng.range(0, 5_000);
            if let Some(at) = self.io.world.next_at() {
                until = until.min(at.max(self.now));
            }
            if let Some((at, _)) = self.engine_deadline() {
                until = until.min(at.max(self.now));
            }
            self.jump(until);
        }
        match self.client.act(&self.model) {
            Action::Request(mut input) => {
                // As the shell does: a Resolve carries the store's copy of its request.
                if let Input::Resolve {
                    approval, stored, ..
                } = input.as_mut()
                {
                    *stored = self.io.store.approvals.get(approval).cloned().map(Box::new);
                }
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

    /// One step: `input`, with (on the seed's share of output lines) more lines of other
    /// sessions due at the same moment, in one batch.
    fn feed(&mut self, input: Input, cause: Cause) -> Result<(), String> {
        let mut batch = vec![(input, cause)];
        let more = self.more_due(&batch[0]);
        if !more.is_empty() {
            self.batches += 1;
            self.batched += 1 + more.len() as u64;
            if matches!(batch[0].1, Cause::Request { .. }) {
                self.request_batches += 1;
            }
        }
        batch.extend(more);
        self.feed_batch(batch)
    }

    /// The daemon's executor over one batch: for each input in order, the settled session it
    /// names is recalled from the store first (`Input::recalls`), then the input runs and its
    /// effects are carried out on the ports (processes at once); then the batch's records are
    /// committed in one transaction and what waited for them delivered.
    fn feed_batch(&mut self, batch: Vec<(Input, Cause)>) -> Result<(), String> {
        let tick = batch.len() == 1 && matches!(batch[0].0, Input::Tick);
        let due_before = self.engine_deadline().is_some_and(|(at, _)| at <= self.now);
        self.io.now = self.now;
        let mut done = Vec::with_capacity(batch.len());
        for (input, cause) in batch {
            log_entry!(
                self.log,
                "#{} t+{} in {:?}",
                self.step,
                self.now - T0,
                input
            );
            self.exec.push(input, &mut self.io)?;
            self.exec.run(&mut self.io);
            let effects = std::mem::take(&mut self.io.observed);
            let trace = self.take_trace();
            if tick && !due_before && !effects.is_empty() {
                return Err(format!(
                    "a Tick with no deadline due had effects: {effects:?}"
                ));
            }
            check_table(&cause, &trace, &effects, &self.io.store)?;
            done.push((cause, effects));
        }
        self.commit(&done, tick)?;
        // Committed: what the step settled goes back to the store, as the shell lets it go.
        self.evicted += self.exec.evict_settled().len() as u64;
        if tick {
            self.io.world.check_kills(self.now)?;
            if let Some((at, why)) = self.engine_deadline() {
                if at <= self.now {
                    return Err(format!(
                        "a Tick at t+{} left a due deadline unfired: {why:?} at t+{}",
                        self.now - T0,
                        at - T0
                    ));
                }
            }
        }
        Ok(())
    }

    /// The batch's commit through the executor (its records in one transaction, then what
    /// waited for them), each input's effects checked against the model in order, then the
    /// whole state checked.
    fn commit(&mut self, batch: &[(Cause, Vec<Effect>)], tick: bool) -> Result<(), String> {
        if self.log.on() {
            for e in batch.iter().flat_map(|(_, fx)| fx) {
                log_entry!(self.log, "   out {e:?}");
            }
        }
        // A batch of several inputs is checked input by input against the store as it was
        // right after each (a reply carries its own input's record, not the batch's last).
        let before = (batch.len() > 1).then(|| self.io.store.clone());
        self.exec.commit(&mut self.io)?;
        if let Some(failure) = self.io.failure.take() {
            return Err(failure);
        }
        if self.exec.engine().is_shutting_down() {
            if let Some(Effect::Spawn { id, run, .. }) = batch
                .iter()
                .flat_map(|(_, fx)| fx)
                .find(|e| matches!(e, Effect::Spawn { .. }))
            {
                self.spawns_after_shutdown += 1;
                return Err(format!(
                    "{id}: an agent was spawned after the shutdown (run {run})"
                ));
            }
        }
        match before {
            None => {
                for (cause, effects) in batch {
                    self.model
                        .on_batch(self.now, cause, effects, &self.io.store)?;
                }
            }
            Some(mut view) => {
                for (cause, effects) in batch {
                    let records: Vec<_> = effects
                        .iter()
                        .filter_map(|e| match e {
                            Effect::Persist(r) => Some(r.clone()),
                            _ => None,
                        })
                        .collect();
                    view.commit(&records)?;
                    self.model.on_batch(self.now, cause, effects, &view)?;
                }
                if view != self.io.store {
                    return Err(
                        "the batch's transaction stored other records than its inputs, applied \
                         one after another"
                            .into(),
                    );
                }
            }
        }
        self.model.check(self.exec.engine(), &self.io.store, tick)?;
        self.check_processes()?;
        self.check_blocked()
    }

    /// Every agent that waits for an answer is waited for: once the engine applied its ask
    /// (and its process is still the session's, not being killed), the request is open, so
    /// a human, its expiry, or the session's end will answer it. (A process being killed, or
    /// gone, is owed nothing.)
    fn check_blocked(&self) -> Result<(), String> {
        for (run, id, key, cursor) in self.io.world.blocked() {
            let Some(s) = self.exec.engine().session(&id) else {
                continue; // checked by check_processes: no process outlives its session
            };
            let alive = matches!(
                s.run(),
                Run::Live { run: r, life: Life::Alive { .. } } if r == run
            );
            if !alive || s.record.provider_cursor < cursor {
                continue; // being killed, or its ask not yet applied (replayed after a crash)
            }
            if !s.pending().iter().any(|a| a.run == run && a.key == key) {
                return Err(format!(
                    "run {run} of {id} waits for the answer to {key} (asked at cursor {cursor}), \
                     but the session ({}) has no open request for it: the agent would wait \
                     forever",
                    s.status()
                ));
            }
        }
        Ok(())
    }

    /// The engine's next deadline, on the simulator's one clock.
    fn engine_deadline(&self) -> Option<(Millis, Deadline)> {
        self.exec
            .engine()
            .poll_timeout()
            .map(|(at, why)| (at.millis(), why))
    }

    fn take_trace(&mut self) -> Vec<Step> {
        let trace = self.exec.engine_mut().take_trace();
        for step in &trace {
            self.coverage.add(step);
        }
        trace
    }

    /// The daemon dies (maybe in the middle of `in_flight`, whose transaction is then lost)
    /// and a new one is built from the store. If the runner survives, the new daemon adopts
    /// the processes it lists whose records name them, and their output is replayed from the
    /// committed cursor (or a little before it).
    fn crash(&mut self, in_flight: Option<(Input, Cause)>) -> Result<(), String> {
        self.crashes += 1;
        // The open requests as committed (the input in flight is lost with its transaction).
        let open_before: BTreeMap<SessionId, BTreeSet<ApprovalId>> = self
            .exec
            .engine()
            .sessions()
            .map(|s| {
                let ids = s.pending().iter().map(|a| a.id.clone()).collect();
                (s.record.id.clone(), ids)
            })
            .collect();
        let mut in_flight_exit = false;
        if let Some((input, _)) = in_flight {
            log_entry!(
                self.log,
                "#{} t+{} in {input:?} -- and the daemon crashes before committing",
                self.step,
                self.now - T0
            );
            self.crashes_mid_step += 1;
            in_flight_exit = matches!(
                input,
                Input::Provider {
                    event: ProviderEvent::Exited { .. },
                    ..
                }
            );
            // The executor did what it does before a commit (a spawn, a write, a signal):
            // those reached the world; the records never reach the store.
            self.io.now = self.now;
            self.exec.push(input, &mut self.io)?;
            self.exec.run(&mut self.io);
            for e in std::mem::take(&mut self.io.observed) {
                if let Effect::Answer {
                    run,
                    approval,
                    at_once: true,
                    ..
                } = e
                {
                    self.io.world.answer_lost(run, &approval.key);
                }
            }
            let _ = self.take_trace();
            if let Some(failure) = self.io.failure.take() {
                return Err(failure);
            }
        } else {
            log_entry!(
                self.log,
                "#{} t+{} the daemon crashes",
                self.step,
                self.now - T0
            );
        }
        let survives = self.rng.per_mille(self.faults.runner_survives);
        if survives {
            self.runner_survived += 1;
            log_entry!(self.log, "   the runner survives: its processes go on");
        }
        self.io.world.crash(survives, in_flight_exit);
        self.model.on_crash(&self.io.store)?;
        let down = self.rng.range(50, 5_000);
        self.jump(self.now + down);

        // What the runner lists, and which of it the new daemon will adopt: a process whose
        // session's committed record names its run. Either every run whose exit the daemon
        // has not read (its last output and its exit are replayed), or only those whose process
        // is still running (as the shell lists them now): one that exited while the daemon was
        // down is then not adopted, and what it said last is never read.
        let only_running = survives && self.rng.chance(1, 2);
        let mut surviving: BTreeMap<(SessionId, RunId), Option<u32>> = BTreeMap::new();
        let mut adopt: BTreeMap<SessionId, (RunId, u32)> = BTreeMap::new();
        for (run, id, pid) in self.io.world.alive() {
            if only_running && self.io.world.exited_by(run, self.now) {
                log_entry!(
                    self.log,
                    "   run {run} of {id} exited meanwhile: not listed"
                );
                self.finished_unlisted += 1;
                let committed = self
                    .io
                    .store
                    .sessions
                    .get(&id)
                    .filter(|r| r.run == Some(run))
                    .map_or(0, |r| r.provider_cursor);
                self.output_unread += self.io.world.unread_output(run, committed);
                self.io.world.reap(run);
                continue;
            }
            let named = self.io.store.sessions.get(&id).and_then(|r| r.run) == Some(run);
            surviving.insert((id.clone(), run), Some(pid));
            if named {
                adopt.insert(id, (run, pid));
            } else {
                // The new daemon must kill it (a restart's new run beside the old one, or a
                // create's, started in the batch the crash lost; or one whose session ended).
                log_entry!(
                    self.log,
                    "   run {run} of {id} is named by no record: to be killed"
                );
                self.orphans += 1;
                self.io.orphans.insert(run);
            }
        }
        if survives {
            // Now and then the runner also lists a run the session no longer has (one that
            // finished long ago): the new daemon must not adopt it.
            for (id, rec) in &self.io.store.sessions {
                let listed = surviving.keys().any(|(i, _)| i == id);
                if !listed && self.rng.chance(1, 8) {
                    let stale = rec.run.unwrap_or(0) + 1 + self.rng.range(0, 3);
                    surviving.insert((id.clone(), stale), None);
                    self.stale_listed += 1;
                }
            }
        }
        for (id, (run, _)) in &adopt {
            let committed = self.io.store.sessions[id].provider_cursor;
            let from = committed.saturating_sub(self.rng.range(0, 3));
            let n = self.io.world.redeliver(self.now, *run, from, committed)?;
            self.redelivered += n as u64;
            self.adopted += 1;
            log_entry!(
                self.log,
                "   adopting run {run} of {id}: output replayed after cursor {from} ({n} lines; \
                 {committed} applied)"
            );
        }
        // The stored requests the new daemon loads: every open one, the newest resolved.
        let loaded = self.io.store.approvals_to_load();
        self.model
            .on_restore(&adopt.keys().cloned().collect(), &self.io.store)?;
        let records = self.io.store.records();
        // A runner that died took everything with it: a cold start, nothing to adopt. One
        // that survived is asked what it still runs, and the run ids it remembers are
        // reserved. The engine avoids the ids the records name by itself (`restore`); the
        // floor reserves the others (runs no record names any more), so each guarantee is
        // tested on its own. (Either way the stored requests are loaded: those of sessions
        // whose process is gone are cancelled.)
        // As the shell's store gives them: only the sessions that are not settled, with their
        // requests; a settled one is recalled when an input names it (`feed`), after the run
        // ids the store names are reserved.
        let open: BTreeSet<&SessionId> = loaded
            .iter()
            .filter(|a| a.is_pending())
            .map(|a| &a.session)
            .collect();
        let restored: Vec<SessionRecord> = records
            .iter()
            .filter(|r| !r.is_settled() || open.contains(&r.id))
            .cloned()
            .collect();
        let restored_ids: BTreeSet<&SessionId> = restored.iter().map(|r| &r.id).collect();
        let loaded: Vec<Approval> = loaded
            .into_iter()
            .filter(|a| restored_ids.contains(&a.session))
            .collect();
        let stored = || Stored {
            sessions: restored.clone(),
            approvals: loaded.clone(),
            ..Stored::default()
        };
        let stored_runs = self.io.store.approvals.values().map(|a| a.run).max();
        let (mut engine, effects) = if survives {
            let (mut engine, effects) = Engine::restore(
                self.limits.clone(),
                now(self.now),
                stored(),
                &Surviving {
                    agents: surviving,
                    ..Surviving::default()
                },
            );
            let named: BTreeSet<RunId> = records.iter().filter_map(|r| r.run).collect();
            if let Some(floor) = self.io.world.max_known_run_except(&named) {
                engine.reserve_runs_through(floor);
            }
            (engine, effects)
        } else {
            Engine::restore(
                self.limits.clone(),
                now(self.now),
                stored(),
                &Surviving::default(),
            )
        };
        if let Some(floor) = stored_runs {
            engine.reserve_runs_through(floor);
        }
        engine.set_trace(true);
        self.exec = Executor::new(engine);
        log_entry!(
            self.log,
            "   restored {} sessions ({} settled ones left in the store)",
            restored.len(),
            records.len() - restored.len()
        );
        for rec in &records {
            self.coverage
                .add_restore(rec.status, adopt.contains_key(&rec.id), rec.turn_open);
        }
        self.check_restored(&restored, &adopt, &effects)?;
        self.check_restored_approvals(&adopt, &open_before, &loaded)?;
        self.io.now = self.now;
        self.exec.execute(effects.clone(), &mut self.io);
        self.exec.run(&mut self.io);
        self.commit(&[(Cause::Restore, effects)], false)?;
        if !self.io.orphans.is_empty() {
            return Err(format!(
                "restore: runs {:?} are named by no record and were left running",
                self.io.orphans
            ));
        }
        self.exec.evict_settled();
        Ok(())
    }

    /// The requests a restarted daemon holds: an adopted session keeps exactly the ones open
    /// before the crash (those of a lost transaction aside: the engine's state before the
    /// input in flight is what was committed) while it carries on (RUNNING, WORKING, WAITING),
    /// and every other session has none left open once the restore's effects are applied;
    /// every resolved one loaded is recognised for a late answer.
    fn check_restored_approvals(
        &self,
        adopt: &BTreeMap<SessionId, (RunId, u32)>,
        open_before: &BTreeMap<SessionId, BTreeSet<ApprovalId>>,
        loaded: &[Approval],
    ) -> Result<(), String> {
        for s in self.exec.engine().sessions() {
            let id = &s.record.id;
            let now: BTreeSet<ApprovalId> = s.pending().iter().map(|a| a.id.clone()).collect();
            let carries_on = adopt.contains_key(id)
                && matches!(
                    s.status(),
                    Status::Running | Status::Working | Status::Waiting
                );
            let want = if carries_on {
                open_before.get(id).cloned().unwrap_or_default()
            } else {
                BTreeSet::new()
            };
            if now != want {
                return Err(format!(
                    "restore: {id} ({}, {}) came back with open requests {now:?}, not {want:?}",
                    s.status(),
                    if adopt.contains_key(id) {
                        "adopted"
                    } else {
                        "not adopted"
                    }
                ));
            }
        }
        for a in loaded.iter().filter(|a| !a.is_pending()) {
            let got = self
                .exec
                .engine()
                .session(&a.session)
                .and_then(|s| s.approval(&a.id));
            if got != Some(a) {
                return Err(format!(
                    "restore: resolved request {} was loaded but the engine knows it as {got:?}",
                    a.id
                ));
            }
        }
        Ok(())
    }

    /// The restored engine holds exactly what the store said, changed only as the restart
    /// rules say: an adopted session carries on (a start becomes RUNNING, a stop or an ended
    /// session gets its process terminated, an open turn of a stop is interrupted), every
    /// other active one is FAILED with OBEY-2032 (its open turn ended with an ERROR saying
    /// so), and no session that was not adopted names a run.
    fn check_restored(
        &self,
        records: &[SessionRecord],
        adopt: &BTreeMap<SessionId, (RunId, u32)>,
        effects: &[Effect],
    ) -> Result<(), String> {
        if self.exec.engine().sessions().count() != records.len() {
            return Err(format!(
                "restore: the store has {} sessions, the rebuilt engine {}",
                records.len(),
                self.exec.engine().sessions().count()
            ));
        }
        let now = self.now;
        for rec in records {
            let id = &rec.id;
            let Some(s) = self.exec.engine().session(id) else {
                return Err(format!("restore lost {id}"));
            };
            let terms: Vec<(RunId, Option<u32>)> = effects
                .iter()
                .filter_map(|e| match e {
                    Effect::Signal {
                        id: i,
                        run,
                        pid,
                        signal: Signal::Term,
                    } if i == id => Some((*run, *pid)),
                    _ => None,
                })
                .collect();
            let mut want = rec.clone();
            let want_run: Run;
            let mut want_deadline: Option<(Instant, Timer)> = None;
            match adopt.get(id) {
                Some(&(run, pid)) => {
                    want.pid = Some(pid);
                    let alive = Run::Live {
                        run,
                        life: Life::Alive { pid: Some(pid) },
                    };
                    let terminating = Run::Live {
                        run,
                        life: Life::Terminating {
                            pid: Some(pid),
                            term: paddock_core::process::Termination::begin(
                                at(now),
                                self.limits.kill_grace,
                            )
                            .0,
                        },
                    };
                    // An agent that runs has its environment.
                    want.env_state = EnvState::Ready;
                    match rec.status {
                        Status::Created | Status::Starting => {
                            want.status = Status::Running;
                            want.started_at = Some(ts(now));
                            want.last_status_seq += 1;
                            if rec.turns == 0 && !rec.config.initial_message.is_empty() {
                                // A first start sends the initial message, adopted or not.
                                want.status = Status::Working;
                                want.last_status_seq += 1;
                                want.turns += 1;
                                want.turn_open = true;
                                want.last_activity_at = Some(ts(now));
                            }
                            want_run = alive;
                            want_deadline = timeout_deadline(at(now), rec.config.timeout_ms)
                                .map(|at| (at, Timer::SessionTimeout));
                        }
                        Status::Running | Status::Working | Status::Waiting => {
                            want_run = alive;
                            // The session timeout from the stored start, and the expiry of the
                            // requests it still waits for (ties: the session timeout first).
                            let expiry = self
                                .io
                                .store
                                .open
                                .iter()
                                .filter_map(|a| self.io.store.approvals.get(a))
                                .filter(|a| &a.session == id)
                                .map(|a| (at(a.expires_at.millis()), Timer::ApprovalExpiry))
                                .min();
                            want_deadline = rec
                                .started_at
                                .and_then(|t| {
                                    timeout_deadline(at(t.millis()), rec.config.timeout_ms)
                                })
                                .map(|at| (at, Timer::SessionTimeout))
                                .into_iter()
                                .chain(expiry)
                                .min();
                        }
                        Status::Stopping | Status::Stopped | Status::Failed => {
                            if rec.turn_open {
                                // The stop's wait for the turn is over: it is interrupted.
                                want.turn_open = false;
                                want.last_turn_failed = true;
                                want.last_activity_seq += 1;
                                want.last_activity_at = Some(ts(now));
                            }
                            want_run = terminating;
                            want_deadline = Some((at(now) + self.limits.kill_grace, Timer::Kill));
                        }
                    }
                    let want_terms = if matches!(want_run.life(), Some(Life::Terminating { .. })) {
                        vec![(run, Some(pid))]
                    } else {
                        vec![]
                    };
                    if terms != want_terms {
                        return Err(format!(
                            "restore: {id} was {} with run {run} adopted; it got TERMs {terms:?}, \
                             not {want_terms:?}",
                            rec.status
                        ));
                    }
                }
                None => {
                    // Its process, if it had one, is gone: no record names it any more.
                    want.pid = None;
                    want.run = None;
                    want.provider_cursor = 0;
                    // A connection is its run's: gone with it.
                    want.disconnected = false;
                    want_run = Run::Idle;
                    if !rec.status.is_terminal() {
                        want.status = Status::Failed;
                        if rec.env_state == EnvState::Creating {
                            // Its making died with the old daemon: given up.
                            want.env_state = EnvState::Failed;
                        }
                        want.ended_at = Some(ts(now));
                        want.last_status_seq += 1;
                        if rec.turn_open {
                            // The turn the old daemon left open ends here, failed.
                            want.turn_open = false;
                            want.last_turn_failed = true;
                            want.last_activity_seq += 1;
                            want.last_activity_at = Some(ts(now));
                        }
                        match &s.record.error {
                            Some(e) if e.code == ErrorCode::ConnectionLost => {
                                want.error = Some(e.clone())
                            }
                            other => {
                                return Err(format!(
                                    "restore: {id} was {} and came back with error {other:?}, \
                                     not OBEY-2032",
                                    rec.status
                                ))
                            }
                        }
                    }
                    if !terms.is_empty() {
                        return Err(format!(
                            "restore: {id} was not adopted, yet its run is TERMed: {terms:?}"
                        ));
                    }
                }
            }
            if s.record != want {
                return Err(format!(
                    "restore: {id} ({} in the store, {}) differs from what the restart rules \
                     say: {}",
                    rec.status,
                    if adopt.contains_key(id) {
                        "adopted"
                    } else {
                        "not adopted"
                    },
                    diff(&want, &s.record)
                ));
            }
            let want_turn = want.turn_open.then_some(want.turns);
            if s.run() != want_run || s.turn() != want_turn {
                return Err(format!(
                    "restore: {id} ({} in the store) came back with process {:?} and turn {:?}; \
                     the restart rules say {want_run:?} and {want_turn:?}",
                    rec.status,
                    s.run(),
                    s.turn()
                ));
            }
            if s.next_deadline() != want_deadline {
                return Err(format!(
                    "restore: {id} ({} in the store) came back with deadline {:?}, not \
                     {want_deadline:?}",
                    rec.status,
                    s.next_deadline()
                ));
            }
        }
        // Nothing the runner keeps alive is lost: every process it still has was adopted, or
        // is named by no record and so is killed (checked once the effects are carried out).
        for (run, id, _) in self.io.world.alive() {
            if self.io.orphans.contains(&run) {
                continue;
            }
            if self.exec.engine().session(&id).and_then(|s| s.run().id()) != Some(run) {
                return Err(format!(
                    "restore: run {run} of {id} outlived the daemon, its record names it, and \
                     the new daemon did not adopt it"
                ));
            }
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
                // As the shell answers: the engine's copy, else the store's (let go when settled).
                let got = self
                    .exec
                    .engine()
                    .session(id)
                    .map(|s| s.status())
                    .or_else(|| self.io.store.sessions.get(id).map(|r| r.status));
                if got != self.model.status(id) {
                    return Err(format!(
                        "watch {id}: the engine says {got:?}, the client saw {:?}",
                        self.model.status(id)
                    ));
                }
            }
            Action::List => {
                // A list of every session reads the store (the engine holds the live ones and
                // what was named lately).
                let ids: Vec<_> = self.io.store.sessions.keys().collect();
                let seen: Vec<_> = self.model.sessions().map(|(id, _)| id).collect();
                if ids != seen {
                    return Err(format!(
                        "list: the engine lists {ids:?}, the client saw {seen:?}"
                    ));
                }
                if self.exec.engine().live_sessions() != self.model.live() {
                    return Err(format!(
                        "list: the engine counts {} live sessions, the client saw {}",
                        self.exec.engine().live_sessions(),
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
        for s in self.exec.engine().sessions() {
            let id = &s.record.id;
            let procs = self.io.world.live_run(id);
            let ok = match (s.run(), procs.as_slice()) {
                (Run::Idle, []) => true,
                (
                    Run::Live {
                        run,
                        life: Life::Starting,
                    },
                    [(r, _, false)],
                ) => *r == run,
                (Run::Live { run, life }, [(r, p, true)]) if life.has_process() => {
                    *r == run && life.pid() == Some(*p)
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
        for (run, id) in self.io.world.runs() {
            if self.exec.engine().session(id).is_none() {
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
        let open: Vec<_> = self
            .exec
            .engine()
            .pending_approvals()
            .map(|a| &a.id)
            .collect();
        if !open.is_empty() || !self.io.store.open.is_empty() {
            return Err(format!(
                "drain: requests for a human still open: {open:?} (stored: {:?})",
                self.io.store.open
            ));
        }
        for s in self.exec.engine().sessions() {
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
        if !self.io.world.is_empty() {
            return Err("drain: provider processes are still running".to_string());
        }
        if let Some((_, why)) = self.engine_deadline() {
            return Err(format!("drain: a deadline outlived everything: {why:?}"));
        }
        Ok(())
    }
}

/// The table is what the engine does: a request the table refuses gets exactly one reply, an
/// error with the table's code, and nothing else; a provider event the table ignores changes
/// nothing but how far the run's output was read (its cursor, stored so that it is not read
/// again after a restart).
fn check_table(
    cause: &Cause,
    trace: &[Step],
    effects: &[Effect],
    store: &Store,
) -> Result<(), String> {
    match cause {
        Cause::Request { req, id, .. } => {
            let refused = trace.iter().find_map(|s| match s.rule {
                Rule::Refuse(code) => Some((s, code)),
                _ => None,
            });
            if let Some((step, code)) = refused {
                // A close of an ended session is refused like a stop, and still closes it:
                // its record changes in that one field.
                let only_closed = |rec: &SessionRecord| {
                    store.sessions.get(id).is_some_and(|old| {
                        let mut want = old.clone();
                        want.closed_by_client = true;
                        !old.closed_by_client && *rec == want
                    })
                };
                let ok = matches!(
                    effects,
                    [Effect::Reply { req: r, result: Err(e) }]
                    | [Effect::ReplyApproval { req: r, result: Err(e) }] if r == req && e.code == code
                ) || matches!(
                    effects,
                    [Effect::Persist(Record::Session(rec)), Effect::Reply { req: r, result: Err(e) }]
                        if r == req && e.code == code && only_closed(rec)
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
        Cause::Provider { id, cursor, .. } => {
            if let Some(step) = trace.iter().find(|s| s.rule == Rule::Ignore) {
                let only_cursor = match (effects, store.sessions.get(id), cursor) {
                    ([Effect::Persist(Record::Session(r))], Some(old), Some(c)) => {
                        let mut want = old.clone();
                        want.provider_cursor = *c;
                        **r == want
                    }
                    _ => false,
                };
                if !effects.is_empty() && !only_cursor {
                    return Err(format!(
                        "the table ignores ({}, {}), but the engine did {effects:?}",
                        step.status,
                        step.input.name()
                    ));
                }
            }
        }
        // A report on an environment whose making was given up (the session stopped, failed
        // or started since) changes nothing at all.
        Cause::Environment { .. } => {
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
        Cause::Tick | Cause::Restore | Cause::Shutdown { .. } | Cause::Report { .. } => {}
    }
    Ok(())
}
