//! The torture test (issue 15 point 9; the reliability review's crash test, kept in the
//! repository): sessions under load, the daemon SIGKILLed again and again at random moments
//! (every third round the runner with it), clients reconnecting and carrying on. After the
//! last round: no event a client received is missing or different in the store, every
//! session's activity numbers are 1..n, every turn's steps are a gapless prefix in order (all
//! of them when the turn completed), every session is adopted or FAILED with the code that says
//! why, and no agent process is left but the live sessions' own.
//!
//! Short by default (6 rounds, a few seconds); the long mode is
//! `PADDOCK_TORTURE_ROUNDS=50 cargo test -p paddock --test e2e torture -- --nocapture`
//! (its figures are printed). `PADDOCK_TORTURE_SEED` replays a run's kill timings.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use paddock_proto::obey::local::v1 as pb;
use pb::local_daemon_service_client::LocalDaemonServiceClient;
use serde_json::json;

use crate::harness::*;

const SESSIONS: usize = 6;
const STEPS: usize = 40;

/// Every event a client received: (session, seq) → content.
type Acked = Arc<Mutex<BTreeMap<(String, i64), String>>>;

/// A small deterministic generator (xorshift), so that a failing run can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn paced_turn() -> serde_json::Value {
    let steps: Vec<serde_json::Value> = (0..STEPS)
        .map(|i| json!({"thinking": format!("{{message}}|{i}"), "tokens_in": 1, "delay_ms": 10}))
        .chain([json!({"result": "done {message}", "tokens_out": 1})])
        .collect();
    turns(json!(steps))
}

/// One client's loop: whenever its session is idle, a turn; after a crash, wait for the daemon,
/// restart a session that failed, and go on.
async fn drive(
    socket: PathBuf,
    id: String,
    stop: Arc<AtomicBool>,
    acked: Acked,
    turns: Arc<AtomicU64>,
) {
    let short = id[id.len() - 6..].to_string();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let Ok(ch) = paddock::transport::channel(&socket).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let mut c = LocalDaemonServiceClient::new(ch);
        let s = match c
            .get_session(pb::GetSessionRequest {
                session_id: id.clone(),
            })
            .await
        {
            Ok(s) => s.into_inner(),
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        match status_name(s.status) {
            "RUNNING" => {}
            "FAILED" | "STOPPED" => {
                let _ = c
                    .restart_session(pb::RestartSessionRequest {
                        session_id: id.clone(),
                        provider_config: Default::default(),
                    })
                    .await;
                continue;
            }
            // A turn adopted after a restart is still going, or the agent is starting.
            _ => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        }
        n += 1;
        let Ok(stream) = c
            .send_message(pb::SendMessageRequest {
                session_id: id.clone(),
                message: format!("{short}-t{n}"),
            })
            .await
        else {
            continue;
        };
        let mut stream = stream.into_inner();
        while let Ok(Some(ev)) = stream.message().await {
            let done = ev.r#type == pb::ActivityType::Completion as i32;
            acked
                .lock()
                .unwrap()
                .insert((id.clone(), ev.seq), ev.content.clone());
            if done {
                turns.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The scripted agents of this test's tempdir, by pid.
fn agents_of(base: &std::path::Path) -> BTreeSet<u32> {
    let base = base.display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("__scripted-agent") && c.contains(&base)
            })
        })
        .collect()
}

async fn all_activities(c: &mut Client, id: &str) -> Vec<pb::SessionActivityEvent> {
    let mut out: Vec<pb::SessionActivityEvent> = Vec::new();
    loop {
        let page = c
            .list_activities(pb::ListActivitiesRequest {
                session_id: id.into(),
                after_seq: out.last().map_or(0, |a| a.seq),
                limit: 0,
            })
            .await
            .unwrap()
            .into_inner()
            .activities;
        if page.is_empty() {
            return out;
        }
        out.extend(page);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_under_load_loses_nothing_and_leaves_nothing() {
    let rounds: u32 = std::env::var("PADDOCK_TORTURE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let seed: u64 = std::env::var("PADDOCK_TORTURE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| u64::from(std::process::id()) | 1);
    eprintln!("torture: {rounds} rounds, PADDOCK_TORTURE_SEED={seed}");
    let mut rng = Rng(seed);
    let mut d = Daemon::start().await;
    let mut ids = Vec::new();
    for _ in 0..SESSIONS {
        ids.push(d.session(Some(("paced", paced_turn()))).await.id);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Acked = Arc::default();
    let turns = Arc::new(AtomicU64::new(0));
    let drivers: Vec<_> = ids
        .iter()
        .map(|id| {
            tokio::spawn(drive(
                d.dirs.socket.clone(),
                id.clone(),
                stop.clone(),
                acked.clone(),
                turns.clone(),
            ))
        })
        .collect();
    let mut runner_kills = 0;
    for round in 1..=rounds {
        tokio::time::sleep(Duration::from_millis(300 + rng.below(1500))).await;
        let runner = d.runner_pid();
        d.kill9();
        if round % 3 == 0 {
            if let Some(pid) = runner {
                runner_kills += 1;
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.below(400))).await;
        d.launch().await;
    }
    // Let the load run a little past the last crash, then let every turn end.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::Relaxed);
    for t in drivers {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .expect("a client loop ends once its turn does")
            .unwrap();
    }

    let mut c = d.client().await;
    let acked = acked.lock().unwrap().clone();
    let mut stored_total = 0;
    let mut live_pids = BTreeSet::new();
    for id in &ids {
        let s = d.get(id).await;
        match status_name(s.status) {
            "RUNNING" => {
                live_pids.insert(s.pid as u32);
            }
            "FAILED" => assert!(
                s.error_message.starts_with("OBEY-2031")
                    || s.error_message.starts_with("OBEY-2032"),
                "{id} failed for another reason: {}",
                s.error_message
            ),
            other => panic!("{id} was left {other} after the load ended"),
        }
        let stored = all_activities(&mut c, id).await;
        stored_total += stored.len();
        let seqs: Vec<i64> = stored.iter().map(|a| a.seq).collect();
        assert_eq!(
            seqs,
            (1..=stored.len() as i64).collect::<Vec<_>>(),
            "{id}: activity numbers with a gap or a repeat"
        );
        let by_seq: BTreeMap<i64, &str> =
            stored.iter().map(|a| (a.seq, a.content.as_str())).collect();
        for ((sid, seq), content) in acked.range((id.clone(), 0)..=(id.clone(), i64::MAX)) {
            assert_eq!(
                by_seq.get(seq).copied(),
                Some(content.as_str()),
                "{sid}: acknowledged event {seq} is missing or different in the store"
            );
        }
        // Each turn's steps: 0, 1, 2, … in order, none twice; all of them if it completed.
        let mut steps: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        let mut completed = BTreeSet::new();
        for a in &stored {
            if let Some((msg, i)) = a.content.split_once('|') {
                steps.entry(msg).or_default().push(i.parse().unwrap());
            } else if let Some(msg) = a.content.strip_prefix("done ") {
                completed.insert(msg);
            }
        }
        for (msg, got) in &steps {
            assert_eq!(
                *got,
                (0..got.len()).collect::<Vec<_>>(),
                "{id}: turn {msg} lost, repeated or reordered a step"
            );
            if completed.contains(msg) {
                assert_eq!(
                    got.len(),
                    STEPS,
                    "{id}: turn {msg} completed without every step"
                );
            }
        }
    }
    // No agent but the live sessions' own (the ones a killed runner took along are gone).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let agents = agents_of(&d.dirs.base);
        if agents == live_pids {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "agent processes {agents:?}, live sessions' {live_pids:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "torture: {rounds} rounds ({runner_kills} with the runner), {} turns completed, {} events \
         acknowledged to clients, {stored_total} stored, 0 lost, 0 repeated, 0 orphans",
        turns.load(Ordering::Relaxed),
        acked.len()
    );
    assert!(turns.load(Ordering::Relaxed) > 0, "the load ran");
}
