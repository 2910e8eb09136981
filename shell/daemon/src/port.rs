//! The daemon's port: the one way into the event loop. The protocol modules (`api/*`), the
//! signal handler and the process readers send a typed [`Command`]; the loop answers each
//! with one `match` (`event_loop::State::command`).
//!
//! Two kinds of answers, one rule: a command that changes something is acknowledged only
//! after the batch it joined has committed (a batch that cannot be committed ends the daemon:
//! a write is never answered with a failure it might not have had), and a [`Query`] is
//! answered after the current batch has committed, so no reply shows what a crash could still
//! lose. A store read that fails is an error in the reply, never an empty result.

use std::path::PathBuf;
use std::sync::Arc;

use paddock_core::campaign::{Campaign, CampaignError, NewCampaign};
use paddock_core::task::{TaskInput, TaskOutput, TaskRecord, TaskReply, TaskStatusEvent};
use paddock_core::{
    ActivityEvent, Approval, ApprovalId, Decision, Error, ErrorCode, Input, RunId, SessionConfig,
    SessionId, SessionRecord, StatusEvent, UserMessage,
};
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use crate::fanout::Fanout;
use crate::store::{ExternalActivity, ReportedEvent, StoreError};

/// The command queue's bound: provider readers wait (and so slow their agent down) when the
/// loop is behind, instead of buffering without limit. Agents' events take room by the event
/// (a command of lines, one permit each: `runner_link::send_lines`).
pub const COMMAND_QUEUE: usize = 4096;

/// Events buffered per watcher before it is told it fell behind.
pub const WATCH_BUFFER: usize = 4096;
/// Activities buffered for one SendMessage client; a client that falls this far behind is
/// given the rest of its turn from the store, at its own pace.
pub const TURN_STREAM_BUFFER: usize = 4096;

/// Where an answer goes.
pub type Reply<T> = oneshot::Sender<T>;
/// A turn's activities, for the client whose Send started it. Behind a pointer: a channel
/// holds its slots in blocks of 32, so an open turn takes a block of 1 KiB instead of 5 KiB
/// (1,000 busy sessions, each with a turn open: ~4 MiB). Shared (the engine's own `Arc`):
/// once the store and the watchers let go, the stream moves its text to the wire uncopied.
pub type TurnStream = mpsc::Sender<Result<Arc<ActivityEvent>, Error>>;

/// What became of a turn's stream the loop fed from the store ([`Command::CatchUp`]).
#[derive(Debug)]
pub enum CaughtUp {
    /// Live again: the loop delivers the turn's activities as they come.
    Live,
    /// Over: the turn's last activity was sent, the client went, or the read failed (said on
    /// the stream).
    Done,
    /// Sent through activity `after`; `more` is stored than the stream had room for, or (not
    /// `more`) all of it was sent but the turn could not go live: the reader waits for room,
    /// or for the session's next commit.
    Behind {
        stream: TurnStream,
        after: u64,
        more: bool,
    },
}
/// A store read's answer.
pub type Read<T> = Result<T, StoreError>;

/// A session request for the core; the loop gives it its request id.
#[derive(Debug)]
pub enum Request {
    /// Refused by the core once the daemon shuts down.
    Create {
        id: SessionId,
        config: Box<SessionConfig>,
    },
    Send {
        id: SessionId,
        text: String,
    },
    Stop {
        id: SessionId,
        graceful: bool,
    },
    /// The client is done with it for good: closed (never resumed) and stopped gracefully
    /// in one step (`Input::Close`).
    Close {
        id: SessionId,
    },
    /// A client attaches to a project: its session found and resumed, or made from `config`
    /// (`Input::Attach`; the configuration was checked by [`Handle::attach`]).
    Attach {
        project: String,
        context: String,
        id: SessionId,
        config: Result<Box<SessionConfig>, Error>,
    },
    /// A new `provider_config`, if any, was validated by [`Handle::restart_session`].
    Restart {
        id: SessionId,
        provider_config: Option<paddock_core::ProviderConfig>,
    },
    /// DeleteSession: forget a terminal session and everything stored about it.
    Delete {
        id: SessionId,
    },
}

/// Something for the loop to do.
pub enum Command {
    /// A provider's event (from a child's reader or waiter).
    Provider(Input),
    /// The events of consecutive lines of a provider's output, in order: handled in one
    /// batch, so they are committed together (a line is applied whole or not at all). With
    /// their room in the queue (a permit each), given back when the loop takes them.
    ProviderLines(Vec<Input>, tokio::sync::OwnedSemaphorePermit),
    /// What the driver did with a session's environment (made off the loop: a worktree of a
    /// large repository takes a while).
    Environment {
        id: SessionId,
        event: paddock_core::EnvEvent,
    },
    /// A provider line its adapter did not understand: stored raw and counted.
    Unrecognized {
        id: SessionId,
        run: RunId,
        line: String,
    },
    /// A session request; `turn` receives the activities of the turn a Send starts.
    Request {
        request: Request,
        reply: Reply<Result<SessionRecord, Error>>,
        turn: Option<TurnStream>,
    },
    /// Resolve a request for a human; `by` names the client.
    Resolve {
        approval: ApprovalId,
        /// Only a request of this session.
        session: Option<SessionId>,
        decision: Decision,
        by: String,
        reply: Reply<Result<Approval, Error>>,
    },
    /// A task request (launch, cancel); the loop gives it its request id.
    TaskRequest {
        input: TaskInput,
        reply: Reply<Result<TaskReply, Error>>,
    },
    /// A task process's output or exit.
    TaskEvent(TaskInput),
    /// A ContainerService request (a create carries the new id).
    ContainerRequest {
        id: String,
        request: paddock_core::container::ContainerRequest,
        reply: Reply<Result<paddock_core::container::ContainerRecord, Error>>,
    },
    /// What a container's driver did (made off the loop).
    ContainerReport {
        id: String,
        event: paddock_core::container::ContainerEvent,
    },
    /// Stop every live session (`graceful`: let running turns finish) and cancel every task;
    /// the loop ends when all are done. Answered with the number of live sessions.
    Shutdown {
        graceful: bool,
        reply: Reply<usize>,
    },
    /// Adds a campaign (`id`, rooted at `root`) named as `how` says; answered with it and
    /// whether it is new.
    AddCampaign {
        id: String,
        root: String,
        how: NewCampaign,
        reply: Reply<Result<(Campaign, bool), CampaignError>>,
    },
    /// Removes a campaign by id or name; answered with whether there was one.
    RemoveCampaign {
        key: String,
        reply: Reply<Result<bool, CampaignError>>,
    },
    /// Stores a campaign or festival event; answered with its id.
    Report {
        event: ReportedEvent,
        reply: Reply<i64>,
    },
    /// Stores activity pushed by an external process; answered with how many rows.
    External {
        rows: Vec<ExternalActivity>,
        reply: Reply<usize>,
    },
    Query(Query),
    /// A turn's stream whose client fell behind ([`crate::event_loop`]'s catch-up), at activity
    /// `after`: the loop sends it what is stored after that, as much as it has room for, and
    /// makes it live again once that was all.
    CatchUp {
        session: SessionId,
        turn: u64,
        after: u64,
        stream: TurnStream,
        reply: Reply<CaughtUp>,
    },
}

impl Command {
    /// How many inputs of the loop's batch it makes ([`super::event_loop::MAX_BATCH`]).
    pub fn inputs(&self) -> usize {
        match self {
            Command::ProviderLines(inputs, _) => inputs.len(),
            _ => 1,
        }
    }
}

/// A session as the loop knows it.
#[derive(Debug, Clone)]
pub struct SessionView {
    /// Shared, not copied, when the store holds it ([`paddock_store::Store::sessions_before`]).
    pub record: std::sync::Arc<SessionRecord>,
    /// Provider lines its adapter did not understand.
    pub unrecognized: u64,
    /// Its open requests for a human.
    pub pending: usize,
}

/// The daemon as a whole (obey `GetState`, `Ping`).
#[derive(Debug, Clone)]
pub struct DaemonView {
    pub started_at: u64,
    pub socket: PathBuf,
    pub data_dir: PathBuf,
    pub campaigns: usize,
    pub sessions: usize,
    /// The sessions not terminal.
    pub live: Vec<SessionRecord>,
}

/// A session's conversation as stored: its user messages, its newest activities (and whether
/// older ones were left out), and its record now.
#[derive(Debug, Clone)]
pub struct HistoryView {
    pub messages: Vec<UserMessage>,
    pub activities: Vec<ActivityEvent>,
    pub truncated: bool,
    pub record: Option<SessionRecord>,
}

/// Which sessions a list wants, decided on the loop before anything is copied: listing the few
/// live sessions among 10,000 stored ones copies the few, not the 10,000.
pub type SessionPick = Box<dyn Fn(&SessionRecord) -> bool + Send>;

/// Where a list of sessions looks, as far as the caller's filter allows: the engine's live set
/// alone (nothing read from the store), or the store in id order, narrowed by SQL before a row
/// is decoded. The pick decides; the scope only spares what it could never keep.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// Only sessions that are not terminal can match.
    pub live_only: bool,
    /// Only ids before this one can match (a page token; `""`: from the newest).
    pub before: String,
    /// Only sessions of this campaign can match.
    pub campaign: Option<String>,
    /// Only sessions working in this directory can match.
    pub working_dir: Option<String>,
}

/// A read, answered after the current batch committed.
pub enum Query {
    Daemon(Reply<Read<DaemonView>>),
    Session(SessionId, Reply<Option<SessionView>>),
    /// The newest `limit` sessions the pick keeps (by id: ULIDs, creation order), looked for
    /// within `scope` (listing the live ones never visits every session ever stored).
    Sessions {
        scope: Scope,
        pick: SessionPick,
        limit: usize,
        reply: Reply<Read<Vec<SessionView>>>,
    },
    /// The campaign with this id or, failing that, this name.
    Campaign(String, Reply<Option<Campaign>>),
    /// A container by id.
    Container(
        String,
        Reply<Option<paddock_core::container::ContainerRecord>>,
    ),
    /// Every container (of one session when given), by id.
    Containers {
        session: Option<SessionId>,
        reply: Reply<Vec<paddock_core::container::ContainerRecord>>,
    },
    /// Every campaign, by name.
    Campaigns(Reply<Vec<Campaign>>),
    /// A session's activities after `after` (a seq), at most `limit`.
    Activities {
        session: SessionId,
        after: u64,
        limit: usize,
        reply: Reply<Read<Vec<ActivityEvent>>>,
    },
    /// A session's conversation, with its newest `limit` activities.
    History {
        session: SessionId,
        limit: usize,
        reply: Reply<Read<HistoryView>>,
    },
    /// The tokens (input, output) counted so far for one turn of a session.
    TurnTokens {
        session: SessionId,
        turn: u64,
        reply: Reply<Read<(u64, u64)>>,
    },
    /// Stored requests for a human: of one session (or all), resolved ones too if `all`.
    Approvals {
        session: Option<SessionId>,
        all: bool,
        limit: usize,
        reply: Reply<Read<Vec<Approval>>>,
    },
    /// The open requests of one session (or all), oldest first, as the engine has them.
    PendingApprovals(Option<SessionId>, Reply<Vec<Approval>>),
    Task(String, Reply<Read<Option<TaskRecord>>>),
    /// The newest `limit` tasks (all, a session's, a container's), newest first, and whether
    /// more matched.
    Tasks {
        of: paddock_store::tasks::TasksOf,
        limit: usize,
        reply: Reply<Read<(Vec<TaskRecord>, bool)>>,
    },
    /// A task's output after `after` (a seq), at most `limit`.
    TaskOutput {
        task: String,
        after: u64,
        limit: usize,
        reply: Reply<Read<Vec<TaskOutput>>>,
    },
}

/// Where status events and activities are published for watchers.
#[derive(Clone)]
pub struct Hub {
    pub status: broadcast::Sender<StatusEvent>,
    /// A session's activities, to that session's subscribers only (the busiest stream: a
    /// watcher of one session is not woken, nor put behind, by the others).
    pub activity: Fanout<SessionId, ActivityEvent>,
    pub task_status: broadcast::Sender<TaskStatusEvent>,
    /// A task's output, to that task's subscribers only (an Execute, StreamTaskOutput).
    pub task_output: Fanout<String, TaskOutput>,
    /// Every task's output, for a container's log (it follows all its tasks, those launched
    /// later too): sent to only while someone listens.
    pub task_output_all: broadcast::Sender<TaskOutput>,
    /// Requests for a human, as they are opened and resolved.
    pub approval: broadcast::Sender<Approval>,
    /// Things worth a human's attention that are not status changes (lost output); raised
    /// with [`Hub::raise_notice`], which also keeps the newest for [`Hub::recent_notices`].
    pub notice: broadcast::Sender<IssuedNotice>,
    recent: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<IssuedNotice>>>,
}

/// Notices kept for subscribers that come later ([`Hub::recent_notices`]).
pub const NOTICE_BACKLOG: usize = 64;

/// A notice with the id it is known by wherever it is delivered.
#[derive(Debug, Clone)]
pub struct IssuedNotice {
    pub id: String,
    pub notice: paddock_core::Notice,
}

impl Default for Hub {
    fn default() -> Self {
        Self::new()
    }
}

impl Hub {
    pub fn new() -> Self {
        Hub {
            status: broadcast::channel(WATCH_BUFFER).0,
            activity: Fanout::new(WATCH_BUFFER),
            task_status: broadcast::channel(WATCH_BUFFER).0,
            task_output: Fanout::new(WATCH_BUFFER),
            task_output_all: broadcast::channel(WATCH_BUFFER).0,
            approval: broadcast::channel(WATCH_BUFFER).0,
            notice: broadcast::channel(WATCH_BUFFER).0,
            recent: Default::default(),
        }
    }

    /// Publishes a notice to its subscribers and keeps it (the newest [`NOTICE_BACKLOG`]) for
    /// those that subscribe later: what a restart finds (output lost while the daemon was
    /// away) is raised before any client could have resubscribed.
    pub fn raise_notice(&self, notice: paddock_core::Notice) {
        let issued = IssuedNotice {
            id: format!("ntf_{}", ulid::Ulid::new()),
            notice,
        };
        {
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            if recent.len() == NOTICE_BACKLOG {
                recent.pop_front();
            }
            recent.push_back(issued.clone());
        }
        let _ = self.notice.send(issued);
    }

    /// The kept notices raised at or after `since`, oldest first.
    pub fn recent_notices(&self, since: paddock_core::Timestamp) -> Vec<IssuedNotice> {
        let recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent
            .iter()
            .filter(|n| n.notice.at >= since)
            .cloned()
            .collect()
    }
}

/// The loop's handle, for the API layer.
#[derive(Clone)]
pub struct Handle {
    pub tx: mpsc::Sender<Command>,
    pub hub: Hub,
    /// Becomes `true` when the loop has finished: every long-lived stream ends then.
    pub done: watch::Receiver<bool>,
}

impl Handle {
    /// Resolves when the daemon is done (after a shutdown stopped every session): streams
    /// select on it so that no open stream keeps the daemon alive.
    pub async fn closed(&self) {
        let mut done = self.done.clone();
        let _ = done.wait_for(|d| *d).await;
    }

    /// Sends the command `make` builds around a reply channel, and waits for the answer.
    pub async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, Error> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).await.map_err(|_| unavailable())?;
        rx.await.map_err(|_| unavailable())
    }

    /// Asks the query `make` builds around a reply channel.
    pub async fn query<T>(&self, make: impl FnOnce(Reply<T>) -> Query) -> Result<T, Error> {
        self.ask(|reply| Command::Query(make(reply))).await
    }

    /// Sends a session request and waits for the core's answer.
    pub async fn request(
        &self,
        request: Request,
        turn: Option<TurnStream>,
    ) -> Result<SessionRecord, Error> {
        self.ask(|reply| Command::Request {
            request,
            reply,
            turn,
        })
        .await?
    }

    /// CreateSession, for every protocol: the configuration checked (OBEY-2002/3/4), then the
    /// loop's answer (refused while the daemon shuts down, OBEY-2051).
    pub async fn create_session(
        &self,
        id: SessionId,
        config: SessionConfig,
    ) -> Result<SessionRecord, Error> {
        let config = validate(config).await?;
        let config = Box::new(config);
        self.request(Request::Create { id, config }, None).await
    }

    /// A client attaches to `project` (sunbeam's StartSession): the core resumes the project's
    /// session or makes session `id` from `config` (answered as a create, or at once when a
    /// live one is joined). The configuration is checked first (OBEY-2002/3/4), off the loop;
    /// a refusal refuses the attach only if nothing is resumed.
    pub async fn attach(
        &self,
        project: String,
        context: String,
        id: SessionId,
        config: SessionConfig,
    ) -> Result<SessionRecord, Error> {
        let config = validate(config).await.map(Box::new);
        let request = Request::Attach {
            project,
            context,
            id,
            config,
        };
        self.request(request, None).await
    }

    /// RestartSession, for every protocol: a new `provider_config` is checked against the
    /// session's configuration (OBEY-2002/3/4) here, off the loop (it may read a script), then
    /// the loop's answer. Checking before the restart's step is exact: only `provider_config`
    /// changes after a create (`handle_restart` is the one place the core writes a config), and
    /// the check replaces it whole.
    pub async fn restart_session(
        &self,
        id: SessionId,
        provider_config: Option<paddock_core::ProviderConfig>,
    ) -> Result<SessionRecord, Error> {
        if let Some(pc) = &provider_config {
            // An unknown session is the core's to refuse (OBEY-1001), in the restart's step.
            if let Some(view) = self.session(id.clone()).await? {
                let mut probe = SessionConfig::clone(&view.record.config);
                probe.provider_config = pc.clone();
                validate(probe).await?;
            }
        }
        let request = Request::Restart {
            id,
            provider_config,
        };
        self.request(request, None).await
    }

    /// Resolves a request for a human (from client `by`) and waits for the core's answer.
    pub async fn resolve(
        &self,
        approval: ApprovalId,
        session: Option<SessionId>,
        decision: Decision,
        by: &str,
    ) -> Result<Approval, Error> {
        self.ask(|reply| Command::Resolve {
            approval,
            session,
            decision,
            by: by.to_string(),
            reply,
        })
        .await?
    }

    /// Sends a task request (launch, cancel) and waits for the task machine's answer.
    /// A ContainerService request; its answer once committed (a create: once made).
    pub async fn container(
        &self,
        id: String,
        request: paddock_core::container::ContainerRequest,
    ) -> Result<paddock_core::container::ContainerRecord, Error> {
        self.ask(|reply| Command::ContainerRequest { id, request, reply })
            .await?
    }

    pub async fn task(&self, input: TaskInput) -> Result<TaskReply, Error> {
        self.ask(|reply| Command::TaskRequest { input, reply })
            .await?
    }

    /// The session as the loop knows it (`None`: there is none).
    pub async fn session(&self, id: SessionId) -> Result<Option<SessionView>, Error> {
        self.query(|reply| Query::Session(id, reply)).await
    }

    /// Begins a shutdown; answers the number of live sessions it stops.
    pub async fn shutdown(&self, graceful: bool) -> Result<usize, Error> {
        self.ask(|reply| Command::Shutdown { graceful, reply })
            .await
    }
}

/// Checks a session configuration off the async runtime's threads (a scripted agent's script
/// is read from disk, bounded by `confined::read`); the configuration back when it is valid.
async fn validate(config: SessionConfig) -> Result<SessionConfig, Error> {
    tokio::task::spawn_blocking(move || crate::providers::validate(&config).map(|()| config))
        .await
        .unwrap_or_else(|e| Err(Error::new(ErrorCode::Generic, format!("validate: {e}"))))
}

/// The loop is gone (or going).
pub fn unavailable() -> Error {
    Error::new(
        ErrorCode::ShuttingDown,
        "the daemon's session engine is not running (shutting down?)",
    )
}

/// The refusal of anything new while the daemon shuts down.
pub fn shutting_down() -> Error {
    Error::new(ErrorCode::ShuttingDown, "the daemon is shutting down")
}
