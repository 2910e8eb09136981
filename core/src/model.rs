//! The vocabulary every machine and every protocol shares: statuses, providers, activities,
//! a session's configuration and its durable record.
//!
//! Times in records and events are [`Timestamp`]s (wall clock, recorded only), supplied by
//! the caller; deadlines are [`crate::time::Instant`]s and never stored.

use std::collections::BTreeMap;
use std::sync::Arc;

pub use crate::time::Timestamp;

/// Identifies one request whose answer the shell is waiting for.
pub type RequestId = u64;

/// The request id of an act nobody waits for (the stops and cancels of a shutdown): never a
/// client's, so its answers go nowhere.
pub const NO_REPLY: RequestId = 0;

/// Identifies one provider process of one session (its "generation"): input from an older
/// process is recognised and ignored.
pub type RunId = u64;

/// A session id (a ULID string made by the shell).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(pub String);

impl std::fmt::Display for SessionId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for SessionId {
    fn from(s: &str) -> Self {
        SessionId(s.to_string())
    }
}

/// A session's status; the numbering is the obey wire enum's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Status {
    Created = 1,
    Starting = 2,
    /// Idle, waiting for input.
    Running = 3,
    /// Processing a message (a turn is in progress).
    Working = 4,
    Stopping = 5,
    /// Terminal: clean shutdown.
    Stopped = 6,
    /// Terminal: an error occurred.
    Failed = 7,
    /// Blocked on a human (an approval or a question). paddock extension.
    Waiting = 8,
}

impl Status {
    pub const ALL: [Status; 8] = [
        Status::Created,
        Status::Starting,
        Status::Running,
        Status::Working,
        Status::Waiting,
        Status::Stopping,
        Status::Stopped,
        Status::Failed,
    ];

    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Stopped | Status::Failed)
    }

    /// Whether a turn is open: the agent works on a message (WORKING), or waits for a human
    /// in the middle of one (WAITING). A status change out of these ends the turn.
    pub fn in_turn(self) -> bool {
        matches!(self, Status::Working | Status::Waiting)
    }

    /// "Active" as obey's ListSessions means it by default: CREATED, STARTING, RUNNING and
    /// WORKING, plus WAITING (paddock's, a working session waiting for a human). A STOPPING
    /// session is on its way out: listed when asked for by status or with terminated ones.
    pub fn is_active(self) -> bool {
        matches!(
            self,
            Status::Created
                | Status::Starting
                | Status::Running
                | Status::Working
                | Status::Waiting
        )
    }

    /// The wire value (`SessionStatus` in obey.local.v1).
    pub fn number(self) -> i32 {
        self as i32
    }

    pub fn from_number(n: i32) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.number() == n)
    }

    pub fn name(self) -> &'static str {
        match self {
            Status::Created => "CREATED",
            Status::Starting => "STARTING",
            Status::Running => "RUNNING",
            Status::Working => "WORKING",
            Status::Waiting => "WAITING",
            Status::Stopping => "STOPPING",
            Status::Stopped => "STOPPED",
            Status::Failed => "FAILED",
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Which agent a session runs; the numbering is the obey wire enum's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Provider {
    ClaudeCode = 1,
    OpenClaw = 2,
    Codex = 3,
    OpenAiApi = 4,
    /// paddock extension.
    Gemini = 5,
    /// paddock extension: any Agent Client Protocol agent.
    Acp = 6,
    /// paddock extension: the built-in scripted agent.
    Scripted = 7,
}

impl Provider {
    pub const ALL: [Provider; 7] = [
        Provider::ClaudeCode,
        Provider::OpenClaw,
        Provider::Codex,
        Provider::OpenAiApi,
        Provider::Gemini,
        Provider::Acp,
        Provider::Scripted,
    ];

    pub fn number(self) -> i32 {
        self as i32
    }

    pub fn from_number(n: i32) -> Option<Provider> {
        Provider::ALL.into_iter().find(|p| p.number() == n)
    }

    /// The name users type (`--provider claude-code`).
    pub fn name(self) -> &'static str {
        match self {
            Provider::ClaudeCode => "claude-code",
            Provider::OpenClaw => "openclaw",
            Provider::Codex => "codex",
            Provider::OpenAiApi => "openai-api",
            Provider::Gemini => "gemini",
            Provider::Acp => "acp",
            Provider::Scripted => "scripted",
        }
    }

    /// Whether the provider's agent takes `provider_config["system_prompt"]` itself (Claude
    /// Code and the scripted agent with `--append-system-prompt`, the openai-api loop as its
    /// system message). The others have no such channel: their session's first message
    /// carries it ([`crate::provider_config::with_system_prompt`]).
    pub fn takes_system_prompt(self) -> bool {
        matches!(
            self,
            Provider::Scripted | Provider::ClaudeCode | Provider::OpenAiApi
        )
    }

    pub fn from_name(name: &str) -> Option<Provider> {
        let n = name.to_ascii_lowercase().replace('_', "-");
        Provider::ALL
            .into_iter()
            .find(|p| p.name() == n || (n == "claude" && *p == Provider::ClaudeCode))
    }
}

/// What kind of thing an agent did; the numbering is the obey wire enum's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ActivityKind {
    Thinking = 1,
    ToolCall = 2,
    ToolResult = 3,
    /// The model's final output: ends the turn.
    Completion = 4,
    /// A provider error: ends the turn.
    Error = 5,
    Status = 6,
    /// The agent's own words between its tool calls (narration, not its reasoning, not a
    /// status change): a paddock extension that a seed client sees as THINKING.
    Text = 7,
}

impl ActivityKind {
    pub const ALL: [ActivityKind; 7] = [
        ActivityKind::Thinking,
        ActivityKind::ToolCall,
        ActivityKind::ToolResult,
        ActivityKind::Completion,
        ActivityKind::Error,
        ActivityKind::Status,
        ActivityKind::Text,
    ];

    pub fn number(self) -> i32 {
        self as i32
    }

    pub fn from_number(n: i32) -> Option<ActivityKind> {
        ActivityKind::ALL.into_iter().find(|k| k.number() == n)
    }

    /// COMPLETION and ERROR end a turn.
    pub fn ends_turn(self) -> bool {
        matches!(self, ActivityKind::Completion | ActivityKind::Error)
    }

    pub fn name(self) -> &'static str {
        match self {
            ActivityKind::Thinking => "THINKING",
            ActivityKind::ToolCall => "TOOL_CALL",
            ActivityKind::ToolResult => "TOOL_RESULT",
            ActivityKind::Completion => "COMPLETION",
            ActivityKind::Error => "ERROR",
            ActivityKind::Status => "STATUS",
            ActivityKind::Text => "TEXT",
        }
    }
}

/// One thing a provider did, as its adapter reports it. Tokens are deltas.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Activity {
    pub kind: Option<ActivityKind>,
    pub content: String,
    pub tool_name: String,
    pub tool_call_id: String,
    pub tool_success: bool,
    pub tokens_input: u64,
    pub tokens_output: u64,
}

impl Activity {
    pub fn new(kind: ActivityKind, content: impl Into<String>) -> Self {
        Activity {
            kind: Some(kind),
            content: content.into(),
            ..Activity::default()
        }
    }

    pub fn kind(&self) -> ActivityKind {
        self.kind.unwrap_or(ActivityKind::Status)
    }

    pub fn with_tokens(mut self, input: u64, output: u64) -> Self {
        self.tokens_input = input;
        self.tokens_output = output;
        self
    }

    pub fn with_tool(mut self, name: impl Into<String>, call_id: impl Into<String>) -> Self {
        self.tool_name = name.into();
        self.tool_call_id = call_id.into();
        self
    }
}

/// Bytes of one environment variable (name and value) passed to an agent or a task.
pub const ENV_ENTRY_BYTES_MAX: usize = 128 * 1024;

/// An environment passed to a process is one `execve` can take: every name non-empty, without
/// `=` or NUL; every value without NUL; each entry within [`ENV_ENTRY_BYTES_MAX`]. Checked when
/// a session or a task is asked for, so that a bad variable is refused before anything is
/// stored instead of failing the spawn later.
pub fn check_environment<'a>(
    env: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<(), EnvVarError> {
    for (key, value) in env {
        // The name as a refusal shows it: at most its first 64 characters.
        let shown = || {
            let mut k: String = key.chars().take(64).collect();
            if k.len() < key.len() {
                k.push('…');
            }
            k
        };
        if key.is_empty() {
            return Err(EnvVarError::EmptyName);
        }
        if key.contains('=') || key.contains('\0') {
            return Err(EnvVarError::Separator(shown()));
        }
        // Letters, digits and `_`, not starting with a digit: what a shell can name, and never
        // a pattern (podman's `--env NAME*` would bring in every variable it matches).
        let portable = key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !key.starts_with(|c: char| c.is_ascii_digit());
        if !portable {
            return Err(EnvVarError::NotPortable(shown()));
        }
        if value.contains('\0') {
            return Err(EnvVarError::NulInValue(shown()));
        }
        let bytes = key.len() + value.len() + 1;
        if bytes > ENV_ENTRY_BYTES_MAX {
            return Err(EnvVarError::TooLarge {
                name: shown(),
                bytes,
            });
        }
    }
    Ok(())
}

/// Why [`check_environment`] refuses a variable. A name is carried as it is shown: its first
/// 64 characters (then `…`), and escaped in the words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvVarError {
    #[error("an environment variable name must not be empty")]
    EmptyName,
    /// The name contains `=` or NUL.
    #[error("environment variable name \"{}\" contains '=' or NUL", .0.escape_debug())]
    Separator(String),
    /// The name is not letters, digits and `_`, or starts with a digit.
    #[error(
        "environment variable name \"{}\": use letters, digits and _ (not starting \
         with a digit)",
        .0.escape_debug()
    )]
    NotPortable(String),
    /// The value (of the variable named) contains NUL.
    #[error("the value of environment variable {} contains NUL", .0.escape_debug())]
    NulInValue(String),
    /// The entry (`NAME=value`) is `bytes` long, over [`ENV_ENTRY_BYTES_MAX`].
    #[error(
        "environment variable {} is {bytes} bytes; at most {ENV_ENTRY_BYTES_MAX}",
        .name.escape_debug()
    )]
    TooLarge { name: String, bytes: usize },
}

/// Everything a session is created with; restart re-uses it (with an optional
/// `provider_config` override).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionConfig {
    pub campaign_id: String,
    pub provider: Provider,
    pub model: String,
    pub agent_name: String,
    pub festival_id: String,
    pub task_id: String,
    /// The client's map with its settings parsed (see [`crate::ProviderConfig`]).
    pub provider_config: crate::ProviderConfig,
    pub environment: BTreeMap<String, String>,
    /// Token budget; 0 = unlimited.
    pub max_tokens: u64,
    /// Session timeout, counted from each start; 0 = none.
    pub timeout_ms: u64,
    pub initial_message: String,
    /// The campaign's root directory: where the agent runs.
    pub working_dir: String,
    /// Where the agent runs: its driver, a worktree, the sandbox's limits.
    pub env: crate::environment::EnvSpec,
}

impl SessionConfig {
    /// A minimal configuration (used by tests and the simulator).
    pub fn new(campaign_id: &str, provider: Provider, working_dir: &str) -> Self {
        SessionConfig {
            campaign_id: campaign_id.to_string(),
            provider,
            model: String::new(),
            agent_name: String::new(),
            festival_id: String::new(),
            task_id: String::new(),
            provider_config: crate::ProviderConfig::default(),
            environment: BTreeMap::new(),
            max_tokens: 0,
            timeout_ms: 0,
            initial_message: String::new(),
            working_dir: working_dir.to_string(),
            env: crate::environment::EnvSpec::default(),
        }
    }
}

/// The durable part of a session: exactly what the store keeps in `agent_sessions`, and what
/// the daemon rebuilds its state from after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    pub id: SessionId,
    /// Shared, not copied: the record is cloned into a `Persist` effect on every change of
    /// state (every event of a working session), and its configuration, which rarely
    /// changes, was most of what each clone copied, compared and dropped. A change goes
    /// through `Arc::make_mut`, so it never shows in an older copy.
    pub config: Arc<SessionConfig>,
    pub status: Status,
    pub tokens_input: u64,
    pub tokens_output: u64,
    /// The provider's process id while one runs.
    pub pid: Option<u32>,
    pub restart_count: u32,
    pub created_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub last_activity_at: Option<Timestamp>,
    pub ended_at: Option<Timestamp>,
    /// Set when FAILED: the code and message that ended the session.
    pub error: Option<crate::Error>,
    /// The provider's own conversation id (claude `session_id`, codex `thread_id`, …), kept so
    /// that a restart continues the same conversation.
    pub provider_session: Option<String>,
    /// The last activity sequence number used (per session; only goes up).
    pub last_activity_seq: u64,
    /// The last status-event sequence number used.
    pub last_status_seq: u64,
    /// How many turns have been started.
    pub turns: u64,
    /// True while turn number `turns` is in progress (its stream has not ended).
    pub turn_open: bool,
    /// Whether the last turn that ended, ended with an ERROR (not a COMPLETION): a session
    /// whose task failed is not "complete", though it lives on.
    pub last_turn_failed: bool,
    /// The provider run (process) the session has, if any: kept so that a daemon that
    /// restarts can adopt a process that outlived it (in the runner).
    pub run: Option<RunId>,
    /// How far into that run's output the session has applied, as the shell counts it (an
    /// opaque, increasing position): after a daemon restart, output is read again from here,
    /// and anything at or before it is recognised as already applied.
    pub provider_cursor: u64,
    /// Where the session's environment is in its life (`Ready` for one that needs nothing
    /// made).
    pub env_state: crate::environment::EnvState,
    /// The connection to the agent's machine (an ssh session's) is down: the agent works on
    /// there while paddock reconnects. Belongs to the current run: false again with another.
    pub disconnected: bool,
    /// Its client said it is done with it (sunbeam's EndSession, [`crate::Input::Close`]): the
    /// session is never resumed for its project. Set once, never cleared.
    pub closed_by_client: bool,
}

/// The `provider_config` key naming the project a sunbeam session belongs to (its root).
pub const PROJECT_KEY: &str = "sunbeam.project";

impl SessionRecord {
    /// The project (sunbeam's root) the session was made for, if it was.
    pub fn project(&self) -> Option<&str> {
        self.config.provider_config.project()
    }

    /// Whether a StartSession for `project` may resume this session: one made for that
    /// project that its client did not close.
    pub fn resumable_for(&self, project: &str) -> bool {
        self.project() == Some(project) && !self.closed_by_client
    }

    pub fn tokens_total(&self) -> u64 {
        self.tokens_input.saturating_add(self.tokens_output)
    }

    /// Ended, with no process named and (checked with its requests) nothing left to decide
    /// when a daemon starts: such a session need not be restored at start-up; it is recalled
    /// when something names it ([`crate::Engine::recall`]). A store selects the others by the
    /// same rule.
    pub fn is_settled(&self) -> bool {
        self.status.is_terminal() && self.pid.is_none() && self.run.is_none()
    }
}

/// The session a StartSession for `project` resumes: the newest (by creation, then id) of
/// those [resumable](SessionRecord::resumable_for) for it, ended or not; none: a new one is made.
pub fn session_to_resume<'a>(
    project: &str,
    candidates: impl IntoIterator<Item = &'a SessionRecord>,
) -> Option<&'a SessionRecord> {
    candidates
        .into_iter()
        .filter(|r| r.resumable_for(project))
        .max_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)))
}

/// An activity as stored and as sent to clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivityEvent {
    pub session: SessionId,
    pub seq: u64,
    /// The turn this activity belongs to (none for activity outside a turn).
    pub turn: Option<u64>,
    /// True on the one COMPLETION or ERROR that ends its turn's stream.
    pub ends_turn: bool,
    pub activity: Activity,
    pub at: Timestamp,
}

/// Something about a session worth a human's attention that is not a status change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub session: SessionId,
    /// The session's status when it happened.
    pub status: Status,
    pub message: String,
    pub at: Timestamp,
}

/// A status change, as stored and as sent to watchers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusEvent {
    pub session: SessionId,
    pub seq: u64,
    /// `None` for the first event of a session (its creation).
    pub previous: Option<Status>,
    pub new: Status,
    pub message: String,
    pub at: Timestamp,
}

/// A user message, stored in order with the turn it started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserMessage {
    pub session: SessionId,
    pub turn: u64,
    pub text: String,
    pub at: Timestamp,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_names_and_values_are_ones_execve_takes() {
        let check = |k: &str, v: &str| {
            let env = BTreeMap::from([(k.to_string(), v.to_string())]);
            check_environment(&env)
        };
        assert_eq!(check("PATH", "/bin:/usr/bin"), Ok(()));
        assert_eq!(check("EMPTY", ""), Ok(()));
        let refused = |k: &str, v: &str, want: EnvVarError, words: &str| {
            let e = check(k, v).unwrap_err();
            assert_eq!(e, want, "{k:?}");
            assert_eq!(e.to_string(), words);
        };
        refused(
            "",
            "x",
            EnvVarError::EmptyName,
            "an environment variable name must not be empty",
        );
        refused(
            "A=B",
            "x",
            EnvVarError::Separator("A=B".into()),
            "environment variable name \"A=B\" contains '=' or NUL",
        );
        refused(
            "A\0B",
            "x",
            EnvVarError::Separator("A\0B".into()),
            "environment variable name \"A\\0B\" contains '=' or NUL",
        );
        refused(
            "1A",
            "x",
            EnvVarError::NotPortable("1A".into()),
            "environment variable name \"1A\": use letters, digits and _ (not starting with a \
             digit)",
        );
        refused(
            "A",
            "x\0y",
            EnvVarError::NulInValue("A".into()),
            "the value of environment variable A contains NUL",
        );
        let big = "v".repeat(ENV_ENTRY_BYTES_MAX);
        refused(
            "A",
            &big,
            EnvVarError::TooLarge {
                name: "A".into(),
                bytes: ENV_ENTRY_BYTES_MAX + 2,
            },
            "environment variable A is 131074 bytes; at most 131072",
        );
        // A long name is shown cut, never echoed whole.
        let long = format!("{}=", "K".repeat(100_000));
        let cut = format!("{}…", "K".repeat(64));
        refused(
            &long,
            "x",
            EnvVarError::Separator(cut.clone()),
            &format!("environment variable name \"{cut}\" contains '=' or NUL"),
        );
    }
}
