//! The daemon's other parts under faults: Aria tasks (launch, output, cancel, timeout, TERM →
//! KILL escalation, processes that ignore TERM), campaigns, daemon crashes (the tasks the
//! runner still runs, found at start-up) and the shutdown — driven through the same
//! [`Engine`] the daemon runs, one seed at a time, with a fake clock that jumps from event to
//! event and a reference model checked after every step.
//!
//! Checked after every step:
//! - the drain rule (every persist first) and one reply per request, of the right kind;
//! - a task's stored record is the engine's, its status only goes forward (PENDING → RUNNING →
//!   terminal), its output sequence has no gap and its output stays within the bound;
//! - a signal goes only to a task whose process lives; a KILL follows a TERM exactly the
//!   grace later, unless the process exited first; a timeout TERMs exactly the timeout after
//!   the start;
//! - a launch is refused with the code its cause implies: the shutdown (`ShuttingDown`), a
//!   session the engine does not know (`SessionNotFound`: a `session exec` whose session is
//!   gone), else a duplicate id, an empty command or the live-task limit;
//! - a task ends CANCELLED when it was cancelled (by a client or the shutdown), TIMEOUT when its
//!   time ran out, otherwise COMPLETED on exit code 0 and FAILED on anything else;
//! - a campaign name is never taken twice, and the engine's campaigns are the reference's;
//! - after a crash, every task the store shows running is FAILED, and every task process the
//!   runner still runs is killed; nothing else happens;
//! - after the shutdown: no launch is accepted, every task ends, every process is reaped and no
//!   deadline is left, within a bounded number of steps.

use std::collections::{BTreeMap, BTreeSet};

use paddock_core::campaign::{Campaign, CampaignError, NewCampaign};
use paddock_core::task::{
    OutputKind, TaskInput, TaskLimits, TaskRecord, TaskReply, TaskSpec, TaskStatus,
};
use paddock_core::{
    Deadline, Duration, Effect, Engine, ErrorCode, Input, Limits, Record, RequestId, Signal,
    Stored, Surviving,
};

use crate::ports::{Logged, Recorder};
use crate::rng::Rng;
use crate::world::{now, Millis, T0};
use paddock_exec::Executor;

/// Steps per seed before the shutdown.
const STEPS: u64 = 400;
/// Steps the shutdown may take to end everything.
const SHUTDOWN_STEPS: u64 = 2_000;

/// What one seed did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DaemonStats {
    pub steps: u64,
    pub launched: u64,
    pub refused: u64,
    pub completed: u64,
    pub failed: u64,
    pub cancelled: u64,
    pub timed_out: u64,
    pub terms: u64,
    pub kills: u64,
    pub crashes: u64,
    pub orphans_killed: u64,
    pub campaigns_added: u64,
    pub campaigns_refused: u64,
}

impl DaemonStats {
    pub fn add(&mut self, o: &DaemonStats) {
        self.steps += o.steps;
        self.launched += o.launched;
        self.refused += o.refused;
        self.completed += o.completed;
        self.failed += o.failed;
        self.cancelled += o.cancelled;
        self.timed_out += o.timed_out;
        self.terms += o.terms;
        self.kills += o.kills;
        self.crashes += o.crashes;
        self.orphans_killed += o.orphans_killed;
        self.campaigns_added += o.campaigns_added;
        self.campaigns_refused += o.campaigns_refused;
    }
}

/// A fake task process.
#[derive(Debug, Clone)]
struct Proc {
    pid: u32,
    /// Output lines still to print, one per `line_every` ms.
    lines: u32,
    next_at: Millis,
    line_every: Millis,
    /// When it exits by itself, and with which code.
    exit_at: Millis,
    code: i32,
    ignores_term: bool,
    /// When a TERM was received (the one that counts for the KILL deadline).
    term_at: Option<Millis>,
    /// Dies by this signal at `exit_at`.
    dying: Option<i32>,
}

/// Why a task is expected to end as it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    None,
    Cancel,
    Timeout,
}

/// The reference model of one task.
#[derive(Debug, Clone)]
struct TaskModel {
    spec: TaskSpec,
    status: TaskStatus,
    started_at: Option<Millis>,
    ending: Ending,
    output_seq: u64,
}

/// Who waits for what.
#[derive(Debug, Clone)]
enum Waiting {
    /// `gone`: bound to a session the engine does not know (refused, `OBEY-2001`).
    Launch {
        id: String,
        ok: bool,
        gone: bool,
    },
    Cancel,
    AddCampaign,
    RemoveCampaign,
    Shutdown,
}

struct Run {
    rng: Rng,
    now: Millis,
    limits: Limits,
    /// The daemon's executor (`paddock_exec`) with its engine, on recording ports.
    exec: Executor,
    io: Recorder,
    procs: BTreeMap<String, Proc>,
    tasks: BTreeMap<String, TaskModel>,
    /// The fake store: what the last commits left.
    stored: BTreeMap<String, TaskRecord>,
    campaigns: BTreeMap<String, Campaign>,
    waiting: BTreeMap<RequestId, Waiting>,
    next_req: RequestId,
    next_id: u64,
    next_pid: u32,
    shutting_down: bool,
    stats: DaemonStats,
    /// Spawns to answer (the executor's part): task id, fails.
    spawns: Vec<(String, bool)>,
}

/// Runs one seed; `Err` says what broke, with the seed to replay.
pub fn run_daemon_seed(seed: u64) -> Result<DaemonStats, String> {
    let mut rng = Rng::new(seed ^ 0xDAE_0000);
    let limits = Limits {
        tasks: TaskLimits {
            max_output_bytes: rng.range(8, 400),
            kill_grace: Duration::from_millis(if rng.per_mille(50) {
                0
            } else {
                rng.range(10, 5_000)
            }),
            max_live_tasks: rng.range(1, 8) as usize,
        },
        ..Limits::default()
    };
    let mut run = Run {
        rng,
        now: T0,
        exec: Executor::new(Engine::new(limits.clone())),
        io: Recorder::default(),
        limits,
        procs: BTreeMap::new(),
        tasks: BTreeMap::new(),
        stored: BTreeMap::new(),
        campaigns: BTreeMap::new(),
        waiting: BTreeMap::new(),
        next_req: 1,
        next_id: 0,
        next_pid: 100,
        shutting_down: false,
        stats: DaemonStats::default(),
        spawns: Vec::new(),
    };
    run.go().map(|()| run.stats.clone()).map_err(|e| {
        format!(
            "daemon sim failed: seed={seed} step={} t+{} ms | {e} | limits: {:?} | replay: \
                 PADDOCK_SIM_SEED={seed} cargo test -p sim --test daemon",
            run.stats.steps,
            run.now - T0,
            run.limits.tasks
        )
    })
}

impl Run {
    fn go(&mut self) -> Result<(), String> {
        let crash_rate = self.rng.range(0, 30) as u32;
        for _ in 0..STEPS {
            self.stats.steps += 1;
            if self.rng.per_mille(crash_rate) {
                self.crash()?;
            } else if self.rng.chance(1, 3) {
                self.client()?;
            } else {
                self.advance()?;
            }
        }
        // The shutdown: graceful or not, then everything must end.
        let req = self.request(Waiting::Shutdown);
        let graceful = self.rng.chance(1, 2);
        self.shutting_down = true;
        // The shutdown cancels every task not ended yet, one timing out included (as a
        // client's cancel would).
        for t in self.tasks.values_mut() {
            if !t.status.is_terminal() {
                t.ending = Ending::Cancel;
            }
        }
        self.feed(Input::Shutdown { req, graceful })?;
        for _ in 0..SHUTDOWN_STEPS {
            self.stats.steps += 1;
            if self.rng.chance(1, 10) {
                // A client still trying: refused.
                self.launch()?;
            }
            if !self.advance()? {
                break;
            }
        }
        let live: Vec<_> = self
            .exec
            .engine()
            .tasks()
            .filter(|t| !t.status.is_terminal())
            .map(|t| (t.id.clone(), t.status))
            .collect();
        if !live.is_empty() || !self.procs.is_empty() || self.exec.engine().poll_timeout().is_some()
        {
            return Err(format!(
                "shutdown: {SHUTDOWN_STEPS} steps later, tasks {live:?} still live, processes \
                 {:?} still running, deadline {:?}",
                self.procs.keys().collect::<Vec<_>>(),
                self.exec.engine().poll_timeout()
            ));
        }
        if !self.waiting.is_empty() {
            return Err(format!("requests never answered: {:?}", self.waiting));
        }
        Ok(())
    }

    fn request(&mut self, w: Waiting) -> RequestId {
        let req = self.next_req;
        self.next_req += 1;
        self.waiting.insert(req, w);
        req
    }

    // ── the client ────────────────────────────────────────────────────────

    fn client(&mut self) -> Result<(), String> {
        match self.rng.weighted(&[50, 20, 10, 5]) {
            0 => self.launch(),
            1 => {
                let ids: Vec<String> = self.tasks.keys().cloned().collect();
                let id = if ids.is_empty() || self.rng.chance(1, 10) {
                    "task-unknown".to_string()
                } else {
                    self.rng.pick(&ids).clone()
                };
                if let Some(t) = self.tasks.get_mut(&id) {
                    if !t.status.is_terminal() && t.ending != Ending::Cancel {
                        t.ending = Ending::Cancel;
                    }
                }
                let req = self.request(Waiting::Cancel);
                self.feed(Input::Task(TaskInput::Cancel { req, id }))
            }
            2 => {
                let name = format!("camp-{}", self.rng.below(6));
                let id = format!("c{}", self.next_id);
                self.next_id += 1;
                let req = self.request(Waiting::AddCampaign);
                self.feed(Input::AddCampaign {
                    req,
                    id,
                    root: "/srv".into(),
                    how: NewCampaign::Named(name),
                })
            }
            _ => {
                let key = format!("camp-{}", self.rng.below(6));
                let req = self.request(Waiting::RemoveCampaign);
                self.feed(Input::RemoveCampaign { req, key })
            }
        }
    }

    fn launch(&mut self) -> Result<(), String> {
        let live = self
            .tasks
            .values()
            .filter(|t| !t.status.is_terminal())
            .count();
        let empty = self.rng.per_mille(30);
        let again = !self.tasks.is_empty() && self.rng.per_mille(30);
        // A command for a session (`session exec`) whose session is gone: this sweep has none.
        let gone = self.rng.per_mille(40);
        let id = if again {
            let ids: Vec<String> = self.tasks.keys().cloned().collect();
            self.rng.pick(&ids).clone()
        } else {
            self.next_id += 1;
            format!("task-{}", self.next_id)
        };
        let spec = TaskSpec {
            command: if empty { vec![] } else { vec!["work".into()] },
            session_id: if gone {
                "sess-gone".into()
            } else {
                String::new()
            },
            timeout_ms: if self.rng.chance(1, 3) {
                self.rng.range(1, 3_000)
            } else {
                0
            },
            ..TaskSpec::default()
        };
        let ok = !self.shutting_down
            && !gone
            && !again
            && !empty
            && live < self.limits.tasks.max_live_tasks;
        let req = self.request(Waiting::Launch {
            id: id.clone(),
            ok,
            gone,
        });
        if ok {
            self.tasks.insert(
                id.clone(),
                TaskModel {
                    spec: spec.clone(),
                    status: TaskStatus::Pending,
                    started_at: None,
                    ending: Ending::None,
                    output_seq: 0,
                },
            );
        }
        self.feed(Input::Task(TaskInput::Launch {
            req,
            id,
            spec: Box::new(spec),
        }))
    }

    // ── the world ─────────────────────────────────────────────────────────

    /// The next thing that happens: a spawn answered, a line, an exit, a deadline. `false`
    /// when nothing is left to happen.
    fn advance(&mut self) -> Result<bool, String> {
        if let Some((id, fails)) = self.spawns.pop() {
            let input = if fails {
                TaskInput::SpawnFailed {
                    id,
                    reason: "no such file".into(),
                }
            } else {
                self.next_pid += 1;
                let pid = self.next_pid;
                let lines = self.rng.below(6) as u32;
                let line_every = self.rng.range(1, 400);
                let exit_at = self.now + line_every * u64::from(lines) + self.rng.range(1, 4_000);
                let code = if self.rng.chance(1, 4) { 3 } else { 0 };
                let ignores_term = self.rng.per_mille(150);
                self.procs.insert(
                    id.clone(),
                    Proc {
                        pid,
                        lines,
                        next_at: self.now + line_every,
                        line_every,
                        exit_at,
                        code,
                        ignores_term,
                        term_at: None,
                        dying: None,
                    },
                );
                TaskInput::Started { id, pid }
            };
            self.feed(Input::Task(input))?;
            return Ok(true);
        }
        let proc_next = self
            .procs
            .iter()
            .map(|(id, p)| {
                let at = if p.lines > 0 && p.dying.is_none() {
                    p.next_at.min(p.exit_at)
                } else {
                    p.exit_at
                };
                (at, id.clone())
            })
            .min();
        let deadline = self.exec.engine().poll_timeout().map(|(at, _)| at.millis());
        // A process's event first, unless a deadline is due before it (at the same time, the
        // deadline first).
        let proc_first = match (&proc_next, deadline) {
            (Some((at, _)), Some(d)) => *at < d,
            (p, _) => p.is_some(),
        };
        match (proc_next, deadline) {
            (Some((at, id)), _) if proc_first => {
                self.now = self.now.max(at);
                let p = self.procs.get_mut(&id).expect("listed");
                if p.lines > 0 && p.dying.is_none() && p.next_at <= p.exit_at {
                    p.lines -= 1;
                    p.next_at += p.line_every;
                    let line = "x".repeat(self.rng.range(0, 40) as usize);
                    let kind = if self.rng.chance(1, 5) {
                        OutputKind::Stderr(line)
                    } else {
                        OutputKind::Stdout(line)
                    };
                    self.feed(Input::Task(TaskInput::Output { id, kind }))?;
                } else {
                    let p = self.procs.remove(&id).expect("listed");
                    let (code, signal) = match p.dying {
                        Some(sig) => (None, Some(sig)),
                        None => (Some(p.code), None),
                    };
                    self.feed(Input::Task(TaskInput::Exited { id, code, signal }))?;
                }
                Ok(true)
            }
            (_, Some(d)) => {
                self.now = self.now.max(d);
                // What the reference expects the tick to time out: running, not ended
                // otherwise, its time up.
                for t in self.tasks.values_mut() {
                    if let (TaskStatus::Running, Ending::None, Some(start)) =
                        (t.status, t.ending, t.started_at)
                    {
                        if t.spec.timeout_ms > 0 && self.now >= start + t.spec.timeout_ms {
                            t.ending = Ending::Timeout;
                        }
                    }
                }
                self.feed(Input::Tick)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// The daemon dies and comes back: the engine is rebuilt from the fake store, with the task
    /// processes the runner still runs.
    fn crash(&mut self) -> Result<(), String> {
        self.stats.crashes += 1;
        // A spawn in flight is lost with the daemon (the runner never heard of it).
        self.spawns.clear();
        self.now += self.rng.range(1, 2_000);
        let surviving = Surviving {
            tasks: self
                .procs
                .iter()
                .map(|(id, p)| (id.clone(), Some(p.pid)))
                .collect(),
            ..Surviving::default()
        };
        // As the daemon's start-up: the tasks that had not ended (the others stay in the
        // store, recalled when named).
        let stored = Stored {
            tasks: self
                .stored
                .values()
                .filter(|r| !r.status.is_terminal())
                .cloned()
                .collect(),
            campaigns: self.campaigns.values().cloned().collect(),
            ..Stored::default()
        };
        let was_live: BTreeSet<String> = self
            .stored
            .values()
            .filter(|r| !r.status.is_terminal())
            .map(|r| r.id.clone())
            .collect();
        let (engine, effects) =
            Engine::restore(self.limits.clone(), now(self.now), stored, &surviving);
        self.exec = Executor::new(engine);
        self.io.tasks = self.stored.clone();
        self.waiting.clear();
        // What the store did not have never was.
        self.tasks.retain(|id, _| self.stored.contains_key(id));
        let mut killed = BTreeSet::new();
        for e in &effects {
            match e {
                Effect::Persist(Record::Task(r)) if was_live.contains(&r.id) => {
                    if r.status != TaskStatus::Failed {
                        return Err(format!("restore: {} came back {:?}", r.id, r.status));
                    }
                }
                Effect::EmitTaskStatus(ev) if was_live.contains(&ev.task) => {}
                Effect::SignalTask {
                    id,
                    pid,
                    signal: Signal::Kill,
                } if surviving.tasks.get(id) == Some(pid) => {
                    killed.insert(id.clone());
                }
                other => return Err(format!("restore: an effect of nothing: {other:?}")),
            }
        }
        let want: BTreeSet<String> = surviving.tasks.keys().cloned().collect();
        if killed != want {
            return Err(format!(
                "restore: killed {killed:?}, but the runner still ran {want:?}"
            ));
        }
        self.stats.orphans_killed += killed.len() as u64;
        self.procs.clear();
        // Carried out as the daemon does at start-up; what it did was checked above, so only
        // its transaction is applied.
        self.io.now = self.now;
        self.exec.execute(effects, &mut self.io);
        self.exec.run(&mut self.io);
        self.exec.commit(&mut self.io)?;
        for l in std::mem::take(&mut self.io.log) {
            if let Logged::Commit(records) = l {
                self.commit(&records)?;
            }
        }
        self.exec.evict_settled();
        for id in &was_live {
            let t = self.tasks.get_mut(id).expect("stored tasks are known");
            t.status = TaskStatus::Failed;
            self.stats.failed += 1;
        }
        self.check()
    }

    // ── the engine ────────────────────────────────────────────────────────

    /// One input through the daemon's executor, then what it did, in the order it did it:
    /// processes at once, the batch's transaction, then deliveries.
    fn feed(&mut self, input: Input) -> Result<(), String> {
        self.io.now = self.now;
        self.exec.push(input.clone(), &mut self.io)?;
        self.exec.run(&mut self.io);
        self.exec.commit(&mut self.io)?;
        let mut committed = false;
        for l in std::mem::take(&mut self.io.log) {
            match l {
                Logged::Commit(records) => {
                    committed = true;
                    self.commit(&records)?;
                }
                Logged::At(e) => self.effect(&input, e)?,
                Logged::Delivered(e) if committed => self.effect(&input, e)?,
                Logged::Delivered(e) => {
                    return Err(format!("{input:?}: {e:?} delivered before the commit"))
                }
            }
        }
        // The daemon lets ended tasks go after every commit; here after some, so that a
        // launch or a cancel meets an ended task both held and recalled.
        if self.rng.chance(1, 2) {
            self.exec.evict_settled();
        }
        self.check()
    }

    /// The fake store's one transaction.
    fn commit(&mut self, records: &[Record]) -> Result<(), String> {
        for r in records {
            match r {
                Record::Task(rec) => {
                    if let Some(old) = self.stored.get(&rec.id) {
                        if old.status.is_terminal() && old.status != rec.status {
                            return Err(format!(
                                "store: task {} went {:?} -> {:?}",
                                rec.id, old.status, rec.status
                            ));
                        }
                        if rec.status < old.status && !rec.status.is_terminal() {
                            return Err(format!(
                                "store: task {} went back {:?} -> {:?}",
                                rec.id, old.status, rec.status
                            ));
                        }
                    }
                    if rec.output_bytes > self.limits.tasks.max_output_bytes {
                        return Err(format!("store: task {} kept too much output", rec.id));
                    }
                    self.stored.insert(rec.id.clone(), (**rec).clone());
                }
                Record::TaskOutput(o) => {
                    let t = self
                        .tasks
                        .get_mut(&o.task)
                        .ok_or_else(|| format!("store: output of unknown task {}", o.task))?;
                    if o.seq != t.output_seq + 1 {
                        return Err(format!(
                            "store: output {} of {} after {}",
                            o.seq, o.task, t.output_seq
                        ));
                    }
                    t.output_seq = o.seq;
                }
                Record::Campaign(c) => {
                    if self.campaigns.values().any(|x| x.name == c.name) {
                        return Err(format!("store: campaign name {} taken twice", c.name));
                    }
                    self.campaigns.insert(c.id.clone(), c.clone());
                }
                Record::RemoveCampaign(id) => {
                    if self.campaigns.remove(id).is_none() {
                        return Err(format!("store: removed campaign {id}, which was not there"));
                    }
                }
                other => return Err(format!("store: a session row from no session: {other:?}")),
            }
        }
        Ok(())
    }

    fn effect(&mut self, input: &Input, e: Effect) -> Result<(), String> {
        match e {
            Effect::Persist(_) => {}
            Effect::SpawnTask { id, .. } => {
                let fails = self.rng.per_mille(50);
                self.spawns.push((id, fails));
            }
            Effect::SignalTask { id, pid, signal } => {
                let p = self
                    .procs
                    .get_mut(&id)
                    .ok_or_else(|| format!("{signal:?} to task {id}, which has no process"))?;
                if pid != Some(p.pid) {
                    return Err(format!(
                        "{signal:?} to {id} with pid {pid:?}, not {}",
                        p.pid
                    ));
                }
                let t = self.tasks.get(&id).expect("a process is a task's");
                match signal {
                    Signal::Term => {
                        self.stats.terms += 1;
                        if p.term_at.is_some() {
                            return Err(format!("a second TERM to {id}"));
                        }
                        if t.ending == Ending::Timeout {
                            let due = t.started_at.expect("started") + t.spec.timeout_ms;
                            if self.now != due {
                                return Err(format!(
                                    "{id} timed out at t+{}, its timeout was due at t+{}",
                                    self.now - T0,
                                    due - T0
                                ));
                            }
                        }
                        p.term_at = Some(self.now);
                        if !p.ignores_term && p.dying.is_none() {
                            p.dying = Some(15);
                            p.exit_at = p.exit_at.min(self.now + self.rng.range(0, 300));
                        }
                    }
                    Signal::Kill => {
                        self.stats.kills += 1;
                        let due = p.term_at.map(|t| t + self.limits.tasks.kill_grace.millis());
                        if due != Some(self.now) {
                            return Err(format!(
                                "KILL to {id} at t+{}; TERM at {:?}, grace {}",
                                self.now - T0,
                                p.term_at.map(|t| t - T0),
                                self.limits.tasks.kill_grace
                            ));
                        }
                        p.dying = Some(9);
                        p.exit_at = self.now;
                    }
                    Signal::Hup => return Err(format!("HUP to task {id}")),
                }
            }
            Effect::EmitTaskStatus(ev) => {
                let t = self
                    .tasks
                    .get_mut(&ev.task)
                    .ok_or_else(|| format!("status of unknown task {}", ev.task))?;
                if self.stored.get(&ev.task).map(|r| r.status) != Some(ev.status) {
                    return Err(format!(
                        "{} emitted {:?} before storing it",
                        ev.task, ev.status
                    ));
                }
                if t.status.is_terminal() {
                    return Err(format!("{} went on after {:?}", ev.task, t.status));
                }
                if ev.status == TaskStatus::Running {
                    t.started_at = Some(self.now);
                }
                if ev.status.is_terminal() {
                    let from_spawn = matches!(input, Input::Task(TaskInput::SpawnFailed { .. }));
                    let want = match (t.ending, from_spawn, ev.exit_code) {
                        (_, true, _) => TaskStatus::Failed,
                        (Ending::Cancel, _, _) => TaskStatus::Cancelled,
                        (Ending::Timeout, _, _) => TaskStatus::Timeout,
                        (Ending::None, _, Some(0)) => TaskStatus::Completed,
                        (Ending::None, _, _) => TaskStatus::Failed,
                    };
                    if ev.status != want {
                        return Err(format!(
                            "{} ended {:?}, not {want:?} ({:?}, exit {:?})",
                            ev.task, ev.status, t.ending, ev.exit_code
                        ));
                    }
                    match ev.status {
                        TaskStatus::Completed => self.stats.completed += 1,
                        TaskStatus::Failed => self.stats.failed += 1,
                        TaskStatus::Cancelled => self.stats.cancelled += 1,
                        _ => self.stats.timed_out += 1,
                    }
                }
                t.status = ev.status;
            }
            Effect::EmitTaskOutput(o) => {
                if self.tasks.get(&o.task).map(|t| t.output_seq) < Some(o.seq) {
                    return Err(format!(
                        "output {} of {} emitted before stored",
                        o.seq, o.task
                    ));
                }
            }
            Effect::ReplyTask { req, result } => match (self.waiting.remove(&req), result) {
                (_, _) if req == paddock_core::NO_REPLY => {}
                (Some(Waiting::Launch { id, ok: true, .. }), Ok(TaskReply::Launched(got))) => {
                    if got != id {
                        return Err(format!("launched {got}, asked for {id}"));
                    }
                    self.stats.launched += 1;
                }
                (
                    Some(Waiting::Launch {
                        ok: false, gone, ..
                    }),
                    Err(e),
                ) => {
                    let want = if self.shutting_down {
                        ErrorCode::ShuttingDown
                    } else if gone {
                        ErrorCode::SessionNotFound
                    } else {
                        ErrorCode::Generic
                    };
                    if e.code != want {
                        return Err(format!("a launch refused with {e:?}, not {want:?}"));
                    }
                    self.stats.refused += 1;
                }
                (Some(Waiting::Cancel), Ok(TaskReply::Cancel { .. }) | Err(_)) => {}
                (w, r) => return Err(format!("request {req} ({w:?}) answered {r:?}")),
            },
            Effect::ReplyAddCampaign { req, result } => {
                if !matches!(self.waiting.remove(&req), Some(Waiting::AddCampaign)) {
                    return Err(format!("campaign reply to {req}, which did not ask"));
                }
                match result {
                    Ok((_, true)) => self.stats.campaigns_added += 1,
                    Err(CampaignError::NameTaken(_)) => self.stats.campaigns_refused += 1,
                    other => return Err(format!("add campaign answered {other:?}")),
                }
            }
            Effect::ReplyRemoveCampaign { req, result } => {
                if !matches!(self.waiting.remove(&req), Some(Waiting::RemoveCampaign)) {
                    return Err(format!("campaign reply to {req}, which did not ask"));
                }
                if let Err(e) = result {
                    return Err(format!("a campaign without sessions not removed: {e}"));
                }
            }
            Effect::ReplyShutdown { req, live } => {
                if !matches!(self.waiting.remove(&req), Some(Waiting::Shutdown)) || live != 0 {
                    return Err(format!("shutdown {req} answered {live} live sessions"));
                }
            }
            other => return Err(format!("an effect of no task: {other:?}")),
        }
        Ok(())
    }

    /// The engine against the reference, after every step.
    fn check(&mut self) -> Result<(), String> {
        for t in self.exec.engine().tasks() {
            if self.stored.get(&t.id) != Some(t) {
                return Err(format!(
                    "task {}: the engine has {t:?}, the store {:?}",
                    t.id,
                    self.stored.get(&t.id)
                ));
            }
        }
        // Every task that has not ended is held (an ended one may have been let go).
        if let Some(t) = self
            .stored
            .values()
            .find(|t| !t.status.is_terminal() && self.exec.engine().task(&t.id).is_none())
        {
            return Err(format!("task {}: stored {:?}, not held", t.id, t.status));
        }
        for (id, p) in &self.procs {
            let t = self
                .exec
                .engine()
                .task(id)
                .ok_or_else(|| format!("{id}: a process of no task"))?;
            if t.status != TaskStatus::Running || t.pid != Some(p.pid) {
                return Err(format!("{id}: process {} runs, the task is {t:?}", p.pid));
            }
        }
        let mine: Vec<&Campaign> = self.campaigns.values().collect();
        let theirs = self.exec.engine().campaigns().all();
        if mine.len() != theirs.len() || theirs.iter().any(|c| self.campaigns.get(&c.id) != Some(c))
        {
            return Err(format!("campaigns: engine {theirs:?}, store {mine:?}"));
        }
        // A running task with a timeout that nobody ended yet: its timeout is armed.
        if let Some((at, Deadline::Task(id, _))) = self.exec.engine().poll_timeout() {
            if at.millis() < self.now {
                return Err(format!(
                    "task {id}'s deadline at {} passed unfired",
                    at.millis()
                ));
            }
        }
        // The reference learns which running tasks are past their timeout only from the engine's
        // TERM, so it marks them here: due now and not yet ended otherwise.
        for (id, t) in self.tasks.iter_mut() {
            if let (TaskStatus::Running, Ending::None, Some(start)) =
                (t.status, t.ending, t.started_at)
            {
                if t.spec.timeout_ms > 0 && self.now >= start + t.spec.timeout_ms {
                    let p = self.procs.get(id);
                    if p.is_some_and(|p| p.term_at.is_none()) {
                        return Err(format!("{id} outlived its timeout without a TERM"));
                    }
                }
            }
        }
        Ok(())
    }
}
