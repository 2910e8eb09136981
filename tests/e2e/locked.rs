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
    let refused = refused_create(&mut d).await;
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

/// A daemon that starts while another program holds the lock starts all the same (a database
/// at its version is only read at start): it answers reads at once, and new work waits or is
/// refused with 2052, as in a running daemon, until the lock goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_started_while_the_database_is_locked_answers_and_waits_for_it() {
    let mut d = Daemon::start().await;
    let s = d.session(None).await;
    assert!(d.shut_down(Duration::from_secs(15)).await.success());
    let other = rusqlite::Connection::open(d.dirs.data.join("paddock.db")).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();

    let t = Instant::now();
    d.launch().await;
    assert_eq!(d.get(&s.id).await.id, s.id);
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "the start waited {:?} (the writer's wait is 5 s)",
        t.elapsed()
    );

    // The first create cannot be stored: its answer waits with it; the next ones are refused.
    let req = d.request(None).await;
    let mut client = d.client().await;
    let first = tokio::spawn(async move { client.create_session(req).await });
    refused_create(&mut d).await;
    assert!(
        !first.is_finished(),
        "the first create is not acknowledged yet"
    );

    // The lock goes: the first create is answered and stored, and new work is taken again.
    other.execute_batch("ROLLBACK").unwrap();
    drop(other);
    let created = within(first)
        .await
        .unwrap()
        .expect("the create that waited")
        .into_inner()
        .session
        .unwrap();
    let t0 = Instant::now();
    loop {
        let req = d.request(None).await;
        match within(d.client().await.create_session(req)).await {
            Ok(_) => break,
            Err(e) => {
                assert!(
                    t0.elapsed() < Duration::from_secs(30),
                    "still refused: {e:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    // Stored, not only answered: the next daemon on this data dir has it.
    assert!(d.shut_down(Duration::from_secs(15)).await.success());
    d.launch().await;
    assert_eq!(d.get(&created.id).await.id, created.id);
}

/// The first create refused (within 30 s), refused as the lock says: UNAVAILABLE, 2052.
async fn refused_create(d: &mut Daemon) -> tonic::Status {
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
    refused
}
