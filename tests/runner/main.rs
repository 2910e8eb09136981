//! End-to-end tests of `paddock runner`: the real binary on a real Unix socket, driven over
//! gRPC (`runner.v1.Runner`, the seed's RPCs and paddock's extensions), with real child
//! processes and a fake `codex`. See [`harness`] for the layout.

mod harness;

use std::time::{Duration, Instant};

use harness::*;
use paddock_proto::runner::v1 as pb;
use pb::runner_event::Payload;
use tonic::Code;

// ── Exec / ExecResume ───────────────────────────────────────────────────────

#[tokio::test]
async fn exec_streams_codex_events_and_keeps_unknown_fields() {
    let r = Runner::start();
    let mut c = r.client().await;
    let dir = r.dir("repo");
    let mut req = exec_request("exec-1", &dir, "-fix the typo");
    req.model = "gpt-5-codex".into();
    req.ssh_auth_sock = "/tmp/agent.sock".into();
    let events = collect(c.exec(req).await.unwrap().into_inner()).await;
    let last = lifecycle(&events);
    assert_eq!((last.state(), last.exit_code), (pb::RunState::Finished, 0));
    assert!(events.iter().all(|e| e.run_id == "exec-1"));

    // How codex was called: flags first, `--` before the prompt, stdin at EOF.
    let call = std::fs::read_to_string(dir.join("codex-call.txt")).unwrap();
    assert_eq!(
        call,
        format!(
            "arg=exec\narg=--json\narg=--model\narg=gpt-5-codex\narg=--\narg=-fix the typo\n\
             cwd={}\nssh=/tmp/agent.sock\nstdin=eof\n",
            dir.display()
        )
    );

    let ex: Vec<&pb::ExecEvent> = events.iter().filter_map(exec).collect();
    let lines: Vec<&str> = TRANSCRIPT.lines().collect();
    assert_eq!(ex.len(), lines.len(), "one event per line");
    use pb::EventType as T;
    let types: Vec<T> = ex.iter().map(|e| e.r#type()).collect();
    assert_eq!(
        types,
        vec![
            T::EventThreadStarted,
            T::EventTurnStarted,
            T::EventItemCompleted,
            T::EventItemStarted,
            T::EventItemCompleted,
            T::EventItemCompleted,
            T::Unspecified,
            T::Unspecified,
            T::EventItemCompleted,
            T::EventTurnCompleted,
        ]
    );
    assert_eq!(ex[0].thread_id, "0199a213-81c0-7800-8aa1-bbab2a035a53");
    assert!(ex[0].raw.is_empty() && ex[1].raw.is_empty() && ex[3].raw.is_empty());
    // Unknown fields: the whole line in raw, the item's JSON in the item's raw.
    let cmd = ex[4].item.as_ref().unwrap();
    assert_eq!(cmd.r#type(), pb::ItemType::ItemCommandExecution);
    assert_eq!(cmd.aggregated_output, "README.md\n");
    assert_eq!(ex[4].raw, lines[4].as_bytes());
    let item_raw: serde_json::Value = serde_json::from_slice(&cmd.raw).unwrap();
    assert_eq!(item_raw["duration_ms"], 12);
    assert_eq!(ex[5].item.as_ref().unwrap().changes[0].path, "README.md");
    // An unknown event type and a non-JSON line.
    assert_eq!(ex[6].raw, lines[6].as_bytes());
    assert_eq!(ex[7].message, lines[7]);
    assert_eq!(ex[7].raw, lines[7].as_bytes());
    let usage = ex[9].usage.as_ref().unwrap();
    assert_eq!(
        (
            usage.input_tokens,
            usage.cached_input_tokens,
            usage.output_tokens
        ),
        (1200, 200, 345)
    );
    assert_eq!(
        ex[9].raw,
        lines[9].as_bytes(),
        "reasoning_output_tokens kept"
    );
}

#[tokio::test]
async fn exec_resume_passes_the_thread_and_a_failing_codex_is_finished_with_its_code() {
    let r = Runner::start();
    let mut c = r.client().await;
    let dir = r.dir("repo");
    std::fs::write(dir.join("exit-code"), "3").unwrap();
    let req = pb::ExecResumeRequest {
        run_id: "resume-1".into(),
        working_dir: dir.to_str().unwrap().into(),
        prompt: "go on".into(),
        resume_session_id: "th_123".into(),
        json: true,
        ..Default::default()
    };
    let events = collect(c.exec_resume(req).await.unwrap().into_inner()).await;
    let last = lifecycle(&events);
    assert_eq!((last.state(), last.exit_code), (pb::RunState::Finished, 3));
    let call = std::fs::read_to_string(dir.join("codex-call.txt")).unwrap();
    assert!(
        call.starts_with("arg=exec\narg=--json\narg=resume\narg=--\narg=th_123\narg=go on\n"),
        "{call}"
    );
}

#[tokio::test]
async fn a_missing_codex_is_a_failed_status_without_started() {
    let r = Runner::start_with(&[("PADDOCK_CODEX_BIN", "/nonexistent/codex")]);
    let mut c = r.client().await;
    let events = collect(
        c.exec(exec_request("x", &r.work, "hi"))
            .await
            .unwrap()
            .into_inner(),
    )
    .await;
    assert_eq!(events.len(), 1, "{events:?}");
    let s = status(&events[0]).unwrap();
    assert_eq!((s.state(), s.exit_code), (pb::RunState::Failed, 127));
    assert!(s.message.contains("/nonexistent/codex"), "{}", s.message);
}

// ── RunCommand ──────────────────────────────────────────────────────────────

#[tokio::test]
async fn run_command_streams_both_outputs_and_the_exit_code() {
    let r = Runner::start();
    let mut c = r.client().await;
    let mut req = command(
        "cmd-1",
        &r.work,
        "pwd; echo out; echo err >&2; echo \"ssh=$SSH_AUTH_SOCK\"; printf 'h\\303\\251'; exit 3",
    );
    req.ssh_auth_sock = "/run/ssh.sock".into();
    let events = collect(c.run_command(req).await.unwrap().into_inner()).await;
    let last = lifecycle(&events);
    assert_eq!((last.state(), last.exit_code), (pb::RunState::Finished, 3));
    assert_eq!(
        output(&events, pb::StreamKind::Stdout),
        format!("{}\nout\nssh=/run/ssh.sock\nhé", r.work.display())
    );
    assert_eq!(output(&events, pb::StreamKind::Stderr), "err\n");

    // use_shell = false (what a seed client that leaves it unset sends): still the shell.
    let mut req = command("cmd-2", &r.work, "echo  a   $((1 + 2))");
    req.use_shell = false;
    let events = collect(c.run_command(req).await.unwrap().into_inner()).await;
    lifecycle(&events);
    assert_eq!(output(&events, pb::StreamKind::Stdout), "a 3\n");
    // No shell: the exact argv (paddock's extension).
    let mut req = command("cmd-3", &r.work, "label");
    req.argv = vec!["echo".into(), " a ".into(), "$((1 + 2))".into()];
    let events = collect(c.run_command(req).await.unwrap().into_inner()).await;
    lifecycle(&events);
    assert_eq!(output(&events, pb::StreamKind::Stdout), " a  $((1 + 2))\n");
}

#[tokio::test]
async fn launch_failures_and_validation_errors() {
    let r = Runner::start();
    let mut c = r.client().await;
    // Not found / not executable: FAILED with the shell's codes, no STARTED.
    let mut req = command("nf", &r.work, "/nonexistent/prog arg");
    req.argv = vec!["/nonexistent/prog".into(), "arg".into()];
    let events = collect(c.run_command(req).await.unwrap().into_inner()).await;
    assert_eq!(events.len(), 1);
    assert_eq!(status(&events[0]).unwrap().exit_code, 127);
    let plain = r.work.join("plain.txt");
    std::fs::write(&plain, "x").unwrap();
    let mut req = command("nx", &r.work, plain.to_str().unwrap());
    req.argv = vec![plain.to_str().unwrap().into()];
    let events = collect(c.run_command(req).await.unwrap().into_inner()).await;
    let s = status(&events[0]).unwrap();
    assert_eq!((s.state(), s.exit_code), (pb::RunState::Failed, 126));

    // INVALID_ARGUMENT for every malformed request.
    let wd = r.work.to_str().unwrap().to_string();
    let bad_commands = [
        command("", &r.work, "true"),
        pb::RunCommandRequest {
            working_dir: "/nonexistent/dir".into(),
            ..command("a", &r.work, "true")
        },
        pb::RunCommandRequest {
            working_dir: plain.to_str().unwrap().into(),
            ..command("a", &r.work, "true")
        },
        pb::RunCommandRequest {
            working_dir: String::new(),
            ..command("a", &r.work, "true")
        },
        command("a", &r.work, "   "),
        command(&"x".repeat(300), &r.work, "true"),
    ];
    for req in bad_commands {
        let err = c.run_command(req.clone()).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{req:?}: {err:?}");
    }
    let mut no_json = exec_request("e", &r.work, "hi");
    no_json.json = false;
    for req in [
        no_json,
        exec_request("e", &r.work, ""),
        exec_request("", &r.work, "hi"),
        exec_request("e", &r.work, &"p".repeat(200 * 1024)),
    ] {
        let err = c.exec(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    }
    let err = c
        .exec_resume(pb::ExecResumeRequest {
            run_id: "e".into(),
            working_dir: wd.clone(),
            prompt: "hi".into(),
            json: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("resume_session_id"));
    let err = c
        .signal_session(pb::SignalRequest {
            run_id: "nf".into(),
            signal: pb::ProcessSignal::Unspecified as i32,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = c
        .stop_run(pb::StopRunRequest {
            run_id: String::new(),
            grace_ms: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = c
        .attach_run(pb::AttachRunRequest {
            run_id: "nobody".into(),
            after_seq: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test]
async fn run_ids_are_unique_while_the_runner_knows_them() {
    let r = Runner::start();
    let mut c = r.client().await;
    let mut live = c
        .run_command(command("dup", &r.work, "sleep 30"))
        .await
        .unwrap()
        .into_inner();
    next(&mut live).await; // STARTED
    let err = c
        .exec(exec_request("dup", &r.work, "hi"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    let ok = signal_run(&mut c, "dup", pb::ProcessSignal::Kill).await;
    assert!(ok.ok, "{ok:?}");
    collect(live).await;
    // Finished, but still known: still taken.
    let err = c
        .run_command(command("dup", &r.work, "true"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
}

// ── signals and stops ───────────────────────────────────────────────────────

#[tokio::test]
async fn signals_reach_the_whole_process_group() {
    let r = Runner::start();
    let mut c = r.client().await;
    // A shell with a background child: TERM must reach both.
    let mut s = c
        .run_command(command(
            "grp",
            &r.work,
            // The sleep inherits an ignored HUP (so the HUP below only runs the shell's trap, set
            // before the pid is printed) but not an ignored TERM.
            "trap '' HUP; sleep 60 & trap 'echo got-hup' HUP; echo $!; while :; do wait; done",
        ))
        .await
        .unwrap()
        .into_inner();
    next(&mut s).await; // STARTED
    let first = next(&mut s).await;
    let Some(Payload::CommandOutput(o)) = first.payload else {
        panic!("{first:?}")
    };
    let sleeper: u32 = o.text.trim().parse().unwrap();
    assert!(alive(sleeper));

    let resp = signal_run(&mut c, "grp", pb::ProcessSignal::Hup).await;
    assert!(resp.ok, "{resp:?}");
    assert!(resp.message.contains("SIGHUP"));
    let ev = next(&mut s).await;
    assert!(matches!(&ev.payload, Some(Payload::CommandOutput(o)) if o.text.contains("got-hup")));

    let resp = signal_run(&mut c, "grp", pb::ProcessSignal::Term).await;
    assert!(resp.ok);
    let rest = collect(s).await;
    let last = status(rest.last().unwrap()).unwrap();
    assert_eq!((last.state(), last.exit_code), (pb::RunState::Failed, 143));
    assert!(last.message.contains("SIGTERM"), "{}", last.message);
    eventually("the background sleep died with its group", || {
        !alive(sleeper)
    })
    .await;

    for (run_id, want) in [("grp", "already exited"), ("nobody", "not found")] {
        let resp = signal_run(&mut c, run_id, pb::ProcessSignal::Kill).await;
        assert!(!resp.ok);
        assert_eq!(resp.message, want);
    }
}

/// What a run leaves behind when its leader exits goes with it: its group, and processes
/// that left the group (setsid) but carry the run's tag in their environment.
#[tokio::test]
async fn a_runs_leftovers_die_with_it_even_out_of_its_group() {
    let r = Runner::start();
    let mut c = r.client().await;
    let s = c
        .run_command(command(
            "leftovers",
            &r.work,
            "sleep 600 & echo $!; setsid sleep 600 & echo $!; sleep 0.3",
        ))
        .await
        .unwrap()
        .into_inner();
    let all = collect(s).await;
    let pids: Vec<u32> = all
        .iter()
        .filter_map(|e| match &e.payload {
            Some(Payload::CommandOutput(o)) => Some(o.text.clone()),
            _ => None,
        })
        .collect::<String>()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 2, "{all:?}");
    let last = status(all.last().unwrap()).unwrap();
    assert_eq!(last.state(), pb::RunState::Finished, "{last:?}");
    eventually(
        "the group's sleep and the escaped sleep died with the run",
        || pids.iter().all(|p| !alive(*p)),
    )
    .await;
}

#[tokio::test]
async fn stop_run_escalates_to_kill_when_term_is_ignored() {
    let r = Runner::start();
    let mut c = r.client().await;
    let mut s = c
        .run_command(command(
            "stubborn",
            &r.work,
            "trap '' TERM; echo ready; sleep 60",
        ))
        .await
        .unwrap()
        .into_inner();
    next(&mut s).await; // STARTED
    next(&mut s).await; // ready: the trap is set
    let t0 = Instant::now();
    let resp = c
        .stop_run(pb::StopRunRequest {
            run_id: "stubborn".into(),
            grace_ms: 400,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(resp.ok, "{resp:?}");
    let listed = c
        .list_runs(pb::ListRunsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(listed
        .runs
        .iter()
        .any(|r| r.run_id == "stubborn" && r.stopping));
    let rest = collect(s).await;
    let elapsed = t0.elapsed();
    let last = status(rest.last().unwrap()).unwrap();
    assert_eq!((last.state(), last.exit_code), (pb::RunState::Failed, 137));
    assert!(last.message.contains("SIGKILL"), "{}", last.message);
    assert!(
        elapsed >= Duration::from_millis(400),
        "KILL came before the grace period: {elapsed:?}"
    );
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");

    // A process that honours TERM ends at once, without KILL.
    let mut s = c
        .run_command(command("polite", &r.work, "echo ready; exec sleep 60"))
        .await
        .unwrap()
        .into_inner();
    next(&mut s).await;
    next(&mut s).await;
    let t0 = Instant::now();
    let resp = c
        .stop_run(pb::StopRunRequest {
            run_id: "polite".into(),
            grace_ms: 0, // the default 10 s
        })
        .await
        .unwrap()
        .into_inner();
    assert!(resp.message.contains("10000 ms"), "{resp:?}");
    let rest = collect(s).await;
    assert!(t0.elapsed() < Duration::from_secs(5));
    let last = status(rest.last().unwrap()).unwrap();
    assert_eq!(last.exit_code, 143);
    assert!(last.message.contains("(stopped)"), "{}", last.message);

    for (run_id, want) in [("polite", "already exited"), ("nobody", "not found")] {
        let resp = c
            .stop_run(pb::StopRunRequest {
                run_id: run_id.into(),
                grace_ms: 10,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(!resp.ok);
        assert_eq!(resp.message, want);
    }
}

/// `stop_on_hangup`: a run whose starting call's stream closes (its client died) is stopped;
/// one without it runs on, as every run does.
#[tokio::test]
async fn a_run_started_with_stop_on_hangup_ends_when_its_client_hangs_up() {
    let r = Runner::start();
    let mut pids = Vec::new();
    for (run_id, stop_on_hangup) in [("hung", true), ("kept", false)] {
        // A client of its own, as a daemon that dies takes its connection with it.
        let mut c = r.client().await;
        let mut s = c
            .run_command(pb::RunCommandRequest {
                stop_on_hangup,
                ..command(run_id, &r.work, "echo $$; exec sleep 300")
            })
            .await
            .unwrap()
            .into_inner();
        next(&mut s).await; // STARTED
        let pid: u32 = output(&[next(&mut s).await], pb::StreamKind::Stdout)
            .trim()
            .parse()
            .unwrap();
        assert!(alive(pid));
        pids.push(pid);
        drop(s);
        drop(c);
    }
    let t0 = Instant::now();
    eventually("the hung-up run's process ends", || !alive(pids[0])).await;
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // The runner records the end when it reaps the process, a moment after it has died.
    let mut c = r.client().await;
    let runs = loop {
        let runs = list_runs(&mut c).await;
        let ended = |r: &pb::RunInfo| r.run_id == "hung" && r.state() != pb::RunState::Started;
        if runs.iter().any(ended) {
            break runs;
        }
        assert!(
            t0.elapsed() < WAIT,
            "the hung-up run is still listed as started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let run = |id: &str| runs.iter().find(|r| r.run_id == id).unwrap().clone();
    // Stopped as `StopRun` stops: TERM, which the sleep obeys.
    assert_eq!(
        (run("hung").state(), run("hung").exit_code),
        (pb::RunState::Failed, 143)
    );
    assert_eq!(run("kept").state(), pb::RunState::Started);
    assert!(alive(pids[1]), "the run without stop_on_hangup was ended");
    let ok = signal_run(&mut c, "kept", pb::ProcessSignal::Kill).await;
    assert!(ok.ok, "{ok:?}");
    eventually("the kept run's process ends", || !alive(pids[1])).await;
}

// ── ownership: ListRuns, AttachRun, WriteStdin ──────────────────────────────

#[tokio::test]
async fn a_run_outlives_its_client_and_can_be_attached_from_the_middle() {
    let r = Runner::start();
    let mut c = r.client().await;
    let dir = r.dir("repo");
    std::fs::write(dir.join("hold"), "").unwrap();
    let mut s = c
        .exec(exec_request("own-1", &dir, "work"))
        .await
        .unwrap()
        .into_inner();
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(next(&mut s).await);
    }
    // The client goes away (a daemon restart): the run goes on.
    drop(s);
    drop(c);
    let mut c = r.client().await;
    let runs = list_runs(&mut c).await;
    let info = runs.iter().find(|i| i.run_id == "own-1").unwrap();
    assert_eq!(info.kind(), pb::RunKind::Exec);
    assert_eq!(info.state(), pb::RunState::Started);
    assert!(info.pid > 0 && alive(info.pid));
    assert_eq!(info.working_dir, dir.to_str().unwrap());
    eventually("the fake codex printed its first lines", || {
        std::fs::read_to_string(dir.join("codex-call.txt")).is_ok()
    })
    .await;

    // Resume after the 4 events seen: the rest, same numbers, then live ones.
    let mut a = c
        .attach_run(pb::AttachRunRequest {
            run_id: "own-1".into(),
            after_seq: 4,
        })
        .await
        .unwrap()
        .into_inner();
    let ev = next(&mut a).await;
    assert_eq!(ev.seq, 5);
    std::fs::remove_file(dir.join("hold")).unwrap();
    let mut rest = vec![ev];
    rest.extend(collect(a).await);
    seen.extend(rest);
    let last = lifecycle(&seen);
    assert_eq!(last.state(), pb::RunState::Finished);
    assert_eq!(seen.len(), TRANSCRIPT.lines().count() + 2);

    // A whole replay equals what a client reading from the start saw.
    let replay = collect(
        c.attach_run(pb::AttachRunRequest {
            run_id: "own-1".into(),
            after_seq: 0,
        })
        .await
        .unwrap()
        .into_inner(),
    )
    .await;
    assert_eq!(replay, seen);
    let runs = list_runs(&mut c).await;
    let info = runs.iter().find(|i| i.run_id == "own-1").unwrap();
    assert_eq!(info.state(), pb::RunState::Finished);
    assert_eq!((info.first_seq, info.last_seq), (1, seen.len() as u64));
}

#[tokio::test]
async fn write_stdin_feeds_a_run_started_with_keep_stdin() {
    let r = Runner::start();
    let mut c = r.client().await;
    let mut req = command("cat", &r.work, "cat");
    req.keep_stdin = true;
    let mut s = c.run_command(req).await.unwrap().into_inner();
    next(&mut s).await;
    let w = c
        .write_stdin(pb::WriteStdinRequest {
            run_id: "cat".into(),
            data: b"hello\n".to_vec(),
            close: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(w.ok, "{w:?}");
    let ev = next(&mut s).await;
    assert!(matches!(&ev.payload, Some(Payload::CommandOutput(o)) if o.text == "hello\n"));
    let runs = list_runs(&mut c).await;
    assert!(runs.iter().any(|i| i.run_id == "cat" && i.stdin_open));
    let w = c
        .write_stdin(pb::WriteStdinRequest {
            run_id: "cat".into(),
            data: b"bye\n".to_vec(),
            close: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(w.ok, "{w:?}");
    let rest = collect(s).await;
    assert_eq!(output(&rest, pb::StreamKind::Stdout), "bye\n");
    assert_eq!(status(rest.last().unwrap()).unwrap().exit_code, 0);

    // Without keep_stdin stdin is /dev/null: `cat` ends at once.
    let events = collect(
        c.run_command(command("cat2", &r.work, "cat; echo done"))
            .await
            .unwrap()
            .into_inner(),
    )
    .await;
    assert_eq!(output(&events, pb::StreamKind::Stdout), "done\n");
    for (run_id, want) in [
        ("cat", "already exited"),
        ("cat2", "already exited"),
        ("nobody", "not found"),
    ] {
        let w = c
            .write_stdin(pb::WriteStdinRequest {
                run_id: run_id.into(),
                data: b"x".to_vec(),
                close: false,
            })
            .await
            .unwrap()
            .into_inner();
        assert!(!w.ok);
        assert_eq!(w.message, want);
    }
    let mut s = c
        .run_command(command("nopipe", &r.work, "sleep 30"))
        .await
        .unwrap()
        .into_inner();
    next(&mut s).await;
    let w = c
        .write_stdin(pb::WriteStdinRequest {
            run_id: "nopipe".into(),
            data: b"x".to_vec(),
            close: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!w.ok && w.message.contains("keep_stdin"), "{w:?}");
    c.signal_session(pb::SignalRequest {
        run_id: "nopipe".into(),
        signal: pb::ProcessSignal::Kill as i32,
    })
    .await
    .unwrap();
    collect(s).await;
}

// ── load ────────────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_megabytes_of_output_keep_the_runner_small() {
    const TOTAL: usize = 50 * 1000 * 1000;
    let r = Runner::start();
    let mut c = r.client().await;
    let (rss_before, _) = memory_kib(r.pid());
    let t0 = Instant::now();
    let mut s = c
        .run_command(command(
            "big",
            &r.work,
            &format!("head -c {TOTAL} /dev/zero | tr '\\0' x"),
        ))
        .await
        .unwrap()
        .into_inner();
    // A slow client first: the runner holds the child back instead of buffering.
    next(&mut s).await; // STARTED
    let Some(Payload::CommandOutput(first)) = next(&mut s).await.payload else {
        panic!("output first")
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (rss_stalled, _) = memory_kib(r.pid());
    let runs = list_runs(&mut c).await;
    let info = runs.iter().find(|i| i.run_id == "big").unwrap();
    assert_eq!(info.state(), pb::RunState::Started, "held back, not done");
    assert!(info.last_seq <= 10_001, "{info:?}");
    // Then read everything.
    let mut bytes = first.text.len();
    let mut max_chunk = bytes;
    let mut events = 2usize;
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(60), s.message())
        .await
        .expect("output keeps coming")
        .expect("stream ok")
    {
        events += 1;
        match ev.payload {
            Some(Payload::CommandOutput(o)) => {
                bytes += o.text.len();
                max_chunk = max_chunk.max(o.text.len());
            }
            Some(Payload::Status(st)) => {
                assert_eq!(st.state(), pb::RunState::Finished, "{st:?}");
            }
            other => panic!("{other:?}"),
        }
    }
    let (rss_after, hwm) = memory_kib(r.pid());
    eprintln!(
        "50 MB: {events} events in {:?}; VmRSS {rss_before} KiB before, {rss_stalled} KiB with a \
         stalled client, {rss_after} KiB after; peak {hwm} KiB",
        t0.elapsed()
    );
    assert_eq!(bytes, TOTAL, "every byte arrived");
    assert!(max_chunk <= 64 * 1024, "{max_chunk}");
    assert!(
        hwm.saturating_sub(rss_before) < 100 * 1024,
        "peak RSS grew by {} KiB",
        hwm - rss_before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_runs_at_once() {
    let r = Runner::start();
    let c = r.client().await;
    let mut tasks = Vec::new();
    for i in 0..20 {
        let mut c = c.clone();
        let work = r.work.clone();
        tasks.push(tokio::spawn(async move {
            let events = collect(
                c.run_command(command(
                    &format!("par-{i}"),
                    &work,
                    &format!(
                        "for j in 1 2 3; do echo {i}-$j; sleep 0.1; done; exit {}",
                        i % 3
                    ),
                ))
                .await
                .unwrap()
                .into_inner(),
            )
            .await;
            (i, events)
        }));
    }
    let t0 = Instant::now();
    for t in tasks {
        let (i, events) = t.await.unwrap();
        let last = lifecycle(&events);
        assert_eq!(last.exit_code, i % 3);
        assert_eq!(
            output(&events, pb::StreamKind::Stdout),
            format!("{i}-1\n{i}-2\n{i}-3\n")
        );
        assert!(events.iter().all(|e| e.run_id == format!("par-{i}")));
    }
    // They ran side by side: far less than 20 × 0.3 s.
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let mut c = c;
    let runs = list_runs(&mut c).await;
    assert_eq!(runs.len(), 20);
    assert!(runs.iter().all(|i| i.state() == pb::RunState::Finished));
}

// ── the process and its socket ──────────────────────────────────────────────

#[tokio::test]
async fn the_socket_is_private_and_claimed_once() {
    use std::os::unix::fs::PermissionsExt;
    let mut r = Runner::start();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&r.socket), 0o600);
    assert_eq!(mode(r.socket.parent().unwrap()), 0o700);
    // A second runner on a live socket is refused.
    let out = std::process::Command::new(BIN)
        .args(["runner", "--socket"])
        .arg(&r.socket)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("another paddock runner is already listening"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SIGKILL leaves a stale socket file: the next runner replaces it.
    let mut child = r.child.take().unwrap();
    signal(child.id(), nix::sys::signal::Signal::SIGKILL);
    child.wait().unwrap();
    assert!(r.socket.exists());
    r.spawn(&[]);
    let mut c = r.client().await;
    c.list_runs(pb::ListRunsRequest {}).await.unwrap();
}

#[tokio::test]
async fn children_die_with_the_runner() {
    let mut r = Runner::start();
    let mut c = r.client().await;
    let mut req = command("orphan", &r.work, "sleep 60");
    req.argv = vec!["sleep".into(), "60".into()];
    let mut s = c.run_command(req).await.unwrap().into_inner();
    next(&mut s).await;
    let runs = list_runs(&mut c).await;
    let pid = runs[0].pid;
    assert!(alive(pid));
    let mut child = r.child.take().unwrap();
    signal(child.id(), nix::sys::signal::Signal::SIGKILL);
    child.wait().unwrap();
    eventually("PDEATHSIG killed the child", || !alive(pid)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_every_run_and_the_runner_exits_cleanly() {
    let mut r = Runner::start();
    let mut c = r.client().await;
    let mut s = c
        .run_command(command("bg", &r.work, "sleep 60 & echo $!; wait"))
        .await
        .unwrap()
        .into_inner();
    next(&mut s).await;
    let Some(Payload::CommandOutput(o)) = next(&mut s).await.payload else {
        panic!()
    };
    let grandchild: u32 = o.text.trim().parse().unwrap();
    let status = r.terminate();
    assert!(status.success(), "{status}\n{}", r.log());
    assert!(!alive(grandchild), "the whole group was stopped");
    assert!(!r.socket.exists(), "the socket is removed");
}

#[tokio::test]
async fn any_authority_a_valid_uri_allows_is_accepted() {
    let r = Runner::start();
    // Not "localhost": the server does not check who the client thinks it talks to.
    let mut c = client_at(&r.socket, "http://runner.invalid:7777").await;
    let events = collect(
        c.run_command(command("auth", &r.work, "echo ok"))
            .await
            .unwrap()
            .into_inner(),
    )
    .await;
    assert_eq!(output(&events, pb::StreamKind::Stdout), "ok\n");
}

// ── a client nobody on the team wrote ───────────────────────────────────────

#[test]
fn a_python_grpcio_client_speaks_to_the_runner() {
    let have = std::process::Command::new("python3")
        .args(["-c", "import grpc, grpc_tools"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !have {
        eprintln!(
            "SKIPPED a_python_grpcio_client_speaks_to_the_runner: python3 with grpcio and \
             grpcio-tools is not installed (pip install grpcio grpcio-tools)"
        );
        return;
    }
    let r = Runner::start();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new("python3")
        .arg(root.join("tests/runner/grpcio_client.py"))
        .arg("--socket")
        .arg(&r.socket)
        .arg("--proto-root")
        .arg(root.join("proto"))
        .arg("--workdir")
        .arg(&r.work)
        .arg("--stubs")
        .arg(r.dir("stubs"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}{stderr}");
    assert!(
        out.status.success(),
        "grpcio client failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("grpcio client: all checks passed"),
        "{stdout}"
    );
}
