//! Claude Code, for real: the npm CLI (pinned in tests/npm/package.json) against the fake
//! Anthropic server, supervised by the real daemon.
//!
//! Facts of the CLI these tests rely on (2.1.330): `ANTHROPIC_BASE_URL` points it at the fake
//! server, any `ANTHROPIC_API_KEY` and `--model` name work, `CLAUDE_CODE_MAX_RETRIES=0` makes
//! a 5xx / 429 / 529 end the turn at once (by default it retries 10 times with back-off), and
//! its conversations live under `$HOME/.claude/projects/<cwd>/` (HOME is the test's tempdir).

use paddock_proto::obey::local::v1 as pb;
use pb::SessionStatus as S;
use serde_json::{json, Value};

use crate::fake_anthropic::{Recorded, Reply};
use crate::harness::*;
use crate::scenarios::{
    budget_crossed_by_real_usage, conversation_survives_restarts, killed_mid_turn,
    model_api_errors, push_bash_turn, stop_during_a_tool_call, ApiErrors, Conversation, Kit,
};

/// Asserts that `expected` appear in the conversation `r` sent, in this order (other texts may
/// come between them: the CLI adds system reminders).
#[track_caller]
fn assert_conversation(r: &Recorded, expected: &[&str]) {
    assert_in_order(&r.texts(), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn tool_turn_changes_files_and_counts_real_tokens() {
    let w = World::start(vec![]).await;
    let hello = w.root.join("hello.txt");
    w.fake.push([
        Reply::tool(
            "Bash",
            json!({"command": "echo made-by-bash > bash.txt && ls", "description": "Create bash.txt"}),
        )
        .thinking("Two files: one with Bash, one with Write.")
        .usage(1200, 0, 40),
        Reply::tool(
            "Write",
            json!({"file_path": hello.display().to_string(), "content": "hello from the fake model\n"}),
        )
        .saying("Now the second file.")
        .usage(300, 1000, 30),
        Reply::text("Created bash.txt and hello.txt.").usage(400, 2300, 20),
    ]);
    let s = w.claude().await;
    assert_eq!(s.status, S::Running as i32, "{s:?}");
    let acts = w.send(&s.id, "Please create two files.").await;

    // The tools really ran, in the campaign directory.
    assert_eq!(
        std::fs::read_to_string(w.root.join("bash.txt")).unwrap(),
        "made-by-bash\n"
    );
    assert_eq!(
        std::fs::read_to_string(&hello).unwrap(),
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
    assert!(acts[2].tool_success && acts[5].tool_success, "{acts:#?}");
    assert_eq!(acts[1].tool_call_id, acts[2].tool_call_id);
    // Token deltas add up to the real totals of the `result` line: every message's input
    // (cache reads included) and final output.
    assert_eq!(token_sums(&acts), (1200 + 1300 + 2700, 40 + 30 + 20));
    let info = w.get(&s.id).await;
    assert_eq!((info.tokens_input, info.tokens_output), (5200, 90));

    // What the CLI sent: the model asked for, streaming, three calls, the tool results fed back.
    let reqs = w.fake.message_requests();
    assert_eq!(reqs.len(), 3, "{reqs:#?}");
    for r in &reqs {
        assert_eq!(r.body["model"], MODEL);
        assert_eq!(r.body["stream"], true);
        assert_eq!(r.headers["x-api-key"], "sk-ant-paddock-test");
    }
    assert_conversation(
        &reqs[2],
        &[
            "Please create two files.",
            "tool_use Bash",
            "bash.txt",
            "tool_use Write",
            "File created successfully",
        ],
    );
    // Nothing but /v1/messages was called.
    assert!(w
        .fake
        .requests()
        .iter()
        .all(|r| r.path.starts_with("/v1/messages")));

    insta::assert_yaml_snapshot!("claude_tool_turn", w.render(&acts));
    w.stop(&s.id, true).await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn conversation_continues_across_turns_session_restarts_and_daemon_crashes() {
    conversation_survives_restarts::<Claude>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn model_api_errors_end_the_turn_with_an_error() {
    model_api_errors::<Claude>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn max_turns_ends_the_turn_with_an_error() {
    let w = World::start(vec![
        Reply::tool(
            "Bash",
            json!({"command": "echo one > one.txt", "description": "One"}),
        )
        .usage(200, 0, 20),
        Reply::text("Second answer."),
    ])
    .await;
    let mut req = w.claude_request();
    req.environment
        .insert("CLAUDE_CODE_MAX_TURNS".into(), "1".into());
    let s = w.create(req).await;
    let acts = w.send(&s.id, "Do two things.").await;
    assert_eq!(
        kinds(&acts),
        ["TOOL_CALL", "TOOL_RESULT", "ERROR"],
        "{acts:#?}"
    );
    assert_eq!(
        acts[2].content,
        "claude: error_max_turns: Reached maximum number of turns (1)"
    );
    // The real totals arrive with the error.
    assert_eq!(token_sums(&acts), (200, 20));
    assert_eq!(w.get(&s.id).await.status, S::Running as i32);
    // The next message is a new turn of the same conversation.
    let acts = w.send(&s.id, "Go on.").await;
    assert_eq!(kinds(&acts), ["TEXT", "COMPLETION"], "{acts:#?}");
    w.stop(&s.id, true).await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn agent_killed_mid_turn_is_obey_2031() {
    killed_mid_turn::<Claude>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn token_budget_crossed_by_real_usage_fails_the_session() {
    budget_crossed_by_real_usage::<Claude>().await;
}

/// Claude Code, as the shared scenarios (`scenarios.rs`) drive it.
pub(crate) struct Claude(World);

impl Kit for Claude {
    const BUDGET_TOKENS: (i64, i64) = (3100, 2);
    const WORD: &'static str = "claude";

    async fn start() -> Self {
        Claude(World::start(vec![]).await)
    }

    fn world(&self) -> &World {
        &self.0
    }

    fn world_mut(&mut self) -> &mut World {
        &mut self.0
    }

    fn push_hang(&self) {
        self.0.fake.push([Reply::hang()]);
    }

    async fn wait_model_requests(&self, n: usize) {
        self.0.fake.wait_requests(n, WAIT).await;
    }

    async fn agent(&self, s: &pb::SessionInfo) -> u32 {
        s.pid as u32
    }

    fn push_shell_turn(&self, command: &str, text: &str, usage: Option<[(u64, u64); 2]>) {
        push_bash_turn(&self.0, command, text, usage);
    }

    fn request(&self) -> pb::CreateSessionRequest {
        self.0.claude_request()
    }

    /// The budget was crossed by the real usage of the second API call, mid-turn (1500 + 1,
    /// then 1600 + 1).
    fn budget_turn(&self, acts: &[pb::SessionActivityEvent]) {
        assert_eq!((acts[0].tokens_input, acts[0].tokens_output), (1500, 1));
        assert_eq!((acts[2].tokens_input, acts[2].tokens_output), (1600, 1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn stop_during_a_tool_call_ends_the_tool_and_the_agent() {
    stop_during_a_tool_call::<Claude>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn permission_policy_answers_the_cli_on_stdin() {
    let w = World::start(vec![]).await;
    let denied = w.root.join("denied.txt");
    w.fake.push([
        Reply::tool(
            "Write",
            json!({"file_path": denied.display().to_string(), "content": "no\n"}),
        ),
        Reply::tool(
            "Bash",
            json!({"command": "echo allowed > allowed.txt", "description": "Allowed"}),
        ),
        Reply::text("One of two."),
    ]);
    let mut req = w.claude_request();
    req.provider_config
        .insert("permissions".into(), "allow:Bash,Read".into());
    let s = w.create(req).await;
    let acts = w.send(&s.id, "Write both files.").await;
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
    assert!(!acts[1].tool_success);
    assert_eq!(
        acts[1].content,
        "paddock: the session's permission policy denies Write"
    );
    assert!(acts[3].tool_success, "{acts:#?}");
    assert!(!denied.exists());
    assert_eq!(
        std::fs::read_to_string(w.root.join("allowed.txt")).unwrap(),
        "allowed\n"
    );
    insta::assert_yaml_snapshot!("claude_permissions", w.render(&acts));
    w.stop(&s.id, true).await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn a_human_approves_denies_and_answers_the_real_cli() {
    let w = World::start(vec![]).await;
    let denied = w.root.join("denied.txt");
    w.fake.push([
        Reply::tool(
            "Write",
            json!({"file_path": denied.display().to_string(), "content": "no\n"}),
        ),
        Reply::tool(
            "Bash",
            json!({"command": "echo approved > approved.txt", "description": "Approved"}),
        ),
        Reply::tool(
            "AskUserQuestion",
            json!({"questions": [{"question": "Which database?", "header": "DB",
                "options": [{"label": "PostgreSQL 15", "description": "as CI"},
                            {"label": "PostgreSQL 14", "description": "as the test"}],
                "multiSelect": false}]}),
        ),
        Reply::text("Done."),
    ]);
    let mut req = w.claude_request();
    req.provider_config
        .insert("permissions".into(), "ask:Read".into());
    let s = w.create(req).await;
    let turn = w.send_stream(&s.id, "Write both files, then ask me.").await;
    let write = resolve_next(&w, &s.id, pb::ApprovalDecision::Deny, "not that file").await;
    assert_eq!(write.tool_name, "Write");
    assert!(write.summary.starts_with("Write: "), "{}", write.summary);
    let bash = resolve_next(&w, &s.id, pb::ApprovalDecision::Approve, "").await;
    assert_eq!(bash.summary, "Bash: echo approved > approved.txt");
    let q = resolve_next(&w, &s.id, pb::ApprovalDecision::Answer, "PostgreSQL 15").await;
    assert_eq!(q.kind, pb::ApprovalKind::Question as i32);
    assert_eq!(q.summary, "Which database? [PostgreSQL 15 / PostgreSQL 14]");
    let acts = collect(turn).await;
    let results: Vec<(bool, String)> = acts
        .iter()
        .filter(|a| kind(a) == "TOOL_RESULT")
        .map(|a| (a.tool_success, a.content.clone()))
        .collect();
    assert_eq!(results.len(), 3, "{acts:#?}");
    assert_eq!(results[0], (false, "not that file".to_string()));
    assert!(results[1].0, "{acts:#?}");
    assert!(results[2].1.contains("PostgreSQL 15"), "{acts:#?}");
    assert_eq!(kind(acts.last().unwrap()), "COMPLETION");
    assert!(!denied.exists());
    assert_eq!(
        std::fs::read_to_string(w.root.join("approved.txt")).unwrap(),
        "approved\n"
    );
    // What the model was told, in the real CLI's own words.
    let sent = w.fake.requests();
    let last = serde_json::to_string(&sent.last().unwrap().body).unwrap();
    assert!(last.contains("PostgreSQL 15"), "{last}");
    assert_eq!(status_name(w.get(&s.id).await.status), "RUNNING");
    w.stop(&s.id, true).await.expect("stop");
}

/// A client's own tool (sunbeam's client-side tools) offered to the real Claude Code through
/// paddock's MCP server on the control channel: the model calls it, the client answers it, the
/// model reads the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn the_real_cli_calls_the_clients_tools_through_paddocks_mcp_server() {
    let w = World::start(vec![
        Reply::tool("mcp__paddock__run_tests", json!({"filter": "db"})),
        Reply::text("All green."),
    ])
    .await;
    let mut req = w.claude_request();
    req.provider_config
        .insert("permissions".into(), "ask".into());
    req.provider_config
        .insert("client_tools".into(), RUN_TESTS_TOOL.into());
    let s = w.create(req).await;
    let turn = w.send_stream(&s.id, "Run the db tests.").await;
    client_tool_turn(&w, &s.id, turn).await;
    // The model was told of the tool (Claude Code names it mcp__paddock__run_tests, and lists
    // MCP tools by name for its tool search rather than in `tools`) and read the client's
    // result.
    let sent = w.fake.requests();
    let first = serde_json::to_string(&sent[0].body).unwrap();
    assert!(first.contains("mcp__paddock__run_tests"), "{first}");
    let last = serde_json::to_string(&sent.last().unwrap().body).unwrap();
    assert!(last.contains("12 passed"), "{last}");
    w.stop(&s.id, true).await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn a_lost_conversation_fails_the_resume_with_the_cli_stderr() {
    let w = World::start(vec![Reply::text("First.")]).await;
    let s = w.claude().await;
    w.send(&s.id, "Hello.").await;
    w.stop(&s.id, true).await.expect("stop");
    // The CLI keeps its conversations under $HOME/.claude/projects/<cwd>/: lose them.
    let projects = w.home.join(".claude/projects");
    assert!(projects.is_dir(), "no {}", projects.display());
    std::fs::remove_dir_all(&projects).unwrap();
    // The CLI exits before it answers paddock's ready request: the restart's start failed.
    w.restart_refused(&s.id).await;
    let f = w.wait_status(&s.id, S::Failed).await;
    assert_eq!(f.error_code, "OBEY-2004", "{f:?}");
    assert!(
        f.error_message.contains("exited before it was ready")
            && f.error_message.contains("exit code 1")
            && f.error_message
                .contains("No conversation found with session ID"),
        "{}",
        f.error_message
    );
}

/// A session is RUNNING when the real CLI answered paddock's ready request (its `mcp_status`
/// control request, before any message); a CLI that dies at start — here on a flag it does
/// not know — refuses CreateSession with OBEY-2004 and its stderr, and leaves no session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn a_cli_that_dies_at_start_refuses_the_create_with_2004() {
    let w = World::start(vec![]).await;
    let mut req = w.claude_request();
    req.provider_config.insert(
        "command".into(),
        format!("{} --no-such-flag", claude_bin().display()),
    );
    let e = within(w.client().await.create_session(req))
        .await
        .expect_err("refused");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().starts_with("OBEY-2004: ")
            && e.message().contains("exited before it was ready")
            && e.message().contains("unknown option '--no-such-flag'"),
        "{}",
        e.message()
    );
    let all = w.all_sessions().await;
    assert!(all.is_empty(), "a refused create left {all:?}");
    // The same CLI without the bad flag answers and runs.
    let s = w.claude().await;
    assert_eq!(s.status, S::Running as i32, "{s:?}");
    w.stop(&s.id, true).await.expect("stop");
}

/// No CLI needed: a missing binary is refused at CreateSession with OBEY-2004, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_cli_binary_is_obey_2004() {
    let w = World::start(vec![]).await;
    let missing = "/nonexistent/claude-paddock-missing";
    assert_refused_2004(
        &w,
        pb::SessionProvider::ClaudeCode,
        &[("command", missing)],
        missing,
    )
    .await;
}

/// The CLI's real stdout, line by line, through the adapter (`providers::plan` and its
/// parser, without the daemon), as a snapshot: a new CLI version that prints something new or
/// differently shows up as a reviewed diff. With `PADDOCK_RECORD_FIXTURES=1` the transcript is
/// also written to `shell/agents/src/testdata/claude_recorded.jsonl`, which the parser's unit
/// tests read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn real_stream_json_through_the_adapter() {
    use paddock::providers::{self, Parsed};
    use paddock_core::{Provider, ProviderEvent, SessionConfig, SpawnSpec};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    let w = World::start(vec![]).await;
    let hello = w.root.join("hello.txt");
    w.fake.push([
        Reply::tool(
            "Bash",
            json!({"command": "ls", "description": "List the project"}),
        )
        .thinking("Let me look around first.")
        .usage(900, 0, 25),
        Reply::tool(
            "Write",
            json!({"file_path": hello.display().to_string(), "content": "hi\n"}),
        )
        .usage(50, 900, 15),
        Reply::text("Listed and wrote hello.txt.").usage(60, 950, 12),
        Reply::error(500),
        Reply::text("Second turn."),
    ]);
    let mut config = SessionConfig::new("c", Provider::ClaudeCode, &w.root.display().to_string());
    config.model = MODEL.into();
    config
        .provider_config
        .insert("command", claude_bin().display().to_string())
        .expect("not a setting");
    config.environment = w.claude_env().into_iter().collect();
    let spec = SpawnSpec {
        config,
        resume: None,
        restart_count: 0,
    };
    let (plan, mut parser) = providers::plan(&spec, std::path::Path::new(BIN)).expect("plan");
    let mut child = tokio::process::Command::new(&plan.program)
        .args(&plan.args)
        .current_dir(&plan.cwd)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &w.home)
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn claude");
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let messages = [
        "List the project, then write hello.txt.",
        "Again?",
        "Once more.",
    ];
    let mut transcript = Vec::new();
    let mut rendered = Vec::new();
    let mut claude_session = String::new();
    for (turn, m) in messages.iter().enumerate() {
        let line = providers::user_message_line(m) + "\n";
        stdin.write_all(line.as_bytes()).await.unwrap();
        loop {
            let Some(l) = within(lines.next_line()).await.unwrap() else {
                panic!("the CLI closed its stdout in turn {turn}");
            };
            transcript.push(l.clone());
            let v: Value = serde_json::from_str(&l).unwrap_or(Value::Null);
            let what = format!(
                "{}{}",
                v["type"].as_str().unwrap_or("?"),
                v["subtype"]
                    .as_str()
                    .or(v["request"]["subtype"].as_str())
                    .map(|s| format!("/{s}"))
                    .unwrap_or_default()
            );
            let mut items = Vec::new();
            for p in parser.parse_line(&l) {
                items.push(match p {
                    Parsed::Event(ProviderEvent::SessionRef(id)) => {
                        claude_session = id;
                        json!({"session_ref": "<claude session id>"})
                    }
                    Parsed::Event(ProviderEvent::Activity(a)) => {
                        let mut o = json!({
                            "type": a.kind().name(),
                            "content": w.redact(&a.content),
                        });
                        if !a.tool_name.is_empty() {
                            o["tool"] = json!(a.tool_name);
                        }
                        if a.tokens_input != 0 || a.tokens_output != 0 {
                            o["tokens"] = json!([a.tokens_input, a.tokens_output]);
                        }
                        o
                    }
                    // A permission prompt goes to the core; answered here as the core does
                    // for the default policy (allow-all).
                    Parsed::Event(ProviderEvent::Ask(paddock_core::Ask {
                        key,
                        kind,
                        tool,
                        input,
                        summary,
                        ..
                    })) => {
                        let input: Value = serde_json::from_str(&input).unwrap();
                        let r = paddock::providers::claude_stream::control_response_allow(
                            &key, &input,
                        );
                        // Twice: a daemon that restarted sends an adopted agent its answers
                        // again (at least once), and the CLI must ignore the repeat.
                        stdin.write_all((r.clone() + "\n").as_bytes()).await.unwrap();
                        stdin.write_all((r + "\n").as_bytes()).await.unwrap();
                        json!({"ask": tool, "kind": kind.name(), "summary": w.redact(&summary), "reply": "allow"})
                    }
                    Parsed::Event(other) => json!({"event": format!("{other:?}")}),
                    Parsed::Reply(r) => {
                        let answer: Value = serde_json::from_str(&r).unwrap();
                        stdin.write_all((r + "\n").as_bytes()).await.unwrap();
                        json!({"reply": answer["response"]["response"]["behavior"]})
                    }
                    Parsed::Unrecognized(_) => json!("unrecognized"),
                });
            }
            rendered.push(json!({ "line": what, "parsed": items }));
            if v["type"] == "result" {
                break;
            }
        }
    }
    drop(stdin);
    let _ = within(child.wait()).await;
    assert!(hello.exists());
    assert!(!claude_session.is_empty());

    if std::env::var_os("PADDOCK_RECORD_FIXTURES").is_some() {
        let root = w.root.display().to_string();
        let text: String = transcript
            .iter()
            .map(|l| {
                l.replace(&root, "/home/dev/proj")
                    .replace(&w.home.display().to_string(), "/home/dev")
                    .replace(&w.fake.addr.to_string(), "127.0.0.1:8080")
                    + "\n"
            })
            .collect();
        let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("agents/src/testdata/claude_recorded.jsonl");
        std::fs::write(&out, text).unwrap();
        eprintln!("recorded {} lines to {}", transcript.len(), out.display());
    }
    insta::assert_yaml_snapshot!("claude_real_stream", Value::Array(rendered));
}

impl ApiErrors for Claude {
    const SNAPSHOT: &'static str = "claude_api_errors";
    const AGENT: &'static str = "claude";
    const TURNS: &'static [Option<u16>] = &[Some(500), Some(429), Some(529), None, Some(400)];
}

impl Conversation for Claude {
    // The CLI sends the whole conversation again after the crash.
    const AFTER_CRASH: &'static [&'static str] = &[
        "Remember the word swordfish.",
        "Noted: swordfish.",
        "What was the word?",
        "You said swordfish.",
        "And now?",
        "Still swordfish after a session restart.",
        "And after the crash?",
    ];
}
