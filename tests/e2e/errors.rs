//! Every OBEY-NNNN code the API can produce, with its gRPC code and message prefix. (2013,
//! 2014, 2021, 2031 are also covered by the scenario tests in `sessions`, 2032 in
//! `lifecycle`.)

use std::collections::BTreeMap;

use paddock_proto::obey::local::v1 as pb;
use pb::{SessionProvider as P, SessionStatus as S};
use serde_json::json;
use tonic::Code;

use crate::harness::*;

async fn create_err(d: &Daemon, req: pb::CreateSessionRequest) -> tonic::Status {
    within(d.client().await.create_session(req))
        .await
        .expect_err("create should be refused")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_session_refusals_2001_2002_2003_2004_2005() {
    let mut d = Daemon::start().await;
    let base = d.request(None).await;

    // 2001: unknown campaign (neither an id nor a name).
    let mut r = base.clone();
    r.campaign_id = "camp_nope".into();
    let e = create_err(&d, r).await;
    assert_status(&e, Code::NotFound, "OBEY-2001: ");
    assert!(e.message().contains("camp_nope"), "{}", e.message());

    // 2002: numbers that are no provider at all.
    for p in [P::Unspecified as i32, 99] {
        let mut r = base.clone();
        r.provider = p;
        let e = create_err(&d, r).await;
        assert_status(&e, Code::InvalidArgument, "OBEY-2002: ");
    }
    // 2004: CLI agents whose binary is not installed here, named in the message; an ACP agent
    // without a command line. 2003: the openai-api loop without a model.
    for (p, named) in [
        (P::Codex, "\"codex\""),
        (P::Gemini, "\"gemini\""),
        (P::Openclaw, "\"openclaw\""),
        (P::Acp, "provider_config.command"),
    ] {
        let mut r = base.clone();
        r.provider = p as i32;
        r.environment = BTreeMap::from([("PATH".to_string(), "/nonexistent".to_string())]);
        let e = create_err(&d, r).await;
        assert_status(&e, Code::FailedPrecondition, "OBEY-2004: ");
        assert!(e.message().contains(named), "{p:?}: {}", e.message());
    }
    let mut r = base.clone();
    r.provider = P::OpenaiApi as i32;
    let e = create_err(&d, r).await;
    assert_status(&e, Code::InvalidArgument, "OBEY-2003: ");

    // 2003: a model the scripted agent does not have.
    let mut r = base.clone();
    r.model = "gpt-9".into();
    let e = create_err(&d, r).await;
    assert_status(&e, Code::InvalidArgument, "OBEY-2003: ");
    assert!(e.message().contains("gpt-9"));
    // A CLI agent asked for another vendor's model, on its vendor's own endpoint.
    let mut r = base.clone();
    r.provider = P::ClaudeCode as i32;
    r.model = "gpt-5.5".into();
    let e = create_err(&d, r).await;
    assert_status(&e, Code::InvalidArgument, "OBEY-2003: ");
    assert!(
        e.message()
            .contains("claude-code does not serve model \"gpt-5.5\""),
        "{}",
        e.message()
    );
    // ... while its one model is accepted.
    let mut r = base.clone();
    r.model = "scripted".into();
    assert_eq!(d.create(r).await.model, "scripted");

    // 2004: a claude-code CLI that is not installed (named in the message), a script that
    // does not exist or does not parse, a bad permission policy.
    let mut r = base.clone();
    r.provider = P::ClaudeCode as i32;
    r.provider_config = BTreeMap::from([(
        "command".to_string(),
        "paddock-e2e-no-such-claude".to_string(),
    )]);
    let e = create_err(&d, r).await;
    assert_status(&e, Code::FailedPrecondition, "OBEY-2004: ");
    assert!(
        e.message().contains("paddock-e2e-no-such-claude"),
        "{}",
        e.message()
    );
    let mut r = base.clone();
    r.provider_config =
        BTreeMap::from([("script".to_string(), "scripts/missing.json".to_string())]);
    let e = create_err(&d, r).await;
    assert_status(&e, Code::FailedPrecondition, "OBEY-2004: ");
    assert!(e.message().contains("missing.json"), "{}", e.message());
    let bad = d
        .dirs
        .script("bad", &json!({"turns": [{"steps": [{"explode": 1}]}]}));
    let mut r = base.clone();
    r.provider_config = BTreeMap::from([("script".to_string(), bad)]);
    let e = create_err(&d, r).await;
    assert_status(&e, Code::FailedPrecondition, "OBEY-2004: ");
    assert!(e.message().contains("explode"), "{}", e.message());
    let mut r = base.clone();
    r.provider_config = BTreeMap::from([("permissions".to_string(), "maybe".to_string())]);
    assert_status(
        &create_err(&d, r).await,
        Code::FailedPrecondition,
        "OBEY-2004: ",
    );
    // ... and client tools that are no list of tools, for any agent (here the scripted one).
    for bad in [
        r#"{"name":"a"}"#,
        r#"[{"name":"a b"}]"#,
        r#"[{"name":"shell"}]"#,
    ] {
        let mut r = base.clone();
        r.provider_config = BTreeMap::from([("client_tools".to_string(), bad.to_string())]);
        let e = create_err(&d, r).await;
        assert_status(&e, Code::FailedPrecondition, "OBEY-2004: ");
        assert!(
            e.message().contains("provider_config.client_tools"),
            "{bad}: {}",
            e.message()
        );
    }

    // 2005: the campaign's root is gone.
    let gone = d.dirs.base.join("gone");
    std::fs::create_dir_all(&gone).unwrap();
    let mut c = d.client().await;
    c.add_campaign(pb::AddCampaignRequest {
        name: "gone".into(),
        root_path: gone.display().to_string(),
    })
    .await
    .unwrap();
    std::fs::remove_dir(&gone).unwrap();
    let mut r = base.clone();
    r.campaign_id = "gone".into();
    let e = create_err(&d, r).await;
    assert_status(&e, Code::Internal, "OBEY-2005: ");
    assert!(e.message().contains("gone"), "{}", e.message());

    // Refusals leave nothing behind.
    let all = c
        .list_sessions(pb::ListSessionsRequest {
            include_terminated: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .sessions;
    assert_eq!(all.len(), 1, "{all:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_invalid_argument() {
    let mut d = Daemon::start().await;
    let base = d.request(None).await;
    let mut r = base.clone();
    r.campaign_id = " ".into();
    assert_eq!(create_err(&d, r).await.code(), Code::InvalidArgument);
    let mut r = base.clone();
    r.max_tokens = -1;
    assert_eq!(create_err(&d, r).await.code(), Code::InvalidArgument);
    let mut r = base.clone();
    r.timeout = Some(prost_types::Duration {
        seconds: -1,
        nanos: 0,
    });
    assert_eq!(create_err(&d, r).await.code(), Code::InvalidArgument);

    let s = d.session(None).await;
    let mut c = d.client().await;
    let e = c
        .send_message(pb::SendMessageRequest {
            session_id: s.id.clone(),
            message: "  ".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = c
        .get_session(pb::GetSessionRequest {
            session_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = c
        .list_sessions(pb::ListSessionsRequest {
            statuses: vec![42],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
}

/// Review D7/D12: environment variables `execve` cannot take are refused before anything is
/// stored, and a create whose agent cannot be executed at all (the file exists and is
/// executable, but its interpreter does not) is refused with OBEY-2004 and leaves no row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_creates_write_nothing() {
    let mut d = Daemon::start().await;
    let base = d.request(None).await;
    for (k, v) in [("", "x"), ("A=B", "x"), ("A\0B", "x"), ("OK", "x\0y")] {
        let mut r = base.clone();
        r.environment = BTreeMap::from([(k.to_string(), v.to_string())]);
        let e = create_err(&d, r).await;
        assert_eq!(e.code(), Code::InvalidArgument, "{k:?}={v:?}: {e:?}");
    }
    let agent = d.dirs.base.join("broken-agent");
    std::fs::write(&agent, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut r = base.clone();
    r.provider = P::ClaudeCode as i32;
    r.provider_config = BTreeMap::from([("command".to_string(), agent.display().to_string())]);
    let e = create_err(&d, r).await;
    assert_status(&e, Code::FailedPrecondition, "OBEY-2004: ");
    assert!(
        e.message().contains("could not start the provider"),
        "refused at the spawn, not before: {}",
        e.message()
    );
    let all = d.all_sessions().await;
    assert!(all.is_empty(), "a refused create left {all:?}");
    // And the daemon still creates sessions, and the agent that never started holds nothing a
    // shutdown waits for.
    d.session(None).await;
    let st = d.shut_down(std::time::Duration::from_secs(15)).await;
    assert!(st.success(), "{st}");
}

/// A session is RUNNING when its agent says it is ready, not when its process exists: an agent
/// CLI that dies at start (here: a bad flag, after a line on stderr) refuses CreateSession with
/// OBEY-2004 and its stderr, and leaves no session — with the runner and without. One that
/// answers the ready request runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_dies_at_start_refuses_the_create_with_2004() {
    for args in [&[][..], &["--no-runner"][..]] {
        let mut d = Daemon::start_with(Dirs::new(), args).await;
        let mut r = d.request(None).await;
        r.provider = P::ClaudeCode as i32;
        r.provider_config = BTreeMap::from([(
            "command".to_string(),
            "sh -c 'sleep 0.3; echo \"error: unknown option --bad-flag\" >&2; exit 1'".to_string(),
        )]);
        let e = create_err(&d, r.clone()).await;
        assert_status(&e, Code::FailedPrecondition, "OBEY-2004: ");
        assert!(
            e.message().contains("exited before it was ready")
                && e.message().contains("unknown option --bad-flag"),
            "{args:?}: {}",
            e.message()
        );
        let all = d.all_sessions().await;
        assert!(all.is_empty(), "{args:?}: a refused create left {all:?}");
        // The same agent, answering the ready request first, runs.
        r.provider_config.insert(
            "command".into(),
            format!("{} sh -c 'exec sleep 600'", d.dirs.ready_then()),
        );
        let s = d.create(r).await;
        assert_eq!(s.status, S::Running as i32, "{args:?}: {s:?}");
        d.stop(&s.id, false).await.expect("stop");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_sessions_are_2010_on_every_session_rpc() {
    let d = Daemon::start().await;
    let mut c = d.client().await;
    let id = "sess_01NOSUCHSESSION0000000000".to_string();
    let check = |e: tonic::Status| {
        assert_status(&e, Code::NotFound, "OBEY-2010: ");
        assert!(
            e.message().contains("sess_01NOSUCHSESSION"),
            "{}",
            e.message()
        );
    };
    check(
        c.get_session(pb::GetSessionRequest {
            session_id: id.clone(),
        })
        .await
        .unwrap_err(),
    );
    check(
        c.send_message(pb::SendMessageRequest {
            session_id: id.clone(),
            message: "hi".into(),
        })
        .await
        .unwrap_err(),
    );
    check(
        c.stop_session(pb::StopSessionRequest {
            session_id: id.clone(),
            graceful: true,
        })
        .await
        .unwrap_err(),
    );
    check(
        c.stop_session(pb::StopSessionRequest {
            session_id: id.clone(),
            graceful: false,
        })
        .await
        .unwrap_err(),
    );
    check(
        c.restart_session(pb::RestartSessionRequest {
            session_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err(),
    );
    check(
        c.watch_session(pb::WatchSessionRequest {
            session_id: id.clone(),
        })
        .await
        .unwrap_err(),
    );
    check(
        c.list_activities(pb::ListActivitiesRequest {
            session_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err(),
    );
    check(
        c.watch_activity(pb::WatchActivityRequest {
            session_id: id.clone(),
            after_seq: 0,
        })
        .await
        .unwrap_err(),
    );
    // A session's approvals too: an unknown session is not one with nothing waiting.
    check(
        c.list_approvals(pb::ListApprovalsRequest {
            session_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err(),
    );
    check(
        c.watch_approvals(pb::WatchApprovalsRequest {
            session_id: id.clone(),
        })
        .await
        .unwrap_err(),
    );
    // And the CLI says so, exit 3 (what is named does not exist).
    let o = crate::cli::cli(&d, &["approvals", "--session", "nope"]).await;
    assert_eq!(o.code, 3, "{o:?}");
    assert!(o.stderr.contains("OBEY-2010"), "{o:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_state_2011_and_already_stopped_2020() {
    let mut d = Daemon::start().await;
    let s = d.session(Some(("slow", slow_turn(1500)))).await;
    let mut c = d.client().await;
    let mut first = c
        .send_message(pb::SendMessageRequest {
            session_id: s.id.clone(),
            message: "first".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(kind(&next(&mut first).await.unwrap().unwrap()), "THINKING");
    // 2011: a message while WORKING.
    let e = c
        .send_message(pb::SendMessageRequest {
            session_id: s.id.clone(),
            message: "second".into(),
        })
        .await
        .unwrap_err();
    assert_status(&e, Code::FailedPrecondition, "OBEY-2011: ");
    assert!(e.message().contains("WORKING"), "{}", e.message());
    // The first turn is not disturbed.
    let rest = collect_ok(first).await;
    assert_eq!(rest.last().map(kind), Some("COMPLETION"));

    // 2020: stopping a stopped session; 2011: a message to it.
    d.stop(&s.id, true).await.unwrap();
    let e = d.stop(&s.id, true).await.unwrap_err();
    assert_status(&e, Code::FailedPrecondition, "OBEY-2020: ");
    let e = d.stop(&s.id, false).await.unwrap_err();
    assert_status(&e, Code::FailedPrecondition, "OBEY-2020: ");
    let e = c
        .send_message(pb::SendMessageRequest {
            session_id: s.id.clone(),
            message: "hello?".into(),
        })
        .await
        .unwrap_err();
    assert_status(&e, Code::FailedPrecondition, "OBEY-2011: ");
    assert!(e.message().contains("STOPPED"), "{}", e.message());

    // 2020 for a FAILED session too, naming why it failed (its agent crashed in a turn).
    let f = d
        .session(Some((
            "crash",
            json!({"turns": [{"steps": [{"crash": 2}]}]}),
        )))
        .await;
    d.send(&f.id, "go").await;
    d.wait_status(&f.id, S::Failed).await;
    let e = d.stop(&f.id, false).await.unwrap_err();
    assert_status(&e, Code::FailedPrecondition, "OBEY-2020: ");
    assert!(e.message().contains("OBEY-2031"), "{}", e.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_with_a_bad_provider_config_is_2004_and_changes_nothing() {
    let mut d = Daemon::start().await;
    let s = d.session(None).await;
    let e = d
        .client()
        .await
        .restart_session(pb::RestartSessionRequest {
            session_id: s.id.clone(),
            provider_config: BTreeMap::from([(
                "script".to_string(),
                "scripts/nowhere.json".to_string(),
            )]),
        })
        .await
        .unwrap_err();
    assert_status(&e, Code::FailedPrecondition, "OBEY-2004: ");
    let info = d.get(&s.id).await;
    assert_eq!(status_name(info.status), "RUNNING");
    assert_eq!(info.restart_count, 0);
    assert_eq!(info.pid, s.pid);
    assert_eq!(info.provider_config, s.provider_config, "nothing changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_session_limit_is_2004() {
    let mut d = Daemon::start_with(Dirs::new(), &["--max-sessions", "2"]).await;
    let a = d.session(None).await;
    d.session(None).await;
    let req = d.request(None).await;
    let e = create_err(&d, req.clone()).await;
    assert_status(&e, Code::FailedPrecondition, "OBEY-2004: ");
    assert!(
        e.message().contains("limit of 2 live sessions"),
        "{}",
        e.message()
    );
    // A stopped session frees its place.
    d.stop(&a.id, false).await.unwrap();
    assert_eq!(status_name(d.create(req).await.status), "RUNNING");
}

/// Review D12: an error never echoes megabytes of a request back (the client would see
/// RESOURCE_EXHAUSTED for the oversized header instead of the real answer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_id_gets_a_short_not_found() {
    let d = Daemon::start().await;
    let huge = "x".repeat(3_500_000);
    let err = d
        .client()
        .await
        .get_session(pb::GetSessionRequest { session_id: huge })
        .await
        .unwrap_err();
    assert_status(&err, tonic::Code::NotFound, "OBEY-2010: ");
    assert!(err.message().len() <= 4096, "{} bytes", err.message().len());
}

/// Review D1: a daemon that does not answer never hangs the CLI: `ping` gives up within its
/// 10 s, every other command within the call timeout (`PADDOCK_TIMEOUT_SECS`).
#[test]
fn the_cli_gives_up_on_a_daemon_that_does_not_answer() {
    let dirs = Dirs::new();
    std::fs::create_dir_all(dirs.socket.parent().unwrap()).unwrap();
    // Something listens there and never says a word.
    let _silent = std::os::unix::net::UnixListener::bind(&dirs.socket).unwrap();
    for (args, limit) in [(vec!["ping"], 15), (vec!["session", "list"], 6)] {
        let started = std::time::Instant::now();
        let out = dirs
            .cli(false)
            .env("PADDOCK_TIMEOUT_SECS", "2")
            .args(&args)
            .output()
            .unwrap();
        let took = started.elapsed().as_secs();
        assert!(!out.status.success(), "{args:?}");
        assert!(took < limit, "{args:?} took {took}s");
    }
}

/// Review D10, D12 (issue 15 point 7): values that cannot be what they claim are refused with
/// INVALID_ARGUMENT, never clamped, wrapped or stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_values_are_refused_not_wrapped() {
    let mut d = Daemon::start().await;
    let mut c = d.client().await;
    // Campaigns: a kernel file system or / as a root, a name with '/' or NUL.
    for (name, root) in [
        ("root", "/"),
        ("proc", "/proc/self"),
        ("a/b", d.dirs.root.to_str().unwrap()),
        ("nul\0", d.dirs.root.to_str().unwrap()),
    ] {
        let err = c
            .add_campaign(pb::AddCampaignRequest {
                name: name.into(),
                root_path: root.into(),
            })
            .await
            .expect_err(name);
        assert_eq!(
            err.code(),
            Code::InvalidArgument,
            "{name}: {}",
            err.message()
        );
    }
    // Durations: one that overflows ms in a u64 (it once wrapped to 384 ms), nanos past 1e9.
    for (seconds, nanos) in [(18_446_744_073_709_552, 0), (1, 2_000_000_000), (-1, 0)] {
        let mut req = d.request(None).await;
        req.timeout = Some(prost_types::Duration { seconds, nanos });
        let err = c.create_session(req).await.expect_err("a bad timeout");
        assert_eq!(err.code(), Code::InvalidArgument, "{seconds}/{nanos}");
        assert!(err.message().contains("timeout"), "{}", err.message());
    }
    let listed = c
        .list_sessions(pb::ListSessionsRequest {
            include_terminated: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .sessions;
    assert!(listed.is_empty(), "a refused create stored nothing");
    // Pushed activity: an unknown type, negative tokens.
    for ev in [
        pb::AgentActivityEvent {
            r#type: 99,
            ..Default::default()
        },
        pb::AgentActivityEvent {
            r#type: pb::ActivityType::Thinking as i32,
            tokens_input: i64::MIN,
            ..Default::default()
        },
    ] {
        let err = c
            .stream_agent_activity(tokio_stream::iter(vec![ev]))
            .await
            .expect_err("refused");
        assert_eq!(err.code(), Code::InvalidArgument, "{}", err.message());
    }
}

/// Review D12: a request the daemon cannot decode is the client's fault (INVALID_ARGUMENT),
/// not a daemon bug (tonic's INTERNAL). The bytes sent are a valid protobuf frame whose field 1
/// (GetSessionRequest.session_id, a string) is not UTF-8.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_requests_are_invalid_argument() {
    #[derive(Clone, PartialEq, prost::Message)]
    struct NotUtf8 {
        #[prost(bytes = "vec", tag = "1")]
        session_id: Vec<u8>,
    }
    let d = Daemon::start().await;
    let ch = paddock::transport::channel(&d.dirs.socket).await.unwrap();
    let mut grpc = tonic::client::Grpc::new(ch);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/obey.local.v1.LocalDaemonService/GetSession",
    );
    let e = grpc
        .unary::<_, pb::SessionInfo, _>(
            tonic::Request::new(NotUtf8 {
                session_id: vec![0xff, 0xfe, 0xfd],
            }),
            path,
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("failed to decode"), "{e:?}");
    // The daemon goes on.
    let mut c = d.client().await;
    c.ping(pb::PingRequest {}).await.unwrap();
}

/// Claude Code that is not logged in is refused at create with what to do (instead of a
/// session whose every turn fails "Not logged in"); a key given to the session is enough.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_without_a_login_is_refused_at_create_with_what_to_do() {
    let d = Daemon::start().await;
    std::fs::remove_file(d.dirs.home.join(".claude/.credentials.json")).unwrap();
    let claude = crate::sessions::fake_claude(&d);
    let root = d.dirs.root.display().to_string();
    let command = format!("command={claude}");
    let args = [
        "session",
        "create",
        "--mount",
        &format!("{root}:/workspace"),
        "--provider",
        "claude-code",
        "--config",
        &command,
    ];
    let o = crate::cli::cli(&d, &args).await;
    assert_eq!(o.code, 4, "refused: {o:?}");
    assert!(
        o.stderr
            .contains("error: OBEY-2004: claude-code is not logged in here")
            && o.stderr.contains("/login"),
        "{o:?}"
    );
    assert!(d.all_sessions().await.is_empty());

    let mut with_key = args.to_vec();
    with_key.extend(["--env", "ANTHROPIC_API_KEY=sk-ant-e2e"]);
    let o = crate::cli::cli(&d, &with_key).await.ok();
    assert!(o.stdout.contains("created"), "{o:?}");
    let all = d.all_sessions().await;
    assert_eq!(all.len(), 1, "{all:?}");
    assert_eq!(all[0].provider, P::ClaudeCode as i32);
}

/// A claude-code session request whose agent is the shell script `name` running `body`, then
/// sleeping on.
async fn stand_in(d: &mut Daemon, name: &str, body: &str) -> pb::CreateSessionRequest {
    let mut req = d.request(None).await;
    req.provider = P::ClaudeCode as i32;
    let agent = d.dirs.base.join(name);
    std::fs::write(&agent, format!("#!/bin/sh\n{body}exec sleep 600\n")).unwrap();
    std::fs::set_permissions(&agent, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    req.provider_config = BTreeMap::from([("command".to_string(), agent.display().to_string())]);
    req
}

/// Claude Code is asked whether it is ready with `mcp_status` (it answers `initialize` only
/// after building its whole command list, ≈10 ms of its CPU paddock never reads), under the
/// same request id, as the first line it reads — with the runner and without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_is_asked_a_cheap_ready_request() {
    for args in [&[][..], &["--no-runner"][..]] {
        let mut d = Daemon::start_with(Dirs::new(), args).await;
        let first = d.dirs.base.join("first-line");
        let (_, answer) = ANSWER_READY.split_once('\n').expect("two lines");
        let body = format!(
            "read -r line\nprintf '%s\\n' \"$line\" > {}\n{answer}",
            first.display()
        );
        let req = stand_in(&mut d, "recording-agent", &body).await;
        let s = d.create(req).await;
        assert_eq!(s.status, S::Running as i32, "{args:?}: {s:?}");
        let line: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&first).unwrap()).unwrap();
        assert_eq!(
            line,
            json!({"type": "control_request", "request_id": "paddock-ready",
                   "request": {"subtype": "mcp_status"}}),
            "{args:?}"
        );
        d.stop(&s.id, false).await.expect("stopped");
    }
}

/// An agent that cannot be written to (it closed its stdin and goes on running) does not
/// leave the turn open until it exits: the message's turn ends with OBEY-2012 at once, the
/// session fails with that code, and the agent is stopped — with the runner and without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_agent_cannot_receive_is_2012() {
    for args in [&[][..], &["--no-runner"][..]] {
        let mut d = Daemon::start_with(Dirs::new(), args).await;
        // It reads the ready request, closes its input, then says it is ready (so no message
        // can be written before the close) and runs on.
        let (read, answer) = ANSWER_READY.split_once('\n').expect("two lines");
        let body = format!("{read}\nexec 0<&-\n{answer}");
        let req = stand_in(&mut d, "deaf-agent", &body).await;
        let s = d.create(req).await;
        assert_eq!(s.status, S::Running as i32, "{args:?}: {s:?}");
        let t0 = std::time::Instant::now();
        let acts = within(d.send(&s.id, "are you there?")).await;
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "{args:?}: the turn waited {:?}",
            t0.elapsed()
        );
        let last = acts.last().expect("the turn's end");
        assert_eq!(kind(last), "ERROR", "{args:?}: {acts:?}");
        assert!(
            last.content
                .starts_with("OBEY-2012: message delivery failed: "),
            "{args:?}: {}",
            last.content
        );
        let info = d.wait_status(&s.id, S::Failed).await;
        assert_eq!(info.error_code, "OBEY-2012", "{args:?}: {info:?}");
        assert_agent_gone(s.pid).await;
    }
}
