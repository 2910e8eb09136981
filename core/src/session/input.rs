//! What goes into the engine: the one [`Input`] enum of the whole daemon.

use crate::approval::{ApprovalId, AskKind, Decision};
use crate::campaign::NewCampaign;
use crate::model::{Activity, RequestId, RunId, SessionConfig, SessionId};
use crate::task::TaskInput;

/// One input to the [`Engine`](crate::Engine). Requests carry the `req` their
/// [`Effect::Reply`](crate::Effect::Reply) will answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// CreateSession: the shell has validated the request, resolved the campaign and made the id.
    Create {
        req: RequestId,
        id: SessionId,
        /// Boxed, as every large payload of an input: an input is moved through the loop's
        /// queue, the executor and the engine, so the enum is as large as its largest variant,
        /// and a configuration is 392 bytes where a provider's event is 176.
        config: Box<SessionConfig>,
    },
    /// SendMessage.
    Send {
        req: RequestId,
        id: SessionId,
        text: String,
    },
    /// StopSession.
    Stop {
        req: RequestId,
        id: SessionId,
        graceful: bool,
    },
    /// A client is done with the session (sunbeam's EndSession): it is marked closed, so it
    /// is never resumed, and stopped gracefully, in one step (no one can find it stopped but
    /// not yet closed). Answered as a graceful Stop (OBEY-2020 if it had ended already; it is
    /// closed all the same).
    Close { req: RequestId, id: SessionId },
    /// A client attaches to `project` (sunbeam's StartSession), with its `context` for the
    /// agent: the project's session is found and resumed, or made — one step, so two
    /// attaches of one project never make two sessions. The session resumed is the newest
    /// [resumable](crate::SessionRecord::resumable_for) for the project
    /// ([`crate::session_to_resume`]): a live one is answered as it is; an ended one is
    /// restarted (as `Restart`) with `context` as its system prompt. With none, session `id`
    /// is made (as `Create`) from `config`, marked as the project's, `context` its system
    /// prompt; a `config` the shell refused (`Err`) refuses the attach then, and only then.
    /// The reply is the session's record: a new session's id is `id`.
    ///
    /// A shell whose engine holds only what start-up restored hands it the project's newest
    /// resumable stored session first ([`Input::project`]).
    Attach {
        req: RequestId,
        project: String,
        context: String,
        id: SessionId,
        config: Result<Box<SessionConfig>, crate::Error>,
    },
    /// RestartSession, with an optional `provider_config` override.
    Restart {
        req: RequestId,
        id: SessionId,
        provider_config: Option<crate::ProviderConfig>,
    },
    /// Resolve a pending approval (approve, deny, answer), from any client; `by` names the
    /// client for the record.
    Resolve {
        req: RequestId,
        approval: ApprovalId,
        /// Only a request of this session (a client attached to one session answers only its
        /// own): another session's is "not found".
        session: Option<SessionId>,
        decision: Decision,
        by: String,
        /// What the store holds under this id, read by the shell: a request resolved longer
        /// ago than the engine remembers is still refused as resolved (OBEY-2041), not as
        /// unknown.
        stored: Option<Box<crate::approval::Approval>>,
    },
    /// DeleteSession (paddock extension): forget a terminal session and everything stored
    /// about it.
    Delete { req: RequestId, id: SessionId },
    /// An activity an agent reported for session `id` itself (obey's StreamAgentActivity): the
    /// session's like its own agent's — numbered, stored, shown to its watchers (in the open
    /// turn, if one is) — but it changes nothing else: it never ends a turn, and its tokens
    /// are shown, not counted against the budget.
    Report { id: SessionId, activity: Activity },
    /// Something the provider process of run `run` did. `cursor` is the position in the run's
    /// output just after what produced this event (see `SessionRecord::provider_cursor`);
    /// `None` for events with no position (start, spawn failure, exit).
    Provider {
        id: SessionId,
        run: RunId,
        cursor: Option<u64>,
        event: ProviderEvent,
    },
    /// What the driver did with session `id`'s environment ([`Effect::Provision`]).
    ///
    /// [`Effect::Provision`]: crate::Effect::Provision
    Environment {
        id: SessionId,
        event: crate::environment::EnvEvent,
    },
    /// An Aria task request (launch, cancel) or what its process did.
    Task(TaskInput),
    /// Add a campaign (`id`, rooted at `root`) named as `how` says.
    AddCampaign {
        req: RequestId,
        id: String,
        root: String,
        how: NewCampaign,
    },
    /// Remove the campaign with this id or name: refused while it has live sessions.
    RemoveCampaign { req: RequestId, key: String },
    /// A ContainerService request about container `id` (a create carries its new id).
    Container {
        req: RequestId,
        id: String,
        request: crate::container::ContainerRequest,
    },
    /// What the driver did with container `id` ([`Effect::Container`]).
    ///
    /// [`Effect::Container`]: crate::Effect::Container
    ContainerReport {
        id: String,
        event: crate::container::ContainerEvent,
    },
    /// The daemon is shutting down: stop every live session (`graceful`: running turns may
    /// finish; a forced shutdown after a graceful one cuts the grace short), cancel every live
    /// task, and refuse every Create and task launch from now on (OBEY-2051). Answered with
    /// the number of live sessions; the stops and cancels are answered to nobody
    /// ([`NO_REPLY`]).
    ///
    /// [`NO_REPLY`]: crate::NO_REPLY
    Shutdown { req: RequestId, graceful: bool },
    /// Time passed: fire every deadline at or before `now`.
    Tick,
}

impl Input {
    /// The session a rule about this input may look up though the session has ended: the one
    /// it names (a create or an attach: to refuse a taken id), a second answer's (through the store's
    /// copy), or the one a task or a container is bound to. A shell whose engine holds only
    /// what start-up restored hands it that session first ([`crate::Engine::recall`]).
    /// Provider and environment events name live sessions only.
    pub fn recalls(&self) -> Option<SessionId> {
        match self {
            Input::Create { id, .. }
            | Input::Attach { id, .. }
            | Input::Send { id, .. }
            | Input::Stop { id, .. }
            | Input::Close { id, .. }
            | Input::Restart { id, .. }
            | Input::Delete { id, .. }
            | Input::Report { id, .. } => Some(id.clone()),
            Input::Resolve { stored, .. } => stored.as_ref().map(|a| a.session.clone()),
            Input::Task(TaskInput::Launch { spec, .. }) if !spec.session_id.is_empty() => {
                Some(SessionId(spec.session_id.clone()))
            }
            Input::Container {
                request: crate::container::ContainerRequest::Create(spec),
                ..
            } => spec.session.clone(),
            _ => None,
        }
    }

    /// The task a rule about this input may look up though it has ended: a launch's (to
    /// refuse an id taken) and a cancel's (an ended task is answered as such, not as unknown).
    /// A shell whose engine lets ended tasks go hands it that task first
    /// ([`crate::Engine::recall_task`]). A task's process reports name live tasks only.
    pub fn recalls_task(&self) -> Option<&str> {
        match self {
            Input::Task(TaskInput::Launch { id, .. } | TaskInput::Cancel { id, .. }) => Some(id),
            _ => None,
        }
    }

    /// The project whose newest resumable session a rule about this input looks for (an
    /// attach's): a shell whose engine holds only what start-up restored hands it the newest
    /// such session it stores and the engine does not hold, as for [`Input::recalls`].
    pub fn project(&self) -> Option<&str> {
        match self {
            Input::Attach { project, .. } => Some(project),
            _ => None,
        }
    }
}

/// What an agent asks. `approval` is the id the request gets if a human must answer it;
/// `key` is the agent's own id for it, which the answer carries back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask {
    pub approval: ApprovalId,
    pub key: String,
    pub kind: AskKind,
    pub tool: String,
    /// The tool's input as JSON text.
    pub input: String,
    /// One human-readable line.
    pub summary: String,
}

/// What a provider adapter (or the process supervisor) reports about one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderEvent {
    /// The process is running (`pid` if it is a process of ours).
    Started { pid: Option<u32> },
    /// The process could not be started at all.
    SpawnFailed { reason: String },
    /// The agent answered [`crate::Effect::AskReady`]: it reads its input and takes messages.
    /// Until then a started session is STARTING, and an agent that exits (a CLI that dies at
    /// start) refuses the create instead of failing a RUNNING session later.
    Ready,
    /// One activity (COMPLETION / ERROR end the turn).
    Activity(Activity),
    /// The agent asks something and waits for the answer (a permission prompt, a question, a
    /// client-side tool).
    Ask(Ask),
    /// The provider's own conversation id, for resuming after a restart.
    SessionRef(String),
    /// Output the provider wrote was lost before the daemon read it: `dropped` events of the
    /// run, numbered from `first` (the oldest still held is `next`), were dropped from the
    /// bounded buffer that kept them while the daemon was away (the runner's).
    OutputLost { dropped: u64, first: u64, next: u64 },
    /// A message could not be written to the process (its stdin is closed or broken): the
    /// turn it began never reached the agent.
    DeliveryFailed { reason: String },
    /// The link between paddock and the agent's machine (an ssh session's connection) dropped
    /// (`connected: false`; the agent works on there) or is back; `note` says so in words.
    Connection { connected: bool, note: String },
    /// The process exited. Sent only after all of its output was read and reported, so that
    /// nothing it said is lost.
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
        stderr_tail: String,
    },
}
