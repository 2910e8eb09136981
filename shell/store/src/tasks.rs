//! Aria tasks and their output.

use paddock_core::task::{OutputKind, TaskOutput, TaskRecord, TaskSpec, TaskStatus};
use paddock_core::Timestamp;
use rusqlite::{named_params, params, Connection, OptionalExtension, Row};

use super::{Result, Store, StoreError};

/// Version 2: tasks and their output.
pub(super) const V2: &str = r#"
CREATE TABLE tasks (
    id                TEXT    NOT NULL PRIMARY KEY,
    session_id        TEXT    NOT NULL,
    type              TEXT    NOT NULL,
    command_json      TEXT    NOT NULL,
    environment       TEXT    NOT NULL DEFAULT '{}',
    timeout_ms        INTEGER NOT NULL,
    working_dir       TEXT    NOT NULL,
    status            INTEGER NOT NULL,
    created_at        INTEGER NOT NULL,
    started_at        INTEGER,
    completed_at      INTEGER,
    exit_code         INTEGER,
    error_message     TEXT,
    progress_centi    INTEGER NOT NULL,
    current_operation TEXT    NOT NULL,
    pid               INTEGER,
    output_bytes      INTEGER NOT NULL,
    last_output_seq   INTEGER NOT NULL,
    truncated         INTEGER NOT NULL
) STRICT;
CREATE INDEX tasks_by_session ON tasks (session_id);

CREATE TABLE task_output (
    task_id   TEXT    NOT NULL,
    seq       INTEGER NOT NULL,
    stream    TEXT    NOT NULL CHECK (stream IN ('stdout', 'stderr', 'progress')),
    text      TEXT    NOT NULL,
    progress  INTEGER,
    at        INTEGER NOT NULL,
    PRIMARY KEY (task_id, seq)
) STRICT;
"#;

/// Version 7: who launched a task (Aria's `Task.user_id`: the client's user, not the daemon's).
pub(super) const V7: &str = r#"
ALTER TABLE tasks ADD COLUMN user_id TEXT NOT NULL DEFAULT '';
"#;

/// Version 15: start-up reads the tasks that have not ended (PENDING = 1, RUNNING = 2) from an
/// index of them, and a listing reads the newest tasks (all, a session's, a container's) from
/// one by creation, instead of every task ever run.
pub(super) const V15: &str = r#"
CREATE INDEX tasks_live ON tasks (id) WHERE status IN (1, 2);
CREATE INDEX tasks_by_created ON tasks (created_at, id);
CREATE INDEX tasks_by_session_created ON tasks (session_id, created_at, id);
CREATE INDEX tasks_by_container ON tasks (container_id, created_at, id);
DROP INDEX tasks_by_session;
"#;

static SELECT_UNENDED_TASKS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT {TASK_COLUMNS} FROM tasks WHERE status IN ({}, {}) ORDER BY id",
        TaskStatus::Pending.number(),
        TaskStatus::Running.number()
    )
});

static SELECT_NEWEST_TASKS: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!("SELECT {TASK_COLUMNS} FROM tasks ORDER BY created_at DESC, id DESC LIMIT ?1")
});

/// Whose tasks a listing reads ([`Store::newest_tasks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TasksOf {
    All,
    /// The tasks of a session (`TaskSpec::session_id`).
    Session(String),
    /// The tasks run in an Aria container (`TaskSpec::container_id`).
    Container(String),
}

static SELECT_NEWEST_TASKS_IN: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT {TASK_COLUMNS} FROM tasks WHERE container_id = ?1 \
         ORDER BY created_at DESC, id DESC LIMIT ?2"
    )
});

static SELECT_NEWEST_TASKS_OF: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT {TASK_COLUMNS} FROM tasks WHERE session_id = ?1 \
         ORDER BY created_at DESC, id DESC LIMIT ?2"
    )
});

const TASK_COLUMNS: &str = "id, session_id, type, command_json, environment, timeout_ms, \
     working_dir, status, created_at, started_at, completed_at, exit_code, error_message, \
     progress_centi, current_operation, pid, output_bytes, last_output_seq, truncated, user_id, \
     container_id, parent_task_id";

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A task's progress where its status is as stored. The status is matched, not set: SQLite
/// rewrites the entry of a partial index (`tasks_live`) whenever an UPDATE sets one of its
/// columns, equal or not, and a running task's record is written with every batch of its
/// output. Nothing of its spec is encoded or sealed again either.
const UPDATE_TASK_PROGRESS: &str = "UPDATE tasks SET started_at = :started_at, \
     completed_at = :completed_at, exit_code = :exit_code, error_message = :error_message, \
     progress_centi = :progress_centi, current_operation = :current_operation, pid = :pid, \
     output_bytes = :output_bytes, last_output_seq = :last_output_seq, truncated = :truncated \
     WHERE id = :id AND status = :status";

/// A task's whole row ([`TASK_COLUMNS`], each bound by its name).
static UPSERT_TASK: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let names: Vec<String> = TASK_COLUMNS
        .split(", ")
        .map(|c| format!(":{}", c.trim()))
        .collect();
    format!(
        "INSERT INTO tasks ({TASK_COLUMNS}) VALUES ({}) \
         ON CONFLICT(id) DO UPDATE SET status=excluded.status, \
         started_at=excluded.started_at, completed_at=excluded.completed_at, \
         exit_code=excluded.exit_code, error_message=excluded.error_message, \
         progress_centi=excluded.progress_centi, \
         current_operation=excluded.current_operation, pid=excluded.pid, \
         output_bytes=excluded.output_bytes, last_output_seq=excluded.last_output_seq, \
         truncated=excluded.truncated",
        names.join(", ")
    )
});

/// Stores a task's record: its progress when its status is as stored ([`UPDATE_TASK_PROGRESS`]),
/// else the whole row (a new task, or a new status).
pub(super) fn upsert(
    conn: &Connection,
    sealer: &super::seal::Sealer,
    t: &TaskRecord,
) -> Result<()> {
    let (started, completed) = (
        t.started_at.map(|t| i(t.millis())),
        t.completed_at.map(|t| i(t.millis())),
    );
    let (output_bytes, last_output_seq) = (i(t.output_bytes), i(t.last_output_seq));
    let progress = named_params! {
        ":id": t.id,
        ":status": t.status.number(),
        ":started_at": started,
        ":completed_at": completed,
        ":exit_code": t.exit_code,
        ":error_message": t.error_message,
        ":progress_centi": t.progress_centi,
        ":current_operation": t.current_operation,
        ":pid": t.pid,
        ":output_bytes": output_bytes,
        ":last_output_seq": last_output_seq,
        ":truncated": t.truncated,
    };
    if conn
        .prepare_cached(UPDATE_TASK_PROGRESS)?
        .execute(progress)?
        == 1
    {
        return Ok(());
    }
    let command = serde_json::to_string(&t.spec.command).expect("json");
    let environment = serde_json::to_string(&sealer.seal(&t.spec.environment)?).expect("json");
    let (timeout_ms, created) = (i(t.spec.timeout_ms), i(t.created_at.millis()));
    let mut row = progress.to_vec();
    row.extend_from_slice(named_params! {
        ":session_id": t.spec.session_id,
        ":type": t.spec.kind,
        ":command_json": command,
        ":environment": environment,
        ":timeout_ms": timeout_ms,
        ":working_dir": t.spec.working_dir,
        ":created_at": created,
        ":user_id": t.spec.user,
        ":container_id": t.spec.container_id,
        ":parent_task_id": t.spec.parent_task_id,
    });
    conn.prepare_cached(&UPSERT_TASK)?.execute(row.as_slice())?;
    Ok(())
}

/// Appends one output row.
pub(super) fn insert_output(conn: &Connection, o: &TaskOutput) -> Result<()> {
    {
        {
            let (stream, text, progress) = match &o.kind {
                OutputKind::Stdout(s) => ("stdout", s.as_str(), None),
                OutputKind::Stderr(s) => ("stderr", s.as_str(), None),
                OutputKind::Progress { centi, operation } => {
                    ("progress", operation.as_str(), Some(*centi))
                }
            };
            conn.prepare_cached(
                "INSERT INTO task_output (task_id, seq, stream, text, progress, at) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                o.task,
                i(o.seq),
                stream,
                text,
                progress,
                i(o.at.millis())
            ])?;
        }
    }
    Ok(())
}

fn u(row: &Row, idx: usize, col: &str) -> Result<u64> {
    let v: i64 = row.get(idx)?;
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("tasks.{col}: negative value {v}")))
}

fn task_from_row(sealer: &super::seal::Sealer, row: &Row) -> Result<TaskRecord> {
    let status: i32 = row.get(7)?;
    let command: String = row.get(3)?;
    let env: String = row.get(4)?;
    Ok(TaskRecord {
        id: row.get(0)?,
        spec: TaskSpec {
            session_id: row.get(1)?,
            kind: row.get(2)?,
            command: serde_json::from_str(&command)
                .map_err(|e| StoreError::Corrupt(format!("tasks.command_json: {e}")))?,
            environment: sealer.open(
                serde_json::from_str(&env)
                    .map_err(|e| StoreError::Corrupt(format!("tasks.environment: {e}")))?,
            ),
            timeout_ms: u(row, 5, "timeout_ms")?,
            working_dir: row.get(6)?,
            user: row.get(19)?,
            container_id: row.get(20)?,
            parent_task_id: row.get(21)?,
        },
        status: TaskStatus::from_number(status)
            .ok_or_else(|| StoreError::Corrupt(format!("tasks.status: unknown {status}")))?,
        created_at: Timestamp::from_millis(u(row, 8, "created_at")?),
        started_at: row
            .get::<_, Option<i64>>(9)?
            .map(|v| Timestamp::from_millis(v.max(0) as u64)),
        completed_at: row
            .get::<_, Option<i64>>(10)?
            .map(|v| Timestamp::from_millis(v.max(0) as u64)),
        exit_code: row.get(11)?,
        error_message: row.get(12)?,
        progress_centi: row.get(13)?,
        current_operation: row.get(14)?,
        pid: row.get(15)?,
        output_bytes: u(row, 16, "output_bytes")?,
        last_output_seq: u(row, 17, "last_output_seq")?,
        truncated: row.get(18)?,
    })
}

impl Store {
    /// Every Aria container.
    pub fn load_containers(&self) -> Result<Vec<paddock_core::container::ContainerRecord>> {
        load_containers(&self.conn, &self.sealer)
    }

    /// The tasks a starting daemon must decide on, in id order: those that had not ended
    /// (through `tasks_live`; ended ones stay in the store, 10,000 of them cost the start-up
    /// nothing).
    pub fn load_unended_tasks(&self) -> Result<Vec<TaskRecord>> {
        let mut stmt = self.conn.prepare_cached(&SELECT_UNENDED_TASKS)?;
        let rows = stmt.query([])?;
        self.tasks_of(rows)
    }

    /// The newest `limit` tasks (by creation, then id) of `of`, and whether older ones follow.
    pub fn newest_tasks(&self, of: &TasksOf, limit: usize) -> Result<(Vec<TaskRecord>, bool)> {
        // One more than the page, to know whether more follow.
        let n = i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX);
        let mut tasks = match of {
            TasksOf::All => {
                let mut stmt = self.conn.prepare_cached(&SELECT_NEWEST_TASKS)?;
                let rows = stmt.query([n])?;
                self.tasks_of(rows)?
            }
            TasksOf::Session(s) => {
                let mut stmt = self.conn.prepare_cached(&SELECT_NEWEST_TASKS_OF)?;
                let rows = stmt.query(params![s, n])?;
                self.tasks_of(rows)?
            }
            TasksOf::Container(c) => {
                let mut stmt = self.conn.prepare_cached(&SELECT_NEWEST_TASKS_IN)?;
                let rows = stmt.query(params![c, n])?;
                self.tasks_of(rows)?
            }
        };
        let more = tasks.len() > limit;
        tasks.truncate(limit);
        Ok((tasks, more))
    }

    fn tasks_of(&self, mut rows: rusqlite::Rows<'_>) -> Result<Vec<TaskRecord>> {
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            out.push(task_from_row(&self.sealer, r)?);
        }
        Ok(out)
    }

    pub fn task(&self, id: &str) -> Result<Option<TaskRecord>> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?1"))?;
        let row = stmt
            .query_row([id], |r| Ok(task_from_row(&self.sealer, r)))
            .optional()?;
        row.transpose()
    }

    /// A task's output after `after_seq`, at most `limit` rows.
    pub fn task_output(&self, id: &str, after_seq: u64, limit: usize) -> Result<Vec<TaskOutput>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT seq, stream, text, progress, at FROM task_output \
             WHERE task_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
        )?;
        let mut rows = stmt.query(params![
            id,
            i(after_seq),
            i64::try_from(limit).unwrap_or(i64::MAX)
        ])?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            let stream: String = r.get(1)?;
            let text: String = r.get(2)?;
            let kind = match stream.as_str() {
                "stdout" => OutputKind::Stdout(text),
                "stderr" => OutputKind::Stderr(text),
                _ => OutputKind::Progress {
                    centi: r.get::<_, Option<u32>>(3)?.unwrap_or(0),
                    operation: text,
                },
            };
            out.push(TaskOutput {
                task: id.to_string(),
                seq: u(r, 0, "seq")?,
                kind,
                at: Timestamp::from_millis(u(r, 4, "at")?),
            });
        }
        Ok(out)
    }
}

/// Upserts an Aria container.
pub(super) fn upsert_container(
    conn: &Connection,
    sealer: &super::seal::Sealer,
    c: &paddock_core::container::ContainerRecord,
) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO containers (id, name, image, driver, network, environment, persistent, \
         session_id, user_id, working_dir, state, created_at, error) \
         VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13) \
         ON CONFLICT(id) DO UPDATE SET state=excluded.state, error=excluded.error",
    )?
    .execute(params![
        c.id,
        c.spec.name,
        c.spec.image,
        c.spec.driver.name(),
        c.spec.network,
        serde_json::to_string(&sealer.seal(&c.spec.environment)?).expect("json"),
        c.spec.persistent,
        c.spec.session.as_ref().map(|s| s.0.as_str()),
        c.spec.user,
        c.spec.working_dir,
        c.state.number(),
        i(c.created_at.millis()),
        c.error,
    ])?;
    Ok(())
}

pub(super) fn remove_container(conn: &Connection, id: &str) -> Result<()> {
    conn.prepare_cached("DELETE FROM containers WHERE id = ?1")?
        .execute([id])?;
    Ok(())
}

/// Every container, for the engine at start-up.
pub(super) fn load_containers(
    conn: &Connection,
    sealer: &super::seal::Sealer,
) -> Result<Vec<paddock_core::container::ContainerRecord>> {
    use paddock_core::container::{ContainerRecord, ContainerSpec, ContainerState};
    let mut stmt = conn.prepare_cached(
        "SELECT id, name, image, driver, network, environment, persistent, session_id, \
         user_id, working_dir, state, created_at, error FROM containers ORDER BY id",
    )?;
    let mut rows = stmt.query([])?;
    let mut out = Vec::new();
    while let Some(row) = rows.next()? {
        let driver: String = row.get(3)?;
        let env: String = row.get(5)?;
        let state: i64 = row.get(10)?;
        out.push(ContainerRecord {
            id: row.get(0)?,
            spec: ContainerSpec {
                name: row.get(1)?,
                image: row.get(2)?,
                driver: paddock_core::Driver::parse(&driver).ok_or_else(|| {
                    StoreError::Corrupt(format!("containers.driver: unknown {driver:?}"))
                })?,
                network: row.get(4)?,
                environment: sealer
                    .open(serde_json::from_str(&env).map_err(|e| {
                        StoreError::Corrupt(format!("containers.environment: {e}"))
                    })?),
                persistent: row.get(6)?,
                session: row
                    .get::<_, Option<String>>(7)?
                    .map(paddock_core::SessionId),
                user: row.get(8)?,
                working_dir: row.get(9)?,
            },
            state: ContainerState::from_number(state)
                .ok_or_else(|| StoreError::Corrupt(format!("containers.state: unknown {state}")))?,
            created_at: Timestamp::from_millis(u(row, 11, "created_at")?),
            error: row.get(12)?,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_core::Record;

    #[test]
    fn tasks_and_output_round_trip() {
        let mut store = Store::open_in_memory().unwrap();
        let rec = TaskRecord {
            id: "task_1".into(),
            spec: TaskSpec {
                session_id: "s".into(),
                kind: "command".into(),
                command: vec!["echo".into(), "hi".into()],
                environment: [("A".to_string(), "1".to_string())].into_iter().collect(),
                timeout_ms: 5000,
                working_dir: "/tmp".into(),
                user: "alice".into(),
                container_id: "ctr_1".into(),
                parent_task_id: "task_0".into(),
            },
            status: TaskStatus::Running,
            created_at: paddock_core::Timestamp::from_millis(1),
            started_at: Some(paddock_core::Timestamp::from_millis(2)),
            completed_at: None,
            exit_code: None,
            error_message: None,
            progress_centi: 4250,
            current_operation: "building".into(),
            pid: Some(77),
            output_bytes: 3,
            last_output_seq: 2,
            truncated: false,
        };
        let out1 = TaskOutput {
            task: "task_1".into(),
            seq: 1,
            kind: OutputKind::Stdout("hi".into()),
            at: paddock_core::Timestamp::from_millis(3),
        };
        let out2 = TaskOutput {
            task: "task_1".into(),
            seq: 2,
            kind: OutputKind::Progress {
                centi: 4250,
                operation: "building".into(),
            },
            at: paddock_core::Timestamp::from_millis(4),
        };
        store
            .apply_all(
                &[
                    Record::Task(Box::new(rec.clone())),
                    Record::TaskOutput(out1.clone()),
                    Record::TaskOutput(out2.clone()),
                ],
                &[],
            )
            .unwrap();
        assert_eq!(store.load_unended_tasks().unwrap(), vec![rec.clone()]);
        assert_eq!(store.task("task_1").unwrap(), Some(rec));
        assert_eq!(
            store.task_output("task_1", 0, 10).unwrap(),
            vec![out1, out2.clone()]
        );
        assert_eq!(store.task_output("task_1", 1, 10).unwrap(), vec![out2]);
        assert_eq!(store.task("nope").unwrap(), None);
    }

    #[test]
    fn a_running_tasks_progress_leaves_the_index_of_live_tasks_alone() {
        use crate::tests::{opcodes, touches_an_index};
        let mut store = Store::open_in_memory().unwrap();
        assert!(touches_an_index(&opcodes(&store.conn, &UPSERT_TASK)));
        assert!(!touches_an_index(&opcodes(
            &store.conn,
            UPDATE_TASK_PROGRESS
        )));
        let at = paddock_core::Timestamp::from_millis;
        let spec = TaskSpec {
            session_id: "s".into(),
            command: vec!["make".into()],
            environment: [("TOKEN".to_string(), "secret".to_string())]
                .into_iter()
                .collect(),
            ..TaskSpec::default()
        };
        let mut t = TaskRecord::new("t".into(), spec, at(1));
        let mut write = |t: &TaskRecord| {
            store
                .apply_all(&[Record::Task(Box::new(t.clone()))], &[])
                .unwrap();
            (
                store.task("t").unwrap(),
                store.load_unended_tasks().unwrap(),
            )
        };
        assert_eq!(write(&t), (Some(t.clone()), vec![t.clone()]));
        // Started: a new status, the whole row.
        t.status = TaskStatus::Running;
        t.started_at = Some(at(2));
        t.pid = Some(41);
        assert_eq!(write(&t), (Some(t.clone()), vec![t.clone()]));
        // Its output and progress: the status as stored, only the progress.
        t.output_bytes = 300;
        t.last_output_seq = 9;
        t.progress_centi = 5000;
        t.current_operation = "linking".into();
        assert_eq!(write(&t), (Some(t.clone()), vec![t.clone()]));
        // Ended: the whole row again, and it leaves the live ones.
        t.status = TaskStatus::Completed;
        t.completed_at = Some(at(3));
        t.exit_code = Some(0);
        t.pid = None;
        assert_eq!(write(&t), (Some(t.clone()), vec![]));
    }

    #[test]
    fn start_up_loads_the_unended_tasks_and_listings_page_the_newest() {
        let mut store = Store::open_in_memory().unwrap();
        let task = |id: &str, session: &str, status: TaskStatus, created: u64| {
            let spec = TaskSpec {
                session_id: session.into(),
                container_id: session.replace('s', "c"),
                command: vec!["true".into()],
                ..TaskSpec::default()
            };
            let at = paddock_core::Timestamp::from_millis;
            let mut t = TaskRecord::new(id.into(), spec, at(created));
            t.status = status;
            t.completed_at = status.is_terminal().then(|| at(created + 1));
            t
        };
        let tasks = [
            task("t1", "s1", TaskStatus::Completed, 10),
            task("t2", "s2", TaskStatus::Running, 20),
            task("t3", "s1", TaskStatus::Failed, 30),
            task("t4", "s1", TaskStatus::Pending, 30), // same creation: by id
            task("t5", "s2", TaskStatus::Cancelled, 40),
        ];
        let batch: Vec<Record> = tasks
            .iter()
            .map(|t| Record::Task(Box::new(t.clone())))
            .collect();
        store.apply(&batch).unwrap();
        let ids = |v: Vec<TaskRecord>| v.into_iter().map(|t| t.id).collect::<Vec<_>>();
        assert_eq!(ids(store.load_unended_tasks().unwrap()), ["t2", "t4"]);
        let page = |of: TasksOf, limit| {
            let (v, more) = store.newest_tasks(&of, limit).unwrap();
            (ids(v), more)
        };
        let s = |id: &str| TasksOf::Session(id.into());
        assert_eq!(
            page(TasksOf::All, 3),
            (vec!["t5".into(), "t4".into(), "t3".into()], true)
        );
        assert!(!page(TasksOf::All, 5).1);
        assert_eq!(page(s("s1"), 2), (vec!["t4".into(), "t3".into()], true));
        assert_eq!(page(s("s1"), 10).0, ["t4", "t3", "t1"]);
        assert_eq!(page(s("none"), 10), (vec![], false));
        assert_eq!(page(TasksOf::Container("c2".into()), 10).0, ["t5", "t2"]);
        // Each from its index: no scan of the tasks, no sort.
        for (sql, index) in [
            (&*super::SELECT_UNENDED_TASKS, "tasks_live"),
            (&*super::SELECT_NEWEST_TASKS, "tasks_by_created"),
            (&*super::SELECT_NEWEST_TASKS_OF, "tasks_by_session_created"),
            (&*super::SELECT_NEWEST_TASKS_IN, "tasks_by_container"),
        ] {
            let steps = crate::tests::query_plan(&store.conn, sql);
            assert!(
                steps.iter().any(|s| s.contains(index))
                    && steps.iter().all(|s| !s.contains("TEMP B-TREE")),
                "{sql}: {steps:#?}"
            );
        }
    }

    #[test]
    fn containers_round_trip_with_their_variables_sealed() {
        use paddock_core::container::{ContainerRecord, ContainerSpec, ContainerState};
        let mut store = Store::open_in_memory().unwrap();
        let c = ContainerRecord {
            id: "ctr_1".into(),
            spec: ContainerSpec {
                name: "build".into(),
                image: "/srv/rootfs".into(),
                driver: paddock_core::Driver::Podman,
                network: true,
                environment: [("API_TOKEN".to_string(), "s3cret".to_string())]
                    .into_iter()
                    .collect(),
                persistent: true,
                session: Some(paddock_core::SessionId("sess_1".into())),
                user: "alice".into(),
                working_dir: "/work".into(),
            },
            state: ContainerState::Running,
            created_at: Timestamp::from_millis(42),
            error: None,
        };
        store
            .apply(&[paddock_core::Record::Container(Box::new(c.clone()))])
            .unwrap();
        assert_eq!(store.load_containers().unwrap(), vec![c.clone()]);
        let raw: String = store
            .conn
            .query_row("SELECT environment FROM containers", [], |r| r.get(0))
            .unwrap();
        assert!(!raw.contains("s3cret"), "sealed: {raw}");
        store
            .apply(&[paddock_core::Record::RemoveContainer("ctr_1".into())])
            .unwrap();
        assert!(store.load_containers().unwrap().is_empty());
    }
}
