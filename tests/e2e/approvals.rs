//! Human approvals over the wire: a scripted agent asks (permission, question, client tool),
//! the session is WAITING with the request listed, and a client resolves it exactly once —
//! or it expires; a pending request survives a daemon kill -9 and is answered afterwards.

use std::time::{Duration, Instant};

use paddock_proto::obey::local::v1 as pb;
use serde_json::{json, Value};

use crate::harness::*;

/// A turn that asks permission for Bash, then ends with what it was told.
fn asking_turn() -> Value {
    json!({"turns": [{"steps": [
        {"thinking": "I need to clean the build directory."},
        {"ask": "Bash", "input": {"command": "rm -rf build"}, "allowed_result": "removed build/"},
        {"result": "Done: {answer}", "tokens_in": 10, "tokens_out": 5}
    ]}]})
}

async fn asking_session(d: &mut Daemon, script: Value, config: &[(&str, &str)]) -> pb::SessionInfo {
    let mut req = d.request(Some(("asking", script))).await;
    req.provider_config
        .insert("permissions".into(), "ask:Read,LS".into());
    for (k, v) in config {
        req.provider_config.insert(k.to_string(), v.to_string());
    }
    d.create(req).await
}

/// Waits until the session has one open request; returns it.
async fn wait_pending(d: &Daemon, session: &str) -> pb::Approval {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let list = d
            .client()
            .await
            .list_approvals(pb::ListApprovalsRequest {
                session_id: session.into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .approvals;
        if let Some(a) = list.into_iter().next() {
            return a;
        }
        assert!(Instant::now() < deadline, "no approval was ever requested");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn resolve(
    d: &Daemon,
    id: &str,
    decision: pb::ApprovalDecision,
    text: &str,
) -> Result<pb::Approval, tonic::Status> {
    d.client()
        .await
        .resolve_approval(pb::ResolveApprovalRequest {
            approval_id: id.into(),
            decision: decision as i32,
            text: text.into(),
            is_error: false,
            resolved_by: "test".into(),
        })
        .await
        .map(|r| r.into_inner())
}

fn last_text(acts: &[pb::SessionActivityEvent]) -> String {
    acts.last().map(|a| a.content.clone()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_tool_runs_and_a_second_answer_is_refused() {
    let mut d = Daemon::start().await;
    let s = asking_session(&mut d, asking_turn(), &[]).await;
    let turn = d.start_turn(&s.id, "clean up").await;
    let a = wait_pending(&d, &s.id).await;
    assert_eq!(a.kind, pb::ApprovalKind::Permission as i32);
    assert_eq!(a.tool_name, "Bash");
    assert_eq!(a.summary, "Bash: rm -rf build");
    assert_eq!(a.state, pb::ApprovalState::Pending as i32);
    let input: Value = serde_json::from_str(&a.input_json).unwrap();
    assert_eq!(input["command"], "rm -rf build");
    let info = d.get(&s.id).await;
    assert_eq!(status_name(info.status), "WAITING");
    assert_eq!(info.pending_approvals, 1);
    // Aria's clients that understand it see "waiting"; a seed client sees the seed's "active".
    let mut aria = paddock_proto::aria::v1::session_service_client::SessionServiceClient::new(
        crate::aria::aria_channel(&d).await,
    );
    let get = || paddock_proto::aria::v1::GetSessionRequest {
        session_id: s.id.clone(),
    };
    let seen = aria.get_session(aware(get())).await.unwrap().into_inner();
    assert_eq!(seen.status, "waiting");
    let seen = aria.get_session(get()).await.unwrap().into_inner();
    assert_eq!(seen.status, "active");
    // A message now is refused: the agent waits for a human.
    let busy = d
        .client()
        .await
        .send_message(pb::SendMessageRequest {
            session_id: s.id.clone(),
            message: "hello?".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(busy.code(), tonic::Code::FailedPrecondition);
    assert!(
        busy.message().starts_with("OBEY-2011"),
        "{}",
        busy.message()
    );

    let done = resolve(&d, &a.id, pb::ApprovalDecision::Approve, "")
        .await
        .unwrap();
    assert_eq!(done.state, pb::ApprovalState::Approved as i32);
    assert!(done.allowed);
    assert_eq!(done.resolved_by, "test");
    let acts = collect_ok(turn).await;
    assert_eq!(last_text(&acts), "Done: removed build/");
    let kinds: Vec<&str> = acts.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            "THINKING",
            "TOOL_CALL",
            "STATUS",
            "STATUS",
            "TOOL_RESULT",
            "COMPLETION"
        ],
        "{acts:#?}"
    );
    assert!(acts[2]
        .content
        .starts_with(&format!("waiting for approval ({})", a.id)));
    assert!(
        acts[3].content.contains("approved (test)"),
        "{}",
        acts[3].content
    );
    assert_eq!(status_name(d.get(&s.id).await.status), "RUNNING");

    // Exactly once: the second answer is OBEY-2041, an unknown id OBEY-2040.
    let again = resolve(&d, &a.id, pb::ApprovalDecision::Deny, "no")
        .await
        .unwrap_err();
    assert_eq!(again.code(), tonic::Code::FailedPrecondition);
    assert!(
        again.message().starts_with("OBEY-2041"),
        "{}",
        again.message()
    );
    assert!(again.message().contains("already approved"));
    let unknown = resolve(&d, "nope", pb::ApprovalDecision::Approve, "")
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    assert!(unknown.message().starts_with("OBEY-2040"));
    // The resolved request stays listed with include_resolved.
    let all = d
        .client()
        .await
        .list_approvals(pb::ListApprovalsRequest {
            session_id: s.id.clone(),
            include_resolved: true,
            limit: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .approvals;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].state, pb::ApprovalState::Approved as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_tool_tells_the_agent_why() {
    let mut d = Daemon::start().await;
    let s = asking_session(&mut d, asking_turn(), &[]).await;
    let turn = d.start_turn(&s.id, "clean up").await;
    let a = wait_pending(&d, &s.id).await;
    let done = resolve(&d, &a.id, pb::ApprovalDecision::Deny, "keep the build")
        .await
        .unwrap();
    assert_eq!(done.state, pb::ApprovalState::Denied as i32);
    let acts = collect_ok(turn).await;
    assert_eq!(last_text(&acts), "Done: denied: keep the build");
    let result = acts.iter().find(|a| kind(a) == "TOOL_RESULT").unwrap();
    assert!(!result.tool_success);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn questions_are_answered_with_text_and_client_tools_with_their_result() {
    let mut d = Daemon::start().await;
    let script = json!({"turns": [{"steps": [
        {"question": "The test assumes PostgreSQL 14 but CI uses 15. Update the test or the CI config?",
         "options": ["Update the test", "Update the CI config"]},
        {"client_tool": "run_tests", "input": {"filter": "db"}},
        {"result": "Final: {answer}"}
    ]}]});
    let s = asking_session(&mut d, script, &[]).await;
    let turn = d.start_turn(&s.id, "fix the tests").await;
    let q = wait_pending(&d, &s.id).await;
    assert_eq!(q.kind, pb::ApprovalKind::Question as i32);
    assert_eq!(
        q.summary,
        "The test assumes PostgreSQL 14 but CI uses 15. Update the test or the CI config? [Update the test / Update the CI config]"
    );
    // A question is not approved or denied blindly: approving is allowed (empty answer), but
    // here the human answers.
    resolve(
        &d,
        &q.id,
        pb::ApprovalDecision::Answer,
        "Update the CI config",
    )
    .await
    .unwrap();
    let t = loop {
        let t = wait_pending(&d, &s.id).await;
        if t.id != q.id {
            break t;
        }
    };
    assert_eq!(t.kind, pb::ApprovalKind::ClientTool as i32);
    assert_eq!(t.tool_name, "run_tests");
    // A client tool cannot be "approved": it needs its result.
    let wrong = resolve(&d, &t.id, pb::ApprovalDecision::Approve, "")
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::FailedPrecondition);
    resolve(
        &d,
        &t.id,
        pb::ApprovalDecision::Answer,
        "12 passed, 0 failed",
    )
    .await
    .unwrap();
    let acts = collect_ok(turn).await;
    let results: Vec<&str> = acts
        .iter()
        .filter(|a| kind(a) == "TOOL_RESULT")
        .map(|a| a.content.as_str())
        .collect();
    assert_eq!(
        results,
        ["User answered: Update the CI config", "12 passed, 0 failed"]
    );
    assert_eq!(last_text(&acts), "Final: 12 passed, 0 failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_request_expires_with_the_default_and_the_session_carries_on() {
    let mut d = Daemon::start().await;
    let s = asking_session(&mut d, asking_turn(), &[("approval_timeout", "500ms")]).await;
    let turn = d.start_turn(&s.id, "clean up").await;
    let a = wait_pending(&d, &s.id).await;
    let acts = collect_ok(turn).await;
    assert!(
        last_text(&acts).starts_with("Done: denied: nobody answered within 0 s"),
        "{}",
        last_text(&acts)
    );
    let late = resolve(&d, &a.id, pb::ApprovalDecision::Approve, "")
        .await
        .unwrap_err();
    assert!(
        late.message().contains("already expired"),
        "{}",
        late.message()
    );
    assert_eq!(status_name(d.get(&s.id).await.status), "RUNNING");

    // approval_default=allow: the expiry lets it go ahead.
    let s = asking_session(
        &mut d,
        asking_turn(),
        &[("approval_timeout", "300ms"), ("approval_default", "allow")],
    )
    .await;
    let acts = d.send(&s.id, "clean up").await;
    assert_eq!(last_text(&acts), "Done: removed build/");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_settles_what_it_allows_without_asking() {
    let mut d = Daemon::start().await;
    let script = json!({"turns": [{"steps": [
        {"ask": "Read", "input": {"file_path": "notes.txt"}},
        {"ask": "Bash", "input": {"command": "make"}},
        {"result": "{answer}"}
    ]}]});
    let mut req = d.request(Some(("policy", script))).await;
    req.provider_config
        .insert("permissions".into(), "allow:Read".into());
    let s = d.create(req).await;
    let acts = d.send(&s.id, "go").await;
    let results: Vec<(&str, bool)> = acts
        .iter()
        .filter(|a| kind(a) == "TOOL_RESULT")
        .map(|a| (a.content.as_str(), a.tool_success))
        .collect();
    assert_eq!(
        results,
        [
            ("remember the milk\n", true),
            (
                "denied: paddock: the session's permission policy denies Bash",
                false
            )
        ]
    );
    // Nothing was asked of a human.
    let all = d
        .client()
        .await
        .list_approvals(pb::ListApprovalsRequest {
            session_id: s.id.clone(),
            include_resolved: true,
            limit: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .approvals;
    assert!(all.is_empty(), "{all:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_request_survives_a_daemon_kill_and_its_answer_reaches_the_agent() {
    let mut d = Daemon::start().await;
    let s = asking_session(&mut d, asking_turn(), &[]).await;
    let _turn = d.start_turn(&s.id, "clean up").await;
    let a = wait_pending(&d, &s.id).await;
    d.kill9();
    assert!(
        agent_running(s.pid as u32),
        "the agent waits on, in the runner"
    );
    d.launch().await;
    // Still listed, still WAITING, still answerable.
    let info = d.get(&s.id).await;
    assert_eq!(status_name(info.status), "WAITING");
    assert_eq!(info.pid, s.pid);
    let again = wait_pending(&d, &s.id).await;
    assert_eq!(again.id, a.id);
    let mut watch = d.watch_activity(&s.id, 0).await;
    resolve(&d, &a.id, pb::ApprovalDecision::Approve, "")
        .await
        .unwrap();
    let acts = collect_until(&mut watch, |a| kind(a) == "COMPLETION").await;
    assert_eq!(last_text(&acts), "Done: removed build/");
    d.wait_status(&s.id, pb::SessionStatus::Running).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_while_waiting_cancels_the_request_and_a_watcher_sees_it_all() {
    let mut d = Daemon::start().await;
    let mut watch = d
        .client()
        .await
        .watch_approvals(pb::WatchApprovalsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let s = asking_session(&mut d, asking_turn(), &[]).await;
    let turn = d.start_turn(&s.id, "clean up").await;
    let opened = next(&mut watch).await.unwrap().unwrap();
    assert_eq!(opened.state, pb::ApprovalState::Pending as i32);
    assert_eq!(opened.session_id, s.id);
    // A graceful stop tells the agent no; its turn finishes and the session stops.
    let stopped = d.stop(&s.id, true).await.unwrap();
    assert_eq!(status_name(stopped.status), "STOPPED");
    let closed = next(&mut watch).await.unwrap().unwrap();
    assert_eq!(closed.id, opened.id);
    assert_eq!(closed.state, pb::ApprovalState::Cancelled as i32);
    assert_eq!(closed.answer, "the session is stopping");
    let acts = collect_ok(turn).await;
    assert_eq!(last_text(&acts), "Done: denied: the session is stopping");
    let late = resolve(&d, &opened.id, pb::ApprovalDecision::Approve, "")
        .await
        .unwrap_err();
    assert!(late.message().contains("already cancelled"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_lists_approves_denies_and_answers() {
    let mut d = Daemon::start().await;
    let script = json!({"turns": [{"steps": [
        {"ask": "Bash", "input": {"command": "make test"}},
        {"question": "Ship it?", "options": ["yes", "no"]},
        {"ask": "Bash", "input": {"command": "git push"}},
        {"result": "{answer}"}
    ]}]});
    let s = asking_session(&mut d, script, &[]).await;
    let turn = d.start_turn(&s.id, "go").await;
    let cli = |args: &[&str]| {
        let out = d.dirs.cli(false).args(args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let a = wait_pending(&d, &s.id).await;
    let (code, out, _) = cli(&["approvals"]);
    assert_eq!(code, Some(0));
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["ID", "SESSION", "KIND", "STATE", "WHAT", "AGE"]);
    assert!(
        out.contains(&a.id) && out.contains("Bash: make test"),
        "{out}"
    );
    let (code, out, _) = cli(&["approve", &a.id]);
    assert_eq!(code, Some(0));
    assert!(out.contains("approved by cli"), "{out}");
    let (code, _, err) = cli(&["approve", &a.id]);
    assert_eq!(code, Some(4), "refused: exit 4");
    assert!(err.contains("OBEY-2041"), "{err}");

    let q = loop {
        let q = wait_pending(&d, &s.id).await;
        if q.id != a.id {
            break q;
        }
    };
    let (code, out, _) = cli(&["--json", "approvals", "--session", &s.id]);
    assert_eq!(code, Some(0));
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed[0]["kind"], "question");
    assert_eq!(listed[0]["summary"], "Ship it? [yes / no]");
    // approve refuses a question, and says how to answer it.
    let (code, _, err) = cli(&["approve", &q.id]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("is a question") && err.contains("paddock answer"),
        "{err}"
    );
    // A unique prefix of the id is enough.
    let (code, _, err) = cli(&["answer", &q.id[..q.id.len() - 6], "yes"]);
    assert_eq!(code, Some(0), "{err}");

    let p = loop {
        let p = wait_pending(&d, &s.id).await;
        if p.id != q.id {
            break p;
        }
    };
    let (code, out, _) = cli(&["deny", &p.id, "--reason", "not on a Friday"]);
    assert_eq!(code, Some(0), "{out}");
    let acts = collect_ok(turn).await;
    assert_eq!(last_text(&acts), "denied: not on a Friday");
    let (_, out, _) = cli(&["approvals"]);
    assert_eq!(out.trim(), "nothing is waiting for you");
    let (_, out, _) = cli(&["--json", "approvals", "--all"]);
    let all: Value = serde_json::from_str(&out).unwrap();
    let states: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["denied", "answered", "approved"]);
}

/// The configuration file reaches an autostarted-or-not daemon: `[daemon] max_sessions` caps
/// sessions unless the flag says otherwise, and `[notify]` runs its command and POSTs to its
/// webhook when an agent asks for approval and when a turn ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_file_sets_daemon_limits_and_notifications() {
    use std::io::{BufRead, Read};
    let dirs = Dirs::new();
    let hook_out = dirs.base.join("notes.txt");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (posted_tx, mut posted) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut r = std::io::BufReader::new(conn);
            let mut len = 0usize;
            let mut line = String::new();
            while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                if line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    len = v.trim().parse().unwrap_or(0);
                }
                line.clear();
            }
            let mut body = vec![0; len];
            let _ = r.read_exact(&mut body);
            let mut conn = r.into_inner();
            let _ = std::io::Write::write_all(
                &mut conn,
                b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n",
            );
            let _ = posted_tx.send(String::from_utf8_lossy(&body).into_owned());
        }
    });
    let config = dirs.base.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[daemon]\nmax_sessions = 1\n\n[notify]\non = [\"approval\", \"turn_done\"]\n\
             command = \"echo $PADDOCK_EVENT $PADDOCK_APPROVAL >> {}\"\n\
             webhook = \"http://127.0.0.1:{port}/hook\"\n",
            hook_out.display()
        ),
    )
    .unwrap();
    let cfg = config.display().to_string();
    let mut d = Daemon::start_with_env(dirs, &[], &[("PADDOCK_CONFIG", &cfg)]).await;
    let s = asking_session(&mut d, asking_turn(), &[]).await;
    // [daemon] max_sessions = 1: a second live session is refused.
    let mut req = d.request(None).await;
    req.agent_name = "second".into();
    let e = d.client().await.create_session(req).await.unwrap_err();
    assert!(e.message().contains("OBEY-"), "{e:?}");

    let turn = d.start_turn(&s.id, "go").await;
    let a = wait_pending(&d, &s.id).await;
    let first: Value = serde_json::from_str(&within(posted.recv()).await.unwrap()).unwrap();
    assert_eq!(first["event"], "approval", "{first}");
    assert_eq!(first["approval"], a.id.as_str(), "{first}");
    assert_eq!(first["session"], s.id.as_str(), "{first}");
    resolve(&d, &a.id, pb::ApprovalDecision::Approve, "")
        .await
        .unwrap();
    collect_ok(turn).await;
    let done: Value = serde_json::from_str(&within(posted.recv()).await.unwrap()).unwrap();
    assert_eq!(done["event"], "turn_done", "{done}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&hook_out).unwrap_or_default();
        if text.contains("turn_done") {
            assert!(text.starts_with(&format!("approval {}", a.id)), "{text}");
            break;
        }
        assert!(Instant::now() < deadline, "the hook never ran: {text:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(d);

    // A flag wins over the file.
    let dirs = Dirs::new();
    let mut d =
        Daemon::start_with_env(dirs, &["--max-sessions", "2"], &[("PADDOCK_CONFIG", &cfg)]).await;
    d.session(None).await;
    d.session(None).await;
}

/// The next line a watch printed, as JSON.
async fn json_line(lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>) -> Value {
    let line = within(lines.recv()).await.expect("the watch ended");
    serde_json::from_str(&line).expect("a JSON line")
}

/// `approvals --watch` prints each request as it is opened and as it is resolved, until
/// Ctrl-C (exit 0); `--session` takes the session's name, as every command taking an id does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_watch_follows_requests_and_names_stand_for_ids() {
    use std::io::BufRead;
    let mut d = Daemon::start().await;
    let mut req = d.request(Some(("asking", asking_turn()))).await;
    req.provider_config
        .insert("permissions".into(), "ask".into());
    req.agent_name = "builder".into();
    let s = d.create(req).await;
    let mut watch = d
        .dirs
        .cli(false)
        .args(["--json", "approvals", "--watch", "--session", "builder"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _guard = PidGuard(watch.id());
    let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let out = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let turn = d.start_turn(&s.id, "go").await;
    let opened = json_line(&mut lines).await;
    assert_eq!(opened["state"], "pending", "{opened}");
    assert_eq!(opened["session_id"], s.id.as_str(), "{opened}");
    let id = opened["id"].as_str().unwrap().to_string();
    // The name works for the other commands too.
    let info = d
        .dirs
        .cli(false)
        .args(["--json", "session", "info", "builder"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&info.stdout).contains(&s.id),
        "{info:?}"
    );
    let ok = d.dirs.cli(false).args(["approve", &id]).output().unwrap();
    assert!(ok.status.success(), "{ok:?}");
    let resolved = json_line(&mut lines).await;
    assert_eq!(
        (resolved["id"].as_str(), resolved["state"].as_str()),
        (Some(id.as_str()), Some("approved"))
    );
    collect_ok(turn).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(watch.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let st = watch.wait().unwrap();
    assert_eq!(st.code(), Some(0), "Ctrl-C ends the watch quietly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aria_notification_stream_says_when_an_agent_waits_and_when_it_goes_on() {
    use paddock_proto::aria::v1 as aria;
    use paddock_proto::aria::v1::notification::EventPayload;
    let mut d = Daemon::start().await;
    let mut n = aria::notification_service_client::NotificationServiceClient::new(
        crate::aria::aria_channel(&d).await,
    )
    .stream_notifications(aware(aria::StreamNotificationsRequest {}))
    .await
    .unwrap()
    .into_inner();
    let s = asking_session(&mut d, asking_turn(), &[]).await;
    let turn = d.start_turn(&s.id, "clean up").await;
    let is = |x: &aria::Notification, prev: &str, new: &str| {
        matches!(&x.event_payload, Some(EventPayload::SessionStatus(e))
            if e.session_id == s.id && e.previous_status == prev && e.new_status == new)
    };
    let got = collect_until(&mut n, |x| is(x, "WORKING", "WAITING")).await;
    let Some(EventPayload::SessionStatus(e)) = &got.last().unwrap().event_payload else {
        unreachable!()
    };
    assert!(
        e.message.starts_with("waiting for approval (")
            && e.message.ends_with("Bash: rm -rf build"),
        "{}",
        e.message
    );
    let a = wait_pending(&d, &s.id).await;
    resolve(&d, &a.id, pb::ApprovalDecision::Approve, "")
        .await
        .unwrap();
    collect_until(&mut n, |x| is(x, "WAITING", "WORKING")).await;
    collect_ok(turn).await;
    // The turn's own RUNNING ⇄ WORKING is not news.
    d.stop(&s.id, false).await.unwrap();
    let got = collect_until(&mut n, |x| {
        matches!(&x.event_payload, Some(EventPayload::SessionStatus(e)) if e.new_status == "STOPPED")
    })
    .await;
    assert!(!got.iter().any(|x| is(x, "WORKING", "RUNNING")), "{got:?}");
}

/// WAITING is paddock's (SessionStatus 8): a client generated from the obey seed, which does
/// not say it understands it (`paddock-extensions`), sees WORKING instead — in GetSession,
/// ListSessions (asking for WORKING finds it), GetState and its status streams, where the
/// WORKING ⇄ WAITING changes are not sent at all. paddock's own clients see WAITING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_client_sees_working_where_paddock_says_waiting() {
    let mut d = Daemon::start().await;
    let s = asking_session(&mut d, asking_turn(), &[]).await;
    let ch = paddock::transport::channel(&d.dirs.socket).await.unwrap();
    let mut seed = pb::local_daemon_service_client::LocalDaemonServiceClient::new(ch);
    let watch = |mut c: pb::local_daemon_service_client::LocalDaemonServiceClient<_>| {
        let id = s.id.clone();
        async move {
            c.watch_session(pb::WatchSessionRequest { session_id: id })
                .await
                .unwrap()
                .into_inner()
        }
    };
    let seed_events = watch(seed.clone()).await;
    let aware_events = {
        let mut c = d.client().await;
        c.watch_session(pb::WatchSessionRequest {
            session_id: s.id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
    };
    let turn = d.start_turn(&s.id, "clean up").await;
    let a = wait_pending(&d, &s.id).await;

    let waiting = pb::SessionStatus::Waiting as i32;
    let working = pb::SessionStatus::Working as i32;
    assert_eq!(d.get(&s.id).await.status, waiting);
    let get = seed
        .get_session(pb::GetSessionRequest {
            session_id: s.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(get.status, working);
    let listed = seed
        .list_sessions(pb::ListSessionsRequest {
            statuses: vec![working],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .sessions;
    assert_eq!(
        listed
            .iter()
            .map(|x| (x.id.as_str(), x.status))
            .collect::<Vec<_>>(),
        [(s.id.as_str(), working)]
    );
    let state = seed
        .get_state(pb::StateRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        state
            .active_sessions
            .iter()
            .filter(|x| x.id == s.id)
            .map(|x| x.status)
            .collect::<Vec<_>>(),
        [working],
        "{state:?}"
    );

    resolve(&d, &a.id, pb::ApprovalDecision::Approve, "")
        .await
        .unwrap();
    collect_ok(turn).await;
    d.stop(&s.id, false).await.unwrap();
    let pairs = |evs: Vec<pb::SessionStatusEvent>| -> Vec<(i32, i32)> {
        evs.iter()
            .map(|e| (e.previous_status, e.new_status))
            .collect()
    };
    let seed_seen = pairs(collect_ok(seed_events).await);
    let aware_seen = pairs(collect_ok(aware_events).await);
    assert!(aware_seen.contains(&(working, waiting)), "{aware_seen:?}");
    assert!(aware_seen.contains(&(waiting, working)), "{aware_seen:?}");
    assert!(
        seed_seen
            .iter()
            .all(|(p, n)| *p != waiting && *n != waiting && p != n),
        "{seed_seen:?}"
    );
    assert_eq!(
        seed_seen.len() + 2,
        aware_seen.len(),
        "{seed_seen:?} {aware_seen:?}"
    );
}

/// A session that names no permissions gets the safe default: on the host the agent's command
/// waits for a human; in a bubblewrap sandbox it runs (the sandbox is the guard). A restart
/// with a new configuration keeps what the session had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_asks_on_the_host_and_trusts_the_sandbox() {
    let mut d = Daemon::start().await;
    let req = d.request(Some(("asking", asking_turn()))).await;
    assert!(!req.provider_config.contains_key("permissions"));
    let host = d.create(req.clone()).await;
    assert_eq!(host.provider_config["permissions"], "ask");
    let turn = d.start_turn(&host.id, "clean up").await;
    let a = wait_pending(&d, &host.id).await;
    assert_eq!(a.tool_name, "Bash");
    resolve(&d, &a.id, pb::ApprovalDecision::Approve, "")
        .await
        .unwrap();
    drop(turn);

    let mut boxed = req;
    boxed.environment_spec = Some(pb::SessionEnvironment {
        driver: "bubblewrap".into(),
        ..Default::default()
    });
    let boxed = d.create(boxed).await;
    assert_eq!(boxed.provider_config["permissions"], "allow-all");
    let acts = d.send(&boxed.id, "clean up").await;
    let last = acts.last().unwrap();
    assert_eq!(kind(last), "COMPLETION", "{acts:?}");
    assert!(last.content.contains("removed build/"), "{}", last.content);

    // A restart whose configuration leaves permissions out keeps the session's.
    d.wait_status(&host.id, pb::SessionStatus::Running).await;
    let script = host.provider_config["script"].clone();
    let r = d
        .client()
        .await
        .restart_session(pb::RestartSessionRequest {
            session_id: host.id.clone(),
            provider_config: [("script".to_string(), script)].into_iter().collect(),
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    assert_eq!(r.provider_config["permissions"], "ask");
}
