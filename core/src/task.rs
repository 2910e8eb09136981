//! Aria tasks: a command run to completion, PENDING → RUNNING → COMPLETED / FAILED /
//! CANCELLED / TIMEOUT.
//!
//! One part of the daemon's engine ([`crate::Engine`] owns the [`Tasks`] and feeds them
//! [`Input::Task`](crate::Input::Task), the shutdown and the ticks): its effects are the
//! engine's one [`Effect`] enum (`Persist(Record::Task…)` first: the drain rule), and
//! [`Tasks::poll_timeout`] names its next deadline (a task's timeout, or the TERM → KILL
//! escalation of a cancel). Output kept per task is bounded here, once, with a marker line.
//! What happens to tasks found running at start-up is decided here too (`Tasks::restore`).

use std::collections::BTreeMap;

use crate::error::{Error, ErrorCode};
use crate::model::RequestId;
use crate::process::{Life, Signal};
use crate::session::effect::{Effect, Record};
use crate::session::machine::Out;
use crate::time::{Duration, Instant, Now, Timestamp};

/// An Aria task status; the numbering is the `aria.v1.TaskStatus` wire enum's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TaskStatus {
    Pending = 1,
    Running = 2,
    Completed = 3,
    Failed = 4,
    Cancelled = 5,
    Timeout = 6,
}

impl TaskStatus {
    pub const ALL: [TaskStatus; 6] = [
        TaskStatus::Pending,
        TaskStatus::Running,
        TaskStatus::Completed,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
        TaskStatus::Timeout,
    ];

    pub fn number(self) -> i32 {
        self as i32
    }

    pub fn from_number(n: i32) -> Option<TaskStatus> {
        TaskStatus::ALL.into_iter().find(|s| s.number() == n)
    }

    pub fn is_terminal(self) -> bool {
        !matches!(self, TaskStatus::Pending | TaskStatus::Running)
    }

    pub fn name(self) -> &'static str {
        match self {
            TaskStatus::Pending => "PENDING",
            TaskStatus::Running => "RUNNING",
            TaskStatus::Completed => "COMPLETED",
            TaskStatus::Failed => "FAILED",
            TaskStatus::Cancelled => "CANCELLED",
            TaskStatus::Timeout => "TIMEOUT",
        }
    }
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskSpec {
    /// The session the task is bound to (may be empty).
    pub session_id: String,
    /// Aria's free-form `type` (e.g. "container:exec").
    pub kind: String,
    /// argv: the parsed `command_json` array.
    pub command: Vec<String>,
    pub environment: BTreeMap<String, String>,
    /// 0 = no timeout.
    pub timeout_ms: u64,
    pub working_dir: String,
    /// Who asked for it: the user of the client that launched it ("" when not known).
    pub user: String,
    /// The container it runs in (`container:exec`; "" for none).
    pub container_id: String,
    /// The task that launched it, as the client said ("" for none).
    pub parent_task_id: String,
}

/// The task `type` paddock runs: a command as a local process (Aria's `type` left empty means
/// it too).
pub const COMMAND_KIND: &str = "command";

/// The task `type` that runs a command in a container (the seed's `container:exec`).
pub const CONTAINER_EXEC_KIND: &str = "container:exec";

/// What an Aria task `type` means here, for a task with a container (`in_container`) or
/// without: the kind paddock runs it as, or why it does not run it. `container:exec` runs in
/// the task's container (and a task with a container is one, whatever its type says is
/// empty); `bundle:build` needs a bundle pipeline, which paddock does not have; an unknown
/// type is refused rather than run as something else.
pub fn kind_of(requested: &str, in_container: bool) -> Result<&'static str, TaskKindError> {
    match (requested.trim(), in_container) {
        ("" | CONTAINER_EXEC_KIND, true) => Ok(CONTAINER_EXEC_KIND),
        ("" | COMMAND_KIND, false) => Ok(COMMAND_KIND),
        (CONTAINER_EXEC_KIND, false) => Err(TaskKindError::NeedsContainer),
        (COMMAND_KIND, true) => Err(TaskKindError::CommandInContainer),
        ("bundle:build", _) => Err(TaskKindError::BundleBuild),
        (other, _) => Err(TaskKindError::Unknown(other.to_string())),
    }
}

/// Why [`kind_of`] does not run a task `type`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskKindError {
    /// `container:exec` for a task without a container.
    #[error(
        "task type \"container:exec\" needs a container: give container_id (a container \
         made with ContainerService.CreateContainer), or launch type \"command\" to run it \
         on the host"
    )]
    NeedsContainer,
    /// `command` for a task with a container.
    #[error(
        "task type \"command\" runs on the host; a task with a container_id is \
         \"container:exec\""
    )]
    CommandInContainer,
    /// `bundle:build`: paddock has no bundle pipeline.
    #[error("task type \"bundle:build\" (an .aria bundle build) is not something paddock runs")]
    BundleBuild,
    /// A type paddock does not know (trimmed).
    #[error(
        "task type {0:?} is not one paddock runs; type \"command\" runs command_json \
         as a local process, \"container:exec\" in a container"
    )]
    Unknown(String),
}

/// The `kind` of the task an obey `Execute` runs: its output streams to the caller as it
/// comes, with no `::progress` convention.
pub const EXECUTE_KIND: &str = "obey:execute";

impl TaskSpec {
    /// Whether stdout lines following the `::progress` convention report progress (Aria
    /// tasks) rather than being output (an obey `Execute`).
    pub fn reports_progress(&self) -> bool {
        self.kind != EXECUTE_KIND
    }
}

/// The durable record of a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRecord {
    pub id: String,
    pub spec: TaskSpec,
    pub status: TaskStatus,
    pub created_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub completed_at: Option<Timestamp>,
    pub exit_code: Option<i32>,
    pub error_message: Option<String>,
    /// Progress in hundredths of a percent (0..=10000), so the record stays `Eq`.
    pub progress_centi: u32,
    pub current_operation: String,
    pub pid: Option<u32>,
    /// Output bytes kept so far.
    pub output_bytes: u64,
    /// The last output sequence number.
    pub last_output_seq: u64,
    /// True once output was cut at the limit.
    pub truncated: bool,
}

impl TaskRecord {
    /// A task just launched: PENDING, nothing run nor printed yet.
    pub fn new(id: String, spec: TaskSpec, created_at: Timestamp) -> TaskRecord {
        TaskRecord {
            id,
            spec,
            status: TaskStatus::Pending,
            created_at,
            started_at: None,
            completed_at: None,
            exit_code: None,
            error_message: None,
            progress_centi: 0,
            current_operation: String::new(),
            pid: None,
            output_bytes: 0,
            last_output_seq: 0,
            truncated: false,
        }
    }
}

/// One line of output or a progress report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputKind {
    Stdout(String),
    Stderr(String),
    /// Percent in hundredths, and what is being done.
    Progress {
        centi: u32,
        operation: String,
    },
}

/// One output record, stored and streamed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskOutput {
    pub task: String,
    pub seq: u64,
    pub kind: OutputKind,
    pub at: Timestamp,
}

/// A task status change, for the notification stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskStatusEvent {
    pub task: String,
    pub status: TaskStatus,
    pub message: String,
    pub exit_code: Option<i32>,
    pub at: Timestamp,
}

/// What a client asks of the tasks, or what a task's process did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskInput {
    Launch {
        req: RequestId,
        id: String,
        /// Boxed: see `Input::Create`.
        spec: Box<TaskSpec>,
    },
    Cancel {
        req: RequestId,
        id: String,
    },
    Started {
        id: String,
        pid: u32,
    },
    SpawnFailed {
        id: String,
        reason: String,
    },
    Output {
        id: String,
        kind: OutputKind,
    },
    /// Sent only after all output was reported.
    Exited {
        id: String,
        code: Option<i32>,
        signal: Option<i32>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskReply {
    Launched(String),
    Cancel { initiated: bool },
}

/// Bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskLimits {
    /// Output bytes kept per task; past it one marker line is kept and the rest dropped.
    pub max_output_bytes: u64,
    /// TERM → KILL on cancel or timeout.
    pub kill_grace: Duration,
    /// Tasks not yet terminal at once.
    pub max_live_tasks: usize,
}

impl Default for TaskLimits {
    fn default() -> Self {
        TaskLimits {
            max_output_bytes: 4 * 1024 * 1024,
            kill_grace: crate::process::KILL_GRACE,
            max_live_tasks: 64,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    None,
    Cancel,
    Timeout,
}

#[derive(Debug, Clone)]
struct Task {
    record: TaskRecord,
    ending: Ending,
    timeout_at: Option<Instant>,
    /// Its command's process, from its spawn to its exit: `Starting` while PENDING, then
    /// `Alive` and, once ended, `Terminating` (never a second TERM: a cancel after a timeout's
    /// KILL must not start the escalation again).
    life: Option<Life>,
    /// The most output its record may hold: the limit it runs under, or what it stored under
    /// a larger limit when it comes back from the store (a daemon restarted with a smaller
    /// `--task-output-max-bytes` takes its old tasks back as they are; they gain no output).
    output_bound: u64,
}

/// Which deadline is next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TaskTimer {
    Timeout,
    Kill,
}

impl TaskTimer {
    pub fn reason(self) -> &'static str {
        match self {
            TaskTimer::Timeout => "task timeout",
            TaskTimer::Kill => "task TERM to KILL escalation",
        }
    }
}

/// Every task of a daemon.
#[derive(Debug, Clone, Default)]
pub struct Tasks {
    tasks: BTreeMap<String, Task>,
    limits: TaskLimits,
}

impl Tasks {
    pub fn new(limits: TaskLimits) -> Self {
        Tasks {
            tasks: BTreeMap::new(),
            limits,
        }
    }

    /// Rebuilds from the store at daemon start-up, and decides what becomes of the task
    /// processes the previous daemon left running (`surviving`: task id → pid, as the runner
    /// lists its live task runs). A task's output is not kept across a daemon's death (there is
    /// no cursor for it), so no task is adopted: one that was PENDING or RUNNING is FAILED,
    /// and every surviving task process — its task's or one no record names as running — is
    /// killed rather than left running unowned. (Normally none survives: a task's process
    /// ends with the daemon.)
    pub(crate) fn restore(
        limits: TaskLimits,
        now: Now,
        records: impl IntoIterator<Item = TaskRecord>,
        surviving: &BTreeMap<String, Option<u32>>,
        out: &mut Out,
    ) -> Self {
        let mut t = Tasks::new(limits);
        for mut record in records {
            if !record.status.is_terminal() {
                // A task's process ends with the daemon (the parent-death signal, or the
                // runner's stop when the daemon's connection closes); one still running now
                // escaped that (a daemon frozen rather than dead) and is killed here.
                let why = if surviving.contains_key(&record.id) {
                    "the daemon restarted while the task ran; its process was killed"
                } else {
                    "the daemon restarted while the task ran; its process ended with the daemon"
                };
                record.status = TaskStatus::Failed;
                record.completed_at = Some(now.wall);
                record.pid = None;
                record.error_message = Some(why.into());
                out.persist
                    .push(Effect::Persist(Record::Task(Box::new(record.clone()))));
                out.rest.push(Effect::EmitTaskStatus(TaskStatusEvent {
                    task: record.id.clone(),
                    status: record.status,
                    message: why.into(),
                    exit_code: None,
                    at: now.wall,
                }));
            }
            let id = record.id.clone();
            let task = Task::stored(record, &t.limits);
            t.tasks.insert(id, task);
        }
        for (id, pid) in surviving {
            out.rest.push(Effect::SignalTask {
                id: id.clone(),
                pid: *pid,
                signal: Signal::Kill,
            });
        }
        for task in t.tasks.values() {
            task.assert_invariants();
        }
        t
    }

    pub fn get(&self, id: &str) -> Option<&TaskRecord> {
        self.tasks.get(id).map(|t| &t.record)
    }

    /// Lets go of every ended task (its record is stored as it is: an ended task has no
    /// process and no deadline, and nothing changes it again): the tasks held follow the
    /// live ones, not the history.
    pub(crate) fn evict_ended(&mut self) {
        // Nothing of an ended task runs or waits (`Task::assert_invariants`).
        self.tasks.retain(|_, t| !t.record.status.is_terminal());
    }

    /// Takes back an ended task from the store (see [`Tasks::evict_ended`]).
    pub(crate) fn recall(&mut self, record: TaskRecord) {
        assert!(
            record.status.is_terminal(),
            "only an ended task is recalled ({} is {:?})",
            record.id,
            record.status
        );
        let id = record.id.clone();
        let task = Task::stored(record, &self.limits);
        task.assert_invariants();
        assert!(
            self.tasks.insert(id.clone(), task).is_none(),
            "task {id} is recalled once"
        );
    }

    pub fn all(&self) -> impl Iterator<Item = &TaskRecord> {
        self.tasks.values().map(|t| &t.record)
    }

    pub fn live(&self) -> usize {
        self.tasks
            .values()
            .filter(|t| !t.record.status.is_terminal() || t.has_process())
            .count()
    }

    /// The earliest deadline: when, which task, why.
    pub fn poll_timeout(&self) -> Option<(Instant, &String, TaskTimer)> {
        let mut best: Option<(Instant, &String, TaskTimer)> = None;
        for (id, t) in &self.tasks {
            for (at, why) in [
                (t.timeout_at, TaskTimer::Timeout),
                (t.life.and_then(|l| l.deadline()), TaskTimer::Kill),
            ] {
                if let Some(at) = at {
                    if best.is_none_or(|(b, _, _)| at < b) {
                        best = Some((at, id, why));
                    }
                }
            }
        }
        best
    }

    /// One task input at `now` (the engine's time, which never goes backwards).
    pub(crate) fn handle(&mut self, now: Now, input: TaskInput, out: &mut Out) {
        match input {
            TaskInput::Launch { req, id, spec } => self.launch(now, req, id, spec, out),
            TaskInput::Cancel { req, id } => self.cancel(now, req, &id, out),
            TaskInput::Started { id, pid } => {
                if let Some(t) = self.tasks.get_mut(&id) {
                    if t.record.status == TaskStatus::Pending {
                        t.life
                            .as_mut()
                            .expect("a PENDING task's spawn was asked for")
                            .started(Some(pid));
                        t.record.pid = Some(pid);
                        t.record.started_at = Some(now.wall);
                        t.timeout_at = (t.record.spec.timeout_ms > 0)
                            .then(|| now.after(Duration::from_millis(t.record.spec.timeout_ms)));
                        set_status(t, TaskStatus::Running, "running", now, out);
                        if t.ending != Ending::None {
                            // Cancelled while it was being spawned.
                            terminate(t, now, self.limits.kill_grace, out);
                        }
                    }
                }
            }
            TaskInput::SpawnFailed { id, reason } => {
                if let Some(t) = self.tasks.get_mut(&id) {
                    if t.record.status == TaskStatus::Pending {
                        t.life = None;
                        t.record.error_message = Some(format!("could not start: {reason}"));
                        t.record.completed_at = Some(now.wall);
                        let msg = t.record.error_message.clone().unwrap_or_default();
                        set_status(t, TaskStatus::Failed, &msg, now, out);
                    }
                }
            }
            TaskInput::Output { id, kind } => {
                let max = self.limits.max_output_bytes;
                if let Some(t) = self.tasks.get_mut(&id) {
                    if t.record.status == TaskStatus::Running {
                        output(t, kind, max, now, out);
                    }
                }
            }
            TaskInput::Exited { id, code, signal } => {
                if let Some(t) = self.tasks.get_mut(&id) {
                    exited(t, code, signal, now, out);
                }
            }
        }
        self.assert_invariants();
    }

    /// The daemon is shutting down: cancel every task not yet terminal (answered to nobody,
    /// [`crate::NO_REPLY`]).
    pub(crate) fn handle_shutdown(&mut self, now: Now, out: &mut Out) {
        let live: Vec<String> = self
            .all()
            .filter(|t| !t.status.is_terminal())
            .map(|t| t.id.clone())
            .collect();
        for id in live {
            self.cancel(now, crate::NO_REPLY, &id, out);
        }
        self.assert_invariants();
    }

    /// Time passed: fire every task deadline at or before `now`.
    pub(crate) fn handle_tick(&mut self, now: Now, out: &mut Out) {
        let grace = self.limits.kill_grace;
        for t in self.tasks.values_mut() {
            if t.timeout_at.is_some_and(|at| at <= now.at) {
                t.timeout_at = None;
                if t.record.status == TaskStatus::Running && t.ending == Ending::None {
                    t.ending = Ending::Timeout;
                    terminate(t, now, grace, out);
                }
            }
            let kill = t.life.as_mut().and_then(|l| l.tick(now.at));
            if let (Some(signal), Some(pid)) = (kill, t.record.pid) {
                out.rest.push(Effect::SignalTask {
                    id: t.record.id.clone(),
                    pid: Some(pid),
                    signal,
                });
            }
        }
        self.assert_invariants();
    }

    fn assert_invariants(&self) {
        for t in self.tasks.values() {
            t.assert_invariants();
        }
    }

    fn launch(&mut self, now: Now, req: RequestId, id: String, spec: Box<TaskSpec>, out: &mut Out) {
        let refuse = if self.tasks.contains_key(&id) {
            Some(format!("a task with id {id} already exists"))
        } else if spec.command.is_empty() || spec.command[0].is_empty() {
            Some("the command is empty".to_string())
        } else if self.live() >= self.limits.max_live_tasks {
            Some(format!(
                "limit of {} running tasks reached",
                self.limits.max_live_tasks
            ))
        } else {
            None
        };
        if let Some(msg) = refuse {
            out.rest.push(Effect::ReplyTask {
                req,
                result: Err(Error::new(ErrorCode::Generic, msg)),
            });
            return;
        }
        let record = TaskRecord::new(id.clone(), TaskSpec::clone(&spec), now.wall);
        out.persist
            .push(Effect::Persist(Record::Task(Box::new(record.clone()))));
        out.rest.push(Effect::EmitTaskStatus(TaskStatusEvent {
            task: id.clone(),
            status: TaskStatus::Pending,
            message: "launched".into(),
            exit_code: None,
            at: now.wall,
        }));
        out.rest.push(Effect::SpawnTask {
            id: id.clone(),
            spec,
        });
        out.rest.push(Effect::ReplyTask {
            req,
            result: Ok(TaskReply::Launched(id.clone())),
        });
        self.tasks.insert(
            id,
            Task {
                record,
                ending: Ending::None,
                timeout_at: None,
                life: Some(Life::Starting),
                output_bound: self.limits.max_output_bytes,
            },
        );
    }

    /// Container `container` stopped or went away: every task still running in it ends as
    /// cancelled (TERM, then KILL after the grace).
    pub(crate) fn end_in_container(&mut self, now: Now, container: &str, out: &mut Out) {
        self.end_where(now, |s| s.container_id == container, out)
    }

    /// Session `session` is being stopped or deleted: the commands run in it (`session exec`,
    /// an Aria task bound to it) end with it, as cancelled.
    pub(crate) fn end_of_session(&mut self, now: Now, session: &str, out: &mut Out) {
        self.end_where(now, |s| s.session_id == session, out)
    }

    fn end_where(&mut self, now: Now, of: impl Fn(&TaskSpec) -> bool, out: &mut Out) {
        let grace = self.limits.kill_grace;
        for t in self.tasks.values_mut() {
            if of(&t.record.spec) && !t.record.status.is_terminal() && t.ending != Ending::Cancel {
                t.ending = Ending::Cancel;
                t.timeout_at = None;
                terminate(t, now, grace, out);
            }
        }
    }

    fn cancel(&mut self, now: Now, req: RequestId, id: &str, out: &mut Out) {
        let grace = self.limits.kill_grace;
        let Some(t) = self.tasks.get_mut(id) else {
            out.rest.push(Effect::ReplyTask {
                req,
                result: Err(Error::new(
                    ErrorCode::Generic,
                    format!("task \"{id}\" not found"),
                )),
            });
            return;
        };
        let initiated = !t.record.status.is_terminal() && t.ending != Ending::Cancel;
        if initiated {
            t.ending = Ending::Cancel;
            t.timeout_at = None;
            terminate(t, now, grace, out);
        }
        out.rest.push(Effect::ReplyTask {
            req,
            result: Ok(TaskReply::Cancel { initiated }),
        });
    }
}

fn set_status(t: &mut Task, status: TaskStatus, message: &str, now: Now, out: &mut Out) {
    t.record.status = status;
    out.persist
        .push(Effect::Persist(Record::Task(Box::new(t.record.clone()))));
    out.rest.push(Effect::EmitTaskStatus(TaskStatusEvent {
        task: t.record.id.clone(),
        status,
        message: message.to_string(),
        exit_code: t.record.exit_code,
        at: now.wall,
    }));
}

/// TERM its process now, KILL after `grace`; nothing for a process not started yet (it is
/// terminated once it starts) nor for one already being ended.
fn terminate(t: &mut Task, now: Now, grace: Duration, out: &mut Out) {
    if let Some(life @ Life::Alive { .. }) = t.life.as_mut() {
        if let Some(signal) = life.terminate(now.at, grace) {
            out.rest.push(Effect::SignalTask {
                id: t.record.id.clone(),
                pid: life.pid(),
                signal,
            });
        }
    }
}

fn output(t: &mut Task, kind: OutputKind, max: u64, now: Now, out: &mut Out) {
    let len = match &kind {
        OutputKind::Stdout(s) | OutputKind::Stderr(s) => s.len() as u64 + 1,
        OutputKind::Progress { .. } => 0,
    };
    let kind = if let OutputKind::Progress { centi, operation } = &kind {
        t.record.progress_centi = (*centi).min(10_000);
        t.record.current_operation = operation.clone();
        kind
    } else if t.truncated_at(max, len) {
        if t.record.truncated {
            return; // already marked: dropped
        }
        t.record.truncated = true;
        OutputKind::Stderr(format!(
            "[paddock: output truncated: more than {max} bytes; the rest of this task's output is discarded]"
        ))
    } else {
        t.record.output_bytes += len;
        kind
    };
    t.record.last_output_seq = t
        .record
        .last_output_seq
        .checked_add(1)
        .expect("output sequence numbers never run out");
    let o = TaskOutput {
        task: t.record.id.clone(),
        seq: t.record.last_output_seq,
        kind,
        at: now.wall,
    };
    out.persist
        .push(Effect::Persist(Record::TaskOutput(o.clone())));
    out.persist
        .push(Effect::Persist(Record::Task(Box::new(t.record.clone()))));
    out.rest.push(Effect::EmitTaskOutput(o));
}

impl Task {
    /// A task as the store kept it: ended, nothing of it running or waiting.
    fn stored(record: TaskRecord, limits: &TaskLimits) -> Task {
        Task {
            output_bound: limits.max_output_bytes.max(record.output_bytes),
            record,
            ending: Ending::None,
            timeout_at: None,
            life: None,
        }
    }

    /// What holds for every task after every step (the pair of the changes in `handle`).
    fn assert_invariants(&self) {
        let r = &self.record;
        if r.status.is_terminal() {
            assert!(
                self.life.is_none() && r.pid.is_none(),
                "a finished task {} has no live process",
                r.id
            );
            assert!(r.completed_at.is_some(), "a finished task has its end time");
            assert!(self.timeout_at.is_none(), "a finished task has no deadline");
        }
        assert_eq!(
            r.status == TaskStatus::Pending,
            self.life == Some(Life::Starting),
            "task {}: a process is being spawned exactly while PENDING",
            r.id
        );
        assert!(
            matches!(
                self.life,
                None | Some(Life::Starting | Life::Alive { .. } | Life::Terminating { .. })
            ),
            "task {}: a task's process is never asked to end its own way",
            r.id
        );
        assert_eq!(
            self.has_process(),
            r.pid.is_some(),
            "task {}: a pid is known exactly while its process lives",
            r.id
        );
        assert!(
            !self.has_process() || r.pid == self.life.and_then(|l| l.pid()),
            "task {}: the record's pid is its process's",
            r.id
        );
        assert!(
            !self.has_process() || r.status == TaskStatus::Running,
            "task {}: only a RUNNING task has a process",
            r.id
        );
        assert!(
            r.output_bytes <= self.output_bound,
            "task {}: output is bounded",
            r.id
        );
    }

    /// Its process started and has not exited.
    fn has_process(&self) -> bool {
        self.life.is_some_and(|l| l.has_process())
    }

    fn truncated_at(&self, max: u64, len: u64) -> bool {
        self.record.truncated || self.record.output_bytes + len > max
    }
}

fn exited(t: &mut Task, code: Option<i32>, signal: Option<i32>, now: Now, out: &mut Out) {
    if !t.has_process() {
        return;
    }
    t.life = None;
    t.timeout_at = None;
    t.record.pid = None;
    t.record.completed_at = Some(now.wall);
    t.record.exit_code = crate::process::exit_code(code, signal);
    let (status, message) = match (t.ending, code) {
        (Ending::Cancel, _) => (TaskStatus::Cancelled, "cancelled".to_string()),
        (Ending::Timeout, _) => (
            TaskStatus::Timeout,
            format!(
                "timed out after {} s and was killed",
                t.record.spec.timeout_ms / 1000
            ),
        ),
        (Ending::None, Some(0)) => (TaskStatus::Completed, "completed".to_string()),
        (Ending::None, Some(c)) => (TaskStatus::Failed, format!("exited with code {c}")),
        (Ending::None, None) => (
            TaskStatus::Failed,
            crate::process::describe_exit(code, signal),
        ),
    };
    if status != TaskStatus::Completed {
        t.record.error_message = Some(message.clone());
    }
    set_status(t, status, &message, now, out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Deadline, Engine, Input, Limits, Stored, Surviving};

    /// The same reading on both clocks, `ms` after their origins.
    fn now(ms: u64) -> Now {
        Now::new(Instant::from_millis(ms), Timestamp::from_millis(ms))
    }

    #[test]
    fn statuses_are_the_wire_enums_numbers_and_names() {
        // aria.v1.TaskStatus: 0 is UNSPECIFIED.
        assert_eq!(TaskStatus::ALL.map(TaskStatus::number), [1, 2, 3, 4, 5, 6]);
        for s in TaskStatus::ALL {
            assert_eq!(TaskStatus::from_number(s.number()), Some(s));
        }
        assert_eq!(TaskStatus::from_number(0), None);
        assert_eq!(TaskStatus::from_number(7), None);
        let names = TaskStatus::ALL.map(TaskStatus::name);
        assert_eq!(
            names,
            [
                "PENDING",
                "RUNNING",
                "COMPLETED",
                "FAILED",
                "CANCELLED",
                "TIMEOUT"
            ]
        );
    }

    #[test]
    fn only_an_execute_does_not_report_progress() {
        let spec = |kind: &str| TaskSpec {
            kind: kind.into(),
            ..TaskSpec::default()
        };
        assert!(!spec(EXECUTE_KIND).reports_progress());
        assert!(spec(COMMAND_KIND).reports_progress());
        assert!(spec(CONTAINER_EXEC_KIND).reports_progress());
    }

    #[test]
    fn task_types_run_only_as_what_they_say() {
        assert_eq!(kind_of("", false), Ok(COMMAND_KIND));
        assert_eq!(kind_of("command", false), Ok(COMMAND_KIND));
        assert_eq!(
            kind_of("container:exec", false),
            Err(TaskKindError::NeedsContainer)
        );
        assert_eq!(kind_of("container:exec", true), Ok(CONTAINER_EXEC_KIND));
        assert_eq!(kind_of("", true), Ok(CONTAINER_EXEC_KIND));
        assert_eq!(
            kind_of("command", true),
            Err(TaskKindError::CommandInContainer)
        );
        assert_eq!(
            kind_of("bundle:build", false),
            Err(TaskKindError::BundleBuild)
        );
        assert_eq!(
            kind_of(" make ", false),
            Err(TaskKindError::Unknown("make".into()))
        );
    }

    /// Each refusal of `kind_of` in the words a LaunchTask gets.
    #[test]
    fn task_kind_refusals_keep_their_words() {
        let refused = |requested: &str, in_container: bool, words: &str| {
            let e = kind_of(requested, in_container).unwrap_err();
            assert_eq!(e.to_string(), words, "{e:?}");
            e
        };
        let e = refused(
            "container:exec",
            false,
            "task type \"container:exec\" needs a container: give container_id (a container made \
             with ContainerService.CreateContainer), or launch type \"command\" to run it on the \
             host",
        );
        assert!(matches!(e, TaskKindError::NeedsContainer));
        let e = refused(
            "command",
            true,
            "task type \"command\" runs on the host; a task with a container_id is \
             \"container:exec\"",
        );
        assert!(matches!(e, TaskKindError::CommandInContainer));
        let e = refused(
            "bundle:build",
            true,
            "task type \"bundle:build\" (an .aria bundle build) is not something paddock runs",
        );
        assert!(matches!(e, TaskKindError::BundleBuild));
        let e = refused(
            "x\"y",
            false,
            "task type \"x\\\"y\" is not one paddock runs; type \"command\" runs command_json as a \
             local process, \"container:exec\" in a container",
        );
        assert!(matches!(e, TaskKindError::Unknown(t) if t == "x\"y"));
    }

    fn spec() -> TaskSpec {
        TaskSpec {
            command: vec!["echo".into(), "hi".into()],
            timeout_ms: 5_000,
            ..TaskSpec::default()
        }
    }

    fn limits() -> Limits {
        Limits {
            tasks: TaskLimits {
                max_output_bytes: 10,
                kill_grace: Duration::from_secs(1),
                max_live_tasks: 2,
            },
            ..Limits::default()
        }
    }

    /// The engine, fed task inputs only.
    struct T(Engine);

    impl T {
        fn new() -> Self {
            T(Engine::new(limits()))
        }
        fn at(&mut self, ms: u64, input: TaskInput) -> Vec<Effect> {
            self.0.handle(now(ms), Input::Task(input))
        }
        fn started(&mut self, ms: u64, id: &str, pid: u32) -> Vec<Effect> {
            self.at(ms, TaskInput::Started { id: id.into(), pid })
        }
        fn exited(&mut self, ms: u64, id: &str, code: Option<i32>, signal: Option<i32>) {
            self.at(
                ms,
                TaskInput::Exited {
                    id: id.into(),
                    code,
                    signal,
                },
            );
        }
        fn launch(&mut self, id: &str) -> Vec<Effect> {
            self.launch_with(id, spec())
        }
        fn launch_with(&mut self, id: &str, spec: TaskSpec) -> Vec<Effect> {
            self.at(
                0,
                TaskInput::Launch {
                    req: 1,
                    id: id.into(),
                    spec: spec.into(),
                },
            )
        }
        fn status(&self, id: &str) -> TaskStatus {
            self.0.task(id).unwrap().status
        }
    }

    fn signal(id: &str, pid: u32, signal: Signal) -> Effect {
        Effect::SignalTask {
            id: id.into(),
            pid: Some(pid),
            signal,
        }
    }

    #[test]
    fn a_task_for_a_session_the_engine_does_not_have_is_refused() {
        let mut t = T::new();
        let fx = t.at(
            0,
            TaskInput::Launch {
                req: 1,
                id: "a".into(),
                spec: Box::new(TaskSpec {
                    session_id: "sess_gone".into(),
                    ..spec()
                }),
            },
        );
        assert!(
            fx.iter().any(|e| matches!(e, Effect::ReplyTask { result: Err(e), .. } if e.code == ErrorCode::SessionNotFound)),
            "{fx:?}"
        );
        assert!(!fx.iter().any(|e| matches!(e, Effect::SpawnTask { .. })));
    }

    #[test]
    fn a_containers_tasks_run_only_while_it_runs_and_end_with_its_stop() {
        use crate::container::{ContainerEvent, ContainerRequest, ContainerSpec};
        let mut t = T::new();
        let in_ctr = |id: &str| TaskInput::Launch {
            req: 1,
            id: id.into(),
            spec: Box::new(TaskSpec {
                container_id: "c".into(),
                ..spec()
            }),
        };
        let refused = |fx: &[Effect]| {
            fx.iter().any(|e| matches!(e, Effect::ReplyTask { result: Err(e), .. } if e.code == ErrorCode::ContainerNotFound || e.code == ErrorCode::WrongState))
        };
        assert!(refused(&t.at(0, in_ctr("a"))), "no such container");
        let ctr = |request| Input::Container {
            req: 2,
            id: "c".into(),
            request,
        };
        let spec_c = ContainerSpec {
            working_dir: "/ws".into(),
            environment: [("K".to_string(), "v".to_string())].into_iter().collect(),
            ..ContainerSpec::default()
        };
        t.0.handle(now(1), ctr(ContainerRequest::Create(Box::new(spec_c))));
        assert!(refused(&t.at(2, in_ctr("a"))), "still being made");
        t.0.handle(
            now(3),
            Input::ContainerReport {
                id: "c".into(),
                event: ContainerEvent::Made,
            },
        );
        let fx = t.at(4, in_ctr("a"));
        let spawned = fx.iter().find_map(|e| match e {
            Effect::SpawnTask { spec, .. } => Some(spec.clone()),
            _ => None,
        });
        let spawned = spawned.expect("launched in the running container");
        assert_eq!(spawned.working_dir, "/ws");
        assert_eq!(spawned.environment.get("K").map(String::as_str), Some("v"));
        t.started(5, "a", 7);
        let fx = t.0.handle(now(6), ctr(ContainerRequest::Stop));
        assert!(fx.contains(&signal("a", 7, Signal::Term)), "{fx:?}");
        t.exited(7, "a", None, Some(15));
        assert_eq!(t.status("a"), TaskStatus::Cancelled);
    }

    #[test]
    fn a_task_runs_to_completion() {
        let mut t = T::new();
        let fx = t.launch("a");
        assert!(matches!(fx[0], Effect::Persist(Record::Task(_))));
        assert!(fx.iter().any(|e| matches!(e, Effect::SpawnTask { .. })));
        t.started(1, "a", 5);
        assert_eq!(t.status("a"), TaskStatus::Running);
        let fx = t.at(
            2,
            TaskInput::Output {
                id: "a".into(),
                kind: OutputKind::Stdout("hi".into()),
            },
        );
        assert!(matches!(fx[0], Effect::Persist(Record::TaskOutput(_))));
        t.exited(3, "a", Some(0), None);
        let r = t.0.task("a").unwrap();
        assert_eq!(
            (r.status, r.exit_code, r.completed_at),
            (
                TaskStatus::Completed,
                Some(0),
                Some(Timestamp::from_millis(3))
            )
        );
        assert_eq!(r.error_message, None);
    }

    #[test]
    fn non_zero_exit_fails_and_spawn_failure_fails() {
        let mut t = T::new();
        t.launch("a");
        t.started(1, "a", 5);
        t.exited(2, "a", Some(3), None);
        assert_eq!(t.status("a"), TaskStatus::Failed);
        t.launch("b");
        t.at(
            1,
            TaskInput::SpawnFailed {
                id: "b".into(),
                reason: "nope".into(),
            },
        );
        assert_eq!(t.status("b"), TaskStatus::Failed);
        assert!(t
            .0
            .task("b")
            .unwrap()
            .error_message
            .as_ref()
            .unwrap()
            .contains("nope"));
    }

    #[test]
    fn a_shutdown_cancels_every_live_task() {
        let mut t = T::new();
        t.launch("a");
        t.launch("b");
        t.started(1, "a", 5);
        let fx = t.0.handle(
            now(2),
            Input::Shutdown {
                req: 7,
                graceful: true,
            },
        );
        assert!(fx.contains(&signal("a", 5, Signal::Term)));
        assert!(fx.contains(&Effect::ReplyShutdown { req: 7, live: 0 }));
        // Still being spawned: ended as soon as it has started.
        let fx = t.started(3, "b", 6);
        assert!(fx.contains(&signal("b", 6, Signal::Term)));
        // And nothing new is launched.
        let fx = t.launch("c");
        assert!(
            matches!(&fx[..], [Effect::ReplyTask { req: 1, result: Err(e) }]
                if e.code == crate::ErrorCode::ShuttingDown),
            "{fx:?}"
        );
        assert!(t.0.task("c").is_none());
    }

    #[test]
    fn timeout_terminates_then_kills() {
        let mut t = T::new();
        t.launch("a");
        t.started(1, "a", 5);
        let due = |ms, timer| (Instant::from_millis(ms), Deadline::Task("a".into(), timer));
        assert_eq!(t.0.poll_timeout(), Some(due(5_001, TaskTimer::Timeout)));
        let fx = t.0.handle(now(5_001), Input::Tick);
        assert!(fx.contains(&signal("a", 5, Signal::Term)));
        assert_eq!(t.0.poll_timeout(), Some(due(6_001, TaskTimer::Kill)));
        let fx = t.0.handle(now(6_001), Input::Tick);
        assert!(fx.contains(&signal("a", 5, Signal::Kill)));
        t.exited(6_002, "a", None, Some(9));
        assert_eq!(t.status("a"), TaskStatus::Timeout);
        assert!(t.0.poll_timeout().is_none());
    }

    #[test]
    fn the_earliest_deadline_of_all_tasks_is_the_one_polled() {
        let mut t = T::new();
        let timeout = |ms| TaskSpec {
            timeout_ms: ms,
            ..spec()
        };
        t.launch_with("a", timeout(9_000));
        t.launch_with("b", timeout(2_000));
        t.started(1, "a", 5);
        t.started(1, "b", 6);
        let due = |ms, id: &str| {
            let timer = Deadline::Task(id.into(), TaskTimer::Timeout);
            Some((Instant::from_millis(ms), timer))
        };
        assert_eq!(t.0.poll_timeout(), due(2_001, "b"));
        // A tie goes to the first by id.
        t.exited(2, "a", Some(0), None);
        t.exited(2, "b", Some(0), None);
        t.launch_with("d", timeout(2_000));
        t.launch_with("c", timeout(2_000));
        t.started(3, "d", 7);
        t.started(3, "c", 8);
        assert_eq!(t.0.poll_timeout(), due(2_003, "c"));
    }

    #[test]
    fn a_task_without_a_timeout_runs_until_it_ends() {
        let mut t = T::new();
        t.launch_with(
            "a",
            TaskSpec {
                timeout_ms: 0,
                ..spec()
            },
        );
        t.started(1, "a", 5);
        assert_eq!(t.0.poll_timeout(), None);
        let fx = t.0.handle(now(86_400_000), Input::Tick);
        assert!(!fx.contains(&signal("a", 5, Signal::Term)), "{fx:?}");
        assert_eq!(t.status("a"), TaskStatus::Running);
    }

    #[test]
    fn a_timeout_due_after_a_cancel_changes_nothing() {
        let mut t = T::new();
        t.launch("a");
        // Cancelled while its spawn is under way: TERMed as it starts, its timeout set then.
        t.at(
            0,
            TaskInput::Cancel {
                req: 9,
                id: "a".into(),
            },
        );
        let fx = t.started(2, "a", 5);
        assert!(fx.contains(&signal("a", 5, Signal::Term)));
        // The process ignores TERM: its KILL (due at 1,002) and its timeout (5,002) come due.
        let fx = t.0.handle(now(5_002), Input::Tick);
        assert_eq!(fx, [signal("a", 5, Signal::Kill)], "the KILL only");
        t.exited(5_002, "a", None, Some(9));
        assert_eq!(
            t.status("a"),
            TaskStatus::Cancelled,
            "cancelled, not timed out"
        );
    }

    #[test]
    fn a_command_whose_program_is_empty_is_refused() {
        for command in [vec![], vec![String::new(), "hi".into()]] {
            let mut t = T::new();
            let fx = t.launch_with("a", TaskSpec { command, ..spec() });
            assert!(
                fx.iter().any(|e| matches!(e, Effect::ReplyTask { result: Err(e), .. } if e.message.contains("the command is empty"))),
                "{fx:?}"
            );
            assert!(!fx.iter().any(|e| matches!(e, Effect::SpawnTask { .. })));
        }
    }

    #[test]
    #[should_panic(expected = "has no live process")]
    fn the_checker_catches_a_finished_task_with_a_live_process() {
        let mut tasks = Tasks::new(limits().tasks);
        let mut out = crate::session::machine::Out::default();
        let launch = TaskInput::Launch {
            req: 1,
            id: "a".into(),
            spec: spec().into(),
        };
        tasks.handle(now(0), launch, &mut out);
        let started = TaskInput::Started {
            id: "a".into(),
            pid: 5,
        };
        tasks.handle(now(1), started, &mut out);
        tasks.assert_invariants();
        tasks.tasks.get_mut("a").unwrap().record.status = TaskStatus::Completed;
        tasks.assert_invariants();
    }

    #[test]
    fn cancel_once_then_not_again() {
        let mut t = T::new();
        t.launch("a");
        t.started(1, "a", 5);
        let cancel = |req| TaskInput::Cancel {
            req,
            id: "a".into(),
        };
        let fx = t.at(2, cancel(9));
        assert!(fx.contains(&Effect::ReplyTask {
            req: 9,
            result: Ok(TaskReply::Cancel { initiated: true })
        }));
        let fx = t.at(2, cancel(10));
        assert!(fx.contains(&Effect::ReplyTask {
            req: 10,
            result: Ok(TaskReply::Cancel { initiated: false })
        }));
        t.exited(3, "a", None, Some(15));
        assert_eq!(t.status("a"), TaskStatus::Cancelled);
    }

    /// A process is TERMed once: a cancel after a timeout's KILL (the process not reaped yet)
    /// starts no second escalation.
    #[test]
    fn one_term_per_process() {
        let mut t = T::new();
        t.launch("a");
        t.started(1, "a", 5);
        let fx = t.0.handle(now(5_001), Input::Tick);
        assert!(fx.contains(&signal("a", 5, Signal::Term)));
        let fx = t.0.handle(now(6_001), Input::Tick);
        assert!(fx.contains(&signal("a", 5, Signal::Kill)));
        let fx = t.at(
            6_002,
            TaskInput::Cancel {
                req: 3,
                id: "a".into(),
            },
        );
        assert!(
            !fx.iter().any(|e| matches!(e, Effect::SignalTask { .. })),
            "{fx:?}"
        );
        assert_eq!(t.0.poll_timeout(), None);
    }

    /// A new task `id` that prints `lines` on stdout: what reaches its watchers.
    fn printed(id: &str, lines: &[&str]) -> (T, Vec<OutputKind>) {
        let mut t = T::new();
        t.launch(id);
        t.started(1, id, 5);
        let mut kept = Vec::new();
        for line in lines {
            let input = TaskInput::Output {
                id: id.into(),
                kind: OutputKind::Stdout((*line).into()),
            };
            for e in t.at(2, input) {
                if let Effect::EmitTaskOutput(o) = e {
                    kept.push(o.kind);
                }
            }
        }
        (t, kept)
    }

    #[test]
    fn output_is_bounded_with_one_marker() {
        let (t, kept) = printed("a", &["12345", "1234", "x", "y"]);
        // "12345\n" fits in 10 bytes; "1234\n" would not: one marker, then nothing.
        assert_eq!(kept.len(), 2);
        assert!(matches!(&kept[1], OutputKind::Stderr(m) if m.contains("truncated")));
        assert!(t.0.task("a").unwrap().truncated);

        // Output that fills the bound exactly is all kept.
        let (t, kept) = printed("b", &["12345", "123"]);
        assert!(
            matches!(&kept[..], [_, OutputKind::Stdout(l)] if l == "123"),
            "{kept:?}"
        );
        assert!(!t.0.task("b").unwrap().truncated);
    }

    /// A task that ended, as the store keeps it.
    fn ended(id: &str, output_bytes: u64) -> TaskRecord {
        let mut r = TaskRecord::new(id.into(), spec(), Timestamp::from_millis(0));
        r.status = TaskStatus::Completed;
        r.completed_at = Some(Timestamp::from_millis(5));
        r.output_bytes = output_bytes;
        r
    }

    #[test]
    fn ended_tasks_leave_memory_and_come_back_when_named() {
        let mut t = T::new();
        t.launch("done");
        t.started(1, "done", 40);
        t.exited(2, "done", Some(0), None);
        t.launch("running");
        t.started(3, "running", 41);
        t.0.evict_settled();
        assert!(t.0.task("done").is_none(), "an ended task is let go");
        assert_eq!(t.status("running"), TaskStatus::Running);
        // Named again (a cancel): recalled from the store, answered as an ended task.
        t.0.recall_task(ended("done", 0));
        let fx = t.at(
            4,
            TaskInput::Cancel {
                req: 7,
                id: "done".into(),
            },
        );
        assert!(fx.contains(&Effect::ReplyTask {
            req: 7,
            result: Ok(TaskReply::Cancel { initiated: false }),
        }));
    }

    #[test]
    fn a_task_stored_under_a_larger_output_limit_comes_back_as_it_is() {
        // The daemon now runs with 10 bytes (`limits`); the task wrote 4 KiB under an older
        // --task-output-max-bytes. Start-up and a recall take it back without a complaint.
        let stored = Stored {
            tasks: vec![ended("big", 4096)],
            ..Stored::default()
        };
        let (mut e, _) = Engine::restore(limits(), now(10), stored, &Surviving::default());
        assert_eq!(e.task("big").unwrap().output_bytes, 4096);
        e.evict_settled();
        e.recall_task(ended("big", 4096));
        let fx = e.handle(
            now(20),
            Input::Task(TaskInput::Cancel {
                req: 7,
                id: "big".into(),
            }),
        );
        assert!(fx.contains(&Effect::ReplyTask {
            req: 7,
            result: Ok(TaskReply::Cancel { initiated: false }),
        }));
        assert_eq!(e.task("big").unwrap().output_bytes, 4096);
    }

    #[test]
    #[should_panic(expected = "only an ended task is recalled")]
    fn recalling_a_task_that_has_not_ended_is_caught() {
        let mut e = Engine::new(limits());
        e.recall_task(TaskRecord::new(
            "a".into(),
            spec(),
            Timestamp::from_millis(0),
        ));
    }

    #[test]
    #[should_panic(expected = "task a is recalled once")]
    fn recalling_a_task_held_is_caught() {
        let mut e = Engine::new(limits());
        e.recall_task(ended("a", 0));
        e.recall_task(ended("a", 0));
    }

    #[test]
    #[should_panic(expected = "a finished task has no deadline")]
    fn a_finished_task_with_a_deadline_is_caught() {
        let mut task = Task::stored(ended("a", 0), &limits().tasks);
        task.timeout_at = Some(Instant::from_millis(5));
        task.assert_invariants();
    }

    #[test]
    #[should_panic(expected = "task a: output is bounded")]
    fn output_past_a_tasks_bound_is_caught() {
        let mut task = Task::stored(ended("a", 4), &limits().tasks);
        task.record.output_bytes = 11;
        task.assert_invariants();
    }

    /// Start-up: what ran is FAILED (its process lost, or killed if the runner still has
    /// it), and every task process the runner still runs is killed, its task's or not.
    #[test]
    fn restore_fails_what_ran_and_kills_what_survived() {
        let mut t = T::new();
        t.launch("lost");
        t.launch("kept");
        let done = {
            let mut d = t.0.task("lost").unwrap().clone();
            d.id = "done".into();
            d.status = TaskStatus::Completed;
            d.completed_at = Some(Timestamp::from_millis(0));
            d
        };
        let stored = Stored {
            tasks: vec![
                t.0.task("lost").unwrap().clone(),
                t.0.task("kept").unwrap().clone(),
                done,
            ],
            ..Stored::default()
        };
        let surviving = Surviving {
            tasks: [("kept".to_string(), Some(41)), ("done".to_string(), None)]
                .into_iter()
                .collect(),
            ..Surviving::default()
        };
        let (e, fx) = Engine::restore(limits(), now(10), stored, &surviving);
        for id in ["lost", "kept"] {
            let r = e.task(id).unwrap();
            assert_eq!(
                (r.status, r.completed_at, r.pid),
                (TaskStatus::Failed, Some(Timestamp::from_millis(10)), None)
            );
        }
        assert!(e
            .task("kept")
            .unwrap()
            .error_message
            .as_ref()
            .unwrap()
            .contains("killed"));
        assert!(e
            .task("lost")
            .unwrap()
            .error_message
            .as_ref()
            .unwrap()
            .contains("ended with the daemon"));
        assert_eq!(e.task("done").unwrap().status, TaskStatus::Completed);
        assert_eq!(e.live_tasks(), 0);
        let persisted: Vec<&str> = fx
            .iter()
            .filter_map(|x| match x {
                Effect::Persist(Record::Task(r)) => Some(r.id.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(persisted, ["lost", "kept"]);
        let kills: Vec<&Effect> = fx
            .iter()
            .filter(|x| matches!(x, Effect::SignalTask { .. }))
            .collect();
        assert_eq!(
            kills,
            [
                &Effect::SignalTask {
                    id: "done".into(),
                    pid: None,
                    signal: Signal::Kill
                },
                &signal("kept", 41, Signal::Kill)
            ]
        );
        let statuses = fx
            .iter()
            .filter(|x| matches!(x, Effect::EmitTaskStatus(_)))
            .count();
        assert_eq!(statuses, 2);
        assert!(fx[..2].iter().all(Effect::is_persist));
    }
}
