//! `sunbeam.code.v1.CodeAgent`: the `sunbeam code` client's one bidirectional stream, mapped
//! onto the same sessions as every other protocol.
//!
//! A stream is one client attached to one paddock session: its first message (`StartSession`)
//! finds or makes the session of a project, and from then on the client's messages become the
//! same session requests obey makes (Create, Send, Stop, Restart through [`Handle::request`])
//! and the session's live activity and status feed (the hub every watcher reads) becomes the
//! client's `ServerMessage`s. Every rule about the session is the core's; this module decides
//! nothing about it.
//!
//! - **Which session.** The project (`project_path`, canonicalized) picks the campaign whose
//!   root it is (an ad-hoc campaign named after the directory is registered if there is none)
//!   and the session, in one step of the core (`Input::Attach`, so clients starting at once
//!   share one): [`paddock_core::session_to_resume`], the newest one created through sunbeam
//!   for that root (marked with `provider_config["sunbeam.project"] = <root>`) that its client
//!   did not close (`EndSession` closes it: the record's `closed_by_client`). A live one is
//!   joined, a terminal one restarted with the new context; none, a new one is created.
//! - **Many clients.** Output comes from the session's feed, not from the reply to whoever
//!   sent the input: every client attached to a session sees every turn, and input from any of
//!   them works (a second input while a turn runs is refused by the core, OBEY-2011, as a
//!   non-fatal `Error`).
//! - **Requests for the client.** The session's open approvals (the core's, on the hub) are
//!   asked of every attached client: a permission as `ApprovalNeeded`, a client tool or a
//!   question as a local `ToolCall`, the request id as `call_id`. `ToolApproval` and
//!   `ToolResult` resolve them through [`Handle::resolve`], like `ResolveApproval` does.
//! - **Detach vs. end.** Closing the stream only detaches (the session goes on, and the next
//!   `StartSession` resumes it with its history); `EndSession` closes the session and stops
//!   it gracefully, in one step of the core (`Input::Close`).
//! - **Project context.** `prompt_md`, `git_branch`, `git_status` and `file_tree` become one
//!   bounded text in `provider_config["system_prompt"]` (see [`project_context`]), which the
//!   agent gets as a system prompt where it has one (`Provider::takes_system_prompt`) and
//!   otherwise ahead of the session's first message (the core's rule, as for any session
//!   with a system prompt; the message is stored without it).
//! - **Bounded.** Each stream queues at most [`OUTGOING_QUEUE`] messages for its client (then
//!   it waits; a client that falls behind the hub catches up from the store); texts, history
//!   entries and the history itself are cut with a marker (the constants below).

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;

use paddock_core::campaign::NewCampaign;
use paddock_core::{
    ActivityEvent, ActivityKind, Approval, ApprovalId, AskKind, Decision, Error, ErrorCode,
    Provider, SessionConfig, SessionId, SessionRecord, Status, StatusEvent, UserMessage,
};
use paddock_proto::sunbeam::code::v1 as pb;
use pb::client_message::Payload as In;
use pb::server_message::Payload as OutMsg;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::Stream;
use tonic::{Request, Response, Status as GrpcStatus, Streaming};

use super::history::{self, Role};
use crate::daemon::fanout::Subscription;
use crate::daemon::port::{Command, Handle, HistoryView, Query, Request as Req};
use crate::daemon::{hear, Heard};
use crate::providers;
use crate::text::truncate;

type Stream_<T> = Pin<Box<dyn Stream<Item = Result<T, GrpcStatus>> + Send>>;

/// `provider_config` key marking a session as sunbeam's: the project root it belongs to.
pub use paddock_core::PROJECT_KEY;

/// Messages queued for one client; past it the stream waits for the client (the hub buffers,
/// and a stream that fell behind the hub catches up from the store).
pub const OUTGOING_QUEUE: usize = 256;
/// One TextDelta, Status, ToolCall's args, or Error message, at most.
pub const TEXT_MAX: usize = 64 * 1024;
/// A turn's `TextDone.full_text`, at most.
pub const FULL_TEXT_MAX: usize = 1024 * 1024;
/// One history entry's content, at most.
pub const HISTORY_ENTRY_MAX: usize = 16 * 1024;
/// History entries sent with `SessionReady` (the newest), at most…
pub const HISTORY_ENTRIES_MAX: usize = 200;
/// …and their bytes, at most (well under the 4 MiB gRPC message limit).
pub const HISTORY_BYTES_MAX: usize = 1024 * 1024;
/// The newest activities read to build the history.
const HISTORY_ACTIVITIES: usize = 5000;
/// `config_toml`, at most.
pub const CONFIG_TOML_MAX: usize = 64 * 1024;
/// Project context parts: `prompt_md`, `git_status`, the file tree (entries and bytes), one
/// path, the branch name. Together under 64 KiB, so that the context fits in one command-line
/// argument (`--append-system-prompt`; Linux allows 128 KiB per argument).
pub const PROMPT_MD_MAX: usize = 32 * 1024;
pub const GIT_STATUS_MAX: usize = 8 * 1024;
pub const FILE_TREE_ENTRIES_MAX: usize = 500;
pub const FILE_TREE_BYTES_MAX: usize = 16 * 1024;
const PATH_MAX: usize = 512;
const BRANCH_MAX: usize = 256;
/// Newest activities searched for SessionEnd's last answer.
const SUMMARY_ACTIVITIES: usize = 200;
/// Activities read from the store per page when a stream catches up.
const CATCH_UP_PAGE: usize = 256;
/// A client tool's result (`ToolResult.result`) handed to the agent, at most.
pub const CLIENT_RESULT_MAX: usize = 256 * 1024;
/// How a request this stream resolved is signed (`Approval.resolved_by`).
const RESOLVED_BY: &str = "sunbeam";
/// `provider_config` key for the client's tools (the agents' own key).
pub use crate::providers::CLIENT_TOOLS_KEY;

/// The service. Which session a project's StartSession gets is the core's one step
/// (`Input::Attach`): two clients starting at once share one session without a lock here.
#[derive(Clone)]
pub struct CodeAgent {
    handle: Handle,
}

impl CodeAgent {
    pub fn new(handle: Handle) -> Self {
        CodeAgent { handle }
    }
}

#[tonic::async_trait]
impl pb::code_agent_server::CodeAgent for CodeAgent {
    type SessionStream = Stream_<pb::ServerMessage>;

    async fn session(
        &self,
        request: Request<Streaming<pb::ClientMessage>>,
    ) -> Result<Response<Self::SessionStream>, GrpcStatus> {
        let inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(OUTGOING_QUEUE);
        tokio::spawn(self.clone().serve(inbound, Out(tx)));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

// ── the client's side of the stream ────────────────────────────────────────────────────────

/// The stream to the client.
#[derive(Clone)]
struct Out(mpsc::Sender<Result<pb::ServerMessage, GrpcStatus>>);

impl Out {
    /// False when the client is gone.
    async fn send(&self, payload: OutMsg) -> bool {
        self.0
            .send(Ok(pb::ServerMessage {
                payload: Some(payload),
            }))
            .await
            .is_ok()
    }

    async fn error(&self, message: impl AsRef<str>, fatal: bool) -> bool {
        self.send(OutMsg::Error(pb::Error {
            message: truncate(message.as_ref(), TEXT_MAX).into_owned(),
            fatal,
        }))
        .await
    }

    async fn closed(&self) {
        self.0.closed().await
    }
}

/// Whether the stream goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Go,
    /// The stream ends: the session ended, a fatal error, or the client is gone.
    Stop,
}

fn go(sent: bool) -> Flow {
    if sent {
        Flow::Go
    } else {
        Flow::Stop
    }
}

fn payload_name(p: &In) -> &'static str {
    match p {
        In::Start(_) => "StartSession",
        In::Input(_) => "UserInput",
        In::ToolResult(_) => "ToolResult",
        In::Approval(_) => "ToolApproval",
        In::End(_) => "EndSession",
    }
}

impl CodeAgent {
    /// One stream, start to end.
    async fn serve(self, mut inbound: Streaming<pb::ClientMessage>, out: Out) {
        let first = tokio::select! {
            biased;
            _ = out.closed() => return,
            m = inbound.message() => m,
            _ = self.handle.closed() => return,
        };
        let start = match first {
            Ok(Some(pb::ClientMessage {
                payload: Some(In::Start(s)),
            })) => s,
            Ok(Some(pb::ClientMessage { payload })) => {
                let got = payload
                    .as_ref()
                    .map(payload_name)
                    .unwrap_or("an empty message");
                out.error(
                    format!("the first message must be StartSession (got {got})"),
                    true,
                )
                .await;
                return;
            }
            // The client went away without a word.
            Ok(None) | Err(_) => return,
        };
        // Subscribe before the session is found or made: whatever it does from here on is
        // either in the history read below or still queued here. (Its activities are
        // subscribed to once it has an id; the catch-up below reads what came before.)
        let status = self.handle.hub.status.subscribe();
        let approvals = self.handle.hub.approval.subscribe();
        let attached = match self.start(start).await {
            Ok(a) => a,
            Err(e) => {
                out.error(e.to_string(), true).await;
                return;
            }
        };
        let activity = self.handle.hub.activity.subscribe(&attached.record.id);
        let mut conn = Conn {
            agent: self,
            id: attached.record.id.clone(),
            out,
            last_seq: attached.last_seq,
            turn: None,
            ending: false,
            inbound_open: true,
            client_tools: client_tool_names(&attached.record.config.provider_config),
            policy: attached.record.config.provider_config.policy().clone(),
            shown: BTreeSet::new(),
        };
        if !conn.out.send(OutMsg::Ready(attached.ready)).await {
            return;
        }
        if !attached.unoffered_tools.is_empty() {
            // Said once, plainly, rather than letting the client wait for calls that never come.
            let note = format!(
                "client tool(s) not offered to the agent: {} (a resumed session keeps the \
                 client tools it started with)",
                attached.unoffered_tools.join(", ")
            );
            let info = OutMsg::Status(pb::Status {
                message: note,
                kind: pb::StatusKind::Info as i32,
            });
            if !conn.out.send(info).await {
                return;
            }
        }
        // A turn that was running when this client attached is replayed from its start, then
        // what the session waits for is asked again.
        if conn.catch_up().await == Flow::Stop || conn.show_open_approvals().await == Flow::Stop {
            return;
        }
        conn.run(inbound, activity, status, approvals).await;
    }
}

// ── StartSession ───────────────────────────────────────────────────────────────────────────

/// A session found or made for a client.
struct Attached {
    record: SessionRecord,
    ready: pb::SessionReady,
    /// The newest activity the client has (in its history) or must not get again.
    last_seq: u64,
    /// `client_tools` the client declared that the session's agent is not offered.
    unoffered_tools: Vec<String>,
}

/// What `config_toml` may say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub provider: Provider,
    pub max_tokens: u64,
    pub timeout_ms: u64,
    pub environment: BTreeMap<String, String>,
    /// `provider_config`, with `permissions` in it.
    pub provider_config: BTreeMap<String, String>,
}

/// The keys `config_toml` may have.
pub const CONFIG_KEYS: [&str; 6] = [
    "provider",
    "permissions",
    "max_tokens",
    "timeout",
    "env",
    "provider_config",
];

/// Parses `config_toml`: `provider` (a `--provider` name; default `scripted`), `permissions`
/// (`allow-all`, `deny`, `allow:A,B`), `max_tokens` (0: none), `timeout` (seconds, 0: none),
/// `env` (a table of strings) and `provider_config` (a table of strings, numbers or booleans).
/// Unknown keys are refused, all of them named.
pub fn parse_config(text: &str) -> Result<Settings, ConfigError> {
    if text.len() > CONFIG_TOML_MAX {
        return Err(ConfigError::TooLarge(text.len()));
    }
    let table: toml::Table = text.parse()?;
    let unknown: Vec<String> = table
        .keys()
        .filter(|k| !CONFIG_KEYS.contains(&k.as_str()))
        .cloned()
        .collect();
    if !unknown.is_empty() {
        return Err(ConfigError::UnknownKeys(unknown));
    }
    let wrong = |key: &str, want: &'static str, got: String| ConfigError::WrongType {
        key: key.to_string(),
        want,
        got,
    };
    let string = |key: &str| match table.get(key) {
        None => Ok(None),
        Some(toml::Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(wrong(key, "a string", v.type_str().into())),
    };
    let count = |key: &str| match table.get(key) {
        None => Ok(0),
        Some(toml::Value::Integer(n)) if *n >= 0 => Ok(*n as u64),
        Some(v) => Err(wrong(key, "a non-negative integer", v.to_string())),
    };
    let strings = |key: &str, scalars: bool| -> Result<BTreeMap<String, String>, ConfigError> {
        let Some(v) = table.get(key) else {
            return Ok(BTreeMap::new());
        };
        let toml::Value::Table(t) = v else {
            return Err(wrong(key, "a table", v.type_str().into()));
        };
        t.iter()
            .map(|(k, v)| match v {
                toml::Value::String(s) => Ok((k.clone(), s.clone())),
                toml::Value::Integer(_) | toml::Value::Float(_) | toml::Value::Boolean(_)
                    if scalars =>
                {
                    Ok((k.clone(), v.to_string()))
                }
                other => Err(wrong(
                    &format!("{key}.{k}"),
                    if scalars {
                        "a string, number or boolean"
                    } else {
                        "a string"
                    },
                    other.type_str().into(),
                )),
            })
            .collect()
    };
    let provider = match string("provider")? {
        None => Provider::Scripted,
        Some(name) => Provider::from_name(name.trim())
            .ok_or_else(|| ConfigError::UnknownProvider(name.clone()))?,
    };
    let mut provider_config = strings("provider_config", true)?;
    for reserved in [PROJECT_KEY, providers::SYSTEM_PROMPT_KEY, CLIENT_TOOLS_KEY] {
        if provider_config.contains_key(reserved) {
            return Err(ConfigError::Reserved(reserved));
        }
    }
    if let Some(p) = string("permissions")? {
        if provider_config.contains_key("permissions") {
            return Err(ConfigError::PermissionsTwice);
        }
        provider_config.insert("permissions".into(), p);
    }
    let environment = strings("env", false)?;
    paddock_core::check_environment(&environment).map_err(ConfigError::Env)?;
    Ok(Settings {
        provider,
        max_tokens: count("max_tokens")?,
        timeout_ms: count("timeout")?.saturating_mul(1000),
        environment,
        provider_config,
    })
}

/// Why a stream's `config_toml` is refused: each says what to change.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config_toml is {0} bytes; at most {CONFIG_TOML_MAX} are accepted")]
    TooLarge(usize),
    #[error("config_toml is not valid TOML: {0}")]
    NotToml(#[from] toml::de::Error),
    #[error("config_toml has unknown key(s): {} (known: {})", .0.join(", "), CONFIG_KEYS.join(", "))]
    UnknownKeys(Vec<String>),
    /// `key` (`env.A` for a table's entry) is not what it must be.
    #[error("config_toml: {key} must be {want} (got {got})")]
    WrongType {
        key: String,
        want: &'static str,
        got: String,
    },
    #[error("config_toml: unknown provider {0:?} (known: {known})", known = Provider::ALL.iter().map(|p| p.name()).collect::<Vec<_>>().join(", "))]
    UnknownProvider(String),
    #[error("config_toml: provider_config.{0} is set by sunbeam itself")]
    Reserved(&'static str),
    #[error("config_toml: permissions is given twice (top level and provider_config)")]
    PermissionsTwice,
    /// The `env` table, as the core's check words it.
    #[error("config_toml: env: {0}")]
    Env(paddock_core::EnvVarError),
}

/// Why a StartSession fails: its words are sunbeam's fatal error event.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("StartSession.project_path is required")]
    NoProjectPath,
    /// The project path cannot be canonicalized (it does not exist, or cannot be read).
    #[error("project_path {path} cannot be used: {source}")]
    ProjectPath {
        path: String,
        source: std::io::Error,
    },
    /// The canonical project path is not a directory.
    #[error("project_path {} is not a directory", .0.display())]
    NotADirectory(std::path::PathBuf),
    /// The stream's `config_toml`.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The session's `provider_config` (the settings and the client's tools), as the core
    /// refuses it.
    #[error(transparent)]
    ProviderConfig(#[from] paddock_core::ConfigError),
    /// The project's campaign could not be registered.
    #[error("{0}")]
    Campaign(paddock_core::campaign::CampaignError),
    /// The daemon refused the attach (an OBEY error), or is gone.
    #[error(transparent)]
    Daemon(#[from] paddock_core::Error),
    /// The session's history could not be read.
    #[error("cannot read the session's history: {0}")]
    History(crate::store::StoreError),
}

/// The agent's project context: the root, the branch, `git status`, the file tree and the
/// project's instructions (`prompt_md`), each part bounded (see the `*_MAX` constants; the
/// file tree keeps its first entries and says how many more there are).
pub fn project_context(root: &str, s: &pb::StartSession) -> String {
    let mut out = String::from("# Project context (from the sunbeam client)\n\n");
    out.push_str(&format!("Project root: {root}\n"));
    let branch = s.git_branch.trim();
    if !branch.is_empty() {
        out.push_str(&format!("Git branch: {}\n", truncate(branch, BRANCH_MAX)));
    }
    let status = s.git_status.trim_end();
    if !status.trim().is_empty() {
        out.push_str("\n## git status\n\n```\n");
        out.push_str(&truncate(status, GIT_STATUS_MAX));
        out.push_str("\n```\n");
    }
    if !s.file_tree.is_empty() {
        let mut list = String::new();
        let mut shown = 0;
        for path in &s.file_tree {
            let line = truncate(path.trim_end(), PATH_MAX);
            if shown == FILE_TREE_ENTRIES_MAX || list.len() + line.len() + 1 > FILE_TREE_BYTES_MAX {
                break;
            }
            list.push_str(&line);
            list.push('\n');
            shown += 1;
        }
        let total = s.file_tree.len();
        out.push_str(&format!("\n## Files ({shown} of {total})\n\n"));
        out.push_str(&list);
        if shown < total {
            out.push_str(&format!("… and {} more\n", total - shown));
        }
    }
    let prompt = s.prompt_md.trim();
    if !prompt.is_empty() {
        out.push_str("\n## Project instructions\n\n");
        out.push_str(&truncate(prompt, PROMPT_MD_MAX));
        out.push('\n');
    }
    out
}

impl CodeAgent {
    /// StartSession: the project's campaign and session, found, restarted or made. An `Err`
    /// is the fatal error (its words the error event's message).
    async fn start(&self, s: pb::StartSession) -> Result<Attached, SessionError> {
        let given = s.project_path.trim();
        if given.is_empty() {
            return Err(SessionError::NoProjectPath);
        }
        let root = std::fs::canonicalize(given).map_err(|source| SessionError::ProjectPath {
            path: given.to_string(),
            source,
        })?;
        if !root.is_dir() {
            return Err(SessionError::NotADirectory(root));
        }
        let settings = parse_config(&s.config_toml)?;
        let root_str = root.display().to_string();
        let context = project_context(&root_str, &s);
        let declared: Vec<String> = s
            .client_tools
            .iter()
            .map(|t| t.name.trim().to_string())
            .collect();
        let tools_json = client_tools_json(&s.client_tools);
        // The whole configuration is checked before anything is registered: a refused start
        // leaves no campaign behind.
        let provider_config = session_provider_config(&settings, tools_json)?;

        let campaign = self.campaign_for(&root_str).await?;
        let (id, config) = new_session(&campaign, &root_str, &s.model, settings, provider_config);
        let record = self
            .handle
            .attach(root_str, context, id.clone(), config)
            .await?;
        let resumed = record.id != id;
        let (history, last_seq) = self.history(&record).await?;
        Ok(Attached {
            ready: pb::SessionReady {
                session_id: record.id.0.clone(),
                room_id: record.config.campaign_id.clone(),
                model: record.config.model.clone(),
                resumed,
                history,
            },
            unoffered_tools: unoffered(&record.config, &declared),
            record,
            last_seq,
        })
    }

    /// The campaign whose root is `root` (the oldest, if several), or a new one named after the
    /// directory (`name`, `name-2`, … while taken), registered as AddCampaign does.
    /// The project's campaign: the one registered for its root, or a new one (the store's one
    /// way, shared with `paddock session create`).
    async fn campaign_for(&self, root_str: &str) -> Result<crate::store::Campaign, SessionError> {
        let root = root_str.to_string();
        let base = crate::store::campaign_name_for(std::path::Path::new(root_str));
        let (c, added) = self
            .handle
            .ask(|reply| Command::AddCampaign {
                id: super::new_campaign_id(),
                root,
                how: NewCampaign::ForRoot { base },
                reply,
            })
            .await?
            .map_err(SessionError::Campaign)?;
        if added {
            tracing::info!(campaign = %c.id, name = %c.name, root = %c.root_path, "sunbeam registered a campaign for a new project");
        }
        Ok(c)
    }

    /// The session's conversation for SessionReady, and the activity the client's feed starts
    /// after: a turn still running is left out of the history and replayed from its start.
    async fn history(
        &self,
        rec: &SessionRecord,
    ) -> Result<(Vec<pb::HistoryEntry>, u64), SessionError> {
        let session = rec.id.clone();
        let HistoryView {
            messages,
            activities,
            truncated,
            record: now,
        } = self
            .handle
            .query(|reply| Query::History {
                session,
                limit: HISTORY_ACTIVITIES,
                reply,
            })
            .await?
            .map_err(SessionError::History)?;
        let now = now.unwrap_or_else(|| rec.clone());
        let open = now.turn_open.then_some(now.turns);
        let replay_from = open.and_then(|t| {
            activities
                .iter()
                .find(|a| a.turn == Some(t))
                .map(|a| a.seq - 1)
        });
        let last_seq = replay_from.unwrap_or(now.last_activity_seq);
        let done: Vec<ActivityEvent> = activities
            .into_iter()
            .filter(|a| a.seq <= last_seq)
            .collect();
        Ok((conversation(&messages, &done, truncated), last_seq))
    }
}

/// The id and configuration of the session a StartSession makes if its project has none to
/// resume. The core marks it as the project's and gives it the attach's context.
fn new_session(
    campaign: &crate::store::Campaign,
    root: &str,
    model: &str,
    settings: Settings,
    provider_config: paddock_core::ProviderConfig,
) -> (SessionId, SessionConfig) {
    let (id, short) = super::new_session_id();
    let config = SessionConfig {
        campaign_id: campaign.id.clone(),
        provider: settings.provider,
        model: model.trim().to_string(),
        agent_name: format!("sunbeam-{short}"),
        festival_id: String::new(),
        task_id: String::new(),
        provider_config,
        environment: settings.environment,
        max_tokens: settings.max_tokens,
        timeout_ms: settings.timeout_ms,
        initial_message: String::new(),
        working_dir: root.to_string(),
        env: paddock_core::EnvSpec::default(),
    };
    (id, config)
}

/// A new session's `provider_config`: the stream's settings and the client's tools, parsed
/// (refused as a whole, naming what is wrong).
fn session_provider_config(
    settings: &Settings,
    client_tools: Option<String>,
) -> Result<paddock_core::ProviderConfig, SessionError> {
    let mut map = settings.provider_config.clone();
    if let Some(tools) = client_tools {
        map.insert(CLIENT_TOOLS_KEY.into(), tools);
    }
    Ok(paddock_core::ProviderConfig::parse(map)?)
}

/// A session's history as sunbeam shows it: each turn's user message (without a project
/// context put ahead of it) and its answer — the same text its `TextDone` carried — newest
/// [`HISTORY_ENTRIES_MAX`] / [`HISTORY_BYTES_MAX`], each cut to [`HISTORY_ENTRY_MAX`].
pub fn conversation(
    messages: &[UserMessage],
    activities: &[ActivityEvent],
    truncated: bool,
) -> Vec<pb::HistoryEntry> {
    let entry = |role: &str, content: &str| pb::HistoryEntry {
        role: role.into(),
        content: truncate(content, HISTORY_ENTRY_MAX).into_owned(),
    };
    let mut out = Vec::new();
    let mut answer: Option<(u64, Answer)> = None;
    for item in history::merge(messages, activities, truncated) {
        if answer.as_ref().is_some_and(|(t, _)| *t != item.turn) {
            answer = None;
        }
        match item.role {
            Role::User => out.push(entry(
                "user",
                paddock_core::provider_config::without_system_prompt(&item.content),
            )),
            Role::Text if item.turn > 0 => {
                answer
                    .get_or_insert_with(|| (item.turn, Answer::default()))
                    .1
                    .push(&item.content, false);
            }
            Role::Assistant => {
                let (_, mut a) = answer.take().unwrap_or_default();
                a.push(&item.content, true);
                out.push(entry("assistant", &a.full_text()));
            }
            _ => {}
        }
    }
    let mut bytes = 0;
    let keep = out
        .iter()
        .rev()
        .take(HISTORY_ENTRIES_MAX)
        .take_while(|e| {
            bytes += e.content.len();
            bytes <= HISTORY_BYTES_MAX
        })
        .count();
    out.split_off(out.len() - keep)
}

/// A turn's answer as the client sees it: every text the agent said in the turn, then its
/// final answer, one delta each, separated by a blank line. The final answer repeating what was
/// already said (Claude Code's `result` repeats its last text) adds nothing; one that extends
/// it adds the rest.
#[derive(Debug, Clone, Default)]
pub struct Answer {
    text: String,
    /// Bytes left out of `text` past [`FULL_TEXT_MAX`].
    dropped: usize,
}

impl Answer {
    /// Adds one text (`last`: the turn's final answer); returns the delta to send.
    pub fn push(&mut self, piece: &str, last: bool) -> String {
        let piece = truncate(piece, TEXT_MAX);
        if piece.is_empty() {
            return String::new();
        }
        let delta = if self.text.is_empty() && self.dropped == 0 {
            piece.into_owned()
        } else if last && self.text.ends_with(&*piece) {
            String::new()
        } else if last && piece.starts_with(&self.text) && self.dropped == 0 {
            piece[self.text.len()..].to_string()
        } else {
            format!("\n\n{piece}")
        };
        if self.dropped == 0 && self.text.len() + delta.len() <= FULL_TEXT_MAX {
            self.text.push_str(&delta);
        } else {
            self.dropped += delta.len();
        }
        delta
    }

    /// Everything pushed, with a marker if some was left out.
    pub fn full_text(&self) -> String {
        if self.dropped == 0 {
            self.text.clone()
        } else {
            format!("{}… [truncated {} bytes]", self.text, self.dropped)
        }
    }
}

// ── an attached stream ─────────────────────────────────────────────────────────────────────

/// One client attached to one session.
struct Conn {
    agent: CodeAgent,
    id: SessionId,
    out: Out,
    /// The newest activity handled (sent, or in the client's history).
    last_seq: u64,
    /// The turn being shown and its text so far.
    turn: Option<(u64, Answer)>,
    /// This client sent EndSession; the stop is under way.
    ending: bool,
    /// False once the client closed its side: output goes on until the stream is dropped.
    inbound_open: bool,
    /// The client tools of the session: their calls show once, as the request to run them.
    client_tools: BTreeSet<String>,
    /// The session's permission policy: whether a tool's call waits for a human's approval.
    policy: paddock_core::approval::Policy,
    /// Open requests this client was shown (as many as the session has open).
    shown: BTreeSet<ApprovalId>,
}

/// A request's answer, back from the task that waited for it.
enum Outcome {
    /// EndSession's stop (and mark) finished.
    Ended(Result<SessionRecord, Error>),
}

impl Conn {
    fn handle(&self) -> &Handle {
        &self.agent.handle
    }

    async fn run(
        &mut self,
        mut inbound: Streaming<pb::ClientMessage>,
        mut activity: Subscription<SessionId, ActivityEvent>,
        mut status: broadcast::Receiver<StatusEvent>,
        mut approvals: broadcast::Receiver<Approval>,
    ) {
        let (done_tx, mut done_rx) = mpsc::channel::<Outcome>(1);
        let handle = self.handle().clone();
        loop {
            let flow = tokio::select! {
                biased;
                _ = self.out.closed() => Flow::Stop,
                Some(o) = done_rx.recv() => self.on_outcome(o).await,
                // A session's stream reads on from the store when it falls behind the hub
                // (the lag rule of streams, `api::watch`).
                ev = activity.hear() => match ev {
                    Heard::Event(ev) => self.on_activity(ev).await,
                    Heard::Behind(_) => self.catch_up().await,
                    Heard::Over => Flow::Stop,
                },
                ev = hear(&mut status) => match ev {
                    Heard::Event(ev) if ev.session == self.id => self.on_status(ev.new, &ev.message).await,
                    Heard::Event(_) => Flow::Go,
                    Heard::Behind(_) => self.recheck_status().await,
                    Heard::Over => Flow::Stop,
                },
                ev = hear(&mut approvals) => match ev {
                    Heard::Event(a) => self.on_approval(a).await,
                    // What is open now is asked again (each request once).
                    Heard::Behind(_) => self.show_open_approvals().await,
                    Heard::Over => Flow::Stop,
                },
                m = inbound.message(), if self.inbound_open => match m {
                    Ok(Some(msg)) => self.on_client(msg, &done_tx).await,
                    // The client closed its side (or it broke): it may still read.
                    Ok(None) | Err(_) => {
                        self.inbound_open = false;
                        Flow::Go
                    }
                },
                _ = handle.closed() => {
                    self.out.error("the paddock daemon shut down", true).await;
                    Flow::Stop
                }
            };
            if flow == Flow::Stop {
                return;
            }
        }
    }

    /// The one place a client message is dispatched.
    async fn on_client(&mut self, msg: pb::ClientMessage, done: &mpsc::Sender<Outcome>) -> Flow {
        match msg.payload {
            None => go(self.out.error("an empty ClientMessage", false).await),
            Some(In::Start(_)) => go(self
                .out
                .error(
                    format!("session {} is already started on this stream", self.id),
                    false,
                )
                .await),
            Some(In::Input(input)) => self.input(input.text).await,
            Some(In::ToolResult(r)) => self.answer(Answer_::ToolResult(r)).await,
            Some(In::Approval(a)) => self.answer(Answer_::Approval(a)).await,
            Some(In::End(_)) => self.end(done.clone()).await,
        }
    }

    /// UserInput: one turn, sent like any SendMessage. Its output comes from the feed, as for
    /// every client of the session.
    async fn input(&mut self, text: String) -> Flow {
        if text.trim().is_empty() {
            return go(self.out.error("UserInput.text is empty", false).await);
        }
        // An agent without a system prompt gets the project context with the first message
        // (the core puts it there).
        let sent = self
            .handle()
            .request(
                Req::Send {
                    id: self.id.clone(),
                    text,
                },
                None,
            )
            .await;
        match sent {
            Ok(_) => Flow::Go,
            Err(e) => go(self.out.error(e.to_string(), false).await),
        }
    }

    /// ToolResult / ToolApproval: the answer to one of the session's open requests (its
    /// `call_id` is the request's id), resolved through the engine like any client's: a
    /// permission is approved or denied, a client tool's result (or a question's answer) is
    /// the answer. Only this session's open requests can be answered on its stream.
    async fn answer(&mut self, answer: Answer_) -> Flow {
        let (call_id, decision) = match answer {
            Answer_::ToolResult(r) => (
                r.call_id,
                Decision::Answer {
                    text: truncate(&r.result, CLIENT_RESULT_MAX).into_owned(),
                    is_error: r.is_error,
                },
            ),
            Answer_::Approval(a) if a.approved => (a.call_id, Decision::Approve),
            Answer_::Approval(a) => (
                a.call_id,
                Decision::Deny {
                    reason: "denied by the sunbeam client".into(),
                },
            ),
        };
        // The core scopes the answer to this session: another session's request is "not
        // found" (OBEY-2040), a second answer "already resolved" (OBEY-2041).
        match self
            .handle()
            .resolve(call_id, Some(self.id.clone()), decision, RESOLVED_BY)
            .await
        {
            Ok(_) => Flow::Go,
            Err(e) => go(self.out.error(e.to_string(), false).await),
        }
    }

    /// The session's open requests, asked of a client that just attached.
    async fn show_open_approvals(&mut self) -> Flow {
        let only = Some(self.id.clone());
        let open = match self
            .handle()
            .query(|reply| Query::PendingApprovals(only, reply))
            .await
        {
            Ok(open) => open,
            Err(e) => return go(self.out.error(e.to_string(), false).await),
        };
        // Requests settled while this stream was not looking are forgotten.
        self.shown.retain(|id| open.iter().any(|a| &a.id == id));
        for a in open {
            if self.on_approval(a).await == Flow::Stop {
                return Flow::Stop;
            }
        }
        Flow::Go
    }

    /// The one place the session's requests for a human (or for the client) become server
    /// messages: a permission is `ApprovalNeeded`; a client tool, and a question (Claude Code's
    /// `AskUserQuestion`, answered with its result), is a `ToolCall` with `is_local`. The
    /// request's id is the `call_id` the answer names. How each is settled (here, by another
    /// client, the CLI, expiry, the turn's end) is the core's note in the activity feed.
    async fn on_approval(&mut self, a: Approval) -> Flow {
        if a.session != self.id {
            return Flow::Go;
        }
        if a.is_pending() {
            if !self.shown.insert(a.id.clone()) {
                return Flow::Go;
            }
            let args_json = truncate(&a.input, TEXT_MAX).into_owned();
            return match a.kind {
                AskKind::Permission => go(self
                    .out
                    .send(OutMsg::Approval(pb::ApprovalNeeded {
                        call_id: a.id,
                        name: a.tool,
                        args_json,
                        summary: truncate(&a.summary, TEXT_MAX).into_owned(),
                    }))
                    .await),
                AskKind::ClientTool | AskKind::Question => {
                    let running = OutMsg::Status(pb::Status {
                        message: a.tool.clone(),
                        kind: pb::StatusKind::ToolRunning as i32,
                    });
                    let call = OutMsg::ToolCall(pb::ToolCall {
                        call_id: a.id,
                        name: a.tool,
                        args_json,
                        is_local: true,
                        needs_approval: false,
                    });
                    go(self.out.send(call).await && self.out.send(running).await)
                }
            };
        }
        // Settled: the core's note about it comes with the activity (a Status INFO).
        self.shown.remove(&a.id);
        Flow::Go
    }

    /// EndSession: the session closed (never resumed) and stopped gracefully, in one step of
    /// the core (waited for in a task of its own, so that the turn it lets finish still
    /// streams here), then SessionEnd.
    async fn end(&mut self, done: mpsc::Sender<Outcome>) -> Flow {
        if self.ending {
            return go(self
                .out
                .error("EndSession is already under way", false)
                .await);
        }
        self.ending = true;
        let handle = self.handle().clone();
        let id = self.id.clone();
        tokio::spawn(async move {
            let result = handle.request(Req::Close { id }, None).await;
            let _ = done.send(Outcome::Ended(result)).await;
        });
        Flow::Go
    }

    async fn on_outcome(&mut self, outcome: Outcome) -> Flow {
        match outcome {
            Outcome::Ended(result) => {
                let ended = match &result {
                    Ok(_) => true,
                    Err(e) => matches!(
                        e.code,
                        ErrorCode::AlreadyStopped | ErrorCode::GracefulStopTimedOut
                    ),
                };
                if !ended {
                    self.ending = false;
                    let e = result.err().map(|e| e.to_string()).unwrap_or_default();
                    return go(self.out.error(format!("EndSession: {e}"), false).await);
                }
                if self.catch_up().await == Flow::Stop {
                    return Flow::Stop;
                }
                let mut summary = self.summary().await;
                if let Err(e) = &result {
                    if e.code == ErrorCode::GracefulStopTimedOut {
                        summary.push_str(" (the turn did not finish in time and was interrupted)");
                    }
                }
                self.out.send(OutMsg::End(pb::SessionEnd { summary })).await;
                Flow::Stop
            }
        }
    }

    /// A status change of the session. Terminal ones end the stream, after everything the
    /// session did before them.
    async fn on_status(&mut self, status: Status, message: &str) -> Flow {
        match status {
            // This client's own EndSession answers with SessionEnd when its stop is done.
            Status::Stopped if self.ending => Flow::Go,
            Status::Stopped => {
                if self.catch_up().await == Flow::Stop {
                    return Flow::Stop;
                }
                let summary = self.summary().await;
                self.out.send(OutMsg::End(pb::SessionEnd { summary })).await;
                Flow::Stop
            }
            Status::Failed => {
                // An ERROR activity of a failing turn ends the stream itself (fatal).
                if self.catch_up().await == Flow::Stop {
                    return Flow::Stop;
                }
                self.out
                    .error(format!("the session failed: {message}"), true)
                    .await;
                Flow::Stop
            }
            _ => Flow::Go,
        }
    }

    /// After missing status events: the session's status now.
    async fn recheck_status(&mut self) -> Flow {
        let now = match self.handle().session(self.id.clone()).await {
            Ok(v) => v.map(|v| {
                let r = v.record;
                (
                    r.status,
                    r.error.as_ref().map(|e| e.to_string()).unwrap_or_default(),
                )
            }),
            Err(_) => return Flow::Stop, // the daemon is gone
        };
        match now {
            Some((status, message)) => self.on_status(status, &message).await,
            None => {
                self.out.error("the session no longer exists", true).await;
                Flow::Stop
            }
        }
    }

    /// Everything stored after `last_seq`, in pages: after falling behind the hub, and before
    /// the stream ends (so that nothing the session did is missing).
    async fn catch_up(&mut self) -> Flow {
        loop {
            let session = self.id.clone();
            let after = self.last_seq;
            let page = match self
                .handle()
                .query(|reply| Query::Activities {
                    session,
                    after,
                    limit: CATCH_UP_PAGE,
                    reply,
                })
                .await
            {
                Ok(Ok(page)) => page,
                Ok(Err(e)) => {
                    return go(self
                        .out
                        .error(format!("cannot read the session's activity: {e}"), false)
                        .await)
                }
                Err(_) => return Flow::Stop,
            };
            let full = page.len() == CATCH_UP_PAGE;
            for ev in page {
                if self.on_activity(ev).await == Flow::Stop {
                    return Flow::Stop;
                }
            }
            if !full {
                return Flow::Go;
            }
        }
    }

    /// The one place the session's activities become server messages.
    async fn on_activity(&mut self, ev: ActivityEvent) -> Flow {
        // Its own session's only (the hub's subscription is by session).
        if ev.seq <= self.last_seq {
            return Flow::Go;
        }
        self.last_seq = ev.seq;
        if let Some(t) = ev.turn {
            if self.turn.as_ref().map(|(n, _)| *n) != Some(t) {
                self.turn = Some((t, Answer::default()));
            }
        }
        let a = &ev.activity;
        let content = || truncate(&a.content, TEXT_MAX).into_owned();
        let status = |kind: pb::StatusKind, message: String| {
            OutMsg::Status(pb::Status {
                message,
                kind: kind as i32,
            })
        };
        match a.kind() {
            ActivityKind::Thinking => go(self
                .out
                .send(status(pb::StatusKind::Thinking, content()))
                .await),
            // A call of a client tool shows as its request (on_approval), with the id to answer.
            ActivityKind::ToolCall if self.client_tools.contains(&a.tool_name) => Flow::Go,
            ActivityKind::ToolCall => {
                // The policy's rule, the core's: a call it leaves to a human waits for approval
                // (an ApprovalNeeded follows when the agent asks).
                let needs_approval = self.policy.decide(AskKind::Permission, &a.tool_name)
                    == paddock_core::approval::PolicyAnswer::AskHuman;
                let call = OutMsg::ToolCall(pb::ToolCall {
                    call_id: a.tool_call_id.clone(),
                    name: a.tool_name.clone(),
                    args_json: args_json(&a.content),
                    is_local: false,
                    needs_approval,
                });
                let running = status(pb::StatusKind::ToolRunning, a.tool_name.clone());
                go(self.out.send(call).await && self.out.send(running).await)
            }
            ActivityKind::ToolResult => {
                let message = if a.tool_success {
                    a.tool_name.clone()
                } else {
                    let first = a.content.lines().next().unwrap_or_default();
                    format!("{} failed: {}", a.tool_name, truncate(first, 200))
                };
                go(self
                    .out
                    .send(status(pb::StatusKind::ToolDone, message))
                    .await)
            }
            // The agent's own words are its answer (anything outside a turn is a notice); a
            // status change (the core's notes about requests, an API retry) is a notice.
            ActivityKind::Status => {
                go(self.out.send(status(pb::StatusKind::Info, content())).await)
            }
            ActivityKind::Text => match &mut self.turn {
                Some((_, answer)) if ev.turn.is_some() => {
                    let delta = answer.push(&a.content, false);
                    go(delta.is_empty()
                        || self
                            .out
                            .send(OutMsg::Delta(pb::TextDelta { text: delta }))
                            .await)
                }
                _ => go(self.out.send(status(pb::StatusKind::Info, content())).await),
            },
            ActivityKind::Completion => {
                let turn = ev.turn.unwrap_or(0);
                let mut answer = match self.turn.take() {
                    Some((t, a)) if t == turn => a,
                    _ => Answer::default(),
                };
                let delta = answer.push(&a.content, true);
                if !delta.is_empty()
                    && !self
                        .out
                        .send(OutMsg::Delta(pb::TextDelta { text: delta }))
                        .await
                {
                    return Flow::Stop;
                }
                let session = self.id.clone();
                let tokens = self
                    .handle()
                    .query(|reply| Query::TurnTokens {
                        session,
                        turn,
                        reply,
                    })
                    .await;
                let (tokens_in, tokens_out) = match tokens {
                    Ok(Ok(t)) => t,
                    Ok(Err(e)) => {
                        let m = format!("cannot read the turn's tokens: {e}");
                        return go(self.out.error(m, false).await);
                    }
                    Err(_) => return Flow::Stop, // the daemon is gone
                };
                go(self
                    .out
                    .send(OutMsg::Done(pb::TextDone {
                        full_text: answer.full_text(),
                        input_tokens: u32::try_from(tokens_in).unwrap_or(u32::MAX),
                        output_tokens: u32::try_from(tokens_out).unwrap_or(u32::MAX),
                    }))
                    .await)
            }
            ActivityKind::Error => {
                self.turn = None;
                let failed = self
                    .handle()
                    .session(self.id.clone())
                    .await
                    .ok()
                    .flatten()
                    .is_none_or(|v| v.record.status == Status::Failed);
                let sent = self.out.error(&a.content, failed).await;
                if failed {
                    Flow::Stop
                } else {
                    go(sent)
                }
            }
        }
    }

    /// SessionEnd's summary: turns, tokens, and the first line of the last answer.
    async fn summary(&self) -> String {
        let session = self.id.clone();
        let found = self
            .handle()
            .query(|reply| Query::History {
                session,
                limit: SUMMARY_ACTIVITIES,
                reply,
            })
            .await
            .ok()
            .and_then(Result::ok)
            .and_then(|h| {
                let last = h
                    .activities
                    .into_iter()
                    .rev()
                    .find(|a| a.activity.kind() == ActivityKind::Completion)
                    .map(|a| a.activity.content);
                Some((h.record?, last))
            });
        let Some((rec, last)) = found else {
            return format!("session {} ended", self.id);
        };
        let mut s = format!(
            "{} turn{}, {} input + {} output tokens",
            rec.turns,
            if rec.turns == 1 { "" } else { "s" },
            rec.tokens_input,
            rec.tokens_output
        );
        if let Some(text) = last {
            let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
            s.push_str(&format!("; last answer: {}", truncate(first.trim(), 200)));
        }
        s
    }
}

/// A client's answer to the session.
enum Answer_ {
    ToolResult(pb::ToolResult),
    Approval(pb::ToolApproval),
}

/// `StartSession.client_tools` as `provider_config["client_tools"]` (none: `None`). The core
/// checks them with the rest of the configuration (names, schemas, how many).
fn client_tools_json(tools: &[pb::ToolDef]) -> Option<String> {
    if tools.is_empty() {
        return None;
    }
    let list: Vec<serde_json::Value> = tools
        .iter()
        .map(|t| {
            serde_json::json!({
                "name": t.name,
                "description": t.description,
                "schema_json": t.schema_json,
            })
        })
        .collect();
    Some(serde_json::Value::Array(list).to_string())
}

/// The names of a session's client tools.
fn client_tool_names(provider_config: &paddock_core::ProviderConfig) -> BTreeSet<String> {
    provider_config
        .agent()
        .client_tools
        .iter()
        .map(|t| t.name.clone())
        .collect()
}

/// The tools a client declared that the session's agent is not offered: those the session was
/// not made with (every agent takes client tools: the openai-api loop offers them to its model,
/// Claude Code, codex, gemini and ACP agents get them from paddock's MCP server, the scripted
/// agent calls what its script says).
fn unoffered(config: &SessionConfig, declared: &[String]) -> Vec<String> {
    let offered = client_tool_names(&config.provider_config);
    declared
        .iter()
        .filter(|n| !offered.contains(n.trim()))
        .cloned()
        .collect()
}

/// A tool call's arguments as JSON: the activity carries the call's main argument (a path, a
/// command) or its whole input; JSON stays, anything else becomes a JSON string.
fn args_json(content: &str) -> String {
    let content = truncate(content, TEXT_MAX);
    match serde_json::from_str::<serde_json::Value>(&content) {
        Ok(_) => content.into_owned(),
        Err(_) => serde_json::Value::String(content.into_owned()).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_core::Activity;

    #[test]
    fn a_refused_start_keeps_the_cores_refusal_and_its_words() {
        let e = parse_config("env = { \"A-B\" = \"x\" }").unwrap_err();
        assert!(
            matches!(&e, ConfigError::Env(paddock_core::EnvVarError::NotPortable(n)) if n == "A-B")
        );
        let e = SessionError::from(e);
        assert_eq!(
            e.to_string(),
            "config_toml: env: environment variable name \"A-B\": use letters, digits and _ \
             (not starting with a digit)"
        );
        let settings = parse_config("").unwrap();
        let e = session_provider_config(&settings, Some("{".into())).unwrap_err();
        assert!(matches!(&e, SessionError::ProviderConfig(c) if c.key == CLIENT_TOOLS_KEY));
        assert_eq!(
            e.to_string(),
            "provider_config.client_tools is not a JSON list: invalid type: map, expected a \
             sequence at line 1 column 0"
        );
    }

    #[test]
    fn config_toml_keys_types_and_unknowns() {
        let s = parse_config(
            r#"
            provider = "claude-code"
            permissions = "allow:Read,LS"
            max_tokens = 5000
            timeout = 60
            env = { ANTHROPIC_BASE_URL = "http://127.0.0.1:9" }
            [provider_config]
            command = "/opt/claude"
            max_tool_rounds = 3
            "#,
        )
        .unwrap();
        assert_eq!(s.provider, Provider::ClaudeCode);
        assert_eq!((s.max_tokens, s.timeout_ms), (5000, 60_000));
        assert_eq!(s.environment["ANTHROPIC_BASE_URL"], "http://127.0.0.1:9");
        assert_eq!(s.provider_config["permissions"], "allow:Read,LS");
        assert_eq!(s.provider_config["max_tool_rounds"], "3");
        let d = parse_config("").unwrap();
        assert_eq!(d.provider, Provider::Scripted);
        assert!(d.provider_config.is_empty() && d.environment.is_empty());

        let e = parse_config("modle = \"x\"\nprovider = \"scripted\"\ncolour = 1").unwrap_err();
        assert!(
            matches!(&e, ConfigError::UnknownKeys(k) if k == &["colour", "modle"]),
            "{e}"
        );
        assert!(
            e.to_string().contains("unknown key(s): colour, modle"),
            "{e}"
        );
        // Each refusal is its own variant, and says what to change.
        let refused = |toml: &str| parse_config(toml).unwrap_err();
        type Is = fn(&ConfigError) -> bool;
        let cases: [(&str, Is, &str); 6] = [
            (
                "provider = ",
                |e| matches!(e, ConfigError::NotToml(_)),
                "not valid TOML",
            ),
            (
                "provider = \"nope\"",
                |e| matches!(e, ConfigError::UnknownProvider(p) if p == "nope"),
                "unknown provider \"nope\" (known: ",
            ),
            (
                "max_tokens = -1",
                |e| matches!(e, ConfigError::WrongType { key, .. } if key == "max_tokens"),
                "max_tokens must be a non-negative integer (got -1)",
            ),
            (
                "env = { A = 1 }",
                |e| matches!(e, ConfigError::WrongType { key, .. } if key == "env.A"),
                "env.A must be a string (got integer)",
            ),
            (
                "[provider_config]\nsystem_prompt = \"x\"",
                |e| matches!(e, ConfigError::Reserved(_)),
                "provider_config.system_prompt is set by sunbeam itself",
            ),
            (
                "permissions = \"deny\"\n[provider_config]\npermissions = \"deny\"",
                |e| matches!(e, ConfigError::PermissionsTwice),
                "twice",
            ),
        ];
        for (toml, is, says) in cases {
            let e = refused(toml);
            assert!(is(&e), "{toml}: {e:?}");
            assert!(e.to_string().contains(says), "{toml}: {e}");
        }
    }

    #[test]
    fn project_context_is_bounded() {
        let s = pb::StartSession {
            prompt_md: "Be careful.\n".into(),
            git_branch: "main".into(),
            git_status: " M src/lib.rs\n".into(),
            file_tree: (0..FILE_TREE_ENTRIES_MAX + 7)
                .map(|i| format!("src/f{i}.rs"))
                .collect(),
            ..Default::default()
        };
        let c = project_context("/p", &s);
        assert!(c.contains("Project root: /p\nGit branch: main\n"), "{c}");
        assert!(c.contains("```\n M src/lib.rs\n```"), "{c}");
        assert!(c.contains(&format!(
            "## Files ({FILE_TREE_ENTRIES_MAX} of {})",
            FILE_TREE_ENTRIES_MAX + 7
        )));
        assert!(c.contains("… and 7 more\n"));
        assert!(
            c.ends_with("## Project instructions\n\nBe careful.\n"),
            "{c}"
        );
        let huge = pb::StartSession {
            prompt_md: "x".repeat(1 << 20),
            git_status: "y".repeat(1 << 20),
            file_tree: vec!["z".repeat(4096); 10_000],
            git_branch: "b".repeat(4096),
            ..Default::default()
        };
        // Everything together fits in one command-line argument.
        assert!(project_context("/p", &huge).len() < 64 * 1024 + 1024);
        let bare = project_context("/p", &pb::StartSession::default());
        assert_eq!(
            bare,
            "# Project context (from the sunbeam client)\n\nProject root: /p\n"
        );
    }

    #[test]
    fn answers_join_texts_and_skip_a_repeated_final_answer() {
        let mut a = Answer::default();
        assert_eq!(a.push("Looking.", false), "Looking.");
        assert_eq!(a.push("Done.", false), "\n\nDone.");
        assert_eq!(a.push("Done.", true), "");
        assert_eq!(a.full_text(), "Looking.\n\nDone.");
        let mut b = Answer::default();
        b.push("Part one", false);
        assert_eq!(b.push("Part one and two", true), " and two");
        let mut c = Answer::default();
        assert_eq!(c.push("Only the answer", true), "Only the answer");
        let mut d = Answer::default();
        d.push(&"x".repeat(TEXT_MAX * 2), false);
        assert!(d
            .full_text()
            .ends_with(&format!("[truncated {TEXT_MAX} bytes]")));
    }

    fn act(seq: u64, turn: u64, kind: ActivityKind, text: &str) -> ActivityEvent {
        ActivityEvent {
            session: SessionId::from("s"),
            seq,
            turn: Some(turn),
            ends_turn: kind.ends_turn(),
            activity: Activity::new(kind, text),
            at: paddock_core::Timestamp::from_millis(seq),
        }
    }

    #[test]
    fn conversation_is_user_and_assistant_as_the_client_saw_them() {
        use ActivityKind as K;
        let msg = |turn, text: &str| UserMessage {
            session: SessionId::from("s"),
            turn,
            text: text.into(),
            at: paddock_core::Timestamp::from_millis(turn),
        };
        let messages = [
            msg(
                1,
                &paddock_core::provider_config::with_system_prompt("ctx", "hello"),
            ),
            msg(2, "again"),
            msg(3, "running"),
        ];
        let acts = [
            act(1, 1, K::Thinking, "hmm"),
            act(2, 1, K::ToolCall, "."),
            act(3, 1, K::ToolResult, "a b"),
            act(4, 1, K::Text, "Two files."),
            // The core's note about a request, or an API retry, is not part of the answer.
            act(4, 1, K::Status, "API error 503; retry 1 of 3"),
            ActivityEvent {
                activity: Activity::new(K::Status, "a1 approved (cli)").with_tool("Bash", "a1"),
                ..act(4, 1, K::Status, "")
            },
            act(5, 1, K::Completion, "You said hello."),
            act(6, 2, K::Text, "Done."),
            act(7, 2, K::Completion, "Done."),
            act(8, 3, K::Thinking, "still going"),
        ];
        let h: Vec<(String, String)> = conversation(&messages, &acts, false)
            .into_iter()
            .map(|e| (e.role, e.content))
            .collect();
        let pairs: Vec<(&str, &str)> = h.iter().map(|(r, c)| (r.as_str(), c.as_str())).collect();
        assert_eq!(
            pairs,
            [
                ("user", "hello"),
                ("assistant", "Two files.\n\nYou said hello."),
                ("user", "again"),
                ("assistant", "Done."),
                ("user", "running"),
            ]
        );
        // Bounded: the newest entries are kept.
        let many: Vec<UserMessage> = (1..=HISTORY_ENTRIES_MAX as u64 + 5)
            .map(|t| msg(t, &format!("m{t}")))
            .collect();
        let h = conversation(&many, &[], false);
        assert_eq!(h.len(), HISTORY_ENTRIES_MAX);
        assert_eq!(
            h.last().unwrap().content,
            format!("m{}", HISTORY_ENTRIES_MAX + 5)
        );
    }

    #[test]
    fn tool_args_are_json() {
        assert_eq!(args_json("src/main.rs"), "\"src/main.rs\"");
        assert_eq!(args_json("{\"a\":1}"), "{\"a\":1}");
    }
}
