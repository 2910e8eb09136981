//! The providers harness: the real `paddock daemon` on a temp socket and data dir, a fake
//! model server on 127.0.0.1, and the real agent CLI from `tests/npm` talking to it.
//!
//! Layout of a test's tempdir:
//!
//! ```text
//! <tmp>/home/                    HOME of the daemon and so of the agent (~/.claude lives here)
//! <tmp>/data/                    --data-dir
//! <tmp>/run/daemon.sock          --socket
//! <tmp>/project/                 the campaign root (README.md, src/main.rs)
//! <tmp>/daemon-<n>.stderr        each daemon start's stderr
//! ```

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use paddock_proto::obey::local::v1 as pb;
use pb::local_daemon_service_client::LocalDaemonServiceClient;
use serde_json::{json, Value};

use crate::fake_anthropic::{FakeAnthropic, Reply};

/// paddock's own client (it understands what paddock adds to the seeds: WAITING, Aria's session
/// notifications); a test of what a seed client sees builds a plain one.
pub type Client = paddock::cli::client::Client;

pub const BIN: &str = env!("CARGO_BIN_EXE_paddock");

/// Anything a test waits for, at most.
pub const WAIT: Duration = Duration::from_secs(30);

/// The model name sessions ask for: any name works against the fake server, and it must reach
/// the server unchanged.
pub const MODEL: &str = "claude-paddock-test";

/// The Claude Code CLI: `PADDOCK_CLAUDE_BIN`, else `tests/npm/node_modules/.bin/claude` (what
/// `cd tests/npm && npm ci` installs; the version is pinned in tests/npm/package.json).
pub fn claude_bin() -> PathBuf {
    npm_bin("PADDOCK_CLAUDE_BIN", "claude")
}

/// One test's world: directories, the fake model server, a daemon.
pub struct World {
    pub tmp: tempfile::TempDir,
    pub base: PathBuf,
    pub home: PathBuf,
    pub data: PathBuf,
    pub socket: PathBuf,
    pub root: PathBuf,
    pub fake: FakeAnthropic,
    daemon: Option<Child>,
    starts: u32,
    pub campaign_id: String,
    /// Directories outside the system's temporary directory ([`World::dir_outside_tmp`]),
    /// removed with the world.
    outside: std::sync::Mutex<Vec<tempfile::TempDir>>,
}

impl World {
    /// This world's directory named by `prefix` under the tester's own `~/.cache` (made on
    /// first use), not under /tmp, removed with the world: for agents that refuse to work from a temporary directory (gemini reads no
    /// settings file under one; codex 0.169 makes no sandbox helper for a CODEX_HOME in one,
    /// and then its sandboxed commands fail with "execvp codex-linux-sandbox").
    pub fn dir_outside_tmp(&self, prefix: &str) -> PathBuf {
        let mut made = self.outside.lock().unwrap();
        if let Some(d) = made.iter().find(|d| {
            d.path()
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        }) {
            return d.path().to_path_buf();
        }
        let under = dirs::home_dir().expect("a home").join(".cache");
        std::fs::create_dir_all(&under).unwrap();
        let d = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(&under)
            .unwrap();
        let path = d.path().to_path_buf();
        made.push(d);
        path
    }

    /// Directories, the fake server with `script`, a daemon and the campaign.
    pub async fn start(script: Vec<Reply>) -> World {
        let tmp = tempfile::Builder::new()
            .prefix("pdk-prov-")
            .tempdir()
            .unwrap();
        let base = std::fs::canonicalize(tmp.path()).unwrap();
        let home = base.join("home");
        let data = base.join("data");
        let root = base.join("project");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join("README.md"), "# project\n").unwrap();
        std::fs::write(root.join("src/main.rs"), "fn main() {}\n").unwrap();
        let fake = FakeAnthropic::start(script).await;
        let mut w = World {
            socket: base.join("run").join("daemon.sock"),
            tmp,
            base,
            home,
            data,
            root,
            fake,
            daemon: None,
            starts: 0,
            campaign_id: String::new(),
            outside: Default::default(),
        };
        w.launch().await;
        let c = w
            .client()
            .await
            .add_campaign(pb::AddCampaignRequest {
                name: "proj".into(),
                root_path: w.root.display().to_string(),
            })
            .await
            .expect("add campaign")
            .into_inner();
        w.campaign_id = c.id;
        w
    }

    /// Starts (again) the daemon; waits until it answers. A stop's TERM gets 10 s before KILL:
    /// Claude Code needs a few seconds to end its tool processes (which run in sessions of
    /// their own, out of reach of a signal to its process group).
    pub async fn launch(&mut self) {
        assert!(self.daemon.is_none());
        self.starts += 1;
        let log = self.base.join(format!("daemon-{}.stderr", self.starts));
        let child = Command::new(BIN)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &self.home)
            .env("PADDOCK_LOG", "info")
            .arg("daemon")
            .arg("--socket")
            .arg(&self.socket)
            .arg("--data-dir")
            .arg(&self.data)
            .args(["--stop-grace-secs", "2", "--kill-grace-secs", "10"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn daemon");
        self.daemon = Some(child);
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(st) = self.daemon.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "daemon exited at start ({st}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if let Ok(ch) = paddock::transport::channel(&self.socket).await {
                if LocalDaemonServiceClient::new(ch)
                    .ping(pb::PingRequest {})
                    .await
                    .is_ok()
                {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "the daemon did not answer");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILLs the daemon (its agents die with it, PDEATHSIG).
    pub fn kill9(&mut self) {
        let mut c = self.daemon.take().expect("daemon running");
        let _ = c.kill();
        let _ = c.wait();
    }

    pub fn daemon_stderr(&self) -> String {
        std::fs::read_to_string(self.base.join(format!("daemon-{}.stderr", self.starts)))
            .unwrap_or_default()
    }

    pub async fn client(&self) -> Client {
        paddock::cli::client::client_of(
            paddock::transport::conn(&self.socket)
                .await
                .expect("connect"),
        )
    }

    /// The environment a Claude Code session gets: the fake server, a dummy key, no side
    /// traffic, and no API retries (a 5xx would otherwise be retried with back-off for minutes).
    pub fn claude_env(&self) -> BTreeMap<String, String> {
        [
            ("ANTHROPIC_BASE_URL", self.fake.url()),
            ("ANTHROPIC_API_KEY", "sk-ant-paddock-test".to_string()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".to_string()),
            ("CLAUDE_CODE_MAX_RETRIES", "0".to_string()),
            ("DISABLE_AUTOUPDATER", "1".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// A CreateSession request for Claude Code in the campaign.
    pub fn claude_request(&self) -> pb::CreateSessionRequest {
        pb::CreateSessionRequest {
            campaign_id: self.campaign_id.clone(),
            provider: pb::SessionProvider::ClaudeCode as i32,
            model: MODEL.into(),
            provider_config: [("command".to_string(), claude_bin().display().to_string())]
                .into_iter()
                .collect(),
            environment: self.claude_env(),
            ..Default::default()
        }
    }

    /// Creates a session. These tests are about each agent's adapter, not about the default
    /// permissions (on the host: ask, or read-only for agents that cannot ask): a session whose
    /// request names no policy gets `allow-all`, and a test of a policy names its own.
    pub async fn create(&self, mut req: pb::CreateSessionRequest) -> pb::SessionInfo {
        req.provider_config
            .entry("permissions".into())
            .or_insert_with(|| "allow-all".into());
        within(self.client().await.create_session(req))
            .await
            .expect("create session")
            .into_inner()
            .session
            .unwrap()
    }

    /// A Claude Code session with default settings.
    pub async fn claude(&self) -> pb::SessionInfo {
        self.create(self.claude_request()).await
    }

    pub async fn get(&self, id: &str) -> pb::SessionInfo {
        self.client()
            .await
            .get_session(pb::GetSessionRequest {
                session_id: id.into(),
            })
            .await
            .expect("get session")
            .into_inner()
    }

    /// Starts a turn; the open stream.
    pub async fn send_stream(
        &self,
        id: &str,
        msg: &str,
    ) -> tonic::Streaming<pb::SessionActivityEvent> {
        self.client()
            .await
            .send_message(pb::SendMessageRequest {
                session_id: id.into(),
                message: msg.into(),
            })
            .await
            .expect("send message")
            .into_inner()
    }

    /// One whole turn: every activity until the stream ends.
    pub async fn send(&self, id: &str, msg: &str) -> Vec<pb::SessionActivityEvent> {
        let s = self.send_stream(id, msg).await;
        collect(s).await
    }

    pub async fn stop(&self, id: &str, graceful: bool) -> Result<pb::SessionInfo, tonic::Status> {
        within(self.client().await.stop_session(pb::StopSessionRequest {
            session_id: id.into(),
            graceful,
        }))
        .await
        .map(|r| r.into_inner().session.unwrap())
    }

    async fn restart_result(&self, id: &str) -> Result<pb::SessionInfo, tonic::Status> {
        within(
            self.client()
                .await
                .restart_session(pb::RestartSessionRequest {
                    session_id: id.into(),
                    ..Default::default()
                }),
        )
        .await
        .map(|r| r.into_inner().session.unwrap())
    }

    pub async fn restart(&self, id: &str) -> pb::SessionInfo {
        self.restart_result(id).await.expect("restart session")
    }

    /// Every session the daemon has, ended ones too.
    pub async fn all_sessions(&self) -> Vec<pb::SessionInfo> {
        self.client()
            .await
            .list_sessions(pb::ListSessionsRequest {
                include_terminated: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .sessions
    }

    /// A restart refused: its start failed (the agent exited before it was ready), OBEY-2004.
    pub async fn restart_refused(&self, id: &str) -> tonic::Status {
        let e = self
            .restart_result(id)
            .await
            .expect_err("the restart's start fails");
        assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
        assert!(e.message().starts_with("OBEY-2004: "), "{}", e.message());
        e
    }

    /// Every stored activity of a session.
    pub async fn activities(&self, id: &str) -> Vec<pb::SessionActivityEvent> {
        self.client()
            .await
            .list_activities(pb::ListActivitiesRequest {
                session_id: id.into(),
                after_seq: 0,
                limit: 0,
            })
            .await
            .expect("list activities")
            .into_inner()
            .activities
    }

    pub async fn wait_status(&self, id: &str, status: pb::SessionStatus) -> pb::SessionInfo {
        let deadline = Instant::now() + WAIT;
        loop {
            let s = self.get(id).await;
            if s.status == status as i32 {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "session never became {status:?}: {s:?}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Redacts this world's paths and the fake server's address.
    pub fn redact(&self, s: &str) -> String {
        s.replace(&self.root.display().to_string(), "<root>")
            .replace(&self.base.display().to_string(), "<tmp>")
            .replace(&self.fake.addr.to_string(), "<fake-server>")
    }

    /// Activities as small JSON values for a snapshot: kind, content (paths redacted), tool,
    /// success, tokens. No ids, sequence numbers or timestamps.
    pub fn render(&self, list: &[pb::SessionActivityEvent]) -> Value {
        Value::Array(
            list.iter()
                .map(|a| {
                    let mut v = json!({"type": kind(a), "content": self.redact(&a.content)});
                    let o = v.as_object_mut().unwrap();
                    if !a.tool_name.is_empty() {
                        o.insert("tool".into(), json!(a.tool_name));
                    }
                    if a.r#type == pb::ActivityType::ToolResult as i32 {
                        o.insert("success".into(), json!(a.tool_success));
                    }
                    if a.tokens_input != 0 || a.tokens_output != 0 {
                        o.insert("tokens".into(), json!([a.tokens_input, a.tokens_output]));
                    }
                    v
                })
                .collect(),
        )
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(mut c) = self.daemon.take() {
            if let Ok(None) = c.try_wait() {
                let _ = kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM);
                // (The daemon under test may take its time to close its servers; its agents
                // die with it either way, through PDEATHSIG.)
                let deadline = Instant::now() + Duration::from_secs(5);
                while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                    std::thread::sleep(Duration::from_millis(25));
                }
                let _ = c.kill();
            }
            let _ = c.wait();
        }
        // What a daemon or runner killed before its clean exit left in the cgroup tree.
        paddock::contain::remove_groups(&self.data);
    }
}

pub async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(WAIT, f)
        .await
        .expect("timed out waiting for the daemon")
}

/// Every item of a turn stream; a stream error is a test failure.
pub async fn collect(
    mut s: tonic::Streaming<pb::SessionActivityEvent>,
) -> Vec<pb::SessionActivityEvent> {
    let mut out = Vec::new();
    loop {
        match within(s.message()).await {
            Ok(Some(a)) => out.push(a),
            Ok(None) => return out,
            Err(e) => panic!("stream error after {out:?}: {e:?}"),
        }
    }
}

/// The next item of a stream.
pub async fn next(
    s: &mut tonic::Streaming<pb::SessionActivityEvent>,
) -> Option<pb::SessionActivityEvent> {
    within(s.message()).await.expect("stream error")
}

pub fn kind(a: &pb::SessionActivityEvent) -> &'static str {
    pb::ActivityType::try_from(a.r#type)
        .map(|t| t.as_str_name().trim_start_matches("ACTIVITY_TYPE_"))
        .unwrap_or("?")
}

pub fn kinds(list: &[pb::SessionActivityEvent]) -> Vec<&'static str> {
    list.iter().map(kind).collect()
}

pub fn status_name(n: i32) -> &'static str {
    pb::SessionStatus::try_from(n)
        .map(|s| s.as_str_name().trim_start_matches("SESSION_STATUS_"))
        .unwrap_or("?")
}

pub fn token_sums(list: &[pb::SessionActivityEvent]) -> (i64, i64) {
    list.iter().fold((0, 0), |(i, o), a| {
        (i + a.tokens_input, o + a.tokens_output)
    })
}

// ── processes ──────────────────────────────────────────────────────────────────────────────────

/// Pids of live processes whose command line contains `needle`.
pub fn processes_with(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if cmd.contains(needle) && alive(pid) {
            out.push(pid);
        }
    }
    out
}

/// True while `pid` is a live (not zombie) process.
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .and_then(|(_, r)| r.trim_start().chars().next()),
            Some('Z') | Some('X') | None
        ),
    }
}

/// The command line of `pid`, arguments joined by spaces.
pub fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .unwrap_or_default()
}

/// Waits until no live process has `needle` in its command line.
pub async fn wait_no_process(needle: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let left = processes_with(needle);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "processes still running with {needle:?}: {:?}",
            left.iter().map(|p| cmdline(*p)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the agent process `pid` is gone (a reused pid running something else counts
/// as gone).
pub async fn wait_gone(pid: u32) {
    let deadline = Instant::now() + WAIT;
    while alive(pid) && cmdline(pid).contains("claude") {
        assert!(
            Instant::now() < deadline,
            "agent {pid} still running: {}",
            cmdline(pid)
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Waits until `path` exists.
pub async fn wait_file(path: &Path, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// An npm-installed CLI: `$env_var`, else `tests/npm/node_modules/.bin/<name>` (what
/// `cd tests/npm && npm ci` installs; versions pinned in tests/npm/package.json).
pub fn npm_bin(env_var: &str, name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env_var) {
        return PathBuf::from(p);
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/npm/node_modules/.bin")
        .join(name);
    assert!(
        p.exists(),
        "{name} is not installed at {}: run `cd tests/npm && npm ci` (or set {env_var})",
        p.display()
    );
    std::fs::canonicalize(&p).unwrap()
}

/// The parent of process `pid`, from /proc.
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid …`: comm may hold spaces and parentheses; ppid follows the last ')'.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Processes whose working directory is `dir` (or below it): what an agent started there.
pub fn processes_in(dir: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(dir))
        })
        .collect()
}

/// Waits until no process works in `dir` (at most `limit`).
pub async fn wait_no_process_in(dir: &Path, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let left = processes_in(dir);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "processes still work in {}: {:?}",
            dir.display(),
            left.iter().map(|p| cmdline(*p)).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

// ── gemini ─────────────────────────────────────────────────────────────────────────────────────

/// The Gemini CLI: `PADDOCK_GEMINI_BIN`, else `tests/npm/node_modules/.bin/gemini` (the version
/// is pinned in tests/npm/package.json).
pub fn gemini_bin() -> PathBuf {
    npm_bin("PADDOCK_GEMINI_BIN", "gemini")
}

/// Pids of the live children of `pid`.
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Ok(child) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // pid (comm) state ppid …
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) && alive(child) {
            out.push(child);
        }
    }
    out
}

/// Waits until `pid` is gone or runs something without `needle` in its command line.
pub async fn wait_gone_with(pid: u32, needle: &str) {
    let deadline = Instant::now() + WAIT;
    while alive(pid) && cmdline(pid).contains(needle) {
        assert!(
            Instant::now() < deadline,
            "process {pid} still running: {}",
            cmdline(pid)
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Waits until the file at `path` holds exactly `content` (at most `limit`).
pub async fn wait_file_content(path: &Path, content: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    while std::fs::read_to_string(path).ok().as_deref() != Some(content) {
        assert!(
            Instant::now() < deadline,
            "{} never held {content:?}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Asserts that CreateSession for `provider` with `config` is refused with OBEY-2004
/// (FAILED_PRECONDITION), its message naming `naming`.
pub async fn assert_refused_2004(
    w: &World,
    provider: pb::SessionProvider,
    config: &[(&str, &str)],
    naming: &str,
) {
    let req = pb::CreateSessionRequest {
        campaign_id: w.campaign_id.clone(),
        provider: provider as i32,
        provider_config: config
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    let e = within(w.client().await.create_session(req))
        .await
        .expect_err("refused");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().starts_with("OBEY-2004"), "{}", e.message());
    assert!(e.message().contains(naming), "{}", e.message());
}

/// Asserts that `expected` appear in `texts` (what a CLI sent its model), in this order; other
/// texts may come between them (CLIs add system reminders).
#[track_caller]
pub fn assert_in_order(texts: &[String], expected: &[&str]) {
    let mut at = 0;
    for e in expected {
        match texts[at..].iter().position(|t| t.contains(e)) {
            Some(i) => at += i + 1,
            None => panic!("{e:?} is not in the conversation sent (in order): {texts:#?}"),
        }
    }
}

/// Waits for the session's next open request for a human, then resolves it (`text`: the deny
/// reason or the answer). Returns the request as it was asked.
pub async fn resolve_next(
    w: &World,
    session: &str,
    decision: pb::ApprovalDecision,
    text: &str,
) -> pb::Approval {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let a = loop {
        let open = w
            .client()
            .await
            .list_approvals(pb::ListApprovalsRequest {
                session_id: session.into(),
                ..Default::default()
            })
            .await
            .expect("list approvals")
            .into_inner()
            .approvals;
        if let Some(a) = open.into_iter().last() {
            break a;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the agent never asked; session is {}",
            status_name(w.get(session).await.status)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status_name(w.get(session).await.status), "WAITING");
    w.client()
        .await
        .resolve_approval(pb::ResolveApprovalRequest {
            approval_id: a.id.clone(),
            decision: decision as i32,
            text: text.into(),
            is_error: false,
            resolved_by: "test".into(),
        })
        .await
        .expect("resolve");
    a
}

/// The client tool of the client-tool tests: `run_tests`, with a `filter`.
pub const RUN_TESTS_TOOL: &str = r#"[{"name":"run_tests","description":"Run the test suite on the client","schema_json":"{\"type\":\"object\",\"properties\":{\"filter\":{\"type\":\"string\"}}}"}]"#;

/// A turn in which the model calls the client's `run_tests` with `{"filter": "db"}`: the call
/// is the client's request (answered "12 passed" here), shows under the client's name, and the
/// turn completes. Returns the turn's activities.
pub async fn client_tool_turn(
    w: &World,
    session: &str,
    turn: tonic::Streaming<pb::SessionActivityEvent>,
) -> Vec<pb::SessionActivityEvent> {
    let call = resolve_next(w, session, pb::ApprovalDecision::Answer, "12 passed").await;
    assert_eq!(call.kind, pb::ApprovalKind::ClientTool as i32);
    assert_eq!(call.tool_name, "run_tests");
    assert!(call.input_json.contains("\"db\""), "{call:?}");
    let acts = collect(turn).await;
    assert_eq!(kind(acts.last().unwrap()), "COMPLETION", "{acts:#?}");
    assert!(
        acts.iter()
            .any(|a| kind(a) == "TOOL_CALL" && a.tool_name == "run_tests"),
        "{acts:#?}"
    );
    acts
}
