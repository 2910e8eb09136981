//! Codex through paddock's codex bridge (`paddock __bridge codex`).
//!
//! Two kinds of tests:
//!
//! - without a CLI (always run): the bridge binary itself, driven over its stdio as the daemon
//!   does, with a fake `codex` shell script — one process per turn, resume arguments, prompts
//!   through stdin, a codex that exits early or is killed, and the tool processes that escape
//!   codex's process group, ended with the session by their containment tag;
//! - the real CLI (`@openai/codex`, pinned in tests/npm/package.json; `PADDOCK_CODEX_BIN`
//!   overrides), supervised by the real daemon and talking to the fake Responses API
//!   (`fake_responses.rs`).
//!
//! Facts of codex-cli 0.169.0 these tests rely on: a model provider of its own is configured
//! with `-c` (here through the bridge's `codex_config`): `model_provider=fake` and
//! `model_providers.fake={name, base_url, env_key, wire_api="responses",
//! request_max_retries=0, stream_max_retries=0}` (no retries: a 5xx ends the turn at once);
//! the key is read from the environment variable `env_key` names; `CODEX_HOME` (here
//! `~/.cache/paddock-test-codex-*`, not under /tmp, where codex makes no sandbox helper) holds its threads, so `exec resume` needs the same one; a model name
//! codex knows (`gpt-5.5`) gets its full tool set (`exec_command`, `apply_patch`, …) — with an
//! unknown name codex falls back to a reduced set without `apply_patch`, and says so in an
//! `error` item.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use paddock_proto::obey::local::v1 as pb;
use pb::SessionStatus as S;
use serde_json::{json, Value};

use crate::fake_responses::{FakeResponses, Recorded, Reply};
use crate::harness::*;
use crate::scenarios::{
    budget_crossed_by_real_usage, conversation_survives_restarts, costing, killed_mid_turn, nonce,
    stop_during_a_tool_call, Conversation, Kit, Sent,
};

/// The model the real-CLI sessions ask for (one codex 0.169 knows).
const CODEX_MODEL: &str = "gpt-5.5";

/// The key the fake provider reads from the environment.
const KEY: &str = "sk-paddock-codex-test";

/// The codex CLI: `PADDOCK_CODEX_BIN`, else `tests/npm/node_modules/.bin/codex`.
fn codex_bin() -> std::path::PathBuf {
    npm_bin("PADDOCK_CODEX_BIN", "codex")
}

/// `codex_config` pointing codex at `fake`.
fn fake_provider_config(fake: &FakeResponses) -> String {
    format!(
        "model_provider=fake\n\
         model_providers.fake={{name=\"fake\",base_url=\"{}\",env_key=\"PADDOCK_FAKE_KEY\",wire_api=\"responses\",request_max_retries=0,stream_max_retries=0}}\n",
        fake.base_url()
    )
}

/// A codex session's CreateSession request, with `permissions` if given.
fn codex_request(
    w: &World,
    fake: &FakeResponses,
    permissions: Option<&str>,
) -> pb::CreateSessionRequest {
    // Not under /tmp (World::dir_outside_tmp): codex's sandbox would not work from there.
    let codex_home = w.dir_outside_tmp("paddock-test-codex-");
    let mut config: std::collections::BTreeMap<String, String> = [
        ("command".to_string(), codex_bin().display().to_string()),
        ("codex_config".to_string(), fake_provider_config(fake)),
    ]
    .into_iter()
    .collect();
    if let Some(p) = permissions {
        config.insert("permissions".into(), p.into());
    }
    pb::CreateSessionRequest {
        campaign_id: w.campaign_id.clone(),
        provider: pb::SessionProvider::Codex as i32,
        model: CODEX_MODEL.into(),
        provider_config: config,
        environment: [
            ("PADDOCK_FAKE_KEY", KEY.to_string()),
            ("CODEX_HOME", codex_home.display().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
        ..Default::default()
    }
}

/// Asserts that `expected` appear in the input `r` sent, in this order.
#[track_caller]
fn assert_input(r: &Recorded, expected: &[&str]) {
    assert_in_order(&r.texts(), expected);
}

/// The thread a request belongs to.
fn thread_of(r: &Recorded) -> String {
    r.headers
        .get("thread-id")
        .cloned()
        .unwrap_or_else(|| panic!("no thread-id header: {:?}", r.headers))
}

// ── the bridge with a fake codex (no CLI needed) ──────────────────────────────────────────────

/// A fake `codex`: logs its arguments and prompt, then acts on the prompt's first word.
const FAKE_CODEX: &str = r#"#!/bin/sh
dir="$FAKE_CODEX_DIR"
n=$(ls "$dir" | grep -c '^args\.')
n=$((n + 1))
printf '%s\n' "$@" > "$dir/args.$n"
for a in "$@"; do last="$a"; done
if [ "$last" = "-" ]; then prompt=$(cat); else prompt="$last"; fi
printf '%s' "$prompt" > "$dir/prompt.$n"
echo "Reading additional input from stdin..." >&2
case "$prompt" in
  crash*)
    echo '{"type":"thread.started","thread_id":"th-crash"}'
    echo '{"type":"error","message":"the model is unreachable"}'
    echo "Error: something went wrong" >&2
    echo "Stack backtrace:" >&2
    echo "   0: <unknown>" >&2
    exit 3 ;;
  selfkill*)
    kill -9 $$ ;;
  orphan*)
    # What codex does with a tool command: a session of its own.
    setsid sh -c "exec sleep $FAKE_CODEX_NAP" </dev/null >/dev/null 2>&1 & ;;
  hang*)
    setsid sh -c "exec sleep $FAKE_CODEX_NAP" </dev/null >/dev/null 2>&1 &
    echo '{"type":"thread.started","thread_id":"th-1"}'
    exec sleep 301 ;;
esac
echo '{"type":"thread.started","thread_id":"th-1"}'
echo '{"type":"turn.started"}'
printf '{"type":"item.completed","item":{"id":"item_0","type":"agent_message","text":"turn %s: %s bytes"}}\n' "$n" "${#prompt}"
# The thread's running totals, as codex reports them: 10 in (4 cached), 2 out per turn.
printf '{"type":"turn.completed","usage":{"input_tokens":%s,"cached_input_tokens":%s,"output_tokens":%s,"something_new":1}}\n' $((n * 10)) $((n * 4)) $((n * 2))
"#;

/// A bridge process over a fake codex, driven over its stdio.
struct FakeBridge {
    dir: tempfile::TempDir,
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
    nap: String,
    /// The containment tag the daemon would give the bridge (`paddock::contain`).
    tag: String,
}

impl FakeBridge {
    fn start(resume: Option<&str>, extra_config: &[(&str, &str)]) -> FakeBridge {
        let dir = tempfile::Builder::new()
            .prefix("pdk-codex-")
            .tempdir()
            .unwrap();
        let script = dir.path().join("codex");
        std::fs::write(&script, FAKE_CODEX).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let log = dir.path().join("log");
        std::fs::create_dir(&log).unwrap();
        let mut config = serde_json::Map::new();
        config.insert("command".into(), json!(script.display().to_string()));
        for (k, v) in extra_config {
            config.insert(k.to_string(), json!(v));
        }
        let nap = format!("300.{}", nonce());
        let tag = paddock::contain::new_tag();
        let mut cmd = Command::new(BIN);
        cmd.args(["__bridge", "codex", "--model", "gpt-test", "--config"])
            .arg(Value::Object(config).to_string());
        if let Some(r) = resume {
            cmd.args(["--resume", r]);
        }
        let mut child = cmd
            .current_dir(dir.path())
            .env("FAKE_CODEX_DIR", &log)
            .env("CODEX_HOME", dir.path().join("codex-home"))
            .env("FAKE_CODEX_NAP", &nap)
            .env(paddock::contain::TAG_VAR, &tag)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("spawn the bridge");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines() {
                let Ok(l) = l else { return };
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        FakeBridge {
            dir,
            stdin: child.stdin.take(),
            child,
            lines: rx,
            nap,
            tag,
        }
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join("log").join(name)).unwrap_or_default()
    }

    fn send(&mut self, text: &str) {
        let line = paddock::providers::user_message_line(text) + "\n";
        let w = self.stdin.as_mut().unwrap();
        w.write_all(line.as_bytes()).unwrap();
        w.flush().unwrap();
    }

    /// The bridge's lines up to and including the turn's `result`.
    fn turn(&mut self, text: &str) -> Vec<Value> {
        self.send(text);
        let mut out = Vec::new();
        loop {
            let l = self
                .lines
                .recv_timeout(WAIT)
                .expect("the bridge printed no result");
            let v: Value = serde_json::from_str(&l).unwrap_or(json!({"raw": l}));
            let end = v["type"] == "result";
            out.push(v);
            if end {
                return out;
            }
        }
    }

    fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(Instant::now() < deadline, "the bridge did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for FakeBridge {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for p in processes_with(&format!("sleep {}", self.nap)) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

use std::os::unix::process::{CommandExt, ExitStatusExt};

/// Waits for the fake tool process (`sleep <nap>`, once `setsid` exec'd it) and returns its pid.
fn wait_tool(nap: &str) -> u32 {
    let deadline = Instant::now() + WAIT;
    loop {
        let found: Vec<u32> = processes_with(nap)
            .into_iter()
            .filter(|p| cmdline(*p).starts_with("sleep "))
            .collect();
        if let [p] = found[..] {
            return p;
        }
        assert!(
            Instant::now() < deadline,
            "the tool never started: {found:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn one_codex_process_per_turn_resuming_the_thread() {
    let mut b = FakeBridge::start(
        None,
        &[
            ("permissions", "deny"),
            ("codex_config", "model_reasoning_effort=\"low\"\n"),
        ],
    );
    let t1 = b.turn("hello");
    assert_eq!(
        t1[0],
        json!({"type": "system", "subtype": "init", "session_id": "th-1"})
    );
    let result = t1.last().unwrap();
    assert_eq!(result["is_error"], false);
    assert_eq!(result["result"], "turn 1: 5 bytes");
    assert_eq!(result["session_id"], "th-1");
    assert_eq!(
        result["usage"],
        json!({"input_tokens": 6, "cache_read_input_tokens": 4, "output_tokens": 2})
    );
    assert_eq!(
        b.log("args.1").lines().collect::<Vec<_>>(),
        [
            "exec",
            "--json",
            "--skip-git-repo-check",
            "-m",
            "gpt-test",
            "-c",
            "approval_policy=\"never\"",
            "-c",
            "sandbox_mode=\"read-only\"",
            "-c",
            "check_for_update_on_startup=false",
            "-c",
            "analytics.enabled=false",
            "-c",
            "model_reasoning_effort=\"low\"",
            "--",
            "hello"
        ]
    );
    // Later turns resume the thread; a prompt that cannot be an argument goes through stdin.
    // Each turn's usage is what the thread's totals grew by.
    let t2 = b.turn("-");
    assert_eq!(
        t2.last().unwrap()["usage"],
        json!({"input_tokens": 6, "cache_read_input_tokens": 4, "output_tokens": 2})
    );
    let big = "x".repeat(200_000);
    let t3 = b.turn(&big);
    assert_eq!(t3.last().unwrap()["result"], "turn 3: 200000 bytes");
    let args2: Vec<String> = b.log("args.2").lines().map(String::from).collect();
    assert_eq!(args2[..2], ["exec", "resume"]);
    assert_eq!(args2[args2.len() - 3..], ["--", "th-1", "-"]);
    assert_eq!(b.log("prompt.2"), "-");
    assert!(b.log("args.3").ends_with("--\nth-1\n-\n"));
    assert_eq!(b.log("prompt.3").len(), 200_000);
    // Stdin closes: the bridge exits 0.
    drop(b.stdin.take());
    assert_eq!(b.wait().code(), Some(0));
}

#[test]
fn a_restarted_bridge_resumes_and_early_exits_are_errors() {
    let mut b = FakeBridge::start(Some("th-0"), &[]);
    let t = b.turn("crash now");
    assert_eq!(
        t.iter()
            .map(|v| v["type"].as_str().unwrap_or("?"))
            .collect::<Vec<_>>(),
        // codex's top-level `error` event (the bridge takes the message for the ERROR text)
        // is passed on as an unrecognized line.
        ["system", "paddock_raw", "result"]
    );
    let r = t.last().unwrap();
    assert_eq!(r["is_error"], true);
    assert_eq!(
        r["result"],
        "the model is unreachable (codex exit code 3: Error: something went wrong)"
    );
    assert_eq!(r["session_id"], "th-crash");
    let args: Vec<String> = b.log("args.1").lines().map(String::from).collect();
    assert_eq!(args[..2], ["exec", "resume"]);
    assert!(args.ends_with(&["--".into(), "th-0".into(), "crash now".into()]));
    // The thread codex reported is the one resumed next.
    let t = b.turn("fine");
    assert_eq!(t.last().unwrap()["is_error"], false);
    assert!(b.log("args.2").ends_with("--\nth-crash\nfine\n"));
    // A codex killed by a signal (not by a stop): the bridge dies the same way.
    b.send("selfkill");
    let st = b.wait();
    assert_eq!(st.signal(), Some(9), "{st:?}");
}

/// Codex puts its tools in sessions of their own, out of reach of the stop's TERM to the
/// bridge's group; they still carry the session's tag, by which the daemon ends them when the
/// bridge is gone (what `paddock::contain::kill_tree` does for a session's process).
#[test]
fn a_stop_ends_the_tool_processes_codex_left_behind() {
    let mut b = FakeBridge::start(None, &[]);
    let nap = format!("sleep {}", b.nap);
    b.send("hang");
    let tool = wait_tool(&nap);
    let pgid = nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(tool as i32))).unwrap();
    assert_ne!(pgid.as_raw() as u32, b.child.id());
    // The daemon's stop: TERM to the bridge's process group. The bridge dies by it.
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(b.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let st = b.wait();
    assert_eq!(st.signal(), Some(15), "{st:?}");
    // The tool escaped the group, not the tag.
    assert!(paddock::contain::kill_tree(b.child.id(), &b.tag) >= 1);
    let deadline = Instant::now() + WAIT;
    while !processes_with(&nap).is_empty() {
        assert!(Instant::now() < deadline, "the tool outlived the stop");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A tool's background process outlives its turn (a server the model started), and ends with
/// the session: when the bridge exits (here: its stdin closes), the tag sweep ends it.
#[test]
fn tool_processes_live_with_the_session_and_end_with_it() {
    let mut b = FakeBridge::start(None, &[]);
    let nap = format!("sleep {}", b.nap);
    let t = b.turn("orphan");
    assert_eq!(t.last().unwrap()["is_error"], false);
    let tool = wait_tool(&nap);
    std::thread::sleep(Duration::from_millis(200));
    assert!(alive(tool), "the background process died with its turn");
    drop(b.stdin.take());
    assert_eq!(b.wait().code(), Some(0));
    assert!(paddock::contain::kill_tree(b.child.id(), &b.tag) >= 1);
    let deadline = Instant::now() + WAIT;
    while !processes_with(&nap).is_empty() {
        assert!(Instant::now() < deadline, "the tool outlived the session");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_codex_config_is_obey_2004() {
    let w = World::start(vec![]).await;
    assert_refused_2004(
        &w,
        pb::SessionProvider::Codex,
        &[
            ("command", "/bin/sh"),
            ("codex_config", "model=\"x\"\nnot a setting"),
        ],
        "codex_config line 2",
    )
    .await;
}

// ── the real CLI ──────────────────────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn codex_runs_shell_and_patch_tools_and_counts_real_tokens() {
    let w = World::start(vec![]).await;
    let fake = FakeResponses::start(vec![
        Reply::shell("echo made-by-shell > shell.txt && ls")
            .thinking("Two files: one with the shell, one with a patch.")
            .usage(1200, 0, 40),
        Reply::patch(
            "*** Begin Patch\n*** Add File: hello.txt\n+hello from the fake model\n*** End Patch\n",
        )
        .saying("Now the second file.")
        .usage(1300, 1000, 30),
        Reply::text("Created shell.txt and hello.txt.").usage(2700, 2300, 20),
    ])
    .await;
    let s = w.create(codex_request(&w, &fake, None)).await;
    assert_eq!(s.status, S::Running as i32, "{s:?}");
    let acts = w.send(&s.id, "Please create two files.").await;

    assert_eq!(
        std::fs::read_to_string(w.root.join("shell.txt")).unwrap(),
        "made-by-shell\n"
    );
    assert_eq!(
        std::fs::read_to_string(w.root.join("hello.txt")).unwrap(),
        "hello from the fake model\n"
    );
    assert_eq!(
        kinds(&acts),
        [
            "THINKING",
            "TOOL_CALL",
            "TOOL_RESULT",
            "TEXT",
            "TOOL_CALL",
            "TOOL_RESULT",
            "TEXT",
            "COMPLETION"
        ],
        "{acts:#?}"
    );
    assert_eq!(acts[1].tool_name, "command_execution");
    assert!(
        acts[1].content.contains("echo made-by-shell"),
        "{}",
        acts[1].content
    );
    assert!(acts[2].tool_success, "{acts:#?}");
    assert!(acts[2].content.contains("shell.txt"), "{}", acts[2].content);
    assert_eq!(acts[1].tool_call_id, acts[2].tool_call_id);
    assert_eq!(acts[4].tool_name, "file_change");
    assert!(acts[5].tool_success);
    assert_eq!(w.redact(&acts[5].content), "add <root>/hello.txt");
    assert_eq!(acts[7].content, "Created shell.txt and hello.txt.");
    // Codex sums the turn's model calls; the input includes the cached tokens, counted once.
    assert_eq!(token_sums(&acts), (1200 + 1300 + 2700, 40 + 30 + 20));
    let info = w.get(&s.id).await;
    assert_eq!((info.tokens_input, info.tokens_output), (5200, 90));

    // What codex sent: the model, streaming, the key, the tools' outputs fed back.
    let reqs = fake.response_requests();
    assert_eq!(reqs.len(), 3, "{reqs:#?}");
    for r in &reqs {
        assert_eq!(r.body["model"], CODEX_MODEL);
        assert_eq!(r.body["stream"], true);
        assert_eq!(r.headers["authorization"], format!("Bearer {KEY}"));
        // Plain JSON bodies, not compressed.
        assert!(
            !r.headers.contains_key("content-encoding"),
            "{:?}",
            r.headers
        );
        // allow-all: no sandbox.
        assert_eq!(r.turn_metadata()["sandbox_mode"], "danger-full-access");
    }
    let tools: Vec<&str> = reqs[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(
        tools.contains(&"exec_command") && tools.contains(&"apply_patch"),
        "{tools:?}"
    );
    assert_input(
        &reqs[2],
        &[
            "Please create two files.",
            "call exec_command",
            "shell.txt",
            "Now the second file.",
            "call apply_patch",
            "Success. Updated the following files",
        ],
    );
    assert_eq!(reqs[0].user_texts(), ["Please create two files."]);
    // Nothing but /v1/responses was called.
    assert!(fake.requests().iter().all(|r| r.path == "/v1/responses"));
    // The real CLI's output, as the daemon parsed it: a new codex version that prints
    // something new or differently shows up as a reviewed diff.
    insta::assert_yaml_snapshot!("codex_tool_turn", w.render(&acts));
    w.stop(&s.id, true).await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn codex_conversation_continues_across_turns_restarts_and_daemon_crashes() {
    conversation_survives_restarts::<Codex>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn codex_permissions_become_its_sandbox() {
    let w = World::start(vec![]).await;
    let patch = "*** Begin Patch\n*** Add File: patched.txt\n+patched\n*** End Patch\n";
    let fake = FakeResponses::start(vec![
        // deny → read-only: the shell cannot write, the patch is rejected. (The command takes a
        // moment: codex 0.169 prints no command_execution item at all for a command its sandbox
        // fails within a few milliseconds — the model still gets the failure.)
        Reply::shell("sleep 1; echo denied > denied.txt"),
        Reply::patch(patch),
        Reply::text("Nothing written."),
        // allow:file_change → workspace-write: both work inside the working directory.
        Reply::shell("echo allowed > allowed.txt"),
        Reply::patch(patch),
        Reply::text("Both written."),
    ])
    .await;
    let s = w.create(codex_request(&w, &fake, Some("deny"))).await;
    let acts = w.send(&s.id, "Write two files.").await;
    assert_eq!(
        kinds(&acts),
        ["TOOL_CALL", "TOOL_RESULT", "TEXT", "COMPLETION"],
        "{acts:#?}"
    );
    assert!(!acts[1].tool_success);
    assert!(
        acts[1].content.contains("Read-only file system"),
        "{}",
        acts[1].content
    );
    assert!(!w.root.join("denied.txt").exists());
    assert!(!w.root.join("patched.txt").exists());
    let reqs = fake.response_requests();
    assert_eq!(reqs[0].turn_metadata()["sandbox_mode"], "read-only");
    // The model is told the patch was rejected.
    assert_input(&reqs[2], &["call apply_patch", "rejected"]);
    w.stop(&s.id, true).await.expect("stop");

    let s = w
        .create(codex_request(&w, &fake, Some("allow:file_change")))
        .await;
    let acts = w.send(&s.id, "Write two files.").await;
    assert_eq!(
        kinds(&acts),
        [
            "TOOL_CALL",
            "TOOL_RESULT",
            "TOOL_CALL",
            "TOOL_RESULT",
            "TEXT",
            "COMPLETION"
        ],
        "{acts:#?}"
    );
    assert!(acts[1].tool_success && acts[3].tool_success, "{acts:#?}");
    assert_eq!(
        std::fs::read_to_string(w.root.join("allowed.txt")).unwrap(),
        "allowed\n"
    );
    assert_eq!(
        std::fs::read_to_string(w.root.join("patched.txt")).unwrap(),
        "patched\n"
    );
    assert_eq!(
        fake.response_requests()[3].turn_metadata()["sandbox_mode"],
        "workspace-write"
    );
    w.stop(&s.id, true).await.expect("stop");
}

/// A client's own tool (sunbeam's client-side tools) offered to the real codex through
/// paddock's MCP server (a socket the bridge serves; codex starts `paddock __mcp-relay`, named
/// with `-c mcp_servers.paddock…`): the model calls it, the client answers it, the model reads
/// the answer. Codex 0.169 defers MCP tools behind its `tool_search` for this model, and routes
/// a call by its namespace and bare name whether or not the model searched first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn codex_calls_the_clients_tools_through_paddocks_mcp_server() {
    let w = World::start(vec![]).await;
    let fake = FakeResponses::start(vec![
        Reply::mcp("paddock", "run_tests", json!({"filter": "db"})),
        Reply::text("All green."),
    ])
    .await;
    let mut req = codex_request(&w, &fake, Some("allow-all"));
    req.provider_config
        .insert("client_tools".into(), RUN_TESTS_TOOL.into());
    let s = w.create(req).await;
    let turn = w.send_stream(&s.id, "Run the db tests.").await;
    let acts = client_tool_turn(&w, &s.id, turn).await;
    let call = acts.iter().find(|a| a.tool_name == "run_tests").unwrap();
    assert!(call.content.contains("db"), "{call:?}");
    // The second request carries the call, routed by paddock's namespace, and the client's
    // result.
    let reqs = fake.response_requests();
    assert_eq!(reqs.len(), 2, "{reqs:#?}");
    let last = reqs[1].body.to_string();
    assert!(
        last.contains("\"namespace\":\"mcp__paddock\"") && last.contains("12 passed"),
        "{last}"
    );
    w.stop(&s.id, true).await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn codex_failed_turns_are_errors_and_the_session_goes_on() {
    let w = World::start(vec![]).await;
    let fake = FakeResponses::start(vec![
        Reply::error(500),
        Reply::error(400),
        Reply::Failed("the model fell over".into()),
        Reply::text("Recovered."),
    ])
    .await;
    let s = w.create(codex_request(&w, &fake, None)).await;
    let mut errors = Vec::new();
    for msg in ["one", "two", "three"] {
        let acts = w.send(&s.id, msg).await;
        assert_eq!(kinds(&acts), ["ERROR"], "{acts:#?}");
        errors.push(acts[0].content.clone());
        let info = w.get(&s.id).await;
        assert_eq!(info.status, S::Running as i32, "{info:?}");
        assert_eq!(info.pid, s.pid);
    }
    // Codex's own words for each: a 5xx, the API's error JSON for a 4xx, a failed response.
    assert!(errors[0].starts_with("codex: error: "), "{}", errors[0]);
    assert!(
        errors[1].contains("fake 400 from the paddock test server"),
        "{}",
        errors[1]
    );
    assert!(errors[2].contains("the model fell over"), "{}", errors[2]);
    insta::assert_yaml_snapshot!(
        "codex_api_errors",
        errors
            .iter()
            .map(|e| w.redact(e).replace(&fake.addr.to_string(), "<fake-server>"))
            .collect::<Vec<_>>()
    );
    let acts = w.send(&s.id, "four").await;
    assert_eq!(kinds(&acts), ["TEXT", "COMPLETION"], "{acts:#?}");
    // The failed turns belong to the thread: the fourth request carries them.
    let reqs = fake.response_requests();
    assert_eq!(reqs.len(), 4);
    assert_eq!(reqs[3].user_texts(), ["one", "two", "three", "four"]);

    // A thread codex no longer has (its CODEX_HOME lost): the turn is an ERROR with codex's
    // stderr, and the session lives on.
    std::fs::remove_dir_all(w.dir_outside_tmp("paddock-test-codex-").join("sessions")).unwrap();
    let acts = w.send(&s.id, "five").await;
    assert_eq!(kinds(&acts), ["ERROR"], "{acts:#?}");
    assert!(
        acts[0].content.contains("exit code 1")
            && acts[0].content.contains("no rollout found for thread id"),
        "{}",
        acts[0].content
    );
    assert!(
        !acts[0].content.contains("Stack backtrace"),
        "{}",
        acts[0].content
    );
    assert_eq!(w.get(&s.id).await.status, S::Running as i32);
    w.stop(&s.id, true).await.expect("stop");
}

/// codex behind paddock's bridge against the fake Responses API, as the shared scenarios
/// drive it.
pub(crate) struct Codex {
    w: World,
    fake: FakeResponses,
}

impl Kit for Codex {
    fn push_text(&self, text: &str) {
        self.fake.push([Reply::text(text)]);
    }

    // Codex reports usage with the turn's end: the turn completes with its real counts, and
    // then the session fails.
    const BUDGET_TURN: &'static [&'static str] =
        &["TOOL_CALL", "TOOL_RESULT", "TEXT", "COMPLETION"];
    async fn start() -> Self {
        let w = World::start(vec![]).await;
        let fake = FakeResponses::start(vec![]).await;
        Codex { w, fake }
    }

    fn world(&self) -> &World {
        &self.w
    }

    fn world_mut(&mut self) -> &mut World {
        &mut self.w
    }

    fn push_hang(&self) {
        self.fake.push([Reply::Hang]);
    }

    async fn wait_model_requests(&self, n: usize) {
        self.fake.wait_requests(n, WAIT).await;
    }

    /// The bridge's child: codex (its npm launcher). (Tool processes codex orphaned may be the
    /// bridge's children too, as zombies until it reaps them: they have no command line.)
    async fn agent(&self, s: &pb::SessionInfo) -> u32 {
        let codex: Vec<u32> = children_of(s.pid as u32)
            .into_iter()
            .filter(|p| cmdline(*p).contains(" exec "))
            .collect();
        assert_eq!(codex.len(), 1, "{codex:?}");
        codex[0]
    }

    /// Nothing of codex is left behind.
    async fn after_end(&self, _asked: usize) {
        wait_no_process(
            &format!("base_url=\"{}\"", self.fake.base_url()),
            Duration::from_secs(5),
        )
        .await;
    }

    fn push_shell_turn(&self, command: &str, text: &str, usage: Option<[(u64, u64); 2]>) {
        // Codex's own timeout for the command: long enough never to end it first.
        let call = Reply::shell_waiting(command, 600_000);
        self.fake
            .push(costing([call, Reply::text(text)], usage, |r, i, o| {
                r.usage(i, 0, o)
            }));
    }

    fn request(&self) -> pb::CreateSessionRequest {
        codex_request(&self.w, &self.fake, None)
    }

    /// The turn's tokens come with its end, on its completion.
    fn budget_turn(&self, acts: &[pb::SessionActivityEvent]) {
        assert_eq!((acts[3].tokens_input, acts[3].tokens_output), (3100, 20));
    }

    /// Codex runs the tool in a session of its own, out of the bridge's process group: what
    /// ends it is the session's containment, not the group's signal.
    fn tool_started(&self, s: &pb::SessionInfo, tool: u32) {
        let sid = nix::unistd::getsid(Some(nix::unistd::Pid::from_raw(tool as i32))).unwrap();
        assert_ne!(sid.as_raw(), s.pid);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn codex_stop_during_a_tool_call_ends_the_tool_and_the_agent() {
    stop_during_a_tool_call::<Codex>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn codex_killed_mid_turn_is_obey_2031() {
    killed_mid_turn::<Codex>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn codex_token_budget_crossed_by_real_usage_fails_the_session() {
    budget_crossed_by_real_usage::<Codex>().await;
}

impl Conversation for Codex {
    // What codex sends after the crash: the thread's input as it keeps it.
    const AFTER_CRASH: &'static [&'static str] = &["swordfish", "And now?", "And after the crash?"];

    fn sent(&self) -> Vec<Sent> {
        let sent = self.fake.response_requests();
        sent.iter()
            .map(|r| Sent {
                texts: r.texts(),
                conversation: Some(thread_of(r)),
            })
            .collect()
    }
}
