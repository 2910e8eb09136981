//! Requests for a human (approvals, questions, client-side tools): one row per request,
//! upserted as it is opened and resolved.

use paddock_core::{Approval, ApprovalState, AskKind, SessionId, Timestamp};
use rusqlite::{params, Connection, Row};

use super::codec::{int, time};
use super::{Result, Store, StoreError};

/// Version 5: requests for a human.
pub(super) const V5: &str = r#"
CREATE TABLE approvals (
    id          TEXT    NOT NULL PRIMARY KEY,
    session_id  TEXT    NOT NULL,
    run         INTEGER NOT NULL,
    key         TEXT    NOT NULL,
    kind        INTEGER NOT NULL,
    tool        TEXT    NOT NULL,
    input       TEXT    NOT NULL,
    summary     TEXT    NOT NULL,
    turn        INTEGER,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    state       INTEGER NOT NULL,
    answer      TEXT    NOT NULL,
    is_error    INTEGER NOT NULL,
    allowed     INTEGER NOT NULL,
    resolved_by TEXT    NOT NULL,
    resolved_at INTEGER
) STRICT;
CREATE INDEX approvals_by_session ON approvals (session_id, created_at);
CREATE INDEX approvals_pending ON approvals (state) WHERE state = 1;
"#;

/// Version 14: the highest run a stored request names (start-up reserves every run up to it)
/// is read from an index instead of every request ever stored.
pub(super) const V14: &str = r#"
CREATE INDEX approvals_by_run ON approvals (run);
"#;

/// The highest run a stored request names (`NULL` when none is stored): the `approvals_by_run`
/// index's last entry.
pub(super) const MAX_REQUEST_RUN: &str = "SELECT MAX(run) FROM approvals";

/// How many resolved requests per session a restarted daemon remembers (for late answers).
pub const RESOLVED_LOADED: i64 = paddock_core::session::machine::RESOLVED_KEPT as i64;

const COLUMNS: &str = "id, session_id, run, key, kind, tool, input, summary, turn, created_at, \
                       expires_at, state, answer, is_error, allowed, resolved_by, resolved_at";

pub(super) fn upsert(conn: &Connection, a: &Approval) -> Result<()> {
    conn.prepare_cached(&format!(
        "INSERT OR REPLACE INTO approvals ({COLUMNS}) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"
    ))?
    .execute(params![
        a.id,
        a.session.0,
        int(a.run),
        a.key,
        a.kind.number(),
        a.tool,
        // Whole: an answer after a restart is rebuilt from it (it is bounded by the agent's
        // 4 MiB line).
        a.input,
        a.summary,
        a.turn.map(int),
        time(a.created_at),
        time(a.expires_at),
        a.state.number(),
        a.answer,
        a.is_error,
        a.allowed,
        a.resolved_by,
        a.resolved_at.map(time),
    ])?;
    Ok(())
}

fn from_row(row: &Row) -> Result<Approval> {
    let corrupt = |what: &str| StoreError::Corrupt(format!("approvals: bad {what}"));
    let u = |i: usize, what: &str| -> Result<u64> {
        let v: i64 = row.get(i)?;
        u64::try_from(v).map_err(|_| corrupt(what))
    };
    let opt = |i: usize, what: &str| -> Result<Option<u64>> {
        let v: Option<i64> = row.get(i)?;
        v.map(|v| u64::try_from(v).map_err(|_| corrupt(what)))
            .transpose()
    };
    Ok(Approval {
        id: row.get(0)?,
        session: SessionId(row.get(1)?),
        run: u(2, "run")?,
        key: row.get(3)?,
        kind: AskKind::from_number(row.get(4)?).ok_or_else(|| corrupt("kind"))?,
        tool: row.get(5)?,
        input: row.get(6)?,
        summary: row.get(7)?,
        turn: opt(8, "turn")?,
        created_at: Timestamp::from_millis(u(9, "created_at")?),
        expires_at: Timestamp::from_millis(u(10, "expires_at")?),
        state: ApprovalState::from_number(row.get(11)?).ok_or_else(|| corrupt("state"))?,
        answer: row.get(12)?,
        is_error: row.get(13)?,
        allowed: row.get(14)?,
        resolved_by: row.get(15)?,
        resolved_at: opt(16, "resolved_at")?.map(Timestamp::from_millis),
    })
}

impl Store {
    /// What a starting daemon gives the engine: every open request, and the most recently
    /// resolved ones (the engine's window of late answers) of each session it restores
    /// ([`Store::load_unsettled_sessions`]).
    pub fn load_approvals(&self) -> Result<Vec<Approval>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT {COLUMNS} FROM ( \
               SELECT *, ROW_NUMBER() OVER (PARTITION BY session_id ORDER BY resolved_at DESC, created_at DESC, id DESC) AS n \
               FROM approvals WHERE state != 1 \
               AND session_id IN ({unsettled})) \
             WHERE n <= ?1 \
             UNION ALL SELECT {COLUMNS} FROM approvals WHERE state = 1 \
             ORDER BY created_at, id",
            unsettled = *super::UNSETTLED_IDS,
        ))?;
        let rows = stmt.query_map([RESOLVED_LOADED], |r| Ok(from_row(r)))?;
        rows.map(|r| r?).collect()
    }

    /// The most recently resolved requests of one session (the window of late answers a
    /// recalled session takes back).
    pub fn resolved_approvals(&self, session: &str) -> Result<Vec<Approval>> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM approvals WHERE session_id = ?1 AND state != 1 \
             ORDER BY resolved_at DESC, created_at DESC, id DESC LIMIT ?2"
        ))?;
        let rows = stmt.query_map(params![session, RESOLVED_LOADED], |r| Ok(from_row(r)))?;
        rows.map(|r| r?).collect()
    }

    /// Requests, newest first: of one session or all, open ones only unless `all`.
    pub fn approvals(
        &self,
        session: Option<&str>,
        all: bool,
        limit: usize,
    ) -> Result<Vec<Approval>> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM approvals \
             WHERE (?1 IS NULL OR session_id = ?1) AND (?2 OR state = 1) \
             ORDER BY created_at DESC, id DESC LIMIT ?3"
        ))?;
        let rows = stmt.query_map(params![session, all, super::codec::limit(limit)], |r| {
            Ok(from_row(r))
        })?;
        rows.map(|r| r?).collect()
    }

    /// One request by id.
    pub fn approval(&self, id: &str) -> Result<Option<Approval>> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!("SELECT {COLUMNS} FROM approvals WHERE id = ?1"))?;
        let mut rows = stmt.query_map([id], |r| Ok(from_row(r)))?;
        rows.next().transpose()?.transpose()
    }

    /// How many requests are open, per session.
    pub fn pending_counts(&self) -> Result<Vec<(String, u64)>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT session_id, COUNT(*) FROM approvals WHERE state = 1 GROUP BY session_id",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        rows.map(|r| {
            let (s, n) = r?;
            Ok((s, n.max(0) as u64))
        })
        .collect()
    }
}
