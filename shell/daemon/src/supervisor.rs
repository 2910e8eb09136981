//! The daemon's children (`--no-runner`): spawn an agent or a task, read its lines, write its
//! stdin, signal its group, and report its exit — every one of them as a core input. How a
//! process is started, read and reaped is [`crate::proc`]'s (own group, parent-death signal,
//! containment tag, bounded lines, drain after exit); children are spawned from the event
//! loop, which runs on a runtime worker thread that lives as long as the daemon.
//!
//! Exit is reported only after stdout was read to its end (or the drain period passed), so
//! every line the provider printed reaches the core before its `Exited`: nothing is lost.
//!
//! [`RunHandle`] is what the event loop holds of a running agent, whether our child or a run
//! of the runner ([`RunRef`], which `runner_link` makes).

use paddock_core::{Input, ProviderEvent, RunId, SessionId, Signal};
use paddock_proto::runner::v1 as rpb;
use rpb::runner_client::RunnerClient;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tonic::transport::Channel;

use crate::proc::{self, LaunchPlan, StderrTail};
use crate::providers::{LineParser, Parsed};

/// Messages queued for one child's stdin.
const STDIN_QUEUE: usize = 64;
/// Longest task output line kept whole.
pub const TASK_LINE_BYTES_MAX: usize = 64 * 1024;

/// Why a process could not be started: its program, and the operating system's reason (the
/// core is told its text, as the session's or task's SpawnFailed reason).
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("{}: {source}", .program.display())]
    Io {
        program: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("empty command")]
    EmptyCommand,
}

/// A running child, as the event loop holds it: a child of the daemon, or a run of the
/// runner.
#[derive(Debug)]
pub struct RunHandle {
    /// The pid of a child of the daemon (runner-owned runs report theirs as an input).
    pub pid: u32,
    stdin: mpsc::Sender<ToStdin>,
    signaller: Signaller,
    /// The line that asks the agent whether it takes messages: its provider's
    /// ([`crate::providers::ready_request`]); paddock's `initialize` until told.
    ready_request: &'static str,
}

/// What goes to a child's stdin, in order.
#[derive(Debug)]
pub enum ToStdin {
    Line(String),
    /// End of input: the agent is asked to end its own way.
    Close,
}

#[derive(Debug)]
enum Signaller {
    /// Our own child: signal its process group.
    Group(u32),
    /// A run of the runner: ask the runner.
    Runner(RunRef),
}

/// A run of the runner, for signals.
#[derive(Debug, Clone)]
pub struct RunRef {
    pub client: RunnerClient<Channel>,
    pub run_id: String,
}

impl RunRef {
    /// Signals the run's process group (through the runner; fire and forget: the exit is
    /// what counts, and it is reported on the run's stream).
    pub fn signal(&self, signal: Signal) {
        let mut client = self.client.clone();
        let req = rpb::SignalRequest {
            run_id: self.run_id.clone(),
            signal: match signal {
                Signal::Hup => rpb::ProcessSignal::Hup as i32,
                Signal::Term => rpb::ProcessSignal::Term as i32,
                Signal::Kill => rpb::ProcessSignal::Kill as i32,
            },
        };
        tokio::spawn(async move {
            if let Err(e) = client.signal_session(req).await {
                tracing::warn!("runner SignalSession failed: {e}");
            }
        });
    }
}

impl RunHandle {
    /// A run owned by the runner.
    pub fn in_runner(stdin: mpsc::Sender<ToStdin>, run: RunRef) -> Self {
        RunHandle {
            pid: 0,
            stdin,
            signaller: Signaller::Runner(run),
            ready_request: crate::providers::stream_json::READY_REQUEST,
        }
    }

    /// The agent is asked whether it is ready with `line` (its provider's ready request).
    pub fn asking_ready_with(self, line: &'static str) -> Self {
        RunHandle {
            ready_request: line,
            ..self
        }
    }

    /// The line that asks the agent whether it takes messages.
    pub fn ready_request(&self) -> &'static str {
        self.ready_request
    }

    /// Queues one line for the child's stdin. False if the queue is full or the child's stdin is
    /// gone (its exit will follow and be reported).
    pub fn write_line(&self, line: String) -> bool {
        self.stdin.try_send(ToStdin::Line(line)).is_ok()
    }

    /// Closes the child's stdin after what is queued (a graceful end's first step; TERM
    /// follows if the agent does not end).
    pub fn close_input(&self) {
        let _ = self.stdin.try_send(ToStdin::Close);
    }

    /// Signals the child's whole process group.
    pub fn signal(&self, signal: Signal) {
        match &self.signaller {
            Signaller::Group(pid) => proc::signal_group(*pid, signal),
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
) -> Result<RunHandle, SpawnError> {
    let (process, pipes) =
        proc::spawn(plan.command(), true, crate::contain::new_tag()).map_err(|source| {
            SpawnError::Io {
                program: plan.program.clone(),
                source,
            }
        })?;
    let pid = process.pid;
    let mut stdin = pipes.stdin.expect("stdin is piped");
    let (stdin_tx, mut stdin_rx) = mpsc::channel::<ToStdin>(STDIN_QUEUE);
    let (write_id, write_tx) = (id.clone(), tx.clone());
    tokio::spawn(async move {
        while let Some(msg) = stdin_rx.recv().await {
            let ToStdin::Line(line) = msg else {
                break; // Close: dropping the pipe is the end of input
            };
            let mut bytes = line.into_bytes();
            bytes.push(b'\n');
            let written = match stdin.write_all(&bytes).await {
                Ok(()) => stdin.flush().await,
                Err(e) => Err(e),
            };
            if let Err(e) = written {
                // The agent cannot be written to: what was sent never reached it. The core
                // ends the turn (OBEY-2012) instead of waiting for an exit that may not come.
                let input = Input::Provider {
                    id: write_id,
                    run,
                    cursor: None,
                    event: ProviderEvent::DeliveryFailed {
                        reason: e.to_string(),
                    },
                };
                let _ = write_tx.send(super::Command::Provider(input)).await;
                break;
            }
        }
    });

    let stderr_task = tokio::spawn(StderrTail::read(pipes.stderr));
    let stdin_for_control = stdin_tx.clone();
    let sid = id.clone();
    let out_tx = tx.clone();
    let mut stdout = pipes.stdout;
    let stdout_task = tokio::spawn(async move {
        while let Some(line) = stdout.next_line().await {
            let line = line.text();
            if line.is_empty() {
                continue;
            }
            for parsed in parser.parse_line(&line) {
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
                        let _ = stdin_for_control.send(ToStdin::Line(line)).await;
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
        // A session's agent is its whole process tree: what the leader left behind (tool
        // processes, an ACP agent's own children, even those in sessions of their own) goes
        // with it. Every line the process printed reaches the core before its exit.
        let exit = process.wait().await;
        let _ = stdout_task.await;
        let stderr_tail = stderr_task.await.unwrap_or_default();
        let input = Input::Provider {
            id,
            run,
            cursor: None,
            event: ProviderEvent::Exited {
                code: exit.code,
                signal: exit.signal,
                stderr_tail,
            },
        };
        let _ = tx.send(super::Command::Provider(input)).await;
    });

    Ok(RunHandle {
        pid,
        stdin: stdin_tx,
        signaller: Signaller::Group(pid),
        ready_request: crate::providers::stream_json::READY_REQUEST,
    })
}

/// Signals a process group (nothing for pid 0, which would be the daemon's own group).
pub use crate::proc::signal_group;

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
/// progress (when the task `reports_progress`), other stdout lines output, stderr lines stderr.
pub fn task_line(line: String, is_stderr: bool, progress: bool) -> paddock_core::task::OutputKind {
    use paddock_core::task::OutputKind;
    let progress = if progress && !is_stderr {
        parse_progress(&line)
    } else {
        None
    };
    match (is_stderr, progress) {
        (false, Some((centi, operation))) => OutputKind::Progress { centi, operation },
        (false, None) => OutputKind::Stdout(line),
        (true, _) => OutputKind::Stderr(line),
    }
}

/// Starts a task's command (stdin closed, contained like every supervised process); its output
/// lines and its exit become task inputs on `tx`. Returns the pid.
pub fn spawn_task(
    id: &str,
    spec: &paddock_core::task::TaskSpec,
    tx: mpsc::Sender<super::Command>,
) -> Result<u32, SpawnError> {
    use paddock_core::task::TaskInput;
    let (program, args) = spec.command.split_first().ok_or(SpawnError::EmptyCommand)?;
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).envs(spec.environment.iter());
    if !spec.working_dir.is_empty() {
        cmd.current_dir(&spec.working_dir);
    }
    let (process, pipes) =
        proc::spawn(cmd, false, crate::contain::new_tag()).map_err(|source| SpawnError::Io {
            program: program.into(),
            source,
        })?;
    let pid = process.pid;
    let out_task = tokio::spawn(read_task_lines(
        pipes.stdout.with_line_limit(TASK_LINE_BYTES_MAX),
        false,
        spec.reports_progress(),
        id.to_string(),
        tx.clone(),
    ));
    let err_task = tokio::spawn(read_task_lines(
        pipes.stderr.with_line_limit(TASK_LINE_BYTES_MAX),
        true,
        false,
        id.to_string(),
        tx.clone(),
    ));
    let id = id.to_string();
    tokio::spawn(async move {
        let exit = process.wait().await;
        let _ = out_task.await;
        let _ = err_task.await;
        let _ = tx
            .send(super::Command::TaskEvent(TaskInput::Exited {
                id,
                code: exit.code,
                signal: exit.signal,
            }))
            .await;
    });
    Ok(pid)
}

/// A task's stdout or stderr, line by line, as task inputs.
async fn read_task_lines<R: tokio::io::AsyncRead + Unpin>(
    mut out: proc::Output<R>,
    is_stderr: bool,
    progress: bool,
    id: String,
    tx: mpsc::Sender<super::Command>,
) {
    use paddock_core::task::TaskInput;
    while let Some(line) = out.next_line().await {
        let input = TaskInput::Output {
            id: id.clone(),
            kind: task_line(line.text(), is_stderr, progress),
        };
        if tx.send(super::Command::TaskEvent(input)).await.is_err() {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
