//! What comes out of the engine: the one [`Effect`] enum of the whole daemon (sessions, Aria
//! tasks, campaigns, shutdown), executed by the shell's one `match`.
//!
//! The drain rule: every `handle` call returns its effects with all `Persist` effects first,
//! in order, then the actions, emits and replies in the order they happened. The shell writes
//! the persists in a transaction, may run `Spawn` / `Write` / `Signal` at once, and delivers
//! `Emit*` and `Reply` only after that transaction committed: so no client ever sees an event
//! that a crash could still lose.

use std::sync::Arc;

use crate::approval::Approval;
use crate::campaign::{Campaign, CampaignError};
use crate::container::{ContainerRecord, ContainerWork};
use crate::error::Error;
use crate::model::{
    ActivityEvent, Notice, RequestId, RunId, SessionConfig, SessionId, SessionRecord, StatusEvent,
    UserMessage,
};
use crate::task::{TaskOutput, TaskRecord, TaskReply, TaskSpec, TaskStatusEvent};

/// A row to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// Upsert the session's durable record.
    Session(Box<SessionRecord>),
    /// Append one activity (shared with its [`Effect::EmitActivity`]: one copy of its text
    /// goes from the parser to the store and to the client).
    Activity(Arc<ActivityEvent>),
    /// Append one status change.
    Status(StatusEvent),
    /// Append one user message.
    UserMessage(UserMessage),
    /// Upsert one request for a human (boxed, as every large payload of a record: see
    /// `Effect::Provision`).
    Approval(Box<Approval>),
    /// Remove the session and everything stored about it.
    Delete(SessionId),
    /// Upsert an Aria task's record.
    Task(Box<TaskRecord>),
    /// Append one line (or progress report) of a task's output.
    TaskOutput(TaskOutput),
    /// Insert a new campaign.
    Campaign(Campaign),
    /// Remove the campaign with this id.
    RemoveCampaign(String),
    /// Upsert an Aria container.
    Container(Box<ContainerRecord>),
    /// Remove the container with this id.
    RemoveContainer(String),
}

pub use crate::process::Signal;

/// How to start a provider process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnSpec {
    pub config: SessionConfig,
    /// The provider's conversation id to continue (after a restart), if it reported one.
    pub resume: Option<String>,
    pub restart_count: u32,
}

/// One effect for the shell to carry out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    Persist(Record),
    /// Make session `id`'s environment (`config.env`: its driver, a worktree); answer with
    /// `Input::Environment` when it is done (the shell makes it off its loop; meanwhile the
    /// session is CREATED).
    Provision {
        id: SessionId,
        /// Boxed, as every large payload of an effect: effects are moved through the executor
        /// and its ports, so the enum is as large as its largest variant.
        config: Box<SessionConfig>,
    },
    /// Start the provider process for run `run` (in the session's environment); answer with
    /// `ProviderEvent::Started` or `SpawnFailed`.
    Spawn {
        id: SessionId,
        run: RunId,
        /// Boxed: see `Provision`.
        spec: Box<SpawnSpec>,
    },
    /// Ask the agent of run `run`, which just started, to say when it is ready for messages
    /// (paddock's ready request, a control request the shell picks per provider); answer with
    /// `ProviderEvent::Ready`.
    AskReady {
        id: SessionId,
        run: RunId,
    },
    /// Deliver one user message to the provider of run `run`.
    Write {
        id: SessionId,
        run: RunId,
        text: String,
    },
    /// Tell the provider of run `run` the outcome of its request `approval.key` (allowed or
    /// not, with `approval.answer`). A stored resolution is told only after it committed
    /// (`at_once == false`); an answer nothing stores (the policy's) is told at once, since a
    /// crash before the commit replays the ask and a crash after it must not lose the answer.
    Answer {
        id: SessionId,
        run: RunId,
        /// Boxed: see `Provision`.
        approval: Box<Approval>,
        at_once: bool,
    },
    /// Close the input of run `run`'s provider: the agent is asked to end its own way (a
    /// graceful stop's first step).
    CloseInput {
        id: SessionId,
        run: RunId,
    },
    /// Signal the process group of run `run`.
    Signal {
        id: SessionId,
        run: RunId,
        pid: Option<u32>,
        signal: Signal,
    },
    /// Tell watchers about a status change.
    EmitStatus(StatusEvent),
    /// Tell the turn's stream (and activity watchers) about an activity.
    EmitActivity(Arc<ActivityEvent>),
    /// Tell watchers about a request for a human that was opened or resolved.
    EmitApproval(Box<Approval>),
    /// Remove what the deleted session kept outside the store — its provider's saved
    /// conversation, its environment (sandbox directories, worktree) — once the deletion is
    /// committed (or a refused create is discarded).
    Forget(Box<SessionRecord>),
    /// Answer request `req`.
    Reply {
        req: RequestId,
        /// Boxed: see `Provision`.
        result: Result<Box<SessionRecord>, Error>,
    },
    /// Answer a `Resolve` request.
    ReplyApproval {
        req: RequestId,
        result: Result<Box<Approval>, Error>,
    },
    /// Start task `id`'s command; answer with `TaskEvent::Started` or `SpawnFailed`.
    SpawnTask {
        id: String,
        /// Boxed: see `Provision`.
        spec: Box<TaskSpec>,
    },
    /// Signal the process group of task `id` (TERM, then KILL after the grace).
    SignalTask {
        id: String,
        pid: Option<u32>,
        signal: Signal,
    },
    /// Tell watchers about a task's status change.
    EmitTaskStatus(TaskStatusEvent),
    /// Tell watchers about a task's output.
    EmitTaskOutput(TaskOutput),
    /// Answer a task request (Launch: the id; Cancel: whether a cancellation was initiated).
    ReplyTask {
        req: RequestId,
        result: Result<TaskReply, Error>,
    },
    /// Answer `AddCampaign`: the campaign and whether it is new.
    ReplyAddCampaign {
        req: RequestId,
        result: Result<(Campaign, bool), CampaignError>,
    },
    /// Answer `RemoveCampaign`: whether there was one.
    ReplyRemoveCampaign {
        req: RequestId,
        result: Result<bool, CampaignError>,
    },
    /// Have the container's driver make, start, stop or destroy it; `Make` and `Start` are
    /// answered with `Input::ContainerReport` (made off the loop).
    Container {
        work: ContainerWork,
        record: Box<ContainerRecord>,
    },
    /// Answer a ContainerService request.
    ReplyContainer {
        req: RequestId,
        result: Result<Box<ContainerRecord>, Error>,
    },
    /// Tell watchers that want a human's attention about something that is not a status
    /// change (output the agent wrote was lost). Delivered after the commit, like `Emit*`.
    Notice(Notice),
    /// Answer `Shutdown`: how many live sessions it stops.
    ReplyShutdown {
        req: RequestId,
        live: usize,
    },
}

impl Effect {
    pub fn is_persist(&self) -> bool {
        matches!(self, Effect::Persist(_))
    }
}
