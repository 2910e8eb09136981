//! The store's tests: round trips, paging, atomicity, migrations, crash survival.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use paddock_core::{
    Activity, ActivityEvent, ActivityKind, Error, ErrorCode, Provider, Record, SessionConfig,
    SessionId, SessionRecord, Status, StatusEvent, UserMessage,
};
use rusqlite::Connection;

use super::codec::{self, ACTIVITY_COLUMNS, SESSION_COLUMNS};
use super::migrations::{self, MIGRATIONS};
use super::*;

/// A unique directory under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "paddock-store-{}-{}-{tag}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    fn db(&self) -> PathBuf {
        self.0.join("paddock.db")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn full_record(id: &str) -> SessionRecord {
    let mut config = SessionConfig::new("camp-1", Provider::Codex, "/srv/campaigns/it's \"here\"");
    config.model = "gpt-5-codex".into();
    config.agent_name = "builder ✓".into();
    config.festival_id = "fest-7".into();
    config.task_id = "task-42".into();
    config.provider_config = paddock_core::ProviderConfig::parse(BTreeMap::from([
        ("effort".to_string(), "high".to_string()),
        ("quote".to_string(), "a \"b\" \\ c\nd".to_string()),
        ("permissions".to_string(), "ask:Read".to_string()),
    ]))
    .expect("valid settings");
    config.environment = BTreeMap::from([("FOO".to_string(), "bar=baz".to_string())]);
    config.max_tokens = 100_000;
    config.timeout_ms = 3_600_000;
    config.initial_message = "build the thing\nthen test it".into();
    config.env = paddock_core::EnvSpec {
        driver: paddock_core::Driver::Podman,
        worktree: true,
        network: true,
        image: "/srv/rootfs".into(),
        memory_bytes: 1 << 30,
        pids: 64,
        podman: Box::new(paddock_core::PodmanOptions {
            mounts: vec!["/usr:/usr:ro".into()],
            ports: vec!["8080:80".into()],
            flags: vec!["--userns=keep-id".into()],
            env: BTreeMap::from([("TOKEN".to_string(), "secret".to_string())]),
        }),
        // Every field set, to see each one round-trip (a real spec has one driver's block).
        qemu: Some(Box::new(paddock_core::QemuOptions {
            cpus: 4,
            flags: vec!["-enable-kvm".into()],
        })),
        ssh: Some(Box::new(paddock_core::SshTarget {
            host: "build.example".into(),
            port: 2222,
            user: "ci".into(),
            key_file: "/home/u/.ssh/id_ed25519".into(),
            known_hosts: "/home/u/.ssh/known_hosts".into(),
            accept_new_host_key: true,
            paddock: "/opt/paddock".into(),
            remote_dir: "~/.paddock".into(),
            workdir: "/srv/repo".into(),
        })),
        kubernetes: Some(Box::new(paddock_core::KubeOptions {
            namespace: "agents".into(),
            service_account: "paddock".into(),
            pod_spec: r#"{"containers":[{"name":"agent","image":"debian:12"}]}"#.into(),
            kubeconfig: "/home/u/.kube/config".into(),
            context: "team".into(),
        })),
    };
    SessionRecord {
        id: SessionId(id.to_string()),
        config: config.into(),
        status: Status::Failed,
        tokens_input: 12_345,
        tokens_output: 678,
        pid: Some(u32::MAX),
        restart_count: 2,
        created_at: paddock_core::Timestamp::from_millis(1_700_000_000_000),
        started_at: Some(paddock_core::Timestamp::from_millis(1_700_000_000_500)),
        last_activity_at: Some(paddock_core::Timestamp::from_millis(1_700_000_100_000)),
        ended_at: Some(paddock_core::Timestamp::from_millis(1_700_000_200_000)),
        error: Some(Error::new(
            ErrorCode::BudgetExceeded,
            "token budget exceeded: 100001 > 100000",
        )),
        provider_session: Some("thread-abc".into()),
        last_activity_seq: 17,
        last_status_seq: 9,
        turns: 3,
        turn_open: true,
        run: Some(7),
        provider_cursor: 12345,
        last_turn_failed: false,
        env_state: paddock_core::EnvState::Failed,
        disconnected: true,
        closed_by_client: true,
    }
}

fn bare_record(id: &str) -> SessionRecord {
    SessionRecord {
        id: SessionId(id.to_string()),
        config: SessionConfig::new("", Provider::Scripted, "").into(),
        status: Status::Created,
        tokens_input: 0,
        tokens_output: 0,
        pid: None,
        restart_count: 0,
        created_at: paddock_core::Timestamp::from_millis(0),
        started_at: None,
        last_activity_at: None,
        ended_at: None,
        error: None,
        provider_session: None,
        last_activity_seq: 0,
        last_status_seq: 0,
        turns: 0,
        turn_open: false,
        run: None,
        provider_cursor: 0,
        last_turn_failed: false,
        env_state: paddock_core::EnvState::Ready,
        disconnected: false,
        closed_by_client: false,
    }
}

fn activity(session: &str, seq: u64) -> ActivityEvent {
    let kind = ActivityKind::ALL[(seq as usize) % ActivityKind::ALL.len()];
    let mut a = Activity::new(kind, format!("activity {seq} of {session}"))
        .with_tokens(seq, seq * 2)
        .with_tool("bash", format!("call-{seq}"));
    a.tool_success = seq.is_multiple_of(2);
    ActivityEvent {
        session: SessionId(session.to_string()),
        seq,
        turn: if seq.is_multiple_of(3) {
            None
        } else {
            Some(seq / 3 + 1)
        },
        ends_turn: kind.ends_turn(),
        activity: a,
        at: paddock_core::Timestamp::from_millis(1_700_000_000_000 + seq),
    }
}

/// [`activity`] as the record a batch stores.
fn activity_record(session: &str, seq: u64) -> Record {
    Record::Activity(Arc::new(activity(session, seq)))
}

fn status_event(session: &str, seq: u64) -> StatusEvent {
    StatusEvent {
        session: SessionId(session.to_string()),
        seq,
        previous: if seq == 1 {
            None
        } else {
            Some(Status::ALL[(seq as usize) % Status::ALL.len()])
        },
        new: Status::ALL[(seq as usize + 1) % Status::ALL.len()],
        message: format!("status {seq}"),
        at: paddock_core::Timestamp::from_millis(1_700_000_000_000 + seq),
    }
}

fn user_message(session: &str, turn: u64) -> UserMessage {
    UserMessage {
        session: SessionId(session.to_string()),
        turn,
        text: format!("message {turn}"),
        at: paddock_core::Timestamp::from_millis(1_700_000_000_000 + turn),
    }
}

fn count(store: &Store, table: &str) -> i64 {
    store
        .conn
        .query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
        .unwrap()
}

#[test]
fn a_turns_tokens_are_read_back_to_its_start() {
    let mut store = Store::open_in_memory().unwrap();
    // Turns 1, 2, 3 of "s" (seq 1-2, 4-5, 7-8; those between carry none), and another
    // session's turn 1.
    let mut batch: Vec<Record> = (1..=9).map(|seq| activity_record("s", seq)).collect();
    batch.extend((1..=3).map(|seq| activity_record("other", seq)));
    store.apply(&batch).unwrap();
    // As a filter on the turn over every activity reads them.
    let summed = |session: &str, turn: u64| -> (u64, u64) {
        let (i, o): (i64, i64) = store
            .conn
            .query_row(
                "SELECT COALESCE(SUM(tokens_input), 0), COALESCE(SUM(tokens_output), 0) \
                 FROM agent_activities AS a JOIN session_keys AS k ON a.key >> 32 = k.key \
                 WHERE session_id = ?1 AND turn = ?2",
                rusqlite::params![session, turn as i64],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        (i as u64, o as u64)
    };
    assert_eq!(store.turn_tokens("s", 3).unwrap(), (7 + 8, 14 + 16));
    for (session, turn) in [
        ("s", 1),
        ("s", 2),
        ("s", 3),
        ("s", 4),
        ("other", 1),
        ("none", 1),
    ] {
        assert_eq!(
            store.turn_tokens(session, turn).unwrap(),
            summed(session, turn),
            "{session} turn {turn}"
        );
    }
}

#[test]
fn the_writer_waits_for_a_lock_held_elsewhere() {
    // As the checkpointer's restart holds the writer lock: the store's write waits for it (in
    // short steps, `busy_wait`) and goes through once it is released.
    let dir = TempDir::new("busy");
    let mut store = Store::open(&dir.db()).unwrap();
    let other = Connection::open(dir.db()).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let held = std::time::Duration::from_millis(60);
    // When the other connection begins to let go (the write may be through before its
    // COMMIT returns).
    let release = std::thread::spawn(move || {
        std::thread::sleep(held);
        let releasing = Instant::now();
        other.execute_batch("COMMIT").unwrap();
        releasing
    });
    store.apply(&[activity_record("s", 1)]).unwrap();
    let written = Instant::now();
    let releasing = release.join().unwrap();
    // SQLite's own busy timeout would try again at 53 then 78 ms.
    assert!(
        written > releasing && written - releasing < std::time::Duration::from_millis(10),
        "written {:?} after the lock's release began",
        written.saturating_duration_since(releasing)
    );
    assert_eq!(count(&store, "agent_activities"), 1);
}

/// A lock held past the writer's wait fails the write with `is_locked` (nothing of it stored,
/// and the same write goes through once the lock is let go); the wait is the calling thread's
/// to shorten, as the daemon does while it waits for another program to let go.
#[test]
fn a_write_past_the_lock_wait_fails_as_locked_and_goes_through_later() {
    let dir = TempDir::new("locked");
    let mut store = Store::open(&dir.db()).unwrap();
    let other = Connection::open(dir.db()).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let wait = std::time::Duration::from_millis(50);
    Store::set_lock_wait(Some(wait));
    let t = Instant::now();
    let e = store.apply(&[activity_record("s", 1)]).unwrap_err();
    let waited = t.elapsed();
    Store::set_lock_wait(None);
    assert!(e.is_locked() && !e.is_out_of_space(), "{e}");
    assert!(
        waited >= wait && waited < std::time::Duration::from_secs(2),
        "waited {waited:?} for the lock"
    );
    other.execute_batch("ROLLBACK").unwrap();
    assert_eq!(count(&store, "agent_activities"), 0);
    store.apply(&[activity_record("s", 1)]).unwrap();
    assert_eq!(count(&store, "agent_activities"), 1);
}

/// A database at this binary's version is only read when opened: another program's lock
/// does not hold up (or fail, past the 5 s wait) a daemon's start; its first write waits.
#[test]
fn a_current_database_opens_while_another_program_holds_the_write_lock() {
    let dir = TempDir::new("open-locked");
    drop(Store::open(&dir.db()).unwrap());
    let other = Connection::open(dir.db()).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let t = Instant::now();
    let mut store = Store::open(&dir.db()).unwrap();
    assert!(
        t.elapsed() < std::time::Duration::from_secs(1),
        "the open waited {:?}",
        t.elapsed()
    );
    assert!(store.load_sessions().unwrap().is_empty());
    Store::set_lock_wait(Some(std::time::Duration::from_millis(20)));
    let e = store.apply(&[activity_record("s", 1)]).unwrap_err();
    Store::set_lock_wait(None);
    assert!(e.is_locked(), "{e}");
    other.execute_batch("ROLLBACK").unwrap();
    store.apply(&[activity_record("s", 1)]).unwrap();
    assert_eq!(count(&store, "agent_activities"), 1);
}

#[test]
fn a_file_database_uses_wal_normal_sync_and_foreign_keys() {
    let dir = TempDir::new("pragmas");
    let store = Store::open(&dir.db()).unwrap();
    let pragma = |name: &str| -> String {
        store
            .conn
            .query_row(&format!("PRAGMA {name}"), [], |r| {
                r.get::<_, rusqlite::types::Value>(0)
            })
            .map(|v| match v {
                rusqlite::types::Value::Integer(i) => i.to_string(),
                rusqlite::types::Value::Text(t) => t,
                other => format!("{other:?}"),
            })
            .unwrap()
    };
    assert_eq!(pragma("journal_mode"), "wal");
    assert_eq!(pragma("page_size"), PAGE_SIZE.to_string());
    assert_eq!(pragma("synchronous"), "1", "NORMAL");
    assert_eq!(pragma("foreign_keys"), "1");
    assert_eq!(
        migrations::current_version(&store.conn).unwrap(),
        MIGRATIONS.len() as i64
    );
}

fn columns_of(table: &str) -> Vec<String> {
    let store = Store::open_in_memory().unwrap();
    let mut stmt = store
        .conn
        .prepare(&format!(
            "SELECT name FROM pragma_table_info('{table}') ORDER BY cid"
        ))
        .unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

#[test]
fn the_session_column_list_matches_the_schema() {
    assert_eq!(columns_of("agent_sessions"), SESSION_COLUMNS);
}

#[test]
fn the_activity_column_list_is_every_column_but_the_carried_progress() {
    let mut cols = columns_of("agent_activities");
    cols.retain(|c| !crate::CARRIED_COLUMNS.contains(&c.as_str()));
    assert_eq!(cols, ACTIVITY_COLUMNS);
}

#[test]
fn a_session_round_trips_with_every_field_set_and_with_none() {
    let mut store = Store::open_in_memory().unwrap();
    let full = full_record("01FULL");
    let bare = bare_record("01BARE");
    store
        .apply(&[
            Record::Session(Box::new(full.clone())),
            Record::Session(Box::new(bare.clone())),
        ])
        .unwrap();
    assert_eq!(store.session("01FULL").unwrap(), Some(full.clone()));
    assert_eq!(store.session("01BARE").unwrap(), Some(bare.clone()));
    assert_eq!(store.session("nope").unwrap(), None);
    assert_eq!(
        store.load_sessions().unwrap(),
        vec![bare.clone(), full.clone()]
    );

    // The upsert overwrites every column, including back to NULL.
    let mut cleared = bare_record("01FULL");
    std::sync::Arc::make_mut(&mut cleared.config).provider = Provider::Gemini;
    store
        .apply(&[Record::Session(Box::new(cleared.clone()))])
        .unwrap();
    assert_eq!(store.session("01FULL").unwrap(), Some(cleared));
    store
        .apply(&[Record::Session(Box::new(full.clone()))])
        .unwrap();
    assert_eq!(store.session("01FULL").unwrap(), Some(full));
    assert_eq!(store.counts().unwrap(), (0, 2));
}

#[test]
fn option_blocks_left_at_their_defaults_are_stored_as_an_empty_object() {
    let mut store = Store::open_in_memory().unwrap();
    store
        .apply(&[
            Record::Session(Box::new(bare_record("01BARE"))),
            Record::Session(Box::new(full_record("01FULL"))),
        ])
        .unwrap();
    let blocks = |id: &str| -> Vec<String> {
        store
            .conn
            .query_row(
                "SELECT env_podman, env_ssh, env_qemu, env_kubernetes, environment \
                 FROM agent_sessions WHERE id = ?1",
                [id],
                |r| (0..5).map(|i| r.get(i)).collect(),
            )
            .unwrap()
    };
    assert_eq!(blocks("01BARE"), vec!["{}"; 5]);
    assert!(
        blocks("01FULL").iter().all(|b| b != "{}"),
        "{:?}",
        blocks("01FULL")
    );
    // Rows an older version wrote spell every default out: they read the same.
    store
        .conn
        .execute(
            r#"UPDATE agent_sessions SET
                 env_podman = '{"mounts":[],"ports":[],"flags":[]}',
                 env_ssh = '{"host":"","port":0,"user":"","key_file":"","known_hosts":"","accept_new_host_key":false,"paddock":"","remote_dir":"","workdir":""}',
                 env_qemu = '{"cpus":0,"flags":[]}',
                 env_kubernetes = '{"namespace":"","service_account":"","pod_spec":"","kubeconfig":"","context":""}'
               WHERE id = '01BARE'"#,
            [],
        )
        .unwrap();
    assert_eq!(
        store.session("01BARE").unwrap(),
        Some(bare_record("01BARE"))
    );
}

#[test]
fn every_status_provider_and_error_code_round_trips() {
    let mut store = Store::open_in_memory().unwrap();
    let mut records = Vec::new();
    for (i, code) in ErrorCode::ALL.into_iter().enumerate() {
        let mut rec = full_record(&format!("s{i:02}"));
        rec.status = Status::ALL[i % Status::ALL.len()];
        std::sync::Arc::make_mut(&mut rec.config).provider = Provider::ALL[i % Provider::ALL.len()];
        rec.error = Some(Error::new(code, format!("{code}: because {i}")));
        records.push(rec);
    }
    let batch: Vec<Record> = records
        .iter()
        .map(|r| Record::Session(Box::new(r.clone())))
        .collect();
    store.apply(&batch).unwrap();
    assert_eq!(store.load_sessions().unwrap(), records);
}

#[test]
fn activities_status_events_and_messages_page_by_seq() {
    let mut store = Store::open_in_memory().unwrap();
    let mut batch = Vec::new();
    for seq in 1..=20 {
        batch.push(activity_record("a", seq));
        batch.push(activity_record("b", seq));
        batch.push(Record::Status(status_event("a", seq)));
    }
    for turn in [2, 1, 3] {
        batch.push(Record::UserMessage(user_message("a", turn)));
    }
    store.apply(&batch).unwrap();

    let all = store.activities("a", 0, usize::MAX).unwrap();
    assert_eq!(all, (1..=20).map(|s| activity("a", s)).collect::<Vec<_>>());
    let page = store.activities("a", 5, 3).unwrap();
    assert_eq!(page, (6..=8).map(|s| activity("a", s)).collect::<Vec<_>>());
    assert!(store.activities("a", 20, 10).unwrap().is_empty());
    assert!(store.activities("a", u64::MAX, 10).unwrap().is_empty());
    assert!(store.activities("a", 0, 0).unwrap().is_empty());
    assert!(store.activities("nobody", 0, 10).unwrap().is_empty());

    let statuses = store.status_events("a", 18, 100).unwrap();
    assert_eq!(statuses, vec![status_event("a", 19), status_event("a", 20)]);
    assert_eq!(store.status_events("a", 0, 1).unwrap()[0].previous, None);
    assert!(store.status_events("b", 0, 100).unwrap().is_empty());

    let messages = store.user_messages("a", 0).unwrap();
    assert_eq!(
        messages,
        vec![
            user_message("a", 1),
            user_message("a", 2),
            user_message("a", 3)
        ]
    );
    // From a turn on (a history window's first), through the key.
    assert_eq!(
        store.user_messages("a", 2).unwrap(),
        vec![user_message("a", 2), user_message("a", 3)]
    );
    assert!(store.user_messages("a", 4).unwrap().is_empty());
    let plan = query_plan(&store.conn, super::SELECT_USER_MESSAGES);
    assert!(
        plan.iter()
            .any(|s| s.starts_with("SEARCH session_messages") && s.contains("turn>?")),
        "{plan:#?}"
    );
}

#[test]
fn an_activity_without_a_kind_is_stored_as_status() {
    let mut store = Store::open_in_memory().unwrap();
    let mut ev = activity("s", 1);
    ev.activity.kind = None;
    store
        .apply(&[Record::Activity(Arc::new(ev.clone()))])
        .unwrap();
    ev.activity.kind = Some(ActivityKind::Status);
    assert_eq!(store.activities("s", 0, 10).unwrap(), vec![ev]);
}

#[test]
fn a_batch_is_atomic() {
    let mut store = Store::open_in_memory().unwrap();
    store.apply(&[activity_record("old", 1)]).unwrap();

    let err = store
        .apply(&[
            Record::Session(Box::new(full_record("s"))),
            activity_record("s", 1),
            Record::Status(status_event("s", 1)),
            Record::UserMessage(user_message("s", 1)),
            activity_record("s", 1), // the same (session, seq): PK violation
        ])
        .unwrap_err();
    assert!(is_unique_violation(&err), "{err}");
    assert!(!is_unique_violation(&StoreError::Corrupt("x".into())));
    assert_eq!(store.session("s").unwrap(), None);
    assert!(store.activities("s", 0, 100).unwrap().is_empty());
    assert!(store.status_events("s", 0, 100).unwrap().is_empty());
    assert!(store.user_messages("s", 0).unwrap().is_empty());
    // What was committed before is untouched, and the store is still usable.
    assert_eq!(store.activities("old", 0, 100).unwrap().len(), 1);
    store.apply(&[activity_record("s", 1)]).unwrap();
    assert_eq!(store.activities("s", 0, 100).unwrap().len(), 1);
}

#[test]
fn a_wal_that_never_empties_is_restarted_past_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("paddock.db");
    let quick = super::Checkpoints {
        every: std::time::Duration::from_millis(20),
        restart_at_bytes: 256 * 1024,
    };
    let mut store = Store::open_with(&db, quick).unwrap();
    let wal = dir.path().join("paddock.db-wal");
    let restarts = || wal_restarts(&wal);
    // 24 MiB of text, a batch every half millisecond (a loop that commits, delivers and
    // commits again): a pass never finds the WAL as it began, and without a restart the WAL
    // holds all of it (36 MB, no restart). A restart every round keeps it under 2 MB here, and
    // under 17 MB with both cores kept busy beside the test (the checkpointer runs late).
    let (mut seq, mut written) = (0, 0);
    let first = restarts();
    while written < 24 << 20 {
        store.apply(&wal_batch("01WAL", &mut seq)).unwrap();
        written += 8 * 2048;
        std::thread::sleep(std::time::Duration::from_micros(500));
    }
    let size = std::fs::metadata(&wal).unwrap().len();
    assert!(
        restarts() >= first + 3 && size < 24 << 20,
        "{} restarts after {written} bytes, a WAL of {size} bytes",
        restarts() - first
    );
    assert_eq!(count(&store, "agent_activities"), seq as i64);
}

/// A restart waits, the writer held off, for every reader to leave an older snapshot. A reader
/// that stayed (a `sqlite3` shell left in a transaction) made the writer's commit fail after
/// 5 s once the WAL passed its limit; now it waits at most `RESTART_WAIT`, and the WAL restarts
/// once the reader leaves.
#[test]
fn a_reader_that_keeps_an_old_snapshot_never_stalls_the_writer_for_long() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("paddock.db");
    let quick = super::Checkpoints {
        every: std::time::Duration::from_millis(20),
        restart_at_bytes: 64 * 1024,
    };
    // What the checkpointer's thread logs (the process's subscriber: this test's alone).
    let logged = Logged::default();
    let w = logged.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || w.clone())
            .finish(),
    )
    .expect("no other test of the store sets a subscriber");
    let mut store = Store::open_with(&db, quick).unwrap();
    let reader = rusqlite::Connection::open(&db).unwrap();
    reader
        .execute_batch("BEGIN; SELECT COUNT(*) FROM agent_activities;")
        .unwrap();
    let wal = dir.path().join("paddock.db-wal");
    let reading = wal_restarts(&wal);
    let mut seq = 0;
    let mut batch = |store: &mut Store| {
        let records = wal_batch("01READ", &mut seq);
        let t = std::time::Instant::now();
        store.apply(&records).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1));
        t.elapsed()
    };
    // A second of batches: the WAL is past its limit and grows at every round.
    let (start, mut slowest) = (std::time::Instant::now(), std::time::Duration::ZERO);
    while start.elapsed() < std::time::Duration::from_secs(1) {
        slowest = slowest.max(batch(&mut store));
    }
    assert!(
        slowest < std::time::Duration::from_millis(500),
        "a commit waited {slowest:?} for the checkpointer"
    );
    // No restart while it reads, and the user is told why the WAL grows (past 4 × 64 KiB);
    // once it leaves, the WAL restarts from its start, and that is said too.
    assert_eq!(wal_restarts(&wal), reading);
    let said = logged.text();
    assert!(
        said.contains("write-ahead log is")
            && said.contains("cannot be emptied: another program keeps a read transaction open"),
        "{said}"
    );
    assert!(
        said.matches("cannot be emptied").count() < 16,
        "said at every round: {said}"
    );
    reader.execute_batch("COMMIT").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while wal_restarts(&wal) == reading {
        batch(&mut store);
        assert!(
            std::time::Instant::now() < deadline,
            "the WAL never restarted once the reader left"
        );
    }
    while !logged.text().contains("write-ahead log is emptied again") {
        assert!(
            std::time::Instant::now() < deadline,
            "the restart was not said: {}",
            logged.text()
        );
        batch(&mut store);
    }
}

/// A log written into memory.
#[derive(Clone, Default)]
struct Logged(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Logged {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Logged {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A WAL that a reader keeps from restarting is said once past the first size, again at each
/// doubling (not at every round), and once more when it restarts.
#[test]
fn a_wal_that_cannot_be_emptied_is_said_at_each_doubling() {
    use super::{Said, Stuck};
    let mut stuck = Stuck::new(100);
    assert_eq!(stuck.after(false, 99), None);
    assert_eq!(
        stuck.after(true, 150),
        None,
        "a restart before any warning is not news"
    );
    assert_eq!(stuck.after(false, 120), Some(Said::Growing(120)));
    assert_eq!(stuck.after(false, 150), None);
    assert_eq!(stuck.after(false, 199), None);
    assert_eq!(stuck.after(false, 200), Some(Said::Growing(200)));
    // A jump past several doublings is said once.
    assert_eq!(stuck.after(false, 1000), Some(Said::Growing(1000)));
    assert_eq!(stuck.after(false, 1500), None);
    assert_eq!(stuck.after(true, 1500), Some(Said::Restarted));
    assert_eq!(stuck.after(true, 0), None);
    assert_eq!(stuck.after(false, 100), Some(Said::Growing(100)));
}

/// Eight activities of 2 KiB of text for `session`, numbered on from `seq`: a batch that
/// grows the WAL.
fn wal_batch(session: &str, seq: &mut u64) -> Vec<Record> {
    (0..8)
        .map(|_| {
            *seq += 1;
            let mut a = activity(session, *seq);
            a.activity.content = "x".repeat(2048);
            Record::Activity(Arc::new(a))
        })
        .collect()
}

/// How many times the WAL at `wal` restarted: its header's checkpoint sequence number
/// (big-endian, bytes 12..16).
fn wal_restarts(wal: &Path) -> u32 {
    use std::io::Read;
    let mut header = [0; 16];
    std::fs::File::open(wal)
        .and_then(|mut f| f.read_exact(&mut header))
        .map_or(0, |()| u32::from_be_bytes(header[12..].try_into().unwrap()))
}

#[test]
fn the_checkpointer_thread_moves_the_wal_into_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("paddock.db");
    let mut store = Store::open(&db).unwrap();
    let size = || std::fs::metadata(&db).unwrap().len();
    let before = size();
    let records: Vec<Record> = (1..=2000)
        .map(|seq| activity_record("01CKPT", seq))
        .collect();
    store.apply(&records).unwrap();
    // Nothing checkpoints on commit any more: the pages wait in the WAL ...
    assert_eq!(size(), before, "no checkpoint on the writer's thread");
    // ... until the checkpointer's next round copies them.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while size() == before {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint within 10 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(count(&store, "agent_activities"), 2000);
}

#[test]
fn a_batch_stores_the_last_version_of_each_session_once() {
    let mut store = Store::open_in_memory().unwrap();
    let mut v1 = bare_record("01ONE");
    v1.last_activity_seq = 1;
    let mut v2 = v1.clone();
    v2.last_activity_seq = 2;
    v2.tokens_input = 7;
    let other = bare_record("01TWO");
    store
        .apply(&[
            Record::Session(Box::new(v1)),
            activity_record("01ONE", 1),
            Record::Session(Box::new(other.clone())),
            activity_record("01ONE", 2),
            Record::Session(Box::new(v2.clone())),
        ])
        .unwrap();
    assert_eq!(store.session("01ONE").unwrap(), Some(v2));
    assert_eq!(store.session("01TWO").unwrap(), Some(other));
    assert_eq!(count(&store, "agent_activities"), 2);
    // A delete later in the batch still wins over the upsert written in the first's place.
    store
        .apply(&[
            Record::Session(Box::new(bare_record("01TWO"))),
            Record::Delete(SessionId::from("01TWO")),
        ])
        .unwrap();
    assert_eq!(store.session("01TWO").unwrap(), None);
}

/// The session a sunbeam attach resumes: the newest by creation (then id) of the project's
/// sessions its client did not close, among those the engine does not hold.
#[test]
fn the_resumable_session_is_the_newest_one_the_rule_accepts() {
    let mut store = Store::open_in_memory().unwrap();
    let in_project = |id: &str, project: &str, at: u64, closed: bool| {
        let mut r = bare_record(id);
        let mut map = std::collections::BTreeMap::new();
        map.insert(paddock_core::PROJECT_KEY.to_string(), project.to_string());
        std::sync::Arc::make_mut(&mut r.config).working_dir = project.to_string();
        std::sync::Arc::make_mut(&mut r.config).provider_config =
            paddock_core::ProviderConfig::parse(map).unwrap();
        r.created_at = paddock_core::Timestamp::from_millis(at);
        r.closed_by_client = closed;
        Record::Session(Box::new(r))
    };
    store
        .apply(&[
            in_project("01A", "/p", 10, false),
            // Same time as 01A: the id decides.
            in_project("01B", "/p", 10, false),
            in_project("01C", "/p", 5, false),
            // Newest, but closed by its client.
            in_project("01D", "/p", 30, true),
            in_project("01E", "/q", 40, false),
        ])
        .unwrap();
    let none = |_: &SessionId| false;
    assert_eq!(store.resumable("/p", &none).unwrap(), Some("01B".into()));
    let held = |id: &SessionId| id.0 == "01B";
    assert_eq!(store.resumable("/p", &held).unwrap(), Some("01A".into()));
    assert_eq!(store.resumable("/q", &none).unwrap(), Some("01E".into()));
    assert_eq!(store.resumable("/r", &none).unwrap(), None);
}

#[test]
fn a_session_whose_configuration_is_stored_has_only_its_state_written() {
    let mut store = Store::open_in_memory().unwrap();
    let config_of = |store: &Store| -> String { column_of(store, "s", "provider_config") };
    let mut rec = full_record("s");
    rec.status = Status::Running;
    rec.last_turn_failed = true; // every state field differs from bare_record's
    store
        .apply(&[Record::Session(Box::new(rec.clone()))])
        .unwrap();
    let stored = config_of(&store);
    // Every state column changes (most back to NULL or 0), the configuration stays: only the
    // state is written (a configuration changed behind the store's back stays as it is), and
    // the row reads back as the record.
    let set_config = |store: &Store, text: &str| {
        store
            .conn
            .execute(
                "UPDATE agent_sessions SET provider_config = ?1 WHERE id = 's'",
                [text],
            )
            .unwrap();
    };
    set_config(&store, r#"{"marker":"kept"}"#);
    let mut state = bare_record("s");
    state.config = rec.config.clone();
    store
        .apply(&[Record::Session(Box::new(state.clone()))])
        .unwrap();
    assert_eq!(config_of(&store), r#"{"marker":"kept"}"#);
    set_config(&store, &stored);
    assert_eq!(store.session("s").unwrap(), Some(state));
    store
        .apply(&[Record::Session(Box::new(rec.clone()))])
        .unwrap();
    assert_eq!(store.session("s").unwrap(), Some(rec.clone()));

    // A batch that changes the configuration and is rolled back leaves the stored one
    // remembered: the next write of the old configuration is a state write, of the new one a
    // full write.
    let mut changed = rec.clone();
    std::sync::Arc::make_mut(&mut changed.config).model = "another-model".into();
    write_rolled_back(&mut store, &changed);
    assert_eq!(store.session("s").unwrap(), Some(rec.clone()));
    store
        .apply(&[Record::Session(Box::new(changed.clone()))])
        .unwrap();
    assert_eq!(store.session("s").unwrap(), Some(changed.clone()));

    // A session that ended, or was deleted and made again, is written in full.
    let mut ended = changed.clone();
    ended.status = Status::Stopped;
    store
        .apply(&[Record::Session(Box::new(ended.clone()))])
        .unwrap();
    assert!(!store.stored_configs.contains_key("s"));
    store
        .apply(&[Record::Delete(SessionId("s".into()))])
        .unwrap();
    assert_eq!(store.session("s").unwrap(), None);
    store
        .apply(&[Record::Session(Box::new(rec.clone()))])
        .unwrap();
    assert_eq!(store.session("s").unwrap(), Some(rec));
}

#[test]
fn an_empty_batch_is_a_no_op() {
    let mut store = Store::open_in_memory().unwrap();
    store.apply(&[]).unwrap();
    assert_eq!(store.apply_all(&[], &[]).unwrap(), Vec::<i64>::new());
}

#[test]
fn reopening_applies_no_migration_twice() {
    let dir = TempDir::new("reopen");
    {
        let mut store = Store::open(&dir.db()).unwrap();
        store
            .apply(&[Record::Session(Box::new(full_record("s")))])
            .unwrap();
    }
    for _ in 0..2 {
        let store = Store::open(&dir.db()).unwrap();
        assert_eq!(store.session("s").unwrap(), Some(full_record("s")));
        assert_eq!(count(&store, "schema_version"), MIGRATIONS.len() as i64);
    }
}

#[test]
fn opening_an_older_database_applies_only_the_newer_migrations() {
    let dir = TempDir::new("upgrade");
    let mut conn = Connection::open(dir.db()).unwrap();
    // v1 only, then v1 + v2: v1 is not run again (its CREATE TABLEs would fail).
    assert_eq!(
        migrations::migrate(&mut conn, &MIGRATIONS[..1], 1).unwrap(),
        1
    );
    let v2 = "CREATE TABLE extra (x INTEGER NOT NULL) STRICT; INSERT INTO extra VALUES (7);";
    let newer = [MIGRATIONS[0], v2];
    assert_eq!(migrations::migrate(&mut conn, &newer, 2).unwrap(), 2);
    assert_eq!(migrations::migrate(&mut conn, &newer, 3).unwrap(), 2);
    let extra: i64 = conn
        .query_row("SELECT COUNT(*) FROM extra", [], |r| r.get(0))
        .unwrap();
    assert_eq!(extra, 1);
    let applied: Vec<(i64, i64)> = conn
        .prepare("SELECT version, applied_at FROM schema_version ORDER BY version")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(applied, vec![(1, 1), (2, 2)]);
}

#[test]
fn a_failing_migration_leaves_nothing_behind() {
    let mut conn = Connection::open_in_memory().unwrap();
    migrations::migrate(&mut conn, &MIGRATIONS[..1], 1).unwrap();
    let broken = [
        MIGRATIONS[0],
        "CREATE TABLE half (x); SELECT * FROM no_such_table;",
    ];
    assert!(migrations::migrate(&mut conn, &broken, 2).is_err());
    assert_eq!(migrations::current_version(&conn).unwrap(), 1);
    let half: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE name = 'half'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(half, 0);
}

#[test]
fn a_database_from_a_newer_binary_is_refused() {
    let dir = TempDir::new("too-new");
    drop(Store::open(&dir.db()).unwrap());
    {
        let conn = Connection::open(dir.db()).unwrap();
        conn.execute(
            "INSERT INTO schema_version (version, applied_at) VALUES (?1, 0)",
            [MIGRATIONS.len() as i64 + 5],
        )
        .unwrap();
    }
    let err = Store::open(&dir.db()).unwrap_err();
    match &err {
        StoreError::TooNew { found, known } => {
            assert_eq!(*found, MIGRATIONS.len() as i64 + 5);
            assert_eq!(*known, MIGRATIONS.len() as i64);
        }
        other => panic!("expected TooNew, got {other}"),
    }
    assert!(err.to_string().contains("newer than this paddock supports"));
}

/// A UNIQUE or PRIMARY KEY constraint violation.
/// Column `column` of session `id`'s row as stored.
fn column_of<T: rusqlite::types::FromSql>(store: &Store, id: &str, column: &str) -> T {
    let sql = format!("SELECT {column} FROM agent_sessions WHERE id = ?1");
    store.conn.query_row(&sql, [id], |r| r.get(0)).unwrap()
}

/// The steps of SQLite's plan for `sql`, its parameters bound to NULL (the store's
/// connection keeps one plan per statement, whatever they are).
pub(crate) fn query_plan(conn: &Connection, sql: &str) -> Vec<String> {
    let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
    let unbound = std::iter::repeat_n(rusqlite::types::Null, stmt.parameter_count());
    let steps = stmt
        .query_map(rusqlite::params_from_iter(unbound), |r| r.get(3))
        .unwrap();
    steps.collect::<rusqlite::Result<_>>().unwrap()
}

/// The opcodes SQLite compiles `sql` to, its parameters bound to NULL.
pub(crate) fn opcodes(conn: &Connection, sql: &str) -> Vec<String> {
    let mut stmt = conn.prepare(&format!("EXPLAIN {sql}")).unwrap();
    let unbound = std::iter::repeat_n(rusqlite::types::Null, stmt.parameter_count());
    let ops = stmt
        .query_map(rusqlite::params_from_iter(unbound), |r| r.get(1))
        .unwrap();
    ops.collect::<rusqlite::Result<_>>().unwrap()
}

/// Whether a statement's opcodes delete an index entry: SQLite rewrites the entry of every
/// (partial) index whose columns an UPDATE sets, equal or not.
pub(crate) fn touches_an_index(ops: &[String]) -> bool {
    ops.iter().any(|o| o == "IdxDelete")
}

/// Writes `rec` in a batch that fails (an activity twice) and so is rolled back.
fn write_rolled_back(store: &mut Store, rec: &SessionRecord) {
    let err = store
        .apply(&[
            Record::Session(Box::new(rec.clone())),
            activity_record(&rec.id.0, 1),
            activity_record(&rec.id.0, 1),
        ])
        .unwrap_err();
    assert!(is_unique_violation(&err), "{err}");
}

fn is_unique_violation(err: &StoreError) -> bool {
    matches!(
        err,
        StoreError::Sqlite(rusqlite::Error::SqliteFailure(e, _))
            if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
                || e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
    )
}

fn campaign(id: &str, name: &str, root: &str, at: u64) -> Campaign {
    Campaign {
        id: id.into(),
        name: name.into(),
        root_path: root.into(),
        created_at: paddock_core::Timestamp::from_millis(at),
    }
}

fn write(store: &mut Store, records: Vec<Record>) -> Result<Vec<i64>> {
    store.apply_all(&records, &[])
}

#[test]
fn campaigns_are_listed_by_name_and_names_stay_unique() {
    let mut store = Store::open_in_memory().unwrap();
    let b = campaign("c-2", "bravo", "/srv/b", 20);
    let a = campaign("c-1", "alpha", "/srv/a", 10);
    write(
        &mut store,
        vec![Record::Campaign(b.clone()), Record::Campaign(a.clone())],
    )
    .unwrap();
    assert_eq!(store.campaigns().unwrap(), vec![a.clone(), b.clone()]);

    // The daemon decides uniqueness in memory; the schema still refuses a duplicate.
    let dup = write(
        &mut store,
        vec![Record::Campaign(campaign("c-3", "alpha", "/x", 30))],
    );
    assert!(is_unique_violation(&dup.unwrap_err()));
    let dup_id = write(
        &mut store,
        vec![Record::Campaign(campaign("c-1", "other", "/x", 30))],
    );
    assert!(is_unique_violation(&dup_id.unwrap_err()));
    assert_eq!(store.counts().unwrap(), (2, 0));

    write(&mut store, vec![Record::RemoveCampaign("c-1".into())]).unwrap();
    assert_eq!(store.campaigns().unwrap(), vec![b]);
}

#[test]
fn delete_session_removes_everything_of_that_session_only() {
    let mut store = Store::open_in_memory().unwrap();
    let mut batch = Vec::new();
    for id in ["gone", "kept"] {
        batch.push(Record::Session(Box::new(full_record(id))));
        for seq in 1..=3 {
            batch.push(activity_record(id, seq));
            batch.push(Record::Status(status_event(id, seq)));
            batch.push(Record::UserMessage(user_message(id, seq)));
        }
    }
    store.apply(&batch).unwrap();
    assert!(store.delete_session("gone").unwrap());
    assert_eq!(store.session("gone").unwrap(), None);
    assert!(store.activities("gone", 0, 100).unwrap().is_empty());
    assert!(store.status_events("gone", 0, 100).unwrap().is_empty());
    assert!(store.user_messages("gone", 0).unwrap().is_empty());
    assert_eq!(store.activities("kept", 0, 100).unwrap().len(), 3);
    assert_eq!(store.status_events("kept", 0, 100).unwrap().len(), 3);
    assert_eq!(store.user_messages("kept", 0).unwrap().len(), 3);
    assert_eq!(count(&store, "agent_activities"), 3);
    assert!(!store.delete_session("gone").unwrap());
    assert_eq!(store.counts().unwrap(), (0, 1));
}

#[test]
fn reported_events_and_external_activities_are_appended() {
    let mut store = Store::open_in_memory().unwrap();
    let event = |kind, event_type: &str, at| {
        Row::Event(ReportedEvent {
            kind,
            campaign_id: "c".into(),
            festival_id: String::new(),
            event_type: event_type.into(),
            payload_json: "{}".into(),
            at,
            received_at: at + 1,
        })
    };
    let ids = store
        .apply_all(
            &[],
            &[
                event("campaign", "started", 5),
                event("festival", "phase", 7),
            ],
        )
        .unwrap();
    assert!(ids[1] > ids[0], "{ids:?}");
    assert!(store.apply_all(&[], &[event("bogus", "x", 1)]).is_err());
    assert_eq!(store.reported_payloads("c", "phase", 10).unwrap(), ["{}"]);

    let rows: Vec<ExternalActivity> = (0..3)
        .map(|i| ExternalActivity {
            session_id: "ext".into(),
            campaign_id: "c".into(),
            agent_name: "outside".into(),
            kind: 99, // kept verbatim, not checked
            content: format!("row {i}"),
            tool_success: true,
            tokens_input: -1,
            at: 1000 + i,
            ..ExternalActivity::default()
        })
        .collect();
    store.apply_all(&[], &[Row::External(rows)]).unwrap();
    assert_eq!(count(&store, "external_activities"), 3);
    let (kind, tokens, at): (i32, i64, i64) = store
        .conn
        .query_row(
            "SELECT type, tokens_input, at FROM external_activities ORDER BY id DESC LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!((kind, tokens, at), (99, -1, 1002));
}

#[test]
fn undecodable_rows_are_reported_as_corrupt() {
    let mut store = Store::open_in_memory().unwrap();
    store
        .apply(&[
            Record::Session(Box::new(full_record("s"))),
            activity_record("s", 1),
            Record::Status(status_event("s", 1)),
        ])
        .unwrap();
    let corrupt = |store: &Store, sql: &str| {
        store.conn.execute(sql, []).unwrap();
    };
    let is_corrupt = |r: Result<()>, needle: &str| match r {
        Err(StoreError::Corrupt(m)) => assert!(m.contains(needle), "{m}"),
        other => panic!("expected Corrupt({needle}), got {other:?}"),
    };

    corrupt(&store, "UPDATE agent_sessions SET status = 42");
    is_corrupt(
        store.load_sessions().map(drop),
        "unknown status 42 (session s)",
    );
    corrupt(&store, "UPDATE agent_sessions SET status = 3, provider = 0");
    is_corrupt(store.session("s").map(drop), "unknown provider 0");
    corrupt(
        &store,
        "UPDATE agent_sessions SET provider = 1, error_code = 'OBEY-1'",
    );
    is_corrupt(store.session("s").map(drop), "agent_sessions.error_code");
    corrupt(
        &store,
        "UPDATE agent_sessions SET error_code = NULL, environment = '[1]'",
    );
    is_corrupt(store.session("s").map(drop), "agent_sessions.environment");
    corrupt(
        &store,
        "UPDATE agent_sessions SET environment = '{}', tokens_input = -1",
    );
    is_corrupt(store.session("s").map(drop), "negative value -1");
    corrupt(
        &store,
        "UPDATE agent_sessions SET tokens_input = 1, pid = -5",
    );
    is_corrupt(store.session("s").map(drop), "agent_sessions.pid");
    // A setting paddock cannot use is never read as a default.
    corrupt(
        &store,
        "UPDATE agent_sessions SET pid = NULL, provider_config = '{\"permissions\":\"maybe\"}'",
    );
    is_corrupt(
        store.session("s").map(drop),
        "agent_sessions.provider_config",
    );
    corrupt(&store, "UPDATE agent_activities SET type = 8");
    is_corrupt(
        store.activities("s", 0, 9).map(drop),
        "unknown activity type 8",
    );
    corrupt(&store, "UPDATE session_status_events SET new_status = 0");
    is_corrupt(store.status_events("s", 0, 9).map(drop), "unknown status 0");
}

/// Earlier versions stored a `client_tools` list unchecked for every agent but the openai-api
/// loop: a list paddock refuses now is dropped when the row is read (the session stays
/// readable, and a daemon with it live still starts); any other setting it refuses is a
/// corrupt row, as above.
#[test]
fn a_stored_client_tools_list_refused_now_is_dropped_not_corrupt() {
    let mut store = Store::open_in_memory().unwrap();
    store
        .apply(&[Record::Session(Box::new(full_record("s")))])
        .unwrap();
    let set = |config: &str| {
        let sql = "UPDATE agent_sessions SET provider_config = ?1";
        store.conn.execute(sql, [config]).unwrap();
    };
    // A name twice, and a list that is not JSON: dropped, the rest kept.
    for bad in [r#"[{\"name\":\"a\"},{\"name\":\"a\"}]"#, "not json"] {
        set(&format!(
            r#"{{"client_tools":"{bad}","permissions":"deny"}}"#
        ));
        let rec = store.session("s").unwrap().expect("readable");
        let config = &rec.config.provider_config;
        assert!(
            config.get(paddock_core::CLIENT_TOOLS_KEY).is_none(),
            "{bad}"
        );
        assert!(config.agent().client_tools.is_empty());
        assert_eq!(
            config.policy(),
            &paddock_core::Policy::Deny,
            "the rest is kept"
        );
    }
    // A valid list is read as it is.
    set(r#"{"client_tools":"[{\"name\":\"run_tests\"}]"}"#);
    let rec = store.session("s").unwrap().unwrap();
    assert_eq!(
        rec.config.provider_config.agent().client_tools[0].name,
        "run_tests"
    );
    // A bad list next to another bad setting: still a corrupt row.
    set(r#"{"client_tools":"not json","permissions":"maybe"}"#);
    assert!(matches!(store.session("s"), Err(StoreError::Corrupt(_))));
}

#[test]
fn huge_values_saturate_instead_of_failing_the_batch() {
    assert_eq!(codec::int(u64::MAX), i64::MAX);
    assert_eq!(codec::int(7), 7);
    let mut store = Store::open_in_memory().unwrap();
    let mut rec = bare_record("s");
    rec.tokens_input = u64::MAX;
    store.apply(&[Record::Session(Box::new(rec))]).unwrap();
    assert_eq!(
        store.session("s").unwrap().unwrap().tokens_input,
        i64::MAX as u64
    );
}

const CRASH_CHILD: &str = "PADDOCK_STORE_TEST_CRASH_DIR";

/// Writes in a child process that then aborts (no close, no checkpoint, no destructors), and
/// checks that everything it committed is there. Also: a plain drop, and a leaked connection.
#[test]
fn committed_rows_survive_a_crash() {
    if let Some(dir) = std::env::var_os(CRASH_CHILD) {
        let db = Path::new(&dir).join("paddock.db");
        let mut store = Store::open(&db).unwrap();
        write(
            &mut store,
            vec![Record::Campaign(campaign("c", "camp", "/srv", 1))],
        )
        .unwrap();
        for seq in 1..=50 {
            store
                .apply(&[
                    activity_record("s", seq),
                    Record::Session(Box::new(full_record("s"))),
                ])
                .unwrap();
        }
        std::process::abort();
    }

    let dir = TempDir::new("crash");
    // This test's path as libtest names it: the module path without the crate name.
    let module = module_path!()
        .split_once("::")
        .map_or(module_path!(), |(_, rest)| rest);
    let name = format!("{module}::committed_rows_survive_a_crash");
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name.as_str(), "--exact", "--test-threads=1", "--nocapture"])
        .env(CRASH_CHILD, &dir.0)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success(), "the child must have aborted: {status}");
    assert!(
        dir.0.join("paddock.db-wal").exists(),
        "the commits should still be in the WAL only"
    );
    {
        let store = Store::open(&dir.db()).unwrap();
        assert_eq!(store.activities("s", 0, 1000).unwrap().len(), 50);
        assert_eq!(store.session("s").unwrap(), Some(full_record("s")));
        assert_eq!(store.counts().unwrap(), (1, 1));
    }

    // A drop (the connection closes), then a leak (it never does).
    let mut store = Store::open(&dir.db()).unwrap();
    store.apply(&[activity_record("s", 51)]).unwrap();
    drop(store);
    let mut store = Store::open(&dir.db()).unwrap();
    store.apply(&[activity_record("s", 52)]).unwrap();
    std::mem::forget(store);
    let store = Store::open(&dir.db()).unwrap();
    assert_eq!(store.activities("s", 50, 1000).unwrap().len(), 2);
}

/// Not a check: prints the rate of the daemon's hot path on a real file.
#[test]
fn throughput_of_batched_activity_writes() {
    const TOTAL: u64 = 10_000;
    const BATCH: u64 = 100;
    let dir = TempDir::new("throughput");
    let mut store = Store::open(&dir.db()).unwrap();
    let mut rec = full_record("s");
    let started = Instant::now();
    for b in 0..TOTAL / BATCH {
        let mut batch: Vec<Record> = (b * BATCH + 1..=(b + 1) * BATCH)
            .map(|seq| activity_record("s", seq))
            .collect();
        rec.last_activity_seq = (b + 1) * BATCH;
        batch.push(Record::Session(Box::new(rec.clone())));
        store.apply(&batch).unwrap();
    }
    let elapsed = started.elapsed();
    assert_eq!(
        store.activities("s", 0, usize::MAX).unwrap().len() as u64,
        TOTAL
    );
    println!(
        "store throughput: {TOTAL} activities in batches of {BATCH} (+1 session upsert each): \
         {:.1} ms, {:.0} activities/s, {:.2} ms/commit",
        elapsed.as_secs_f64() * 1e3,
        TOTAL as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64() * 1e3 / (TOTAL / BATCH) as f64
    );

    // And one record per commit, the worst case (a lone activity between quiet periods).
    let started = Instant::now();
    for seq in TOTAL + 1..=TOTAL + 1000 {
        store.apply(&[activity_record("s", seq)]).unwrap();
    }
    let elapsed = started.elapsed();
    println!(
        "store throughput: 1000 single-activity commits: {:.1} ms, {:.0} commits/s",
        elapsed.as_secs_f64() * 1e3,
        1000.0 / elapsed.as_secs_f64()
    );
}

#[test]
fn store_errors_display_and_chain() {
    let e = StoreError::TooNew { found: 9, known: 1 };
    assert!(e.to_string().contains("version 9"));
    assert!(std::error::Error::source(&e).is_none());
    let e = StoreError::from(rusqlite::Error::InvalidQuery);
    assert!(std::error::Error::source(&e).is_some());
    assert!(StoreError::Corrupt("x.y: bad".into())
        .to_string()
        .contains("x.y: bad"));
}

#[test]
fn credentials_an_older_install_stored_in_the_clear_are_sealed_once_at_open() {
    let dir = TempDir::new("seal");
    let mut rec = full_record("s1");
    std::sync::Arc::make_mut(&mut rec.config)
        .environment
        .insert("GITHUB_TOKEN".into(), "ghp-old".into());
    {
        let mut store = Store::open(&dir.db()).unwrap();
        store
            .apply(&[Record::Session(Box::new(rec.clone()))])
            .unwrap();
    }
    // What an older binary wrote: the credential in the clear, and no sealed flag.
    let conn = Connection::open(dir.db()).unwrap();
    conn.execute_batch(
        "UPDATE agent_sessions SET environment = '{\"GITHUB_TOKEN\":\"ghp-old\",\"FOO\":\"bar=baz\"}';
         PRAGMA user_version = 0;",
    )
    .unwrap();
    drop(conn);
    let store = Store::open(&dir.db()).unwrap();
    assert_eq!(
        store.session("s1").unwrap().unwrap(),
        rec,
        "opens to the same value"
    );
    let raw: String = store
        .conn
        .query_row("SELECT environment FROM agent_sessions", [], |r| r.get(0))
        .unwrap();
    assert!(
        !raw.contains("ghp-old") && raw.contains("sealed:v1:"),
        "{raw}"
    );
    assert!(
        raw.contains("bar=baz"),
        "only credentials are sealed: {raw}"
    );
    let flags: i64 = store
        .conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(flags & SEALED_FLAG, SEALED_FLAG);
}

/// A request of `session`, asked by `run`: open, or resolved at `resolved_at`.
fn request(id: &str, session: &str, run: u64, resolved_at: Option<u64>) -> paddock_core::Approval {
    use paddock_core::{ApprovalState, AskKind, Timestamp};
    paddock_core::Approval {
        id: id.into(),
        session: SessionId(session.into()),
        run,
        key: format!("key-{id}"),
        kind: AskKind::Permission,
        tool: "Bash".into(),
        input: "{}".into(),
        summary: "Bash: ls".into(),
        turn: Some(1),
        created_at: Timestamp::from_millis(10),
        expires_at: Timestamp::from_millis(1_000_000),
        state: if resolved_at.is_some() {
            ApprovalState::Approved
        } else {
            ApprovalState::Pending
        },
        answer: String::new(),
        is_error: false,
        allowed: resolved_at.is_some(),
        resolved_by: resolved_at.map(|_| "cli".into()).unwrap_or_default(),
        resolved_at: resolved_at.map(Timestamp::from_millis),
    }
}

#[test]
fn start_up_loads_only_what_is_not_settled_and_the_rest_pages_by_id() {
    let mut store = Store::open_in_memory().unwrap();
    let rec = |id: &str, status: Status, pid: Option<u32>, run: Option<u64>, dir: &str| {
        let mut r = bare_record(id);
        r.status = status;
        r.pid = pid;
        r.run = run;
        std::sync::Arc::make_mut(&mut r.config).working_dir = dir.into();
        std::sync::Arc::make_mut(&mut r.config).campaign_id = if dir == "/a" {
            "ca".into()
        } else {
            "cb".into()
        };
        r
    };
    let records = vec![
        rec("s1", Status::Stopped, None, None, "/a"),
        rec("s2", Status::Running, Some(7), Some(3), "/a"),
        rec("s3", Status::Failed, Some(8), None, "/b"), // its process was still being killed
        rec("s4", Status::Stopped, None, Some(5), "/b"), // its run still named
        rec("s5", Status::Failed, None, None, "/b"),    // an open request left behind
        rec("s6", Status::Stopped, None, None, "/a"),
    ];
    for r in &records {
        assert_eq!(
            r.is_settled(),
            ["s1", "s5", "s6"].contains(&r.id.0.as_str()),
            "{}",
            r.id
        );
    }
    let batch: Vec<Record> = records
        .iter()
        .map(|r| Record::Session(Box::new(r.clone())))
        .collect();
    store.apply(&batch).unwrap();
    let mut requests = vec![request("open", "s5", 9, None)];
    let n = approvals::RESOLVED_LOADED as u64 + 5;
    for i in 0..n {
        requests.push(request(&format!("r{i:02}"), "s1", 11, Some(100 + i)));
    }
    requests.push(request("r2", "s2", 3, Some(50)));
    let batch: Vec<Record> = requests
        .iter()
        .map(|a| Record::Approval(Box::new(a.clone())))
        .collect();
    store.apply(&batch).unwrap();
    // Lines their agents printed that no parser read: 3 of settled s1, 1 of s2, 2 of s5.
    let lines: Vec<Row> = [("s1", 3), ("s2", 1), ("s5", 2)]
        .into_iter()
        .flat_map(|(id, n)| {
            (0..n).map(move |i| {
                Row::Unrecognized(UnrecognizedLine {
                    session_id: id.into(),
                    run: 1,
                    at_ms: i,
                    line: format!("noise {i}"),
                })
            })
        })
        .collect();
    store.apply_all(&[], &lines).unwrap();

    let ids = |v: Vec<SessionRecord>| v.into_iter().map(|r| r.id.0).collect::<Vec<_>>();
    // The settled ones stay in the store: s1 and s6 (s5 holds an open request).
    assert_eq!(
        ids(store.load_unsettled_sessions().unwrap()),
        ["s2", "s3", "s4", "s5"]
    );
    // Their requests: every open one, and the resolved ones of the sessions loaded (s1's wait
    // for its recall).
    let loaded: Vec<String> = store
        .load_approvals()
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(loaded, ["open", "r2"]);
    // A recall takes the newest resolved ones, as many as the engine remembers.
    let recalled = store.resolved_approvals("s1").unwrap();
    assert_eq!(recalled.len() as i64, approvals::RESOLVED_LOADED);
    assert_eq!(recalled[0].id, format!("r{:02}", n - 1));
    assert!(store.resolved_approvals("s6").unwrap().is_empty());
    // Every run id a request names stays reserved: s1's requests name run 11.
    assert_eq!(store.max_request_run().unwrap(), 11);
    // Those of the sessions come with the sessions loaded: a session naming a run is never
    // settled.
    let named: Vec<String> = store
        .conn
        .prepare("SELECT id FROM agent_sessions WHERE run_id IS NOT NULL ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(named, ["s2", "s4"], "each of them among those loaded");
    // And the counts of their unrecognized lines; a settled session's when it is named.
    assert_eq!(
        store.unrecognized_counts().unwrap(),
        [("s2".to_string(), 1), ("s5".to_string(), 2)]
    );
    assert_eq!(store.unrecognized_count("s1").unwrap(), 3);
    assert_eq!(store.unrecognized_count("s6").unwrap(), 0);
    assert_eq!(store.session_count().unwrap(), 6);
    // Pages, newest first, narrowed by campaign and working dir, each session with its
    // count.
    let page = |before, campaign, dir, limit| {
        let listed = store.sessions_before(before, campaign, dir, limit).unwrap();
        let listed = listed.into_iter().map(|(r, n)| (r.id.0.clone(), n));
        listed.collect::<Vec<_>>()
    };
    let counted = |ids: &[&str]| -> Vec<(String, u64)> {
        let count = |id: &str| {
            [("s1", 3), ("s2", 1), ("s5", 2)]
                .iter()
                .find(|c| c.0 == id)
                .map_or(0, |c| c.1)
        };
        ids.iter().map(|id| (id.to_string(), count(id))).collect()
    };
    assert_eq!(page("", None, None, 4), counted(&["s6", "s5", "s4", "s3"]));
    assert_eq!(page("s3", None, None, 4), counted(&["s2", "s1"]));
    assert_eq!(page("", Some("ca"), None, 10), counted(&["s6", "s2", "s1"]));
    assert_eq!(
        page("s6", None, Some("/b"), 10),
        counted(&["s5", "s4", "s3"])
    );
    assert!(store
        .sessions_before("s1", None, None, 10)
        .unwrap()
        .is_empty());

    let empty = Store::open_in_memory().unwrap();
    assert_eq!(empty.max_request_run().unwrap(), 0);
    assert_eq!(empty.session_count().unwrap(), 0);
}

/// Version 12 moves sunbeam's "ended by its client" from campaign events onto the session: a
/// database written by an older daemon keeps every EndSession it recorded.
#[test]
fn the_sessions_sunbeam_ended_are_closed_by_the_upgrade() {
    let dir = TempDir::new("v12");
    {
        let mut conn = Connection::open(dir.db()).unwrap();
        migrations::migrate(&mut conn, &MIGRATIONS[..11], 1).unwrap();
        for id in ["s-ended", "s-open"] {
            conn.execute(
                "INSERT INTO agent_sessions (id, campaign_id, provider, model, agent_name, status,
                   festival_id, task_id, tokens_input, tokens_output, max_tokens, restart_count,
                   created_at, working_dir, timeout_ms, initial_message, last_activity_seq,
                   last_status_seq, turns)
                 VALUES (?1, 'c', 1, '', '', 6, '', '', 0, 0, 0, 0, 1, '/p', 0, '', 0, 0, 0)",
                [id],
            )
            .unwrap();
        }
        for (event, payload) in [
            ("sunbeam.session_ended", r#"{"session_id":"s-ended"}"#),
            ("sunbeam.session_ended", "not json"),
            ("something.else", r#"{"session_id":"s-open"}"#),
        ] {
            conn.execute(
                "INSERT INTO reported_events (kind, campaign_id, festival_id, event_type,
                   payload_json, at, received_at) VALUES ('campaign', 'c', '', ?1, ?2, 1, 1)",
                [event, payload],
            )
            .unwrap();
        }
    }
    let store = Store::open(&dir.db()).unwrap();
    let closed = |id: &str| store.session(id).unwrap().unwrap().closed_by_client;
    assert!(closed("s-ended"));
    assert!(!closed("s-open"));
}

/// Start-up reads what it must decide on from indexes, never by visiting every stored session:
/// the partial index's expression (migration 13) and the rule's must stay the same for SQLite
/// to use it.
/// Start-up's highest stored run reads one entry of an index, not every request ever stored.
#[test]
fn start_up_reads_the_highest_request_run_from_its_index() {
    let store = Store::open_in_memory().unwrap();
    let steps = query_plan(&store.conn, super::approvals::MAX_REQUEST_RUN);
    assert!(
        steps.iter().all(|s| !s.starts_with("SCAN approvals"))
            && steps.iter().any(|s| s.contains("approvals_by_run")),
        "{steps:#?}"
    );
}

#[test]
fn a_working_session_leaves_the_index_of_active_rows_alone() {
    let mut store = Store::open_in_memory().unwrap();
    // The statement for a working session sets none of the partial index's columns.
    assert!(touches_an_index(&opcodes(
        &store.conn,
        &super::UPDATE_SESSION_STATE
    )));
    assert!(!touches_an_index(&opcodes(
        &store.conn,
        &super::UPDATE_SESSION_WORK
    )));

    let status_of = |store: &Store| -> i64 { column_of(store, "s", "status") };
    let unsettled = |store: &Store| -> Vec<String> {
        let mut stmt = store.conn.prepare(&super::UNSETTLED_IDS).unwrap();
        let ids = stmt.query_map([], |r| r.get(0)).unwrap();
        ids.collect::<rusqlite::Result<_>>().unwrap()
    };
    let mut rec = full_record("s");
    rec.status = Status::Running;
    rec.pid = Some(7);
    rec.run = Some(3);
    store
        .apply(&[Record::Session(Box::new(rec.clone()))])
        .unwrap();
    // A status changed behind the store's back stays while the session's status, pid and run
    // are as the store wrote them (only its work is written)…
    store
        .conn
        .execute(
            "UPDATE agent_sessions SET status = ?1 WHERE id = 's'",
            [Status::Waiting.number()],
        )
        .unwrap();
    rec.tokens_input += 5;
    rec.last_activity_seq += 1;
    store
        .apply(&[Record::Session(Box::new(rec.clone()))])
        .unwrap();
    assert_eq!(status_of(&store), i64::from(Status::Waiting.number()));
    let read = store.session("s").unwrap().unwrap();
    assert_eq!(
        (read.tokens_input, read.last_activity_seq),
        (rec.tokens_input, rec.last_activity_seq)
    );
    // …and is written with the rest once one of them changes.
    rec.pid = None;
    store
        .apply(&[Record::Session(Box::new(rec.clone()))])
        .unwrap();
    assert_eq!(store.session("s").unwrap(), Some(rec.clone()));
    assert_eq!(unsettled(&store), ["s"]);
    // A rolled-back batch leaves the stored key as it was: the run that it dropped is
    // written by the next batch.
    let mut dropped = rec.clone();
    dropped.run = None;
    write_rolled_back(&mut store, &dropped);
    store
        .apply(&[Record::Session(Box::new(dropped.clone()))])
        .unwrap();
    assert_eq!(store.session("s").unwrap(), Some(dropped.clone()));
    // Ended, with no process and no run: out of the index.
    let mut ended = dropped;
    ended.status = Status::Stopped;
    store
        .apply(&[Record::Session(Box::new(ended.clone()))])
        .unwrap();
    assert_eq!(store.session("s").unwrap(), Some(ended));
    assert!(unsettled(&store).is_empty());
    let check: String = store
        .conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}

#[test]
fn start_up_reads_the_unsettled_from_their_index() {
    let store = Store::open_in_memory().unwrap();
    let plan = |sql: &str| query_plan(&store.conn, sql);
    for sql in [
        &*super::SELECT_UNSETTLED_SESSIONS,
        &*super::UNSETTLED_IDS,
        &*super::UNSETTLED_UNRECOGNIZED_COUNTS,
    ] {
        let steps = plan(sql);
        // Unrecognized lines are read by their key, never scanned.
        assert!(
            !steps
                .iter()
                .any(|s| s.starts_with("SCAN provider_unrecognized")),
            "{steps:#?}"
        );
        assert!(
            steps.iter().any(|s| s.contains("agent_sessions_active")),
            "{steps:#?}"
        );
        // Sessions are scanned only through the index of the active ones.
        assert!(
            steps
                .iter()
                .filter(|s| s.starts_with("SCAN agent_sessions"))
                .all(|s| s.contains("agent_sessions_active")),
            "{steps:#?}"
        );
    }
}

/// The ended sessions' rows a list holds ([`SettledRows`]) are what is stored, whatever wrote
/// the row since: a restart, a rolled-back batch, a line of its agent, a deletion, a rewrite.
#[test]
fn an_ended_sessions_row_held_for_lists_is_never_older_than_the_stored_one() {
    let mut store = Store::open_in_memory().unwrap();
    let ended = |id: &str, tokens| {
        let mut r = bare_record(id);
        r.status = Status::Stopped;
        r.tokens_input = tokens;
        r
    };
    write(
        &mut store,
        vec![
            Record::Session(Box::new(ended("s1", 1))),
            Record::Session(Box::new(ended("s2", 2))),
        ],
    )
    .unwrap();
    let listed = |store: &Store| -> Vec<(String, Status, u64, u64)> {
        let page = store.sessions_before("", None, None, 10).unwrap();
        page.iter()
            .map(|(r, n)| (r.id.0.clone(), r.status, r.tokens_input, *n))
            .collect()
    };
    let first = listed(&store);
    assert_eq!(
        first,
        [
            ("s2".into(), Status::Stopped, 2, 0),
            ("s1".into(), Status::Stopped, 1, 0)
        ]
    );
    // Held now: a second list reads the same rows without decoding them again.
    assert_eq!(store.settled.borrow().len(), 2);
    assert_eq!(listed(&store), first);
    let held = store.sessions_before("", None, None, 1).unwrap();
    let again = store.sessions_before("", None, None, 1).unwrap();
    assert!(
        Arc::ptr_eq(&held[0].0, &again[0].0),
        "one decoded row, shared"
    );

    // A restart writes the row: the list shows the live one.
    let mut live = ended("s2", 5);
    live.status = Status::Running;
    write(&mut store, vec![Record::Session(Box::new(live))]).unwrap();
    assert_eq!(listed(&store)[0], ("s2".into(), Status::Running, 5, 0));
    // A live row is never held; ended again, it is read anew and held.
    assert_eq!(store.settled.borrow().len(), 1);
    write(&mut store, vec![Record::Session(Box::new(ended("s2", 6)))]).unwrap();
    assert_eq!(listed(&store)[0], ("s2".into(), Status::Stopped, 6, 0));

    // A batch that rolls back leaves the stored row, and the list shows that one.
    write_rolled_back(&mut store, &ended("s1", 99));
    assert_eq!(listed(&store)[1], ("s1".into(), Status::Stopped, 1, 0));

    // An unrecognized line counts at once.
    let line = Row::Unrecognized(UnrecognizedLine {
        session_id: "s1".into(),
        run: 1,
        at_ms: 0,
        line: "noise".into(),
    });
    store.apply_all(&[], &[line]).unwrap();
    assert_eq!(listed(&store)[1], ("s1".into(), Status::Stopped, 1, 1));

    // Deleted, by the batch or by itself: gone from the list.
    write(&mut store, vec![Record::Delete(SessionId("s2".into()))]).unwrap();
    assert_eq!(listed(&store), [("s1".into(), Status::Stopped, 1, 1)]);
    assert!(store.delete_session("s1").unwrap());
    assert!(listed(&store).is_empty());
    assert_eq!(store.settled.borrow().len(), 0);
}

/// A row another program changed in the file (`sqlite3` by hand) is listed as it is now, not
/// as it was held.
#[test]
fn a_row_changed_by_another_program_is_listed_as_it_is_now() {
    let dir = TempDir::new("held");
    let mut store = Store::open(&dir.db()).unwrap();
    let mut r = bare_record("s1");
    r.status = Status::Stopped;
    std::sync::Arc::make_mut(&mut r.config).agent_name = "before".into();
    write(&mut store, vec![Record::Session(Box::new(r))]).unwrap();
    let name = |store: &Store| {
        let page = store.sessions_before("", None, None, 10).unwrap();
        page[0].0.config.agent_name.clone()
    };
    assert_eq!(name(&store), "before");
    assert_eq!(store.settled.borrow().len(), 1);
    // Held: listed again without a read of the row.
    assert_eq!(name(&store), "before");
    let other = Connection::open(dir.db()).unwrap();
    other
        .execute(
            "UPDATE agent_sessions SET agent_name = 'after' WHERE id = 's1'",
            [],
        )
        .unwrap();
    assert_eq!(name(&store), "after");
    // Held again, and kept while nothing else writes.
    assert_eq!(store.settled.borrow().len(), 1);
    let held = store.sessions_before("", None, None, 1).unwrap();
    let again = store.sessions_before("", None, None, 1).unwrap();
    assert!(Arc::ptr_eq(&held[0].0, &again[0].0));
}

/// The rows held are bounded: a list of more ended sessions than [`SETTLED_ROWS_MAX`] holds
/// the last ones it read and reads the rest again.
#[test]
fn the_rows_held_for_lists_are_bounded() {
    let mut store = Store::open_in_memory().unwrap();
    let n = SETTLED_ROWS_MAX.get() + 10;
    let batch: Vec<Record> = (0..n)
        .map(|i| {
            let mut r = bare_record(&format!("s{i:05}"));
            r.status = Status::Failed;
            Record::Session(Box::new(r))
        })
        .collect();
    write(&mut store, batch).unwrap();
    let all = store.sessions_before("", None, None, n).unwrap();
    assert_eq!(all.len(), n);
    assert_eq!(store.settled.borrow().len(), SETTLED_ROWS_MAX.get());
    assert_eq!(all[0].0.id.0, format!("s{:05}", n - 1));
}

/// `rec` after one more event of its agent: its activity `seq`, the output cursor at
/// `cursor`, the activity's tokens counted.
fn progressed(rec: &SessionRecord, seq: u64, cursor: u64) -> SessionRecord {
    let mut next = rec.clone();
    next.last_activity_seq = seq;
    next.provider_cursor = cursor;
    next.tokens_input += seq;
    next.tokens_output += seq * 2;
    next.last_activity_at = Some(paddock_core::Timestamp::from_millis(
        1_700_000_000_000 + seq,
    ));
    next
}

/// A working session's event writes its activity row and not the session's: the row carries
/// the session's progress, every read of the session (by id, in a page, at start-up, after a
/// reopen) takes it back from there, and whatever else changes writes the session's row again.
#[test]
fn an_events_progress_rides_on_its_activity_row() {
    let dir = TempDir::new("carried");
    let mut store = Store::open(&dir.db()).unwrap();
    let mut rec = bare_record("s");
    rec.status = Status::Running;
    rec.run = Some(3);
    rec.provider_cursor = 4;
    rec.turns = 1;
    rec.turn_open = true;
    store
        .apply(&[Record::Session(Box::new(rec.clone()))])
        .unwrap();
    let stored_seq = |store: &Store| column_of::<i64>(store, "s", "last_activity_seq");

    // Two events in one batch: the last activity carries the last record's progress.
    let v1 = progressed(&rec, 1, 5);
    let v2 = progressed(&v1, 2, 7);
    store
        .apply(&[
            activity_record("s", 1),
            Record::Session(Box::new(v1)),
            activity_record("s", 2),
            Record::Session(Box::new(v2.clone())),
        ])
        .unwrap();
    assert_eq!(stored_seq(&store), 0, "the session's row is not written");
    let carried: Vec<Option<i64>> = store
        .conn
        .prepare("SELECT session_cursor FROM agent_activities ORDER BY key")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(carried, [None, Some(7)]);
    assert_eq!(store.session("s").unwrap(), Some(v2.clone()));
    assert_eq!(
        store.load_unsettled_sessions().unwrap(),
        std::slice::from_ref(&v2)
    );
    assert_eq!(*store.sessions_before("", None, None, 10).unwrap()[0].0, v2);

    // A crash here loses nothing: a store opened again reads the same.
    drop(store);
    let mut store = Store::open(&dir.db()).unwrap();
    assert_eq!(
        store.load_unsettled_sessions().unwrap(),
        std::slice::from_ref(&v2)
    );
    // Its first write of the session is in full (it remembers no row yet); then events ride.
    let v3 = progressed(&v2, 3, 8);
    store
        .apply(&[
            activity_record("s", 3),
            Record::Session(Box::new(v3.clone())),
        ])
        .unwrap();
    assert_eq!(stored_seq(&store), 3);
    let v4 = progressed(&v3, 4, 9);
    store
        .apply(&[
            activity_record("s", 4),
            Record::Session(Box::new(v4.clone())),
        ])
        .unwrap();
    assert_eq!(
        (stored_seq(&store), store.session("s").unwrap()),
        (3, Some(v4.clone()))
    );

    // A cursor moved by a line that made no activity: no row can carry it, the session's is
    // written.
    let mut v5 = v4.clone();
    v5.provider_cursor = 10;
    store
        .apply(&[Record::Session(Box::new(v5.clone()))])
        .unwrap();
    assert_eq!(column_of::<i64>(&store, "s", "provider_cursor"), 10);
    assert_eq!(store.session("s").unwrap(), Some(v5.clone()));

    // An event that also changes the state (its turn ends): the row is written.
    let mut v6 = progressed(&v5, 5, 11);
    v6.turn_open = false;
    store
        .apply(&[
            activity_record("s", 5),
            Record::Session(Box::new(v6.clone())),
        ])
        .unwrap();
    assert_eq!(stored_seq(&store), 5);
    assert_eq!(store.session("s").unwrap(), Some(v6.clone()));

    // A record whose seq is not the batch's last activity of it (an activity of a report
    // after it, say): written.
    let v7 = progressed(&v6, 6, 12);
    store
        .apply(&[
            activity_record("s", 6),
            Record::Session(Box::new(v7.clone())),
            activity_record("s", 7),
        ])
        .unwrap();
    assert_eq!(stored_seq(&store), 6);

    // Its end is written in full, and read as it is.
    let mut ended = progressed(&v7, 8, 13);
    ended.status = Status::Stopped;
    ended.run = None;
    ended.provider_cursor = 0;
    store
        .apply(&[
            activity_record("s", 8),
            Record::Session(Box::new(ended.clone())),
        ])
        .unwrap();
    assert_eq!(stored_seq(&store), 8);
    assert_eq!(store.session("s").unwrap(), Some(ended));
}

/// Version 17 keys activities by one integer: a database written before it keeps every
/// activity of every session, in order, with the progress its rows carried, and the sessions'
/// keys follow the order their activities were first written in.
#[test]
fn the_upgrade_to_one_integer_key_keeps_every_activity() {
    let dir = TempDir::new("v17");
    {
        let mut conn = Connection::open(dir.db()).unwrap();
        migrations::migrate(&mut conn, &MIGRATIONS[..16], 1).unwrap();
        let mut insert = conn
            .prepare(
                "INSERT INTO agent_activities (session_id, seq, turn, ends_turn, type, content,
                   tool_name, tool_call_id, tool_success, tokens_input, tokens_output, at,
                   session_cursor, session_tokens_input, session_tokens_output,
                   session_last_activity_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
            )
            .unwrap();
        // Written interleaved and out of seq order: the copy is by session, then seq.
        for (id, seq) in [
            ("b", 2),
            ("a", 1),
            ("b", 1),
            ("a", 3),
            ("a", 2),
            ("orphan", 1),
        ] {
            let ev = activity(id, seq);
            let a = &ev.activity;
            let carried = (id == "a" && seq == 3).then_some(42i64);
            insert
                .execute(rusqlite::params![
                    id,
                    seq as i64,
                    ev.turn.map(|t| t as i64),
                    ev.ends_turn,
                    a.kind().number(),
                    a.content,
                    a.tool_name,
                    a.tool_call_id,
                    a.tool_success,
                    a.tokens_input as i64,
                    a.tokens_output as i64,
                    ev.at.millis() as i64,
                    carried,
                    carried,
                    carried,
                    carried,
                ])
                .unwrap();
        }
    }
    let mut store = Store::open(&dir.db()).unwrap();
    for (id, n) in [("a", 3), ("b", 2), ("orphan", 1)] {
        let want: Vec<_> = (1..=n).map(|seq| activity(id, seq)).collect();
        assert_eq!(store.activities(id, 0, 100).unwrap(), want, "{id}");
        assert_eq!(
            store.last_activities(id, 2).unwrap().0,
            want[want.len().saturating_sub(2)..]
        );
    }
    let keys: Vec<(i64, String)> = pairs(
        &store.conn,
        "SELECT key, session_id FROM session_keys ORDER BY key",
    );
    assert_eq!(
        keys,
        [(1, "b".into()), (2, "a".into()), (3, "orphan".into())]
    );
    let carried: Vec<(i64, Option<i64>)> = pairs(
        &store.conn,
        "SELECT key, session_cursor FROM agent_activities ORDER BY key",
    );
    let key = |session: i64, seq: i64| (session << 32) | seq;
    assert_eq!(
        carried,
        [
            (key(1, 1), None),
            (key(1, 2), None),
            (key(2, 1), None),
            (key(2, 2), None),
            (key(2, 3), Some(42)),
            (key(3, 1), None),
        ]
    );
    // The next activity of a session goes on after its copied ones.
    store.apply(&[activity_record("a", 4)]).unwrap();
    assert_eq!(
        store.activities("a", 2, 100).unwrap(),
        [activity("a", 3), activity("a", 4)]
    );
}

/// The rows of a query of two columns.
fn pairs<A: rusqlite::types::FromSql, B: rusqlite::types::FromSql>(
    conn: &Connection,
    sql: &str,
) -> Vec<(A, B)> {
    conn.prepare(sql)
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

/// A session's key is never given to another: a session deleted and created again under the
/// same id starts with no activities, and a key made in a batch that rolled back is made
/// again by the next.
#[test]
fn session_keys_are_made_once_and_never_reused() {
    let mut store = Store::open_in_memory().unwrap();
    let key_of = |store: &Store, id: &str| -> Option<i64> {
        store
            .conn
            .query_row(super::SELECT_SESSION_KEY, [id], |r| r.get(0))
            .optional()
            .unwrap()
    };
    // The second activity repeats the first's key: the batch, and the key it made, roll back.
    let failed = store.apply(&[activity_record("s", 1), activity_record("s", 1)]);
    assert!(failed.is_err());
    assert_eq!(key_of(&store, "s"), None);
    store
        .apply(&[
            activity_record("s", 1),
            activity_record("t", 1),
            activity_record("s", 2),
        ])
        .unwrap();
    let (s, t) = (key_of(&store, "s").unwrap(), key_of(&store, "t").unwrap());
    assert!(s < t);
    // `t` holds the highest key: deleted (it has no session row, only activities), its key is
    // not the next one made.
    assert!(!store.delete_session("t").unwrap());
    assert_eq!(key_of(&store, "t"), None);
    assert!(store.activities("t", 0, 100).unwrap().is_empty());
    store.apply(&[activity_record("u", 1)]).unwrap();
    let u = key_of(&store, "u").unwrap();
    assert!(u > t, "{u} after {t}");
    // Created again under the same id, a session starts with no activities.
    store.apply(&[activity_record("t", 7)]).unwrap();
    assert!(key_of(&store, "t").unwrap() > u);
    assert_eq!(store.activities("t", 0, 100).unwrap(), [activity("t", 7)]);
    assert_eq!(
        store.activities("s", 0, 100).unwrap(),
        [activity("s", 1), activity("s", 2)]
    );
    // The same through a batch's `Record::Delete`.
    store
        .apply(&[Record::Delete(SessionId("s".into()))])
        .unwrap();
    assert!(store.activities("s", 0, 100).unwrap().is_empty());
    store.apply(&[activity_record("s", 3)]).unwrap();
    assert!(key_of(&store, "s").unwrap() > key_of(&store, "t").unwrap());
    assert_eq!(store.activities("s", 0, 100).unwrap(), [activity("s", 3)]);
    assert_eq!(store.activities("u", 0, 100).unwrap(), [activity("u", 1)]);
}

/// A session deleted in the middle of a batch takes its key with it: an activity of the same
/// id after the delete, in the same batch or the next, is stored under a new key and read back.
#[test]
fn a_delete_within_a_batch_takes_the_sessions_key_with_it() {
    let mut store = Store::open_in_memory().unwrap();
    store.apply(&[activity_record("s", 1)]).unwrap();
    store
        .apply(&[
            activity_record("s", 2),
            Record::Delete(SessionId("s".into())),
            activity_record("s", 1),
        ])
        .unwrap();
    assert_eq!(store.activities("s", 0, 10).unwrap(), [activity("s", 1)]);
    store.apply(&[activity_record("s", 2)]).unwrap();
    assert_eq!(
        store.activities("s", 0, 10).unwrap(),
        [activity("s", 1), activity("s", 2)]
    );
    assert_eq!(
        count(&store, "agent_activities"),
        2,
        "nothing left under the old key"
    );
}

/// A session's key deleted by another program (by hand, with `sqlite3`) is not used again
/// from memory: the next activity of that id makes a new key, and is read back.
#[test]
fn a_key_another_program_deleted_is_not_used_from_memory() {
    let dir = TempDir::new("keys-by-hand");
    let mut store = Store::open(&dir.db()).unwrap();
    store.apply(&[activity_record("s", 1)]).unwrap();
    let by_hand = Connection::open(dir.db()).unwrap();
    by_hand
        .execute_batch(
            "DELETE FROM agent_activities; DELETE FROM session_keys WHERE session_id = 's';",
        )
        .unwrap();
    store.apply(&[activity_record("s", 2)]).unwrap();
    assert_eq!(store.activities("s", 0, 10).unwrap(), [activity("s", 2)]);
}

/// An activity's number past what its key holds is refused with a clear error, not stored
/// under another session's key; the last one that fits is stored and read back.
#[test]
fn an_activity_number_past_the_key_is_refused() {
    let mut store = Store::open_in_memory().unwrap();
    let last = activity("s", super::SEQ_MAX);
    store
        .apply(&[Record::Activity(Arc::new(last.clone()))])
        .unwrap();
    let err = store
        .apply(&[activity_record("s", super::SEQ_MAX + 1)])
        .unwrap_err();
    assert!(matches!(err, StoreError::Limit(_)), "{err}");
    assert!(err.to_string().contains("4294967295"), "{err}");
    assert_eq!(
        store.activities("s", 0, 10).unwrap(),
        std::slice::from_ref(&last)
    );
    assert_eq!(store.activities("s", u64::MAX, 10).unwrap(), []);
    assert_eq!(store.last_activities("s", 10).unwrap(), (vec![last], false));
}

/// Only a committed batch's progress is read back: a batch rolled back leaves the session as
/// it was, and the next event rides again.
#[test]
fn a_rolled_back_batch_carries_nothing() {
    let mut store = Store::open_in_memory().unwrap();
    let mut rec = bare_record("s");
    rec.status = Status::Working;
    rec.run = Some(1);
    store
        .apply(&[Record::Session(Box::new(rec.clone()))])
        .unwrap();
    let v1 = progressed(&rec, 1, 1);
    // The second activity repeats the first's key: the batch fails.
    let failed = store.apply(&[
        activity_record("s", 1),
        Record::Session(Box::new(v1.clone())),
        activity_record("s", 1),
    ]);
    assert!(failed.is_err());
    assert_eq!(store.session("s").unwrap(), Some(rec));
    store
        .apply(&[
            activity_record("s", 1),
            Record::Session(Box::new(v1.clone())),
        ])
        .unwrap();
    assert_eq!(store.session("s").unwrap(), Some(v1));
}

/// One step of a session's life in [`carried_progress_reads_back_as_written`].
#[derive(Debug, Clone)]
enum Step {
    /// An event of its agent: an activity, the cursor and the tokens move.
    Event { cursor: u64, tokens: u64 },
    /// An event that also changes its state (a turn opens or closes).
    EventAndState { cursor: u64 },
    /// A line that made no activity: only the cursor moves.
    Cursor(u64),
    /// An activity another process reported: its seq and time move, nothing else.
    Report,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (1..5u64, 0..9u64).prop_map(|(cursor, tokens)| Step::Event { cursor, tokens }),
        1 => (1..5u64).prop_map(|cursor| Step::EventAndState { cursor }),
        1 => (1..5u64).prop_map(Step::Cursor),
        1 => Just(Step::Report),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Whatever mix of events, state changes and bare cursor moves two sessions go through, in
    /// batches of any size, and wherever the store is closed and opened again (a crash between
    /// batches), every read gives the last record written: the progress an activity row carries
    /// and the row's own state always add up to it.
    #[test]
    fn carried_progress_reads_back_as_written(
        steps in proptest::collection::vec((step(), proptest::bool::ANY, 0..2usize), 1..40),
        reopen_every in 2..9usize,
    ) {
        let dir = TempDir::new("carried-prop");
        let mut store = Store::open(&dir.db()).unwrap();
        let mut recs: Vec<SessionRecord> = ["a", "b"]
            .iter()
            .map(|id| {
                let mut r = bare_record(id);
                r.status = Status::Running;
                r.run = Some(1);
                r
            })
            .collect();
        store
            .apply(&recs.iter().map(|r| Record::Session(Box::new(r.clone()))).collect::<Vec<_>>())
            .unwrap();
        let mut batch = Vec::new();
        for (n, (step, ends_batch, who)) in steps.into_iter().enumerate() {
            let rec = &mut recs[who];
            let id = rec.id.0.clone();
            let mut activity_of = |rec: &mut SessionRecord| {
                rec.last_activity_seq += 1;
                rec.last_activity_at =
                    Some(paddock_core::Timestamp::from_millis(1_000 + rec.last_activity_seq));
                batch.push(activity_record(&id, rec.last_activity_seq));
            };
            match step {
                Step::Event { cursor, tokens } => {
                    rec.provider_cursor += cursor;
                    rec.tokens_input += tokens;
                    rec.tokens_output += 2 * tokens;
                    activity_of(rec);
                }
                Step::EventAndState { cursor } => {
                    rec.provider_cursor += cursor;
                    rec.turn_open = !rec.turn_open;
                    rec.turns += u64::from(rec.turn_open);
                    activity_of(rec);
                }
                Step::Cursor(c) => rec.provider_cursor += c,
                Step::Report => activity_of(rec),
            }
            batch.push(Record::Session(Box::new(rec.clone())));
            if ends_batch {
                store.apply(&std::mem::take(&mut batch)).unwrap();
                for r in &recs {
                    let read = store.session(&r.id.0).unwrap();
                    proptest::prop_assert_eq!(read.as_ref(), Some(r));
                }
                if n % reopen_every == 0 {
                    drop(store);
                    store = Store::open(&dir.db()).unwrap();
                    proptest::prop_assert_eq!(&store.load_unsettled_sessions().unwrap(), &recs);
                }
            }
        }
        store.apply(&batch).unwrap();
        proptest::prop_assert_eq!(&store.load_unsettled_sessions().unwrap(), &recs);
        let page: Vec<SessionRecord> = store
            .sessions_before("", None, None, 10)
            .unwrap()
            .into_iter()
            .map(|(r, _)| (*r).clone())
            .rev()
            .collect();
        proptest::prop_assert_eq!(&page, &recs);
        // An end is written in full and read as it is.
        for rec in &mut recs {
            rec.status = Status::Stopped;
            rec.run = None;
            rec.provider_cursor = 0;
        }
        store
            .apply(&recs.iter().map(|r| Record::Session(Box::new(r.clone()))).collect::<Vec<_>>())
            .unwrap();
        for r in &recs {
            let read = store.session(&r.id.0).unwrap();
            proptest::prop_assert_eq!(read.as_ref(), Some(r));
        }
    }
}

/// A session's carried progress is read through the activities' key, one seek past the row's
/// own seq: never a scan of the session's activities.
#[test]
fn carried_progress_is_read_through_the_activity_key() {
    let store = Store::open_in_memory().unwrap();
    let plan = query_plan(&store.conn, &super::SELECT_CARRIED);
    assert!(
        plan.iter().any(|s| s.starts_with("SEARCH agent_activities")
            && s.contains("INTEGER PRIMARY KEY (rowid>? AND rowid<?)")),
        "{plan:#?}"
    );
    assert!(!plan.iter().any(|s| s.starts_with("SCAN")), "{plan:#?}");
}

/// Every read of a session's activities is a range of the activities' key, found through the
/// session's key: never a scan.
#[test]
fn activities_are_read_as_a_range_of_their_key() {
    let store = Store::open_in_memory().unwrap();
    for sql in [
        super::SELECT_ACTIVITIES_AFTER.as_str(),
        super::SELECT_LAST_ACTIVITIES.as_str(),
    ] {
        let plan = query_plan(&store.conn, sql);
        assert!(
            plan.iter().any(|s| s.starts_with("SEARCH agent_activities")
                && s.contains("INTEGER PRIMARY KEY (rowid>? AND rowid<?)")),
            "{sql}: {plan:#?}"
        );
        assert!(
            plan.iter()
                .any(|s| s.contains("SEARCH session_keys USING COVERING INDEX")),
            "{sql}: {plan:#?}"
        );
        assert!(
            !plan.iter().any(|s| s.starts_with("SCAN")),
            "{sql}: {plan:#?}"
        );
    }
}

/// What a batch does in [`activities_read_back_in_order_whatever_their_shapes`].
#[derive(Debug, Clone)]
enum Put {
    /// An activity of session 0 or 1: plain text, a tool call, or text marked successful
    /// (each kind of row the inserts bind differently).
    Activity(usize, u8),
    /// Session 0 or 1 is deleted.
    Delete(usize),
}

fn put() -> impl proptest::strategy::Strategy<Value = Put> {
    use proptest::prelude::*;
    prop_oneof![
        20 => (0..2usize, 0..3u8).prop_map(|(s, shape)| Put::Activity(s, shape)),
        1 => (0..2usize).prop_map(Put::Delete),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Activities go into the table many to a statement (`activities.rs`). Whatever the mix
    /// of shapes, sessions and deletes in batches of any size, each session reads back
    /// exactly the activities written since its last delete, in order.
    #[test]
    fn activities_read_back_in_order_whatever_their_shapes(
        puts in proptest::collection::vec(put(), 1..200),
        batch in 1..120usize,
    ) {
        let mut store = Store::open_in_memory().unwrap();
        let ids = ["s0", "s1"];
        let mut want: [Vec<ActivityEvent>; 2] = Default::default();
        let mut seqs = [0u64; 2];
        for chunk in puts.chunks(batch) {
            let mut records = Vec::new();
            for p in chunk {
                match *p {
                    Put::Activity(s, shape) => {
                        seqs[s] += 1;
                        let seq = seqs[s];
                        let mut a = Activity::new(ActivityKind::Text, format!("text {seq}"))
                            .with_tokens(seq, 1);
                        match shape {
                            0 => {}
                            1 => a = a.with_tool("bash", format!("call-{seq}")),
                            _ => a.tool_success = true,
                        }
                        let ev = ActivityEvent {
                            session: SessionId(ids[s].to_string()),
                            seq,
                            turn: Some(1),
                            ends_turn: false,
                            activity: a,
                            at: paddock_core::Timestamp::from_millis(1_700_000_000_000 + seq),
                        };
                        want[s].push(ev.clone());
                        records.push(Record::Activity(Arc::new(ev)));
                    }
                    Put::Delete(s) => {
                        want[s].clear();
                        seqs[s] = 0;
                        records.push(Record::Delete(SessionId(ids[s].to_string())));
                    }
                }
            }
            store.apply(&records).unwrap();
        }
        for s in 0..2 {
            proptest::prop_assert_eq!(&store.activities(ids[s], 0, usize::MAX).unwrap(), &want[s]);
        }
        // And nothing else: no row went in under a deleted session's key.
        let rows: i64 = store
            .conn
            .query_row("SELECT COUNT(*) FROM agent_activities", [], |r| r.get(0))
            .unwrap();
        proptest::prop_assert_eq!(rows as usize, want[0].len() + want[1].len());
    }
}
