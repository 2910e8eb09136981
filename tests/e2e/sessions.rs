//! Sessions end to end: turns, watches, lists, stops, restarts, budgets, timeouts, crashes.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use paddock_proto::obey::local::v1 as pb;
use pb::{SessionProvider as P, SessionStatus as S};
use serde_json::json;

use crate::harness::*;

fn kinds(list: &[pb::SessionActivityEvent]) -> Vec<&'static str> {
    list.iter().map(kind).collect()
}

fn transitions(list: &[pb::SessionStatusEvent]) -> Vec<(String, String)> {
    list.iter()
        .map(|e| {
            (
                status_name(e.previous_status).to_string(),
                status_name(e.new_status).to_string(),
            )
        })
        .collect()
}

fn tr(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

fn token_sums(list: &[pb::SessionActivityEvent]) -> (i64, i64) {
    list.iter().fold((0, 0), |(i, o), a| {
        (i + a.tokens_input, o + a.tokens_output)
    })
}

/// Every event of a stream belongs to `id`, seqs go up by one from `first`, and each status
/// event starts where the previous one ended.
fn assert_activity_seqs(list: &[pb::SessionActivityEvent], id: &str, first: i64) {
    for (i, a) in list.iter().enumerate() {
        assert_eq!(a.session_id, id);
        assert_eq!(a.seq, first + i as i64, "seqs: {list:?}");
        assert!(a.timestamp.is_some());
    }
}

fn assert_status_chain(list: &[pb::SessionStatusEvent], id: &str) {
    for w in list.windows(2) {
        assert_eq!(w[0].new_status, w[1].previous_status, "chain: {list:?}");
        assert!(w[1].seq > w[0].seq, "seqs: {list:?}");
    }
    for e in list {
        assert_eq!(e.session_id, id);
        assert!(e.timestamp.is_some());
    }
}

async fn watch(d: &Daemon, id: &str) -> tonic::Streaming<pb::SessionStatusEvent> {
    d.client()
        .await
        .watch_session(pb::WatchSessionRequest {
            session_id: id.into(),
        })
        .await
        .expect("watch session")
        .into_inner()
}

async fn list_activities(
    d: &Daemon,
    id: &str,
    after: i64,
    limit: i32,
) -> Vec<pb::SessionActivityEvent> {
    d.client()
        .await
        .list_activities(pb::ListActivitiesRequest {
            session_id: id.into(),
            after_seq: after,
            limit,
        })
        .await
        .expect("list activities")
        .into_inner()
        .activities
}

/// A StopSession running in the background.
async fn stop_in_background(
    d: &Daemon,
    id: &str,
    graceful: bool,
) -> tokio::task::JoinHandle<Result<pb::SessionInfo, tonic::Status>> {
    let mut c = d.client().await;
    let id = id.to_string();
    tokio::spawn(async move {
        within(c.stop_session(pb::StopSessionRequest {
            session_id: id,
            graceful,
        }))
        .await
        .map(|r| r.into_inner().session.expect("session"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_turn_streams_thinking_ls_listing_status_completion() {
    let mut d = Daemon::start().await;
    let s = d.session(None).await;
    assert_eq!(status_name(s.status), "RUNNING");
    assert!(s.pid > 0 && agent_running(s.pid as u32));
    assert_eq!(s.working_dir, d.dirs.root.display().to_string());
    assert_eq!(s.provider, P::Scripted as i32);
    assert!(s.id.starts_with("sess_"));
    assert!(s.agent_name.starts_with("scripted-"), "{}", s.agent_name);
    assert!(s.created_at.is_some() && s.started_at.is_some() && s.ended_at.is_none());

    let acts = d.send(&s.id, "What is in this project?").await;
    assert_eq!(
        kinds(&acts),
        ["THINKING", "TOOL_CALL", "TOOL_RESULT", "TEXT", "COMPLETION"]
    );
    assert_activity_seqs(&acts, &s.id, 1);
    // A seed client sees the agent's words between its tool calls as THINKING (the type obey's
    // own example gives them; TEXT is paddock's extension, STATUS a status change).
    let ch = paddock::transport::channel(&d.dirs.socket).await.unwrap();
    let mut seed = pb::local_daemon_service_client::LocalDaemonServiceClient::new(ch);
    let listed = seed
        .list_activities(pb::ListActivitiesRequest {
            session_id: s.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .activities;
    assert_eq!(
        kinds(&listed),
        [
            "THINKING",
            "TOOL_CALL",
            "TOOL_RESULT",
            "THINKING",
            "COMPLETION"
        ]
    );
    assert!(acts[0].content.contains("What is in this project?"));
    assert_eq!(acts[1].tool_name, "LS");
    assert_eq!(acts[1].content, d.dirs.root.display().to_string());
    assert!(!acts[1].tool_call_id.is_empty());
    assert_eq!(acts[2].tool_name, "LS");
    assert_eq!(acts[2].tool_call_id, acts[1].tool_call_id);
    assert!(acts[2].tool_success);
    assert_eq!(acts[2].content, ROOT_LISTING);
    assert_eq!(
        acts[3].content,
        "The directory has 4 entries: README.md, notes.txt, scripts/, src/"
    );
    assert!(acts[4]
        .content
        .contains("The working directory has 4 entries."));

    // The deltas add up to the session's counters: the built-in turn costs 100 + 2q in
    // (q = 24 bytes / 4) and 30 out.
    let info = d.get(&s.id).await;
    assert_eq!(status_name(info.status), "RUNNING");
    assert_eq!(token_sums(&acts), (info.tokens_input, info.tokens_output));
    assert_eq!((info.tokens_input, info.tokens_output), (112, 30));
    assert!(info.last_activity_at.is_some());

    // Everything streamed was stored, identically.
    let r = Redact::new(&d).session(&s.id);
    let stored = list_activities(&d, &s.id, 0, 0).await;
    assert_eq!(r.activities(&stored), r.activities(&acts));
    insta::assert_json_snapshot!("full_turn", r.activities(&acts));

    // A second turn continues the sequence and the counters.
    let again = d.send(&s.id, "And again?").await;
    assert_eq!(kinds(&again).last(), Some(&"COMPLETION"));
    assert_activity_seqs(&again, &s.id, 6);
    let info2 = d.get(&s.id).await;
    let (i2, o2) = token_sums(&again);
    assert_eq!(
        (info2.tokens_input, info2.tokens_output),
        (112 + i2, 30 + o2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_with_initial_message_starts_working_and_stores_the_turn() {
    let mut d = Daemon::start().await;
    let mut req = d.request(Some(("fixed", fixed_turn()))).await;
    req.initial_message = "Check the build".into();
    req.agent_name = "builder".into();
    req.festival_id = "fest-1".into();
    req.task_id = "task-9".into();
    let s = d.create(req).await;
    assert_eq!(status_name(s.status), "WORKING");
    assert_eq!(s.agent_name, "builder");
    assert_eq!(s.festival_id, "fest-1");
    assert_eq!(s.task_id, "task-9");

    let mut w = d.watch_activity(&s.id, 0).await;
    let acts = collect_until(&mut w, |a| kind(a) == "COMPLETION").await;
    assert_eq!(
        kinds(&acts),
        ["THINKING", "TOOL_CALL", "TOOL_RESULT", "TEXT", "COMPLETION"]
    );
    assert_eq!(acts[0].content, "Reading the request: Check the build");
    assert_eq!(acts[4].content, "Done with turn 1: Check the build");
    let info = d.wait_status(&s.id, S::Running).await;
    assert_eq!(token_sums(&acts), (info.tokens_input, info.tokens_output));
    assert_eq!((info.tokens_input, info.tokens_output), (35, 15));
    let stored = list_activities(&d, &s.id, 0, 0).await;
    assert_eq!(stored.len(), 5);
    // A restart does not send the initial message again.
    let r = d
        .client()
        .await
        .restart_session(pb::RestartSessionRequest {
            session_id: s.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    assert_eq!(status_name(r.status), "RUNNING");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(list_activities(&d, &s.id, 0, 0).await.len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_session_reports_each_transition_in_order_and_ends_at_the_terminal_one() {
    let mut d = Daemon::start().await;
    let s = d.session(Some(("fixed", fixed_turn()))).await;
    let w = watch(&d, &s.id).await;
    let acts = d.send(&s.id, "hi").await;
    assert_eq!(kinds(&acts).last(), Some(&"COMPLETION"));
    let stopped = d.stop(&s.id, true).await.expect("stop");
    assert_eq!(status_name(stopped.status), "STOPPED");
    assert!(stopped.ended_at.is_some());
    let evs = collect_ok(w).await; // ends by itself at STOPPED
    assert_eq!(
        transitions(&evs),
        tr(&[
            ("RUNNING", "WORKING"),
            ("WORKING", "RUNNING"),
            ("RUNNING", "STOPPING"),
            ("STOPPING", "STOPPED"),
        ])
    );
    assert_status_chain(&evs, &s.id);
    assert_agent_gone(s.pid).await;
    // Watching a terminal session ends at once.
    assert!(collect_ok(watch(&d, &s.id).await).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_all_sessions_follows_a_whole_life() {
    let mut d = Daemon::start().await;
    let mut all = d
        .client()
        .await
        .watch_all_sessions(pb::WatchAllSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let s = d.session(Some(("fixed", fixed_turn()))).await;
    let acts = d.send(&s.id, "hi").await;
    assert_eq!(kinds(&acts).last(), Some(&"COMPLETION"));
    d.stop(&s.id, true).await.expect("stop");
    let evs = collect_until(&mut all, |e| e.new_status == S::Stopped as i32).await;
    assert_eq!(
        transitions(&evs),
        tr(&[
            ("UNSPECIFIED", "CREATED"),
            ("CREATED", "STARTING"),
            ("STARTING", "RUNNING"),
            ("RUNNING", "WORKING"),
            ("WORKING", "RUNNING"),
            ("RUNNING", "STOPPING"),
            ("STOPPING", "STOPPED"),
        ])
    );
    assert_status_chain(&evs, &s.id);
    assert_eq!(evs[0].seq, 1);
    let r = Redact::new(&d).session(&s.id);
    insta::assert_json_snapshot!(
        "watch_all_whole_life",
        serde_json::Value::Array(evs.iter().map(|e| r.status(e, true)).collect())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_all_sessions_filters_by_campaign() {
    let mut d = Daemon::start().await;
    let ours = d.campaign().await;
    let other_root = d.dirs.base.join("other");
    std::fs::create_dir_all(&other_root).unwrap();
    let other = d
        .client()
        .await
        .add_campaign(pb::AddCampaignRequest {
            name: "other".into(),
            root_path: other_root.display().to_string(),
        })
        .await
        .unwrap()
        .into_inner();
    // Filter by name: the campaign's id or its name are both accepted.
    let mut all = d
        .client()
        .await
        .watch_all_sessions(pb::WatchAllSessionsRequest {
            campaign_id: CAMPAIGN.into(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut req = d.request(None).await;
    req.campaign_id = other.id.clone();
    let theirs = d.create(req).await;
    d.stop(&theirs.id, false).await.unwrap();
    let mine = d.session(None).await;
    assert_eq!(mine.campaign_id, ours);
    d.stop(&mine.id, false).await.unwrap();
    let evs = collect_until(&mut all, |e| e.new_status == S::Stopped as i32).await;
    assert!(evs.iter().all(|e| e.session_id == mine.id), "{evs:?}");
    assert_eq!(evs.len(), 5);

    let e = d
        .client()
        .await
        .watch_all_sessions(pb::WatchAllSessionsRequest {
            campaign_id: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_status(&e, tonic::Code::NotFound, "OBEY-2001: ");
}

/// A claude-code "binary" that is the scripted agent (same line protocol), so a claude-code
/// session can run without Claude.
pub fn fake_claude(d: &Daemon) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = d.dirs.base.join("fake-claude");
    std::fs::write(&path, format!("#!/bin/sh\nexec '{BIN}' __scripted-agent\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_sessions_filters_by_campaign_status_provider_and_terminated() {
    let mut d = Daemon::start().await;
    let proj = d.campaign().await;
    let other_root = d.dirs.base.join("other");
    std::fs::create_dir_all(&other_root).unwrap();
    let other = d
        .client()
        .await
        .add_campaign(pb::AddCampaignRequest {
            name: "other".into(),
            root_path: other_root.display().to_string(),
        })
        .await
        .unwrap()
        .into_inner();

    let a1 = d.session(None).await.id;
    let a2 = d.session(None).await.id;
    d.stop(&a2, false).await.unwrap();
    let mut req = d.request(None).await;
    req.campaign_id = "other".into(); // by name
    let b1 = d.create(req).await;
    assert_eq!(b1.campaign_id, other.id);
    let b1 = b1.id;
    let mut req = d.request(None).await;
    req.provider = P::ClaudeCode as i32;
    req.provider_config.clear();
    req.provider_config
        .insert("command".into(), fake_claude(&d));
    let c1 = d.create(req).await;
    assert_eq!(status_name(c1.status), "RUNNING");
    let c1 = c1.id;
    let f1 = d
        .session(Some((
            "crash",
            json!({"turns": [{"steps": [{"crash": 4}]}], "stderr": "no config found"}),
        )))
        .await
        .id;
    d.send(&f1, "go").await;
    let failed = d.wait_status(&f1, S::Failed).await;
    assert_eq!(failed.error_code, "OBEY-2031");
    assert!(
        failed.error_message.contains("exit code 4")
            && failed.error_message.contains("no config found"),
        "{}",
        failed.error_message
    );

    let mut c = d.client().await;
    let set = |ids: &[&String]| ids.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let req = |f: &dyn Fn(&mut pb::ListSessionsRequest)| {
        let mut r = pb::ListSessionsRequest::default();
        f(&mut r);
        r
    };
    let c2 = c.clone();
    let list = move |r: pb::ListSessionsRequest| {
        let mut c = c2.clone();
        async move {
            within(c.list_sessions(r))
                .await
                .expect("list sessions")
                .into_inner()
                .sessions
                .into_iter()
                .map(|s| s.id)
                .collect::<BTreeSet<_>>()
        }
    };

    assert_eq!(list(req(&|_| {})).await, set(&[&a1, &b1, &c1]));
    assert_eq!(
        list(req(&|r| r.include_terminated = true)).await,
        set(&[&a1, &a2, &b1, &c1, &f1])
    );
    assert_eq!(
        list(req(&|r| r.campaign_id = proj.clone())).await,
        set(&[&a1, &c1])
    );
    assert_eq!(
        list(req(&|r| r.campaign_id = CAMPAIGN.into())).await,
        set(&[&a1, &c1])
    );
    assert_eq!(
        list(req(&|r| {
            r.campaign_id = CAMPAIGN.into();
            r.include_terminated = true;
        }))
        .await,
        set(&[&a1, &a2, &c1, &f1])
    );
    assert_eq!(
        list(req(&|r| r.statuses = vec![S::Stopped as i32])).await,
        set(&[&a2])
    );
    assert_eq!(
        list(req(
            &|r| r.statuses = vec![S::Failed as i32, S::Stopped as i32]
        ))
        .await,
        set(&[&a2, &f1])
    );
    assert_eq!(
        list(req(&|r| r.statuses = vec![S::Running as i32])).await,
        set(&[&a1, &b1, &c1])
    );
    assert_eq!(
        list(req(&|r| r.provider = P::ClaudeCode as i32)).await,
        set(&[&c1])
    );
    assert_eq!(
        list(req(&|r| r.provider = P::Scripted as i32)).await,
        set(&[&a1, &b1])
    );
    assert_eq!(
        list(req(&|r| {
            r.provider = P::Scripted as i32;
            r.campaign_id = other.id.clone();
        }))
        .await,
        set(&[&b1])
    );
    let e = c
        .list_sessions(pb::ListSessionsRequest {
            campaign_id: "nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_status(&e, tonic::Code::NotFound, "OBEY-2001: ");

    // GetState: active sessions only.
    let st = c.get_state(pb::StateRequest {}).await.unwrap().into_inner();
    assert_eq!(st.session_count, 5);
    assert_eq!(st.campaign_count, 2);
    let active: BTreeSet<String> = st.active_sessions.iter().map(|a| a.id.clone()).collect();
    assert_eq!(active, set(&[&a1, &b1, &c1]));
    let cc = st.active_sessions.iter().find(|a| a.id == c1).unwrap();
    assert_eq!(cc.provider, P::ClaudeCode as i32);
    assert_eq!(cc.campaign_id, proj);
    assert_eq!(cc.status, S::Running as i32);

    // The claude-code session (the scripted agent behind a claude-code command) works.
    let acts = d.send(&c1, "hello").await;
    assert_eq!(kinds(&acts).last(), Some(&"COMPLETION"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_during_a_turn_lets_the_turn_finish() {
    let mut d = Daemon::start().await;
    let s = d.session(Some(("slow", slow_turn(1000)))).await;
    let w = watch(&d, &s.id).await;
    let mut stream = d.start_turn(&s.id, "take your time").await;
    let first = next(&mut stream).await.unwrap().unwrap();
    assert_eq!(kind(&first), "THINKING");
    let stopper = stop_in_background(&d, &s.id, true).await;
    let mut acts = vec![first];
    acts.extend(collect_ok(stream).await);
    assert_eq!(kinds(&acts), ["THINKING", "TEXT", "COMPLETION"]);
    let stopped = stopper.await.unwrap().expect("graceful stop");
    assert_eq!(status_name(stopped.status), "STOPPED");
    assert_eq!(stopped.pid, 0);
    assert_eq!(
        (stopped.tokens_input, stopped.tokens_output),
        token_sums(&acts)
    );
    let evs = collect_ok(w).await;
    assert_eq!(
        transitions(&evs),
        tr(&[
            ("RUNNING", "WORKING"),
            ("WORKING", "STOPPING"),
            ("STOPPING", "STOPPED"),
        ])
    );
    assert_agent_gone(s.pid).await;
    let r = Redact::new(&d).session(&s.id);
    insta::assert_json_snapshot!(
        "graceful_stop_mid_turn",
        json!({"activities": r.activities(&acts), "statuses": r.statuses(&evs)})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_that_outlasts_the_grace_period_is_2021_and_force_stops() {
    let mut d = Daemon::start().await;
    let s = d.session(Some(("hang", hanging_turn()))).await;
    let w = watch(&d, &s.id).await;
    let mut stream = d.start_turn(&s.id, "never finish").await;
    let first = next(&mut stream).await.unwrap().unwrap();
    assert_eq!(kind(&first), "THINKING");
    let t0 = Instant::now();
    let stopper = stop_in_background(&d, &s.id, true).await;
    d.wait_status(&s.id, S::Stopping).await;
    // While stopping: no message, no restart.
    let mut c = d.client().await;
    let e = c
        .send_message(pb::SendMessageRequest {
            session_id: s.id.clone(),
            message: "more".into(),
        })
        .await
        .unwrap_err();
    assert_status(&e, tonic::Code::FailedPrecondition, "OBEY-2011: ");
    let e = c
        .restart_session(pb::RestartSessionRequest {
            session_id: s.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_status(&e, tonic::Code::FailedPrecondition, "OBEY-2011: ");
    // ListSessions' default is the seed's active set (and WAITING): a stopping session is
    // listed when asked for by status.
    let listed = |statuses: Vec<i32>| {
        let mut c = c.clone();
        async move {
            c.list_sessions(pb::ListSessionsRequest {
                statuses,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .sessions
            .into_iter()
            .map(|s| s.id)
            .collect::<Vec<_>>()
        }
    };
    assert!(!listed(vec![]).await.contains(&s.id));
    assert_eq!(
        listed(vec![S::Stopping as i32]).await,
        std::slice::from_ref(&s.id)
    );

    let mut acts = vec![first];
    acts.extend(collect_ok(stream).await);
    assert_eq!(kinds(&acts), ["THINKING", "ERROR"]);
    assert!(
        acts[1].content.starts_with("OBEY-2021: "),
        "{}",
        acts[1].content
    );
    let e = stopper.await.unwrap().unwrap_err();
    assert_status(&e, tonic::Code::DeadlineExceeded, "OBEY-2021: ");
    assert!(e.message().contains(&s.id), "{}", e.message());
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(1900), "{waited:?}");
    let info = d.get(&s.id).await;
    assert_eq!(status_name(info.status), "STOPPED");
    assert_agent_gone(s.pid).await;
    let evs = collect_ok(w).await;
    let r = Redact::new(&d).session(&s.id);
    insta::assert_json_snapshot!(
        "graceful_stop_timeout",
        json!({"activities": r.activities(&acts), "statuses": r.statuses(&evs)})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_stop_during_a_turn_ends_the_stream_at_once() {
    let mut d = Daemon::start().await;
    let s = d.session(Some(("hang", hanging_turn()))).await;
    let w = watch(&d, &s.id).await;
    let mut stream = d.start_turn(&s.id, "never finish").await;
    let first = next(&mut stream).await.unwrap().unwrap();
    assert_eq!(kind(&first), "THINKING");
    let t0 = Instant::now();
    let stopped = d.stop(&s.id, false).await.expect("forced stop");
    assert!(
        t0.elapsed() < Duration::from_millis(900),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(status_name(stopped.status), "STOPPED");
    let mut acts = vec![first];
    acts.extend(collect_ok(stream).await);
    assert_eq!(kinds(&acts), ["THINKING", "ERROR"]);
    assert_eq!(acts[1].content, "turn interrupted: session force-stopped");
    assert_agent_gone(s.pid).await;
    let evs = collect_ok(w).await;
    let r = Redact::new(&d).session(&s.id);
    insta::assert_json_snapshot!(
        "forced_stop",
        json!({"activities": r.activities(&acts), "statuses": r.statuses(&evs)})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_ignores_sigterm_is_killed_after_the_kill_grace() {
    let mut d = Daemon::start().await;
    let mut script = hanging_turn();
    script["ignore_sigterm"] = json!(true);
    let s = d.session(Some(("stubborn", script))).await;
    let mut stream = d.start_turn(&s.id, "ignore them").await;
    assert_eq!(kind(&next(&mut stream).await.unwrap().unwrap()), "THINKING");
    let t0 = Instant::now();
    let stopper = stop_in_background(&d, &s.id, false).await;
    // The stream ends at once with the interruption, long before the process is gone...
    let rest = collect_ok(stream).await;
    assert_eq!(kinds(&rest), ["ERROR"]);
    assert!(
        t0.elapsed() < Duration::from_millis(800),
        "{:?}",
        t0.elapsed()
    );
    assert!(agent_running(s.pid as u32), "TERM should have been ignored");
    // ... and the stop answers once KILL (after --kill-grace-secs 1) has reaped it.
    let stopped = stopper.await.unwrap().expect("forced stop");
    let took = t0.elapsed();
    assert_eq!(status_name(stopped.status), "STOPPED");
    assert!(took >= Duration::from_millis(900), "{took:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_agent_gone(s.pid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_stop_cuts_a_waiting_graceful_stop_short() {
    let mut d = Daemon::start().await;
    let s = d.session(Some(("hang", hanging_turn()))).await;
    let mut stream = d.start_turn(&s.id, "never finish").await;
    assert_eq!(kind(&next(&mut stream).await.unwrap().unwrap()), "THINKING");
    let t0 = Instant::now();
    let graceful = stop_in_background(&d, &s.id, true).await;
    d.wait_status(&s.id, S::Stopping).await;
    let forced = d.stop(&s.id, false).await.expect("forced stop");
    assert_eq!(status_name(forced.status), "STOPPED");
    // Both stops are answered, well before the 2 s grace period would have run out.
    let g = graceful
        .await
        .unwrap()
        .expect("the graceful stop joins the forced one");
    assert_eq!(status_name(g.status), "STOPPED");
    assert!(
        t0.elapsed() < Duration::from_millis(1800),
        "{:?}",
        t0.elapsed()
    );
    let rest = collect_ok(stream).await;
    assert_eq!(kinds(&rest), ["ERROR"]);
    assert_eq!(rest[0].content, "turn interrupted: session force-stopped");
    assert_agent_gone(s.pid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_during_a_turn_interrupts_it() {
    let mut d = Daemon::start().await;
    let s = d.session(Some(("hang", hanging_turn()))).await;
    let mut stream = d.start_turn(&s.id, "never finish").await;
    assert_eq!(kind(&next(&mut stream).await.unwrap().unwrap()), "THINKING");
    let r = d
        .client()
        .await
        .restart_session(pb::RestartSessionRequest {
            session_id: s.id.clone(),
            ..Default::default()
        })
        .await
        .expect("restart")
        .into_inner()
        .session
        .unwrap();
    assert_eq!(status_name(r.status), "RUNNING");
    assert_eq!(r.restart_count, 1);
    let rest = collect_ok(stream).await;
    assert_eq!(kinds(&rest), ["ERROR"]);
    assert_eq!(rest[0].content, "turn interrupted: session restarting");
    assert_agent_gone(s.pid).await;
    assert!(agent_running(r.pid as u32));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_turns_of_two_sessions_stay_apart() {
    let mut d = Daemon::start().await;
    let a = d.session(Some(("slow", slow_turn(300)))).await;
    let b = d.session(Some(("fixed", fixed_turn()))).await;
    let (ra, rb) = tokio::join!(d.send(&a.id, "for a"), d.send(&b.id, "for b"));
    assert_eq!(kinds(&ra), ["THINKING", "TEXT", "COMPLETION"]);
    assert_eq!(
        kinds(&rb),
        ["THINKING", "TOOL_CALL", "TOOL_RESULT", "TEXT", "COMPLETION"]
    );
    assert_activity_seqs(&ra, &a.id, 1);
    assert_activity_seqs(&rb, &b.id, 1);
    assert_eq!(ra[2].content, "Slow answer to for a");
    assert_eq!(rb[4].content, "Done with turn 1: for b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_the_id_counts_restarts_and_works_again() {
    let mut d = Daemon::start().await;
    let s = d.session(Some(("fixed", fixed_turn()))).await;
    let w = watch(&d, &s.id).await;
    let one = d.send(&s.id, "one").await;
    let r = d
        .client()
        .await
        .restart_session(pb::RestartSessionRequest {
            session_id: s.id.clone(),
            ..Default::default()
        })
        .await
        .expect("restart")
        .into_inner()
        .session
        .unwrap();
    assert_eq!(r.id, s.id);
    assert_eq!(r.restart_count, 1);
    assert_eq!(status_name(r.status), "RUNNING");
    assert!(r.pid > 0 && r.pid != s.pid);
    assert_agent_gone(s.pid).await;
    let two = d.send(&s.id, "two").await;
    assert_activity_seqs(&two, &s.id, 6);
    let stopped = d.stop(&s.id, false).await.unwrap();
    assert_eq!(stopped.restart_count, 1);
    let (i1, o1) = token_sums(&one);
    let (i2, o2) = token_sums(&two);
    assert_eq!(
        (stopped.tokens_input, stopped.tokens_output),
        (i1 + i2, o1 + o2)
    );
    assert_agent_gone(r.pid).await;
    let evs = collect_ok(w).await;
    assert_status_chain(&evs, &s.id);
    let red = Redact::new(&d).session(&s.id);
    insta::assert_json_snapshot!(
        "restart",
        json!({
            "turn_before": red.activities(&one),
            "turn_after": red.activities(&two),
            "statuses": red.statuses(&evs),
        })
    );
    // A STOPPED session restarts too.
    let again = d
        .client()
        .await
        .restart_session(pb::RestartSessionRequest {
            session_id: s.id.clone(),
            ..Default::default()
        })
        .await
        .expect("restart a stopped session")
        .into_inner()
        .session
        .unwrap();
    assert_eq!(again.restart_count, 2);
    assert_eq!(status_name(again.status), "RUNNING");
    assert!(again.ended_at.is_none());
    assert_eq!(
        d.send(&s.id, "three").await.last().map(kind),
        Some("COMPLETION")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_session_can_be_restarted_with_a_new_provider_config() {
    let mut d = Daemon::start().await;
    let s = d
        .session(Some((
            "crash",
            turns(json!([{"thinking": "uh oh"}, {"crash": 3}])),
        )))
        .await;
    let acts = d.send(&s.id, "go").await;
    assert_eq!(kinds(&acts), ["THINKING", "ERROR"]);
    let failed = d.get(&s.id).await;
    assert_eq!(status_name(failed.status), "FAILED");
    assert_eq!(failed.error_code, "OBEY-2031");
    assert!(failed.ended_at.is_some());

    let ok = d.dirs.script("ok", &fixed_turn());
    let mut pc = std::collections::BTreeMap::new();
    pc.insert("script".to_string(), ok.clone());
    let r = d
        .client()
        .await
        .restart_session(pb::RestartSessionRequest {
            session_id: s.id.clone(),
            provider_config: pc,
        })
        .await
        .expect("restart a failed session")
        .into_inner()
        .session
        .unwrap();
    assert_eq!(r.id, s.id);
    assert_eq!(r.restart_count, 1);
    assert_eq!(status_name(r.status), "RUNNING");
    assert_eq!(r.error_code, "");
    assert_eq!(r.error_message, "");
    assert!(r.ended_at.is_none());
    assert_eq!(r.provider_config.get("script"), Some(&ok));
    let acts = d.send(&s.id, "again").await;
    assert_eq!(kinds(&acts).last(), Some(&"COMPLETION"));
    assert_eq!(acts.last().unwrap().content, "Done with turn 1: again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_crossing_the_token_budget_fails_the_session_with_2013() {
    let mut d = Daemon::start().await;
    let mut req = d
        .request(Some((
            "greedy",
            turns(json!([
                {"thinking": "Let me read everything", "tokens_in": 30, "tokens_out": 10},
                {"tool": "LS", "input": {"path": "."}, "tokens_in": 50, "tokens_out": 20},
                {"text": "never counted", "tokens_in": 500, "tokens_out": 500, "delay_ms": 100},
                {"result": "never seen"}
            ])),
        )))
        .await;
    req.max_tokens = 100;
    let s = d.create(req).await;
    assert_eq!(s.max_tokens, 100);
    let w = watch(&d, &s.id).await;
    let acts = d.send(&s.id, "read it all").await;
    assert_eq!(kinds(&acts), ["THINKING", "TOOL_CALL", "ERROR"]);
    assert!(
        acts[2].content.starts_with("OBEY-2013: "),
        "{}",
        acts[2].content
    );
    let info = d.wait_status(&s.id, S::Failed).await;
    assert_eq!(info.error_code, "OBEY-2013");
    assert!(info.error_message.starts_with("OBEY-2013: "));
    assert_eq!((info.tokens_input, info.tokens_output), (80, 30));
    assert_agent_gone(s.pid).await;
    let evs = collect_ok(w).await;
    let r = Redact::new(&d).session(&s.id);
    insta::assert_json_snapshot!(
        "budget_exhaustion",
        json!({"activities": r.activities(&acts), "statuses": r.statuses(&evs)})
    );
    // A failed session takes no message: 2011 (naming the failure).
    let e = d
        .client()
        .await
        .send_message(pb::SendMessageRequest {
            session_id: s.id.clone(),
            message: "more".into(),
        })
        .await
        .unwrap_err();
    assert_status(&e, tonic::Code::FailedPrecondition, "OBEY-2011: ");
    assert!(e.message().contains("OBEY-2013"), "{}", e.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_final_answer_past_the_budget_is_delivered_then_the_session_fails_with_2013() {
    // Agents that report usage once per turn (codex, gemini, ACP) cross the budget with the
    // turn's end: the same end as a crossing mid-turn, after the answer.
    let mut d = Daemon::start().await;
    let mut req = d
        .request(Some((
            "past",
            turns(json!([
                {"thinking": "Counting", "tokens_in": 10, "tokens_out": 0},
                {"result": "Past the budget", "tokens_in": 80, "tokens_out": 40}
            ])),
        )))
        .await;
    req.max_tokens = 100;
    let s = d.create(req).await;
    let acts = d.send(&s.id, "count").await;
    assert_eq!(kinds(&acts), ["THINKING", "COMPLETION"]);
    assert_eq!(acts[1].content, "Past the budget");
    let info = d.wait_status(&s.id, pb::SessionStatus::Failed).await;
    assert_eq!(info.error_code, "OBEY-2013");
    assert!(
        info.error_message.contains("120 of 100"),
        "{}",
        info.error_message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_reached_exactly_at_completion_refuses_the_next_message() {
    let mut d = Daemon::start().await;
    let mut req = d
        .request(Some((
            "exact",
            turns(json!([
                {"thinking": "Counting", "tokens_in": 10, "tokens_out": 0},
                {"result": "Exactly at the budget", "tokens_in": 60, "tokens_out": 40}
            ])),
        )))
        .await;
    req.max_tokens = 100;
    let s = d.create(req).await;
    let acts = d.send(&s.id, "count").await;
    assert_eq!(kinds(&acts), ["THINKING", "COMPLETION"]);
    let info = d.get(&s.id).await;
    assert_eq!(status_name(info.status), "RUNNING");
    assert_eq!(info.tokens_input + info.tokens_output, 100);
    let e = d
        .client()
        .await
        .send_message(pb::SendMessageRequest {
            session_id: s.id.clone(),
            message: "one more".into(),
        })
        .await
        .unwrap_err();
    assert_status(&e, tonic::Code::ResourceExhausted, "OBEY-2013: ");
    // Refused, not failed: still RUNNING, and it can still be stopped.
    assert_eq!(status_name(d.get(&s.id).await.status), "RUNNING");
    assert_eq!(
        status_name(d.stop(&s.id, true).await.unwrap().status),
        "STOPPED"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_timeout_during_a_hanging_turn_fails_with_2014() {
    let mut d = Daemon::start().await;
    let mut req = d.request(Some(("hang", hanging_turn()))).await;
    req.timeout = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    // An idle session times out too.
    let idle = d.create(req.clone()).await;
    let s = d.create(req).await;
    assert_eq!(
        s.timeout,
        Some(prost_types::Duration {
            seconds: 1,
            nanos: 0
        })
    );
    let w = watch(&d, &s.id).await;
    let t0 = Instant::now();
    let acts = d.send(&s.id, "wait forever").await;
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(kinds(&acts), ["THINKING", "ERROR"]);
    assert!(
        acts[1].content.starts_with("OBEY-2014: "),
        "{}",
        acts[1].content
    );
    let info = d.get(&s.id).await;
    assert_eq!(status_name(info.status), "FAILED");
    assert_eq!(info.error_code, "OBEY-2014");
    assert_agent_gone(s.pid).await;
    let evs = collect_ok(w).await;
    let r = Redact::new(&d).session(&s.id);
    insta::assert_json_snapshot!(
        "timeout",
        json!({"activities": r.activities(&acts), "statuses": r.statuses(&evs)})
    );
    let idle = d.wait_status(&idle.id, S::Failed).await;
    assert_eq!(idle.error_code, "OBEY-2014");
    assert!(idle.ended_at.is_some());
    assert_agent_gone(idle.pid.max(s.pid)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_crash_mid_turn_fails_with_2031_and_its_stderr() {
    let mut d = Daemon::start().await;
    let s = d
        .session(Some((
            "crash",
            json!({
                "stderr": "agent booting",
                "turns": [{"steps": [
                    {"thinking": "About to do something risky", "tokens_in": 3, "tokens_out": 1},
                    {"stderr": "fatal: widget exploded in turn {turn}"},
                    {"crash": 3}
                ]}]
            }),
        )))
        .await;
    let w = watch(&d, &s.id).await;
    let acts = d.send(&s.id, "do it").await;
    assert_eq!(kinds(&acts), ["THINKING", "ERROR"]);
    let err = &acts[1].content;
    assert!(err.starts_with("OBEY-2031: "), "{err}");
    assert!(err.contains("exit code 3"), "{err}");
    assert!(err.contains("fatal: widget exploded in turn 1"), "{err}");
    let info = d.get(&s.id).await;
    assert_eq!(status_name(info.status), "FAILED");
    assert_eq!(info.error_code, "OBEY-2031");
    assert_eq!(&info.error_message, err);
    assert_eq!(info.pid, 0);
    assert_agent_gone(s.pid).await;
    let evs = collect_ok(w).await;
    let r = Redact::new(&d).session(&s.id);
    insta::assert_json_snapshot!(
        "provider_crash",
        json!({"activities": r.activities(&acts), "statuses": r.statuses(&evs)})
    );
    // Its history can still be read and watched (the watch ends at once, after it).
    let w = d.watch_activity(&s.id, 0).await;
    assert_eq!(r.activities(&collect_ok(w).await), r.activities(&acts));
}

async fn killed_by(d: &mut Daemon, signal: i32) {
    let s = d
        .session(Some((
            &format!("signal{signal}"),
            turns(json!([{"thinking": "hmm"}, {"signal": signal}])),
        )))
        .await;
    let acts = d.send(&s.id, "do it").await;
    assert_eq!(kinds(&acts), ["THINKING", "ERROR"]);
    assert!(
        acts[1].content.starts_with("OBEY-2031: ")
            && acts[1]
                .content
                .contains(&format!("killed by signal {signal}")),
        "{}",
        acts[1].content
    );
    assert_eq!(d.get(&s.id).await.error_code, "OBEY-2031");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_by_a_signal_mid_turn_fails_with_2031() {
    let mut d = Daemon::start().await;
    killed_by(&mut d, 9).await;
    killed_by(&mut d, 6).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_killed_by_sigsegv_mid_turn_fails_with_2031() {
    let mut d = Daemon::start().await;
    killed_by(&mut d, 11).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activities_can_be_listed_in_pages_and_watched_from_history_to_the_end() {
    let mut d = Daemon::start().await;
    let s = d.session(Some(("fixed", fixed_turn()))).await;
    let first = d.send(&s.id, "one").await;
    assert_eq!(first.len(), 5);
    // Pages.
    let page = list_activities(&d, &s.id, 2, 2).await;
    assert_eq!(page.iter().map(|a| a.seq).collect::<Vec<_>>(), [3, 4]);
    assert!(list_activities(&d, &s.id, 5, 0).await.is_empty());
    // History after seq 3, then live, then the end at the terminal status.
    let mut w = d.watch_activity(&s.id, 3).await;
    let hist = collect_until(&mut w, |a| a.seq == 5).await;
    assert_eq!(hist.iter().map(|a| a.seq).collect::<Vec<_>>(), [4, 5]);
    let second = d.send(&s.id, "two").await;
    let live = collect_until(&mut w, |a| kind(a) == "COMPLETION").await;
    let r = Redact::new(&d).session(&s.id);
    assert_eq!(r.activities(&live), r.activities(&second));
    d.stop(&s.id, false).await.unwrap();
    assert!(collect_ok(w).await.is_empty());
}

/// Lines the adapter does not understand never hurt the session: they are stored raw (in the
/// store's `provider_unrecognized` table), counted in SessionInfo, and the count survives a
/// daemon restart and the session's end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrecognized_provider_lines_are_stored_raw_and_counted() {
    let mut d = Daemon::start().await;
    let script = turns(json!([
        {"raw": "this is not json {"},
        {"text": "Between two odd lines."},
        {"raw": "{\"type\":\"from_a_future_cli\",\"x\":1}"},
        {"result": "Still fine."}
    ]));
    let s = d.session(Some(("odd", script))).await;
    let acts = d.send(&s.id, "Go.").await;
    assert_eq!(
        acts.iter().map(kind).collect::<Vec<_>>(),
        ["TEXT", "COMPLETION"],
        "{acts:#?}"
    );
    assert_eq!(d.get(&s.id).await.unrecognized_lines, 2);
    d.send(&s.id, "Again.").await;
    let info = d.get(&s.id).await;
    assert_eq!(info.status, pb::SessionStatus::Running as i32);
    assert_eq!(info.unrecognized_lines, 4);
    // Listed too, and kept across a restart of the daemon.
    let listed = within(
        d.client()
            .await
            .list_sessions(pb::ListSessionsRequest::default()),
    )
    .await
    .unwrap()
    .into_inner()
    .sessions;
    assert_eq!(listed[0].unrecognized_lines, 4);
    d.kill9();
    d.launch().await;
    assert_eq!(d.get(&s.id).await.unrecognized_lines, 4);
    // Stopped, it settles: the daemon lets it go and reads its count from the store, for a
    // listing of ended sessions and for the session named again, before and after a restart.
    d.stop(&s.id, false).await.unwrap();
    d.wait_status(&s.id, pb::SessionStatus::Stopped).await;
    for restarted in [false, true] {
        if restarted {
            d.kill9();
            d.launch().await;
        }
        let all = pb::ListSessionsRequest {
            include_terminated: true,
            ..Default::default()
        };
        let listed = within(d.client().await.list_sessions(all))
            .await
            .unwrap()
            .into_inner()
            .sessions;
        assert_eq!(listed[0].id, s.id);
        assert_eq!(listed[0].unrecognized_lines, 4, "restarted: {restarted}");
        assert_eq!(
            d.get(&s.id).await.unrecognized_lines,
            4,
            "restarted: {restarted}"
        );
    }
    let db = rusqlite::Connection::open(d.dirs.data.join("paddock.db")).unwrap();
    let lines: Vec<String> = db
        .prepare("SELECT line FROM provider_unrecognized WHERE session_id = ?1 ORDER BY seq")
        .unwrap()
        .query_map([&s.id], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        lines,
        [
            "this is not json {",
            "{\"type\":\"from_a_future_cli\",\"x\":1}",
            "this is not json {",
            "{\"type\":\"from_a_future_cli\",\"x\":1}"
        ]
    );
}

/// A client slower than its agent still gets every activity of its turn, in order, ending
/// with the COMPLETION: past the stream's buffer the rest comes from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_gets_its_whole_turn() {
    let n = 20_000;
    let (d, stream, s) = long_turn((0..n).map(padded_step).collect()).await;
    // Let the agent run far ahead of this client: the turn ends unread.
    d.wait_status(&s.id, S::Running).await;
    read_whole_turn(stream, n).await;
    let said = d.stderr();
    assert!(
        said.contains("fell behind: fed from the store"),
        "the client fell behind; the daemon said:\n{said}"
    );
}

/// A client that fell behind and read the store up to its end goes back to the live
/// activities, and still gets every one of its turn once, in order: the agent makes 20,000
/// activities while the client reads nothing, pauses while the client catches up from the
/// store, then makes 300 more, which come live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_caught_up_is_fed_live_again() {
    let (first, then) = (20_000, 300);
    let mut steps: Vec<serde_json::Value> = (0..first).map(padded_step).collect();
    steps.push(json!({"delay_ms": 3000}));
    steps.extend((first..first + then).map(padded_step));
    let (d, stream, s) = long_turn(steps).await;
    // The client reads nothing until the agent made its first part.
    d.wait_until(&s.id, "the first part never came", |s| {
        s.tokens_input >= first as i64
    })
    .await;
    read_whole_turn(stream, first + then).await;
    let said = d.stderr();
    assert!(
        said.contains("a turn's stream is live again"),
        "the stream went back to the live activities; the daemon said:\n{said}"
    );
}

/// A client that fell behind while its agent floods on, with no pause, goes back to the live
/// activities before the turn ends: the loop reads back what was committed and makes the
/// stream live in the same step. (A reader that read the store and then asked to go live found
/// the flood's next batches committed each time, and was fed from the store to the turn's end.)
/// The agent prints 150,000 lines as fast as `cat` writes them; the client reads nothing until
/// 20,000 are stored, then reads as fast as it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_behind_a_flood_is_fed_live_again_before_the_turn_ends() {
    let n: usize = 150_000;
    let log = [("PADDOCK_LOG", "warn,paddock_daemon::event_loop=debug")];
    let mut d = Daemon::start_with_env(Dirs::new(), &[], &log).await;
    let base = d.dirs.base.clone();
    let lines = base.join("flood.jsonl");
    let mut text = String::new();
    for i in 0..n {
        let pad = "x".repeat(100);
        let line = json!({"type": "assistant", "message": {"id": format!("msg_{i}"),
            "type": "message", "role": "assistant", "model": "m",
            "content": [{"type": "text", "text": format!("step {i} {pad}")}],
            "stop_reason": null, "usage": {"input_tokens": 1, "output_tokens": 1}},
            "parent_tool_use_id": null, "session_id": "flood"});
        text.push_str(&line.to_string());
        text.push('\n');
    }
    text.push_str(
        &json!({"type": "result", "subtype": "success", "is_error": false, "result": "all done",
            "session_id": "flood", "usage": {"input_tokens": n, "output_tokens": n}})
        .to_string(),
    );
    text.push('\n');
    std::fs::write(&lines, text).unwrap();
    let script = base.join("flood.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n{ANSWER_READY}read -r _\ncat {}\nwhile read -r _; do :; done\n",
            lines.display()
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let s = stand_in(&mut d, script.display().to_string()).await;
    let stream = go(&d, &s.id).await;
    let behind = d
        .wait_until(&s.id, "the flood never came", |s| s.tokens_output >= 20_000)
        .await;
    let still_flooding = behind.tokens_output < n as i64 / 2;
    read_whole_turn(stream, n).await;
    let said = d.stderr();
    assert!(
        said.contains("fell behind: fed from the store"),
        "the client fell behind; the daemon said:\n{said}"
    );
    // Live again means before the turn's end: a turn that ended is read back to its end.
    assert!(
        still_flooding && said.contains("a turn's stream is live again"),
        "the stream went back to the live activities while the agent flooded on \
         (flooding when the client began to read: {still_flooding}); the daemon said:\n{said}"
    );
}

/// A step of about 250 bytes: 20,000 are more than a turn's stream buffers (4,096) and
/// HTTP/2's windows (~2.4 MB) hold.
fn padded_step(i: usize) -> serde_json::Value {
    let pad = "x".repeat(200);
    json!({"text": format!("step {i} {pad}"), "tokens_in": 1, "tokens_out": 1})
}

/// A daemon that logs its loop's debug lines, a scripted session of `steps` (then "all done"),
/// and the stream of the turn started.
async fn long_turn(
    mut steps: Vec<serde_json::Value>,
) -> (
    Daemon,
    tonic::Streaming<pb::SessionActivityEvent>,
    pb::SessionInfo,
) {
    let log = [("PADDOCK_LOG", "warn,paddock_daemon::event_loop=debug")];
    let mut d = Daemon::start_with_env(Dirs::new(), &[], &log).await;
    steps.push(json!({"result": "all done"}));
    let s = d.session(Some(("long", turns(json!(steps))))).await;
    let stream = go(&d, &s.id).await;
    (d, stream, s)
}

/// The stream of a turn ("go") started on session `id`.
async fn go(d: &Daemon, id: &str) -> tonic::Streaming<pb::SessionActivityEvent> {
    within(d.client().await.send_message(pb::SendMessageRequest {
        session_id: id.to_string(),
        message: "go".into(),
    }))
    .await
    .unwrap()
    .into_inner()
}

/// Reads a turn to its end: `n` activities and the COMPLETION, each once, in order.
async fn read_whole_turn(mut stream: tonic::Streaming<pb::SessionActivityEvent>, n: usize) {
    let mut seqs = Vec::new();
    let mut last = None;
    while let Some(ev) = within(stream.message()).await.unwrap() {
        seqs.push(ev.seq);
        last = Some(ev);
    }
    assert_eq!(seqs.len(), n + 1);
    assert!(
        seqs.windows(2).all(|w| w[1] == w[0] + 1),
        "in order, none twice"
    );
    let last = last.unwrap();
    assert_eq!(kind(&last), "COMPLETION");
    assert_eq!(last.content, "all done");
}

/// A claude-code session whose agent is the shell command `cmd` (which answers the ready
/// request itself).
async fn stand_in(d: &mut Daemon, cmd: String) -> pb::SessionInfo {
    let mut req = d.request(None).await;
    req.provider = P::ClaudeCode as i32;
    req.provider_config.clear();
    req.provider_config.insert("command".into(), cmd);
    d.create(req).await
}

/// A graceful stop first asks the agent to end its own way — its input is closed, as an
/// interactive agent's `/exit` would — and TERMs it only when it has not ended within the end
/// grace (1 s here); a forced stop TERMs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_stop_closes_the_agents_input_before_any_signal() {
    for args in [&[][..], &["--no-runner"][..]] {
        graceful_stop_closes_input(args).await;
    }
}

async fn graceful_stop_closes_input(args: &[&str]) {
    // A kill grace long enough for a busy machine: the TERM trap must get to run (with the
    // harness's 1 s, a loaded CI machine once KILLed the agent before its trap wrote).
    let args: Vec<&str> = args
        .iter()
        .copied()
        .chain(["--kill-grace-secs", "5"])
        .collect();
    let mut d = Daemon::start_with(Dirs::new(), &args).await;
    let base = d.dirs.base.clone();
    // Its TERM trap is set before it says it is ready, so no stop can come before it.
    let agent = |m: &std::path::Path, body: &str| {
        use std::os::unix::fs::PermissionsExt;
        let script = m.with_extension("sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\ntrap 'echo TERM > {m}; exit 143' TERM\n{ANSWER_READY}{body}\necho EOF > {m}\n",
                m = m.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        script.display().to_string()
    };
    // Reading is the shell's own `read`, not a child: a TERM sent to the group while the shell
    // forks a child (`cat`) can be taken by the child before its exec, leaving `cat` reading
    // on and the shell's trap waiting for it until the KILL (a loaded CI machine saw that).
    let reads_input = "while read -r _; do :; done";
    // It reads its input to the end, then ends: no signal at all.
    let reads = base.join("reads");
    let s = stand_in(&mut d, agent(&reads, reads_input)).await;
    let t0 = Instant::now();
    d.stop(&s.id, true).await.expect("stop");
    assert_eq!(std::fs::read_to_string(&reads).unwrap(), "EOF\n");
    assert!(
        t0.elapsed() < Duration::from_millis(900),
        "{:?}",
        t0.elapsed()
    );
    // It does not listen: TERM after the end grace.
    let deaf = base.join("deaf");
    let s = stand_in(&mut d, agent(&deaf, "while :; do sleep 0.1; done")).await;
    let t0 = Instant::now();
    d.stop(&s.id, true).await.expect("stop");
    assert_eq!(std::fs::read_to_string(&deaf).unwrap(), "TERM\n");
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "{:?}",
        t0.elapsed()
    );
    // A forced stop does not ask.
    let forced = base.join("forced");
    let s = stand_in(&mut d, agent(&forced, reads_input)).await;
    d.stop(&s.id, false).await.expect("stop");
    assert_eq!(std::fs::read_to_string(&forced).unwrap(), "TERM\n");
}

/// A WatchActivity client that reads more slowly than its session writes is never dropped:
/// once more is waiting for it than the hub queues, it reads on from the store, and gets
/// every activity once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_activity_watcher_reads_on_from_the_store() {
    let mut d = Daemon::start().await;
    let mut steps: Vec<serde_json::Value> = (0..5_000)
        .map(|i| json!({"thinking": format!("step {i}: {}", "x".repeat(1_000))}))
        .collect();
    steps.push(json!({"result": "done"}));
    let s = d.session(Some(("many", turns(json!(steps))))).await;
    let mut w = d.watch_activity(&s.id, 0).await;
    // Not read while three turns run: 15,000 activities of 1 KB are more than the hub queues
    // for it (4,096), its stream's buffer (4,096) and the connection's window hold.
    let mut acts = Vec::new();
    for message in ["one", "two", "three"] {
        acts.extend(d.send(&s.id, message).await);
    }
    assert!(acts.len() > 15_000, "{}", acts.len());
    let mut watched = Vec::new();
    while watched.len() < acts.len() {
        let ev = within(w.message()).await.expect("not dropped").unwrap();
        watched.push(ev.seq);
    }
    let sent: Vec<i64> = acts.iter().map(|a| a.seq).collect();
    assert_eq!(watched, sent, "every activity once, in order");
}
