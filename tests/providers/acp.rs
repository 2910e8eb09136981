//! ACP agents, for real: Claude's ACP adapter (`@agentclientprotocol/claude-agent-acp`, pinned
//! in tests/npm/package.json) spoken to by paddock's ACP bridge, against the fake Anthropic
//! server, supervised by the real daemon.
//!
//! Facts of the adapter these tests rely on (0.100.0): it drives Claude Code through the Claude
//! Agent SDK, so the Claude facts hold (`ANTHROPIC_BASE_URL`, any key and model name,
//! `CLAUDE_CODE_MAX_RETRIES=0`); as root it refuses to start a session unless `IS_SANDBOX=1`
//! ("--dangerously-skip-permissions cannot be used with root/sudo privileges"); in its
//! `default` mode it asks `session/request_permission` before every edit or command; it sends
//! side requests (a session title, answered by the fake server outside the script; a guess of
//! the next prompt, off with `CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION=false`).

use std::collections::BTreeMap;
use std::time::Duration;

use paddock_proto::obey::local::v1 as pb;
use pb::SessionStatus as S;
use serde_json::{json, Value};

use crate::fake_anthropic::Reply;
use crate::harness::*;
use crate::scenarios::{
    budget_crossed_by_real_usage, conversation_survives_restarts, killed_mid_turn,
    model_api_errors, push_bash_turn, stop_during_a_tool_call, ApiErrors, Conversation, Kit,
};

/// The ACP adapter: `PADDOCK_ACP_BIN`, else tests/npm/node_modules/.bin/claude-agent-acp.
pub fn acp_bin() -> std::path::PathBuf {
    npm_bin("PADDOCK_ACP_BIN", "claude-agent-acp")
}

fn acp_env(w: &World) -> BTreeMap<String, String> {
    let mut env = w.claude_env();
    env.insert("IS_SANDBOX".into(), "1".into());
    // The SDK predicts the user's next prompt after a turn, with a model call of its own that
    // would take the next scripted reply.
    env.insert(
        "CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION".into(),
        "false".into(),
    );
    env.insert(
        "PADDOCK_BRIDGE_TRACE".into(),
        w.base.join("acp-trace.jsonl").display().to_string(),
    );
    env
}

fn acp_request(w: &World) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        campaign_id: w.campaign_id.clone(),
        provider: pb::SessionProvider::Acp as i32,
        provider_config: [("command".to_string(), acp_bin().display().to_string())]
            .into_iter()
            .collect(),
        environment: acp_env(w),
        ..Default::default()
    }
}

/// The ACP session id the agent gave the first `session/new`.
fn acp_session_id(w: &World) -> String {
    trace(w)
        .lines()
        .filter_map(|l| l.strip_prefix("< "))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find_map(|v| v["result"]["sessionId"].as_str().map(str::to_string))
        .expect("a session/new answer in the trace")
}

fn trace(w: &World) -> String {
    std::fs::read_to_string(w.base.join("acp-trace.jsonl")).unwrap_or_default()
}

/// The adapter's process (a node script), not the bridge in front of it.
fn adapter_pids() -> Vec<u32> {
    processes_with("claude-agent-acp/dist")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn acp_tool_turn_changes_files_and_counts_real_tokens() {
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
    let s = w.create(acp_request(&w)).await;
    assert_eq!(s.status, S::Running as i32, "{s:?}");
    let acts = w.send(&s.id, "Please create two files.").await;

    // The tools really ran, in the campaign directory, each allowed by the session's policy
    // through ACP's permission prompt.
    assert_eq!(
        std::fs::read_to_string(w.root.join("bash.txt")).unwrap(),
        "made-by-bash\n"
    );
    assert_eq!(
        std::fs::read_to_string(&hello).unwrap(),
        "hello from the fake model\n"
    );
    assert!(trace(&w).contains("session/request_permission"));
    assert_eq!(
        kinds(&acts),
        [
            "THINKING",
            "TOOL_CALL",
            "TOOL_RESULT",
            "TEXT",
            "TOOL_CALL",
            "TOOL_RESULT",
            "COMPLETION"
        ],
        "{acts:#?}"
    );
    assert_eq!(acts[1].tool_name, "Bash");
    assert_eq!(acts[1].tool_call_id, acts[2].tool_call_id);
    assert!(acts[2].tool_success && acts[5].tool_success, "{acts:#?}");
    // The prompt's usage: every model call's input (cache reads included) and output.
    assert_eq!(token_sums(&acts), (1200 + 1300 + 2700, 40 + 30 + 20));
    let info = w.get(&s.id).await;
    assert_eq!((info.tokens_input, info.tokens_output), (5200, 90));
    insta::assert_yaml_snapshot!("acp_tool_turn", w.render(&acts));
    w.stop(&s.id, true).await.expect("stop");
    wait_gone(s.pid as u32).await;
    // Everything the agent started has gone with it.
    wait_no_process_in(&w.root, Duration::from_secs(10)).await;
}

/// A client's own tool (sunbeam's client-side tools) offered to a real ACP agent as an MCP
/// server of its session (`mcpServers` in `session/new`: `paddock __mcp-relay` to a socket the
/// bridge serves): the model calls it, the client answers it, the model reads the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn acp_agents_call_the_clients_tools_through_paddocks_mcp_server() {
    let w = World::start(vec![
        Reply::tool("mcp__paddock__run_tests", json!({"filter": "db"})),
        Reply::text("All green."),
    ])
    .await;
    let mut req = acp_request(&w);
    req.provider_config
        .insert("permissions".into(), "allow-all".into());
    req.provider_config
        .insert("client_tools".into(), RUN_TESTS_TOOL.into());
    let s = w.create(req).await;
    let turn = w.send_stream(&s.id, "Run the db tests.").await;
    client_tool_turn(&w, &s.id, turn).await;
    assert!(trace(&w).contains("__mcp-relay"), "named in session/new");
    let sent = w.fake.requests();
    let last = serde_json::to_string(&sent.last().unwrap().body).unwrap();
    assert!(last.contains("12 passed"), "{last}");
    w.stop(&s.id, true).await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn acp_conversation_continues_across_turns_and_restarts() {
    conversation_survives_restarts::<Acp>().await;
}

/// The session's model reaches the agent through its `model` session config option (what the
/// Claude adapter offers; it has no `models` list): the model API is asked for it. A model the
/// agent does not offer is refused, with the agent's own list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn acp_session_model_is_the_agents_model_option() {
    let w = World::start(vec![Reply::text("Hi from sonnet.")]).await;
    let mut req = acp_request(&w);
    req.model = "sonnet".into();
    let s = w.create(req.clone()).await;
    let acts = w.send(&s.id, "hello").await;
    assert_eq!(kinds(&acts), ["COMPLETION"], "{acts:#?}");
    assert!(
        trace(&w).contains("session/set_config_option"),
        "{}",
        trace(&w)
    );
    let asked = w.fake.message_requests();
    assert!(!asked.is_empty());
    for r in &asked {
        let model = r.body["model"].as_str().unwrap_or("");
        assert!(model.contains("sonnet"), "asked for {model:?}");
    }
    w.stop(&s.id, true).await.expect("stop");

    // The session is ready only once the agent's session is set up with its model: a model
    // the agent does not offer refuses the create (OBEY-2004), with the agent's choices.
    req.model = "gpt-9".into();
    let e = within(w.client().await.create_session(req))
        .await
        .expect_err("refused");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    let m = e.message();
    assert!(
        m.starts_with("OBEY-2004: ")
            && m.contains("does not offer model \"gpt-9\"")
            && m.contains("sonnet"),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn acp_model_api_errors_end_the_turn_with_an_error() {
    model_api_errors::<Acp>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn acp_agent_killed_mid_turn_is_obey_2031() {
    killed_mid_turn::<Acp>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn acp_token_budget_crossed_by_real_usage_fails_the_session() {
    budget_crossed_by_real_usage::<Acp>().await;
}

/// An ACP agent (Claude's ACP adapter) behind paddock's bridge, as the shared scenarios drive it.
pub(crate) struct Acp(World);

impl Kit for Acp {
    // The adapter's answer is its prompt's end: no TEXT of its own (and a resumed session's
    // replayed history is not reported again).
    const ANSWERED: &'static [&'static str] = &["COMPLETION"];
    // The adapter ends its tool's processes itself, a moment later than the others.
    const TOOL_GONE_WITHIN: Duration = Duration::from_secs(15);
    // ACP reports usage with the prompt's answer only, so the budget is crossed by the turn's
    // end: the turn completes with its real counts, and then the session fails with
    // OBEY-2013, as one whose agent streams its usage does mid-turn.
    const BUDGET_TURN: &'static [&'static str] = &["TOOL_CALL", "TOOL_RESULT", "COMPLETION"];

    async fn start() -> Self {
        Acp(World::start(vec![]).await)
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

    /// The adapter the bridge started (it may start helpers of its own).
    async fn agent(&self, s: &pb::SessionInfo) -> u32 {
        let agents: Vec<u32> = adapter_pids()
            .into_iter()
            .filter(|p| parent_of(*p) == Some(s.pid as u32))
            .collect();
        assert_eq!(agents.len(), 1, "{agents:?}");
        agents[0]
    }

    fn push_shell_turn(&self, command: &str, text: &str, usage: Option<[(u64, u64); 2]>) {
        push_bash_turn(&self.0, command, text, usage);
    }

    fn request(&self) -> pb::CreateSessionRequest {
        acp_request(&self.0)
    }

    fn budget_turn(&self, acts: &[pb::SessionActivityEvent]) {
        assert_eq!(token_sums(acts), (3100, 20));
    }

    async fn after_end(&self, _asked: usize) {
        wait_no_process_in(&self.0.root, Duration::from_secs(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn acp_stop_during_a_tool_call_ends_the_tool_and_the_agent() {
    stop_during_a_tool_call::<Acp>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn acp_permission_policy_answers_the_agents_prompts() {
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
    let mut req = acp_request(&w);
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
            "COMPLETION"
        ],
        "{acts:#?}"
    );
    assert!(!acts[1].tool_success, "{acts:#?}");
    assert!(acts[3].tool_success, "{acts:#?}");
    assert!(!denied.exists());
    assert_eq!(
        std::fs::read_to_string(w.root.join("allowed.txt")).unwrap(),
        "allowed\n"
    );
    // The agent picked the denial up through its own option ("reject").
    assert!(
        trace(&w).contains(r#""optionId":"reject""#),
        "{}",
        trace(&w)
    );
    insta::assert_yaml_snapshot!("acp_permissions", w.render(&acts));
    w.stop(&s.id, true).await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn acp_prompts_wait_for_a_human() {
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
        Reply::text("One of two."),
    ]);
    let mut req = acp_request(&w);
    req.provider_config
        .insert("permissions".into(), "ask".into());
    let s = w.create(req).await;
    let turn = w.send_stream(&s.id, "Write both files.").await;
    let first = resolve_next(&w, &s.id, pb::ApprovalDecision::Deny, "not that one").await;
    assert_eq!(first.kind, pb::ApprovalKind::Permission as i32);
    let second = resolve_next(&w, &s.id, pb::ApprovalDecision::Approve, "").await;
    assert_ne!(first.id, second.id);
    let acts = collect(turn).await;
    assert_eq!(kind(acts.last().unwrap()), "COMPLETION", "{acts:#?}");
    assert!(!denied.exists());
    assert_eq!(
        std::fs::read_to_string(w.root.join("approved.txt")).unwrap(),
        "approved\n"
    );
    // The human's answers went to the agent through its own options.
    let t = trace(&w);
    assert!(t.contains(r#""optionId":"reject""#), "{t}");
    assert!(t.contains(r#""optionId":"allow-once""#), "{t}");
    w.stop(&s.id, true).await.expect("stop");
}

/// No agent needed: an ACP session without a command line, or with a missing binary, is
/// refused at CreateSession with OBEY-2004.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_without_a_runnable_command_is_obey_2004() {
    let w = World::start(vec![]).await;
    let mut req = acp_request_without_binary(&w);
    let e = within(w.client().await.create_session(req.clone()))
        .await
        .expect_err("no command");
    assert!(e.message().starts_with("OBEY-2004"), "{}", e.message());
    assert!(
        e.message().contains("provider_config.command"),
        "{}",
        e.message()
    );
    req.provider_config
        .insert("command".into(), "paddock-no-such-acp-agent --acp".into());
    let e = within(w.client().await.create_session(req))
        .await
        .expect_err("missing binary");
    assert!(e.message().starts_with("OBEY-2004"), "{}", e.message());
    assert!(
        e.message().contains("paddock-no-such-acp-agent"),
        "{}",
        e.message()
    );
}

fn acp_request_without_binary(w: &World) -> pb::CreateSessionRequest {
    pb::CreateSessionRequest {
        campaign_id: w.campaign_id.clone(),
        provider: pb::SessionProvider::Acp as i32,
        ..Default::default()
    }
}

/// What the agent said, recorded (`PADDOCK_BRIDGE_TRACE`), through the bridge's translator:
/// a snapshot, so a new adapter version that speaks differently shows up as a reviewed diff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn acp_recorded_updates_through_the_translator() {
    let w = World::start(vec![]).await;
    w.fake.push([
        Reply::tool("Bash", json!({"command": "ls", "description": "List"}))
            .thinking("Look first.")
            .usage(900, 0, 25),
        Reply::text("Listed.").usage(60, 900, 12),
    ]);
    let s = w.create(acp_request(&w)).await;
    w.send(&s.id, "List the project.").await;
    w.stop(&s.id, true).await.expect("stop");
    let updates: Vec<Value> = trace(&w)
        .lines()
        .filter_map(|l| l.strip_prefix("< "))
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["method"] == "session/update")
        .map(|v| v["params"]["update"].clone())
        .collect();
    let kinds_seen: Vec<&str> = updates
        .iter()
        .filter_map(|u| u["sessionUpdate"].as_str())
        // Left out: updates the adapter sends when it gets to them (commands, usage, the
        // session's title from a side request), at no fixed point of the turn.
        .filter(|k| {
            !matches!(
                *k,
                "available_commands_update" | "usage_update" | "session_info_update"
            )
        })
        .collect();
    insta::assert_yaml_snapshot!("acp_recorded_update_kinds", kinds_seen);
    let rendered = paddock::providers::bridge::acp::translate_for_test(&updates);
    insta::assert_yaml_snapshot!("acp_recorded_translated", w.redact(&rendered));
}

/// OpenClaw is the ACP adapter with `openclaw acp` as its default command: any ACP agent
/// given as its command runs the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn openclaw_sessions_are_acp_sessions() {
    let w = World::start(vec![Reply::text("Hello from an OpenClaw session.")]).await;
    let mut req = acp_request(&w);
    req.provider = pb::SessionProvider::Openclaw as i32;
    let s = w.create(req).await;
    assert_eq!(s.provider, pb::SessionProvider::Openclaw as i32);
    let acts = w.send(&s.id, "Hi.").await;
    assert_eq!(kinds(&acts), ["COMPLETION"], "{acts:#?}");
    assert_eq!(acts[0].content, "Hello from an OpenClaw session.");
    assert!(cmdline(s.pid as u32).contains("__bridge acp"));
    w.stop(&s.id, true).await.expect("stop");
}

impl ApiErrors for Acp {
    const SNAPSHOT: &'static str = "acp_api_errors";
    const AGENT: &'static str = "acp";
    const TURNS: &'static [Option<u16>] = &[Some(500), None, Some(400)];
}

impl Conversation for Acp {
    /// The ACP session the adapter made (its `session/new` answer).
    fn conversation(&self) -> String {
        acp_session_id(&self.0)
    }

    /// The restarted bridge asked the adapter to resume its session.
    async fn after_conversation(&self, _s: &pb::SessionInfo) {
        assert!(trace(&self.0).contains(r#""method":"session/resume""#));
    }
}
