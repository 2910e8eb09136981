//! The "existing" RPCs (ReportCampaignEvent, ReportFestivalEvent, StreamAgentActivity, Ping,
//! GetState, Execute) and the campaign registry (AddCampaign, ListCampaigns, RemoveCampaign).

use paddock_proto::obey::local::v1 as pb;
use pb::execute_response::Output;
use tonic::Code;

use crate::harness::*;

/// Rows of `table` in the daemon's database (read-only, next to the running daemon).
fn count_rows(d: &Daemon, table: &str, filter: &str) -> i64 {
    let db = d.dirs.data.join("paddock.db");
    let conn =
        rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .expect("open the daemon's database");
    conn.query_row(
        &format!("SELECT COUNT(*) FROM {table} WHERE {filter}"),
        [],
        |r| r.get(0),
    )
    .expect("count rows")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ping_and_get_state() {
    let mut d = Daemon::start().await;
    let mut c = d.client().await;
    let p = c.ping(pb::PingRequest {}).await.unwrap().into_inner();
    assert!(!p.version.is_empty());
    assert!(p.uptime.is_some());

    let st = c.get_state(pb::StateRequest {}).await.unwrap().into_inner();
    assert_eq!(st.version, p.version);
    assert_eq!(st.socket_path, d.dirs.socket.display().to_string());
    assert_eq!(st.data_dir, d.dirs.data.display().to_string());
    assert!(st.started_at.is_some());
    assert_eq!((st.campaign_count, st.session_count), (0, 0));
    assert!(st.active_sessions.is_empty());

    let campaign = d.campaign().await;
    let mut req = d.request(None).await;
    req.agent_name = "summarised".into();
    let s = d.create(req).await;
    let st = c.get_state(pb::StateRequest {}).await.unwrap().into_inner();
    assert_eq!((st.campaign_count, st.session_count), (1, 1));
    assert_eq!(
        st.active_sessions,
        vec![pb::SessionSummary {
            id: s.id.clone(),
            campaign_id: campaign,
            provider: pb::SessionProvider::Scripted as i32,
            agent_name: "summarised".into(),
            status: pb::SessionStatus::Running as i32,
        }]
    );
    d.stop(&s.id, true).await.unwrap();
    let st = c.get_state(pb::StateRequest {}).await.unwrap().into_inner();
    assert_eq!(st.session_count, 1);
    assert!(st.active_sessions.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaign_and_festival_events_are_accepted_and_stored() {
    let mut d = Daemon::start().await;
    let campaign = d.campaign().await;
    let mut c = d.client().await;
    let r = c
        .report_campaign_event(pb::CampaignEventRequest {
            campaign_id: CAMPAIGN.into(),
            event_type: "campaign.opened".into(),
            payload_json: r#"{"by":"e2e"}"#.into(),
            timestamp: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.accepted);
    assert!(!r.event_id.is_empty());
    let r2 = c
        .report_festival_event(pb::FestivalEventRequest {
            festival_id: "fest-1".into(),
            campaign_id: campaign.clone(),
            event_type: "festival.phase".into(),
            payload_json: "{}".into(),
            timestamp: Some(prost_types::Timestamp {
                seconds: 1_771_425_000,
                nanos: 0,
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r2.accepted);
    assert_ne!(r2.event_id, r.event_id);
    // A festival event needs no campaign.
    c.report_festival_event(pb::FestivalEventRequest {
        festival_id: "fest-2".into(),
        event_type: "festival.created".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(count_rows(&d, "reported_events", "1=1"), 3);
    assert_eq!(
        count_rows(
            &d,
            "reported_events",
            &format!("kind = 'campaign' AND campaign_id = '{campaign}'")
        ),
        1
    );

    let e = c
        .report_campaign_event(pb::CampaignEventRequest {
            campaign_id: "nope".into(),
            event_type: "x".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_status(&e, Code::NotFound, "OBEY-2001: ");
    let e = c
        .report_festival_event(pb::FestivalEventRequest {
            festival_id: "f".into(),
            campaign_id: "nope".into(),
            event_type: "x".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_status(&e, Code::NotFound, "OBEY-2001: ");
    let e = c
        .report_campaign_event(pb::CampaignEventRequest {
            campaign_id: CAMPAIGN.into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_agent_activity_acknowledges_every_event() {
    let mut d = Daemon::start().await;
    let campaign = d.campaign().await;
    let mut c = d.client().await;
    let events: Vec<pb::AgentActivityEvent> = (0..300)
        .map(|i| pb::AgentActivityEvent {
            session_id: "ext-agent-1".into(),
            campaign_id: campaign.clone(),
            agent_name: "external".into(),
            r#type: if i % 2 == 0 {
                pb::ActivityType::Thinking as i32
            } else {
                pb::ActivityType::ToolCall as i32
            },
            content: format!("event {i}"),
            tokens_input: 1,
            ..Default::default()
        })
        .collect();
    let ack = within(c.stream_agent_activity(tokio_stream::iter(events)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ack.received, 300);
    assert_eq!(
        count_rows(&d, "external_activities", "session_id = 'ext-agent-1'"),
        300
    );
    // An empty stream is fine too.
    let ack = c
        .stream_agent_activity(tokio_stream::iter(Vec::<pb::AgentActivityEvent>::new()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ack.received, 0);
}

/// Reports for a session the daemon has are that session's activity: numbered after its own,
/// stored in its activity table (ListActivities), shown to its watchers (WatchActivity), their
/// tokens counted; they end no turn. Reports for other ids stay apart (above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_activity_of_a_known_session_is_that_sessions_activity() {
    let mut d = Daemon::start().await;
    let s = d.session(None).await;
    let own = d.send(&s.id, "hello").await;
    let last_own = own.last().unwrap().seq;
    let mut c = d.client().await;
    let mut watch = c
        .watch_activity(pb::WatchActivityRequest {
            session_id: s.id.clone(),
            after_seq: last_own,
        })
        .await
        .unwrap()
        .into_inner();
    let report = |kind: pb::ActivityType, content: &str| pb::AgentActivityEvent {
        session_id: s.id.clone(),
        agent_name: "sidecar".into(),
        r#type: kind as i32,
        content: content.into(),
        tool_name: "lint".into(),
        tokens_input: 7,
        tokens_output: 3,
        ..Default::default()
    };
    let before = d.get(&s.id).await;
    let ack = within(c.stream_agent_activity(tokio_stream::iter(vec![
        report(pb::ActivityType::ToolCall, "cargo clippy"),
        report(pb::ActivityType::Completion, "clippy is clean"),
    ])))
    .await
    .unwrap()
    .into_inner();
    assert_eq!(ack.received, 2);
    // Shown to the session's watchers, numbered right after its own activity.
    let mut seen = Vec::new();
    for _ in 0..2 {
        seen.push(next(&mut watch).await.expect("an event").unwrap());
    }
    assert_eq!(
        seen.iter()
            .map(|a| (a.seq, a.content.as_str(), a.tool_name.as_str()))
            .collect::<Vec<_>>(),
        [
            (last_own + 1, "cargo clippy", "lint"),
            (last_own + 2, "clippy is clean", "lint")
        ]
    );
    // Stored with it, its tokens shown but not counted (the budget is the agent's own usage);
    // no turn was opened or ended, and none kept apart.
    let listed = c
        .list_activities(pb::ListActivitiesRequest {
            session_id: s.id.clone(),
            after_seq: last_own,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .activities;
    assert_eq!(listed.len(), 2, "{listed:?}");
    let after = d.get(&s.id).await;
    assert_eq!(listed[0].tokens_input, 7);
    assert_eq!(
        (after.tokens_input, after.tokens_output),
        (before.tokens_input, before.tokens_output)
    );
    assert_eq!(after.turns_completed, before.turns_completed);
    assert_eq!(status_name(after.status), "RUNNING");
    let id_filter = format!("session_id = '{}'", s.id);
    assert_eq!(count_rows(&d, "external_activities", &id_filter), 0);
    // The session's conversation goes on as before.
    let more = d.send(&s.id, "again").await;
    assert_eq!(more.first().unwrap().seq, last_own + 3);

    // Mid-turn, a reported COMPLETION shows on the turn's stream but does not end it: the
    // agent's own does.
    let slow = d.session(Some(("slow", slow_turn(800)))).await;
    let mut turn = d.start_turn(&slow.id, "take your time").await;
    let first = next(&mut turn).await.unwrap().unwrap();
    let mut r = report(pb::ActivityType::Completion, "a sidecar says: done");
    r.session_id = slow.id.clone();
    within(c.stream_agent_activity(tokio_stream::iter(vec![r])))
        .await
        .unwrap();
    let mut rest = vec![first];
    rest.extend(collect_ok(turn).await);
    let contents: Vec<&str> = rest.iter().map(|a| a.content.as_str()).collect();
    assert!(contents.contains(&"a sidecar says: done"), "{contents:?}");
    let last = rest.last().unwrap();
    assert_eq!(kind(last), "COMPLETION");
    assert_ne!(last.content, "a sidecar says: done", "{contents:?}");
    assert_eq!(d.get(&slow.id).await.turns_completed, 1);
}

async fn execute(
    d: &Daemon,
    req: pb::ExecuteRequest,
) -> (String, String, Option<i32>, Option<tonic::Status>) {
    let mut s = d.client().await.execute(req).await.unwrap().into_inner();
    let (mut out, mut err, mut code) = (String::new(), String::new(), None);
    while let Some(item) = next(&mut s).await {
        match item {
            Ok(r) => match r.output {
                Some(Output::Stdout(t)) => out.push_str(&t),
                Some(Output::Stderr(t)) => err.push_str(&t),
                Some(Output::ExitCode(c)) => {
                    assert!(code.is_none(), "two exit codes");
                    code = Some(c)
                }
                None => panic!("empty output"),
            },
            Err(e) => return (out, err, code, Some(e)),
        }
    }
    (out, err, code, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execute_streams_output_and_the_exit_code_in_the_campaign_root() {
    let mut d = Daemon::start().await;
    d.campaign().await;
    let (out, err, code, e) = execute(
        &d,
        pb::ExecuteRequest {
            campaign_id: CAMPAIGN.into(),
            command: "ls".into(),
            args: vec!["-1".into()],
            ..Default::default()
        },
    )
    .await;
    assert!(e.is_none());
    assert_eq!(out, "README.md\nnotes.txt\nscripts\nsrc\n");
    assert_eq!(err, "");
    assert_eq!(code, Some(0));

    let (out, err, code, _) = execute(
        &d,
        pb::ExecuteRequest {
            campaign_id: CAMPAIGN.into(),
            command: "pwd; echo \"$GREETING\"; echo oops >&2; exit".into(),
            args: vec!["3".into()],
            use_shell: true,
            environment: [("GREETING".to_string(), "hi there".to_string())].into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(out, format!("{}\nhi there\n", d.dirs.root.display()));
    assert_eq!(err, "oops\n");
    assert_eq!(code, Some(3));

    // A command over its time limit is killed: the stream ends with DEADLINE_EXCEEDED.
    let (_, _, code, e) = execute(
        &d,
        pb::ExecuteRequest {
            campaign_id: CAMPAIGN.into(),
            command: "sleep".into(),
            args: vec!["30".into()],
            timeout_seconds: 1,
            ..Default::default()
        },
    )
    .await;
    assert_eq!(code, None);
    assert_eq!(e.expect("deadline").code(), Code::DeadlineExceeded);

    let mut c = d.client().await;
    let e = c
        .execute(pb::ExecuteRequest {
            campaign_id: "nope".into(),
            command: "ls".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_status(&e, Code::NotFound, "OBEY-2001: ");
    let e = c
        .execute(pb::ExecuteRequest {
            campaign_id: CAMPAIGN.into(),
            command: "paddock-e2e-no-such-command".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaigns_are_added_listed_and_removed() {
    let mut d = Daemon::start().await;
    let mut c = d.client().await;
    let camp = c
        .add_campaign(pb::AddCampaignRequest {
            name: CAMPAIGN.into(),
            // A non-canonical path is stored canonical.
            root_path: format!("{}/src/..", d.dirs.root.display()),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(camp.id.starts_with("camp_"));
    assert_eq!(camp.name, CAMPAIGN);
    assert_eq!(camp.root_path, d.dirs.root.display().to_string());
    assert!(camp.created_at.is_some());

    // Duplicate names, missing roots, files as roots.
    let e = c
        .add_campaign(pb::AddCampaignRequest {
            name: CAMPAIGN.into(),
            root_path: d.dirs.root.display().to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);
    for root in [d.dirs.base.join("nowhere"), d.dirs.root.join("README.md")] {
        let e = c
            .add_campaign(pb::AddCampaignRequest {
                name: "x".into(),
                root_path: root.display().to_string(),
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{root:?}: {e:?}");
    }

    let other = c
        .add_campaign(pb::AddCampaignRequest {
            name: "second".into(),
            root_path: d.dirs.home.display().to_string(),
        })
        .await
        .unwrap()
        .into_inner();
    let list = c
        .list_campaigns(pb::ListCampaignsRequest {})
        .await
        .unwrap()
        .into_inner()
        .campaigns;
    let mut names: Vec<_> = list
        .iter()
        .map(|c| (c.name.clone(), c.id.clone()))
        .collect();
    names.sort();
    assert_eq!(
        names,
        vec![
            (CAMPAIGN.to_string(), camp.id.clone()),
            ("second".to_string(), other.id.clone())
        ]
    );

    // A campaign with a live session cannot go; once it is stopped, it can.
    let s = d
        .create(pb::CreateSessionRequest {
            campaign_id: camp.id.clone(),
            provider: pb::SessionProvider::Scripted as i32,
            ..Default::default()
        })
        .await;
    let e = c
        .remove_campaign(pb::RemoveCampaignRequest {
            campaign: CAMPAIGN.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    d.stop(&s.id, false).await.unwrap();
    let r = c
        .remove_campaign(pb::RemoveCampaignRequest {
            campaign: CAMPAIGN.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.removed);
    // By id, too.
    assert!(
        c.remove_campaign(pb::RemoveCampaignRequest {
            campaign: other.id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .removed
    );
    assert!(c
        .list_campaigns(pb::ListCampaignsRequest {})
        .await
        .unwrap()
        .into_inner()
        .campaigns
        .is_empty());
    let e = c
        .remove_campaign(pb::RemoveCampaignRequest {
            campaign: CAMPAIGN.into(),
        })
        .await
        .unwrap_err();
    assert_status(&e, Code::NotFound, "OBEY-2001: ");
    // The stopped session of the removed campaign is still there to read.
    assert_eq!(status_name(d.get(&s.id).await.status), "STOPPED");
}

/// Review D8: Execute runs as a task, so its output is bounded like a task's: a 100 MB line
/// reaches the client cut to 64 KiB pieces, the stored output stops at the task's bound, and
/// the daemon's peak memory stays far below the output's size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execute_output_is_bounded_and_a_client_that_leaves_cancels_it() {
    let mut d = Daemon::start().await;
    d.campaign().await;
    let (out, _, code, e) = execute(
        &d,
        pb::ExecuteRequest {
            campaign_id: CAMPAIGN.into(),
            command: "head -c 100000000 /dev/zero | tr '\\0' x".into(),
            use_shell: true,
            ..Default::default()
        },
    )
    .await;
    assert!(e.is_none(), "{e:?}");
    assert_eq!(code, Some(0));
    assert!(
        out.len() < 5 * 1024 * 1024,
        "the stored bound (4 MiB), not 100 MB: {} bytes",
        out.len()
    );
    assert!(out.lines().all(|l| l.len() <= 64 * 1024 + 64));
    let pid = d.pid();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let peak_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    assert!(
        peak_kb < 64 * 1024,
        "the daemon's peak RSS is {peak_kb} kB for a 100 MB line"
    );

    // A client that goes away cancels its command (TERM to its process group).
    let mut s = d.execute_shell("echo $$; exec sleep 300").await;
    let first = next(&mut s).await.unwrap().unwrap();
    let Some(Output::Stdout(pid)) = first.output else {
        panic!("the shell's pid first: {first:?}")
    };
    drop(s);
    wait_pid_gone(
        pid.trim().parse().unwrap(),
        std::time::Duration::from_secs(15),
        "the command, after its client left",
    )
    .await;
}

/// The services a socket answers for, by server reflection v1 or v1alpha (grpcurl speaks v1,
/// grpcio-reflection and older tools v1alpha).
pub(crate) async fn reflected_services(ch: tonic::transport::Channel, alpha: bool) -> Vec<String> {
    macro_rules! list {
        ($pb:path) => {{
            use $pb as r;
            let req = r::ServerReflectionRequest {
                host: String::new(),
                message_request: Some(r::server_reflection_request::MessageRequest::ListServices(
                    String::new(),
                )),
            };
            let mut replies = r::server_reflection_client::ServerReflectionClient::new(ch)
                .server_reflection_info(tokio_stream::iter([req]))
                .await
                .expect("reflection answers")
                .into_inner();
            match replies.message().await.unwrap().unwrap().message_response {
                Some(r::server_reflection_response::MessageResponse::ListServicesResponse(l)) => {
                    let mut names: Vec<String> = l.service.into_iter().map(|s| s.name).collect();
                    names.sort();
                    names
                }
                other => panic!("not a service list: {other:?}"),
            }
        }};
    }
    if alpha {
        list!(tonic_reflection::pb::v1alpha)
    } else {
        list!(tonic_reflection::pb::v1)
    }
}

/// Every socket lists, by reflection v1 and v1alpha, exactly the services it serves, and
/// answers the standard health check for each (SERVING), NOT_FOUND for any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_socket_reflects_and_reports_health_for_exactly_its_services() {
    use tonic_health::pb::{
        health_check_response::ServingStatus, health_client::HealthClient, HealthCheckRequest,
    };
    let d = Daemon::start().await;
    let main = paddock::transport::channel(&d.dirs.socket).await.unwrap();
    let aria = crate::aria::aria_channel(&d).await;
    let common = [
        "aria.v1.ContainerService",
        "aria.v1.NotificationService",
        "aria.v1.SessionService",
        "aria.v1.TaskService",
        "grpc.health.v1.Health",
        "obey.local.v1.LocalDaemonService",
    ];
    let mut want_main: Vec<&str> = common
        .iter()
        .copied()
        .chain([
            "grpc.reflection.v1.ServerReflection",
            "sunbeam.code.v1.CodeAgent",
        ])
        .collect();
    want_main.sort();
    assert_eq!(reflected_services(main.clone(), false).await, want_main);
    let mut want_alpha: Vec<&str> = common
        .iter()
        .copied()
        .chain([
            "grpc.reflection.v1alpha.ServerReflection",
            "sunbeam.code.v1.CodeAgent",
        ])
        .collect();
    want_alpha.sort();
    assert_eq!(reflected_services(main.clone(), true).await, want_alpha);
    // The Aria socket serves no sunbeam.
    let aria_list = reflected_services(aria.clone(), false).await;
    assert!(
        !aria_list.iter().any(|s| s.starts_with("sunbeam")),
        "{aria_list:?}"
    );
    assert!(
        aria_list.iter().any(|s| s == "aria.v1.TaskService"),
        "{aria_list:?}"
    );

    let mut health = HealthClient::new(main);
    for service in [
        "",
        "obey.local.v1.LocalDaemonService",
        "sunbeam.code.v1.CodeAgent",
    ] {
        let r = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.status, ServingStatus::Serving as i32, "{service:?}");
    }
    let e = health
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound);
    let r = HealthClient::new(aria)
        .check(HealthCheckRequest {
            service: "aria.v1.TaskService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.status, ServingStatus::Serving as i32);

    // The runner's socket: the runner contract only.
    let runner = paddock::transport::channel(&d.dirs.data.join("runner.sock"))
        .await
        .unwrap();
    assert_eq!(
        reflected_services(runner.clone(), false).await,
        [
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "runner.v1.Runner"
        ]
    );
    let r = HealthClient::new(runner)
        .check(HealthCheckRequest {
            service: "runner.v1.Runner".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.status, ServingStatus::Serving as i32);
}

/// Python's grpcio-reflection (server reflection v1alpha, a client nobody on the team wrote)
/// lists the daemon's services and resolves a method's types by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_grpcio_reflection_lists_and_describes_the_services() {
    let have = std::process::Command::new("python3")
        .args(["-c", "import grpc, grpc_reflection"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !have {
        assert!(
            std::env::var_os("PADDOCK_REQUIRE_GRPCIO").is_none(),
            "PADDOCK_REQUIRE_GRPCIO is set but grpcio-reflection is missing"
        );
        eprintln!(
            "SKIPPED python_grpcio_reflection_lists_and_describes_the_services: python3 with \
             grpcio and grpcio-reflection is not installed (pip install grpcio grpcio-reflection)"
        );
        return;
    }
    let d = Daemon::start().await;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = tokio::process::Command::new("python3")
        .arg(root.join("tests/e2e/grpcio_reflection.py"))
        .arg("--socket")
        .arg(&d.dirs.socket)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("grpcio reflection client: all checks passed"),
        "{stdout}"
    );
}
