//! The openai-api provider, for real: paddock's own agent loop (`paddock __bridge openai`)
//! against the fake Chat Completions server (`fake_openai.rs`), supervised by the real daemon.
//! No npm CLI is involved, so none of these tests is ignored.
//!
//! Each test's session gets `base_url` = the fake server, `max_retries` = 0 (unless the test is
//! about retries) and `OPENAI_API_KEY` in its environment; the conversation is saved under the
//! test's `$HOME/.local/state/paddock/openai-api/`.

use paddock_proto::obey::local::v1 as pb;
use pb::SessionStatus as S;
use serde_json::{json, Value};

use crate::fake_openai::{FakeOpenAi, Recorded, Reply};
use crate::harness::*;
use crate::scenarios::{
    budget_crossed_by_real_usage, conversation_survives_restarts, costing, killed_mid_turn,
    model_api_errors, stop_during_a_tool_call, ApiErrors, Conversation, Kit, Sent,
};

/// The model sessions ask for: it must reach the server unchanged.
const MODEL: &str = "gpt-paddock-test";
const KEY: &str = "sk-paddock-openai-test";

async fn start(script: Vec<Reply>) -> (World, FakeOpenAi) {
    let w = World::start(vec![]).await;
    let fake = FakeOpenAi::start(script).await;
    (w, fake)
}

fn request(w: &World, fake: &FakeOpenAi) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        campaign_id: w.campaign_id.clone(),
        provider: pb::SessionProvider::OpenaiApi as i32,
        model: MODEL.into(),
        provider_config: [
            ("base_url".to_string(), fake.base_url()),
            ("max_retries".to_string(), "0".to_string()),
        ]
        .into_iter()
        .collect(),
        environment: [("OPENAI_API_KEY".to_string(), KEY.to_string())]
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

/// Asserts that `expected` appear in the conversation `r` sent, in this order.
#[track_caller]
fn assert_conversation(r: &Recorded, expected: &[&str]) {
    assert_in_order(&r.texts(), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_tool_turn_changes_files_and_counts_real_tokens() {
    let (w, fake) = start(vec![
        Reply::tool(
            "write_file",
            json!({"path": "hello.txt", "content": "hello from the fake model\n"}),
        )
        .reasoning("Two files: one with write_file, one with shell.")
        .usage(1200, 0, 40),
        Reply::tool(
            "shell",
            json!({"command": "echo made-by-shell > shell.txt && ls"}),
        )
        .saying("Now the second file.")
        .usage(1300, 1000, 30),
        Reply::text("Created hello.txt and shell.txt.").usage(1400, 1200, 20),
    ])
    .await;
    let s = w.create(request(&w, &fake)).await;
    assert_eq!(s.status, S::Running as i32, "{s:?}");
    let acts = w.send(&s.id, "Please create two files.").await;

    assert_eq!(
        std::fs::read_to_string(w.root.join("hello.txt")).unwrap(),
        "hello from the fake model\n"
    );
    assert_eq!(
        std::fs::read_to_string(w.root.join("shell.txt")).unwrap(),
        "made-by-shell\n"
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
    assert_eq!(acts[2].tool_name, "write_file");
    assert_eq!(acts[5].tool_name, "shell");
    // Every call's prompt tokens (cached ones included) and completion tokens, as the API
    // reported them, each on the first activity of its call.
    assert_eq!(token_sums(&acts), (1200 + 1300 + 1400, 40 + 30 + 20));
    assert_eq!((acts[0].tokens_input, acts[0].tokens_output), (1200, 40));
    assert_eq!((acts[3].tokens_input, acts[3].tokens_output), (1300, 30));
    let info = w.get(&s.id).await;
    assert_eq!((info.tokens_input, info.tokens_output), (3900, 90));

    // What the bridge sent: the model, streaming with usage, the tools, the key.
    let reqs = fake.completions();
    assert_eq!(reqs.len(), 3, "{reqs:#?}");
    for r in &reqs {
        assert_eq!(r.body["model"], MODEL);
        assert_eq!(r.body["stream"], true);
        assert_eq!(r.body["stream_options"]["include_usage"], true);
        assert_eq!(r.headers["authorization"], format!("Bearer {KEY}"));
        let tools: Vec<_> = r.body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(tools, ["shell", "read_file", "write_file", "list_dir"]);
    }
    assert_eq!(reqs[0].body["messages"][0]["role"], "system");
    assert_conversation(
        &reqs[2],
        &[
            "user: Please create two files.",
            "assistant: tool_call write_file",
            "tool: wrote 26 bytes to hello.txt",
            "assistant: Now the second file.",
            "assistant: tool_call shell",
            "tool: README.md\nhello.txt\nshell.txt\nsrc\n",
        ],
    );
    assert!(fake
        .requests()
        .iter()
        .all(|r| r.path == "/v1/chat/completions"));

    insta::assert_yaml_snapshot!("openai_tool_turn", w.render(&acts));
    w.stop(&s.id, true).await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_conversation_continues_across_turns_session_restarts_and_daemon_crashes() {
    conversation_survives_restarts::<OpenAi>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_api_errors_end_the_turn_with_an_error() {
    model_api_errors::<OpenAi>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_retries_are_bounded_and_shown_and_an_unreachable_endpoint_is_an_error() {
    let (w, fake) = start(vec![
        Reply::error(503),
        Reply::text("After one retry."),
        Reply::error(500),
        Reply::error(502),
    ])
    .await;
    let mut req = request(&w, &fake);
    req.provider_config.insert("max_retries".into(), "1".into());
    req.provider_config
        .insert("retry_backoff_ms".into(), "10".into());
    let s = w.create(req).await;
    let acts = w.send(&s.id, "Try.").await;
    assert_eq!(kinds(&acts), ["STATUS", "TEXT", "COMPLETION"], "{acts:#?}");
    assert_eq!(
        acts[0].content,
        "API error 503 (fake 503 from the paddock test server); retry 1 of 1 in 10 ms"
    );
    let acts = w.send(&s.id, "Again.").await;
    assert_eq!(kinds(&acts), ["STATUS", "ERROR"], "{acts:#?}");
    assert!(acts[1]
        .content
        .starts_with("openai-api: API error status 502"));
    assert_eq!(fake.completions().len(), 4);

    // Nothing listens at the endpoint: an ERROR, and the session stays usable.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut req = request(&w, &fake);
    req.provider_config
        .insert("base_url".into(), format!("http://127.0.0.1:{port}/v1"));
    let s2 = w.create(req).await;
    let acts = w.send(&s2.id, "Anyone?").await;
    assert_eq!(kinds(&acts), ["ERROR"], "{acts:#?}");
    assert!(
        acts[0].content.contains("/v1/chat/completions"),
        "{}",
        acts[0].content
    );
    assert_eq!(w.get(&s2.id).await.status, S::Running as i32);
    w.stop(&s.id, true).await.expect("stop");
    w.stop(&s2.id, true).await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_bridge_killed_mid_turn_is_obey_2031() {
    killed_mid_turn::<OpenAi>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_token_budget_crossed_by_real_usage_fails_the_session() {
    budget_crossed_by_real_usage::<OpenAi>().await;
}

/// paddock's own agent loop against the fake OpenAI API, as the shared scenarios drive it.
pub(crate) struct OpenAi {
    w: World,
    fake: FakeOpenAi,
}

impl Kit for OpenAi {
    fn push_text(&self, text: &str) {
        self.fake.push([Reply::text(text)]);
    }

    async fn start() -> Self {
        let (w, fake) = start(vec![]).await;
        OpenAi { w, fake }
    }

    fn world(&self) -> &World {
        &self.w
    }

    fn world_mut(&mut self) -> &mut World {
        &mut self.w
    }

    fn push_hang(&self) {
        self.fake.push([Reply::hang()]);
    }

    async fn wait_model_requests(&self, n: usize) {
        self.fake.wait_requests(n, WAIT).await;
    }

    /// The bridge is the agent: paddock's own loop.
    async fn agent(&self, s: &pb::SessionInfo) -> u32 {
        s.pid as u32
    }

    fn push_shell_turn(&self, command: &str, text: &str, usage: Option<[(u64, u64); 2]>) {
        let call = Reply::tool("shell", json!({"command": command}));
        self.fake
            .push(costing([call, Reply::text(text)], usage, |r, i, o| {
                r.usage(i, 0, o)
            }));
    }

    fn request(&self) -> pb::CreateSessionRequest {
        request(&self.w, &self.fake)
    }

    /// Each answer carries its own usage: the second crosses the budget mid-turn.
    fn budget_turn(&self, acts: &[pb::SessionActivityEvent]) {
        assert_eq!((acts[0].tokens_input, acts[0].tokens_output), (1500, 10));
        assert_eq!((acts[2].tokens_input, acts[2].tokens_output), (1600, 10));
    }

    /// The loop asked the model no more than the turn needed (a stop cut the turn at its
    /// first call; a budget crossed by the second answer is the turn's end).
    async fn after_end(&self, asked: usize) {
        assert_eq!(self.fake.completions().len(), asked);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_stop_during_a_slow_shell_tool_ends_the_tool_and_the_bridge() {
    stop_during_a_tool_call::<OpenAi>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_path_escapes_are_refused() {
    let (w, fake) = start(vec![]).await;
    // Outside the campaign root: a secret beside it, and a symlink from inside to outside.
    std::fs::write(w.base.join("secret.txt"), "the secret\n").unwrap();
    std::os::unix::fs::symlink(&w.base, w.root.join("out")).unwrap();
    let abs = w.base.join("abs.txt");
    fake.push([
        Reply::tool(
            "write_file",
            json!({"path": "../escaped.txt", "content": "x"}),
        )
        .and_tool(
            "write_file",
            json!({"path": abs.display().to_string(), "content": "x"}),
        )
        .and_tool(
            "write_file",
            json!({"path": "out/linked.txt", "content": "x"}),
        )
        .and_tool("read_file", json!({"path": "out/secret.txt"}))
        .and_tool("list_dir", json!({"path": "../"})),
        Reply::text("All refused."),
    ]);
    let s = w.create(request(&w, &fake)).await;
    let acts = w.send(&s.id, "Escape.").await;
    let results: Vec<_> = acts.iter().filter(|a| kind(a) == "TOOL_RESULT").collect();
    assert_eq!(results.len(), 5, "{acts:#?}");
    for r in &results {
        assert!(!r.tool_success, "{r:?}");
        assert!(
            r.content.contains("outside the working directory"),
            "{}",
            r.content
        );
        assert!(!r.content.contains("the secret"), "{}", r.content);
    }
    assert!(!w.base.join("escaped.txt").exists());
    assert!(!abs.exists());
    assert!(!w.base.join("linked.txt").exists());
    assert_eq!(kind(acts.last().unwrap()), "COMPLETION");
    // The model was told, call by call.
    let tool_messages: Vec<_> = fake.completions()[1]
        .texts()
        .into_iter()
        .filter(|t| t.starts_with("tool: "))
        .collect();
    assert_eq!(tool_messages.len(), 5, "{tool_messages:#?}");
    insta::assert_yaml_snapshot!("openai_path_escapes", w.render(&acts));
    w.stop(&s.id, true).await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_asks_a_human_and_has_the_client_run_its_tools() {
    let (w, fake) = start(vec![
        Reply::tool("shell", json!({"command": "echo ran > ran.txt"})),
        Reply::tool("run_tests", json!({"filter": "db"})),
        Reply::text("All green."),
    ])
    .await;
    let mut req = request(&w, &fake);
    req.provider_config
        .insert("permissions".into(), "ask:read_file,list_dir".into());
    req.provider_config.insert(
        "client_tools".into(),
        r#"[{"name":"run_tests","description":"Run the test suite on the client","schema_json":"{\"type\":\"object\"}"}]"#.into(),
    );
    let s = w.create(req).await;
    let turn = w.send_stream(&s.id, "Run it, then the tests.").await;
    let shell = resolve_next(&w, &s.id, pb::ApprovalDecision::Approve, "").await;
    assert_eq!(shell.summary, "shell: echo ran > ran.txt");
    let tests = resolve_next(&w, &s.id, pb::ApprovalDecision::Answer, "12 passed").await;
    assert_eq!(tests.kind, pb::ApprovalKind::ClientTool as i32);
    assert_eq!(tests.tool_name, "run_tests");
    let acts = collect(turn).await;
    assert_eq!(kind(acts.last().unwrap()), "COMPLETION", "{acts:#?}");
    assert_eq!(
        std::fs::read_to_string(w.root.join("ran.txt")).unwrap(),
        "ran\n"
    );
    // The model saw the client's tool among its tools, and its result.
    let sent = fake.completions();
    let offered = serde_json::to_string(&sent[0].body["tools"]).unwrap();
    assert!(offered.contains("run_tests"), "{offered}");
    assert_conversation(&sent[2], &["tool: 12 passed"]);
    w.stop(&s.id, true).await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_permission_policy_denies_and_the_model_is_told() {
    let (w, fake) = start(vec![
        Reply::tool(
            "write_file",
            json!({"path": "denied.txt", "content": "no\n"}),
        ),
        Reply::tool("read_file", json!({"path": "README.md"})),
        Reply::text("One of two."),
    ])
    .await;
    let mut req = request(&w, &fake);
    req.provider_config
        .insert("permissions".into(), "allow:read_file,list_dir".into());
    let s = w.create(req).await;
    let acts = w.send(&s.id, "Write, then read.").await;
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
        "paddock: the session's permission policy denies write_file"
    );
    assert!(!w.root.join("denied.txt").exists());
    assert!(acts[3].tool_success);
    assert_eq!(acts[3].content, "# project\n");
    assert_conversation(
        &fake.completions()[1],
        &[
            "assistant: tool_call write_file",
            "tool: paddock: the session's permission policy denies write_file",
        ],
    );
    w.stop(&s.id, true).await.expect("stop");

    // `deny`: nothing runs at all.
    fake.push([
        Reply::tool("shell", json!({"command": "echo ran > ran.txt"})),
        Reply::text("Denied."),
    ]);
    let mut req = request(&w, &fake);
    req.provider_config
        .insert("permissions".into(), "deny".into());
    let s = w.create(req).await;
    let acts = w.send(&s.id, "Run it.").await;
    assert_eq!(
        kinds(&acts),
        ["TOOL_CALL", "TOOL_RESULT", "TEXT", "COMPLETION"]
    );
    assert!(!acts[1].tool_success);
    assert!(!w.root.join("ran.txt").exists());
    w.stop(&s.id, true).await.expect("stop");
}

/// No model: OBEY-2003; a provider_config the loop cannot use: OBEY-2004. Both at create,
/// before any process starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_bad_configurations_are_refused_at_create() {
    let (w, fake) = start(vec![]).await;
    let mut req = request(&w, &fake);
    req.model = String::new();
    let e = w
        .client()
        .await
        .create_session(req)
        .await
        .expect_err("refused");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().starts_with("OBEY-2003"), "{}", e.message());
    for (key, value) in [("max_tool_rounds", "many"), ("base_url", "localhost:8080")] {
        let mut req = request(&w, &fake);
        req.provider_config.insert(key.into(), value.into());
        let e = w
            .client()
            .await
            .create_session(req)
            .await
            .expect_err("refused");
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert!(e.message().starts_with("OBEY-2004"), "{}", e.message());
        assert!(e.message().contains(key), "{}", e.message());
    }
    assert!(fake.requests().is_empty());
}

/// The saved conversation is gone: the resumed bridge refuses to start a blank one (as Claude
/// Code does), and the session fails with its reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_a_lost_conversation_fails_the_resume() {
    let (w, fake) = start(vec![Reply::text("First.")]).await;
    let s = w.create(request(&w, &fake)).await;
    w.send(&s.id, "Hello.").await;
    w.stop(&s.id, true).await.expect("stop");
    let state = w.home.join(".local/state/paddock/openai-api");
    assert!(state.is_dir(), "no {}", state.display());
    std::fs::remove_dir_all(&state).unwrap();
    // The bridge exits before it is ready: the restart's start failed.
    w.restart_refused(&s.id).await;
    let f = w.wait_status(&s.id, S::Failed).await;
    assert_eq!(f.error_code, "OBEY-2004", "{f:?}");
    assert!(
        f.error_message.contains("exit code 1") && f.error_message.contains("no conversation"),
        "{}",
        f.error_message
    );
}

/// The bridge's own stdout is this provider's "CLI output": recorded once from a live run and
/// kept as `tests/providers/recordings/openai_bridge.jsonl` (paths, the fake server's address
/// and the conversation id normalised).
const RECORDING: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/providers/recordings/openai_bridge.jsonl"
);

/// The recording through the daemon's adapter (`providers::plan`'s parser), as a snapshot.
#[test]
fn openai_recorded_bridge_output_through_the_adapter() {
    use paddock::providers::{self, Parsed};
    use paddock_core::{Provider, ProviderEvent, SessionConfig, SpawnSpec};

    let text = std::fs::read_to_string(RECORDING).expect("the recording");
    // The live run's policy: `shell` is denied.
    let mut config = SessionConfig::new("c", Provider::OpenAiApi, "/home/dev/proj");
    config
        .provider_config
        .insert("permissions", "allow:list_dir,read_file,write_file")
        .expect("a valid policy");
    let spec = SpawnSpec {
        config,
        resume: None,
        restart_count: 0,
    };
    let (_, mut parser) = providers::plan(&spec, std::path::Path::new(BIN)).expect("plan");
    let mut rendered = Vec::new();
    for l in text.lines() {
        let v: Value = serde_json::from_str(l).unwrap_or(Value::Null);
        let what = format!(
            "{}{}",
            v["type"].as_str().unwrap_or("?"),
            v["subtype"]
                .as_str()
                .or(v["request"]["subtype"].as_str())
                .map(|s| format!("/{s}"))
                .unwrap_or_default()
        );
        let items: Vec<Value> = parser
            .parse_line(l)
            .into_iter()
            .map(|p| match p {
                Parsed::Event(ProviderEvent::SessionRef(id)) => json!({ "session_ref": id }),
                Parsed::Event(ProviderEvent::Activity(a)) => {
                    let mut o = json!({"type": a.kind().name(), "content": a.content});
                    if !a.tool_name.is_empty() {
                        o["tool"] = json!(a.tool_name);
                    }
                    if a.kind() == paddock_core::ActivityKind::ToolResult {
                        o["success"] = json!(a.tool_success);
                    }
                    if a.tokens_input != 0 || a.tokens_output != 0 {
                        o["tokens"] = json!([a.tokens_input, a.tokens_output]);
                    }
                    o
                }
                // A permission prompt goes to the core (the daemon answers it by the policy).
                Parsed::Event(ProviderEvent::Ask(paddock_core::Ask {
                    kind,
                    tool,
                    summary,
                    ..
                })) => json!({ "ask": tool, "kind": kind.name(), "summary": summary }),
                Parsed::Event(other) => json!({ "event": format!("{other:?}") }),
                Parsed::Reply(r) => {
                    let answer: Value = serde_json::from_str(&r).unwrap();
                    json!({ "reply": answer["response"]["response"]["behavior"] })
                }
                Parsed::Unrecognized(_) => json!("unrecognized"),
            })
            .collect();
        rendered.push(json!({ "line": what, "parsed": items }));
    }
    insta::assert_yaml_snapshot!("openai_recorded_bridge_output", Value::Array(rendered));
}

/// A live run of the bridge (`providers::plan`, no daemon: this test answers its permission
/// prompts with the adapter's replies) prints exactly the recording. With
/// `PADDOCK_RECORD_FIXTURES=1` it writes the recording instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_bridge_output_matches_the_recording() {
    use paddock::providers::{self, claude_stream, Parsed};
    use paddock_core::{Provider, SessionConfig, SpawnSpec};
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    let (w, fake) = start(vec![
        Reply::tool("list_dir", json!({}))
            .reasoning("Let me look around first.")
            .usage(900, 0, 25),
        Reply::tool(
            "write_file",
            json!({"path": "hello.txt", "content": "hi\n"}),
        )
        .and_tool("shell", json!({"command": "rm -rf src"}))
        .saying("Writing the file; cleaning up too.")
        .usage(1000, 900, 15),
        Reply::text("Wrote hello.txt; src stays.").usage(1100, 1000, 12),
        Reply::error(500),
        Reply::text("Second turn."),
    ])
    .await;
    let mut config = SessionConfig::new("c", Provider::OpenAiApi, &w.root.display().to_string());
    config.model = MODEL.into();
    config.provider_config = [
        ("base_url", fake.base_url()),
        ("max_retries", "0".into()),
        ("permissions", "allow:list_dir,read_file,write_file".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect::<std::collections::BTreeMap<_, _>>()
    .try_into()
    .expect("valid settings");
    config.environment = [("OPENAI_API_KEY".to_string(), KEY.to_string())]
        .into_iter()
        .collect();
    let spec = SpawnSpec {
        config,
        resume: None,
        restart_count: 0,
    };
    let policy = spec.config.provider_config.policy().clone();
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
        .expect("spawn the bridge");
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut transcript = Vec::new();
    for m in ["List, then write hello.txt.", "Again?", "Once more."] {
        let line = providers::user_message_line(m) + "\n";
        stdin.write_all(line.as_bytes()).await.unwrap();
        loop {
            let Some(l) = within(lines.next_line()).await.unwrap() else {
                panic!("the bridge closed its stdout");
            };
            for p in parser.parse_line(&l) {
                // Answered as the daemon's core does: by the session's policy.
                if let Parsed::Event(paddock_core::ProviderEvent::Ask(paddock_core::Ask {
                    key,
                    kind,
                    tool,
                    input,
                    ..
                })) = p
                {
                    let input: Value = serde_json::from_str(&input).unwrap();
                    let answer = match policy.decide(kind, &tool) {
                        paddock_core::PolicyAnswer::Allow => {
                            claude_stream::control_response_allow(&key, &input)
                        }
                        paddock_core::PolicyAnswer::Deny(why) => {
                            claude_stream::control_response_deny(&key, &why)
                        }
                        paddock_core::PolicyAnswer::AskHuman => unreachable!("no ask policy"),
                    };
                    stdin.write_all((answer + "\n").as_bytes()).await.unwrap();
                }
            }
            let end = l.contains(r#""type":"result""#);
            transcript.push(l);
            if end {
                break;
            }
        }
    }
    drop(stdin);
    let st = within(child.wait()).await.unwrap();
    assert!(st.success(), "{st:?}");
    assert_eq!(
        std::fs::read_to_string(w.root.join("hello.txt")).unwrap(),
        "hi\n"
    );
    assert!(w.root.join("src").is_dir(), "the denied shell command ran");

    let first: Value = serde_json::from_str(&transcript[0]).unwrap();
    assert_eq!(first["subtype"], "init");
    let conv = first["session_id"].as_str().unwrap().to_string();
    let text: String = transcript
        .iter()
        .map(|l| {
            l.replace(&conv, "01CONVERSATIONID0000000000")
                .replace(&w.root.display().to_string(), "/home/dev/proj")
                .replace(&fake.addr.to_string(), "127.0.0.1:8080")
                + "\n"
        })
        .collect();
    if std::env::var_os("PADDOCK_RECORD_FIXTURES").is_some() {
        std::fs::create_dir_all(std::path::Path::new(RECORDING).parent().unwrap()).unwrap();
        std::fs::write(RECORDING, &text).unwrap();
        eprintln!("recorded {} lines to {RECORDING}", transcript.len());
    }
    let recorded = std::fs::read_to_string(RECORDING).unwrap_or_default();
    assert_eq!(
        text, recorded,
        "the bridge's output changed: review, then re-record with PADDOCK_RECORD_FIXTURES=1"
    );
}

/// A key given in provider_config never shows in the process list, and the agent's own shell
/// tool sees neither it nor the bridge's configuration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_a_configured_key_stays_out_of_sight() {
    let w = World::start(vec![]).await;
    let fake = FakeOpenAi::start(vec![
        Reply::tool(
            "shell",
            json!({"command": "env > env.txt; cat /proc/$PPID/cmdline | tr '\\0' ' ' > parent.txt"}),
        ),
        Reply::text("Looked."),
    ])
    .await;
    let mut req = request(&w, &fake);
    req.environment.clear();
    req.provider_config
        .insert("api_key".into(), "sk-secret-in-config".into());
    let s = w.create(req).await;
    assert!(
        !cmdline(s.pid as u32).contains("sk-secret-in-config"),
        "{}",
        cmdline(s.pid as u32)
    );
    w.send(&s.id, "Look around.").await;
    let env = std::fs::read_to_string(w.root.join("env.txt")).unwrap();
    assert!(!env.contains("sk-secret-in-config"), "{env}");
    assert!(!env.contains("PADDOCK_BRIDGE_CONFIG"), "{env}");
    let parent = std::fs::read_to_string(w.root.join("parent.txt")).unwrap();
    assert!(parent.contains("__bridge openai"), "{parent}");
    assert!(!parent.contains("sk-secret"), "{parent}");
    // The key did reach the endpoint.
    assert_eq!(
        fake.requests()[0].headers["authorization"],
        "Bearer sk-secret-in-config"
    );
    w.stop(&s.id, true).await.expect("stop");
}

impl ApiErrors for OpenAi {
    const SNAPSHOT: &'static str = "openai_api_errors";
    const AGENT: &'static str = "openai-api";
    const TURNS: &'static [Option<u16>] = &[Some(500), Some(429), Some(400), Some(401), None];

    fn push_error(&self, status: u16) {
        self.fake.push([Reply::error(status)]);
    }

    fn error_words(&self, status: u16, content: &str) {
        assert_eq!(
            content,
            format!(
                "openai-api: API error status {status}: fake {status} from the paddock test server"
            )
        );
    }

    /// No retries were made (max_retries 0): one request per turn.
    fn after_turns(&self) {
        assert_eq!(self.fake.completions().len(), Self::TURNS.len());
    }
}

impl OpenAi {
    /// Where the bridge saves its conversations.
    fn saved(&self) -> std::path::PathBuf {
        self.w.home.join(".local/state/paddock/openai-api")
    }
}

impl Conversation for OpenAi {
    /// The one conversation the bridge saved (`<id>.json`).
    fn conversation(&self) -> String {
        let saved: Vec<String> = std::fs::read_dir(self.saved())
            .expect("the saved conversations")
            .filter_map(|e| {
                e.ok()?
                    .file_name()
                    .to_str()?
                    .strip_suffix(".json")
                    .map(String::from)
            })
            .collect();
        assert_eq!(saved.len(), 1, "{saved:?}");
        saved[0].clone()
    }

    fn sent(&self) -> Vec<Sent> {
        let sent = self.fake.completions();
        sent.iter()
            .map(|r| Sent {
                texts: r.texts(),
                conversation: None,
            })
            .collect()
    }

    /// Deleting the session deletes its saved conversation too.
    async fn after_conversation(&self, s: &pb::SessionInfo) {
        let saved = self.saved().join(format!("{}.json", self.conversation()));
        self.w
            .client()
            .await
            .delete_session(pb::DeleteSessionRequest {
                session_id: s.id.clone(),
            })
            .await
            .expect("delete");
        assert!(!saved.exists(), "the conversation outlived its session");
    }
}
