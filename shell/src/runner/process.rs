//! A run's child process: spawn it, turn its output into events, write its stdin, report its
//! exit.
//!
//! Every child runs in its own process group (signals go to the whole group, so a stop takes
//! the child's own children with it) and gets `PR_SET_PDEATHSIG(SIGKILL)`, so it dies with the
//! runner. (The parent-death signal fires when the *thread* that forked exits: children are
//! spawned from tasks on the runtime's worker threads, never from `spawn_blocking`, and those
//! threads live as long as the runner. It reaches the child itself, not its descendants: a
//! runner that is SIGKILLed leaves grandchildren to their own devices; a runner that gets
//! SIGTERM stops every run's whole group first.)
//!
//! Output: for `Exec`, each stdout line (at most [`MAX_LINE_BYTES`]) becomes one `ExecEvent`
//! ([`super::codex::map_line`]) and the last lines of stderr become the detail of a failed
//! status; for `RunCommand`, stdout and stderr become `CommandOutput` chunks of at most
//! [`CHUNK_BYTES`], cut at UTF-8 character boundaries. The exit is reported after both pipes
//! reached their end, or when they stayed silent for [`DRAIN_AFTER_EXIT`] after the process
//! exited (a grandchild holding them open): so every byte the process printed comes before
//! its final status.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use paddock_core::run::{Input, Signal};
use paddock_proto::runner::v1::{runner_event::Payload, CommandOutput, StreamKind};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, watch};

use super::registry::{Registry, Run, StdinMsg};

/// Longest stdout line of `codex exec --json` kept whole; the rest of a longer line is dropped
/// (and the event says so). 1 MiB keeps every event (the line in `raw` plus what was parsed
/// out of it) under the 4 MiB message limit that gRPC clients apply by default.
pub const MAX_LINE_BYTES: usize = 1024 * 1024;
/// Largest `CommandOutput.text`.
pub const CHUNK_BYTES: usize = 64 * 1024;
/// After the process exited, how long its pipes may stay silent before the exit is reported.
pub const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);
/// Lines of stderr kept for the status of a failed `Exec`.
pub const STDERR_TAIL_LINES: usize = 20;
/// Bytes kept of one such line.
const STDERR_LINE_BYTES: usize = 512;
/// Writes queued for one child's stdin.
const STDIN_QUEUE: usize = 16;

/// What to run.
#[derive(Debug, Clone)]
pub struct Launch {
    pub program: OsString,
    pub args: Vec<OsString>,
    pub cwd: PathBuf,
    pub ssh_auth_sock: Option<String>,
    /// Pipe stdin (for WriteStdin) instead of /dev/null.
    pub stdin_piped: bool,
    /// Added to the child's environment.
    pub env: Vec<(String, String)>,
}

/// How the child's output becomes events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputMode {
    /// `codex exec --json`: stdout lines → `ExecEvent`.
    Jsonl,
    /// A shell command: stdout / stderr chunks → `CommandOutput`.
    Chunks,
}

/// Starts `launch` for `run` (registered, not started): its STARTED status, or a FAILED one if
/// it cannot be spawned, is in the run's log when this returns; the rest follows from tasks.
pub async fn start(reg: Arc<Registry>, run: Arc<Run>, launch: Launch, mode: OutputMode) {
    // Run ids are unique: the run's id marks its whole process tree (see `crate::contain`).
    let tag = format!("run-{}", run.id);
    let child = if launch.cwd.is_dir() {
        spawn(&launch, &tag).map_err(|e| {
            let code = match e.kind() {
                std::io::ErrorKind::NotFound => 127,
                std::io::ErrorKind::PermissionDenied => 126,
                _ => -1,
            };
            (format!("{}: {e}", launch.program.to_string_lossy()), code)
        })
    } else {
        Err((
            format!("working_dir {} is not a directory", launch.cwd.display()),
            -1,
        ))
    };
    let mut child = match child {
        Ok(c) => c,
        Err((reason, exit_code)) => {
            tracing::info!(run = %run.id, "spawn failed: {reason}");
            let statuses = run
                .apply(Input::SpawnFailed { reason, exit_code })
                .unwrap_or_default();
            for s in &statuses {
                run.push_status(s).await;
            }
            reg.finished(&run);
            return;
        }
    };
    let pid = child.id().unwrap_or(0);
    tracing::info!(run = %run.id, pid, "started");
    let statuses = run.apply(Input::Started { pid }).unwrap_or_default();
    for s in &statuses {
        run.push_status(s).await;
    }
    if let Some(stdin) = child.stdin.take() {
        let (tx, rx) = mpsc::channel(STDIN_QUEUE);
        run.set_stdin(tx);
        tokio::spawn(write_stdin(stdin, rx));
    }
    tokio::spawn(supervise(reg, run, child, mode, tag));
}

fn spawn(launch: &Launch, tag: &str) -> std::io::Result<Child> {
    let mut cmd = Command::new(&launch.program);
    cmd.args(&launch.args)
        .current_dir(&launch.cwd)
        .stdin(if launch.stdin_piped {
            Stdio::piped()
        } else {
            // An open stdin makes `codex exec` wait for a prompt on it forever.
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    if let Some(sock) = &launch.ssh_auth_sock {
        cmd.env("SSH_AUTH_SOCK", sock);
    }
    cmd.envs(launch.env.iter().map(|(k, v)| (k, v)));
    cmd.env(crate::contain::TAG_VAR, tag);
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec and only calls prctl and
    // getppid, which are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)?;
            // The runner died between fork and prctl: the signal will never come.
            if nix::unistd::getppid() != parent {
                return Err(std::io::Error::other("the runner exited"));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Signals the process group `pid` leads (nothing for pid 0).
pub fn signal_group(pid: u32, signal: Signal) {
    if pid == 0 {
        return;
    }
    let sig = match signal {
        Signal::Hup => nix::sys::signal::Signal::SIGHUP,
        Signal::Term => nix::sys::signal::Signal::SIGTERM,
        Signal::Kill => nix::sys::signal::Signal::SIGKILL,
    };
    if let Err(e) = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid as i32), sig) {
        tracing::debug!(pid, ?sig, "killpg: {e}");
    }
}

async fn write_stdin(mut stdin: ChildStdin, mut rx: mpsc::Receiver<StdinMsg>) {
    while let Some(msg) = rx.recv().await {
        let mut result = stdin.write_all(&msg.data).await;
        if result.is_ok() {
            result = stdin.flush().await;
        }
        let failed = result.is_err();
        let _ = msg
            .ack
            .send(result.map_err(|e| format!("stdin write failed: {e}")));
        if msg.close || failed {
            break;
        }
    }
    // Dropping `stdin` closes the pipe.
}

/// Reads the child's output into the log, waits for its exit, and reports it.
async fn supervise(
    reg: Arc<Registry>,
    run: Arc<Run>,
    mut child: Child,
    mode: OutputMode,
    tag: String,
) {
    let (exited_tx, exited_rx) = watch::channel(false);
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let (out_task, err_task) = match mode {
        OutputMode::Jsonl => (
            tokio::spawn(read_jsonl(stdout, run.clone(), exited_rx.clone())),
            tokio::spawn(read_tail(stderr, exited_rx.clone())),
        ),
        OutputMode::Chunks => {
            let err_run = run.clone();
            (
                tokio::spawn(read_chunks(
                    stdout,
                    StreamKind::Stdout,
                    run.clone(),
                    exited_rx.clone(),
                )),
                tokio::spawn(async move {
                    read_chunks(stderr, StreamKind::Stderr, err_run, exited_rx).await;
                    String::new() // stderr was streamed: no tail for the status
                }),
            )
        }
    };
    let pid = child.id();
    let status = child.wait().await;
    // A run is its whole process tree (see `crate::contain`): what the leader left behind
    // when it exited goes with it, as systemd's control-group kill mode does. Nothing is left
    // running that no one supervises.
    let pgid = pid.unwrap_or(0);
    let _ = tokio::task::spawn_blocking(move || crate::contain::kill_tree(pgid, &tag)).await;
    let _ = exited_tx.send(true);
    let _ = out_task.await;
    let detail = err_task.await.unwrap_or_default();
    let (code, signal) = match status {
        Ok(s) => {
            use std::os::unix::process::ExitStatusExt;
            (s.code(), s.signal())
        }
        Err(e) => {
            tracing::warn!(run = %run.id, "wait: {e}");
            (None, None)
        }
    };
    tracing::info!(run = %run.id, ?code, ?signal, "exited");
    let statuses = run
        .apply(Input::Exited {
            code,
            signal,
            detail,
        })
        .unwrap_or_default();
    for s in &statuses {
        run.push_status(s).await;
    }
    reg.finished(&run);
}

/// Resolves once the process has exited and then [`DRAIN_AFTER_EXIT`] passed.
async fn drained(exited: &mut watch::Receiver<bool>) {
    if exited.wait_for(|e| *e).await.is_err() {
        std::future::pending::<()>().await;
    }
    tokio::time::sleep(DRAIN_AFTER_EXIT).await;
}

/// One read, or `None` when the pipe stayed silent past the drain period after the exit.
/// Data already in the pipe always wins (`biased`), and the silence is counted from each read.
async fn read_some<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut [u8],
    exited: &mut watch::Receiver<bool>,
) -> Option<usize> {
    tokio::select! {
        biased;
        n = r.read(buf) => Some(n.unwrap_or(0)),
        _ = drained(exited) => None,
    }
}

async fn read_jsonl<R: AsyncRead + Unpin>(
    mut r: R,
    run: Arc<Run>,
    mut exited: watch::Receiver<bool>,
) {
    let mut split = LineSplitter::new(MAX_LINE_BYTES);
    let mut buf = vec![0u8; 64 * 1024];
    let mut lines = Vec::new();
    loop {
        let n = read_some(&mut r, &mut buf, &mut exited).await.unwrap_or(0);
        if n == 0 {
            split.finish(&mut lines);
        } else {
            split.feed(&buf[..n], &mut lines);
        }
        for (line, cut) in lines.drain(..) {
            if line.trim_ascii().is_empty() {
                continue;
            }
            let mut ev = super::codex::map_line(&line);
            if cut > 0 {
                ev.message
                    .push_str(&format!("… [line cut: {cut} bytes dropped]"));
            }
            let bytes = (line.len() + cut) as u64;
            run.push_output(Payload::Exec(ev), bytes).await;
        }
        if n == 0 {
            return;
        }
    }
}

/// The last lines of stderr (each bounded), joined.
async fn read_tail<R: AsyncRead + Unpin>(mut r: R, mut exited: watch::Receiver<bool>) -> String {
    let mut split = LineSplitter::new(STDERR_LINE_BYTES);
    let mut tail = std::collections::VecDeque::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut lines = Vec::new();
    loop {
        let n = read_some(&mut r, &mut buf, &mut exited).await.unwrap_or(0);
        if n == 0 {
            split.finish(&mut lines);
        } else {
            split.feed(&buf[..n], &mut lines);
        }
        for (line, _) in lines.drain(..) {
            if tail.len() == STDERR_TAIL_LINES {
                tail.pop_front();
            }
            tail.push_back(String::from_utf8_lossy(&line).into_owned());
        }
        if n == 0 {
            return tail.into_iter().collect::<Vec<_>>().join("\n");
        }
    }
}

async fn read_chunks<R: AsyncRead + Unpin>(
    mut r: R,
    stream: StreamKind,
    run: Arc<Run>,
    mut exited: watch::Receiver<bool>,
) {
    let mut utf8 = Utf8Chunker::default();
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        let n = read_some(&mut r, &mut buf, &mut exited).await.unwrap_or(0);
        let text = if n == 0 {
            utf8.finish()
        } else {
            utf8.feed(&buf[..n])
        };
        for piece in split_at_chars(&text, CHUNK_BYTES) {
            let payload = Payload::CommandOutput(CommandOutput {
                stream: stream as i32,
                text: piece.to_string(),
            });
            run.push_output(payload, piece.len() as u64).await;
        }
        if n == 0 {
            return;
        }
    }
}

/// Splits a byte stream into lines, keeping at most `max` bytes of each (the count of bytes
/// dropped from a line comes with it). Lines lose their `\n` (and a `\r` before it).
pub struct LineSplitter {
    max: usize,
    line: Vec<u8>,
    cut: usize,
}

impl LineSplitter {
    pub fn new(max: usize) -> Self {
        LineSplitter {
            max,
            line: Vec::new(),
            cut: 0,
        }
    }

    pub fn feed(&mut self, mut data: &[u8], out: &mut Vec<(Vec<u8>, usize)>) {
        while !data.is_empty() {
            let (part, rest, end) = match data.iter().position(|&b| b == b'\n') {
                Some(i) => (&data[..i], &data[i + 1..], true),
                None => (data, &data[data.len()..], false),
            };
            let room = self.max.saturating_sub(self.line.len());
            let keep = part.len().min(room);
            self.line.extend_from_slice(&part[..keep]);
            self.cut += part.len() - keep;
            if end {
                self.emit(out);
            }
            data = rest;
        }
    }

    /// End of input: a last line without `\n`.
    pub fn finish(&mut self, out: &mut Vec<(Vec<u8>, usize)>) {
        if !self.line.is_empty() || self.cut > 0 {
            self.emit(out);
        }
    }

    fn emit(&mut self, out: &mut Vec<(Vec<u8>, usize)>) {
        let mut line = std::mem::take(&mut self.line);
        if self.cut == 0 && line.last() == Some(&b'\r') {
            line.pop();
        }
        out.push((line, std::mem::take(&mut self.cut)));
    }
}

/// Turns byte chunks into text without splitting a UTF-8 character across chunks (an
/// incomplete character at the end waits for the next chunk; invalid bytes become U+FFFD).
#[derive(Default)]
pub struct Utf8Chunker {
    carry: Vec<u8>,
}

impl Utf8Chunker {
    pub fn feed(&mut self, data: &[u8]) -> String {
        let mut bytes = std::mem::take(&mut self.carry);
        bytes.extend_from_slice(data);
        let mut out = String::with_capacity(bytes.len());
        let mut rest = &bytes[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                        None => {
                            self.carry = after.to_vec();
                            break;
                        }
                    }
                }
            }
        }
        out
    }

    /// End of input: an incomplete character left over becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.carry);
        String::from_utf8_lossy(&rest).into_owned()
    }
}

/// `s` in pieces of at most `max` bytes, cut at character boundaries.
pub fn split_at_chars(s: &str, max: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let mut end = rest.len().min(max);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        if end == 0 {
            // max smaller than one character: take the character whole
            end = rest.chars().next().map_or(rest.len(), char::len_utf8);
        }
        out.push(&rest[..end]);
        rest = &rest[end..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_bounded_and_counted() {
        let mut s = LineSplitter::new(5);
        let mut out = Vec::new();
        s.feed(b"ab", &mut out);
        s.feed(b"c\r\nhello world\nx", &mut out);
        s.finish(&mut out);
        assert_eq!(
            out,
            vec![
                (b"abc".to_vec(), 0),
                (b"hello".to_vec(), 6),
                (b"x".to_vec(), 0)
            ]
        );
        let mut out = Vec::new();
        s.finish(&mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn utf8_characters_are_never_split_across_chunks() {
        let text = "héllo wörld ✓";
        let bytes = text.as_bytes();
        for cut in 0..bytes.len() {
            let mut c = Utf8Chunker::default();
            let mut got = c.feed(&bytes[..cut]);
            got.push_str(&c.feed(&bytes[cut..]));
            got.push_str(&c.finish());
            assert_eq!(got, text, "cut at {cut}");
        }
        let mut c = Utf8Chunker::default();
        assert_eq!(c.feed(b"a\xffb"), "a\u{FFFD}b");
        assert_eq!(c.feed(b"\xe2\x9c"), "");
        assert_eq!(c.finish(), "\u{FFFD}");
    }

    #[test]
    fn pieces_respect_the_limit_and_characters() {
        assert_eq!(split_at_chars("abcdef", 4), vec!["abcd", "ef"]);
        assert_eq!(split_at_chars("ééé", 3), vec!["é", "é", "é"]);
        assert_eq!(split_at_chars("✓", 1), vec!["✓"]);
        assert!(split_at_chars("", 4).is_empty());
    }
}
