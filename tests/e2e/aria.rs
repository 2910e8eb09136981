//! The Aria runtime API (`aria.v1`) over the Aria socket (`$HOME/.aria/runtime.sock`): tasks
//! (success, failure, timeout, cancel, follow from the start and from the middle, bounded
//! output, output after a daemon restart), notifications, sessions and ExecuteTurn, and errors
//! with their `google.rpc.Status` details (containers: containers.rs).

use std::time::Duration;

use aria::notification::EventPayload;
use aria::task_output::Output;
use aria::turn_output::Event;
use paddock_proto::aria::v1 as aria;
use tonic::transport::Channel;
use tonic_types::StatusExt;

use crate::harness::*;

/// The Aria notification stream, as a client that understands paddock's extensions reads it.
pub(crate) async fn notifications(d: &Daemon) -> tonic::Streaming<aria::Notification> {
    aria::notification_service_client::NotificationServiceClient::new(aria_channel(d).await)
        .stream_notifications(aware(aria::StreamNotificationsRequest {}))
        .await
        .unwrap()
        .into_inner()
}

pub(crate) async fn aria_channel(d: &Daemon) -> Channel {
    let path = d.dirs.home.join(".aria").join("runtime.sock");
    within(async {
        loop {
            if let Ok(ch) = paddock::transport::channel(&path).await {
                return ch;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

async fn tasks(d: &Daemon) -> aria::task_service_client::TaskServiceClient<Channel> {
    aria::task_service_client::TaskServiceClient::new(aria_channel(d).await)
}

async fn launch(
    c: &mut aria::task_service_client::TaskServiceClient<Channel>,
    command: &[&str],
    timeout_seconds: i32,
) -> String {
    c.launch_task(aria::LaunchTaskRequest {
        command_json: serde_json::to_string(command).unwrap(),
        timeout_seconds,
        r#type: "command".into(),
        ..Default::default()
    })
    .await
    .expect("launch")
    .into_inner()
    .task_id
}

async fn wait_task(
    c: &mut aria::task_service_client::TaskServiceClient<Channel>,
    id: &str,
) -> aria::Task {
    within(async {
        loop {
            let t = c
                .get_task(aria::GetTaskRequest { task_id: id.into() })
                .await
                .unwrap()
                .into_inner();
            if !matches!(
                aria::TaskStatus::try_from(t.status),
                Ok(aria::TaskStatus::Pending | aria::TaskStatus::Running)
            ) {
                return t;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

fn lines(out: &[aria::TaskOutput]) -> Vec<String> {
    out.iter()
        .map(|o| match &o.output {
            Some(Output::StdoutLine(l)) => format!("out:{l}"),
            Some(Output::StderrLine(l)) => format!("err:{l}"),
            Some(Output::Progress(p)) => {
                format!(
                    "progress:{}:{}",
                    p.percent_complete, p.operation_description
                )
            }
            None => "none".into(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_runs_streams_and_reports_progress() {
    let d = Daemon::start().await;
    let mut c = tasks(&d).await;
    let id = launch(
        &mut c,
        &[
            "sh",
            "-c",
            "echo one; echo '::progress 50 half way'; echo oops >&2; echo two",
        ],
        0,
    )
    .await;
    let t = wait_task(&mut c, &id).await;
    assert_eq!(t.status, aria::TaskStatus::Completed as i32);
    assert_eq!(t.exit_code, Some(0));
    assert_eq!(t.progress_percent, 50.0);
    assert_eq!(t.current_operation, "half way");
    assert_eq!(
        t.command_json,
        r#"["sh","-c","echo one; echo '::progress 50 half way'; echo oops >&2; echo two"]"#
    );
    assert!(t.started_at.is_some() && t.completed_at.is_some());
    let out = collect_ok(
        c.stream_task_output(aria::StreamTaskOutputRequest {
            task_id: id.clone(),
            follow: false,
        })
        .await
        .unwrap()
        .into_inner(),
    )
    .await;
    let got = lines(&out);
    // stdout keeps its order; stderr is a separate pipe and may interleave.
    let stdout: Vec<&String> = got.iter().filter(|l| !l.starts_with("err:")).collect();
    assert_eq!(stdout, ["out:one", "progress:50:half way", "out:two"]);
    assert!(got.contains(&"err:oops".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_timeout_and_cancel() {
    let d = Daemon::start().await;
    let mut c = tasks(&d).await;
    let failed = launch(&mut c, &["sh", "-c", "exit 3"], 0).await;
    let t = wait_task(&mut c, &failed).await;
    assert_eq!(t.status, aria::TaskStatus::Failed as i32);
    assert_eq!(t.exit_code, Some(3));
    assert_eq!(t.error_message.as_deref(), Some("exited with code 3"));

    let missing = launch(&mut c, &["/definitely/not/a/program"], 0).await;
    let t = wait_task(&mut c, &missing).await;
    assert_eq!(t.status, aria::TaskStatus::Failed as i32);
    assert!(t.error_message.unwrap().contains("could not start"));

    let slow = launch(&mut c, &["sleep", "30"], 1).await;
    let t = wait_task(&mut c, &slow).await;
    assert_eq!(t.status, aria::TaskStatus::Timeout as i32);

    let cancelled = launch(&mut c, &["sleep", "30"], 0).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = c
        .cancel_task(aria::CancelTaskRequest {
            task_id: cancelled.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.cancellation_initiated);
    let t = wait_task(&mut c, &cancelled).await;
    assert_eq!(t.status, aria::TaskStatus::Cancelled as i32);
    // Cancelling a finished task initiates nothing.
    let r = c
        .cancel_task(aria::CancelTaskRequest { task_id: cancelled })
        .await
        .unwrap()
        .into_inner();
    assert!(!r.cancellation_initiated);
}

/// Ended tasks leave the daemon's memory (start-up loads only those that had not ended) and
/// are read from the store: listed newest first, got by id, and a cancel of one is answered as
/// for an ended task, before and after a restart.
/// A task whose command could not start holds nothing the daemon waits for: a graceful
/// shutdown after it ends the daemon, with the runner and without (a failed start once left
/// the runner's handle behind, and the shutdown waited for it for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_could_not_start_never_holds_up_a_shutdown() {
    for args in [&[][..], &["--no-runner"][..]] {
        let mut d = Daemon::start_with(Dirs::new(), args).await;
        let mut c = tasks(&d).await;
        let missing = launch(&mut c, &["/definitely/not/a/program"], 0).await;
        let t = wait_task(&mut c, &missing).await;
        assert_eq!(t.status, aria::TaskStatus::Failed as i32, "{args:?}");
        // Said once, with the system's reason (the runner's status said "could not start" too).
        let why = t.error_message.unwrap_or_default();
        assert!(
            why.starts_with("could not start: /definitely/not/a/program: ")
                && why.matches("could not start").count() == 1,
            "{args:?}: {why}"
        );
        let st = d.shut_down(Duration::from_secs(15)).await;
        assert!(st.success(), "{args:?}: {st}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_tasks_are_read_from_the_store() {
    let mut d = Daemon::start().await;
    let mut c = tasks(&d).await;
    let mut ids = Vec::new();
    for code in 0..3 {
        let id = launch(&mut c, &["sh", "-c", &format!("exit {code}")], 0).await;
        wait_task(&mut c, &id).await;
        ids.push(id);
    }
    for restarted in [false, true] {
        if restarted {
            d.kill9();
            d.launch().await;
            c = tasks(&d).await;
        }
        let listed = c
            .list_tasks(aria::ListTasksRequest {
                session_id: String::new(),
                limit: 2,
            })
            .await
            .unwrap()
            .into_inner();
        let newest: Vec<&str> = listed.tasks.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(newest, [&ids[2], &ids[1]], "restarted: {restarted}");
        assert!(listed.truncated);
        let t = c
            .get_task(aria::GetTaskRequest {
                task_id: ids[1].clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(t.exit_code, Some(1), "restarted: {restarted}");
        let r = c
            .cancel_task(aria::CancelTaskRequest {
                task_id: ids[0].clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(!r.cancellation_initiated, "restarted: {restarted}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_from_the_start_and_from_the_middle() {
    let d = Daemon::start().await;
    let mut c = tasks(&d).await;
    let script = "for i in 1 2 3 4 5 6; do echo line$i; sleep 0.2; done";
    let id = launch(&mut c, &["sh", "-c", script], 0).await;
    let from_start = c
        .stream_task_output(aria::StreamTaskOutputRequest {
            task_id: id.clone(),
            follow: true,
        })
        .await
        .unwrap()
        .into_inner();
    // Join in the middle: after some output is stored.
    tokio::time::sleep(Duration::from_millis(650)).await;
    let from_middle = c
        .stream_task_output(aria::StreamTaskOutputRequest {
            task_id: id.clone(),
            follow: true,
        })
        .await
        .unwrap()
        .into_inner();
    let want: Vec<String> = (1..=6).map(|i| format!("out:line{i}")).collect();
    assert_eq!(lines(&collect_ok(from_start).await), want);
    assert_eq!(lines(&collect_ok(from_middle).await), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_is_bounded_and_survives_a_daemon_restart() {
    // 256 KiB kept per task (the default is 4 MiB); the task writes 384 KiB.
    let mut d = Daemon::start_with(Dirs::new(), &["--task-output-max-bytes", "262144"]).await;
    let mut c = tasks(&d).await;
    let id = launch(
        &mut c,
        &["sh", "-c", "yes 0123456789abcdef | head -c 393216"],
        0,
    )
    .await;
    let t = wait_task(&mut c, &id).await;
    assert_eq!(t.status, aria::TaskStatus::Completed as i32);
    // A task still running when the daemon dies (it says its pid, then becomes `sleep`).
    let pid_file = d.dirs.base.join("task.pid");
    let script = format!("echo $$ > {}; exec sleep 30", pid_file.display());
    let running = launch(&mut c, &["sh", "-c", &script], 0).await;
    let pid: u32 = within(async {
        loop {
            if let Some(pid) = std::fs::read_to_string(&pid_file)
                .ok()
                .and_then(|s| s.trim().parse().ok())
            {
                return pid;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;

    // The task's process ends with the daemon (the runner stops it when the daemon's
    // connection closes), before any daemon starts again.
    d.kill9();
    wait_pid_gone(pid, WAIT, "the task's process, after the daemon").await;
    d.launch().await;
    let mut c = tasks(&d).await;
    let out = collect_ok(
        c.stream_task_output(aria::StreamTaskOutputRequest {
            task_id: id.clone(),
            follow: true,
        })
        .await
        .unwrap()
        .into_inner(),
    )
    .await;
    let got = lines(&out);
    let kept: usize = got
        .iter()
        .filter(|l| l.starts_with("out:"))
        .map(|l| l.len() - 4 + 1)
        .sum();
    assert!(kept <= 256 * 1024, "kept {kept} bytes");
    assert!(kept > 256 * 1024 - 64, "kept only {kept} bytes");
    assert!(
        got.last().unwrap().contains("output truncated"),
        "last line: {:?}",
        got.last()
    );
    // The task that was running when the daemon died is FAILED, and says its process ended
    // with the daemon. (A task run that survived would be killed at start-up:
    // runner_mode::runs_no_record_names_are_killed_at_start_up.)
    let t = wait_task(&mut c, &running).await;
    assert_eq!(t.status, aria::TaskStatus::Failed as i32);
    let why = t.error_message.unwrap();
    assert!(why.contains("daemon restarted"), "{why}");
    assert!(why.contains("its process ended with the daemon"), "{why}");

    // Started again with a smaller limit, the daemon takes the task back as it is (its 256 KiB
    // are more than 1 KiB) when a client names it, and goes on.
    d.kill9();
    d.extra_args = vec!["--task-output-max-bytes".into(), "1024".into()];
    d.launch().await;
    let mut c = tasks(&d).await;
    let r = c
        .cancel_task(aria::CancelTaskRequest {
            task_id: id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!r.cancellation_initiated);
    let t = wait_task(&mut c, &id).await;
    assert_eq!(t.status, aria::TaskStatus::Completed as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_carry_task_and_session_status() {
    let mut d = Daemon::start().await;
    let mut n =
        aria::notification_service_client::NotificationServiceClient::new(aria_channel(&d).await)
            .stream_notifications(aware(aria::StreamNotificationsRequest {}))
            .await
            .unwrap()
            .into_inner();
    // A seed client's stream: the seed's payloads only.
    let mut seed =
        aria::notification_service_client::NotificationServiceClient::new(aria_channel(&d).await)
            .stream_notifications(aria::StreamNotificationsRequest {})
            .await
            .unwrap()
            .into_inner();
    let mut c = tasks(&d).await;
    let id = launch(&mut c, &["true"], 0).await;
    let got = collect_until(&mut n, |x| {
        matches!(&x.event_payload, Some(EventPayload::TaskStatus(t)) if t.new_status == aria::TaskStatus::Completed as i32)
    })
    .await;
    let statuses: Vec<i32> = got
        .iter()
        .filter_map(|x| match &x.event_payload {
            Some(EventPayload::TaskStatus(t)) if t.task_id == id => Some(t.new_status),
            _ => None,
        })
        .collect();
    assert_eq!(
        statuses,
        [
            aria::TaskStatus::Pending as i32,
            aria::TaskStatus::Running as i32,
            aria::TaskStatus::Completed as i32
        ]
    );
    assert!(got
        .iter()
        .all(|x| x.id.starts_with("ntf_") && x.timestamp.is_some()));
    let s = d.session(None).await;
    let got = collect_until(&mut n, |x| {
        matches!(&x.event_payload, Some(EventPayload::SessionStatus(s)) if s.new_status == "RUNNING")
    })
    .await;
    match &got.last().unwrap().event_payload {
        Some(EventPayload::SessionStatus(x)) => assert_eq!(x.session_id, s.id),
        other => panic!("{other:?}"),
    }
    // The seed client saw the task's three and nothing of the session.
    let last = launch(&mut c, &["true"], 0).await;
    let got = collect_until(&mut seed, |x| {
        matches!(&x.event_payload, Some(EventPayload::TaskStatus(t)) if t.task_id == last && t.new_status == aria::TaskStatus::Completed as i32)
    })
    .await;
    assert!(
        got.iter()
            .all(|x| matches!(x.event_payload, Some(EventPayload::TaskStatus(_)))),
        "{got:?}"
    );
    assert_eq!(got.len(), 6, "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aria_session_executes_turns() {
    let d = Daemon::start().await;
    let mut s = aria::session_service_client::SessionServiceClient::new(aria_channel(&d).await);
    let session = s
        .create_session(aria::CreateSessionRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(session.id.starts_with("sess_"));
    assert_eq!(session.status, "active");
    assert_eq!(session.context_data["provider"], "scripted");
    let out = collect_ok(
        s.execute_turn(aria::ExecuteTurnRequest {
            session_id: session.id.clone(),
            input: "hello aria".into(),
        })
        .await
        .unwrap()
        .into_inner(),
    )
    .await;
    let shape: Vec<&str> = out
        .iter()
        .map(|o| match &o.event {
            Some(Event::Message(m)) if m.role == aria::MessageRole::User as i32 => "user",
            Some(Event::Message(_)) => "assistant",
            Some(Event::ToolCall(_)) => "tool_call",
            Some(Event::ToolResult(_)) => "tool_result",
            Some(Event::FinalResponse(_)) => "final",
            None => "none",
        })
        .collect();
    assert_eq!(
        shape,
        [
            "user",
            "assistant",
            "tool_call",
            "tool_result",
            "assistant",
            "final"
        ]
    );
    match &out[2].event {
        Some(Event::ToolCall(t)) => {
            assert_eq!(t.tool_name, "LS");
            serde_json::from_str::<serde_json::Value>(&t.parameters_json).expect("JSON parameters");
        }
        other => panic!("{other:?}"),
    }
    match &out[5].event {
        Some(Event::FinalResponse(f)) => assert!(f.contains("hello aria")),
        other => panic!("{other:?}"),
    }
    let got = s
        .get_session(aria::GetSessionRequest {
            session_id: session.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.context_data["paddock_status"], "RUNNING");
    assert_eq!(got.context_data["tokens_input"], "104");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_standard_codes_with_details() {
    let d = Daemon::start().await;
    let mut c = tasks(&d).await;
    let e = c
        .launch_task(aria::LaunchTaskRequest {
            command_json: "ls -l".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    let info = e.get_details_error_info().expect("an ErrorInfo detail");
    assert_eq!(info.domain, "paddock");
    assert_eq!(info.reason, "INVALID_TASK");
    let e = c
        .get_task(aria::GetTaskRequest {
            task_id: "task_nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert_eq!(e.get_details_error_info().unwrap().reason, "TASK_NOT_FOUND");
    let e = c
        .launch_task(aria::LaunchTaskRequest {
            command_json: r#"["true"]"#.into(),
            session_id: "sess_nope".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    let mut s = aria::session_service_client::SessionServiceClient::new(aria_channel(&d).await);
    let e = s
        .execute_turn(aria::ExecuteTurnRequest {
            session_id: "sess_nope".into(),
            input: "hi".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert!(e.message().starts_with("OBEY-2010"));
    let mut k = aria::container_service_client::ContainerServiceClient::new(aria_channel(&d).await);
    let e = k
        .get_container(aria::GetContainerRequest {
            container_id: "ctr_nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    assert!(e.message().starts_with("OBEY-2060"), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_grpcio_client_uses_the_task_service() {
    let have = std::process::Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !have {
        eprintln!(
            "SKIPPED a_python_grpcio_client_uses_the_task_service: python3 with grpcio and \
             grpcio-tools is not installed (pip install grpcio grpcio-tools)"
        );
        return;
    }
    let d = Daemon::start().await;
    let _ = aria_channel(&d).await; // the Aria socket answers
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let stubs = d.dirs.base.join("stubs");
    std::fs::create_dir_all(&stubs).unwrap();
    let out = tokio::process::Command::new("python3")
        .arg(root.join("tests/e2e/grpcio_tasks.py"))
        .arg("--socket")
        .arg(d.dirs.home.join(".aria").join("runtime.sock"))
        .arg("--proto-root")
        .arg(root.join("proto"))
        .arg("--stubs")
        .arg(&stubs)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "grpcio client failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("grpcio task client: all checks passed"),
        "{stdout}"
    );
}

/// `paddock task`: launch a command bound to a session given by its name, follow its output,
/// read its record, and cancel one that runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_task_commands_launch_follow_show_and_cancel() {
    let mut d = Daemon::start().await;
    let mut req = d.request(None).await;
    req.agent_name = "builder".into();
    let s = d.create(req).await;
    let cli = |args: &[&str]| {
        let out = d.dirs.cli(false).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let id = cli(&[
        "task",
        "launch",
        "--session",
        "builder",
        "--",
        "sh",
        "-c",
        "echo hi; pwd",
    ]);
    assert!(!id.is_empty());
    let logs = cli(&["task", "logs", "--follow", &id]);
    assert!(logs.starts_with("hi\n"), "{logs}");
    assert!(
        logs.ends_with(&s.working_dir),
        "it ran in the session's directory: {logs}"
    );
    let t: serde_json::Value = serde_json::from_str(&cli(&["--json", "task", "get", &id])).unwrap();
    assert_eq!(t["status"], "COMPLETED", "{t}");
    assert_eq!(t["session_id"], s.id.as_str(), "{t}");
    let slow = cli(&["task", "launch", "--", "sleep", "600"]);
    // `task list`: newest first, with the session, state and command line.
    let list = cli(&["task", "list"]);
    let rows: Vec<Vec<&str>> = list
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["ID", "SESSION", "STATUS", "EXIT", "AGE", "COMMAND"],
        "{list}"
    );
    assert_eq!(rows[1][0], slow, "{list}");
    assert_eq!((rows[1][1], rows[1][3]), ("-", "-"), "{list}");
    assert!(["PENDING", "RUNNING"].contains(&rows[1][2]), "{list}");
    assert!(
        list.lines().nth(1).unwrap().ends_with("sleep 600"),
        "{list}"
    );
    assert_eq!(rows[2][0], id, "{list}");
    assert_eq!(&rows[2][1..4], [s.id.as_str(), "COMPLETED", "0"], "{list}");
    assert!(
        list.lines()
            .nth(2)
            .unwrap()
            .ends_with("sh -c 'echo hi; pwd'"),
        "{list}"
    );
    let mine: serde_json::Value =
        serde_json::from_str(&cli(&["--json", "task", "list", "--session", "builder"])).unwrap();
    assert_eq!(mine["tasks"].as_array().unwrap().len(), 1, "{mine}");
    assert_eq!(mine["tasks"][0]["id"], id.as_str(), "{mine}");

    // A unique part of an id names the task (its end, as a narrow table shows it).
    assert_eq!(
        cli(&["task", "cancel", &slow[slow.len() - 8..]]),
        "cancelling"
    );
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let t: serde_json::Value = serde_json::from_str(&cli(&[
            "--json",
            "task",
            "get",
            &slow["task_".len()..][..12],
        ]))
        .unwrap();
        if t["status"] == "CANCELLED" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{t}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A part both ids share is refused, naming the problem.
    let out = d
        .dirs
        .cli(false)
        .args(["task", "get", "task_"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("matches 2 tasks"),
        "{out:?}"
    );
}
