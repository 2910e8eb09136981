//! Core values to SQLite columns and back.
//!
//! SQLite integers are `i64`; the core's counters and times are `u64`. Writing saturates at
//! `i64::MAX` (a ms timestamp, token count or sequence number never gets there, and one absurd
//! value must not fail a whole batch); reading refuses a negative or out-of-range value as
//! [`StoreError::Corrupt`], as it refuses an unknown enum number or malformed JSON.

use std::collections::BTreeMap;

use paddock_core::{
    Activity, ActivityEvent, ActivityKind, Driver, EnvSpec, EnvState, Error, ErrorCode,
    KubeOptions, PodmanOptions, Provider, ProviderConfig, QemuOptions, SessionConfig, SessionId,
    SessionRecord, SshTarget, Status, StatusEvent, UserMessage,
};
use rusqlite::Row;

use super::{Campaign, Result, StoreError};

/// The columns of `agent_sessions`, in the order `SELECT`s list them; the upsert is built
/// from this list so that it sets every column.
pub(super) const SESSION_COLUMNS: [&str; 46] = [
    "id",
    "campaign_id",
    "provider",
    "model",
    "agent_name",
    "status",
    "festival_id",
    "task_id",
    "tokens_input",
    "tokens_output",
    "max_tokens",
    "pid",
    "restart_count",
    "created_at",
    "started_at",
    "last_activity_at",
    "ended_at",
    "error_code",
    "error_message",
    "working_dir",
    "provider_config",
    "environment",
    "timeout_ms",
    "initial_message",
    "provider_session",
    "last_activity_seq",
    "last_status_seq",
    "turns",
    "turn_open",
    "run_id",
    "provider_cursor",
    "last_turn_failed",
    "env_driver",
    "env_worktree",
    "env_network",
    "env_state",
    "env_image",
    "env_memory",
    "env_pids",
    "env_podman",
    "env_podman_env",
    "env_ssh",
    "disconnected",
    "env_qemu",
    "env_kubernetes",
    "closed_by_client",
];

/// The columns of `agent_activities` the readers select (all but those that carry the
/// session's progress), in order: a catch-up or a history decodes thousands of rows, by
/// position. The key holds the seq ([`super::activity_seq`]).
pub(super) const ACTIVITY_COLUMNS: [&str; 11] = [
    "key",
    "turn",
    "ends_turn",
    "type",
    "content",
    "tool_name",
    "tool_call_id",
    "tool_success",
    "tokens_input",
    "tokens_output",
    "at",
];

/// The `role` of a user message in `session_messages`.
pub(super) const ROLE_USER: &str = "user";

/// A `u64` as an SQLite integer (saturating).
pub(super) fn int(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A recorded time as an SQLite integer (ms since the epoch, saturating).
pub(super) fn time(t: paddock_core::Timestamp) -> i64 {
    int(t.millis())
}

/// A `usize` (a `LIMIT`) as an SQLite integer (saturating).
pub(super) fn limit(v: usize) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn corrupt(table: &str, col: &str, what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{table}.{col}: {what}"))
}

/// A column of a selected row, for the decoders: by name, or by its position in the SELECT.
/// rusqlite finds a named column by comparing it with every column's name, for every field of
/// every row; for 10,000 stored sessions of 32 columns that lookup was most of the daemon's
/// start-up. A [`Col`] carries the position (and its name, for errors).
pub(super) trait Column: Copy {
    fn get<T: rusqlite::types::FromSql>(self, row: &Row) -> rusqlite::Result<T>;
    fn name(self) -> &'static str;
    /// The column's text, borrowed from the row (no copy).
    fn text<'r>(self, row: &'r Row<'_>) -> rusqlite::Result<&'r str>;
}

impl Column for &'static str {
    fn get<T: rusqlite::types::FromSql>(self, row: &Row) -> rusqlite::Result<T> {
        row.get(self)
    }
    fn text<'r>(self, row: &'r Row<'_>) -> rusqlite::Result<&'r str> {
        Ok(row.get_ref(self)?.as_str()?)
    }
    fn name(self) -> &'static str {
        self
    }
}

/// A column by position.
#[derive(Debug, Clone, Copy)]
pub(super) struct Col {
    at: usize,
    name: &'static str,
}

impl Column for Col {
    fn get<T: rusqlite::types::FromSql>(self, row: &Row) -> rusqlite::Result<T> {
        row.get(self.at)
    }
    fn text<'r>(self, row: &'r Row<'_>) -> rusqlite::Result<&'r str> {
        Ok(row.get_ref(self.at)?.as_str()?)
    }
    fn name(self) -> &'static str {
        self.name
    }
}

/// Column `name` of a row selected with `columns`; evaluated at compile time (`sc!`, `ac!`),
/// so a name that is not in the list does not build.
const fn col_in(columns: &[&str], name: &'static str) -> Col {
    let mut i = 0;
    while i < columns.len() {
        let (a, b) = (columns[i].as_bytes(), name.as_bytes());
        if a.len() == b.len() {
            let mut j = 0;
            while j < a.len() && a[j] == b[j] {
                j += 1;
            }
            if j == a.len() {
                return Col { at: i, name };
            }
        }
        i += 1;
    }
    panic!("not a selected column")
}

/// A column of a row selected with [`SESSION_COLUMNS`], by position.
macro_rules! sc {
    ($name:literal) => {
        const { col_in(&SESSION_COLUMNS, $name) }
    };
}

/// A column of a row selected with [`ACTIVITY_COLUMNS`], by position.
macro_rules! ac {
    ($name:literal) => {
        const { col_in(&ACTIVITY_COLUMNS, $name) }
    };
}

fn uint(row: &Row, table: &str, col: impl Column) -> Result<u64> {
    let v: i64 = col.get(row)?;
    u64::try_from(v).map_err(|_| corrupt(table, col.name(), format!("negative value {v}")))
}

fn opt_uint(row: &Row, table: &str, col: impl Column) -> Result<Option<u64>> {
    let v: Option<i64> = col.get(row)?;
    v.map(|v| {
        u64::try_from(v).map_err(|_| corrupt(table, col.name(), format!("negative value {v}")))
    })
    .transpose()
}

/// A recorded time (ms since the epoch).
pub(super) fn stamp(row: &Row, table: &str, col: impl Column) -> Result<paddock_core::Timestamp> {
    uint(row, table, col).map(paddock_core::Timestamp::from_millis)
}

pub(super) fn opt_stamp(
    row: &Row,
    table: &str,
    col: impl Column,
) -> Result<Option<paddock_core::Timestamp>> {
    Ok(opt_uint(row, table, col)?.map(paddock_core::Timestamp::from_millis))
}

fn u32_col(row: &Row, table: &str, col: impl Column) -> Result<u32> {
    let v: i64 = col.get(row)?;
    u32::try_from(v).map_err(|_| corrupt(table, col.name(), format!("value {v} out of range")))
}

fn i32_col(row: &Row, table: &str, col: impl Column) -> Result<i32> {
    let v: i64 = col.get(row)?;
    i32::try_from(v).map_err(|_| corrupt(table, col.name(), format!("value {v} out of range")))
}

fn status(row: &Row, table: &str, col: impl Column) -> Result<Status> {
    let n = i32_col(row, table, col)?;
    Status::from_number(n).ok_or_else(|| corrupt(table, col.name(), format!("unknown status {n}")))
}

fn opt_status(row: &Row, table: &str, col: impl Column) -> Result<Option<Status>> {
    let v: Option<i64> = col.get(row)?;
    match v {
        None => Ok(None),
        Some(_) => status(row, table, col).map(Some),
    }
}

fn provider(row: &Row, table: &str, col: impl Column) -> Result<Provider> {
    let n = i32_col(row, table, col)?;
    Provider::from_number(n)
        .ok_or_else(|| corrupt(table, col.name(), format!("unknown provider {n}")))
}

fn activity_kind(row: &Row, table: &str, col: impl Column) -> Result<ActivityKind> {
    let n = i32_col(row, table, col)?;
    ActivityKind::from_number(n)
        .ok_or_else(|| corrupt(table, col.name(), format!("unknown activity type {n}")))
}

/// A string map as the JSON object stored in `provider_config` / `environment`.
/// The `env_podman` column: the podman block's lists (its variables are a map of their own,
/// sealed).
#[derive(serde::Serialize, serde::Deserialize, Default, PartialEq)]
#[serde(default)]
pub(super) struct PodmanJson {
    pub mounts: Vec<String>,
    pub ports: Vec<String>,
    pub flags: Vec<String>,
}

/// The `env_qemu` column: the qemu driver's VM.
#[derive(serde::Serialize, serde::Deserialize, Default, PartialEq)]
#[serde(default)]
pub(super) struct QemuJson {
    pub cpus: u32,
    pub flags: Vec<String>,
}

/// The `env_kubernetes` column: the kubernetes driver's pod.
#[derive(serde::Serialize, serde::Deserialize, Default, PartialEq)]
#[serde(default)]
pub(super) struct KubeJson {
    pub namespace: String,
    pub service_account: String,
    pub pod_spec: String,
    pub kubeconfig: String,
    pub context: String,
}

impl From<&KubeOptions> for KubeJson {
    fn from(k: &KubeOptions) -> Self {
        KubeJson {
            namespace: k.namespace.clone(),
            service_account: k.service_account.clone(),
            pod_spec: k.pod_spec.clone(),
            kubeconfig: k.kubeconfig.clone(),
            context: k.context.clone(),
        }
    }
}

/// The `env_ssh` column: the ssh driver's machine.
#[derive(serde::Serialize, serde::Deserialize, Default, PartialEq)]
#[serde(default)]
pub(super) struct SshJson {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub key_file: String,
    pub known_hosts: String,
    pub accept_new_host_key: bool,
    pub paddock: String,
    pub remote_dir: String,
    pub workdir: String,
}

impl From<&SshTarget> for SshJson {
    fn from(t: &SshTarget) -> Self {
        SshJson {
            host: t.host.clone(),
            port: t.port,
            user: t.user.clone(),
            key_file: t.key_file.clone(),
            known_hosts: t.known_hosts.clone(),
            accept_new_host_key: t.accept_new_host_key,
            paddock: t.paddock.clone(),
            remote_dir: t.remote_dir.clone(),
            workdir: t.workdir.clone(),
        }
    }
}

impl From<SshJson> for SshTarget {
    fn from(j: SshJson) -> Self {
        SshTarget {
            host: j.host,
            port: j.port,
            user: j.user,
            key_file: j.key_file,
            known_hosts: j.known_hosts,
            accept_new_host_key: j.accept_new_host_key,
            paddock: j.paddock,
            remote_dir: j.remote_dir,
            workdir: j.workdir,
        }
    }
}

pub(super) fn map_to_json(map: &BTreeMap<String, String>) -> Result<String> {
    serde_json::to_string(map).map_err(|e| StoreError::Corrupt(format!("encoding a map: {e}")))
}

/// The text an option block is stored as: `{}` when it is all defaults (most sessions use
/// none of the drivers' options), so that reading it back needs no parse.
pub(super) fn block_to_json<T: serde::Serialize + Default + PartialEq>(
    block: &T,
    what: &str,
) -> Result<String> {
    if *block == T::default() {
        return Ok(EMPTY_OBJECT.to_string());
    }
    serde_json::to_string(block)
        .map_err(|e| StoreError::Corrupt(format!("encoding the {what} block: {e}")))
}

const EMPTY_OBJECT: &str = "{}";

/// A JSON object column: an option block or a map. `{}` (what most rows hold) is the default
/// without a parse; the rest is parsed from the row's own text, not a copy of it.
fn json_col<T: serde::de::DeserializeOwned + Default>(
    row: &Row,
    table: &str,
    col: impl Column,
) -> Result<T> {
    let text = col.text(row)?;
    if text == EMPTY_OBJECT {
        return Ok(T::default());
    }
    serde_json::from_str(text)
        .map_err(|e| corrupt(table, col.name(), format!("bad JSON object: {e}")))
}

fn map_from_json(row: &Row, table: &str, col: impl Column) -> Result<BTreeMap<String, String>> {
    json_col(row, table, col)
}

/// Decodes one row selected with [`SESSION_COLUMNS`].
/// Sealed credentials are opened with `sealer`: the settings of `provider_config` are parsed
/// from the map as the client sent it.
pub(super) fn session_from_row(row: &Row, sealer: &crate::seal::Sealer) -> Result<SessionRecord> {
    let id: String = sc!("id").get(row)?;
    // Name the session in every decoding error: one bad row must be findable.
    decode_session(row, &id, sealer).map_err(|e| match e {
        StoreError::Corrupt(m) => StoreError::Corrupt(format!("{m} (session {id})")),
        other => other,
    })
}

/// A stored session's `provider_config`, parsed as at its create. The one exception: earlier
/// versions checked a `client_tools` list only for the openai-api loop, and none refused a
/// name twice or a schema that is not an object; a stored list paddock refuses now is dropped,
/// with a warning naming the session, rather than making its row unreadable (a daemon would
/// not start with such a live session). Anything else refused is a corrupt row.
fn stored_provider_config(
    id: &str,
    map: BTreeMap<String, String>,
) -> std::result::Result<ProviderConfig, paddock_core::ConfigError> {
    if !map.contains_key(paddock_core::CLIENT_TOOLS_KEY) {
        return ProviderConfig::parse(map);
    }
    match ProviderConfig::parse(map.clone()) {
        Err(e) if e.key == paddock_core::CLIENT_TOOLS_KEY => {
            tracing::warn!(session = id, "its stored client tools are dropped: {e}");
            let mut map = map;
            map.remove(paddock_core::CLIENT_TOOLS_KEY);
            ProviderConfig::parse(map)
        }
        parsed => parsed,
    }
}

fn decode_session(row: &Row, id: &str, sealer: &crate::seal::Sealer) -> Result<SessionRecord> {
    const T: &str = "agent_sessions";
    let config = SessionConfig {
        campaign_id: sc!("campaign_id").get(row)?,
        provider: provider(row, T, sc!("provider"))?,
        model: sc!("model").get(row)?,
        agent_name: sc!("agent_name").get(row)?,
        festival_id: sc!("festival_id").get(row)?,
        task_id: sc!("task_id").get(row)?,
        // Validated when the session was created or restarted; a value paddock cannot use
        // now is a corrupt row, never a silent default (but see `stored_provider_config`).
        provider_config: stored_provider_config(
            id,
            sealer.open(map_from_json(row, T, sc!("provider_config"))?),
        )
        .map_err(|e| corrupt(T, sc!("provider_config").name(), e))?,
        environment: sealer.open(map_from_json(row, T, sc!("environment"))?),
        max_tokens: uint(row, T, sc!("max_tokens"))?,
        timeout_ms: uint(row, T, sc!("timeout_ms"))?,
        initial_message: sc!("initial_message").get(row)?,
        working_dir: sc!("working_dir").get(row)?,
        env: EnvSpec {
            driver: {
                let name: String = sc!("env_driver").get(row)?;
                Driver::parse(&name).ok_or_else(|| {
                    corrupt(
                        T,
                        sc!("env_driver").name(),
                        format!("unknown driver {name:?}"),
                    )
                })?
            },
            worktree: sc!("env_worktree").get(row)?,
            network: sc!("env_network").get(row)?,
            image: sc!("env_image").get(row)?,
            memory_bytes: uint(row, T, sc!("env_memory"))?,
            pids: u32::try_from(uint(row, T, sc!("env_pids"))?)
                .map_err(|_| corrupt(T, sc!("env_pids").name(), "out of range"))?,
            podman: {
                let o: PodmanJson = json_col(row, T, sc!("env_podman"))?;
                Box::new(PodmanOptions {
                    mounts: o.mounts,
                    ports: o.ports,
                    flags: o.flags,
                    env: sealer.open(map_from_json(row, T, sc!("env_podman_env"))?),
                })
            },
            qemu: {
                let j: QemuJson = json_col(row, T, sc!("env_qemu"))?;
                paddock_core::environment::boxed(QemuOptions {
                    cpus: j.cpus,
                    flags: j.flags,
                })
            },
            ssh: {
                let j: SshJson = json_col(row, T, sc!("env_ssh"))?;
                paddock_core::environment::boxed(SshTarget::from(j))
            },
            kubernetes: {
                let j: KubeJson = json_col(row, T, sc!("env_kubernetes"))?;
                paddock_core::environment::boxed(KubeOptions {
                    namespace: j.namespace,
                    service_account: j.service_account,
                    pod_spec: j.pod_spec,
                    kubeconfig: j.kubeconfig,
                    context: j.context,
                })
            },
        },
    };
    let pid = match sc!("pid").get::<Option<i64>>(row)? {
        None => None,
        Some(p) => Some(
            u32::try_from(p)
                .map_err(|_| corrupt(T, sc!("pid").name(), format!("value {p} out of range")))?,
        ),
    };
    // The code decides whether there is an error; a missing message reads as empty.
    let error = match sc!("error_code").get::<Option<String>>(row)? {
        None => None,
        Some(code) => {
            let parsed = ErrorCode::parse(&code).ok_or_else(|| {
                corrupt(
                    T,
                    sc!("error_code").name(),
                    format!("unknown code {code:?}"),
                )
            })?;
            let message: Option<String> = sc!("error_message").get(row)?;
            Some(Error::new(parsed, message.unwrap_or_default()))
        }
    };
    Ok(SessionRecord {
        id: SessionId(id.to_string()),
        config: config.into(),
        status: status(row, T, sc!("status"))?,
        tokens_input: uint(row, T, sc!("tokens_input"))?,
        tokens_output: uint(row, T, sc!("tokens_output"))?,
        pid,
        restart_count: u32_col(row, T, sc!("restart_count"))?,
        created_at: stamp(row, T, sc!("created_at"))?,
        started_at: opt_stamp(row, T, sc!("started_at"))?,
        last_activity_at: opt_stamp(row, T, sc!("last_activity_at"))?,
        ended_at: opt_stamp(row, T, sc!("ended_at"))?,
        error,
        provider_session: sc!("provider_session").get(row)?,
        last_activity_seq: uint(row, T, sc!("last_activity_seq"))?,
        last_status_seq: uint(row, T, sc!("last_status_seq"))?,
        turns: uint(row, T, sc!("turns"))?,
        turn_open: sc!("turn_open").get(row)?,
        run: opt_uint(row, T, sc!("run_id"))?,
        provider_cursor: uint(row, T, sc!("provider_cursor"))?,
        last_turn_failed: sc!("last_turn_failed").get(row)?,
        env_state: {
            let n: i64 = sc!("env_state").get(row)?;
            EnvState::from_number(n)
                .ok_or_else(|| corrupt(T, sc!("env_state").name(), format!("unknown state {n}")))?
        },
        disconnected: sc!("disconnected").get(row)?,
        closed_by_client: sc!("closed_by_client").get(row)?,
    })
}

/// Decodes one `agent_activities` row (selected with [`ACTIVITY_COLUMNS`]).
pub(super) fn activity_from_row(session: &str, row: &Row) -> Result<ActivityEvent> {
    const T: &str = "agent_activities";
    Ok(ActivityEvent {
        session: SessionId(session.to_string()),
        seq: super::activity_seq(ac!("key").get(row)?),
        turn: opt_uint(row, T, ac!("turn"))?,
        ends_turn: ac!("ends_turn").get(row)?,
        activity: Activity {
            kind: Some(activity_kind(row, T, ac!("type"))?),
            content: ac!("content").get(row)?,
            tool_name: ac!("tool_name").get(row)?,
            tool_call_id: ac!("tool_call_id").get(row)?,
            tool_success: ac!("tool_success").get(row)?,
            tokens_input: uint(row, T, ac!("tokens_input"))?,
            tokens_output: uint(row, T, ac!("tokens_output"))?,
        },
        at: stamp(row, T, ac!("at"))?,
    })
}

/// Decodes one `session_status_events` row.
pub(super) fn status_event_from_row(session: &str, row: &Row) -> Result<StatusEvent> {
    const T: &str = "session_status_events";
    Ok(StatusEvent {
        session: SessionId(session.to_string()),
        seq: uint(row, T, "seq")?,
        previous: opt_status(row, T, "previous_status")?,
        new: status(row, T, "new_status")?,
        message: row.get("message")?,
        at: stamp(row, T, "at")?,
    })
}

/// Decodes one `session_messages` row.
pub(super) fn user_message_from_row(session: &str, row: &Row) -> Result<UserMessage> {
    const T: &str = "session_messages";
    Ok(UserMessage {
        session: SessionId(session.to_string()),
        turn: uint(row, T, "turn")?,
        text: row.get("content")?,
        at: stamp(row, T, "at")?,
    })
}

/// Decodes one `campaigns` row.
pub(super) fn campaign_from_row(row: &Row) -> Result<Campaign> {
    Ok(Campaign {
        id: row.get("id")?,
        name: row.get("name")?,
        root_path: row.get("root_path")?,
        created_at: stamp(row, "campaigns", "created_at")?,
    })
}
