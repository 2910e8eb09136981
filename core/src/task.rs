//! Aria tasks: a command run to completion, PENDING → RUNNING → COMPLETED / FAILED /
//! CANCELLED / TIMEOUT.
//!
//! The same shape as the session machine: [`Tasks::handle`] takes the time and one
//! [`TaskInput`], returns [`TaskEffect`]s with every `Persist*` first (the drain rule), and
//! [`Tasks::poll_timeout`] names the next deadline (a task's timeout, or the TERM → KILL
//! escalation of a cancel). Output kept per task is bounded here, once, with a marker line.

use std::collections::BTreeMap;

use crate::error::{Error, ErrorCode};
use crate::model::{Millis, RequestId};
use crate::process::Signal;

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
}

/// The durable record of a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRecord {
    pub id: String,
    pub spec: TaskSpec,
    pub status: TaskStatus,
    pub created_at: Millis,
    pub started_at: Option<Millis>,
    pub completed_at: Option<Millis>,
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
    pub at: Millis,
}

/// A task status change, for the notification stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskStatusEvent {
    pub task: String,
    pub status: TaskStatus,
    pub message: String,
    pub exit_code: Option<i32>,
    pub at: Millis,
}

/// Inputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskInput {
    Launch {
        req: RequestId,
        id: String,
        spec: TaskSpec,
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
    /// The daemon is shutting down: cancel every task not yet terminal (answered to nobody,
    /// [`crate::NO_REPLY`]).
    Shutdown,
    Tick,
}

/// Effects; `Persist*` come first in every batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskEffect {
    Persist(TaskRecord),
    PersistOutput(TaskOutput),
    Spawn {
        id: String,
        spec: TaskSpec,
    },
    /// TERM (then, after the grace, KILL) to the task's process group.
    Signal {
        id: String,
        pid: u32,
        signal: Signal,
    },
    EmitStatus(TaskStatusEvent),
    EmitOutput(TaskOutput),
    /// Answer to Launch (the record) or Cancel (whether a cancellation was initiated).
    Reply {
        req: RequestId,
        result: Result<TaskReply, Error>,
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
    pub kill_grace_ms: u64,
    /// Tasks not yet terminal at once.
    pub max_live_tasks: usize,
}

impl Default for TaskLimits {
    fn default() -> Self {
        TaskLimits {
            max_output_bytes: 4 * 1024 * 1024,
            kill_grace_ms: crate::process::KILL_GRACE_MS,
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
    timeout_at: Option<Millis>,
    kill_at: Option<Millis>,
    alive: bool,
}

/// Which deadline is next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskTimer {
    Timeout,
    Kill,
}

/// Every task of a daemon.
#[derive(Debug, Clone, Default)]
pub struct Tasks {
    tasks: BTreeMap<String, Task>,
    limits: TaskLimits,
    now: Millis,
}

#[derive(Default)]
struct Out {
    persist: Vec<TaskEffect>,
    rest: Vec<TaskEffect>,
}

impl Tasks {
    pub fn new(limits: TaskLimits) -> Self {
        Tasks {
            tasks: BTreeMap::new(),
            limits,
            now: 0,
        }
    }

    /// Rebuilds from the store. A task that was PENDING or RUNNING when the daemon died lost
    /// its process with it: FAILED.
    pub fn restore(
        limits: TaskLimits,
        now: Millis,
        records: impl IntoIterator<Item = TaskRecord>,
    ) -> (Self, Vec<TaskEffect>) {
        let mut t = Tasks::new(limits);
        t.now = now;
        let mut out = Out::default();
        for mut record in records {
            if !record.status.is_terminal() {
                record.status = TaskStatus::Failed;
                record.completed_at = Some(now);
                record.pid = None;
                record.error_message =
                    Some("the daemon restarted while the task ran; its process was lost".into());
                out.persist.push(TaskEffect::Persist(record.clone()));
                out.rest.push(TaskEffect::EmitStatus(TaskStatusEvent {
                    task: record.id.clone(),
                    status: record.status,
                    message: record.error_message.clone().unwrap_or_default(),
                    exit_code: None,
                    at: now,
                }));
            }
            let id = record.id.clone();
            t.tasks.insert(
                id,
                Task {
                    record,
                    ending: Ending::None,
                    timeout_at: None,
                    kill_at: None,
                    alive: false,
                },
            );
        }
        out.persist.append(&mut out.rest);
        (t, out.persist)
    }

    pub fn get(&self, id: &str) -> Option<&TaskRecord> {
        self.tasks.get(id).map(|t| &t.record)
    }

    pub fn all(&self) -> impl Iterator<Item = &TaskRecord> {
        self.tasks.values().map(|t| &t.record)
    }

    pub fn live(&self) -> usize {
        self.tasks
            .values()
            .filter(|t| !t.record.status.is_terminal() || t.alive)
            .count()
    }

    /// The earliest deadline: when, which task, why.
    pub fn poll_timeout(&self) -> Option<(Millis, String, TaskTimer)> {
        let mut best: Option<(Millis, &String, TaskTimer)> = None;
        for (id, t) in &self.tasks {
            for (at, why) in [
                (t.timeout_at, TaskTimer::Timeout),
                (t.kill_at, TaskTimer::Kill),
            ] {
                if let Some(at) = at {
                    if best.is_none_or(|(b, _, _)| at < b) {
                        best = Some((at, id, why));
                    }
                }
            }
        }
        best.map(|(at, id, why)| (at, id.clone(), why))
    }

    pub fn handle(&mut self, now: Millis, input: TaskInput) -> Vec<TaskEffect> {
        self.now = self.now.max(now);
        let now = self.now;
        let mut out = Out::default();
        match input {
            TaskInput::Launch { req, id, spec } => self.launch(now, req, id, spec, &mut out),
            TaskInput::Cancel { req, id } => self.cancel(now, req, &id, &mut out),
            TaskInput::Shutdown => {
                let live: Vec<String> = self
                    .all()
                    .filter(|t| !t.status.is_terminal())
                    .map(|t| t.id.clone())
                    .collect();
                for id in live {
                    self.cancel(now, crate::NO_REPLY, &id, &mut out);
                }
            }
            TaskInput::Started { id, pid } => {
                if let Some(t) = self.tasks.get_mut(&id) {
                    if t.record.status == TaskStatus::Pending {
                        t.alive = true;
                        t.record.pid = Some(pid);
                        t.record.started_at = Some(now);
                        t.timeout_at = (t.record.spec.timeout_ms > 0)
                            .then(|| now.saturating_add(t.record.spec.timeout_ms));
                        set_status(t, TaskStatus::Running, "running", now, &mut out);
                        if t.ending != Ending::None {
                            // Cancelled while it was being spawned.
                            terminate(t, now, self.limits.kill_grace_ms, &mut out);
                        }
                    }
                }
            }
            TaskInput::SpawnFailed { id, reason } => {
                if let Some(t) = self.tasks.get_mut(&id) {
                    if t.record.status == TaskStatus::Pending {
                        t.record.error_message = Some(format!("could not start: {reason}"));
                        t.record.completed_at = Some(now);
                        let msg = t.record.error_message.clone().unwrap_or_default();
                        set_status(t, TaskStatus::Failed, &msg, now, &mut out);
                    }
                }
            }
            TaskInput::Output { id, kind } => {
                let max = self.limits.max_output_bytes;
                if let Some(t) = self.tasks.get_mut(&id) {
                    if t.record.status == TaskStatus::Running {
                        output(t, kind, max, now, &mut out);
                    }
                }
            }
            TaskInput::Exited { id, code, signal } => {
                if let Some(t) = self.tasks.get_mut(&id) {
                    exited(t, code, signal, now, &mut out);
                }
            }
            TaskInput::Tick => {
                let grace = self.limits.kill_grace_ms;
                for t in self.tasks.values_mut() {
                    if t.timeout_at.is_some_and(|at| at <= now) {
                        t.timeout_at = None;
                        if t.record.status == TaskStatus::Running && t.ending == Ending::None {
                            t.ending = Ending::Timeout;
                            terminate(t, now, grace, &mut out);
                        }
                    }
                    if t.kill_at.is_some_and(|at| at <= now) {
                        t.kill_at = None;
                        if let (true, Some(pid)) = (t.alive, t.record.pid) {
                            out.rest.push(TaskEffect::Signal {
                                id: t.record.id.clone(),
                                pid,
                                signal: Signal::Kill,
                            });
                        }
                    }
                }
            }
        }
        for t in self.tasks.values() {
            t.assert_invariants(&self.limits);
        }
        out.persist.append(&mut out.rest);
        out.persist
    }

    fn launch(&mut self, now: Millis, req: RequestId, id: String, spec: TaskSpec, out: &mut Out) {
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
            out.rest.push(TaskEffect::Reply {
                req,
                result: Err(Error::new(ErrorCode::Generic, msg)),
            });
            return;
        }
        let record = TaskRecord {
            id: id.clone(),
            spec: spec.clone(),
            status: TaskStatus::Pending,
            created_at: now,
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
        };
        out.persist.push(TaskEffect::Persist(record.clone()));
        out.rest.push(TaskEffect::EmitStatus(TaskStatusEvent {
            task: id.clone(),
            status: TaskStatus::Pending,
            message: "launched".into(),
            exit_code: None,
            at: now,
        }));
        out.rest.push(TaskEffect::Spawn {
            id: id.clone(),
            spec,
        });
        out.rest.push(TaskEffect::Reply {
            req,
            result: Ok(TaskReply::Launched(id.clone())),
        });
        self.tasks.insert(
            id,
            Task {
                record,
                ending: Ending::None,
                timeout_at: None,
                kill_at: None,
                alive: false,
            },
        );
    }

    fn cancel(&mut self, now: Millis, req: RequestId, id: &str, out: &mut Out) {
        let grace = self.limits.kill_grace_ms;
        let Some(t) = self.tasks.get_mut(id) else {
            out.rest.push(TaskEffect::Reply {
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
        out.rest.push(TaskEffect::Reply {
            req,
            result: Ok(TaskReply::Cancel { initiated }),
        });
    }
}

fn set_status(t: &mut Task, status: TaskStatus, message: &str, now: Millis, out: &mut Out) {
    t.record.status = status;
    out.persist.push(TaskEffect::Persist(t.record.clone()));
    out.rest.push(TaskEffect::EmitStatus(TaskStatusEvent {
        task: t.record.id.clone(),
        status,
        message: message.to_string(),
        exit_code: t.record.exit_code,
        at: now,
    }));
}

fn terminate(t: &mut Task, now: Millis, grace: u64, out: &mut Out) {
    if let (true, Some(pid)) = (t.alive, t.record.pid) {
        if t.kill_at.is_none() {
            t.kill_at = Some(crate::process::kill_deadline(now, grace));
            out.rest.push(TaskEffect::Signal {
                id: t.record.id.clone(),
                pid,
                signal: Signal::Term,
            });
        }
    }
}

fn output(t: &mut Task, kind: OutputKind, max: u64, now: Millis, out: &mut Out) {
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
        at: now,
    };
    out.persist.push(TaskEffect::PersistOutput(o.clone()));
    out.persist.push(TaskEffect::Persist(t.record.clone()));
    out.rest.push(TaskEffect::EmitOutput(o));
}

impl Task {
    /// What holds for every task after every step (the pair of the changes in `handle`).
    fn assert_invariants(&self, limits: &TaskLimits) {
        let r = &self.record;
        if r.status.is_terminal() {
            assert!(
                !self.alive && r.pid.is_none() && self.kill_at.is_none(),
                "a finished task {} has no live process",
                r.id
            );
            assert!(r.completed_at.is_some(), "a finished task has its end time");
        }
        assert_eq!(
            self.alive,
            r.pid.is_some(),
            "task {}: a pid is known exactly while its process lives",
            r.id
        );
        assert!(
            !self.alive || r.status == TaskStatus::Running,
            "task {}: only a RUNNING task has a process",
            r.id
        );
        assert!(
            r.output_bytes <= limits.max_output_bytes,
            "task {}: output is bounded",
            r.id
        );
    }

    fn truncated_at(&self, max: u64, len: u64) -> bool {
        self.record.truncated || self.record.output_bytes + len > max
    }
}

fn exited(t: &mut Task, code: Option<i32>, signal: Option<i32>, now: Millis, out: &mut Out) {
    if !t.alive {
        return;
    }
    t.alive = false;
    t.kill_at = None;
    t.timeout_at = None;
    t.record.pid = None;
    t.record.completed_at = Some(now);
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

    fn spec() -> TaskSpec {
        TaskSpec {
            command: vec!["echo".into(), "hi".into()],
            timeout_ms: 5_000,
            ..TaskSpec::default()
        }
    }

    fn limits() -> TaskLimits {
        TaskLimits {
            max_output_bytes: 10,
            kill_grace_ms: 1_000,
            max_live_tasks: 2,
        }
    }

    fn launch(t: &mut Tasks, id: &str) -> Vec<TaskEffect> {
        t.handle(
            0,
            TaskInput::Launch {
                req: 1,
                id: id.into(),
                spec: spec(),
            },
        )
    }

    fn status(t: &Tasks, id: &str) -> TaskStatus {
        t.get(id).unwrap().status
    }

    #[test]
    fn a_task_runs_to_completion() {
        let mut t = Tasks::new(limits());
        let fx = launch(&mut t, "a");
        assert!(matches!(fx[0], TaskEffect::Persist(_)));
        assert!(fx.iter().any(|e| matches!(e, TaskEffect::Spawn { .. })));
        t.handle(
            1,
            TaskInput::Started {
                id: "a".into(),
                pid: 5,
            },
        );
        assert_eq!(status(&t, "a"), TaskStatus::Running);
        t.handle(
            2,
            TaskInput::Output {
                id: "a".into(),
                kind: OutputKind::Stdout("hi".into()),
            },
        );
        t.handle(
            3,
            TaskInput::Exited {
                id: "a".into(),
                code: Some(0),
                signal: None,
            },
        );
        let r = t.get("a").unwrap();
        assert_eq!(
            (r.status, r.exit_code, r.completed_at),
            (TaskStatus::Completed, Some(0), Some(3))
        );
        assert_eq!(r.error_message, None);
    }

    #[test]
    fn non_zero_exit_fails_and_spawn_failure_fails() {
        let mut t = Tasks::new(limits());
        launch(&mut t, "a");
        t.handle(
            1,
            TaskInput::Started {
                id: "a".into(),
                pid: 5,
            },
        );
        t.handle(
            2,
            TaskInput::Exited {
                id: "a".into(),
                code: Some(3),
                signal: None,
            },
        );
        assert_eq!(status(&t, "a"), TaskStatus::Failed);
        launch(&mut t, "b");
        t.handle(
            1,
            TaskInput::SpawnFailed {
                id: "b".into(),
                reason: "nope".into(),
            },
        );
        assert_eq!(status(&t, "b"), TaskStatus::Failed);
        assert!(t
            .get("b")
            .unwrap()
            .error_message
            .as_ref()
            .unwrap()
            .contains("nope"));
    }

    #[test]
    fn a_shutdown_cancels_every_live_task() {
        let mut t = Tasks::new(limits());
        launch(&mut t, "a");
        launch(&mut t, "b");
        t.handle(
            1,
            TaskInput::Started {
                id: "a".into(),
                pid: 5,
            },
        );
        let fx = t.handle(2, TaskInput::Shutdown);
        assert!(fx.contains(&TaskEffect::Signal {
            id: "a".into(),
            pid: 5,
            signal: Signal::Term
        }));
        // Still being spawned: ended as soon as it has started.
        let fx = t.handle(
            3,
            TaskInput::Started {
                id: "b".into(),
                pid: 6,
            },
        );
        assert!(fx.contains(&TaskEffect::Signal {
            id: "b".into(),
            pid: 6,
            signal: Signal::Term
        }));
    }

    #[test]
    fn timeout_terminates_then_kills() {
        let mut t = Tasks::new(limits());
        launch(&mut t, "a");
        t.handle(
            1,
            TaskInput::Started {
                id: "a".into(),
                pid: 5,
            },
        );
        let (at, _, why) = t.poll_timeout().unwrap();
        assert_eq!((at, why), (5_001, TaskTimer::Timeout));
        let fx = t.handle(at, TaskInput::Tick);
        assert!(fx.contains(&TaskEffect::Signal {
            id: "a".into(),
            pid: 5,
            signal: Signal::Term
        }));
        let (at, _, why) = t.poll_timeout().unwrap();
        assert_eq!(why, TaskTimer::Kill);
        let fx = t.handle(at, TaskInput::Tick);
        assert!(fx.contains(&TaskEffect::Signal {
            id: "a".into(),
            pid: 5,
            signal: Signal::Kill
        }));
        t.handle(
            at + 1,
            TaskInput::Exited {
                id: "a".into(),
                code: None,
                signal: Some(9),
            },
        );
        assert_eq!(status(&t, "a"), TaskStatus::Timeout);
        assert!(t.poll_timeout().is_none());
    }

    #[test]
    fn cancel_once_then_not_again() {
        let mut t = Tasks::new(limits());
        launch(&mut t, "a");
        t.handle(
            1,
            TaskInput::Started {
                id: "a".into(),
                pid: 5,
            },
        );
        let fx = t.handle(
            2,
            TaskInput::Cancel {
                req: 9,
                id: "a".into(),
            },
        );
        assert!(fx.contains(&TaskEffect::Reply {
            req: 9,
            result: Ok(TaskReply::Cancel { initiated: true })
        }));
        let fx = t.handle(
            2,
            TaskInput::Cancel {
                req: 10,
                id: "a".into(),
            },
        );
        assert!(fx.contains(&TaskEffect::Reply {
            req: 10,
            result: Ok(TaskReply::Cancel { initiated: false })
        }));
        t.handle(
            3,
            TaskInput::Exited {
                id: "a".into(),
                code: None,
                signal: Some(15),
            },
        );
        assert_eq!(status(&t, "a"), TaskStatus::Cancelled);
    }

    #[test]
    fn output_is_bounded_with_one_marker() {
        let mut t = Tasks::new(limits());
        launch(&mut t, "a");
        t.handle(
            1,
            TaskInput::Started {
                id: "a".into(),
                pid: 5,
            },
        );
        let mut kept = Vec::new();
        for line in ["12345", "1234", "x", "y"] {
            for e in t.handle(
                2,
                TaskInput::Output {
                    id: "a".into(),
                    kind: OutputKind::Stdout(line.into()),
                },
            ) {
                if let TaskEffect::EmitOutput(o) = e {
                    kept.push(o.kind);
                }
            }
        }
        // "12345\n" fits in 10 bytes; "1234\n" would not: one marker, then nothing.
        assert_eq!(kept.len(), 2);
        assert!(matches!(&kept[1], OutputKind::Stderr(m) if m.contains("truncated")));
        assert!(t.get("a").unwrap().truncated);
    }

    #[test]
    fn restore_fails_what_was_running() {
        let mut t = Tasks::new(limits());
        launch(&mut t, "a");
        let rec = t.get("a").unwrap().clone();
        let (t2, fx) = Tasks::restore(limits(), 10, vec![rec]);
        assert_eq!(t2.get("a").unwrap().status, TaskStatus::Failed);
        assert!(matches!(fx[0], TaskEffect::Persist(_)));
    }
}
