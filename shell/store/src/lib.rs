//! paddock's SQLite store: sessions, their activities / status events / user messages,
//! campaigns, and what external processes report (campaign and festival events, activity).
//!
//! One [`Store`] owns one `rusqlite::Connection` (it is `Send`, not `Sync`: give it to one
//! thread or put it behind a mutex). The daemon's hot path is [`Store::apply`]: the `Persist`
//! records of one or more engine steps, written in one transaction with cached statements.
//!
//! The file is opened in WAL mode with `synchronous=NORMAL`, `foreign_keys=ON` and a busy
//! timeout, made with 1 KiB pages ([`PAGE_SIZE`]), and brought up to the current schema by
//! versioned migrations (`migrations.rs`);
//! a database written by a newer paddock is refused ([`StoreError::TooNew`]).

mod activities;
pub mod approvals;
mod codec;
mod migrations;
pub mod seal;
pub mod tasks;
#[cfg(test)]
mod tests;

use std::fmt;
use std::path::Path;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use paddock_core::{
    ActivityEvent, Record, SessionConfig, SessionId, SessionRecord, StatusEvent, UserMessage,
};
use rusqlite::{named_params, params, Connection, OptionalExtension, Rows, TransactionBehavior};

use codec::{int, map_to_json, time, ACTIVITY_COLUMNS, SESSION_COLUMNS};

/// How long a statement waits for another connection's lock before failing with `SQLITE_BUSY`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The page size of a database paddock makes (why: the comment where `init` sets it).
pub const PAGE_SIZE: u32 = 1024;
/// Prepared statements kept per connection (the `apply` path uses four; the readers a dozen).
const STATEMENT_CACHE: usize = 64;

pub use paddock_core::campaign::Campaign;

/// A campaign or festival event an external process reported (obey `Report*Event`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportedEvent {
    /// `"campaign"` or `"festival"` (a CHECK constraint refuses anything else).
    pub kind: &'static str,
    pub campaign_id: String,
    pub festival_id: String,
    pub event_type: String,
    pub payload_json: String,
    pub at: u64,
    pub received_at: u64,
}

/// A row the shell (not the core) writes: committed in the same transaction as the batch's
/// core records ([`Store::apply_all`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Row {
    Event(ReportedEvent),
    External(Vec<ExternalActivity>),
    Unrecognized(UnrecognizedLine),
}

/// One activity pushed by an external process (obey `StreamAgentActivity`), kept verbatim:
/// `kind` is the wire `ActivityType` number, not checked against the core's enum.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ExternalActivity {
    pub session_id: String,
    pub campaign_id: String,
    pub agent_name: String,
    pub kind: i32,
    pub content: String,
    pub tool_name: String,
    pub tool_call_id: String,
    pub tool_success: bool,
    pub tokens_input: i64,
    pub tokens_output: i64,
    pub at: u64,
}

/// A store failure.
#[derive(Debug)]
pub enum StoreError {
    /// SQLite refused or failed (I/O, lock timeout, constraint, …).
    Sqlite(rusqlite::Error),
    /// The database's schema version is newer than this binary's.
    TooNew { found: i64, known: i64 },
    /// A stored value cannot be decoded (unknown enum number, bad JSON, negative counter…).
    Corrupt(String),
    /// A value is beyond what the store's format can hold: an activity's number past
    /// 4,294,967,295, a session's key past 2,147,483,647 (migration 17).
    Limit(String),
}

pub type Result<T> = std::result::Result<T, StoreError>;

impl StoreError {
    /// The disk is full (or failing to write): the same write can succeed once space is back,
    /// and nothing of the failed transaction was stored.
    pub fn is_out_of_space(&self) -> bool {
        use rusqlite::ErrorCode as C;
        matches!(self.sqlite_code(), Some(C::DiskFull | C::SystemIoFailure))
    }

    /// Another connection held a lock the write needed for longer than the writer waits
    /// ([`Store::set_lock_wait`]): another program writing to the database (a `sqlite3` shell
    /// in a transaction, a VACUUM, a backup). Nothing of the failed transaction was stored, and
    /// the same write can succeed once it lets go.
    pub fn is_locked(&self) -> bool {
        use rusqlite::ErrorCode as C;
        matches!(
            self.sqlite_code(),
            Some(C::DatabaseBusy | C::DatabaseLocked)
        )
    }

    /// SQLite's primary result code, when SQLite failed.
    fn sqlite_code(&self) -> Option<rusqlite::ErrorCode> {
        match self {
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(e, _)) => Some(e.code),
            _ => None,
        }
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Sqlite(e) => write!(f, "database error: {e}"),
            StoreError::TooNew { found, known } => write!(
                f,
                "database schema version {found} is newer than this paddock supports \
                 (version {known}): it was written by a newer paddock; upgrade paddock \
                 or use another database file"
            ),
            StoreError::Corrupt(what) => write!(f, "corrupt database: {what}"),
            StoreError::Limit(what) => write!(f, "beyond what the database can hold: {what}"),
        }
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Sqlite(e) => Some(e),
            _ => None,
        }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Sqlite(e)
    }
}

/// A provider output line its adapter did not understand: kept raw, so a format change in a
/// new CLI version can be seen and handled, never fatal to the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnrecognizedLine {
    pub session_id: String,
    pub run: u64,
    pub at_ms: i64,
    pub line: String,
}

/// Unrecognized lines kept per session (the newest; the count covers all of them).
pub const UNRECOGNIZED_KEPT: i64 = 1000;
/// An unrecognized line is kept up to this many bytes.
pub const UNRECOGNIZED_LINE_MAX: usize = 16 * 1024;

fn insert_unrecognized(tx: &rusqlite::Transaction<'_>, l: &UnrecognizedLine) -> Result<()> {
    let line = paddock_support::text::prefix(&l.line, UNRECOGNIZED_LINE_MAX);
    // Prepared once: an agent that prints what its parser does not read prints a lot of it.
    let seq: i64 = tx
        .prepare_cached(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM provider_unrecognized WHERE session_id = ?1",
        )?
        .query_row([&l.session_id], |r| r.get(0))?;
    tx.prepare_cached(
        "INSERT INTO provider_unrecognized (session_id, seq, run, at, line) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(rusqlite::params![l.session_id, seq, l.run as i64, l.at_ms, line])?;
    tx.prepare_cached("DELETE FROM provider_unrecognized WHERE session_id = ?1 AND seq <= ?2")?
        .execute(rusqlite::params![l.session_id, seq - UNRECOGNIZED_KEPT])?;
    Ok(())
}

/// The session upsert, built from [`SESSION_COLUMNS`] so that it sets every column.
static UPSERT_SESSION: LazyLock<String> = LazyLock::new(|| {
    let values: Vec<String> = SESSION_COLUMNS.iter().map(|c| format!(":{c}")).collect();
    let set: Vec<String> = SESSION_COLUMNS[1..]
        .iter()
        .map(|c| format!("{c} = excluded.{c}"))
        .collect();
    format!(
        "INSERT INTO agent_sessions ({}) VALUES ({}) ON CONFLICT (id) DO UPDATE SET {}",
        SESSION_COLUMNS.join(", "),
        values.join(", "),
        set.join(", ")
    )
});

/// The columns of a session that change as it works (everything but its id and its
/// configuration), in the order [`UPDATE_SESSION_STATE`] binds them.
const SESSION_STATE_COLUMNS: [&str; 22] = [
    "status",
    "tokens_input",
    "tokens_output",
    "pid",
    "restart_count",
    "created_at",
    "started_at",
    "last_activity_at",
    "ended_at",
    "error_code",
    "error_message",
    "provider_session",
    "last_activity_seq",
    "last_status_seq",
    "turns",
    "turn_open",
    "run_id",
    "provider_cursor",
    "last_turn_failed",
    "env_state",
    "disconnected",
    "closed_by_client",
];

/// A session whose configuration is stored as it is: only its state is written (`?1` is the
/// id, then [`SESSION_STATE_COLUMNS`]).
static UPDATE_SESSION_STATE: LazyLock<String> = LazyLock::new(|| update_state(&[]));

/// The columns the partial index `agent_sessions_active` reads ([`ACTIVE_ROW`]).
const ACTIVE_ROW_COLUMNS: [&str; 3] = ["status", "pid", "run_id"];

/// [`UPDATE_SESSION_STATE`] for a session whose [`ACTIVE_ROW_COLUMNS`] are stored as they are:
/// it leaves them out, and with them the index. SQLite rewrites the entry of every partial
/// index whose columns an UPDATE sets, equal or not (a delete and an insert: two seeks and a
/// page more in every commit for each working session). The same parameters bind: those left
/// out are numbered and not read.
static UPDATE_SESSION_WORK: LazyLock<String> = LazyLock::new(|| update_state(&ACTIVE_ROW_COLUMNS));

/// `UPDATE agent_sessions SET` every column of [`SESSION_STATE_COLUMNS`] but `skip`, each as
/// `?{its place + 2}`.
fn update_state(skip: &[&str]) -> String {
    let set: Vec<String> = SESSION_STATE_COLUMNS
        .iter()
        .enumerate()
        .filter(|(_, c)| !skip.contains(c))
        .map(|(i, c)| format!("{c} = ?{}", i + 2))
        .collect();
    format!("UPDATE agent_sessions SET {} WHERE id = ?1", set.join(", "))
}

static SELECT_SESSIONS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {} FROM agent_sessions ORDER BY id",
        SESSION_COLUMNS.join(", ")
    )
});

/// A session row that has not ended, or still names a process or a run: the rows the partial
/// index `agent_sessions_active` holds. Migration 13 wrote the same expression, and SQLite uses
/// a partial index only for a WHERE that repeats its own
/// (`tests::start_up_reads_the_unsettled_from_their_index` checks that it does).
static ACTIVE_ROW: LazyLock<String> = LazyLock::new(|| {
    format!(
        "status NOT IN ({stopped}, {failed}) OR pid IS NOT NULL OR run_id IS NOT NULL",
        stopped = paddock_core::Status::Stopped.number(),
        failed = paddock_core::Status::Failed.number(),
    )
});

/// The ids of the sessions that are not [settled](SessionRecord::is_settled): an active row
/// ([`ACTIVE_ROW`]), or one holding an open request (state 1). What start-up restores, read
/// from two indexes: 10,000 ended sessions cost it nothing.
static UNSETTLED_IDS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT id FROM agent_sessions WHERE {} \
         UNION SELECT session_id FROM approvals WHERE state = 1",
        *ACTIVE_ROW
    )
});

/// [`Store::unrecognized_counts`]: only of the sessions [`UNSETTLED_IDS`] names, through
/// `provider_unrecognized`'s key.
static UNSETTLED_UNRECOGNIZED_COUNTS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT session_id, MAX(seq) FROM provider_unrecognized \
         WHERE session_id IN ({}) GROUP BY session_id",
        *UNSETTLED_IDS
    )
});

static SELECT_UNSETTLED_SESSIONS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {} FROM agent_sessions WHERE id IN ({}) ORDER BY id",
        SESSION_COLUMNS.join(", "),
        *UNSETTLED_IDS
    )
});

/// A page of sessions newest first (ids are ULIDs: creation order), before an id (`''`: from
/// the newest), optionally of one campaign or working dir.
/// [`Store::user_messages`]: `?1` the session, `?2` the role, `?3` the first turn (a range of
/// the key `(session_id, turn, role)`).
const SELECT_USER_MESSAGES: &str = "SELECT turn, content, at FROM session_messages \
     WHERE session_id = ?1 AND turn >= ?3 AND role = ?2 ORDER BY turn";

/// Their ids only: the rows themselves are read one by one, those [`Store`] holds
/// ([`SettledRows`]) not at all. Without a campaign or directory asked for, this reads only
/// the primary key's index.
const SELECT_SESSION_IDS_BEFORE: &str = "SELECT id FROM agent_sessions \
     WHERE (?1 = '' OR id < ?1) \
     AND (?2 IS NULL OR campaign_id = ?2) AND (?3 IS NULL OR working_dir = ?3) \
     ORDER BY id DESC LIMIT ?4";

/// One session with the count of its unrecognized lines after [`SESSION_COLUMNS`] (one seek
/// in `provider_unrecognized`'s key).
static SELECT_SESSION_COUNTED: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {}, ({UNRECOGNIZED_COUNT_OF} ?1) FROM agent_sessions WHERE id = ?1",
        SESSION_COLUMNS.join(", ")
    )
});

/// How many unrecognized lines the session whose id follows has had (`seq` counts them all;
/// the table keeps the newest [`UNRECOGNIZED_KEPT`]).
const UNRECOGNIZED_COUNT_OF: &str =
    "SELECT COALESCE(MAX(seq), 0) FROM provider_unrecognized WHERE session_id =";

/// The sessions working in `?1`, newest first by the order of
/// [`paddock_core::session_to_resume`] (creation, then id).
static SELECT_SESSIONS_NEWEST_IN: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {} FROM agent_sessions WHERE working_dir = ?1 ORDER BY created_at DESC, id DESC",
        SESSION_COLUMNS.join(", ")
    )
});

static SELECT_SESSION: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {} FROM agent_sessions WHERE id = ?1",
        SESSION_COLUMNS.join(", ")
    )
});

/// An activity's row is keyed by one integer (migration 17): its session's key (its row in
/// `session_keys`) in the high bits, its seq in the low `SEQ_BITS`. A session's activities are
/// one range of the table's B-tree, in seq order.
pub(crate) const SEQ_BITS: u32 = 32;
/// The largest activity number a session can hold (4,294,967,295).
pub(crate) const SEQ_MAX: u64 = (1 << SEQ_BITS) - 1;
/// The largest session key (2,147,483,647 sessions with activities, over the file's life:
/// keys are never reused).
pub(crate) const SESSION_KEY_MAX: i64 = (1 << (63 - SEQ_BITS)) - 1;

/// The key of activity `seq` of the session whose key is `session`.
fn activity_key(session: i64, seq: u64) -> Result<i64> {
    if seq > SEQ_MAX {
        return Err(StoreError::Limit(format!(
            "activity {seq} of one session: a session holds at most {SEQ_MAX}"
        )));
    }
    Ok((session << SEQ_BITS) | seq as i64)
}

/// The seq of the activity whose key is `key`.
pub(crate) fn activity_seq(key: i64) -> u64 {
    key as u64 & SEQ_MAX
}

/// `WHERE` terms for the activities of session `?1` after seq `?2` (`>= ?2` with `op` `>=`): a
/// range of the table's key, empty when the session has no key (it has no activities).
fn activities_of(op: &str) -> String {
    format!(
        "key {op} (SELECT (key << {SEQ_BITS}) + ?2 FROM session_keys WHERE session_id = ?1) \
         AND key < (SELECT (key + 1) << {SEQ_BITS} FROM session_keys WHERE session_id = ?1)"
    )
}

/// `WHERE` terms for the activities of session `?1` after seq `?2`.
static ACTIVITIES_OF_AFTER: LazyLock<String> = LazyLock::new(|| activities_of(">"));

static SELECT_ACTIVITIES_AFTER: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {} FROM agent_activities WHERE {} ORDER BY key LIMIT ?3",
        ACTIVITY_COLUMNS.join(", "),
        *ACTIVITIES_OF_AFTER
    )
});

/// The newest `?3` activities of session `?1` (from seq `?2` = 0).
static SELECT_LAST_ACTIVITIES: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT {} FROM agent_activities WHERE {} ORDER BY key DESC LIMIT ?3",
        ACTIVITY_COLUMNS.join(", "),
        activities_of(">=")
    )
});

/// The turn and tokens of every activity of session `?1` (from seq `?2` = 0), newest first.
static SELECT_TURN_TOKENS: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT turn, tokens_input, tokens_output FROM agent_activities WHERE {} \
         ORDER BY key DESC",
        activities_of(">=")
    )
});

/// Every activity of session `?1` (from seq `?2` = 0).
static DELETE_ACTIVITIES: LazyLock<String> =
    LazyLock::new(|| format!("DELETE FROM agent_activities WHERE {}", activities_of(">=")));

const SELECT_SESSION_KEY: &str = "SELECT key FROM session_keys WHERE session_id = ?1";
const INSERT_SESSION_KEY: &str = "INSERT INTO session_keys (session_id) VALUES (?1)";

/// The columns of an activity row that may carry its session's progress as of it (migration
/// 16; NULL when they do not): the output cursor, the token totals and the last activity's
/// time; the row's seq is the session's last activity number ([`Store::apply_all`]).
pub(crate) const CARRIED_COLUMNS: [&str; 4] = [
    "session_cursor",
    "session_tokens_input",
    "session_tokens_output",
    "session_last_activity_at",
];

/// The newest activity of session `?1` after seq `?2` that carries its progress (a range of
/// the activities' key, from its end: past the row's own seq there is one such activity, or
/// none).
static SELECT_CARRIED: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT key, {} FROM agent_activities \
         WHERE {} AND session_cursor IS NOT NULL \
         ORDER BY key DESC LIMIT 1",
        CARRIED_COLUMNS.join(", "),
        *ACTIVITIES_OF_AFTER
    )
});

const INSERT_STATUS: &str = "INSERT INTO session_status_events \
     (session_id, seq, previous_status, new_status, message, at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6)";

const INSERT_MESSAGE: &str = "INSERT INTO session_messages (session_id, turn, role, content, at) \
     VALUES (?1, ?2, ?3, ?4, ?5)";

const CAMPAIGN_COLUMNS: &str = "id, name, root_path, created_at";

/// paddock's database. See the module documentation.
#[derive(Debug)]
pub struct Store {
    conn: Connection,
    /// Seals credentials before they are written and opens them when read ([`seal`]).
    sealer: seal::Sealer,
    /// Dropped with the store: the checkpointer thread ends.
    _checkpointer: Option<std::sync::mpsc::Sender<()>>,
    /// What this store last committed of each live session's row (at most
    /// [`STORED_CONFIGS_MAX`]): the record it wrote last in full or in state. A session that
    /// works changes its state with every event and its configuration almost never: while the
    /// configuration is the one stored ([`same_config`]), a batch writes only the state
    /// ([`UPDATE_SESSION_STATE`]) instead of encoding and sealing the whole row again, while
    /// its status, pid and run are too, only the columns no index reads
    /// ([`UPDATE_SESSION_WORK`]), and while only its progress moved, nothing of the row
    /// ([`differs_only_in_progress`]: the record's progress here may be older than the row's,
    /// which the activity rows carry).
    stored_configs: foldhash::HashMap<String, SessionRecord>,
    /// The keys (`session_keys`) of the sessions whose activities this store wrote lately, as
    /// committed: at most [`SESSION_KEYS_MAX`], the least recently used dropped first. An
    /// activity's row is keyed by its session's key ([`activity_key`]).
    session_keys: lru::LruCache<String, i64>,
    /// SQLite's `data_version` when those keys were last known to be the stored ones: another
    /// program's commit (a session deleted by hand) lets them all go.
    keys_version: i64,
    /// The ended sessions' rows a list read lately, decoded ([`SettledRows`]).
    settled: std::cell::RefCell<SettledRows>,
    /// SQLite's `data_version` when those rows were last known to be the stored ones: it
    /// changes with every commit of another connection to the file.
    settled_version: std::cell::Cell<i64>,
}

/// The rows of ended (STOPPED or FAILED) sessions that lists read lately, decoded, with their
/// unrecognized-line counts: at most [`SETTLED_ROWS_MAX`], the least recently read dropped
/// first.
///
/// A list of sessions is mostly ended ones (a user's history), read again and again (`session
/// list --all`, `top`), and an ended session's row changes only when it is restarted or
/// deleted. Decoding a row is most of what a list costs (46 columns, four of them JSON, and the
/// credentials opened), so a row held here is not read again. Every write of a session's row,
/// of its unrecognized lines or its deletion goes through [`Store::apply_all`] or
/// [`Store::delete_session`], and both drop the session from here first, whether the
/// transaction commits or not: what is held is always what is stored. Another program's commit
/// to the file (`sqlite3` by hand) lets every held row go before the next list (SQLite's
/// `PRAGMA data_version` says there was one). Empty at start: memory does not grow with the
/// stored history.
type SettledRows = lru::LruCache<String, (Arc<SessionRecord>, u64)>;

/// How many ended sessions' rows [`Store`] holds at most: a few pages of a list (~1 KiB each).
const SETTLED_ROWS_MAX: std::num::NonZeroUsize = std::num::NonZeroUsize::new(1024).unwrap();

/// How many sessions' keys [`Store`] holds at most: as many as it holds stored rows.
const SESSION_KEYS_MAX: std::num::NonZeroUsize =
    std::num::NonZeroUsize::new(STORED_CONFIGS_MAX).unwrap();

/// Whether two records hold the same configuration: the stored record's is the very one the
/// engine's holds (one `Arc`), so a record of the same configuration is known so without
/// comparing its fields.
fn same_config(a: &Arc<SessionConfig>, b: &Arc<SessionConfig>) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

/// A session's [`ACTIVE_ROW_COLUMNS`].
type ActiveKey = (paddock_core::Status, Option<u32>, Option<u64>);

fn active_key(rec: &SessionRecord) -> ActiveKey {
    (rec.status, rec.pid, rec.run)
}

/// Whether `a` and `b` are the same session in the same state but for its progress: the output
/// cursor, the token totals, the last activity's number and time, which every event of a
/// working session moves and nothing else does. Every field is named, so that a field added
/// to the record is a decision here.
fn differs_only_in_progress(a: &SessionRecord, b: &SessionRecord) -> bool {
    let SessionRecord {
        id,
        config,
        status,
        tokens_input: _,
        tokens_output: _,
        pid,
        restart_count,
        created_at,
        started_at,
        last_activity_at: _,
        ended_at,
        error,
        provider_session,
        last_activity_seq: _,
        last_status_seq,
        turns,
        turn_open,
        last_turn_failed,
        run,
        provider_cursor: _,
        env_state,
        disconnected,
        closed_by_client,
    } = a;
    *id == b.id
        && same_config(config, &b.config)
        && *status == b.status
        && *pid == b.pid
        && *restart_count == b.restart_count
        && *created_at == b.created_at
        && *started_at == b.started_at
        && *ended_at == b.ended_at
        && *error == b.error
        && *provider_session == b.provider_session
        && *last_status_seq == b.last_status_seq
        && *turns == b.turns
        && *turn_open == b.turn_open
        && *last_turn_failed == b.last_turn_failed
        && *run == b.run
        && *env_state == b.env_state
        && *disconnected == b.disconnected
        && *closed_by_client == b.closed_by_client
}

/// Sessions whose stored configuration [`Store`] remembers, at most; the others are written
/// in full.
const STORED_CONFIGS_MAX: usize = 4096;

/// How often the checkpointer thread moves the WAL's committed pages into the database.
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(500);
/// The WAL file is cut back to this size when it restarts after a checkpoint.
const WAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;
/// A WAL larger than this is restarted under the writer lock ([`checkpointer`]). Below
/// [`WAL_SIZE_LIMIT`], with room for what half a second adds at 40 MB a second: the file stays
/// as large as it grew and a restarted WAL writes over blocks the file has, instead of being
/// cut back and growing again (every block it adds is work for the file system's journal,
/// which the checkpoint's fsync waits for).
const WAL_RESTART_AT: i64 = 32 * 1024 * 1024;
/// Passes a restart may make without the lock first, each copying what the one before left.
const CATCH_UP_PASSES: usize = 4;

/// When the checkpointer checkpoints ([`CHECKPOINTS`]; tests make it quicker).
#[derive(Clone, Copy, Debug)]
struct Checkpoints {
    every: Duration,
    restart_at_bytes: i64,
}

const CHECKPOINTS: Checkpoints = Checkpoints {
    every: CHECKPOINT_EVERY,
    restart_at_bytes: WAL_RESTART_AT,
};

/// Checkpoints a WAL database from its own connection and thread (performance review B2): a
/// checkpoint copies pages and fsyncs, which on the writer's thread stalled every commit for
/// 12–20 ms. PASSIVE never waits for the writer nor blocks it; the WAL restarts from its start
/// once every frame was copied.
///
/// A writer that never pauses for a whole pass (a thousand busy sessions) never let that
/// happen: a pass copies what the WAL held when it began, and its WAL grew by every commit
/// (40 MB a second, 800 MB after 20 s). Once the WAL holds more than
/// [`Checkpoints::restart_at_bytes`], the checkpointer catches up without the lock (what a pass
/// leaves is what was written during it, less each time) and then checkpoints in RESTART
/// mode, which holds the writer lock while it copies the last frames and syncs: the writer
/// waits that long ([`busy_wait`], 2–4 ms measured) and its next commit writes from the WAL's
/// start. A restart also waits, the lock held, for every reader to leave an older snapshot:
/// it gives up after [`RESTART_WAIT`] and tries again a round later, so a reader that keeps
/// one open (a `sqlite3` shell left in a transaction, a backup tool) costs the writer at most
/// that, never [`BUSY_TIMEOUT`]. Such a reader keeps every frame written since: past
/// [`STUCK_WARN_FACTOR`] times the restart size the log says so, naming the cause ([`Stuck`]).
fn checkpointer(path: std::path::PathBuf, when: Checkpoints, stop: std::sync::mpsc::Receiver<()>) {
    let conn = match Connection::open(&path) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(db = %path.display(), "checkpointer: cannot open the database: {e}");
            return;
        }
    };
    // Only a restart waits (a PASSIVE pass never calls the busy handler).
    let _ = conn.busy_timeout(RESTART_WAIT);
    // A frame is a page and its 24-byte header.
    let frame = conn
        .query_row("PRAGMA page_size", [], |r| r.get::<_, i64>(0))
        .map_or(4096 + 24, |p| p + 24);
    let restart_at = when.restart_at_bytes / frame;
    // Close enough to restart: what a millisecond adds at 40 MB a second.
    let caught_up = 40 * 1024 / frame;
    let pass = |mode: &str| {
        conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
            Ok(Pass {
                gave_up: r.get::<_, i64>(0)? != 0,
                log: r.get(1)?,
                copied: r.get(2)?,
            })
        })
    };
    let mut last_log = 0;
    let mut stuck = Stuck::new(when.restart_at_bytes.saturating_mul(STUCK_WARN_FACTOR));
    loop {
        match stop.recv_timeout(when.every) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        let mut r = pass("PASSIVE");
        if let Ok(Pass { mut log, .. }) = r {
            // A WAL that did not grow since the last round was idle, and a whole pass copied
            // it: the writer's next commit restarts it.
            let grew = log != std::mem::replace(&mut last_log, log);
            if grew && log > restart_at {
                for _ in 0..CATCH_UP_PASSES {
                    r = pass("PASSIVE");
                    let Ok(Pass { log: now, .. }) = r else { break };
                    if now - std::mem::replace(&mut log, now) <= caught_up {
                        break;
                    }
                }
                let held = std::time::Instant::now();
                r = pass("RESTART");
                let held_ms = held.elapsed().as_secs_f64() * 1e3;
                let restarted = matches!(r, Ok(Pass { gave_up: false, .. }));
                if restarted {
                    tracing::debug!(frames = log, held_ms, "checkpoint: the WAL restarts")
                } else {
                    tracing::debug!(
                        frames = log,
                        held_ms,
                        "checkpoint: no restart (a reader holds an older snapshot, or the \
                         writer did not pause); tried again next round"
                    )
                }
                // The frames a reader keeps: a restart it blocks copies none past its snapshot,
                // while one that found the writer busy has copied all but the newest.
                let pinned = match r {
                    Ok(Pass { log, copied, .. }) if !restarted && copied <= log / 2 => log,
                    _ => 0,
                };
                match stuck.after(restarted, pinned.saturating_mul(frame)) {
                    Some(Said::Growing(bytes)) => tracing::warn!(
                        db = %path.display(),
                        "the database's write-ahead log is {} MiB and cannot be emptied: \
                         another program keeps a read transaction open on it (a sqlite3 \
                         shell, a backup); it grows until that program lets go",
                        bytes >> 20
                    ),
                    Some(Said::Restarted) => tracing::info!(
                        db = %path.display(),
                        "the database's write-ahead log is emptied again"
                    ),
                    None => {}
                }
            }
        }
        match r {
            Ok(Pass { log, copied, .. }) if log > 0 => {
                tracing::trace!(frames = log, copied, "checkpoint")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(db = %path.display(), "checkpoint failed: {e}"),
        }
    }
}

/// A WAL this many times [`Checkpoints::restart_at_bytes`] that a restart could not empty is
/// said once in the log (128 MiB by default), then again at each doubling.
const STUCK_WARN_FACTOR: i64 = 4;

/// When the checkpointer tells the user that the WAL cannot be emptied: a reader that keeps an
/// older snapshot (a `sqlite3` shell left in a transaction) holds every frame written since,
/// and only its user can let it go.
#[derive(Debug)]
struct Stuck {
    /// The size of the first warning.
    first: i64,
    /// The size of the next warning.
    next: i64,
}

/// What [`Stuck`] has the checkpointer say.
#[derive(Debug, PartialEq)]
enum Said {
    /// The WAL holds this many bytes, and grows.
    Growing(i64),
    /// It restarted after a warning.
    Restarted,
}

impl Stuck {
    fn new(first: i64) -> Stuck {
        Stuck { first, next: first }
    }

    /// After a restart that did or did not go through, with `bytes` of WAL kept by a reader.
    fn after(&mut self, restarted: bool, bytes: i64) -> Option<Said> {
        let warned = self.next > self.first;
        if restarted {
            self.next = self.first;
            return warned.then_some(Said::Restarted);
        }
        if bytes < self.next {
            return None;
        }
        while self.next <= bytes {
            self.next = self.next.saturating_mul(2);
        }
        Some(Said::Growing(bytes))
    }
}

/// What a `PRAGMA wal_checkpoint` pass did.
struct Pass {
    /// It gave up waiting (for the writer, or for a reader on an older snapshot).
    gave_up: bool,
    /// Frames in the WAL.
    log: i64,
    /// Frames copied into the database.
    copied: i64,
}

/// How long the writer sleeps between tries while another connection holds the lock it
/// needs (the checkpointer's restart): short, so that it writes within a fraction of a
/// millisecond of the lock's release. (SQLite's own busy timeout sleeps 1, 2, 5, 10… ms.)
const BUSY_STEP: Duration = Duration::from_micros(100);

/// How long the checkpointer's restart waits for the writer's transaction to end and for
/// readers to leave older snapshots, holding off the writer meanwhile: a few of the writer's
/// commits (0.5–3 ms each under a thousand busy sessions).
const RESTART_WAIT: Duration = Duration::from_millis(10);

thread_local! {
    /// How long the writer on this thread waits for a lock another connection holds before
    /// its statement fails with `SQLITE_BUSY` ([`BUSY_TIMEOUT`] unless
    /// [`Store::set_lock_wait`] said otherwise).
    static LOCK_WAIT: std::cell::Cell<Duration> = const { std::cell::Cell::new(BUSY_TIMEOUT) };
}

/// The writer's busy handler: sleeps [`BUSY_STEP`] per try, until its thread's lock wait
/// ([`BUSY_TIMEOUT`] by default) has passed since the first (measured: on a loaded machine a
/// sleep lasts longer than it asks).
fn busy_wait(tries: i32) -> bool {
    thread_local! {
        static SINCE: std::cell::Cell<Option<std::time::Instant>> =
            const { std::cell::Cell::new(None) };
    }
    let now = std::time::Instant::now();
    let since = SINCE.with(|s| {
        if tries == 0 {
            s.set(Some(now));
        }
        s.get().unwrap_or(now)
    });
    if now.duration_since(since) >= LOCK_WAIT.get() {
        return false;
    }
    std::thread::sleep(BUSY_STEP);
    true
}

impl Store {
    /// Opens (creating if needed) the database file at `path` and migrates it. The parent
    /// directory must exist.
    pub fn open(path: &Path) -> Result<Store> {
        Store::open_with(path, CHECKPOINTS)
    }

    /// How long a write on the calling thread waits for a lock another program holds before
    /// it fails with [`StoreError::is_locked`] (`None`: the default, 5 s). A daemon whose
    /// commits fail that way shortens it while it waits, so that each try costs its event
    /// loop little.
    pub fn set_lock_wait(wait: Option<Duration>) {
        LOCK_WAIT.set(wait.unwrap_or(BUSY_TIMEOUT));
    }

    fn open_with(path: &Path, checkpoints: Checkpoints) -> Result<Store> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let sealer = seal::Sealer::load_or_create(&dir.join(SECRET_KEY_FILE))?;
        let mut store = Store::init(Connection::open(path)?, sealer)?;
        let mode: String = store
            .conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
        if mode.eq_ignore_ascii_case("wal") {
            // Checkpoints leave the writer's thread for their own (if a thread cannot be
            // started, SQLite's own checkpoints on commit stay on).
            let (tx, rx) = std::sync::mpsc::channel();
            let db = path.to_path_buf();
            let spawned = std::thread::Builder::new()
                .name("paddock-checkpoint".into())
                .spawn(move || checkpointer(db, checkpoints, rx));
            match spawned {
                Ok(_) => {
                    store.conn.execute_batch(&format!(
                        "PRAGMA wal_autocheckpoint = 0; \
                         PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}"
                    ))?;
                    store._checkpointer = Some(tx);
                }
                Err(e) => tracing::warn!("no checkpointer thread ({e}): checkpoints on commit"),
            }
        }
        Ok(store)
    }

    /// A private in-memory database (for tests).
    pub fn open_in_memory() -> Result<Store> {
        Store::init(Connection::open_in_memory()?, seal::Sealer::ephemeral()?)
    }

    fn init(mut conn: Connection, sealer: seal::Sealer) -> Result<Store> {
        conn.busy_handler(Some(busy_wait))?;
        conn.execute_batch("PRAGMA foreign_keys = ON")?;
        // 1 KiB pages for a new database (an existing one keeps its own: only a VACUUM could
        // change it, and a start never rewrites the file). Every event updates its session's
        // row and a leaf of the activity index, pages of their own for each of 1,000 busy
        // sessions, and WAL mode writes whole pages: with 4 KiB pages each event wrote ~8 KiB
        // of WAL. Measured (`cargo bench … targets`, P3, P6): 1 KiB pages cut the daemon's
        // CPU per event by ~17% (97 → 82 µs) and P3's latency (p50 3.3 → 2.2 ms, p99 24 → 16
        // ms, medians of 5 runs), with listing and start-up (P4, P5) unchanged. Must come
        // before the journal mode is set (it is fixed once the WAL exists).
        conn.execute_batch(&format!("PRAGMA page_size = {PAGE_SIZE}"))?;
        // WAL: readers never block the writer, and a commit is one append to the log.
        let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
        // synchronous=NORMAL is durable enough *with WAL*: a commit is written to the WAL
        // file before `COMMIT` returns, so a committed transaction survives a crash of this
        // process (the OS still has the write); only the fsync is deferred to checkpoints.
        // An OS crash or power loss can therefore lose the last few committed transactions,
        // but never corrupts the database (WAL frames are checksummed and replayed only up to
        // the last complete commit). paddock delivers events to clients only after commit,
        // so the worst case is a restart that forgets the last moments before a power cut.
        // If WAL is unavailable (a filesystem without shared-memory support), NORMAL with a
        // rollback journal is *not* safe against power loss: use FULL there. (An in-memory
        // database reports "memory" and has nothing to sync.)
        let sync = if mode.eq_ignore_ascii_case("wal") || mode.eq_ignore_ascii_case("memory") {
            "NORMAL"
        } else {
            "FULL"
        };
        conn.execute_batch(&format!("PRAGMA synchronous = {sync}"))?;
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        // One plan per statement, whatever its parameters are bound to. Without it, the bundled
        // SQLite (built with STAT4) compiled a cached statement such as "sessions after ?1 in
        // campaign ?2 (or any)" again at every step after a new binding: under `perf` that
        // was a third of the daemon's SQLite time for each page of `session list --all`.
        conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
            true,
        )?;
        migrations::migrate(&mut conn, migrations::MIGRATIONS, now_ms())?;
        seal_stored_credentials(&mut conn, &sealer)?;
        Ok(Store {
            conn,
            sealer,
            _checkpointer: None,
            stored_configs: foldhash::HashMap::default(),
            session_keys: lru::LruCache::new(SESSION_KEYS_MAX),
            keys_version: 0,
            settled: std::cell::RefCell::new(lru::LruCache::new(SETTLED_ROWS_MAX)),
            settled_version: std::cell::Cell::new(0),
        })
    }

    /// Writes a batch of core records in ONE transaction (the daemon's batched commit): all
    /// of them or, on any error, none.
    pub fn apply(&mut self, records: &[Record]) -> Result<()> {
        self.apply_all(records, &[]).map(drop)
    }

    /// Writes a batch of session records, task rows and shell rows in ONE transaction.
    /// Returns the ids of the batch's reported events ([`Row::Event`]), in order.
    pub fn apply_all(&mut self, records: &[Record], rows: &[Row]) -> Result<Vec<i64>> {
        if records.is_empty() && rows.is_empty() {
            return Ok(Vec::new());
        }
        // Before anything is written: a row held is never older than the stored one.
        let settled = self.settled.get_mut();
        for record in records {
            match record {
                Record::Session(rec) => settled.pop(&rec.id.0),
                Record::Delete(id) => settled.pop(&id.0),
                _ => None,
            };
        }
        for row in rows {
            if let Row::Unrecognized(line) = row {
                settled.pop(&line.session_id);
            }
        }
        let sealer = &self.sealer;
        // A batch of a fast agent's N events carries N versions of its session's record (and a
        // busy task's of its task's): only the last one is written, in the place of the first
        // (performance review B2). Nothing in between reads the row back.
        let mut last: foldhash::HashMap<(bool, &str), usize> = foldhash::HashMap::default();
        for (i, record) in records.iter().enumerate() {
            match record {
                Record::Session(rec) => last.insert((true, rec.id.0.as_str()), i),
                Record::Task(t) => last.insert((false, t.id.as_str()), i),
                _ => None,
            };
        }
        // A working session's row is not written for an event at all when the event's activity
        // row can carry what changed (performance review B2, "no full session upsert per
        // event"): the last record of a session in the batch differs from the row this store
        // committed only in its progress, and the batch's last activity of the session is its
        // last (its seq is the record's). That activity row gets the progress
        // (`CARRIED_COLUMNS`), in the same transaction, and every read of a session's row takes
        // it back from there ([`Store::session_from_row`]). An ended session's row is always
        // written: it is read without looking further.
        let mut last_activity: foldhash::HashMap<&str, usize> = foldhash::HashMap::default();
        for (i, record) in records.iter().enumerate() {
            if let Record::Activity(ev) = record {
                last_activity.insert(ev.session.0.as_str(), i);
            }
        }
        let mut carried: foldhash::HashMap<usize, &SessionRecord> = foldhash::HashMap::default();
        for (&(is_session, id), &i) in &last {
            let (true, Record::Session(rec), Some(&a)) =
                (is_session, &records[i], last_activity.get(id))
            else {
                continue;
            };
            let carries = !rec.status.is_terminal()
                && matches!(&records[a], Record::Activity(ev) if ev.seq == rec.last_activity_seq)
                && self
                    .stored_configs
                    .get(id)
                    .is_some_and(|stored| differs_only_in_progress(stored, rec));
            if carries {
                carried.insert(a, rec);
            }
        }
        let mut written: foldhash::HashSet<(bool, &str)> = carried
            .values()
            .map(|rec| (true, rec.id.0.as_str()))
            .collect();
        // What the batch does to `stored_configs`, done once it committed: rows stored anew,
        // rows whose configuration was as stored (their active key may have changed), rows
        // gone.
        let mut configs_stored: Vec<&SessionRecord> = Vec::new();
        let mut states_stored: Vec<&SessionRecord> = Vec::new();
        let mut configs_gone: Vec<&str> = Vec::new();
        let stored_configs = &self.stored_configs;
        // The keys of the batch's sessions that this store did not hold: remembered once the
        // batch committed (a key made in a transaction that rolled back was never stored).
        let mut keys_found: Vec<(&str, i64)> = Vec::new();
        // The last activity's session and key: a batch's activities come in runs of one
        // session.
        let mut last_key: Option<(&str, i64)> = None;
        let known_keys = &mut self.session_keys;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        // Read under the write lock: no other commit can come before this batch's.
        let version = tx
            .prepare_cached("PRAGMA data_version")?
            .query_row([], |r| r.get::<_, i64>(0))?;
        if std::mem::replace(&mut self.keys_version, version) != version {
            known_keys.clear();
        }
        let mut activities = activities::ActivityInserts::new(&tx);
        for (i, record) in records.iter().enumerate() {
            let key = match record {
                Record::Session(rec) => Some((true, rec.id.0.as_str())),
                Record::Task(t) => Some((false, t.id.as_str())),
                _ => None,
            };
            let record = match key {
                Some(k) if !written.insert(k) => continue,
                Some(k) => &records[last[&k]],
                None => record,
            };
            // The activities waiting go in before anything else is written.
            if !matches!(record, Record::Activity(_)) {
                activities.flush()?;
            }
            match record {
                Record::Session(rec) => {
                    let stored = stored_configs
                        .get(&rec.id.0)
                        .filter(|stored| same_config(&stored.config, &rec.config));
                    let updated = match stored {
                        Some(s) => {
                            update_session_state(&tx, rec, active_key(s) == active_key(rec))?
                        }
                        None => false,
                    };
                    if !updated {
                        upsert_session(&tx, sealer, rec)?;
                    }
                    if rec.status.is_terminal() {
                        configs_gone.push(&rec.id.0);
                    } else if updated {
                        states_stored.push(rec);
                    } else {
                        configs_stored.push(rec);
                    }
                }
                Record::Activity(ev) => {
                    let id = ev.session.0.as_str();
                    let session = match last_key {
                        Some((last, key)) if last == id => key,
                        _ => {
                            let key = match known_keys.get(id) {
                                Some(&key) => key,
                                None => session_key(&tx, id, &mut keys_found)?,
                            };
                            last_key = Some((id, key));
                            key
                        }
                    };
                    activities.push(session, ev, carried.get(&i).copied())?
                }
                Record::Status(ev) => insert_status(&tx, ev)?,
                Record::UserMessage(m) => insert_message(&tx, m)?,
                Record::Approval(a) => approvals::upsert(&tx, a)?,
                Record::Delete(id) => {
                    delete_session_rows(&tx, &id.0)?;
                    configs_gone.push(&id.0);
                    // Its key went with it: a later activity of the same id makes a new one.
                    known_keys.pop(&id.0);
                    keys_found.retain(|(found, _)| *found != id.0);
                    if last_key.is_some_and(|(last, _)| last == id.0) {
                        last_key = None;
                    }
                }
                Record::Task(t) => tasks::upsert(&tx, sealer, t)?,
                Record::TaskOutput(o) => tasks::insert_output(&tx, o)?,
                Record::Campaign(c) => insert_campaign(&tx, c)?,
                Record::RemoveCampaign(id) => {
                    // Its sessions are kept.
                    tx.execute("DELETE FROM campaigns WHERE id = ?1", [id])?;
                }
                Record::Container(c) => tasks::upsert_container(&tx, sealer, c)?,
                Record::RemoveContainer(id) => tasks::remove_container(&tx, id)?,
            }
        }
        activities.flush()?;
        drop(activities);
        let mut events = Vec::new();
        for row in rows {
            match row {
                Row::Event(e) => events.push(insert_event(&tx, e)?),
                Row::External(list) => insert_external(&tx, list)?,
                Row::Unrecognized(line) => insert_unrecognized(&tx, line)?,
            }
        }
        tx.commit()?;
        for (id, key) in keys_found {
            known_keys.put(id.to_string(), key);
        }
        // Only what is committed is remembered: after a rollback the next write is in full.
        for rec in configs_stored {
            if self.stored_configs.len() < STORED_CONFIGS_MAX
                || self.stored_configs.contains_key(&rec.id.0)
            {
                self.stored_configs.insert(rec.id.0.clone(), rec.clone());
            }
        }
        for rec in states_stored {
            if let Some(stored) = self.stored_configs.get_mut(&rec.id.0) {
                *stored = rec.clone();
            }
        }
        for id in configs_gone {
            self.stored_configs.remove(id);
        }
        Ok(events)
    }

    /// How many unrecognized provider lines each session that is not settled has had (those
    /// with none are absent): what a starting daemon holds in memory, beside the sessions it
    /// holds.
    pub fn unrecognized_counts(&self) -> Result<Vec<(String, u64)>> {
        let mut stmt = self.conn.prepare_cached(&UNSETTLED_UNRECOGNIZED_COUNTS)?;
        let rows = stmt.query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?.max(0) as u64))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// How many unrecognized provider lines session `id` has had.
    pub fn unrecognized_count(&self, id: &str) -> Result<u64> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!("{UNRECOGNIZED_COUNT_OF} ?1"))?;
        let n: i64 = stmt.query_row([id], |r| r.get(0))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// The kept unrecognized lines of a session, oldest first: (seq, run, at ms, line).
    pub fn unrecognized_lines(&self, session_id: &str) -> Result<Vec<(u64, u64, i64, String)>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT seq, run, at, line FROM provider_unrecognized WHERE session_id = ?1 ORDER BY seq",
        )?;
        let rows = stmt.query_map([session_id], |r| {
            Ok((
                r.get::<_, i64>(0)? as u64,
                r.get::<_, i64>(1)? as u64,
                r.get::<_, i64>(2)?,
                r.get::<_, String>(3)?,
            ))
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Every session, in id order (ULIDs: creation order).
    pub fn load_sessions(&self) -> Result<Vec<SessionRecord>> {
        let mut stmt = self.conn.prepare_cached(&SELECT_SESSIONS)?;
        let rows = stmt.query([])?;
        collect(rows, |r| self.session_from_row(r))
    }

    /// The sessions a starting daemon must decide on, in id order: every one that is not
    /// [settled](SessionRecord::is_settled) (10,000 ended ones cost the start-up nothing).
    pub fn load_unsettled_sessions(&self) -> Result<Vec<SessionRecord>> {
        let mut stmt = self.conn.prepare_cached(&SELECT_UNSETTLED_SESSIONS)?;
        let rows = stmt.query([])?;
        collect(rows, |r| self.session_from_row(r))
    }

    /// Up to `limit` sessions with an id before `before` (`""`: from the newest), newest
    /// first, each with how many unrecognized lines it had; only those of `campaign` and in
    /// `working_dir` when given. An ended session's row read lately is not read again (the
    /// store holds it, `SettledRows`).
    pub fn sessions_before(
        &self,
        before: &str,
        campaign: Option<&str>,
        working_dir: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(Arc<SessionRecord>, u64)>> {
        let mut stmt = self.conn.prepare_cached(SELECT_SESSION_IDS_BEFORE)?;
        let rows = stmt.query(params![before, campaign, working_dir, codec::limit(limit)])?;
        let ids = collect(rows, |r| Ok(r.get::<_, String>(0)?))?;
        let mut settled = self.settled.borrow_mut();
        // Another program committed to the file since the last list: nothing held is trusted
        // (one that commits from now on is seen by the next list).
        let version = self
            .conn
            .prepare_cached("PRAGMA data_version")?
            .query_row([], |r| r.get::<_, i64>(0))?;
        if self.settled_version.replace(version) != version {
            settled.clear();
        }
        let mut out = Vec::with_capacity(ids.len());
        // Prepared once a page, and only when a row is not held.
        let mut counted = None;
        for id in ids {
            if let Some((record, count)) = settled.get(&id) {
                out.push((Arc::clone(record), *count));
                continue;
            }
            let stmt = match &mut counted {
                Some(stmt) => stmt,
                None => counted.insert(self.conn.prepare_cached(&SELECT_SESSION_COUNTED)?),
            };
            let mut rows = stmt.query([&id])?;
            // Gone between the two reads (another program writing the file): not listed.
            let Some(r) = rows.next()? else { continue };
            let count = u64::try_from(r.get::<_, i64>(SESSION_COLUMNS.len())?).unwrap_or(0);
            let record = Arc::new(self.session_from_row(r)?);
            if record.status.is_terminal() {
                settled.put(id, (Arc::clone(&record), count));
            }
            out.push((record, count));
        }
        Ok(out)
    }

    /// The newest session stored for sunbeam project `project` that the core's rule could
    /// resume ([`paddock_core::session_to_resume`]) among those `skip` does not name.
    ///
    /// A project's sessions work in its root, and the rule takes the newest (by creation, then
    /// id) of those it accepts: the project's rows are read newest first and the first one the
    /// rule accepts is the one, so a project with a long history costs one row, not all of
    /// them (SQLite's `created_at` integers and BINARY text order as the rule's do).
    pub fn resumable(
        &self,
        project: &str,
        skip: &dyn Fn(&SessionId) -> bool,
    ) -> Result<Option<SessionId>> {
        let mut stmt = self.conn.prepare_cached(&SELECT_SESSIONS_NEWEST_IN)?;
        let mut rows = stmt.query([project])?;
        while let Some(row) = rows.next()? {
            let r = self.session_from_row(row)?;
            if !skip(&r.id) && paddock_core::session_to_resume(project, [&r]).is_some() {
                return Ok(Some(r.id));
            }
        }
        Ok(None)
    }

    /// Whether session `id` is stored.
    pub fn has_session(&self, id: &str) -> Result<bool> {
        Ok(self
            .conn
            .prepare_cached("SELECT 1 FROM agent_sessions WHERE id = ?1")?
            .exists([id])?)
    }

    /// How many sessions are stored.
    pub fn session_count(&self) -> Result<u64> {
        let n: i64 = self
            .conn
            .prepare_cached("SELECT COUNT(*) FROM agent_sessions")?
            .query_row([], |r| r.get(0))?;
        Ok(n.max(0) as u64)
    }

    /// The highest run id any stored request names (0: none). With the runs of the sessions
    /// [`Store::load_unsettled_sessions`] gives, which `Engine::restore` reserves (a session that
    /// names a run is never settled, so every such session is among them), the runs a new daemon
    /// must never hand out again.
    /// A `MAX(run_id)` over the sessions would read every one of them: 2.4 ms of a start with
    /// 10,000 stored, a quarter of what they cost it. The requests' maximum is the last entry of
    /// their `approvals_by_run` index (migration 14), however many are stored.
    pub fn max_request_run(&self) -> Result<u64> {
        let n: Option<i64> = self
            .conn
            .prepare_cached(approvals::MAX_REQUEST_RUN)?
            .query_row([], |r| r.get(0))?;
        Ok(n.unwrap_or(0).max(0) as u64)
    }

    /// One session.
    pub fn session(&self, id: &str) -> Result<Option<SessionRecord>> {
        let mut stmt = self.conn.prepare_cached(&SELECT_SESSION)?;
        let mut rows = stmt.query([id])?;
        rows.next()?.map(|r| self.session_from_row(r)).transpose()
    }

    /// A session row with its credentials opened, and the progress its newest activity carries
    /// when that is newer than the row's ([`CARRIED_COLUMNS`]). An ended session's row is read
    /// as it is: its end was written in full, and nothing is carried for it after.
    fn session_from_row(&self, row: &rusqlite::Row) -> Result<SessionRecord> {
        let mut rec = codec::session_from_row(row, &self.sealer)?;
        if !rec.status.is_terminal() {
            let carried = self
                .conn
                .prepare_cached(&SELECT_CARRIED)?
                .query_row(
                    params![rec.id.0, int(rec.last_activity_seq.min(SEQ_MAX))],
                    |r| {
                        Ok((
                            r.get::<_, i64>(0)?,
                            r.get::<_, i64>(1)?,
                            r.get::<_, i64>(2)?,
                            r.get::<_, i64>(3)?,
                            r.get::<_, Option<i64>>(4)?,
                        ))
                    },
                )
                .optional()?;
            if let Some((key, cursor, input, output, at)) = carried {
                let uint = |v: i64| u64::try_from(v).unwrap_or(0);
                rec.last_activity_seq = activity_seq(key);
                rec.provider_cursor = uint(cursor);
                rec.tokens_input = uint(input);
                rec.tokens_output = uint(output);
                rec.last_activity_at = at.map(|ms| paddock_core::Timestamp::from_millis(uint(ms)));
            }
        }
        Ok(rec)
    }

    /// Up to `limit` activities of a session with `seq > after_seq`, in seq order.
    pub fn activities(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<ActivityEvent>> {
        let mut stmt = self.conn.prepare_cached(&SELECT_ACTIVITIES_AFTER)?;
        let rows = stmt.query(params![
            session_id,
            int(after_seq.min(SEQ_MAX)),
            codec::limit(limit)
        ])?;
        collect(rows, |row| codec::activity_from_row(session_id, row))
    }

    /// The newest `limit` activities of a session, in seq order, and whether older ones exist.
    pub fn last_activities(
        &self,
        session_id: &str,
        limit: usize,
    ) -> Result<(Vec<ActivityEvent>, bool)> {
        let mut stmt = self.conn.prepare_cached(&SELECT_LAST_ACTIVITIES)?;
        let rows = stmt.query(params![
            session_id,
            0,
            codec::limit(limit.saturating_add(1))
        ])?;
        let mut list = collect(rows, |row| codec::activity_from_row(session_id, row))?;
        let truncated = list.len() > limit;
        list.truncate(limit);
        list.reverse();
        Ok((list, truncated))
    }

    /// Up to `limit` status events of a session with `seq > after_seq`, in seq order.
    pub fn status_events(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<StatusEvent>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT seq, previous_status, new_status, message, at \
             FROM session_status_events WHERE session_id = ?1 AND seq > ?2 \
             ORDER BY seq LIMIT ?3",
        )?;
        let rows = stmt.query(params![session_id, int(after_seq), codec::limit(limit)])?;
        collect(rows, |row| codec::status_event_from_row(session_id, row))
    }

    /// A session's user messages of turn `from_turn` on, in turn order.
    pub fn user_messages(&self, session_id: &str, from_turn: u64) -> Result<Vec<UserMessage>> {
        let mut stmt = self.conn.prepare_cached(SELECT_USER_MESSAGES)?;
        let rows = stmt.query(params![session_id, codec::ROLE_USER, int(from_turn)])?;
        collect(rows, |row| codec::user_message_from_row(session_id, row))
    }

    /// Every campaign, by name.
    pub fn campaigns(&self) -> Result<Vec<Campaign>> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {CAMPAIGN_COLUMNS} FROM campaigns ORDER BY name"
        ))?;
        let rows = stmt.query([])?;
        collect(rows, codec::campaign_from_row)
    }

    /// The payloads of a campaign's newest `limit` reported events of one type, newest first
    /// (what the tests read back: nothing in the daemon reads them since sunbeam's ended
    /// sessions moved onto the session, e1ca046).
    #[cfg(test)]
    pub(crate) fn reported_payloads(
        &self,
        campaign_id: &str,
        event_type: &str,
        limit: usize,
    ) -> Result<Vec<String>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT payload_json FROM reported_events \
             WHERE campaign_id = ?1 AND event_type = ?2 ORDER BY id DESC LIMIT ?3",
        )?;
        let rows = stmt.query(params![campaign_id, event_type, codec::limit(limit)])?;
        collect(rows, |row| Ok(row.get(0)?))
    }

    /// Deletes a session with all its activities, status events and messages, in one
    /// transaction. Returns whether the session existed (its other rows are deleted anyway).
    /// `external_activities` are left alone: they are what other processes reported.
    pub fn delete_session(&mut self, id: &str) -> Result<bool> {
        self.settled.get_mut().pop(id);
        self.session_keys.pop(id);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let existed = delete_session_rows(&tx, id)?;
        tx.commit()?;
        self.stored_configs.remove(id);
        Ok(existed)
    }

    /// The tokens (input, output) counted so far for one turn of a session.
    ///
    /// Read from the session's newest activity back to the first of an earlier turn: a
    /// session's activities carry its turn counter, which never goes back (those between
    /// turns carry none), and both callers ask for the newest turn (the one that just ended,
    /// or the one an adopted run is in), so this reads that turn's rows and not the
    /// session's whole history (the `turn` column has no index; a filter on it read every
    /// activity of the session).
    pub fn turn_tokens(&self, session_id: &str, turn: u64) -> Result<(u64, u64)> {
        let mut stmt = self.conn.prepare_cached(&SELECT_TURN_TOKENS)?;
        let mut rows = stmt.query(params![session_id, 0])?;
        let (mut input, mut output) = (0u64, 0u64);
        while let Some(r) = rows.next()? {
            match r.get::<_, Option<i64>>(0)?.map(|t| t.max(0) as u64) {
                Some(t) if t < turn => break,
                Some(t) if t == turn => {
                    input = input.saturating_add(r.get::<_, i64>(1)?.max(0) as u64);
                    output = output.saturating_add(r.get::<_, i64>(2)?.max(0) as u64);
                }
                _ => {}
            }
        }
        Ok((input, output))
    }

    /// (number of campaigns, number of sessions).
    #[cfg(test)]
    pub fn counts(&self) -> Result<(i64, i64)> {
        Ok(self.conn.query_row(
            "SELECT (SELECT COUNT(*) FROM campaigns), (SELECT COUNT(*) FROM agent_sessions)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?)
    }
}

/// Deletes every row of a session (not `external_activities`: those are what other processes
/// reported). Returns whether the session existed.
/// A campaign name for a directory: its last component, with anything but letters, digits,
/// `-`, `_` and `.` as `-` (`/home/me/my repo` → `my-repo`; `/` → `root`).
pub fn campaign_name_for(dir: &Path) -> String {
    let base = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let clean: String = base
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .collect();
    let clean = clean.trim_matches('-').to_string();
    if clean.is_empty() {
        "root".into()
    } else {
        clean
    }
}

fn insert_campaign(conn: &Connection, c: &Campaign) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO campaigns (id, name, root_path, created_at) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![c.id, c.name, c.root_path, time(c.created_at)])?;
    Ok(())
}

/// Inserts a reported event; returns its id.
fn insert_event(conn: &Connection, e: &ReportedEvent) -> Result<i64> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO reported_events \
         (kind, campaign_id, festival_id, event_type, payload_json, at, received_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?;
    Ok(stmt.insert(params![
        e.kind,
        e.campaign_id,
        e.festival_id,
        e.event_type,
        e.payload_json,
        int(e.at),
        int(e.received_at)
    ])?)
}

/// Appends activity pushed by external processes.
fn insert_external(conn: &Connection, rows: &[ExternalActivity]) -> Result<()> {
    let mut stmt = conn.prepare_cached(
        "INSERT INTO external_activities \
         (session_id, campaign_id, agent_name, type, content, tool_name, tool_call_id, \
          tool_success, tokens_input, tokens_output, at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    )?;
    for a in rows {
        stmt.execute(params![
            a.session_id,
            a.campaign_id,
            a.agent_name,
            a.kind,
            a.content,
            a.tool_name,
            a.tool_call_id,
            a.tool_success,
            a.tokens_input,
            a.tokens_output,
            int(a.at)
        ])?;
    }
    Ok(())
}

fn delete_session_rows(conn: &Connection, id: &str) -> Result<bool> {
    let existed = conn.execute("DELETE FROM agent_sessions WHERE id = ?1", [id])? > 0;
    conn.prepare_cached(&DELETE_ACTIVITIES)?
        .execute(params![id, 0])?;
    for table in [
        "session_keys",
        "session_status_events",
        "session_messages",
        "provider_unrecognized",
        "approvals",
    ] {
        conn.execute(&format!("DELETE FROM {table} WHERE session_id = ?1"), [id])?;
    }
    Ok(existed)
}

fn upsert_session(conn: &Connection, sealer: &seal::Sealer, rec: &SessionRecord) -> Result<()> {
    let c = &rec.config;
    let provider_config = map_to_json(&sealer.seal(&c.provider_config)?)?;
    let environment = map_to_json(&sealer.seal(&c.environment)?)?;
    let podman = codec::block_to_json(
        &codec::PodmanJson {
            mounts: c.env.podman.mounts.clone(),
            ports: c.env.podman.ports.clone(),
            flags: c.env.podman.flags.clone(),
        },
        "podman",
    )?;
    let podman_env = map_to_json(&sealer.seal(&c.env.podman.env)?)?;
    let ssh = codec::block_to_json(&codec::SshJson::from(c.env.ssh()), "ssh")?;
    let qemu = codec::block_to_json(
        &codec::QemuJson {
            cpus: c.env.qemu().cpus,
            flags: c.env.qemu().flags.clone(),
        },
        "qemu",
    )?;
    let kubernetes =
        codec::block_to_json(&codec::KubeJson::from(c.env.kubernetes()), "kubernetes")?;
    let error_code = rec.error.as_ref().map(|e| e.code.to_string());
    let error_message = rec.error.as_ref().map(|e| e.message.as_str());
    let mut stmt = conn.prepare_cached(&UPSERT_SESSION)?;
    stmt.execute(named_params! {
        ":id": rec.id.0,
        ":campaign_id": c.campaign_id,
        ":provider": c.provider.number(),
        ":model": c.model,
        ":agent_name": c.agent_name,
        ":status": rec.status.number(),
        ":festival_id": c.festival_id,
        ":task_id": c.task_id,
        ":tokens_input": int(rec.tokens_input),
        ":tokens_output": int(rec.tokens_output),
        ":max_tokens": int(c.max_tokens),
        ":pid": rec.pid,
        ":restart_count": rec.restart_count,
        ":created_at": time(rec.created_at),
        ":started_at": rec.started_at.map(time),
        ":last_activity_at": rec.last_activity_at.map(time),
        ":ended_at": rec.ended_at.map(time),
        ":error_code": error_code,
        ":error_message": error_message,
        ":working_dir": c.working_dir,
        ":provider_config": provider_config,
        ":environment": environment,
        ":timeout_ms": int(c.timeout_ms),
        ":initial_message": c.initial_message,
        ":provider_session": rec.provider_session,
        ":turn_open": rec.turn_open,
        ":run_id": rec.run.map(int),
        ":provider_cursor": int(rec.provider_cursor),
        ":last_turn_failed": rec.last_turn_failed,
        ":last_activity_seq": int(rec.last_activity_seq),
        ":last_status_seq": int(rec.last_status_seq),
        ":turns": int(rec.turns),
        ":env_driver": c.env.driver.name(),
        ":env_worktree": c.env.worktree,
        ":env_network": c.env.network,
        ":env_state": rec.env_state.number(),
        ":env_image": c.env.image,
        ":env_memory": int(c.env.memory_bytes),
        ":env_pids": i64::from(c.env.pids),
        ":env_podman": podman,
        ":env_podman_env": podman_env,
        ":env_ssh": ssh,
        ":disconnected": rec.disconnected,
        ":env_qemu": qemu,
        ":env_kubernetes": kubernetes,
        ":closed_by_client": rec.closed_by_client,
    })?;
    Ok(())
}

/// Writes the state of session `rec`, whose configuration is stored as it is, and whose
/// [`ACTIVE_ROW_COLUMNS`] too when `active_as_stored`. False when there is no such row (the
/// caller writes it in full).
fn update_session_state(
    conn: &Connection,
    rec: &SessionRecord,
    active_as_stored: bool,
) -> Result<bool> {
    let error_code = rec.error.as_ref().map(|e| e.code.to_string());
    let error_message = rec.error.as_ref().map(|e| e.message.as_str());
    let sql: &str = if active_as_stored {
        &UPDATE_SESSION_WORK
    } else {
        &UPDATE_SESSION_STATE
    };
    let n = conn.prepare_cached(sql)?.execute(params![
        rec.id.0,
        rec.status.number(),
        int(rec.tokens_input),
        int(rec.tokens_output),
        rec.pid,
        rec.restart_count,
        time(rec.created_at),
        rec.started_at.map(time),
        rec.last_activity_at.map(time),
        rec.ended_at.map(time),
        error_code,
        error_message,
        rec.provider_session,
        int(rec.last_activity_seq),
        int(rec.last_status_seq),
        int(rec.turns),
        rec.turn_open,
        rec.run.map(int),
        int(rec.provider_cursor),
        rec.last_turn_failed,
        rec.env_state.number(),
        rec.disconnected,
        rec.closed_by_client,
    ])?;
    Ok(n == 1)
}

/// The key of session `id` in `session_keys`, made if it has none; one this store did not
/// hold is added to `found` (unless already there: a batch looks a session up once).
fn session_key<'a>(
    tx: &rusqlite::Transaction<'_>,
    id: &'a str,
    found: &mut Vec<(&'a str, i64)>,
) -> Result<i64> {
    if let Some(&(_, key)) = found.iter().find(|(f, _)| *f == id) {
        return Ok(key);
    }
    let stored = tx
        .prepare_cached(SELECT_SESSION_KEY)?
        .query_row([id], |r| r.get::<_, i64>(0))
        .optional()?;
    let key = match stored {
        Some(key) => key,
        None => {
            tx.prepare_cached(INSERT_SESSION_KEY)?.execute([id])?;
            tx.last_insert_rowid()
        }
    };
    if !(1..=SESSION_KEY_MAX).contains(&key) {
        return Err(StoreError::Limit(format!(
            "session key {key} of session {id}: keys go from 1 to {SESSION_KEY_MAX}"
        )));
    }
    found.push((id, key));
    Ok(key)
}

fn insert_status(conn: &Connection, ev: &StatusEvent) -> Result<()> {
    conn.prepare_cached(INSERT_STATUS)?.execute(params![
        ev.session.0,
        int(ev.seq),
        ev.previous.map(|s| s.number()),
        ev.new.number(),
        ev.message,
        time(ev.at)
    ])?;
    Ok(())
}

fn insert_message(conn: &Connection, m: &UserMessage) -> Result<()> {
    conn.prepare_cached(INSERT_MESSAGE)?.execute(params![
        m.session.0,
        int(m.turn),
        codec::ROLE_USER,
        m.text,
        time(m.at)
    ])?;
    Ok(())
}

/// Decodes every row with `f`.
/// The file beside the database that holds the key credentials are sealed with.
pub const SECRET_KEY_FILE: &str = "secret.key";

/// `PRAGMA user_version` bit: every credential stored is sealed (the one-time sweep of an older
/// install's rows ran). The schema's own version is the `schema_version` table.
const SEALED_FLAG: i64 = 1;

/// Seals the credentials an older install stored in the clear, once, in one transaction.
fn seal_stored_credentials(conn: &mut Connection, sealer: &seal::Sealer) -> Result<()> {
    let flags: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if flags & SEALED_FLAG != 0 {
        return Ok(());
    }
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let parse = |text: &str, what: &str| {
        serde_json::from_str::<std::collections::BTreeMap<String, String>>(text)
            .map_err(|e| StoreError::Corrupt(format!("{what}: bad JSON object: {e}")))
    };
    let sessions: Vec<(String, String, String)> = tx
        .prepare("SELECT id, provider_config, environment FROM agent_sessions")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (id, pc, env) in sessions {
        let (pc, env) = (
            parse(&pc, "agent_sessions.provider_config")?,
            parse(&env, "agent_sessions.environment")?,
        );
        if seal::Sealer::needs_sealing(&pc) || seal::Sealer::needs_sealing(&env) {
            tx.execute(
                "UPDATE agent_sessions SET provider_config = ?2, environment = ?3 WHERE id = ?1",
                params![
                    id,
                    map_to_json(&sealer.seal(&pc)?)?,
                    map_to_json(&sealer.seal(&env)?)?
                ],
            )?;
        }
    }
    let tasks: Vec<(String, String)> = tx
        .prepare("SELECT id, environment FROM tasks")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for (id, env) in tasks {
        let env = parse(&env, "tasks.environment")?;
        if seal::Sealer::needs_sealing(&env) {
            tx.execute(
                "UPDATE tasks SET environment = ?2 WHERE id = ?1",
                params![id, map_to_json(&sealer.seal(&env)?)?],
            )?;
        }
    }
    tx.execute_batch(&format!("PRAGMA user_version = {}", flags | SEALED_FLAG))?;
    tx.commit()?;
    Ok(())
}

fn collect<T>(
    mut rows: Rows<'_>,
    mut f: impl FnMut(&rusqlite::Row) -> Result<T>,
) -> Result<Vec<T>> {
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        out.push(f(row)?);
    }
    Ok(out)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
