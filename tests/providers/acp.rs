//! ACP agents, for real: Claude's ACP adapter (`@agentclientprotocol/claude-agent-acp`, pinned
//! in tests/npm/package.json) spoken to by paddock's ACP bridge, against the fake Anthropic
//! server, supervised by the real daemon.
//!
//! Facts of the adapter these tests rely on (0.100.0): it drives Claude Code through the Claude
//! Agent SDK, so the Claude facts hold (`ANTHROPIC_BASE_URL`, any key and model name,
//! `CLAUDE_CODE_MAX_RETRIES=0`); as root it refuses to start a session unless `IS_SANDBOX=1`
//! ("--dangerously-skip-permissions cannot be used with root/sudo privileges"); in its
//! `default` mode it asks `session/request_permission` before every edit or command.

use std::collections::HashMap;

use paddock_proto::obey::local::v1 as pb;
use pb::SessionStatus as S;
use serde_json::json;

use crate::fake_anthropic::Reply;
use crate::harness::*;

/// The ACP adapter: `PADDOCK_ACP_BIN`, else tests/npm/node_modules/.bin/claude-agent-acp.
pub fn acp_bin() -> std::path::PathBuf {
    npm_bin("PADDOCK_ACP_BIN", "claude-agent-acp")
}

fn acp_env(w: &World) -> HashMap<String, String> {
    let mut env = w.claude_env();
    env.insert("IS_SANDBOX".into(), "1".into());
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

fn trace(w: &World) -> String {
    std::fs::read_to_string(w.base.join("acp-trace.jsonl")).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn acp_tool_turn_changes_files() {
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
    eprintln!("TRACE:\n{}", trace(&w));
    eprintln!("ACTS: {:#?}", w.render(&acts));
    for r in w.fake.message_requests() {
        eprintln!("REQ {} {}", r.path, serde_json::to_string(&r.body).unwrap().chars().take(1500).collect::<String>());
    }
    assert_eq!(
        std::fs::read_to_string(w.root.join("bash.txt")).unwrap(),
        "made-by-bash\n"
    );
    assert_eq!(
        std::fs::read_to_string(&hello).unwrap(),
        "hello from the fake model\n"
    );
    w.stop(&s.id, true).await.expect("stop");
}
