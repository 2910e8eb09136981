//! The e2e harness: one real `paddock daemon` per test, on a real Unix socket and a real SQLite
//! data dir, everything inside one tempdir that also holds the test's HOME and a campaign root
//! with a few known files (so directory listings are deterministic).
//!
//! Layout of a test's tempdir:
//!
//! ```text
//! <tmp>/home/                      HOME of the daemon and of every CLI run
//! <tmp>/data/                      --data-dir (paddock.db, daemon.lock)
//! <tmp>/run/paddock/daemon.sock    --socket (the daemon creates run/paddock/ itself, 0700)
//! <tmp>/project/                   the campaign root:
//!     README.md  notes.txt  scripts/  src/main.rs
//! <tmp>/daemon-<n>.stderr          each daemon start's stderr (printed when a start fails)
//! ```
//!
//! Scripts for the scripted agent go in `project/scripts/` (a directory that always exists, so
//! writing one never changes the campaign root's listing) and are passed as
//! `provider_config["script"] = "scripts/<name>.json"`.
//!
//! [`Daemon`]'s `Drop` stops the daemon (SIGTERM, up to 5 s, then SIGKILL) and so every child
//! of it (children die with the daemon through PDEATHSIG).
//!
//! Tests run on `#[tokio::test(flavor = "multi_thread", worker_threads = 2)]`: `Drop` blocks its
//! thread while the daemon exits, and the daemon's graceful HTTP/2 shutdown waits for the
//! test's client connections to acknowledge it, which needs a second runtime thread to run
//! them. (On a current-thread runtime every daemon would sit out the 5 s and be SIGKILLed.)

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use paddock_proto::obey::local::v1 as pb;
use pb::local_daemon_service_client::LocalDaemonServiceClient;
use serde_json::{json, Value};

/// paddock's own client (it understands what paddock adds to the seeds: WAITING, Aria's session
/// notifications); a test of what a seed client sees builds a plain one.
pub type Client = paddock::cli::client::Client;

/// `message` as paddock's own clients send it: saying it understands what paddock adds to the
/// seeds (`paddock-extensions: all`).
pub fn aware<T>(message: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.metadata_mut()
        .insert(paddock::api::extensions::KEY, "all".parse().unwrap());
    r
}

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_paddock");

/// Anything a test waits for, at most (a hung daemon fails the test instead of hanging it).
pub const WAIT: Duration = Duration::from_secs(30);

/// The name the default campaign is registered under.
pub const CAMPAIGN: &str = "proj";

/// The campaign root's listing, as the scripted agent's `LS` prints it.
pub const ROOT_LISTING: &str = "README.md\nnotes.txt\nscripts/\nsrc/";

/// One test's directories (independent of any daemon, which may be started several times).
pub struct Dirs {
    pub tmp: tempfile::TempDir,
    /// Canonical path of the tempdir.
    pub base: PathBuf,
    pub home: PathBuf,
    pub data: PathBuf,
    pub socket: PathBuf,
    /// Campaign root (canonical, as AddCampaign stores it).
    pub root: PathBuf,
}

/// The shell lines that make a shell stand-in for an agent answer paddock's ready request (the
/// first line every agent reads: a `control_request` with id `paddock-ready`), so that its
/// session runs.
pub const ANSWER_READY: &str = "read -r _\nprintf '%s\\n' \
    '{\"type\":\"control_response\",\"response\":{\"subtype\":\"success\",\"request_id\":\"paddock-ready\",\"response\":{}}}'\n";

impl Dirs {
    /// A command prefix (`<prefix> sh -c '…'`) that answers paddock's ready request and then
    /// runs the rest of its command line: for agents that are shell stand-ins.
    pub fn ready_then(&self) -> String {
        use std::os::unix::fs::PermissionsExt;
        let p = self.base.join("ready-then");
        if !p.exists() {
            std::fs::write(&p, format!("#!/bin/sh\n{ANSWER_READY}exec \"$@\"\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        p.display().to_string()
    }

    pub fn new() -> Dirs {
        let tmp = tempfile::Builder::new()
            .prefix("pdk-e2e-")
            .tempdir()
            .expect("tempdir");
        let base = std::fs::canonicalize(tmp.path()).expect("canonical tempdir");
        let home = base.join("home");
        let data = base.join("data");
        let root = base.join("project");
        // The test user has logged in to Claude Code (claude-code sessions here run stand-in
        // agents; a create is refused without a login, see `errors.rs`).
        std::fs::create_dir_all(home.join(".claude")).unwrap();
        std::fs::write(home.join(".claude/.credentials.json"), "{}").unwrap();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::create_dir_all(root.join("scripts")).unwrap();
        std::fs::write(root.join("README.md"), "# project\nAn e2e test campaign.\n").unwrap();
        std::fs::write(root.join("notes.txt"), "remember the milk\n").unwrap();
        std::fs::write(root.join("src/main.rs"), "fn main() {}\n").unwrap();
        Dirs {
            socket: base.join("run").join("paddock").join("daemon.sock"),
            tmp,
            base,
            home,
            data,
            root,
        }
    }

    /// Writes `project/scripts/<name>.json`; returns the path relative to the campaign root
    /// (what `provider_config["script"]` takes).
    pub fn script(&self, name: &str, script: &Value) -> String {
        let rel = format!("scripts/{name}.json");
        std::fs::write(
            self.root.join(&rel),
            serde_json::to_string_pretty(script).unwrap(),
        )
        .unwrap();
        rel
    }

    /// A `paddock` CLI command talking to this test's socket and data dir, with HOME in the
    /// tempdir and no inherited paddock / XDG settings. Autostart is off unless `autostart`.
    pub fn cli(&self, autostart: bool) -> Command {
        let mut c = Command::new(BIN);
        c.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &self.home)
            .env("PADDOCK_LOG", "warn")
            // `session create` without --provider: the scripted agent, not whatever is found.
            .env("PADDOCK_PROVIDER", "scripted")
            .arg("--socket")
            .arg(&self.socket)
            .arg("--data-dir")
            .arg(&self.data)
            .stdin(Stdio::null());
        if !autostart {
            c.arg("--no-autostart");
        }
        c
    }
}

/// A running daemon (and the test's directories).
pub struct Daemon {
    pub dirs: Dirs,
    child: Option<Child>,
    starts: u32,
    campaign_id: Option<String>,
    /// More `daemon` arguments (e.g. `--max-sessions 2`), for every launch.
    pub extra_args: Vec<String>,
    /// More environment for the daemon (e.g. `PADDOCK_LOG=debug`), for every launch.
    pub extra_env: Vec<(String, String)>,
}

impl Daemon {
    /// Fresh directories and a daemon answering on the socket.
    pub async fn start() -> Daemon {
        Daemon::start_in(Dirs::new()).await
    }

    pub async fn start_in(dirs: Dirs) -> Daemon {
        Daemon::start_with(dirs, &[]).await
    }

    /// As [`Daemon::start_in`], with more `daemon` arguments.
    pub async fn start_with(dirs: Dirs, extra_args: &[&str]) -> Daemon {
        Daemon::start_with_env(dirs, extra_args, &[]).await
    }

    /// [`Daemon::start_with`], with more environment for the daemon.
    pub async fn start_with_env(dirs: Dirs, extra_args: &[&str], env: &[(&str, &str)]) -> Daemon {
        let mut d = Daemon {
            dirs,
            child: None,
            starts: 0,
            campaign_id: None,
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            extra_env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        d.launch().await;
        d
    }

    /// The `daemon` command for these dirs (short grace periods), not started.
    pub fn daemon_command(dirs: &Dirs, socket: &Path, data: &Path, stderr: Stdio) -> Command {
        Daemon::daemon_command_with(dirs, socket, data, stderr, &[])
    }

    /// [`Daemon::daemon_command`] with more arguments; a grace period among them replaces the
    /// short default one.
    pub fn daemon_command_with(
        dirs: &Dirs,
        socket: &Path,
        data: &Path,
        stderr: Stdio,
        extra: &[String],
    ) -> Command {
        let mut c = Command::new(BIN);
        c.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &dirs.home)
            .env("PADDOCK_LOG", "warn")
            .arg("daemon")
            .arg("--socket")
            .arg(socket)
            .arg("--data-dir")
            .arg(data)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        for (flag, short) in [
            ("--stop-grace-secs", "2"),
            ("--kill-grace-secs", "1"),
            ("--end-grace-secs", "1"),
        ] {
            if !extra.iter().any(|a| a == flag) {
                c.args([flag, short]);
            }
        }
        c.args(extra);
        c
    }

    /// Starts (again) a daemon on the same socket and data dir; waits until it answers.
    pub async fn launch(&mut self) {
        assert!(self.child.is_none(), "a daemon is already running");
        self.starts += 1;
        let log = self.stderr_path();
        let f = std::fs::File::create(&log).unwrap();
        let child = Daemon::daemon_command_with(
            &self.dirs,
            &self.dirs.socket,
            &self.dirs.data,
            Stdio::from(f),
            &self.extra_args,
        )
        .envs(self.extra_env.iter().map(|(k, v)| (k, v)))
        .spawn()
        .expect("spawn daemon");
        self.child = Some(child);
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(st) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                panic!(
                    "the daemon exited at start-up ({st}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            if let Ok(ch) = paddock::transport::channel(&self.dirs.socket).await {
                let mut c = LocalDaemonServiceClient::new(ch);
                if c.ping(pb::PingRequest {}).await.is_ok() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the daemon did not answer within {WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn stderr_path(&self) -> PathBuf {
        self.dirs
            .base
            .join(format!("daemon-{}.stderr", self.starts))
    }

    /// What the current (or last) daemon printed on stderr.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.stderr_path()).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("daemon running").id()
    }

    /// A new client on the socket.
    pub async fn client(&self) -> Client {
        let ch = paddock::transport::conn(&self.dirs.socket)
            .await
            .expect("connect");
        paddock::cli::client::client_of(ch)
    }

    /// SIGKILLs the daemon and reaps it (its children get PDEATHSIG).
    pub fn kill9(&mut self) {
        let mut child = self.child.take().expect("daemon running");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Asks the daemon to shut down gracefully (Shutdown, not forced) and waits up to `limit`
    /// for it to exit; its exit status.
    pub async fn shut_down(&mut self, limit: Duration) -> ExitStatus {
        self.client()
            .await
            .shutdown(pb::ShutdownRequest { force: false })
            .await
            .expect("shutdown");
        self.wait_exit(limit).await
    }

    /// Waits up to `limit` for the daemon to exit on its own; its exit status.
    pub async fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(st) = self
                .child
                .as_mut()
                .expect("daemon running")
                .try_wait()
                .unwrap()
            {
                self.child = None;
                return st;
            }
            assert!(
                Instant::now() < deadline,
                "the daemon did not exit within {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Registers the default campaign (once) and returns its id.
    pub async fn campaign(&mut self) -> String {
        if let Some(id) = &self.campaign_id {
            return id.clone();
        }
        let c = self
            .client()
            .await
            .add_campaign(pb::AddCampaignRequest {
                name: CAMPAIGN.into(),
                root_path: self.dirs.root.display().to_string(),
            })
            .await
            .expect("add campaign")
            .into_inner();
        self.campaign_id = Some(c.id.clone());
        c.id
    }

    /// `Execute` of `command` through `sh -c` in the default campaign: its output stream.
    pub async fn execute_shell(&mut self, command: &str) -> tonic::Streaming<pb::ExecuteResponse> {
        let campaign_id = self.campaign().await;
        self.client()
            .await
            .execute(pb::ExecuteRequest {
                campaign_id,
                command: command.into(),
                use_shell: true,
                ..Default::default()
            })
            .await
            .expect("execute")
            .into_inner()
    }

    /// A CreateSessionRequest for the scripted agent in the default campaign, with `script`
    /// (a JSON script written to scripts/<name>.json) if given.
    pub async fn request(&mut self, script: Option<(&str, Value)>) -> pb::CreateSessionRequest {
        let campaign_id = self.campaign().await;
        let mut provider_config = BTreeMap::new();
        if let Some((name, s)) = script {
            provider_config.insert("script".to_string(), self.dirs.script(name, &s));
        }
        pb::CreateSessionRequest {
            campaign_id,
            provider: pb::SessionProvider::Scripted as i32,
            provider_config,
            ..Default::default()
        }
    }

    /// Creates a session; panics on refusal.
    pub async fn create(&mut self, req: pb::CreateSessionRequest) -> pb::SessionInfo {
        self.client()
            .await
            .create_session(req)
            .await
            .expect("create session")
            .into_inner()
            .session
            .expect("session in response")
    }

    /// Creates a scripted session (built-in behaviour if `script` is None).
    pub async fn session(&mut self, script: Option<(&str, Value)>) -> pb::SessionInfo {
        let req = self.request(script).await;
        self.create(req).await
    }

    /// Sends `text` to session `id`; the turn's activity stream, unread.
    pub async fn start_turn(
        &self,
        id: &str,
        text: &str,
    ) -> tonic::Streaming<pb::SessionActivityEvent> {
        self.client()
            .await
            .send_message(pb::SendMessageRequest {
                session_id: id.into(),
                message: text.into(),
            })
            .await
            .expect("send a message")
            .into_inner()
    }

    /// Every session the daemon has, stopped and failed ones included.
    pub async fn all_sessions(&self) -> Vec<pb::SessionInfo> {
        self.client()
            .await
            .list_sessions(pb::ListSessionsRequest {
                include_terminated: true,
                ..Default::default()
            })
            .await
            .expect("list sessions")
            .into_inner()
            .sessions
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

    /// Every activity stored for session `id`, in order.
    pub async fn stored_activities(&self, id: &str) -> Vec<pb::SessionActivityEvent> {
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

    /// Sends a message and collects the whole activity stream.
    pub async fn send(&self, id: &str, message: &str) -> Vec<pb::SessionActivityEvent> {
        let stream = self
            .client()
            .await
            .send_message(pb::SendMessageRequest {
                session_id: id.into(),
                message: message.into(),
            })
            .await
            .expect("send message")
            .into_inner();
        collect_ok(stream).await
    }

    /// WatchActivity of session `id`: its activities after sequence number `after`, then live.
    pub async fn watch_activity(
        &self,
        id: &str,
        after: i64,
    ) -> tonic::Streaming<pb::SessionActivityEvent> {
        self.client()
            .await
            .watch_activity(pb::WatchActivityRequest {
                session_id: id.into(),
                after_seq: after,
            })
            .await
            .expect("watch activity")
            .into_inner()
    }

    pub async fn stop(&self, id: &str, graceful: bool) -> Result<pb::SessionInfo, tonic::Status> {
        within(self.client().await.stop_session(pb::StopSessionRequest {
            session_id: id.into(),
            graceful,
        }))
        .await
        .map(|r| r.into_inner().session.expect("session in response"))
    }

    /// Waits until the session is as `done` says (polling GetSession); `what` names the wait
    /// in the failure.
    pub async fn wait_until(
        &self,
        id: &str,
        what: &str,
        done: impl Fn(&pb::SessionInfo) -> bool,
    ) -> pb::SessionInfo {
        let deadline = Instant::now() + WAIT;
        loop {
            let s = self.get(id).await;
            if done(&s) {
                return s;
            }
            assert!(Instant::now() < deadline, "session {id}: {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits until the session has `status` (polling GetSession).
    pub async fn wait_status(&self, id: &str, status: pb::SessionStatus) -> pb::SessionInfo {
        let deadline = Instant::now() + WAIT;
        loop {
            let s = self.get(id).await;
            if s.status == status as i32 {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "session {id} never became {status:?} (is {})",
                status_name(s.status)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            stop_child(&mut child);
        }
        // A daemon's runner outlives it by design: stop every runner this test started.
        for pid in self.all_runner_pids() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while pid_running(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        // What a SIGKILLed daemon or runner left in the machine's cgroup tree.
        paddock::contain::remove_groups(&self.dirs.data);
    }
}

fn runner_pid_in(data_dir: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(data_dir.join("runner.sock.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    pid_running(pid).then_some(pid)
}

impl Daemon {
    /// The pid of the runner of this data dir, if one is running.
    pub fn runner_pid(&self) -> Option<u32> {
        runner_pid_in(&self.dirs.data)
    }

    /// Runners of every data dir under this test's tempdir (tests may start daemons on other
    /// data dirs too).
    fn all_runner_pids(&self) -> Vec<u32> {
        let Ok(entries) = std::fs::read_dir(&self.dirs.base) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter_map(|e| runner_pid_in(&e.path()))
            .collect()
    }
}

/// SIGTERM, up to 5 s, then SIGKILL; always reaped.
pub fn stop_child(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
    }
    let _ = child.wait();
}

/// Kills a process that is not our child (an autostarted daemon) when dropped, if it still
/// runs.
pub struct PidGuard(pub u32);

impl Drop for Dirs {
    /// What a daemon or runner of these dirs that was not stopped cleanly (an autostarted one,
    /// one a test SIGKILLed) left: an autostarted daemon still shutting down (`shutdown`
    /// answers before it has stopped, and the test may end first: it then wrote into the
    /// directory being removed, which was left half removed), a runner still running, and
    /// groups in the machine's cgroup tree. The daemon goes first: it stops its runner.
    fn drop(&mut self) {
        for role in ["daemon", "runner"] {
            for pid in processes_of(role, &self.data) {
                drop(PidGuard(pid));
            }
        }
        paddock::contain::remove_groups(&self.data);
        // A file system a test mounted inside them (the disk-full tests' tmpfs on the data
        // dir) is unmounted, or removing the directories fails (EBUSY) half way and leaves
        // them behind.
        for at in mounts_under(&self.base) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&at)
                .status();
        }
    }
}

/// The mount points at or below `dir`, deepest first (from `/proc/self/mountinfo`).
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|at| at.starts_with(dir))
        .collect();
    found.sort_by_key(|at| std::cmp::Reverse(at.components().count()));
    found
}

/// The live `paddock <role>` processes working in `data` (their command line names it).
fn processes_of(role: &str, data: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let (role, data) = (format!(" {role} "), data.to_string_lossy());
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c).replace('\0', " ");
                c.contains(&role) && c.contains(&*data)
            })
        })
        .filter(|pid| pid_running(*pid))
        .collect()
}

/// Removes the control groups recorded in every data dir under `dir` (a `cgroup-runner` or
/// `cgroup-daemon` file): for a runner the test SIGKILLed outside a [`Dirs`] (a fake pod's, an
/// ssh host's), which could not remove them itself; else the machine's cgroup tree keeps one
/// empty group per run of the test. What the groups still hold is killed.
pub fn release_groups_under(dir: &Path) {
    fn walk(dir: &Path, depth: usize) {
        const DEPTH_MAX: usize = 6;
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut recorded = false;
        for e in entries.flatten() {
            let Ok(kind) = e.file_type() else { continue };
            if kind.is_dir() && depth < DEPTH_MAX {
                walk(&e.path(), depth + 1);
            } else if kind.is_file() && e.file_name().to_string_lossy().starts_with("cgroup-") {
                recorded = true;
            }
        }
        if recorded {
            paddock::contain::remove_groups(dir);
        }
    }
    walk(dir, 0)
}

impl Drop for PidGuard {
    fn drop(&mut self) {
        if pid_running(self.0) {
            let _ = kill(Pid::from_raw(self.0 as i32), Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while pid_running(self.0) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = kill(Pid::from_raw(self.0 as i32), Signal::SIGKILL);
        }
    }
}

// ── processes ──────────────────────────────────────────────────────────────────────────────────

/// True while `pid` is a live (not zombie) process.
pub fn pid_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            // "pid (comm) S …": the state follows the last ')'.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X') | None)
        }
    }
}

/// Waits until `pid` is gone; fails, naming `what`, if it is still running after `within`.
pub async fn wait_pid_gone(pid: u32, within: Duration, what: &str) {
    let deadline = Instant::now() + within;
    while pid_running(pid) {
        assert!(Instant::now() < deadline, "{what} ({pid}) is still running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// True while `pid` is a live scripted agent (a pid reused by something else does not count).
pub fn agent_running(pid: u32) -> bool {
    pid_running(pid)
        && std::fs::read(format!("/proc/{pid}/cmdline"))
            .map(|c| String::from_utf8_lossy(&c).contains("__scripted-agent"))
            .unwrap_or(false)
}

/// Asserts the agent process `pid` is gone (waiting up to `WAIT` for it to go).
pub async fn assert_agent_gone(pid: i32) {
    assert!(pid > 0, "no pid to check");
    let deadline = Instant::now() + WAIT;
    while agent_running(pid as u32) {
        assert!(
            Instant::now() < deadline,
            "agent process {pid} is still running"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

// ── streams ────────────────────────────────────────────────────────────────────────────────────

/// Awaits `f`, failing the test after `WAIT`.
pub async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(WAIT, f)
        .await
        .expect("timed out waiting for the daemon")
}

/// The next item of a stream (`None` at its end), failing the test after `WAIT`.
pub async fn next<T>(s: &mut tonic::Streaming<T>) -> Option<Result<T, tonic::Status>> {
    within(next_item(s)).await
}

/// Every item until the stream ends; panics on a stream error.
pub async fn collect_ok<T: std::fmt::Debug>(mut s: tonic::Streaming<T>) -> Vec<T> {
    let mut out = Vec::new();
    while let Some(item) = next(&mut s).await {
        match item {
            Ok(v) => out.push(v),
            Err(e) => panic!("stream error after {out:?}: {e:?}"),
        }
    }
    out
}

/// Items until `stop` says the last one was the last (the stream stays open).
pub async fn collect_until<T: std::fmt::Debug>(
    s: &mut tonic::Streaming<T>,
    stop: impl Fn(&T) -> bool,
) -> Vec<T> {
    let mut out = Vec::new();
    loop {
        match next(s).await {
            Some(Ok(v)) => {
                let done = stop(&v);
                out.push(v);
                if done {
                    return out;
                }
            }
            Some(Err(e)) => panic!("stream error after {out:?}: {e:?}"),
            None => panic!("stream ended early after {out:?}"),
        }
    }
}

/// `Streaming::message` as an Option of a Result.
async fn next_item<T>(s: &mut tonic::Streaming<T>) -> Option<Result<T, tonic::Status>> {
    match s.message().await {
        Ok(Some(v)) => Some(Ok(v)),
        Ok(None) => None,
        Err(e) => Some(Err(e)),
    }
}

// ── names and redaction ────────────────────────────────────────────────────────────────────────

pub fn status_name(n: i32) -> &'static str {
    pb::SessionStatus::try_from(n)
        .map(|s| s.as_str_name().trim_start_matches("SESSION_STATUS_"))
        .unwrap_or("?")
}

pub fn activity_name(n: i32) -> &'static str {
    pb::ActivityType::try_from(n)
        .map(|s| s.as_str_name().trim_start_matches("ACTIVITY_TYPE_"))
        .unwrap_or("?")
}

pub fn kind(a: &pb::SessionActivityEvent) -> &'static str {
    activity_name(a.r#type)
}

/// What a snapshot must not contain: session ids, pids, tempdir paths.
#[derive(Default, Clone)]
pub struct Redact {
    pairs: Vec<(String, String)>,
}

impl Redact {
    pub fn new(d: &Daemon) -> Redact {
        Redact::default().with(&d.dirs.root.display().to_string(), "<root>")
    }

    pub fn with(mut self, from: &str, to: &str) -> Redact {
        if !from.is_empty() {
            self.pairs.push((from.to_string(), to.to_string()));
        }
        self
    }

    pub fn session(self, id: &str) -> Redact {
        self.with(id, "<session>")
    }

    pub fn apply(&self, s: &str) -> String {
        let mut out = s.to_string();
        for (from, to) in &self.pairs {
            out = out.replace(from, to);
        }
        redact_pids(&out)
    }

    /// An activity as a small JSON value.
    pub fn activity(&self, a: &pb::SessionActivityEvent) -> Value {
        let mut v = json!({
            "seq": a.seq,
            "type": kind(a),
            "content": self.apply(&a.content),
        });
        let o = v.as_object_mut().unwrap();
        if !a.tool_name.is_empty() {
            o.insert("tool_name".into(), json!(a.tool_name));
        }
        if a.r#type == pb::ActivityType::ToolResult as i32 {
            o.insert("tool_success".into(), json!(a.tool_success));
        }
        if a.tokens_input != 0 || a.tokens_output != 0 {
            o.insert("tokens".into(), json!([a.tokens_input, a.tokens_output]));
        }
        v
    }

    pub fn activities(&self, list: &[pb::SessionActivityEvent]) -> Value {
        Value::Array(list.iter().map(|a| self.activity(a)).collect())
    }

    /// A status event as a small JSON value (`session` only when `with_session`).
    pub fn status(&self, e: &pb::SessionStatusEvent, with_session: bool) -> Value {
        let mut v = json!({
            "seq": e.seq,
            "status": format!("{} -> {}", status_name(e.previous_status), status_name(e.new_status)),
            "message": self.apply(&e.message),
        });
        if with_session {
            v.as_object_mut()
                .unwrap()
                .insert("session".into(), json!(self.apply(&e.session_id)));
        }
        v
    }

    pub fn statuses(&self, list: &[pb::SessionStatusEvent]) -> Value {
        Value::Array(list.iter().map(|e| self.status(e, false)).collect())
    }
}

/// `pid 1234` → `pid <pid>` (as in "provider started (pid 1234)").
pub fn redact_pids(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("pid ") {
        out.push_str(&rest[..i + 4]);
        let after = &rest[i + 4..];
        let digits = after.chars().take_while(|c| c.is_ascii_digit()).count();
        if digits > 0 {
            out.push_str("<pid>");
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

/// Asserts a gRPC error's code and that its message starts with `prefix` (e.g. "OBEY-2010: "); an
/// OBEY prefix must also be the reason of the status's `ErrorInfo` detail (domain `paddock`).
#[track_caller]
pub fn assert_status(e: &tonic::Status, code: tonic::Code, prefix: &str) {
    assert_eq!(
        e.code(),
        code,
        "wrong gRPC code for {:?} (message: {})",
        e.code(),
        e.message()
    );
    assert!(
        e.message().starts_with(prefix),
        "message {:?} does not start with {prefix:?}",
        e.message()
    );
    // A refusal with an OBEY code also carries it as a structured ErrorInfo, which is what
    // clients match (never the message text).
    if let Some(code) = prefix.strip_suffix(": ").filter(|c| c.starts_with("OBEY-")) {
        use tonic_types::StatusExt;
        let info = e
            .get_details_error_info()
            .unwrap_or_else(|| panic!("no ErrorInfo detail on {:?}", e.message()));
        assert_eq!(
            (info.reason.as_str(), info.domain.as_str()),
            (code, "paddock")
        );
    }
}

/// The file mode bits of `p`.
pub fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

// ── scripts ────────────────────────────────────────────────────────────────────────────────────

/// A script whose every turn is `steps`.
pub fn turns(steps: Value) -> Value {
    json!({ "turns": [ { "steps": steps } ] })
}

/// A short, fully fixed turn: thinking, a Bash call with a fixed result, a text, the result.
pub fn fixed_turn() -> Value {
    turns(json!([
        {"thinking": "Reading the request: {message}", "tokens_in": 20, "tokens_out": 5},
        {"tool": "Bash", "input": {"command": "cargo check"}, "tokens_in": 10, "tokens_out": 7},
        {"tool_result": "Finished dev profile", "is_error": false},
        {"text": "The build is clean.", "tokens_in": 5, "tokens_out": 3},
        {"result": "Done with turn {turn}: {message}"}
    ]))
}

/// A turn that thinks, then hangs until a signal ends it.
pub fn hanging_turn() -> Value {
    turns(json!([
        {"thinking": "This will take a while", "tokens_in": 5, "tokens_out": 1},
        {"hang": true}
    ]))
}

/// A turn that thinks, waits `ms`, then finishes.
pub fn slow_turn(ms: u64) -> Value {
    turns(json!([
        {"thinking": "Working slowly", "tokens_in": 10, "tokens_out": 2},
        {"text": "Still at it", "delay_ms": ms, "tokens_in": 4, "tokens_out": 2},
        {"result": "Slow answer to {message}"}
    ]))
}
