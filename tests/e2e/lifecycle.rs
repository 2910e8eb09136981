//! The daemon's own life: Shutdown and SIGTERM (every session stopped gracefully, exit 0),
//! kill -9 and restart (reconciliation: OBEY-2032), one daemon per socket and per data dir,
//! stale sockets, socket permissions.

use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use paddock_proto::obey::local::v1 as pb;
use pb::SessionStatus as S;

use crate::harness::*;

fn kinds(list: &[pb::SessionActivityEvent]) -> Vec<&'static str> {
    list.iter().map(kind).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_every_session_gracefully_and_the_daemon_exits_0() {
    let mut d = Daemon::start().await;
    let idle = d.session(None).await;
    let busy = d.session(Some(("slow", slow_turn(800)))).await;
    let mut stream = d.start_turn(&busy.id, "finish me").await;
    assert_eq!(kind(&next(&mut stream).await.unwrap().unwrap()), "THINKING");

    let r = d
        .client()
        .await
        .shutdown(pb::ShutdownRequest { force: false })
        .await
        .expect("shutdown")
        .into_inner();
    assert!(r.accepted);
    assert_eq!(r.active_sessions, 2);
    // Nothing new is taken meanwhile, with a code of its own (UNAVAILABLE).
    let req = d.request(None).await;
    let e = d
        .client()
        .await
        .create_session(req)
        .await
        .expect_err("a create during shutdown");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().starts_with("OBEY-2051: "), "{e:?}");
    // A task's launch the same (it once read RESOURCE_EXHAUSTED, as for a full daemon).
    let ch = paddock::transport::channel(&d.dirs.socket).await.unwrap();
    let e = paddock_proto::aria::v1::task_service_client::TaskServiceClient::new(ch)
        .launch_task(paddock_proto::aria::v1::LaunchTaskRequest {
            command_json: r#"["true"]"#.into(),
            r#type: "command".into(),
            ..Default::default()
        })
        .await
        .expect_err("a launch during shutdown");
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert!(e.message().starts_with("OBEY-2051: "), "{e:?}");
    // Graceful: the running turn is allowed to finish.
    let rest = collect_ok(stream).await;
    assert_eq!(kinds(&rest), ["TEXT", "COMPLETION"]);
    let st = d.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(st.code(), Some(0), "{st:?}: {}", d.stderr());
    assert!(!d.dirs.socket.exists(), "the socket is removed on exit");
    assert_agent_gone(idle.pid).await;
    assert_agent_gone(busy.pid).await;

    // What the store says afterwards: both STOPPED (not reconciled as lost).
    d.launch().await;
    for id in [&idle.id, &busy.id] {
        let s = d.get(id).await;
        assert_eq!(status_name(s.status), "STOPPED", "{s:?}");
        assert_eq!(s.error_code, "");
        assert!(s.ended_at.is_some());
        assert_eq!(s.pid, 0);
    }
    assert_eq!(d.get(&busy.id).await.tokens_output, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_shutdown_interrupts_turns_and_exits_0() {
    let mut d = Daemon::start().await;
    let busy = d.session(Some(("hang", hanging_turn()))).await;
    let mut stream = d.start_turn(&busy.id, "never finish").await;
    assert_eq!(kind(&next(&mut stream).await.unwrap().unwrap()), "THINKING");
    let t0 = Instant::now();
    let r = d
        .client()
        .await
        .shutdown(pb::ShutdownRequest { force: true })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.active_sessions, 1);
    let rest = collect_ok(stream).await;
    assert_eq!(kinds(&rest), ["ERROR"]);
    let st = d.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(st.code(), Some(0), "{st:?}: {}", d.stderr());
    // No grace period was waited for.
    assert!(
        t0.elapsed() < Duration::from_millis(1900),
        "{:?}",
        t0.elapsed()
    );
    assert_agent_gone(busy.pid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_sessions_and_exits_0() {
    let mut d = Daemon::start().await;
    let s = d.session(None).await;
    kill(Pid::from_raw(d.pid() as i32), Signal::SIGTERM).unwrap();
    let st = d.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(st.code(), Some(0), "{st:?}: {}", d.stderr());
    assert_agent_gone(s.pid).await;
    d.launch().await;
    assert_eq!(status_name(d.get(&s.id).await.status), "STOPPED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_watch_all_stream_does_not_keep_the_daemon_alive() {
    let mut d = Daemon::start().await;
    let mut all = d
        .client()
        .await
        .watch_all_sessions(pb::WatchAllSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let s = d.session(None).await;
    collect_until(&mut all, |e| e.new_status == S::Running as i32).await;
    d.client()
        .await
        .shutdown(pb::ShutdownRequest { force: false })
        .await
        .unwrap();
    // The watcher sees the session stop, then its stream ends with the daemon.
    collect_until(&mut all, |e| e.new_status == S::Stopped as i32).await;
    let st = d.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(st.code(), Some(0), "{st:?}: {}", d.stderr());
    assert!(next(&mut all).await.is_none_or(|r| r.is_err()));
    assert_agent_gone(s.pid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_a_restarted_daemon_fails_live_sessions_with_2032() {
    // Agents as the daemon's own children (no runner): they die with it (PDEATHSIG), and the
    // next daemon reconciles their sessions. (With the runner they survive: runner_mode.rs.)
    let mut d = Daemon::start_with(Dirs::new(), &["--no-runner"]).await;
    let idle = d.session(None).await;
    let busy = d.session(Some(("hang", hanging_turn()))).await;
    let done = d.session(None).await;
    d.stop(&done.id, true).await.unwrap();
    let mut stream = d.start_turn(&busy.id, "never finish").await;
    assert_eq!(kind(&next(&mut stream).await.unwrap().unwrap()), "THINKING");
    assert!(agent_running(idle.pid as u32) && agent_running(busy.pid as u32));

    d.kill9();
    // The agents die with the daemon (PDEATHSIG).
    assert_agent_gone(idle.pid).await;
    assert_agent_gone(busy.pid).await;
    // The client's stream does not end as if the turn had completed.
    match next(&mut stream).await {
        None => {}
        Some(Err(_)) => {}
        Some(Ok(ev)) => panic!("unexpected event after the daemon died: {ev:?}"),
    }
    assert!(
        d.dirs.socket.exists(),
        "kill -9 leaves the socket file behind"
    );

    // Same socket (the stale file is replaced), same data dir.
    d.launch().await;
    for (s, was) in [(&idle, "RUNNING"), (&busy, "WORKING")] {
        let info = d.get(&s.id).await;
        assert_eq!(status_name(info.status), "FAILED", "{info:?}");
        assert_eq!(info.error_code, "OBEY-2032");
        assert!(
            info.error_message.starts_with("OBEY-2032: ")
                && info.error_message.contains("daemon restarted")
                && info.error_message.contains(was),
            "{}",
            info.error_message
        );
        assert_eq!(info.pid, 0);
        assert!(info.ended_at.is_some());
    }
    // The session stopped before the crash stays STOPPED.
    let info = d.get(&done.id).await;
    assert_eq!(status_name(info.status), "STOPPED");
    assert_eq!(info.error_code, "");

    let mut c = d.client().await;
    let active = c
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sessions;
    assert!(active.is_empty(), "{active:?}");
    let st = c.get_state(pb::StateRequest {}).await.unwrap().into_inner();
    assert!(st.active_sessions.is_empty());
    assert_eq!(st.session_count, 3);
    // Its history survived, ending with the failure.
    let acts = c
        .list_activities(pb::ListActivitiesRequest {
            session_id: busy.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .activities;
    assert_eq!(acts.first().map(kind), Some("THINKING"));
    // A reconciled session can be restarted and works again.
    let r = c
        .restart_session(pb::RestartSessionRequest {
            session_id: idle.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    assert_eq!(status_name(r.status), "RUNNING");
    assert_eq!(r.restart_count, 1);
    let acts = d.send(&idle.id, "are you back?").await;
    assert_eq!(acts.last().map(kind), Some("COMPLETION"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_sessions_stay_in_the_store_until_named_and_then_answer_as_before() {
    // A restarted daemon restores only what it must decide on; an ended session is read back
    // (recalled) the first time a request names it. Lists read the store.
    let mut d = Daemon::start_with_env(Dirs::new(), &[], &[("PADDOCK_LOG", "paddock=debug")]).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let s = d.session(None).await;
        d.stop(&s.id, true).await.unwrap();
        ids.push(s.id);
    }
    ids.sort();
    d.kill9();
    d.launch().await;
    let mut c = d.client().await;
    // Every ended session is listed, newest first, page by page.
    let page = |token: String| pb::ListSessionsRequest {
        include_terminated: true,
        page_size: 2,
        page_token: token,
        ..Default::default()
    };
    let first = c
        .list_sessions(page(String::new()))
        .await
        .unwrap()
        .into_inner();
    let listed: Vec<&str> = first.sessions.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(listed, [ids[2].as_str(), ids[1].as_str()]);
    assert!(first
        .sessions
        .iter()
        .all(|s| status_name(s.status) == "STOPPED"));
    let second = c
        .list_sessions(page(first.next_page_token))
        .await
        .unwrap()
        .into_inner();
    let listed: Vec<&str> = second.sessions.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(listed, [ids[0].as_str()]);
    assert_eq!(second.next_page_token, "");
    let st = c.get_state(pb::StateRequest {}).await.unwrap().into_inner();
    assert_eq!(st.session_count, 3);
    assert!(
        !d.stderr().contains("recalled a settled session"),
        "nothing named a session yet: {}",
        d.stderr()
    );
    // Named, each answers as it did: a restart works, a second stop is OBEY-2020, a delete
    // forgets the session.
    let r = c
        .restart_session(pb::RestartSessionRequest {
            session_id: ids[0].clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap();
    assert_eq!(status_name(r.status), "RUNNING");
    assert_eq!(r.restart_count, 1);
    let acts = d.send(&ids[0], "are you back?").await;
    assert_eq!(acts.last().map(kind), Some("COMPLETION"));
    let again = d.stop(&ids[1], true).await.unwrap_err();
    assert_status(&again, tonic::Code::FailedPrecondition, "OBEY-2020");
    c.delete_session(pb::DeleteSessionRequest {
        session_id: ids[2].clone(),
    })
    .await
    .unwrap();
    let gone = c
        .get_session(pb::GetSessionRequest {
            session_id: ids[2].clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound, "{gone:?}");
    let st = c.get_state(pb::StateRequest {}).await.unwrap().into_inner();
    assert_eq!(st.session_count, 2);
    assert_eq!(st.active_sessions.len(), 1);
    assert!(d.stderr().contains("recalled a settled session"));
}

/// Runs a second daemon that must refuse to start; its stderr.
async fn refused_start(d: &Daemon, socket: &std::path::Path, data: &std::path::Path) -> String {
    let mut child = Daemon::daemon_command(&d.dirs, socket, data, Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            stop_child(&mut child);
            panic!("the second daemon did not refuse to start");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(
        status.code(),
        Some(1),
        "{status:?} (signal {:?}): {err}",
        status.signal()
    );
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_on_the_same_socket_or_data_dir_refuses() {
    let d = Daemon::start().await;
    let other_data = d.dirs.base.join("data2");
    let err = refused_start(&d, &d.dirs.socket, &other_data).await;
    assert!(
        err.contains(&format!(
            "another paddock daemon is already listening on {}",
            d.dirs.socket.display()
        )),
        "{err}"
    );
    let other_socket = d.dirs.base.join("other.sock");
    let err = refused_start(&d, &other_socket, &d.dirs.data).await;
    assert!(
        err.contains("another paddock daemon is already using the data dir"),
        "{err}"
    );
    // The first one is untouched.
    assert!(d.dirs.socket.exists());
    d.client().await.ping(pb::PingRequest {}).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_socket_file_is_replaced() {
    let dirs = Dirs::new();
    std::fs::create_dir_all(dirs.socket.parent().unwrap()).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&dirs.socket).unwrap());
    assert!(dirs.socket.exists());
    let d = Daemon::start_in(dirs).await;
    d.client().await.ping(pb::PingRequest {}).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_dir_is_0700_and_the_socket_0600() {
    let d = Daemon::start().await;
    assert_eq!(mode(d.dirs.socket.parent().unwrap()), 0o700);
    assert_eq!(mode(&d.dirs.socket), 0o600);
}

/// In both modes: as a run of the runner (stopped when the daemon's connection closes) and as
/// the daemon's own child (`--no-runner`: the parent-death signal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executed_command_dies_with_a_killed_daemon() {
    use pb::execute_response::Output;
    for args in [&[][..], &["--no-runner"]] {
        let mut d = Daemon::start_with(Dirs::new(), args).await;
        // Far longer than the wait below: the command must be ended, not end.
        let mut s = d.execute_shell("echo $$; exec sleep 300").await;
        let pid: u32 = match next(&mut s).await {
            Some(Ok(pb::ExecuteResponse {
                output: Some(Output::Stdout(line)),
            })) => line.trim().parse().unwrap(),
            other => panic!("expected the pid, got {other:?}"),
        };
        assert!(pid_running(pid));
        d.kill9();
        wait_pid_gone(
            pid,
            WAIT,
            &format!("the command, after the daemon ({args:?})"),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_execute_stream_does_not_keep_the_daemon_alive() {
    let mut d = Daemon::start().await;
    let mut s = d.execute_shell("echo started; exec sleep 30").await;
    assert!(next(&mut s).await.unwrap().is_ok());
    let st = d.shut_down(Duration::from_secs(10)).await;
    assert_eq!(st.code(), Some(0), "{st:?}: {}", d.stderr());
}

/// The daemon's log (`--log-file`, as an autostarted daemon gets) rotates by size and never
/// holds terminal escape codes; so does its runner's (`runner.log`, rotated at its default size).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_log_rotates_by_size_and_has_no_colour_codes() {
    let dirs = Dirs::new();
    let log = dirs.base.join("daemon.log");
    let log_arg = log.display().to_string();
    let mut d = Daemon::start_with_env(
        dirs,
        &["--log-file", &log_arg, "--log-max-bytes", "600"],
        &[("PADDOCK_LOG", "debug")],
    )
    .await;
    for _ in 0..6 {
        let s = d.session(None).await;
        d.send(&s.id, "hello").await;
        d.stop(&s.id, false).await.unwrap();
    }
    // Read once the daemon is gone: a rotation moves every old file up one (daemon.log.4 for a
    // moment) before it removes the oldest, and a debug log rotates at any line.
    let st = d.shut_down(Duration::from_secs(10)).await;
    assert_eq!(st.code(), Some(0), "{st:?}");
    let rotated = log.with_extension("log.1");
    assert!(
        rotated.exists(),
        "daemon.log.1 after more than 600 bytes of log"
    );
    assert!(
        !log.with_extension("log.4").exists(),
        "at most 3 old files are kept"
    );
    let mut all = String::new();
    for f in [&log, &rotated] {
        let text = std::fs::read_to_string(f).unwrap();
        assert!(
            !text.contains('\u{1b}'),
            "no ANSI codes in {}: {text}",
            f.display()
        );
        all.push_str(&text);
    }
    assert!(
        all.contains(" DEBUG ") || all.contains(" INFO "),
        "log lines: {all}"
    );
    // Rotated once past the limit: an old file holds the limit and at most one more line.
    let old = std::fs::metadata(&rotated).unwrap().len();
    assert!(
        (600..600 + 8192).contains(&old),
        "daemon.log.1 has {old} bytes"
    );
    let runner_log = std::fs::read_to_string(d.dirs.data.join("runner.log")).unwrap();
    assert!(
        runner_log.contains("paddock runner listening"),
        "{runner_log}"
    );
    assert!(!runner_log.contains('\u{1b}'), "{runner_log}");
}
