//! The runner harness: one real `paddock runner` per test on a real Unix socket in a tempdir,
//! with a fake `codex` (a shell script, via `PADDOCK_CODEX_BIN`) that records how it was called
//! and prints a realistic `codex exec --json` transcript.
//!
//! Layout of a test's tempdir:
//!
//! ```text
//! <tmp>/sock/runner.sock   --socket (the runner creates sock/ itself, 0700)
//! <tmp>/fake-codex         the fake codex
//! <tmp>/work/              a working_dir
//! <tmp>/runner.stderr      the runner's log (printed when a start fails)
//! ```
//!
//! The fake codex writes its argv (one per line), `cwd=`, `ssh=` and `stdin=eof|data` to
//! `codex-call.txt` in its working directory; prints [`TRANSCRIPT`]; if `hold` exists in its
//! working directory it waits (up to 30 s) for it to disappear before the last two lines; exits
//! with the code in `exit-code` in its working directory (0 without).

#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use paddock_proto::runner::v1 as pb;
use pb::runner_client::RunnerClient;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

pub type Client = RunnerClient<Channel>;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_paddock");

/// Anything a test waits for, at most.
pub const WAIT: Duration = Duration::from_secs(20);

/// What the fake codex prints: a real turn's shape, with fields this mapping does not know
/// (`ts`, `duration_ms`, `reasoning_output_tokens`) and an event type it does not know.
pub const TRANSCRIPT: &str = r#"{"type":"thread.started","thread_id":"0199a213-81c0-7800-8aa1-bbab2a035a53"}
{"type":"turn.started"}
{"type":"item.completed","item":{"id":"item_0","type":"reasoning","text":"**Looking at the repo**"}}
{"type":"item.started","item":{"id":"item_1","type":"command_execution","command":"bash -lc ls","aggregated_output":"","exit_code":null,"status":"in_progress"}}
{"type":"item.completed","item":{"id":"item_1","type":"command_execution","command":"bash -lc ls","aggregated_output":"README.md\n","exit_code":0,"status":"completed","duration_ms":12},"ts":"2025-11-02T10:00:00Z"}
{"type":"item.completed","item":{"id":"item_2","type":"file_change","changes":[{"path":"README.md","kind":"update"}],"status":"completed"}}
{"type":"turn.diff","diff":"--- a/README.md\n+++ b/README.md"}
not json: a warning codex printed on stdout
{"type":"item.completed","item":{"id":"item_3","type":"agent_message","text":"Done."}}
{"type":"turn.completed","usage":{"input_tokens":1200,"cached_input_tokens":200,"output_tokens":345,"reasoning_output_tokens":64}}"#;

/// Lines of [`TRANSCRIPT`] printed before the `hold` wait.
pub const BEFORE_HOLD: usize = 8;

const FAKE_CODEX: &str = r#"#!/bin/sh
{
  for a in "$@"; do printf 'arg=%s\n' "$a"; done
  echo "cwd=$(pwd)"
  echo "ssh=${SSH_AUTH_SOCK:-}"
  if IFS= read -r line; then echo "stdin=data"; else echo "stdin=eof"; fi
} > codex-call.txt
head -n __BEFORE__ "__TRANSCRIPT__"
n=0
while [ -e hold ] && [ $n -lt 300 ]; do sleep 0.1; n=$((n+1)); done
tail -n +__AFTER__ "__TRANSCRIPT__"
if [ -e exit-code ]; then exit "$(cat exit-code)"; fi
exit 0
"#;

/// One test's runner.
pub struct Runner {
    pub tmp: tempfile::TempDir,
    pub base: PathBuf,
    pub socket: PathBuf,
    pub work: PathBuf,
    pub child: Option<Child>,
}

impl Runner {
    pub fn start() -> Runner {
        Runner::start_with(&[])
    }

    /// A runner with extra environment variables.
    pub fn start_with(env: &[(&str, &str)]) -> Runner {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = tmp.path().canonicalize().unwrap();
        let work = base.join("work");
        std::fs::create_dir_all(&work).unwrap();
        let transcript = base.join("transcript.jsonl");
        std::fs::write(&transcript, format!("{TRANSCRIPT}\n")).unwrap();
        let fake = base.join("fake-codex");
        let script = FAKE_CODEX
            .replace("__TRANSCRIPT__", transcript.to_str().unwrap())
            .replace("__BEFORE__", &BEFORE_HOLD.to_string())
            .replace("__AFTER__", &(BEFORE_HOLD + 1).to_string());
        std::fs::write(&fake, script).unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let socket = base.join("sock").join("runner.sock");
        let mut r = Runner {
            tmp,
            base,
            socket,
            work,
            child: None,
        };
        r.spawn(env);
        r
    }

    /// Starts (again) the runner process on this tempdir's socket and waits until it answers.
    pub fn spawn(&mut self, env: &[(&str, &str)]) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.base.join("runner.stderr"))
            .unwrap();
        let mut cmd = Command::new(BIN);
        cmd.arg("runner")
            .arg("--socket")
            .arg(&self.socket)
            .env("PADDOCK_CODEX_BIN", self.base.join("fake-codex"))
            .env("PADDOCK_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start paddock runner");
        self.child = Some(child);
        let deadline = Instant::now() + WAIT;
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("runner exited at start ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "runner did not listen:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.base.join("runner.stderr")).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub async fn client(&self) -> Client {
        client_at(&self.socket, "http://localhost").await
    }

    /// A fresh working directory `name` under the tempdir.
    pub fn dir(&self, name: &str) -> PathBuf {
        let d = self.base.join(name);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// Stops the runner with SIGTERM and waits for it; its exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        signal(child.id(), nix::sys::signal::Signal::SIGTERM);
        wait_child(&mut child, WAIT).expect("runner exits after SIGTERM")
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(data_dir) = self.socket.parent() {
            paddock::contain::remove_groups(data_dir);
        }
    }
}

pub fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
}

pub fn wait_child(child: &mut Child, within: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A client over the socket at `path`, sending `origin`'s authority.
pub async fn client_at(path: &Path, origin: &str) -> Client {
    let p = path.to_path_buf();
    let ch = Endpoint::try_from(origin.to_string())
        .expect("uri")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let p = p.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(p).await?)) }
        }))
        .await
        .expect("connect to the runner");
    RunnerClient::new(ch).max_decoding_message_size(16 * 1024 * 1024)
}

/// Reads a stream to its end (or fails after [`WAIT`]).
pub async fn collect(stream: tonic::Streaming<pb::RunnerEvent>) -> Vec<pb::RunnerEvent> {
    collect_for(stream, WAIT).await
}

pub async fn collect_for(
    mut stream: tonic::Streaming<pb::RunnerEvent>,
    within: Duration,
) -> Vec<pb::RunnerEvent> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.message()).await {
            Ok(Ok(Some(ev))) => out.push(ev),
            Ok(Ok(None)) => return out,
            Ok(Err(status)) => panic!("stream failed: {status:?} after {out:?}"),
            Err(_) => panic!("stream did not end within {within:?}; so far: {out:?}"),
        }
    }
}

/// The next event of a stream (or fails after [`WAIT`]).
pub async fn next(stream: &mut tonic::Streaming<pb::RunnerEvent>) -> pb::RunnerEvent {
    tokio::time::timeout(WAIT, stream.message())
        .await
        .expect("an event in time")
        .expect("stream ok")
        .expect("stream not ended")
}

pub fn status(ev: &pb::RunnerEvent) -> Option<&pb::RunStatus> {
    match &ev.payload {
        Some(pb::runner_event::Payload::Status(s)) => Some(s),
        _ => None,
    }
}

pub fn exec(ev: &pb::RunnerEvent) -> Option<&pb::ExecEvent> {
    match &ev.payload {
        Some(pb::runner_event::Payload::Exec(e)) => Some(e),
        _ => None,
    }
}

/// The stdout / stderr text of a command's events.
pub fn output(events: &[pb::RunnerEvent], kind: pb::StreamKind) -> String {
    events
        .iter()
        .filter_map(|e| match &e.payload {
            Some(pb::runner_event::Payload::CommandOutput(o)) if o.stream == kind as i32 => {
                Some(o.text.as_str())
            }
            _ => None,
        })
        .collect()
}

/// Asserts the lifecycle: STARTED first, one final status last, none between; the final one.
pub fn lifecycle(events: &[pb::RunnerEvent]) -> pb::RunStatus {
    let first = events.first().and_then(status).expect("a first event");
    assert_eq!(first.state(), pb::RunState::Started, "{events:?}");
    let last = events.last().and_then(status).expect("a status last");
    assert!(
        matches!(last.state(), pb::RunState::Finished | pb::RunState::Failed),
        "{events:?}"
    );
    let between = events[1..events.len() - 1]
        .iter()
        .filter(|e| status(e).is_some())
        .count();
    assert_eq!(between, 0, "{events:?}");
    // Numbered 1, 2, 3, … without gaps.
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let want: Vec<u64> = (1..=events.len() as u64).collect();
    assert_eq!(seqs, want);
    last.clone()
}

/// The runs the runner lists (`ListRuns`).
pub async fn list_runs(c: &mut Client) -> Vec<pb::RunInfo> {
    c.list_runs(pb::ListRunsRequest {})
        .await
        .unwrap()
        .into_inner()
        .runs
}

/// `SignalSession` of `signal` to run `run_id`: the runner's answer.
pub async fn signal_run(
    c: &mut Client,
    run_id: &str,
    signal: pb::ProcessSignal,
) -> pb::SignalResponse {
    c.signal_session(pb::SignalRequest {
        run_id: run_id.into(),
        signal: signal as i32,
    })
    .await
    .unwrap()
    .into_inner()
}

pub fn command(run_id: &str, dir: &Path, command: &str) -> pb::RunCommandRequest {
    pb::RunCommandRequest {
        run_id: run_id.into(),
        working_dir: dir.to_str().unwrap().into(),
        command: command.into(),
        use_shell: true,
        ..Default::default()
    }
}

pub fn exec_request(run_id: &str, dir: &Path, prompt: &str) -> pb::ExecRequest {
    pb::ExecRequest {
        run_id: run_id.into(),
        working_dir: dir.to_str().unwrap().into(),
        prompt: prompt.into(),
        json: true,
        ..Default::default()
    }
}

/// The `VmRSS` / `VmHWM` (peak) of a process, in KiB.
pub fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Whether a process exists (and is not a zombie).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // The state follows the parenthesised command name.
            let state = stat
                .rsplit(')')
                .next()
                .and_then(|s| s.split_whitespace().next());
            state != Some("Z")
        }
        Err(_) => false,
    }
}

/// Waits until `cond` holds (or fails after [`WAIT`]).
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
