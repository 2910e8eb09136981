//! The schema, as an ordered list of migrations.
//!
//! `MIGRATIONS[i]` takes the database from version `i` to version `i + 1`. Each one runs in its
//! own transaction together with the `schema_version` row that records it, so a migration is
//! either entirely applied or not at all. Migrations are history: never edit one that has
//! shipped, append a new one.

use rusqlite::{params, Connection, TransactionBehavior};

use super::{Result, StoreError};

/// Every migration this binary knows, oldest first.
pub(super) const MIGRATIONS: &[&str] = &[
    V1,
    super::tasks::V2,
    V3,
    V4,
    super::approvals::V5,
    V6,
    super::tasks::V7,
    V8,
    V9,
    V10,
    V11,
    V12,
    V13,
    super::approvals::V14,
    super::tasks::V15,
    V16,
    V17,
];

/// Version 17: an activity is keyed by one integer, its session's key (a number
/// `session_keys` gives each session that has activities) in the high bits and its seq in the
/// low [`super::SEQ_BITS`], instead of by `(session_id, seq)`. A rowid table with a key of two
/// columns is two B-trees (the rows, and the key's index with the session's id again in every
/// entry): an insert was two B-tree inserts and a comparison of 26-byte ids down the index.
/// Keyed by the rowid itself, an activity is one insert into one B-tree, a session's
/// activities are one range of it, and the WAL takes less than half the bytes an activity
/// (performance review, P2). The rows are copied in key order.
const V17: &str = r#"
CREATE TABLE session_keys (
    key        INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT    NOT NULL UNIQUE
) STRICT;
INSERT INTO session_keys (session_id)
    SELECT session_id FROM agent_activities GROUP BY session_id ORDER BY MIN(rowid);
CREATE TABLE agent_activities_v17 (
    key                      INTEGER PRIMARY KEY,
    turn                     INTEGER,
    ends_turn                INTEGER NOT NULL,
    type                     INTEGER NOT NULL,
    content                  TEXT    NOT NULL,
    tool_name                TEXT    NOT NULL,
    tool_call_id             TEXT    NOT NULL,
    tool_success             INTEGER NOT NULL,
    tokens_input             INTEGER NOT NULL,
    tokens_output            INTEGER NOT NULL,
    at                       INTEGER NOT NULL,
    session_cursor           INTEGER,
    session_tokens_input     INTEGER,
    session_tokens_output    INTEGER,
    session_last_activity_at INTEGER
) STRICT;
INSERT INTO agent_activities_v17
    SELECT (k.key << 32) | a.seq, a.turn, a.ends_turn, a.type, a.content, a.tool_name,
           a.tool_call_id, a.tool_success, a.tokens_input, a.tokens_output, a.at,
           a.session_cursor, a.session_tokens_input, a.session_tokens_output,
           a.session_last_activity_at
      FROM agent_activities AS a JOIN session_keys AS k USING (session_id)
     ORDER BY k.key, a.seq;
DROP TABLE agent_activities;
ALTER TABLE agent_activities_v17 RENAME TO agent_activities;
"#;

/// Version 16: an activity row may carry its session's progress as of it (the output cursor,
/// the token totals, the last activity's time), so that an event's activity is all a working
/// session's event writes, not its session's row too (`CARRIED_COLUMNS` in `lib.rs`). NULL
/// in the rows written before, and in those that carry nothing.
const V16: &str = r#"
ALTER TABLE agent_activities ADD COLUMN session_cursor INTEGER;
ALTER TABLE agent_activities ADD COLUMN session_tokens_input INTEGER;
ALTER TABLE agent_activities ADD COLUMN session_tokens_output INTEGER;
ALTER TABLE agent_activities ADD COLUMN session_last_activity_at INTEGER;
"#;

/// Version 13: start-up reads the sessions it must decide on from an index of the rows that
/// have not ended or still name a process or a run (`ACTIVE_ROW` in `lib.rs`, the same
/// expression with Stopped = 6 and Failed = 7), instead of reading every stored session. The
/// index on the status goes: no query used it, and each event's update of its session kept it.
const V13: &str = r#"
DROP INDEX agent_sessions_by_status;
CREATE INDEX agent_sessions_active ON agent_sessions (id)
 WHERE status NOT IN (6, 7) OR pid IS NOT NULL OR run_id IS NOT NULL;
"#;

/// Version 12: whether its client closed a session (sunbeam's EndSession): such a session is
/// never resumed. Until now that was a campaign event (`sunbeam.session_ended`, payload
/// `{"session_id": …}`) read back at every StartSession; the sessions those events name are
/// marked, and the events stay as they were reported.
const V12: &str = r#"
ALTER TABLE agent_sessions ADD COLUMN closed_by_client INTEGER NOT NULL DEFAULT 0;
UPDATE agent_sessions SET closed_by_client = 1
 WHERE id IN (SELECT json_extract(payload_json, '$.session_id') FROM reported_events
               WHERE event_type = 'sunbeam.session_ended' AND json_valid(payload_json));
"#;

/// Version 11: the kubernetes driver's pod (latis' `kubernetes:` block, as JSON: namespace,
/// service account, the pod spec's JSON text, kubeconfig and context; no credential: those stay
/// in the kubeconfig).
const V11: &str = r#"
ALTER TABLE agent_sessions ADD COLUMN env_kubernetes TEXT NOT NULL DEFAULT '{}';
"#;

/// Version 10: the ssh driver's machine (latis' `ssh:` block, as JSON; it holds no secret: a
/// key is named by its file, never stored), and whether the connection to it is down; the qemu
/// driver's VM (cpus and flags, as JSON).
const V10: &str = r#"
ALTER TABLE agent_sessions ADD COLUMN env_ssh TEXT NOT NULL DEFAULT '{}';
ALTER TABLE agent_sessions ADD COLUMN disconnected INTEGER NOT NULL DEFAULT 0;
ALTER TABLE agent_sessions ADD COLUMN env_qemu TEXT NOT NULL DEFAULT '{}';
"#;

/// Version 9: a container's image, the environment's memory and process limits, and the seed's
/// `podman:` block (mounts, ports and flags as JSON; its variables sealed like the session's);
/// Aria's containers, and the container and parent of a task.
const V9: &str = r#"
ALTER TABLE agent_sessions ADD COLUMN env_image TEXT NOT NULL DEFAULT '';
ALTER TABLE agent_sessions ADD COLUMN env_memory INTEGER NOT NULL DEFAULT 0;
ALTER TABLE agent_sessions ADD COLUMN env_pids INTEGER NOT NULL DEFAULT 0;
ALTER TABLE agent_sessions ADD COLUMN env_podman TEXT NOT NULL DEFAULT '{}';
ALTER TABLE agent_sessions ADD COLUMN env_podman_env TEXT NOT NULL DEFAULT '{}';
ALTER TABLE tasks ADD COLUMN container_id TEXT NOT NULL DEFAULT '';
ALTER TABLE tasks ADD COLUMN parent_task_id TEXT NOT NULL DEFAULT '';
CREATE TABLE containers (
    id          TEXT    NOT NULL PRIMARY KEY,
    name        TEXT    NOT NULL,
    image       TEXT    NOT NULL,
    driver      TEXT    NOT NULL,
    network     INTEGER NOT NULL,
    environment TEXT    NOT NULL,
    persistent  INTEGER NOT NULL,
    session_id  TEXT,
    user_id     TEXT    NOT NULL,
    working_dir TEXT    NOT NULL,
    state       INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    error       TEXT
) STRICT;
"#;

/// Version 8: where a session's agent runs (its environment's driver and options, fixed at
/// create) and where that environment is in its life (`EnvState::number`). Sessions stored
/// before it ran on the host, in an environment that needed nothing made.
const V8: &str = r#"
ALTER TABLE agent_sessions ADD COLUMN env_driver TEXT NOT NULL DEFAULT 'local';
ALTER TABLE agent_sessions ADD COLUMN env_worktree INTEGER NOT NULL DEFAULT 0;
ALTER TABLE agent_sessions ADD COLUMN env_network INTEGER NOT NULL DEFAULT 0;
ALTER TABLE agent_sessions ADD COLUMN env_state INTEGER NOT NULL DEFAULT 1;
"#;

/// Version 6: whether a session's last turn failed (so that a live session whose task failed
/// is not shown as complete).
const V6: &str = r#"
ALTER TABLE agent_sessions ADD COLUMN last_turn_failed INTEGER NOT NULL DEFAULT 0;
"#;

/// Version 4: provider output lines the adapter did not understand, kept raw (the newest
/// [`super::UNRECOGNIZED_KEPT`] per session; `seq` counts them all).
const V4: &str = r#"
CREATE TABLE provider_unrecognized (
    session_id TEXT    NOT NULL,
    seq        INTEGER NOT NULL,
    run        INTEGER NOT NULL,
    at         INTEGER NOT NULL,
    line       TEXT    NOT NULL,
    PRIMARY KEY (session_id, seq)
) STRICT;
"#;

/// Version 3: what a restarted daemon needs to adopt a provider process that outlived it (its
/// run id and how far into its output the session got), and whether a turn is open.
const V3: &str = r#"
ALTER TABLE agent_sessions ADD COLUMN turn_open INTEGER NOT NULL DEFAULT 0;
ALTER TABLE agent_sessions ADD COLUMN run_id INTEGER;
ALTER TABLE agent_sessions ADD COLUMN provider_cursor INTEGER NOT NULL DEFAULT 0;
"#;

/// Version 1: the initial schema.
///
/// No foreign keys between the session tables: the daemon writes a session's rows in the
/// order its engine produced them, and activities must never be refused because of that
/// order (or because a session was deleted while an external process still reports on it).
/// Tables are `STRICT`, so a value of the wrong type is an error rather than silently kept.
const V1: &str = r#"
CREATE TABLE campaigns (
    id         TEXT    NOT NULL PRIMARY KEY,
    name       TEXT    NOT NULL UNIQUE,
    root_path  TEXT    NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;

CREATE TABLE agent_sessions (
    id                TEXT    NOT NULL PRIMARY KEY,
    campaign_id       TEXT    NOT NULL,
    provider          INTEGER NOT NULL,
    model             TEXT    NOT NULL,
    agent_name        TEXT    NOT NULL,
    status            INTEGER NOT NULL,
    festival_id       TEXT    NOT NULL,
    task_id           TEXT    NOT NULL,
    tokens_input      INTEGER NOT NULL,
    tokens_output     INTEGER NOT NULL,
    max_tokens        INTEGER NOT NULL,
    pid               INTEGER,
    restart_count     INTEGER NOT NULL,
    created_at        INTEGER NOT NULL,
    started_at        INTEGER,
    last_activity_at  INTEGER,
    ended_at          INTEGER,
    error_code        TEXT,
    error_message     TEXT,
    working_dir       TEXT    NOT NULL,
    provider_config   TEXT    NOT NULL DEFAULT '{}',
    environment       TEXT    NOT NULL DEFAULT '{}',
    timeout_ms        INTEGER NOT NULL,
    initial_message   TEXT    NOT NULL,
    provider_session  TEXT,
    last_activity_seq INTEGER NOT NULL,
    last_status_seq   INTEGER NOT NULL,
    turns             INTEGER NOT NULL
) STRICT;
CREATE INDEX agent_sessions_by_campaign ON agent_sessions (campaign_id);
CREATE INDEX agent_sessions_by_status ON agent_sessions (status);

CREATE TABLE agent_activities (
    session_id    TEXT    NOT NULL,
    seq           INTEGER NOT NULL,
    turn          INTEGER,
    ends_turn     INTEGER NOT NULL,
    type          INTEGER NOT NULL,
    content       TEXT    NOT NULL,
    tool_name     TEXT    NOT NULL,
    tool_call_id  TEXT    NOT NULL,
    tool_success  INTEGER NOT NULL,
    tokens_input  INTEGER NOT NULL,
    tokens_output INTEGER NOT NULL,
    at            INTEGER NOT NULL,
    PRIMARY KEY (session_id, seq)
) STRICT;

CREATE TABLE session_status_events (
    session_id      TEXT    NOT NULL,
    seq             INTEGER NOT NULL,
    previous_status INTEGER,
    new_status      INTEGER NOT NULL,
    message         TEXT    NOT NULL,
    at              INTEGER NOT NULL,
    PRIMARY KEY (session_id, seq)
) STRICT;

CREATE TABLE session_messages (
    session_id TEXT    NOT NULL,
    turn       INTEGER NOT NULL,
    role       TEXT    NOT NULL,
    content    TEXT    NOT NULL,
    at         INTEGER NOT NULL,
    PRIMARY KEY (session_id, turn, role)
) STRICT;

CREATE TABLE reported_events (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    kind         TEXT    NOT NULL CHECK (kind IN ('campaign', 'festival')),
    campaign_id  TEXT    NOT NULL,
    festival_id  TEXT    NOT NULL,
    event_type   TEXT    NOT NULL,
    payload_json TEXT    NOT NULL,
    at           INTEGER NOT NULL,
    received_at  INTEGER NOT NULL
) STRICT;
CREATE INDEX reported_events_by_campaign ON reported_events (campaign_id, id);

CREATE TABLE external_activities (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id    TEXT    NOT NULL,
    campaign_id   TEXT    NOT NULL,
    agent_name    TEXT    NOT NULL,
    type          INTEGER NOT NULL,
    content       TEXT    NOT NULL,
    tool_name     TEXT    NOT NULL,
    tool_call_id  TEXT    NOT NULL,
    tool_success  INTEGER NOT NULL,
    tokens_input  INTEGER NOT NULL,
    tokens_output INTEGER NOT NULL,
    at            INTEGER NOT NULL
) STRICT;
CREATE INDEX external_activities_by_session ON external_activities (session_id, id);
"#;

/// Brings the database up to `migrations.len()`, applying only the migrations it lacks, each
/// in its own transaction. Refuses ([`StoreError::TooNew`]) a database written by a newer
/// binary. Returns the resulting version.
pub(super) fn migrate(conn: &mut Connection, migrations: &[&str], now: u64) -> Result<i64> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_version (
             version    INTEGER NOT NULL PRIMARY KEY,
             applied_at INTEGER NOT NULL
         ) STRICT",
    )?;
    let known = i64::try_from(migrations.len()).unwrap_or(i64::MAX);
    // A database already at this version is only read: a start needs no write lock (another
    // program holding one, a `sqlite3` shell in a transaction, is waited out by the daemon's
    // first commit instead of failing the start).
    let up_to_date = |current: i64| match current {
        found if found > known => Err(StoreError::TooNew { found, known }),
        current => Ok(current == known),
    };
    if up_to_date(current_version(conn)?)? {
        return Ok(known);
    }
    loop {
        // IMMEDIATE: two processes opening the same file at once cannot both apply a step.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let current = current_version(&tx)?;
        if up_to_date(current)? {
            tx.commit()?;
            return Ok(current);
        }
        let index = usize::try_from(current)
            .map_err(|_| StoreError::Corrupt(format!("schema_version {current} is negative")))?;
        tx.execute_batch(migrations[index])?;
        tx.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES (?1, ?2)",
            params![current + 1, super::codec::int(now)],
        )?;
        tx.commit()?;
    }
}

/// The highest version recorded (0 for a new database).
pub(super) fn current_version(conn: &Connection) -> Result<i64> {
    Ok(conn.query_row(
        "SELECT COALESCE(MAX(version), 0) FROM schema_version",
        [],
        |row| row.get(0),
    )?)
}
