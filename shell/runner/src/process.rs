//! A run's child process: spawn it, turn its output into events, write its stdin, report its
//! exit.
//!
//! How a child is started, read and reaped is [`paddock_sys::proc`]'s: its own process group
//! (signals go to the whole group), the parent-death signal (children are spawned from tasks
//! on the runtime's worker threads, never from `spawn_blocking`), the run's id as its
//! containment tag, bounded lines, the drain after exit. The parent-death signal reaches the
//! child itself, not its descendants: a runner that is SIGKILLed leaves grandchildren to their
//! own devices; a runner that gets SIGTERM stops every run's whole group first.
//!
//! Output: for `Exec`, each stdout line (at most [`proc::LINE_BYTES_MAX`]) becomes one
//! `ExecEvent` ([`super::codex::map_line`]) and the stderr tail becomes the detail of a failed
//! status; for `RunCommand`, stdout and stderr become `CommandOutput` chunks of at most
//! [`CHUNK_BYTES`], cut at UTF-8 character boundaries. The exit is reported after both pipes
//! reached their end, or when they stayed silent for [`proc::DRAIN_AFTER_EXIT`] after the
//! process exited (a grandchild holding them open): so every byte the process printed comes
//! before its final status.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use paddock_core::run::Input;
use paddock_proto::runner::v1::{runner_event::Payload, CommandOutput, StreamKind};
use tokio::io::{AsyncRead, AsyncWriteExt};
use tokio::process::{ChildStderr, ChildStdin, ChildStdout, Command};
use tokio::sync::mpsc;

use super::registry::{Registry, Run, StdinMsg};
use paddock_sys::proc;

/// Largest `CommandOutput.text`.
pub const CHUNK_BYTES: usize = 64 * 1024;
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
    // Run ids are unique: the run's id marks its whole process tree (see `paddock_sys::contain`).
    let tag = format!("run-{}", run.id);
    let child = if launch.cwd.is_dir() {
        spawn(&launch, tag).map_err(|e| {
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
    let (process, pipes) = match child {
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
    let pid = process.pid;
    tracing::info!(run = %run.id, pid, "started");
    let statuses = run.apply(Input::Started { pid }).unwrap_or_default();
    for s in &statuses {
        run.push_status(s).await;
    }
    if let Some(stdin) = pipes.stdin {
        let (tx, rx) = mpsc::channel(STDIN_QUEUE);
        run.set_stdin(tx);
        tokio::spawn(write_stdin(stdin, rx));
    }
    tokio::spawn(supervise(
        reg,
        run,
        process,
        pipes.stdout,
        pipes.stderr,
        mode,
    ));
}

fn spawn(launch: &Launch, tag: String) -> std::io::Result<(proc::Process, proc::Pipes)> {
    let mut cmd = Command::new(&launch.program);
    cmd.args(&launch.args).current_dir(&launch.cwd);
    if let Some(sock) = &launch.ssh_auth_sock {
        cmd.env("SSH_AUTH_SOCK", sock);
    }
    cmd.envs(launch.env.iter().map(|(k, v)| (k, v)));
    proc::spawn(cmd, launch.stdin_piped, tag)
}

async fn write_stdin(mut stdin: ChildStdin, mut rx: mpsc::Receiver<StdinMsg>) {
    while let Some(msg) = rx.recv().await {
        let mut result = stdin.write_all(&msg.data).await;
        if result.is_ok() {
            result = stdin.flush().await;
        }
        let failed = result.is_err();
        let _ = msg.ack.send(result);
        if msg.close || failed {
            break;
        }
    }
    // Dropping `stdin` closes the pipe.
}

/// Reads the child's output into the log, waits for its exit (and the end of its tree), and
/// reports it.
async fn supervise(
    reg: Arc<Registry>,
    run: Arc<Run>,
    process: proc::Process,
    stdout: proc::Output<ChildStdout>,
    stderr: proc::Output<ChildStderr>,
    mode: OutputMode,
) {
    let (out_task, err_task) = match mode {
        OutputMode::Jsonl => (
            tokio::spawn(read_jsonl(stdout, run.clone())),
            tokio::spawn(proc::StderrTail::read(stderr)),
        ),
        OutputMode::Chunks => {
            let err_run = run.clone();
            (
                tokio::spawn(read_chunks(stdout, StreamKind::Stdout, run.clone())),
                tokio::spawn(async move {
                    read_chunks(stderr, StreamKind::Stderr, err_run).await;
                    String::new() // stderr was streamed: no tail for the status
                }),
            )
        }
    };
    let exit = process.wait().await;
    let _ = out_task.await;
    let detail = err_task.await.unwrap_or_default();
    let (code, signal) = (exit.code, exit.signal);
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

async fn read_jsonl(mut stdout: proc::Output<ChildStdout>, run: Arc<Run>) {
    while let Some(line) = stdout.next_line().await {
        if line.bytes.trim_ascii().is_empty() {
            continue;
        }
        let mut ev = super::codex::map_line(&line.bytes);
        if line.cut_bytes > 0 {
            ev.message.push_str(&proc::cut_marker(line.cut_bytes));
        }
        let bytes = (line.bytes.len() + line.cut_bytes) as u64;
        run.push_output(Payload::Exec(ev), bytes).await;
    }
}

async fn read_chunks(
    mut out: proc::Output<impl AsyncRead + Unpin>,
    stream: StreamKind,
    run: Arc<Run>,
) {
    let mut utf8 = Utf8Chunker::default();
    loop {
        let chunk = out.next_chunk().await;
        let ended = chunk.is_none();
        let text = match chunk {
            Some(bytes) => utf8.feed(bytes),
            None => utf8.finish(),
        };
        // A read is at most 64 KiB, so its text is one piece but for a character carried over
        // from the read before: then it is moved into its event, not copied.
        if text.len() <= CHUNK_BYTES {
            if !text.is_empty() {
                push_text(&run, stream, text).await;
            }
        } else {
            for piece in split_at_chars(&text, CHUNK_BYTES) {
                push_text(&run, stream, piece.to_string()).await;
            }
        }
        if ended {
            return;
        }
    }
}

/// One piece of a stream's output as the run's next event.
async fn push_text(run: &Run, stream: StreamKind, text: String) {
    let size = text.len() as u64;
    let payload = Payload::CommandOutput(CommandOutput {
        stream: stream as i32,
        text,
    });
    run.push_output(payload, size).await;
}

/// Turns byte chunks into text without splitting a UTF-8 character across chunks (an
/// incomplete character at the end waits for the next chunk; invalid bytes become U+FFFD).
#[derive(Default)]
pub struct Utf8Chunker {
    carry: Vec<u8>,
}

impl Utf8Chunker {
    /// The text of `data` (after what the last chunk left over). Valid UTF-8, as an agent's
    /// output nearly always is, becomes the text in place: the chunk's bytes are not copied.
    pub fn feed(&mut self, data: Vec<u8>) -> String {
        let bytes = if self.carry.is_empty() {
            data
        } else {
            let mut carried = std::mem::take(&mut self.carry);
            carried.extend_from_slice(&data);
            carried
        };
        match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => {
                let error = e.utf8_error();
                let mut bytes = e.into_bytes();
                if error.error_len().is_none() {
                    // Only the end is cut: a character the next chunk completes.
                    self.carry = bytes.split_off(error.valid_up_to());
                    String::from_utf8(bytes).unwrap_or_default()
                } else {
                    self.lossy(&bytes)
                }
            }
        }
    }

    /// `bytes` with each invalid sequence as U+FFFD, but for an incomplete character at the
    /// end, which is carried over.
    fn lossy(&mut self, bytes: &[u8]) -> String {
        let mut out = String::with_capacity(bytes.len());
        let mut rest = bytes;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    return out;
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
                            return out;
                        }
                    }
                }
            }
        }
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
    fn utf8_characters_are_never_split_across_chunks() {
        let text = "héllo wörld ✓";
        let bytes = text.as_bytes();
        for cut in 0..bytes.len() {
            let mut c = Utf8Chunker::default();
            let mut got = c.feed(bytes[..cut].to_vec());
            got.push_str(&c.feed(bytes[cut..].to_vec()));
            got.push_str(&c.finish());
            assert_eq!(got, text, "cut at {cut}");
        }
        let mut c = Utf8Chunker::default();
        assert_eq!(c.feed(b"a\xffb".to_vec()), "a\u{FFFD}b");
        assert_eq!(c.feed(b"\xe2\x9c".to_vec()), "");
        assert_eq!(c.finish(), "\u{FFFD}");
        // An invalid byte and a character cut at the end, in one chunk.
        assert_eq!(c.feed(b"x\xffy\xe2\x9c".to_vec()), "x\u{FFFD}y");
        assert_eq!(c.feed(b"\x93z".to_vec()), "\u{2713}z");
        assert_eq!(c.finish(), "");
    }

    #[test]
    fn pieces_respect_the_limit_and_characters() {
        assert_eq!(split_at_chars("abcdef", 4), vec!["abcd", "ef"]);
        assert_eq!(split_at_chars("ééé", 3), vec!["é", "é", "é"]);
        assert_eq!(split_at_chars("✓", 1), vec!["✓"]);
        assert!(split_at_chars("", 4).is_empty());
    }
}
