//! `paddock daemon --runner`: agents run in the runner, so the daemon can die (SIGKILL, mid
//! turn) and come back without killing a single agent: every session is back, its agent the
//! same process, its turn goes on, every event reaches the store and the watchers exactly once.

use std::collections::BTreeSet;
use std::time::Duration;

use paddock_proto::obey::local::v1 as pb;
use paddock_proto::runner::v1 as rpb;
use rpb::runner_client::RunnerClient;
use serde_json::json;

use crate::harness::*;

fn paced_turn() -> serde_json::Value {
    turns(json!([
        {"thinking": "step one", "tokens_in": 10, "tokens_out": 1, "delay_ms": 100},
        {"thinking": "step two", "tokens_in": 10, "tokens_out": 1, "delay_ms": 900},
        {"thinking": "step three", "tokens_in": 10, "tokens_out": 1, "delay_ms": 900},
        {"result": "done with {message}", "tokens_in": 40, "tokens_out": 7}
    ]))
}

async fn runner_daemon() -> Daemon {
    Daemon::start_with(Dirs::new(), &[]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_killed_mid_turn_takes_its_agents_back() {
    let mut d = runner_daemon().await;
    let busy = d.session(Some(("paced", paced_turn()))).await;
    let idle = d.session(None).await;
    let runner = d.runner_pid().expect("a runner");
    assert_ne!(runner, d.pid());

    // A turn in progress when the daemon dies.
    let c = d.client().await;
    let mut stream = c
        .clone()
        .send_message(pb::SendMessageRequest {
            session_id: busy.id.clone(),
            message: "the job".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = next(&mut stream).await.unwrap().unwrap();
    assert_eq!(kind(&first), "THINKING");
    d.kill9();
    assert!(
        agent_running(busy.pid as u32),
        "the agent outlives the daemon"
    );
    assert!(agent_running(idle.pid as u32));

    d.launch().await;
    assert_eq!(d.runner_pid(), Some(runner), "the same runner");
    // Every session is back, with the same agent process.
    let b = d.get(&busy.id).await;
    assert_eq!(status_name(b.status), "WORKING");
    assert_eq!(b.pid, busy.pid);
    let i = d.get(&idle.id).await;
    assert_eq!(status_name(i.status), "RUNNING");
    assert_eq!(i.pid, idle.pid);

    // The turn goes on and ends; a watcher from the start sees every activity exactly once.
    let done = d.wait_status(&busy.id, pb::SessionStatus::Running).await;
    let stored = d.stored_activities(&busy.id).await;
    let seqs: Vec<i64> = stored.iter().map(|a| a.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as i64).collect::<Vec<_>>());
    let contents: Vec<&str> = stored.iter().map(|a| a.content.as_str()).collect();
    assert_eq!(
        contents,
        ["step one", "step two", "step three", "done with the job"],
        "each activity exactly once; daemon log: {}",
        d.stderr()
    );
    let distinct: BTreeSet<&str> = contents.iter().copied().collect();
    assert_eq!(distinct.len(), contents.len());
    // The turn's totals, as its result line reported them.
    assert_eq!(done.tokens_input, 40);
    assert_eq!(done.tokens_output, 7);

    // And it keeps working.
    let acts = d.send(&idle.id, "after the restart").await;
    assert_eq!(kind(acts.last().unwrap()), "COMPLETION");

    // A clean shutdown stops the agents and the runner.
    let st = d.shut_down(Duration::from_secs(15)).await;
    assert_eq!(st.code(), Some(0));
    assert_agent_gone(busy.pid).await;
    assert_agent_gone(idle.pid).await;
    within(async {
        while pid_running(runner) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_after_a_restart_see_the_rest_of_the_life() {
    let mut d = runner_daemon().await;
    let s = d.session(Some(("paced", paced_turn()))).await;
    let c = d.client().await;
    let _stream = c
        .clone()
        .send_message(pb::SendMessageRequest {
            session_id: s.id.clone(),
            message: "x".into(),
        })
        .await
        .unwrap()
        .into_inner();
    tokio::time::sleep(Duration::from_millis(300)).await;
    d.kill9();
    d.launch().await;
    let mut watch = d
        .client()
        .await
        .watch_session(pb::WatchSessionRequest {
            session_id: s.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let evs = collect_until(&mut watch, |e| {
        e.new_status == pb::SessionStatus::Running as i32
    })
    .await;
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(status_name(evs[0].previous_status), "WORKING");
    d.stop(&s.id, false).await.unwrap();
    let evs = collect_ok(watch).await;
    let names: Vec<&str> = evs.iter().map(|e| status_name(e.new_status)).collect();
    assert_eq!(names, ["STOPPING", "STOPPED"]);
    assert_agent_gone(s.pid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_runner_dies_its_agents_die_and_their_sessions_fail() {
    let mut d = runner_daemon().await;
    let s = d.session(Some(("paced", paced_turn()))).await;
    let runner = d.runner_pid().expect("a runner");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(runner as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let failed = d.wait_status(&s.id, pb::SessionStatus::Failed).await;
    assert_eq!(failed.error_code, "OBEY-2031");
    assert!(
        failed.error_message.contains("runner"),
        "{}",
        failed.error_message
    );
    assert_agent_gone(s.pid).await;
    // Runner and daemon gone together: a restarted daemon starts a new runner and reconciles.
    let s2 = d.session(None).await;
    d.kill9();
    let runner2 = d.runner_pid().expect("a new runner");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(runner2 as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    assert_agent_gone(s2.pid).await;
    d.launch().await;
    let s2 = d.get(&s2.id).await;
    assert_eq!(status_name(s2.status), "FAILED");
    assert_eq!(s2.error_code, "OBEY-2032");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_ends_while_the_daemon_is_down_is_read_to_its_end() {
    let mut d = runner_daemon().await;
    let s = d.session(Some(("paced", paced_turn()))).await;
    let c = d.client().await;
    let mut stream = c
        .clone()
        .send_message(pb::SendMessageRequest {
            session_id: s.id.clone(),
            message: "quick".into(),
        })
        .await
        .unwrap()
        .into_inner();
    next(&mut stream).await.unwrap().unwrap();
    d.kill9();
    // The turn finishes (about 2 s) while no daemon is there to read it.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    d.launch().await;
    let back = d.wait_status(&s.id, pb::SessionStatus::Running).await;
    assert_eq!(back.pid, s.pid);
    let stored = d.stored_activities(&s.id).await;
    let contents: Vec<&str> = stored.iter().map(|a| a.content.as_str()).collect();
    assert_eq!(
        contents,
        ["step one", "step two", "step three", "done with quick"]
    );
    // A restart after the daemon restart gets a run id the runner does not know yet.
    let r = d
        .client()
        .await
        .restart_session(pb::RestartSessionRequest {
            session_id: s.id.clone(),
            provider_config: Default::default(),
        })
        .await
        .expect("restart")
        .into_inner()
        .session
        .unwrap();
    assert_eq!(status_name(r.status), "RUNNING");
    assert_eq!(r.restart_count, 1);
    assert_ne!(r.pid, s.pid);
}

/// A daemon whose runner keeps 20 events per run, killed (SIGKILL) while a turn of 150 steps
/// runs and started again once the turn (1.5 s) has ended with no daemon reading it.
async fn a_turn_written_while_the_daemon_was_away() -> (Daemon, pb::SessionInfo) {
    let mut d = Daemon::start_with(Dirs::new(), &["--runner-buffer-events", "20"]).await;
    let steps: Vec<serde_json::Value> = (0..150)
        .map(|i| json!({"thinking": format!("step {i}"), "delay_ms": 10}))
        .chain([json!({"result": "done"})])
        .collect();
    let s = d.session(Some(("long", turns(json!(steps))))).await;
    let mut stream = d.start_turn(&s.id, "go").await;
    next(&mut stream).await.unwrap().unwrap();
    d.kill9();
    tokio::time::sleep(Duration::from_millis(3000)).await;
    d.launch().await;
    (d, s)
}

/// Review D5: output the runner could not keep while the daemon was away is not lost
/// silently. With a 20-event buffer, a turn of 150 steps written while the daemon is down
/// loses most of them; the session records the gap as a STATUS activity, the turn still ends
/// with its result, and nothing is recorded twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_lost_while_the_daemon_was_away_is_recorded() {
    let (d, s) = a_turn_written_while_the_daemon_was_away().await;
    d.wait_status(&s.id, pb::SessionStatus::Running).await;
    let stored = d.stored_activities(&s.id).await;
    let lost: Vec<&pb::SessionActivityEvent> = stored
        .iter()
        .filter(|a| a.content.starts_with("output lost: "))
        .collect();
    assert_eq!(lost.len(), 1, "one record of the gap: {stored:#?}");
    assert_eq!(lost[0].r#type, pb::ActivityType::Status as i32, "{lost:?}");
    assert!(
        lost[0].content.contains("--runner-buffer-events"),
        "it says how to keep more: {}",
        lost[0].content
    );
    let thinking = stored
        .iter()
        .filter(|a| a.content.starts_with("step "))
        .count();
    assert!(
        thinking < 150,
        "a 20-event buffer cannot have kept 150 steps"
    );
    assert_eq!(stored.last().unwrap().content, "done", "the turn ended");
    let seqs: Vec<i64> = stored.iter().map(|a| a.seq).collect();
    let want: Vec<i64> = (1..=stored.len() as i64).collect();
    assert_eq!(seqs, want, "gapless, nothing twice");
}

/// Review D7: the runner honours the daemon's --max-sessions (no hidden cap of 128).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_takes_as_many_agents_as_the_daemon_allows() {
    let mut d = Daemon::start_with(Dirs::new(), &["--max-sessions", "140"]).await;
    let mut ids = Vec::new();
    for _ in 0..130 {
        let s = d.session(None).await;
        assert_eq!(status_name(s.status), "RUNNING");
        ids.push(s.id);
    }
    let live = d
        .client()
        .await
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sessions;
    assert_eq!(live.len(), 130);
}

/// The daemon's runner, as a client of its own (the runner contract).
async fn runner_client(d: &Daemon) -> RunnerClient<tonic::transport::Channel> {
    let ch = paddock::transport::channel(&d.dirs.data.join("runner.sock"))
        .await
        .expect("connect to the runner");
    RunnerClient::new(ch)
}

/// Issue 16: the runner keeps only what the daemon has not stored (`AckRun` after each
/// commit): after a turn of 3,000 events the run holds at most the event the session's cursor
/// is in, not its whole buffer; and a daemon started again with other limits sets them on the
/// runner it finds (`SetLimits`), so its --max-sessions reaches a runner it did not start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runner_keeps_only_what_the_daemon_has_not_stored() {
    let mut d = Daemon::start_with(Dirs::new(), &["--max-sessions", "2"]).await;
    let steps: Vec<serde_json::Value> = (0..3000)
        .map(|i| json!({"thinking": format!("step {i}")}))
        .chain([json!({"result": "done"})])
        .collect();
    let s = d.session(Some(("long", turns(json!(steps))))).await;
    let acts = d.send(&s.id, "go").await;
    assert_eq!(kind(acts.last().unwrap()), "COMPLETION");
    assert_eq!(acts.len(), 3001);
    let mut runner = runner_client(&d).await;
    let run = |runs: Vec<rpb::RunInfo>| {
        runs.into_iter()
            .find(|r| r.run_id.starts_with(&format!("agent:{}:", s.id)))
            .expect("the session's run")
    };
    let held = within(async {
        loop {
            let r = run(runner
                .list_runs(rpb::ListRunsRequest {})
                .await
                .unwrap()
                .into_inner()
                .runs);
            let held = if r.first_seq == 0 {
                0
            } else {
                r.last_seq + 1 - r.first_seq
            };
            if held <= 1 {
                return (held, r.last_seq);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(held.1 > 10, "the turn went through the runner: {held:?}");

    // A daemon killed mid-turn still finds every unstored event after its cursor (the other
    // runner_mode tests), and the next one sets its own limits on the same runner.
    let pid = d.runner_pid();
    d.kill9();
    d.extra_args = vec!["--max-sessions".into(), "80".into()];
    d.launch().await;
    assert_eq!(d.runner_pid(), pid, "the same runner");
    let limits = runner
        .set_limits(rpb::SetLimitsRequest::default())
        .await
        .expect("SetLimits with nothing to change reads them")
        .into_inner();
    assert_eq!(
        limits.max_runs,
        80 + 64,
        "sessions + tasks of the new daemon"
    );
    // The session is back and works; what it says is stored once.
    let acts = d.send(&s.id, "again").await;
    assert_eq!(kind(acts.last().unwrap()), "COMPLETION");
}

/// Review D5, for Aria clients: output lost while the daemon was away is found by the
/// restart, before any client could resubscribe; a StreamNotifications subscriber that comes
/// after the restart is still told (a session notification, status unchanged, the message
/// saying what was lost), and a second subscriber gets the same notice under the same id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_lost_while_the_daemon_was_away_is_an_aria_notification() {
    use paddock_proto::aria::v1 as aria;
    let (d, s) = a_turn_written_while_the_daemon_was_away().await;
    let lost_notice = || async {
        let mut notes = crate::aria::notifications(&d).await;
        within(async {
            loop {
                let n = next(&mut notes).await.expect("the stream ended").unwrap();
                if let Some(aria::notification::EventPayload::SessionStatus(st)) = &n.event_payload
                {
                    if st.message.starts_with("output lost: ") {
                        return (n.id.clone(), st.clone());
                    }
                }
            }
        })
        .await
    };
    let (id, lost) = lost_notice().await;
    assert_eq!(lost.session_id, s.id);
    assert_eq!(lost.previous_status, lost.new_status, "{lost:?}");
    assert!(lost.message.contains("--runner-buffer-events"), "{lost:?}");
    let (again, _) = lost_notice().await;
    assert_eq!(again, id, "one notice, one id");
}

/// A batch the crash lost may have started an agent (a restart's new run beside the old one, a
/// create's first run): the runner still runs it, no stored record names it. The next daemon
/// kills every such run instead of leaving it running with nobody to own it, and adopts the
/// run the record names as before. (Found by the simulator once it ran the daemon's executor,
/// which spawns before it commits; the daemon used to keep only a session's last listed run and
/// leave the others alive.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_no_record_names_are_killed_at_start_up() {
    let mut d = runner_daemon().await;
    let s = d.session(None).await;
    let mut runner = runner_client(&d).await;
    d.kill9();
    // Three runs the store knows nothing of: a later run of the session, a run of a session
    // that was never stored, and a task's run of a task that was never stored.
    let root = d.dirs.data.display().to_string();
    let (mut pids, mut streams) = (Vec::new(), Vec::new());
    for run_id in [
        format!("agent:{}:{}", s.id, 90),
        "agent:sess_never_stored:91".to_string(),
        "task:task_never_stored".to_string(),
    ] {
        let mut events = runner
            .run_command(rpb::RunCommandRequest {
                run_id: run_id.clone(),
                working_dir: root.clone(),
                command: "sleep 600".into(),
                argv: vec!["sleep".into(), "600".into()],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        // Started: its pid is listed.
        let _ = events.message().await;
        let pid = within(async {
            loop {
                let runs = runner
                    .list_runs(rpb::ListRunsRequest {})
                    .await
                    .unwrap()
                    .into_inner()
                    .runs;
                if let Some(r) = runs.iter().find(|r| r.run_id == run_id && r.pid > 0) {
                    return r.pid;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert!(pid_running(pid));
        pids.push(pid);
        streams.push(events);
    }

    d.launch().await;
    // The session's own run is adopted, as ever.
    let back = d.get(&s.id).await;
    assert_eq!(status_name(back.status), "RUNNING");
    assert_eq!(back.pid, s.pid);
    assert!(agent_running(s.pid as u32));
    // The others are killed.
    for pid in pids {
        within(async {
            while pid_running(pid) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }
    let acts = d.send(&s.id, "still here").await;
    assert_eq!(kind(acts.last().unwrap()), "COMPLETION");
}
