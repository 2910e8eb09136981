//! Core values to SQLite columns and back.
//!
//! SQLite integers are `i64`; the core's counters and times are `u64`. Writing saturates at
//! `i64::MAX` (a ms timestamp, token count or sequence number never gets there, and one absurd
//! value must not fail a whole batch); reading refuses a negative or out-of-range value as
//! [`StoreError::Corrupt`], as it refuses an unknown enum number or malformed JSON.

use std::collections::BTreeMap;

use paddock_core::{
    Activity, ActivityEvent, ActivityKind, Driver, EnvSpec, EnvState, Error, ErrorCode, Provider,
    SessionConfig, SessionId, SessionRecord, Status, StatusEvent, UserMessage,
};
use rusqlite::Row;

use super::{Campaign, Result, StoreError};

/// The columns of `agent_sessions`, in the order `SELECT`s list them; the upsert is built
/// from this list so that it sets every column.
pub(super) const SESSION_COLUMNS: [&str; 36] = [
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

fn uint(row: &Row, table: &str, col: &str) -> Result<u64> {
    let v: i64 = row.get(col)?;
    u64::try_from(v).map_err(|_| corrupt(table, col, format!("negative value {v}")))
}

fn opt_uint(row: &Row, table: &str, col: &str) -> Result<Option<u64>> {
    let v: Option<i64> = row.get(col)?;
    v.map(|v| u64::try_from(v).map_err(|_| corrupt(table, col, format!("negative value {v}"))))
        .transpose()
}

/// A recorded time (ms since the epoch).
pub(super) fn stamp(row: &Row, table: &str, col: &str) -> Result<paddock_core::Timestamp> {
    uint(row, table, col).map(paddock_core::Timestamp::from_millis)
}

pub(super) fn opt_stamp(
    row: &Row,
    table: &str,
    col: &str,
) -> Result<Option<paddock_core::Timestamp>> {
    Ok(opt_uint(row, table, col)?.map(paddock_core::Timestamp::from_millis))
}

fn u32_col(row: &Row, table: &str, col: &str) -> Result<u32> {
    let v: i64 = row.get(col)?;
    u32::try_from(v).map_err(|_| corrupt(table, col, format!("value {v} out of range")))
}

fn i32_col(row: &Row, table: &str, col: &str) -> Result<i32> {
    let v: i64 = row.get(col)?;
    i32::try_from(v).map_err(|_| corrupt(table, col, format!("value {v} out of range")))
}

fn status(row: &Row, table: &str, col: &str) -> Result<Status> {
    let n = i32_col(row, table, col)?;
    Status::from_number(n).ok_or_else(|| corrupt(table, col, format!("unknown status {n}")))
}

fn opt_status(row: &Row, table: &str, col: &str) -> Result<Option<Status>> {
    let v: Option<i64> = row.get(col)?;
    match v {
        None => Ok(None),
        Some(_) => status(row, table, col).map(Some),
    }
}

fn provider(row: &Row, table: &str, col: &str) -> Result<Provider> {
    let n = i32_col(row, table, col)?;
    Provider::from_number(n).ok_or_else(|| corrupt(table, col, format!("unknown provider {n}")))
}

fn activity_kind(row: &Row, table: &str, col: &str) -> Result<ActivityKind> {
    let n = i32_col(row, table, col)?;
    ActivityKind::from_number(n)
        .ok_or_else(|| corrupt(table, col, format!("unknown activity type {n}")))
}

/// A string map as the JSON object stored in `provider_config` / `environment`.
pub(super) fn map_to_json(map: &BTreeMap<String, String>) -> Result<String> {
    serde_json::to_string(map).map_err(|e| StoreError::Corrupt(format!("encoding a map: {e}")))
}

fn map_from_json(row: &Row, table: &str, col: &str) -> Result<BTreeMap<String, String>> {
    let text: String = row.get(col)?;
    serde_json::from_str(&text).map_err(|e| corrupt(table, col, format!("bad JSON object: {e}")))
}

/// Decodes one row selected with [`SESSION_COLUMNS`].
pub(super) fn session_from_row(row: &Row) -> Result<SessionRecord> {
    let id: String = row.get("id")?;
    // Name the session in every decoding error: one bad row must be findable.
    decode_session(row, &id).map_err(|e| match e {
        StoreError::Corrupt(m) => StoreError::Corrupt(format!("{m} (session {id})")),
        other => other,
    })
}

fn decode_session(row: &Row, id: &str) -> Result<SessionRecord> {
    const T: &str = "agent_sessions";
    let config = SessionConfig {
        campaign_id: row.get("campaign_id")?,
        provider: provider(row, T, "provider")?,
        model: row.get("model")?,
        agent_name: row.get("agent_name")?,
        festival_id: row.get("festival_id")?,
        task_id: row.get("task_id")?,
        provider_config: map_from_json(row, T, "provider_config")?,
        environment: map_from_json(row, T, "environment")?,
        max_tokens: uint(row, T, "max_tokens")?,
        timeout_ms: uint(row, T, "timeout_ms")?,
        initial_message: row.get("initial_message")?,
        working_dir: row.get("working_dir")?,
        env: EnvSpec {
            driver: {
                let name: String = row.get("env_driver")?;
                Driver::parse(&name)
                    .ok_or_else(|| corrupt(T, "env_driver", format!("unknown driver {name:?}")))?
            },
            worktree: row.get("env_worktree")?,
            network: row.get("env_network")?,
        },
    };
    let pid = match row.get::<_, Option<i64>>("pid")? {
        None => None,
        Some(p) => Some(
            u32::try_from(p).map_err(|_| corrupt(T, "pid", format!("value {p} out of range")))?,
        ),
    };
    // The code decides whether there is an error; a missing message reads as empty.
    let error = match row.get::<_, Option<String>>("error_code")? {
        None => None,
        Some(code) => {
            let parsed = ErrorCode::parse(&code)
                .ok_or_else(|| corrupt(T, "error_code", format!("unknown code {code:?}")))?;
            let message: Option<String> = row.get("error_message")?;
            Some(Error::new(parsed, message.unwrap_or_default()))
        }
    };
    Ok(SessionRecord {
        id: SessionId(id.to_string()),
        config,
        status: status(row, T, "status")?,
        tokens_input: uint(row, T, "tokens_input")?,
        tokens_output: uint(row, T, "tokens_output")?,
        pid,
        restart_count: u32_col(row, T, "restart_count")?,
        created_at: stamp(row, T, "created_at")?,
        started_at: opt_stamp(row, T, "started_at")?,
        last_activity_at: opt_stamp(row, T, "last_activity_at")?,
        ended_at: opt_stamp(row, T, "ended_at")?,
        error,
        provider_session: row.get("provider_session")?,
        last_activity_seq: uint(row, T, "last_activity_seq")?,
        last_status_seq: uint(row, T, "last_status_seq")?,
        turns: uint(row, T, "turns")?,
        turn_open: row.get("turn_open")?,
        run: opt_uint(row, T, "run_id")?,
        provider_cursor: uint(row, T, "provider_cursor")?,
        last_turn_failed: row.get("last_turn_failed")?,
        env_state: {
            let n: i64 = row.get("env_state")?;
            EnvState::from_number(n)
                .ok_or_else(|| corrupt(T, "env_state", format!("unknown state {n}")))?
        },
    })
}

/// Decodes one `agent_activities` row (selected with every column but `session_id`).
pub(super) fn activity_from_row(session: &str, row: &Row) -> Result<ActivityEvent> {
    const T: &str = "agent_activities";
    Ok(ActivityEvent {
        session: SessionId(session.to_string()),
        seq: uint(row, T, "seq")?,
        turn: opt_uint(row, T, "turn")?,
        ends_turn: row.get("ends_turn")?,
        activity: Activity {
            kind: Some(activity_kind(row, T, "type")?),
            content: row.get("content")?,
            tool_name: row.get("tool_name")?,
            tool_call_id: row.get("tool_call_id")?,
            tool_success: row.get("tool_success")?,
            tokens_input: uint(row, T, "tokens_input")?,
            tokens_output: uint(row, T, "tokens_output")?,
        },
        at: stamp(row, T, "at")?,
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
