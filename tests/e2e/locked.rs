//! Another program holding the database's write lock (a `sqlite3` shell left in a transaction,
//! a backup): past the writer's 5 s wait the daemon does not exit. Like a full disk
//! (`diskfull.rs`) it refuses new work, with UNAVAILABLE `OBEY-2052 … database locked`,
//! answers reads, keeps the agents, and once the lock is let go it stores what waited and goes
//! on, having lost nothing it acknowledged.

use std::time::{Duration, Instant};

use paddock_proto::obey::local::v1 as pb;
use tonic::Code;

use crate::diskfull::{answered_and_stored, hold};
use crate::harness::*;
use crate::lifecycle::refused_start;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_locked_by_another_program_refuses_new_work_and_loses_nothing() {
    let mut d = Daemon::start().await;
    let s = d.session(None).await;
    let before = d.send(&s.id, "before the lock").await;
    assert!(!before.is_empty());

    // Another program takes the write lock and keeps it.
    let other = rusqlite::Connection::open(d.dirs.data.join("paddock.db")).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();

    // A message whose turn cannot be stored: its answer waits with it.
    let held = hold(&d, &s.id, "while the database is locked".into()).await;

    // Past the writer's 5 s wait new work is refused, with the reason.
    let t0 = Instant::now();
    let refused = loop {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "no create refused while the database is locked"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let req = d.request(None).await;
        if let Err(e) = within(d.client().await.create_session(req)).await {
            break e;
        }
    };
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().starts_with("OBEY-2052: database locked"),
        "{refused:?}"
    );
    assert!(
        refused.message().contains("paddock.db"),
        "it names the file: {refused:?}"
    );

    // Reads are answered at once (each try of the held batch waits 50 ms for the lock, not
    // 5 s), the daemon and the agent are alive, the held message is not acknowledged.
    let t = Instant::now();
    d.client()
        .await
        .ping(pb::PingRequest {})
        .await
        .expect("ping");
    let now = d.get(&s.id).await;
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "reads waited {:?}",
        t.elapsed()
    );
    assert!(pid_running(now.pid as u32), "the agent lives");
    assert!(!held.is_finished(), "the message is not acknowledged yet");
    assert!(
        d.stderr().contains("database locked by another program"),
        "{}",
        d.stderr()
    );

    // The lock is let go: what waited is stored and answered, and new work is taken again.
    other.execute_batch("ROLLBACK").unwrap();
    drop(other);
    answered_and_stored(&mut d, &s.id, before.len(), held).await;
}

/// A daemon that starts while another program holds the lock (past the 5 s wait) exits 1 and
/// says why; once the lock goes it starts on the same store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_started_while_the_database_is_locked_says_so() {
    let mut d = Daemon::start().await;
    let s = d.session(None).await;
    assert!(d.shut_down(Duration::from_secs(15)).await.success());
    let other = rusqlite::Connection::open(d.dirs.data.join("paddock.db")).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let err = refused_start(&d, &d.dirs.socket, &d.dirs.data).await;
    assert!(
        err.contains("database is locked (another program holds the database's write lock"),
        "{err}"
    );
    other.execute_batch("ROLLBACK").unwrap();
    drop(other);
    d.launch().await;
    assert_eq!(d.get(&s.id).await.id, s.id);
}
