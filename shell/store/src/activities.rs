//! A batch's activity rows, inserted many to a statement.
//!
//! A fast agent's batch is hundreds of activities in a row. Inserted one statement each, every
//! row paid for a statement's run (its cursor opened and closed, the B-tree searched from its
//! root for the end) and for binding fifteen parameters. Here the rows of a batch wait in
//! [`ActivityInserts`] and go [`GROUP`] to a statement, whose cursor appends each row after
//! the one before; a row of text with nothing of a tool and no carried progress (nearly every
//! row of a turn) binds only the eight columns that vary. With rusqlite alone, 1M rows in
//! batches of 300: 0.80 → 0.67 µs a row.
//!
//! The rows go in the order they came; [`ActivityInserts::flush`] is called before anything
//! else the batch writes, so that a delete or another table's row is never reordered with
//! them.

use std::sync::LazyLock;

use paddock_core::{ActivityEvent, SessionRecord};
use rusqlite::{CachedStatement, ToSql, Transaction};

use crate::codec::{int, time};
use crate::{activity_key, Result};

/// Rows to a statement: past 32 the gain is within noise (0.75 µs a row at 32, 0.74 at 64).
pub(crate) const GROUP: usize = 32;

const INSERT: &str = "INSERT INTO agent_activities \
     (key, turn, ends_turn, type, content, tool_name, tool_call_id, tool_success, \
      tokens_input, tokens_output, at, session_cursor, session_tokens_input, \
      session_tokens_output, session_last_activity_at) VALUES ";

/// Every column bound.
const FULL_ROW: &str = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
/// A plain row: no tool, not carrying its session's progress ([`Shape::Plain`]).
const PLAIN_ROW: &str = "(?, ?, ?, ?, ?, '', '', 0, ?, ?, ?, NULL, NULL, NULL, NULL)";

fn insert_of(row: &str, rows: usize) -> String {
    format!("{INSERT}{}", vec![row; rows].join(", "))
}

static FULL_ONE: LazyLock<String> = LazyLock::new(|| insert_of(FULL_ROW, 1));
static FULL_GROUP: LazyLock<String> = LazyLock::new(|| insert_of(FULL_ROW, GROUP));
static PLAIN_ONE: LazyLock<String> = LazyLock::new(|| insert_of(PLAIN_ROW, 1));
static PLAIN_GROUP: LazyLock<String> = LazyLock::new(|| insert_of(PLAIN_ROW, GROUP));

/// Which columns a row binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Full,
    Plain,
}

impl Shape {
    fn of(ev: &ActivityEvent, progress: Option<&SessionRecord>) -> Shape {
        let a = &ev.activity;
        if progress.is_none()
            && a.tool_name.is_empty()
            && a.tool_call_id.is_empty()
            && !a.tool_success
        {
            Shape::Plain
        } else {
            Shape::Full
        }
    }

    /// Its statement for one row or for a group of [`GROUP`], and where the batch keeps it in
    /// [`ActivityInserts::statements`].
    fn statement(self, group: bool) -> (usize, &'static str) {
        match (self, group) {
            (Shape::Full, false) => (0, &FULL_ONE),
            (Shape::Full, true) => (1, &FULL_GROUP),
            (Shape::Plain, false) => (2, &PLAIN_ONE),
            (Shape::Plain, true) => (3, &PLAIN_GROUP),
        }
    }
}

/// One row waiting: its key, its event, and the session's progress it carries.
type Pending<'r> = (i64, &'r ActivityEvent, Option<&'r SessionRecord>);

/// The activity rows of one batch, waiting to be inserted in groups (module docs).
pub(crate) struct ActivityInserts<'c, 'r> {
    tx: &'c Transaction<'c>,
    /// Rows of one shape, in their order; at most [`GROUP`].
    pending: Vec<Pending<'r>>,
    shape: Shape,
    /// Taken from the statement cache once a batch: looking a statement up by its text (a
    /// group's is 2 KiB) is not done per group.
    statements: [Option<CachedStatement<'c>>; 4],
}

impl<'c, 'r> ActivityInserts<'c, 'r> {
    pub(crate) fn new(tx: &'c Transaction<'c>) -> Self {
        ActivityInserts {
            tx,
            pending: Vec::with_capacity(GROUP),
            shape: Shape::Plain,
            statements: [None, None, None, None],
        }
    }

    /// Queues the activity `ev` of the session whose key is `session`, with the session's
    /// progress it carries.
    pub(crate) fn push(
        &mut self,
        session: i64,
        ev: &'r ActivityEvent,
        progress: Option<&'r SessionRecord>,
    ) -> Result<()> {
        let key = activity_key(session, ev.seq)?;
        let shape = Shape::of(ev, progress);
        if shape != self.shape {
            self.flush()?;
            self.shape = shape;
        }
        self.pending.push((key, ev, progress));
        if self.pending.len() == GROUP {
            self.flush()?;
        }
        Ok(())
    }

    /// Inserts every row waiting.
    pub(crate) fn flush(&mut self) -> Result<()> {
        let rows = std::mem::take(&mut self.pending);
        let result = if rows.len() == GROUP {
            self.insert(&rows, true)
        } else {
            rows.chunks(1).try_for_each(|row| self.insert(row, false))
        };
        self.pending = rows;
        self.pending.clear();
        result
    }

    fn insert(&mut self, rows: &[Pending<'r>], group: bool) -> Result<()> {
        let shape = self.shape;
        let (index, sql) = shape.statement(group);
        let stmt = match &mut self.statements[index] {
            Some(stmt) => stmt,
            slot => slot.insert(self.tx.prepare_cached(sql)?),
        };
        let mut at = 1;
        let mut bind = |value: &dyn ToSql| -> rusqlite::Result<()> {
            stmt.raw_bind_parameter(at, value)?;
            at += 1;
            Ok(())
        };
        for &(key, ev, progress) in rows {
            let a = &ev.activity;
            bind(&key)?;
            bind(&ev.turn.map(int))?;
            bind(&ev.ends_turn)?;
            bind(&a.kind().number())?;
            bind(&a.content)?;
            if shape == Shape::Full {
                bind(&a.tool_name)?;
                bind(&a.tool_call_id)?;
                bind(&a.tool_success)?;
            }
            bind(&int(a.tokens_input))?;
            bind(&int(a.tokens_output))?;
            bind(&time(ev.at))?;
            if shape == Shape::Full {
                bind(&progress.map(|r| int(r.provider_cursor)))?;
                bind(&progress.map(|r| int(r.tokens_input)))?;
                bind(&progress.map(|r| int(r.tokens_output)))?;
                bind(&progress.and_then(|r| r.last_activity_at).map(time))?;
            }
        }
        stmt.raw_execute()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_binds_every_placeholder_of_its_rows() {
        for (shape, per_row) in [(Shape::Full, 15), (Shape::Plain, 8)] {
            for (group, rows) in [(false, 1), (true, GROUP)] {
                let (_, sql) = shape.statement(group);
                assert_eq!(sql.matches('?').count(), per_row * rows, "{sql}");
            }
        }
    }
}
