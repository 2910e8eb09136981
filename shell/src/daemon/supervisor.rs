//! Child processes: spawn a provider, read its lines, write its stdin, signal its group, and
//! report its exit — every one of them as a core input.
//!
//! Every child runs in its own process group (so a stop kills its whole tree) and gets
//! `PR_SET_PDEATHSIG(SIGKILL)`, so it dies with the daemon. The parent-death signal fires when
//! the *thread* that forked exits: children are spawned from the event loop, which runs on a
//! runtime worker thread that lives as long as the daemon.
//!
//! Exit is reported only after stdout was read to its end (or a short drain period passed), so
//! every line the provider printed reaches the core before its `Exited`: nothing is lost.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use paddock_core::{Input, ProviderEvent, RunId, SessionId, Signal};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command as ProcessCommand;
use tokio::sync::mpsc;

use crate::providers::{LineParser, Parsed};

/// Longest stdout line kept whole; longer lines are cut (and counted as unrecognised). Agents
/// print large tool results on one line; 4 MiB bounds the memory one line can take.
pub const MAX_LINE_BYTES: usize = 4 * 1024 * 1024;
/// Lines of stderr kept for a FAILED reason.
pub const STDERR_TAIL_LINES: usize = 20;
/// Bytes kept of one stderr line.
const STDERR_LINE_BYTES: usize = 512;
/// Messages queued for one child's stdin.
const STDIN_QUEUE: usize = 64;
/// After the process exits, how long its stdout may stay open (a grandchild holding it) before
/// the exit is reported anyway.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// What to run.
#[derive(Debug, Clone)]
pub struct LaunchPlan {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
}

/// A running child, as the event loop holds it: a child of the daemon, or a run of the
/// runner.
#[derive(Debug)]
pub struct RunHandle {
    /// The pid of a child of the daemon (runner-owned runs report theirs as an input).
    pub pid: u32,
    stdin: mpsc::Sender<String>,
    signaller: Signaller,
}

#[derive(Debug)]
enum Signaller {
    /// Our own child: signal its process group.
    Group(u32),
    /// A run of the runner: ask the runner.
    Runner(super::runner_link::RunRef),
}

impl RunHandle {
    /// A run owned by the runner.
    pub fn in_runner(stdin: mpsc::Sender<String>, run: super::runner_link::RunRef) -> Self {
        RunHandle {
            pid: 0,
            stdin,
            signaller: Signaller::Runner(run),
        }
    }

    /// Queues one line for the child's stdin. False if the queue is full or the child's stdin is
    /// gone (its exit will follow and be reported).
    pub fn write_line(&self, line: String) -> bool {
        self.stdin.try_send(line).is_ok()
    }

    /// Signals the child's whole process group.
    pub fn signal(&self, signal: Signal) {
        match &self.signaller {
            Signaller::Group(pid) => signal_group(*pid, signal),
            Signaller::Runner(run) => run.signal(signal),
        }
    }
}

/// Starts `plan`; its output becomes `Input::Provider` commands on `tx`.
pub fn spawn(
    plan: &LaunchPlan,
    id: SessionId,
    run: RunId,
    mut parser: Box<dyn LineParser>,
    tx: mpsc::Sender<super::Command>,
) -> Result<RunHandle, String> {
    let tag = crate::contain::new_tag();
    let mut cmd = ProcessCommand::new(&plan.program);
    cmd.args(&plan.args)
        .current_dir(&plan.cwd)
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .env(crate::contain::TAG_VAR, &tag)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    // SAFETY: the closure runs in the forked child before exec and only calls prctl, which is
    // async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("{}: {e}", plan.program.display()))?;
    let pid = child.id().unwrap_or(0);
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut stdin = child.stdin.take().expect("stdin is piped");

    let (stdin_tx, mut stdin_rx) = mpsc::channel::<String>(STDIN_QUEUE);
    tokio::spawn(async move {
        while let Some(line) = stdin_rx.recv().await {
            let mut bytes = line.into_bytes();
            bytes.push(b'\n');
            if stdin.write_all(&bytes).await.is_err() || stdin.flush().await.is_err() {
                break; // the child closed stdin; its exit is reported by the waiter
            }
        }
    });

    let tail: Arc<Mutex<VecDeque<String>>> = Arc::default();
    let tail_w = tail.clone();
    let stderr_task = tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let mut t = tail_w.lock().expect("stderr tail lock");
            if t.len() == STDERR_TAIL_LINES {
                t.pop_front();
            }
            t.push_back(truncate(&line, STDERR_LINE_BYTES));
        }
    });

    let stdin_for_control = stdin_tx.clone();
    let sid = id.clone();
    let out_tx = tx.clone();
    let mut stdout_task = tokio::spawn(async move {
        let mut reader = BufReader::new(stdout);
        let mut buf = Vec::with_capacity(8 * 1024);
        loop {
            buf.clear();
            match read_bounded_line(&mut reader, &mut buf).await {
                Ok(0) => break,
                Ok(_) => {}
                Err(_) => break,
            }
            let line = String::from_utf8_lossy(&buf);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                continue;
            }
            for parsed in parser.parse_line(line) {
                match parsed {
                    Parsed::Event(event) => {
                        let input = Input::Provider {
                            id: sid.clone(),
                            run,
                            cursor: None,
                            event,
                        };
                        if out_tx.send(super::Command::Provider(input)).await.is_err() {
                            return;
                        }
                    }
                    Parsed::Reply(line) => {
                        let _ = stdin_for_control.send(line).await;
                    }
                    Parsed::Unrecognized(line) => {
                        let cmd = super::Command::Unrecognized {
                            id: sid.clone(),
                            run,
                            line,
                        };
                        if out_tx.send(cmd).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
    });

    tokio::spawn(async move {
        let status = child.wait().await;
        // A session's agent is its whole process tree: what the leader left behind (tool
        // processes, an ACP agent's own children, even those in sessions of their own) goes
        // with it.
        let _ = tokio::task::spawn_blocking(move || crate::contain::kill_tree(pid, &tag)).await;
        // Let the reader finish what the process printed before reporting the exit.
        if tokio::time::timeout(DRAIN_AFTER_EXIT, &mut stdout_task)
            .await
            .is_err()
        {
            stdout_task.abort();
        }
        let _ = tokio::time::timeout(Duration::from_millis(200), stderr_task).await;
        let (code, signal) = match status {
            Ok(s) => {
                use std::os::unix::process::ExitStatusExt;
                (s.code(), s.signal())
            }
            Err(_) => (None, None),
        };
        let stderr_tail = tail
            .lock()
            .map(|t| t.iter().cloned().collect::<Vec<_>>().join("\n"))
            .unwrap_or_default();
        let input = Input::Provider {
            id,
            run,
            cursor: None,
            event: ProviderEvent::Exited {
                code,
                signal,
                stderr_tail,
            },
        };
        let _ = tx.send(super::Command::Provider(input)).await;
    });

    Ok(RunHandle {
        pid,
        stdin: stdin_tx,
        signaller: Signaller::Group(pid),
    })
}

/// Reads one line into `buf`, keeping at most [`MAX_LINE_BYTES`] of it (the rest of an
/// over-long line is consumed and dropped). Returns the bytes consumed (0 at EOF).
async fn read_bounded_line<R: tokio::io::AsyncBufRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
) -> std::io::Result<usize> {
    let mut total = 0;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(total);
        }
        let (chunk, done) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..=i], true),
            None => (available, false),
        };
        let n = chunk.len();
        let room = MAX_LINE_BYTES.saturating_sub(buf.len());
        buf.extend_from_slice(&chunk[..n.min(room)]);
        reader.consume(n);
        total += n;
        if done {
            return Ok(total);
        }
    }
}

pub fn truncate(s: &str, max: usize) -> String {
    let head = crate::text::prefix(s, max);
    if head.len() == s.len() {
        return s.to_string();
    }
    format!("{head}… [{} bytes cut]", s.len() - head.len())
}

/// Longest task output line kept whole.
const TASK_LINE_BYTES: usize = 64 * 1024;

/// Signals a process group: the runner's, now that the daemon and the runner share the
/// core's one `Signal` (it also refuses pid 0, which would signal the daemon's own group).
pub use crate::runner::process::signal_group;

/// Parses the progress convention: a stdout line `::progress <percent> [description]`
/// (percent 0–100, decimals allowed) reports progress instead of being output.
pub fn parse_progress(line: &str) -> Option<(u32, String)> {
    let rest = line.strip_prefix("::progress ")?;
    let (pct, op) = rest.split_once(' ').unwrap_or((rest, ""));
    let pct: f64 = pct.trim_end_matches('%').parse().ok()?;
    if !(0.0..=100.0).contains(&pct) {
        return None;
    }
    Some(((pct * 100.0).round() as u32, op.trim().to_string()))
}

/// One line of a task's output: stdout lines following the `::progress` convention are
/// progress, other stdout lines output, stderr lines stderr.
pub fn task_line(line: String, is_stderr: bool) -> paddock_core::task::OutputKind {
    use paddock_core::task::OutputKind;
    match (is_stderr, parse_progress(&line)) {
        (false, Some((centi, operation))) => OutputKind::Progress { centi, operation },
        (false, None) => OutputKind::Stdout(line),
        (true, _) => OutputKind::Stderr(line),
    }
}

/// Starts a task's command (stdin closed, own process group, dies with the daemon); its
/// output lines and its exit become task inputs on `tx`. Returns the pid.
pub fn spawn_task(
    id: &str,
    spec: &paddock_core::task::TaskSpec,
    tx: mpsc::Sender<super::Command>,
) -> Result<u32, String> {
    use paddock_core::task::TaskInput;
    let (program, args) = spec.command.split_first().ok_or("empty command")?;
    let mut cmd = ProcessCommand::new(program);
    cmd.args(args)
        .envs(spec.environment.iter())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    if !spec.working_dir.is_empty() {
        cmd.current_dir(&spec.working_dir);
    }
    // SAFETY: only prctl runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)
        });
    }
    let mut child = cmd.spawn().map_err(|e| format!("{program}: {e}"))?;
    let pid = child.id().unwrap_or(0);
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let reader = |stream: Box<dyn tokio::io::AsyncRead + Send + Unpin>, is_err: bool| {
        let tx = tx.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let mut r = BufReader::new(stream);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match read_bounded_line(&mut r, &mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                buf.truncate(buf.len().min(TASK_LINE_BYTES));
                let line = String::from_utf8_lossy(&buf)
                    .trim_end_matches(['\n', '\r'])
                    .to_string();
                let kind = task_line(line, is_err);
                let input = TaskInput::Output {
                    id: id.clone(),
                    kind,
                };
                if tx.send(super::Command::TaskEvent(input)).await.is_err() {
                    break;
                }
            }
        })
    };
    let out_task = reader(Box::new(stdout), false);
    let err_task = reader(Box::new(stderr), true);
    let id = id.to_string();
    tokio::spawn(async move {
        let status = child.wait().await;
        for t in [out_task, err_task] {
            let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, t).await;
        }
        let (code, signal) = match status {
            Ok(s) => {
                use std::os::unix::process::ExitStatusExt;
                (s.code(), s.signal())
            }
            Err(_) => (None, None),
        };
        let _ = tx
            .send(super::Command::TaskEvent(TaskInput::Exited {
                id,
                code,
                signal,
            }))
            .await;
    });
    Ok(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate("abc", 5), "abc");
        let t = truncate("ééé", 3);
        assert!(t.starts_with('é'));
        assert!(t.contains("bytes cut"));
    }

    #[test]
    fn progress_lines() {
        assert_eq!(
            parse_progress("::progress 42 building"),
            Some((4200, "building".into()))
        );
        assert_eq!(
            parse_progress("::progress 12.5%"),
            Some((1250, String::new()))
        );
        assert_eq!(parse_progress("::progress 101 x"), None);
        assert_eq!(parse_progress("progress 10"), None);
        assert_eq!(parse_progress("::progress abc"), None);
    }

    #[tokio::test]
    async fn over_long_lines_are_bounded() {
        let data = vec![b'x'; MAX_LINE_BYTES + 10];
        let mut input = data.clone();
        input.push(b'\n');
        input.extend_from_slice(b"next\n");
        let mut r = BufReader::new(&input[..]);
        let mut buf = Vec::new();
        let n = read_bounded_line(&mut r, &mut buf).await.unwrap();
        assert_eq!(n, MAX_LINE_BYTES + 11);
        assert_eq!(buf.len(), MAX_LINE_BYTES);
        buf.clear();
        read_bounded_line(&mut r, &mut buf).await.unwrap();
        assert_eq!(buf, b"next\n");
    }
}
