//! Gemini CLI, for real: the npm CLI (pinned in tests/npm/package.json) behind paddock's gemini
//! bridge (`paddock __bridge gemini`), against the fake Gemini API, supervised by the real
//! daemon.
//!
//! Facts of the CLI these tests rely on (0.61.0): `GOOGLE_GEMINI_BASE_URL` points it at the
//! fake server and any `GEMINI_API_KEY` works once `$HOME/.gemini/settings.json` selects API-key
//! auth (`security.auth.selectedType: "gemini-api-key"`; without it the headless CLI only says
//! "Invalid auth method selected."); `general.maxAttempts: 1` there makes a failing model call end the turn at once
//! (by default it tries 10 times with back-off: minutes for a 5xx); `--skip-trust` trusts the
//! working directory; `privacy.usageStatisticsEnabled: false` stops its only side traffic (Google's
//! usage logging: without it, strace shows DNS lookups; with it, no connection but to the fake
//! server);
//! its conversations live under `$HOME/.gemini/tmp/<project>/chats/`; a failed call writes a
//! report to `$TMPDIR` (the tests point it into their tempdir). Each turn is a new node process
//! that takes a second or more to start (more on a busy machine): the tests keep turns few.

use std::time::{Duration, Instant};

use paddock_proto::obey::local::v1 as pb;
use pb::SessionStatus as S;
use serde_json::{json, Value};

use crate::fake_gemini::{FakeGemini, Recorded, Reply};
use crate::harness::*;
use crate::scenarios::{
    budget_crossed_by_real_usage, conversation_survives_restarts, costing, killed_mid_turn,
    model_api_errors, stop_during_a_tool_call, ApiErrors, Conversation, Kit, Sent,
};

/// The model sessions ask for: it must reach the server unchanged (`-m`).
const GEMINI_MODEL: &str = "gemini-paddock-test";

/// A test's world with the fake Gemini API.
pub(crate) struct G {
    w: World,
    fake: FakeGemini,
}

impl G {
    async fn start(script: Vec<Reply>) -> G {
        let w = World::start(vec![]).await;
        let fake = FakeGemini::start(script).await;
        let dir = w.home.join(".gemini");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(w.base.join("tmp")).unwrap();
        std::fs::write(
            dir.join("settings.json"),
            json!({
                "security": {"auth": {"selectedType": "gemini-api-key"}},
                "general": {"maxAttempts": 1, "enableAutoUpdate": false, "enableAutoUpdateNotification": false},
                "privacy": {"usageStatisticsEnabled": false},
                "telemetry": {"enabled": false},
            })
            .to_string(),
        )
        .unwrap();
        G { w, fake }
    }

    fn env(&self) -> std::collections::BTreeMap<String, String> {
        [
            ("GOOGLE_GEMINI_BASE_URL", self.fake.url()),
            ("GEMINI_API_KEY", "paddock-test-key".to_string()),
            ("TMPDIR", self.w.base.join("tmp").display().to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    fn request(&self) -> pb::CreateSessionRequest {
        pb::CreateSessionRequest {
            campaign_id: self.w.campaign_id.clone(),
            provider: pb::SessionProvider::Gemini as i32,
            model: GEMINI_MODEL.into(),
            provider_config: [("command".to_string(), gemini_bin().display().to_string())]
                .into_iter()
                .collect(),
            environment: self.env(),
            ..Default::default()
        }
    }

    async fn session(&self) -> pb::SessionInfo {
        self.w.create(self.request()).await
    }

    fn render(&self, acts: &[pb::SessionActivityEvent]) -> Value {
        let v = self.w.render(acts).to_string();
        serde_json::from_str(&v.replace(&self.fake.addr.to_string(), "<fake-server>")).unwrap()
    }

    /// The ids of the gemini conversations stored under `$HOME/.gemini/tmp/<project>/chats/`.
    /// (One conversation may have more than one file: a resumed run sometimes starts a new
    /// `session-<time>-<id>.jsonl` under the same id.)
    fn conversations(&self) -> Vec<String> {
        let mut ids = std::collections::BTreeSet::new();
        let tmp = self.w.home.join(".gemini/tmp");
        for project in std::fs::read_dir(&tmp).into_iter().flatten().flatten() {
            for chat in std::fs::read_dir(project.path().join("chats"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let text = std::fs::read_to_string(chat.path()).unwrap_or_default();
                let first: Value = text
                    .lines()
                    .next()
                    .and_then(|l| serde_json::from_str(l).ok())
                    .unwrap_or(Value::Null);
                if let Some(id) = first["sessionId"].as_str() {
                    ids.insert(id.to_string());
                }
            }
        }
        ids.into_iter().collect()
    }
}

/// Asserts that `expected` appear in the conversation `r` sent, in this order.
#[track_caller]
fn assert_conversation(r: &Recorded, expected: &[&str]) {
    assert_in_order(&r.texts(), expected);
}

/// The gemini process the bridge `pid` runs for the turn in progress.
async fn gemini_child(bridge: u32) -> u32 {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(c) = children_of(bridge)
            .into_iter()
            .find(|c| cmdline(*c).contains("gemini"))
        {
            return c;
        }
        assert!(Instant::now() < deadline, "the bridge started no gemini");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn gemini_tool_turn_changes_files_and_counts_real_tokens() {
    let g = G::start(vec![]).await;
    let hello = g.w.root.join("hello.txt");
    g.fake.push([
        Reply::call(
            "run_shell_command",
            json!({"command": "echo made-by-shell > shell.txt && ls", "description": "Create shell.txt"}),
        )
        .thinking("Two files: one with the shell, one with write_file.")
        .usage(1200, 0, 40),
        Reply::call(
            "write_file",
            json!({"file_path": hello.display().to_string(), "content": "hello from the fake model\n"}),
        )
        .saying("Now the second file.")
        .usage(1300, 1000, 30),
        Reply::text("Created shell.txt and hello.txt.")
            .usage(2700, 2300, 20)
            .thoughts(5),
    ]);
    let s = g.session().await;
    assert_eq!(s.status, S::Running as i32, "{s:?}");
    let acts = g.w.send(&s.id, "Please create two files.").await;

    // The tools really ran, in the campaign directory.
    assert_eq!(
        std::fs::read_to_string(g.w.root.join("shell.txt")).unwrap(),
        "made-by-shell\n"
    );
    assert_eq!(
        std::fs::read_to_string(&hello).unwrap(),
        "hello from the fake model\n"
    );
    assert_eq!(
        kinds(&acts),
        [
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
    assert!(acts[1].tool_success && acts[4].tool_success, "{acts:#?}");
    assert_eq!(acts[0].tool_call_id, acts[1].tool_call_id);
    assert_eq!(acts[1].tool_name, "run_shell_command");
    assert_eq!(acts[6].content, "Created shell.txt and hello.txt.");
    // The real totals of the `result` stats: every call's prompt (cache reads included) and
    // its output, thinking tokens included.
    assert_eq!(token_sums(&acts), (1200 + 1300 + 2700, 40 + 30 + 20 + 5));
    let info = g.w.get(&s.id).await;
    assert_eq!((info.tokens_input, info.tokens_output), (5200, 95));

    // What the CLI sent: the model asked for, three calls, the tool results fed back.
    let reqs = g.fake.stream_requests();
    assert_eq!(reqs.len(), 3, "{reqs:#?}");
    for r in &reqs {
        assert_eq!(r.model(), GEMINI_MODEL);
        assert_eq!(r.headers["x-goog-api-key"], "paddock-test-key");
    }
    assert_conversation(
        &reqs[2],
        &[
            "Please create two files.",
            "call run_shell_command",
            "response run_shell_command",
            "call write_file",
            "response write_file",
        ],
    );
    // Nothing but streamGenerateContent was called.
    assert_eq!(g.fake.requests().len(), 3);

    insta::assert_yaml_snapshot!("gemini_tool_turn", g.render(&acts));
    g.w.stop(&s.id, true).await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn gemini_conversation_continues_across_turns_session_restarts_and_daemon_crashes() {
    conversation_survives_restarts::<G>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn gemini_model_api_errors_end_the_turn_with_an_error() {
    model_api_errors::<G>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn gemini_killed_mid_turn_is_obey_2031() {
    killed_mid_turn::<G>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn gemini_token_budget_crossed_by_real_usage_fails_the_session() {
    budget_crossed_by_real_usage::<G>().await;
}

impl Kit for G {
    fn push_text(&self, text: &str) {
        self.fake.push([Reply::text(text)]);
    }

    async fn start() -> Self {
        G::start(vec![]).await
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

    async fn agent(&self, s: &pb::SessionInfo) -> u32 {
        gemini_child(s.pid as u32).await
    }

    fn push_shell_turn(&self, command: &str, text: &str, usage: Option<[(u64, u64); 2]>) {
        let call = Reply::call(
            "run_shell_command",
            json!({"command": command, "description": "Run it"}),
        );
        self.fake
            .push(costing([call, Reply::text(text)], usage, |r, i, o| {
                r.usage(i, 0, o)
            }));
    }

    fn request(&self) -> pb::CreateSessionRequest {
        G::request(self)
    }

    /// gemini reports usage once, with the turn's result: the bridge puts the whole turn's
    /// tokens on the answer, which crosses the budget.
    fn budget_turn(&self, acts: &[pb::SessionActivityEvent]) {
        assert_eq!((acts[2].tokens_input, acts[2].tokens_output), (3100, 20));
    }

    /// The bridge, and the gemini CLI it runs for the turn.
    async fn agent_processes(&self, s: &pb::SessionInfo) -> Vec<(u32, &'static str)> {
        let cli = gemini_child(s.pid as u32).await;
        vec![(cli, "gemini"), (s.pid as u32, "__bridge")]
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn gemini_stop_during_a_tool_call_ends_the_tool_and_the_agent() {
    stop_during_a_tool_call::<G>().await;
}

/// A permission policy is gemini's `default` approval mode (with `--allowed-tools` for an
/// allow-list): headless, the CLI does not offer the model the tools that need approval at
/// all, and a call to one fails as an unknown tool; an allowed tool is offered and runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn gemini_permission_policy_becomes_its_approval_mode() {
    let g = G::start(vec![
        Reply::call(
            "run_shell_command",
            json!({"command": "echo no > denied.txt", "description": "Denied"}),
        ),
        Reply::text("Could not."),
    ])
    .await;
    let mut req = g.request();
    req.provider_config
        .insert("permissions".into(), "allow:read_file".into());
    let s = g.w.create(req).await;
    let acts = g.w.send(&s.id, "Write denied.txt.").await;
    assert_eq!(
        kinds(&acts),
        ["TOOL_CALL", "TOOL_RESULT", "TEXT", "COMPLETION"],
        "{acts:#?}"
    );
    assert!(!acts[1].tool_success);
    assert!(
        acts[1]
            .content
            .contains("Tool \"run_shell_command\" not found"),
        "{}",
        acts[1].content
    );
    assert!(!g.w.root.join("denied.txt").exists());
    let offered: Vec<String> = g.fake.stream_requests()[0].body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| {
            t["functionDeclarations"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|f| f["name"].as_str().map(String::from))
        .collect();
    assert!(offered.iter().any(|t| t == "read_file"), "{offered:?}");
    assert!(
        !offered
            .iter()
            .any(|t| t == "run_shell_command" || t == "write_file"),
        "{offered:?}"
    );
    g.w.stop(&s.id, true).await.expect("stop");

    // `allow:run_shell_command`: that tool, and no other that needs approval, is offered and
    // runs — but a command with a redirection (`>`) still needs a confirmation gemini cannot
    // ask for headless (its policy engine's `allowRedirection` defaults to false).
    g.fake.push([
        Reply::call(
            "run_shell_command",
            json!({"command": "echo no > redirected.txt", "description": "Redirected"}),
        ),
        Reply::call(
            "run_shell_command",
            json!({"command": "touch allowed.txt", "description": "Allowed"}),
        ),
        Reply::text("Done."),
    ]);
    let mut req = g.request();
    req.provider_config
        .insert("permissions".into(), "allow:run_shell_command".into());
    let s = g.w.create(req).await;
    let acts = g.w.send(&s.id, "Create two files.").await;
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
    assert!(!acts[1].tool_success, "{acts:#?}");
    assert!(
        acts[1].content.contains("requires user confirmation"),
        "{}",
        acts[1].content
    );
    assert!(!g.w.root.join("redirected.txt").exists());
    assert!(acts[3].tool_success, "{acts:#?}");
    assert!(g.w.root.join("allowed.txt").exists());
    let offered: Vec<String> = g.fake.stream_requests()[2].body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| {
            t["functionDeclarations"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|f| f["name"].as_str().map(String::from))
        .collect();
    assert!(
        offered.iter().any(|t| t == "run_shell_command"),
        "{offered:?}"
    );
    assert!(!offered.iter().any(|t| t == "write_file"), "{offered:?}");
    g.w.stop(&s.id, true).await.expect("stop");
}

/// A conversation gemini no longer has: the resumed CLI exits 42 at the next message, and the
/// bridge with it — a crash (OBEY-2031) that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn gemini_lost_conversation_fails_the_resumed_turn_with_the_cli_stderr() {
    let g = G::start(vec![Reply::text("First.")]).await;
    let s = g.session().await;
    g.w.send(&s.id, "Hello.").await;
    g.w.stop(&s.id, true).await.expect("stop");
    let tmp = g.w.home.join(".gemini/tmp");
    assert_eq!(g.conversations().len(), 1);
    std::fs::remove_dir_all(&tmp).unwrap();
    let r = g.w.restart(&s.id).await;
    assert!(cmdline(r.pid as u32).contains("--resume"), "{r:?}");
    let acts = g.w.send(&s.id, "Still there?").await;
    assert_eq!(kinds(&acts), ["ERROR"], "{acts:#?}");
    let f = g.w.wait_status(&s.id, S::Failed).await;
    assert_eq!(f.error_code, "OBEY-2031", "{f:?}");
    assert!(
        f.error_message.contains("exit code 42")
            && f.error_message.contains("Error resuming session"),
        "{}",
        f.error_message
    );
    // Only the first turn reached the model.
    assert_eq!(g.fake.stream_requests().len(), 1);
}

/// No CLI needed: a missing binary is refused at CreateSession with OBEY-2004, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_missing_cli_binary_is_obey_2004() {
    let w = World::start(vec![]).await;
    let missing = "/nonexistent/gemini-paddock-missing";
    assert_refused_2004(
        &w,
        pb::SessionProvider::Gemini,
        &[("command", missing)],
        missing,
    )
    .await;
}

/// The CLI's real stdout for a tool turn, compared by shape with the recording the bridge's
/// unit tests read (`tests/providers/recordings/gemini_stream.jsonl`). With
/// `PADDOCK_RECORD_FIXTURES=1` the recording is written anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn gemini_recorded_stream_is_current() {
    let g = G::start(vec![]).await;
    let hello = g.w.root.join("hello.txt");
    g.fake.push([
        Reply::call(
            "run_shell_command",
            json!({"command": "ls", "description": "List the project"}),
        )
        .thinking("Let me look around first.")
        .usage(900, 0, 25),
        Reply::call(
            "write_file",
            json!({"file_path": hello.display().to_string(), "content": "hi\n"}),
        )
        .saying("Writing it now.")
        .usage(950, 900, 15)
        .thoughts(3),
        Reply::text("Listed and wrote hello.txt.").usage(1010, 950, 12),
    ]);
    let out = tokio::process::Command::new(gemini_bin())
        .args([
            "--output-format",
            "stream-json",
            "--skip-trust",
            "-m",
            GEMINI_MODEL,
            "--approval-mode",
            "yolo",
            "--prompt=List the project, then write hello.txt.",
        ])
        .current_dir(&g.w.root)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &g.w.home)
        .env("GEMINI_CLI_NO_RELAUNCH", "true")
        .envs(g.env())
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = within(out).await.expect("run gemini");
    assert!(out.status.success(), "{:?}", out.status);
    assert!(hello.exists());
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let shape = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap_or(Value::Null);
                let mut keys: Vec<&str> = v
                    .as_object()
                    .map(|o| o.keys().map(String::as_str).collect())
                    .unwrap_or_default();
                keys.sort();
                format!("{} {}", v["type"].as_str().unwrap_or("?"), keys.join(","))
            })
            .collect()
    };
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/providers/recordings/gemini_stream.jsonl");
    if std::env::var_os("PADDOCK_RECORD_FIXTURES").is_some() {
        let redacted = text
            .replace(&g.w.root.display().to_string(), "/home/dev/proj")
            .replace(&g.w.home.display().to_string(), "/home/dev");
        std::fs::write(&fixture, redacted).unwrap();
        eprintln!("recorded {}", fixture.display());
    }
    let recorded = std::fs::read_to_string(&fixture).expect("the recording");
    assert_eq!(shape(&text), shape(&recorded), "{text}");
}

/// A second ACP agent, from another vendor: `gemini --acp` behind paddock's ACP bridge, a tool
/// turn that changes the project, the permission prompt answered by the session's policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn gemini_over_acp_runs_a_tool_turn() {
    let g = G::start(vec![]).await;
    let hello = g.w.root.join("hello.txt");
    g.fake.push([
        Reply::call(
            "write_file",
            json!({"file_path": hello.display().to_string(), "content": "hello over ACP\n"}),
        )
        .usage(1200, 0, 40),
        Reply::text("Wrote hello.txt.").usage(1300, 0, 20),
    ]);
    let mut env = g.env();
    let trace = g.w.base.join("acp-trace.jsonl");
    env.insert("PADDOCK_BRIDGE_TRACE".into(), trace.display().to_string());
    let req = pb::CreateSessionRequest {
        campaign_id: g.w.campaign_id.clone(),
        provider: pb::SessionProvider::Acp as i32,
        provider_config: [(
            "command".to_string(),
            format!("{} --acp", gemini_bin().display()),
        )]
        .into_iter()
        .collect(),
        environment: env,
        ..Default::default()
    };
    let s = g.w.create(req).await;
    let acts = g.w.send(&s.id, "Write hello.txt.").await;
    let trace = std::fs::read_to_string(&trace).unwrap_or_default();
    assert_eq!(
        std::fs::read_to_string(&hello).ok().as_deref(),
        Some("hello over ACP\n"),
        "{acts:#?}\n{trace}"
    );
    let k = kinds(&acts);
    assert!(
        k.contains(&"TOOL_CALL") && k.contains(&"TOOL_RESULT"),
        "{acts:#?}"
    );
    assert_eq!(k.last(), Some(&"COMPLETION"), "{acts:#?}");
    assert_eq!(acts.last().unwrap().content, "Wrote hello.txt.");
    g.w.stop(&s.id, true).await.expect("stop");
    wait_no_process_in(&g.w.root, Duration::from_secs(10)).await;
}

/// A client's own tool (sunbeam's client-side tools) offered to the real gemini through
/// paddock's MCP server (a socket the bridge serves, named in gemini's system settings; gemini
/// starts `paddock __mcp-relay`): the model calls it, the client answers it, the model reads
/// the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the npm CLIs: run .ci/run or `cd tests/npm && npm ci`"]
async fn gemini_calls_the_clients_tools_through_paddocks_mcp_server() {
    let g = G::start(vec![]).await;
    g.fake.push([
        Reply::call("mcp_paddock_run_tests", json!({"filter": "db"})),
        Reply::text("All green."),
    ]);
    let mut req = g.request();
    req.provider_config
        .insert("permissions".into(), "allow-all".into());
    // gemini reads its settings file only under directories no other user can write: not
    // under /tmp, where the test's HOME is. The bridge's cache directory goes under the
    // tester's own home for this test.
    let cache = g.w.dir_outside_tmp("paddock-gemini-mcp-");
    req.environment
        .insert("XDG_CACHE_HOME".into(), cache.display().to_string());
    req.provider_config
        .insert("client_tools".into(), RUN_TESTS_TOOL.into());
    let s = g.w.create(req).await;
    let turn = g.w.send_stream(&s.id, "Run the db tests.").await;
    client_tool_turn(&g.w, &s.id, turn).await;
    // The model read the client's result.
    let sent = g.fake.stream_requests();
    let last = sent.last().unwrap().body.to_string();
    assert!(last.contains("12 passed"), "{last}");
    g.w.stop(&s.id, true).await.expect("stop");
}

impl ApiErrors for G {
    const SNAPSHOT: &'static str = "gemini_api_errors";
    const AGENT: &'static str = "gemini";
    const TURNS: &'static [Option<u16>] = &[Some(500), Some(400), Some(429), None];

    fn push_error(&self, status: u16) {
        self.fake.push([Reply::error(status)]);
    }

    /// The CLI rewrites a 429's message: the status comes from its stderr, the words from
    /// the server.
    fn error_words(&self, status: u16, content: &str) {
        assert!(
            content.contains(&format!("fake {status} from the paddock test server")),
            "{content}"
        );
    }

    fn render(&self, acts: &[pb::SessionActivityEvent]) -> Value {
        G::render(self, acts)
    }
}

impl Conversation for G {
    /// The one conversation gemini stored.
    fn conversation(&self) -> String {
        let ids = self.conversations();
        assert_eq!(ids.len(), 1, "{ids:?}");
        ids[0].clone()
    }

    fn sent(&self) -> Vec<Sent> {
        let sent = self.fake.stream_requests();
        sent.iter()
            .map(|r| Sent {
                texts: r.texts(),
                conversation: None,
            })
            .collect()
    }

    /// Every turn resumed it: still one conversation.
    async fn after_conversation(&self, _s: &pb::SessionInfo) {
        assert_eq!(self.conversations().len(), 1);
    }
}
