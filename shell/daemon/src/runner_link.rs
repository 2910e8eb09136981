//! The daemon's side of the runner (`paddock runner`): agents run as runs of a separate
//! process that outlives the daemon, so a daemon that dies and comes back finds them still
//! running and takes them back.
//!
//! - Start-up: connect to the runner on `<data dir>/runner.sock`, or start one (detached, its
//!   own process group, no parent-death signal: it must survive us).
//! - Spawn: `RunCommand` with the agent's exact argv and environment and a piped stdin; the
//!   response stream is read like a child's pipes: stdout chunks are reassembled into lines for
//!   the provider's parser, stderr's last lines are kept, the final `RunStatus` is the exit.
//! - Cursor: the events parsed from one line reach the event loop as one command (so one
//!   batch, one transaction), the last of them carrying a cursor naming where the line ends
//!   (the runner event's `seq` and the byte offset after the newline); the core stores it with
//!   the batch. After a restart the daemon attaches right after that line: nothing is lost,
//!   nothing applied twice (as long as the runner still buffers it), and the core ignores any
//!   event at or before the stored cursor should one come again.
//! - Acknowledgement: the cursor is the daemon's own statement of what it has stored, so once a
//!   batch committed, each session record in it tells the runner (`AckRun`, coalesced per run
//!   over [`ACK_WINDOW`]) that the run's events before the cursor's event are stored: the
//!   runner drops them, and holds per run only what the daemon has not stored. Nothing is
//!   acknowledged before its commit, so a crash at any point still finds everything after the
//!   stored cursor in the runner. A run the session no longer has (it exited, the session was
//!   restarted or deleted) is acknowledged whole: no daemon will read it again. Task runs are
//!   never read again either (a restarted daemon kills them), so their events are acknowledged
//!   as they are read.
//! - Limits: a runner this daemon starts gets its run and buffer limits as flags; one a previous
//!   daemon started gets them with `SetLimits`, so `--max-sessions` always reaches the runner.
//! - If the runner goes away, the run's exit is reported with the reason (OBEY-2031).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use paddock_core::{Input, ProviderEvent, Record, RunId, SessionId, Signal, Surviving};
use paddock_proto::runner::v1 as rpb;
use rpb::runner_client::RunnerClient;
use tokio::sync::{mpsc, Notify, Semaphore};
use tonic::transport::Channel;

use super::supervisor::{task_line, RunHandle, RunRef, ToStdin, TASK_LINE_BYTES_MAX};
use super::Command;
use crate::proc::{LaunchPlan, LineSplitter, StderrTail, LINE_BYTES_MAX};
use crate::providers::{LineParser, Parsed};

/// Lines queued for one agent's stdin.
const STDIN_QUEUE: usize = 64;
/// Bits of the cursor for the byte offset within a runner event (chunks are at most 64 KiB).
const OFFSET_BITS: u32 = 17;
/// How long acknowledgements gather before they are sent: a busy run commits a batch every
/// few milliseconds, and one `AckRun` per run per window is plenty.
pub const ACK_WINDOW: Duration = Duration::from_millis(20);
/// A task run's events are acknowledged every this many (and at its end).
const TASK_ACK_EVERY: u64 = 256;

/// The cursor of the position `offset` bytes into runner event `seq` (the end of a line).
/// Cursors grow with the position in the output.
pub fn cursor(seq: u64, offset: usize) -> u64 {
    (seq << OFFSET_BITS) | offset as u64
}

/// The position a cursor names: (runner event seq, byte offset in it).
pub fn position(cursor: u64) -> (u64, usize) {
    (
        cursor >> OFFSET_BITS,
        (cursor & ((1 << OFFSET_BITS) - 1)) as usize,
    )
}

/// The runner's name for run `run` of session `id`.
pub fn run_id(id: &SessionId, run: RunId) -> String {
    format!("agent:{id}:{run}")
}

/// The session and run of a runner run id made by [`run_id`].
pub fn parse_run_id(s: &str) -> Option<(SessionId, RunId)> {
    let rest = s.strip_prefix("agent:")?;
    let (id, run) = rest.rsplit_once(':')?;
    Some((SessionId(id.to_string()), run.parse().ok()?))
}

/// A finished run's exit as (code, signal): the runner reports death by signal N as FAILED with
/// exit code 128 + N.
fn exit_of(state: rpb::RunState, exit_code: i32) -> (Option<i32>, Option<i32>) {
    if state == rpb::RunState::Failed && exit_code > 128 {
        (None, Some(exit_code - 128))
    } else {
        (Some(exit_code), None)
    }
}

/// The runner's name for task `id`'s run.
pub fn task_run_id(id: &str) -> String {
    format!("task:{id}")
}

/// The task id of a runner run id made by [`task_run_id`].
pub fn parse_task_run_id(s: &str) -> Option<&str> {
    s.strip_prefix("task:")
}

/// The highest runner event of a run the daemon has stored everything up to, given the
/// session's committed cursor: the events before the cursor's own (the line that ends there
/// may be followed, in the same event, by output not applied yet, so that event is kept).
pub fn stored_through(cursor: u64) -> u64 {
    position(cursor).0.saturating_sub(1)
}

/// The daemon's connection to its runner.
#[derive(Debug, Clone)]
pub struct RunnerLink {
    client: RunnerClient<Channel>,
    pub socket: PathBuf,
    data_dir: PathBuf,
    exe: PathBuf,
    limits: crate::runner::Limits,
    acks: Arc<Acks>,
    /// Room for agents' events in the loop's queue, shared by every run's reader: a command
    /// of an agent's lines takes one permit per event (see [`send_lines`]).
    room: Arc<Semaphore>,
}

/// Acknowledgements on their way to the runner (see the module's "Acknowledgement").
#[derive(Debug, Default)]
struct Acks {
    st: Mutex<AckState>,
    /// Wakes the sender (one task per link).
    wake: Notify,
}

#[derive(Debug, Default)]
struct AckState {
    /// Per session, the run its last committed record names, what was acknowledged of it, and
    /// the runner's id of that run (made once a run, not once a commit).
    sessions: BTreeMap<SessionId, Acked>,
    /// Not sent yet: runner run id → the seq stored through (`u64::MAX`: all of it).
    pending: BTreeMap<String, u64>,
}

/// What was acknowledged of a session's current run.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Acked {
    run: RunId,
    seq: u64,
    run_id: String,
}

impl AckState {
    /// What a committed session record says: the events it stored of its run, and that a run
    /// it no longer names will not be read again.
    ///
    /// A busy session's batch holds a record per event: the usual one (the same run, further
    /// on) changes its entry in place, without a new string or map entry.
    fn session(&mut self, id: &SessionId, now: Option<(RunId, u64)>) {
        if let (Some((run, seq)), Some(acked)) = (now, self.sessions.get_mut(id)) {
            if acked.run == run {
                if seq > acked.seq {
                    acked.seq = seq;
                    push_ack(&mut self.pending, &acked.run_id, seq);
                }
                return;
            }
        }
        if let Some(old) = self.sessions.remove(id) {
            // A run the session no longer names is read no more: all of it may go.
            push_ack(&mut self.pending, &old.run_id, u64::MAX);
        }
        if let Some((run, seq)) = now {
            let run_id = run_id(id, run);
            if seq > 0 {
                push_ack(&mut self.pending, &run_id, seq);
            }
            self.sessions.insert(id.clone(), Acked { run, seq, run_id });
        }
    }
}

/// `seq` of `run_id` is stored; never moves an acknowledgement back. A function of the map
/// alone, so that it runs beside a borrowed session entry.
fn push_ack(pending: &mut BTreeMap<String, u64>, run_id: &str, seq: u64) {
    match pending.get_mut(run_id) {
        Some(e) => *e = (*e).max(seq),
        None => {
            pending.insert(run_id.to_string(), seq);
        }
    }
}

impl RunnerLink {
    /// Connects to the runner of `data_dir`, starting one if none answers.
    pub async fn connect_or_start(
        data_dir: &Path,
        exe: &Path,
        limits: &crate::runner::Limits,
    ) -> Result<Self, crate::runner::client::StartError> {
        let socket = data_dir.join("runner.sock");
        let client = match crate::runner::client::connect(&socket).await {
            Some(mut client) => {
                tracing::info!(socket = %socket.display(), "using the running runner");
                // A previous daemon started it, perhaps with other limits: ours hold now.
                let req = rpb::SetLimitsRequest {
                    max_runs: u32::try_from(limits.live_runs).unwrap_or(u32::MAX),
                    buffer_events: u32::try_from(limits.events_per_run).unwrap_or(u32::MAX),
                    buffer_bytes: limits.bytes_per_run as u64,
                };
                if let Err(e) = client.set_limits(req).await {
                    tracing::warn!(
                        "the running runner keeps its own limits (SetLimits: {}); restart it to \
                         apply --max-sessions and the buffer bounds",
                        e.message()
                    );
                }
                client
            }
            None => crate::runner::client::start(data_dir, exe, &socket, limits).await?,
        };
        let acks = Arc::new(Acks::default());
        tokio::spawn(send_acks(client.clone(), acks.clone()));
        Ok(RunnerLink {
            client,
            socket,
            data_dir: data_dir.to_path_buf(),
            exe: exe.to_path_buf(),
            limits: limits.clone(),
            acks,
            room: Arc::new(Semaphore::new(crate::port::COMMAND_QUEUE)),
        })
    }

    /// A batch committed with these records: the runner may forget what they stored. Called on
    /// the event loop, after the commit and before anything is delivered: it only notes the
    /// acknowledgements (a lock and a map), a task of its own sends them.
    pub fn committed(&self, records: &[Record]) {
        let mut st = self.acks.st.lock().unwrap_or_else(|p| p.into_inner());
        for r in records {
            match r {
                Record::Session(rec) => {
                    let now = rec
                        .run
                        .map(|run| (run, stored_through(rec.provider_cursor)));
                    st.session(&rec.id, now);
                }
                Record::Delete(id) => st.session(id, None),
                _ => {}
            }
        }
        let woke = !st.pending.is_empty();
        drop(st);
        if woke {
            self.acks.wake.notify_one();
        }
    }

    /// Acknowledges `seq` of runner run `run_id` (coalesced like [`Self::committed`]'s).
    fn ack_later(&self, run_id: &str, seq: u64) {
        let mut st = self.acks.st.lock().unwrap_or_else(|p| p.into_inner());
        push_ack(&mut st.pending, run_id, seq);
        drop(st);
        self.acks.wake.notify_one();
    }

    /// What the runner still has at start-up, for the core to decide on: the agent runs —
    /// live, or finished with output the previous daemon may not have read — as session →
    /// (run, pid), the task runs still running (task id → pid), and the highest agent run id
    /// it knows (new run ids must be above it: the runner refuses an id it remembers). The
    /// engine adopts only the agent runs a stored record names as the session's current run,
    /// and kills every task run.
    pub async fn surviving_runs(&self) -> Result<(Surviving, RunId), tonic::Status> {
        let runs = self
            .client
            .clone()
            .list_runs(rpb::ListRunsRequest {})
            .await?
            .into_inner()
            .runs;
        let mut max_run = 0;
        let mut out = Surviving::default();
        for r in runs {
            let pid = (r.pid > 0).then_some(r.pid);
            if let Some(task) = parse_task_run_id(&r.run_id) {
                if r.state == rpb::RunState::Started as i32 {
                    tracing::warn!(run = %r.run_id, "a task run left by the previous daemon is still running");
                    out.tasks.insert(task.to_string(), pid);
                }
                continue;
            }
            let Some((id, run)) = parse_run_id(&r.run_id) else {
                continue;
            };
            max_run = max_run.max(run);
            // Every one: the core adopts the run a record names and kills the others.
            out.agents.insert((id, run), pid);
        }
        Ok((out, max_run))
    }

    /// Signals an agent's run the daemon holds no handle for (one the core did not adopt at
    /// start-up), by its run id.
    pub fn signal_agent(&self, id: &SessionId, run: RunId, signal: Signal) {
        self.run_ref(id, run).signal(signal);
    }

    /// Signals a task's run.
    pub fn signal_task(&self, id: &str, signal: Signal) {
        RunRef {
            client: self.client.clone(),
            run_id: task_run_id(id),
        }
        .signal(signal);
    }

    /// Starts a task's command as a run of the runner; its output, start and exit come back as
    /// task inputs (stdout lines with the `::progress` convention, stderr lines).
    pub fn spawn_task(
        &self,
        id: &str,
        spec: &paddock_core::task::TaskSpec,
        tx: mpsc::Sender<Command>,
    ) {
        use paddock_core::task::TaskInput;
        let run_id = task_run_id(id);
        let req = rpb::RunCommandRequest {
            run_id: run_id.clone(),
            working_dir: spec.working_dir.clone(),
            command: spec.command.join(" "),
            use_shell: false,
            ssh_auth_sock: String::new(),
            keep_stdin: false,
            argv: spec.command.clone(),
            environment: spec.environment.clone().into_iter().collect(),
            // A task is the daemon's alone (a restarted daemon never adopts one): it ends
            // with the daemon's connection, so nothing it started runs unowned.
            stop_on_hangup: true,
        };
        let mut client = self.client.clone();
        let id = id.to_string();
        let progress = spec.reports_progress();
        let link = self.clone();
        tokio::spawn(async move {
            let send = |input: TaskInput| {
                let tx = tx.clone();
                async move { tx.send(Command::TaskEvent(input)).await.is_ok() }
            };
            let mut stream = match client.run_command(req).await {
                Ok(s) => s.into_inner(),
                Err(e) => {
                    send(TaskInput::SpawnFailed {
                        id,
                        reason: format!("the runner refused the run: {}", e.message()),
                    })
                    .await;
                    return;
                }
            };
            let mut started = false;
            let mut out = LineSplitter::new(TASK_LINE_BYTES_MAX);
            let mut err = LineSplitter::new(TASK_LINE_BYTES_MAX);
            let mut lines = Vec::new();
            loop {
                let ev = match stream.message().await {
                    Ok(Some(ev)) => ev,
                    Ok(None) | Err(_) => {
                        let input = if started {
                            TaskInput::Exited {
                                id,
                                code: None,
                                signal: None,
                            }
                        } else {
                            TaskInput::SpawnFailed {
                                id,
                                reason: "the runner went away".into(),
                            }
                        };
                        send(input).await;
                        return;
                    }
                };
                // A task's output is never read again (a restarted daemon kills its tasks), so
                // what was read need not be kept.
                if ev.seq % TASK_ACK_EVERY == 0 {
                    link.ack_later(&run_id, ev.seq);
                }
                use rpb::runner_event::Payload;
                match ev.payload {
                    Some(Payload::CommandOutput(o)) => {
                        let is_err = o.stream == rpb::StreamKind::Stderr as i32;
                        let split = if is_err { &mut err } else { &mut out };
                        split.feed(o.text.as_bytes(), &mut lines);
                        for line in lines.drain(..) {
                            let kind = task_line(line.text(), is_err, progress);
                            if !send(TaskInput::Output {
                                id: id.clone(),
                                kind,
                            })
                            .await
                            {
                                return;
                            }
                        }
                    }
                    Some(Payload::Status(st)) => {
                        let state = rpb::RunState::try_from(st.state).unwrap_or_default();
                        match state {
                            rpb::RunState::Started => {
                                started = true;
                                let pid = client
                                    .list_runs(rpb::ListRunsRequest {})
                                    .await
                                    .ok()
                                    .and_then(|r| {
                                        r.into_inner()
                                            .runs
                                            .into_iter()
                                            .find(|r| r.run_id == run_id)
                                            .map(|r| r.pid)
                                    })
                                    .unwrap_or(0);
                                send(TaskInput::Started {
                                    id: id.clone(),
                                    pid,
                                })
                                .await;
                            }
                            rpb::RunState::Finished | rpb::RunState::Failed => {
                                link.ack_later(&run_id, u64::MAX);
                                // What is left without a final newline is a line too.
                                out.finish(&mut lines);
                                let last_out = lines.len();
                                err.finish(&mut lines);
                                for (i, line) in lines.drain(..).enumerate() {
                                    send(TaskInput::Output {
                                        id: id.clone(),
                                        kind: task_line(line.text(), i >= last_out, progress),
                                    })
                                    .await;
                                }
                                let input = if started {
                                    let (code, signal) = exit_of(state, st.exit_code);
                                    TaskInput::Exited { id, code, signal }
                                } else {
                                    TaskInput::SpawnFailed {
                                        id,
                                        reason: paddock_core::run::spawn_failure_reason(
                                            &st.message,
                                        )
                                        .to_string(),
                                    }
                                };
                                send(input).await;
                                return;
                            }
                            rpb::RunState::Unspecified => {}
                        }
                    }
                    _ => {}
                }
            }
        });
    }

    /// Asks the runner to stop (SIGTERM to the pid it wrote next to its socket). Used on a
    /// clean daemon shutdown, when every session was stopped: nothing is left for it to keep.
    pub fn stop_runner(&self) {
        let pid_file = crate::runner::pid_file(&self.socket);
        if let Some(pid) = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }

    fn run_ref(&self, id: &SessionId, run: RunId) -> RunRef {
        RunRef {
            client: self.client.clone(),
            run_id: run_id(id, run),
        }
    }

    /// Starts an agent as a run of the runner. `Started` / `SpawnFailed` come as inputs.
    pub fn spawn_agent(
        &self,
        plan: &LaunchPlan,
        id: SessionId,
        run: RunId,
        parser: Box<dyn LineParser>,
        tx: mpsc::Sender<Command>,
    ) -> RunHandle {
        let rref = self.run_ref(&id, run);
        let stdin = self.stdin_forwarder(&rref, &id, run, &tx);
        let mut argv = vec![plan.program.display().to_string()];
        argv.extend(plan.args.iter().cloned());
        let req = rpb::RunCommandRequest {
            run_id: rref.run_id.clone(),
            working_dir: plan.cwd.display().to_string(),
            command: argv.join(" "),
            use_shell: false,
            ssh_auth_sock: String::new(),
            keep_stdin: true,
            argv,
            environment: plan.env.iter().cloned().collect(),
            // An agent outlives the daemon: the next one takes it back.
            stop_on_hangup: false,
        };
        let client = self.client.clone();
        let link = self.clone();
        tokio::spawn(async move {
            // Boxed: the call (and a restart) is over once the stream opens, and the task lives
            // as long as the run; unboxed, its state would keep their size (some KiB) per run.
            let (client, result) = Box::pin(link.run_command(client, req)).await;
            match result {
                Ok(stream) => {
                    let room = link.room.clone();
                    let reader = Reader::new(id, run, parser, tx, room, client, Begin::Spawned);
                    reader.read(stream.into_inner()).await;
                }
                Err(e) => {
                    let event = ProviderEvent::SpawnFailed {
                        reason: format!("the runner refused the run: {}", e.message()),
                    };
                    let _ = tx
                        .send(Command::Provider(Input::Provider {
                            id,
                            run,
                            cursor: None,
                            event,
                        }))
                        .await;
                }
            }
        });
        RunHandle::in_runner(stdin, rref)
    }

    /// Opens run `req`'s event stream; a runner that does not answer (it died, and its runs
    /// with it) is started again and asked once more. Returns the client that answered.
    async fn run_command(
        &self,
        mut client: RunnerClient<Channel>,
        req: rpb::RunCommandRequest,
    ) -> (
        RunnerClient<Channel>,
        Result<tonic::Response<tonic::Streaming<rpb::RunnerEvent>>, tonic::Status>,
    ) {
        let mut result = client.run_command(req.clone()).await;
        if matches!(&result, Err(e) if e.code() == tonic::Code::Unavailable) {
            tracing::warn!("the runner does not answer; starting a new one");
            if let Ok(fresh) =
                crate::runner::client::start(&self.data_dir, &self.exe, &self.socket, &self.limits)
                    .await
            {
                client = fresh;
                result = client.run_command(req).await;
            }
        }
        (client, result)
    }

    /// Takes back an agent run that outlived the previous daemon, reading its output from just
    /// after the last line the session applied (`cursor`).
    pub fn attach_agent(
        &self,
        id: SessionId,
        run: RunId,
        cursor: u64,
        parser: Box<dyn LineParser>,
        tx: mpsc::Sender<Command>,
    ) -> RunHandle {
        let rref = self.run_ref(&id, run);
        let stdin = self.stdin_forwarder(&rref, &id, run, &tx);
        let (seq, offset) = if cursor == 0 {
            (0, 0)
        } else {
            position(cursor)
        };
        let req = rpb::AttachRunRequest {
            run_id: rref.run_id.clone(),
            after_seq: seq.saturating_sub(1),
        };
        // The cursor was read from the store: what is before it need not be kept.
        if cursor > 0 {
            self.ack_later(&rref.run_id, stored_through(cursor));
        }
        let mut client = self.client.clone();
        let room = self.room.clone();
        tokio::spawn(async move {
            let reader = Reader::new(
                id.clone(),
                run,
                parser,
                tx.clone(),
                room,
                client.clone(),
                Begin::Attached {
                    skip: (seq > 0).then_some((seq, offset)),
                },
            );
            // Boxed, as a spawn's call: the task lives as long as the run.
            match Box::pin(client.attach_run(req)).await {
                Ok(stream) => reader.read(stream.into_inner()).await,
                Err(e) => {
                    reader
                        .lost(format!("cannot reattach: {}", e.message()))
                        .await
                }
            }
        });
        RunHandle::in_runner(stdin, rref)
    }

    /// A queue whose lines are written to the run's stdin, in order; a write the runner
    /// refuses is the session's `DeliveryFailed`, sent on `loop_tx`.
    fn stdin_forwarder(
        &self,
        rref: &RunRef,
        id: &SessionId,
        run: RunId,
        loop_tx: &mpsc::Sender<Command>,
    ) -> mpsc::Sender<ToStdin> {
        let (tx, mut rx) = mpsc::channel::<ToStdin>(STDIN_QUEUE);
        let (id, loop_tx) = (id.clone(), loop_tx.clone());
        let mut client = self.client.clone();
        let run_id = rref.run_id.clone();
        tokio::spawn(async move {
            while let Some(msg) = rx.recv().await {
                let req = match msg {
                    ToStdin::Line(line) => {
                        let mut data = line.into_bytes();
                        data.push(b'\n');
                        rpb::WriteStdinRequest {
                            run_id: run_id.clone(),
                            data,
                            close: false,
                        }
                    }
                    ToStdin::Close => {
                        // End of input; whether the agent then ends is its exit's to say.
                        let req = rpb::WriteStdinRequest {
                            run_id: run_id.clone(),
                            data: Vec::new(),
                            close: true,
                        };
                        let _ = Box::pin(client.write_stdin(req)).await;
                        break;
                    }
                };
                // Boxed: the task waits for lines far longer than it writes them, and an
                // unboxed call would size its state for the whole run.
                let failed = match Box::pin(client.write_stdin(req)).await {
                    Ok(r) if r.get_ref().ok => continue,
                    Ok(r) => r.into_inner().message,
                    Err(e) => e.message().to_string(),
                };
                tracing::warn!(run = %run_id, "stdin: {failed}");
                // What was sent never reached the agent: the core ends the turn (OBEY-2012).
                if let Ok(room) = loop_tx.reserve().await {
                    room.send(Command::Provider(Input::Provider {
                        id: id.clone(),
                        run,
                        cursor: None,
                        event: ProviderEvent::DeliveryFailed { reason: failed },
                    }));
                }
                break;
            }
        });
        tx
    }
}

/// Sends the link's acknowledgements, one `AckRun` per run per [`ACK_WINDOW`]. One that fails
/// (the runner is restarting) is not repeated: the next commit of that run acknowledges at
/// least as much, and an unacknowledged event only costs the runner memory within its bounds.
async fn send_acks(mut client: RunnerClient<Channel>, acks: Arc<Acks>) {
    loop {
        acks.wake.notified().await;
        tokio::time::sleep(ACK_WINDOW).await;
        let pending =
            std::mem::take(&mut acks.st.lock().unwrap_or_else(|p| p.into_inner()).pending);
        for (run_id, seq) in pending {
            if let Err(e) = client.ack_run(rpb::AckRunRequest { run_id, seq }).await {
                tracing::debug!("AckRun: {}", e.message());
            }
        }
    }
}

/// The most inputs one [`Command::ProviderLines`] carries (a line's events are never split,
/// so one line's may be more): a chunk of output (up to 64 KiB) can hold hundreds of lines.
const LINES_INPUTS_MAX: usize = 64;

/// Sends the events of the lines in `batch` to the loop as one command, once the queue has
/// room for the command and `room` for its events (one permit each, given back when the loop
/// takes them: agents' events wait in the queue no deeper than one per slot, as if each
/// line were its own command); false when the loop is gone.
async fn send_lines(
    tx: &mpsc::Sender<Command>,
    room: &Arc<Semaphore>,
    batch: &mut Vec<Input>,
) -> bool {
    if batch.is_empty() {
        return true;
    }
    // A line of more events than the queue holds takes all of it.
    let events = u32::try_from(batch.len().min(crate::port::COMMAND_QUEUE)).unwrap_or(1);
    let Ok(permit) = room.clone().acquire_many_owned(events).await else {
        return false;
    };
    let Ok(slot) = tx.reserve().await else {
        return false;
    };
    // The next command's room is as large as this one's (the rest of a chunk of many lines
    // fills it again without growing it step by step).
    let next = Vec::with_capacity(batch.capacity());
    slot.send(Command::ProviderLines(
        std::mem::replace(batch, next),
        permit,
    ));
    true
}

/// How a [`Reader`] comes to a run.
enum Begin {
    /// Its run was just asked for: `Started` comes from the runner.
    Spawned,
    /// An agent run that outlived the previous daemon, its output read again from just after
    /// `skip` (the last line the session applied), if anything was.
    Attached { skip: Option<(u64, usize)> },
}

/// Reads one run's event stream into provider inputs.
struct Reader {
    id: SessionId,
    run: RunId,
    parser: Box<dyn LineParser>,
    tx: mpsc::Sender<Command>,
    /// The link's room for events in the loop's queue.
    room: Arc<Semaphore>,
    client: RunnerClient<Channel>,
    started: bool,
    /// Skip output before this position (a reattach resumes after the last applied line).
    skip: Option<(u64, usize)>,
    stdout: LineSplitter,
    stderr: StderrTail,
}

impl Reader {
    fn new(
        id: SessionId,
        run: RunId,
        parser: Box<dyn LineParser>,
        tx: mpsc::Sender<Command>,
        room: Arc<Semaphore>,
        client: RunnerClient<Channel>,
        begin: Begin,
    ) -> Self {
        let (started, skip) = match begin {
            Begin::Spawned => (false, None),
            Begin::Attached { skip } => (true, skip),
        };
        Reader {
            id,
            run,
            parser,
            tx,
            room,
            client,
            started,
            skip,
            stdout: LineSplitter::new(LINE_BYTES_MAX),
            stderr: StderrTail::default(),
        }
    }

    /// Sends one provider input to the loop. The command is made once the queue has room:
    /// a `send(command)` future holds the command while it waits, and this one lives as long
    /// as the run (see [`Reader::read`]).
    async fn send(&mut self, cursor: Option<u64>, event: ProviderEvent) -> bool {
        let Ok(room) = self.tx.reserve().await else {
            return false;
        };
        room.send(Command::Provider(Input::Provider {
            id: self.id.clone(),
            run: self.run,
            cursor,
            event,
        }));
        true
    }

    /// Reads the run's events until its end. This future lives as long as the run, once per
    /// live session, and is as large as its largest await: what happens once (the end, the
    /// pid) is boxed, and sends make their command only when the queue has room.
    async fn read(mut self, mut stream: tonic::Streaming<rpb::RunnerEvent>) {
        loop {
            let ev = match stream.message().await {
                Ok(Some(ev)) => ev,
                Ok(None) => {
                    return Box::pin(self.lost("the runner ended the run's stream".into())).await
                }
                Err(e) => {
                    let why = format!("the runner went away: {}", e.message());
                    return Box::pin(self.lost(why)).await;
                }
            };
            use rpb::runner_event::Payload;
            match ev.payload {
                Some(Payload::CommandOutput(out)) => {
                    if out.stream == rpb::StreamKind::Stderr as i32 {
                        self.stderr.feed(out.text.as_bytes());
                    } else if !self.stdout(ev.seq, &out.text).await {
                        return;
                    }
                }
                Some(Payload::Status(st)) => {
                    let state = rpb::RunState::try_from(st.state).unwrap_or_default();
                    match state {
                        rpb::RunState::Started => {
                            if !self.started {
                                self.started = true;
                                // Boxed: asked once per run (see `run_command`).
                                let pid = Box::pin(self.pid()).await;
                                if !self.send(None, ProviderEvent::Started { pid }).await {
                                    return;
                                }
                            }
                        }
                        rpb::RunState::Finished | rpb::RunState::Failed => {
                            return Box::pin(self.finish(state, st.exit_code, &st.message)).await;
                        }
                        rpb::RunState::Unspecified => {}
                    }
                }
                Some(Payload::Truncated(t)) => {
                    tracing::warn!(
                        session = %self.id,
                        "the runner no longer holds {} events of this run; output was lost",
                        t.dropped
                    );
                    self.stdout.reset();
                    self.skip = None;
                    // Recorded in the session, at the position where the kept output resumes:
                    // a later reattach from there does not record it twice.
                    let lost = ProviderEvent::OutputLost {
                        dropped: t.dropped,
                        first: t.first_dropped_seq,
                        next: t.next_seq,
                    };
                    if !self.send(Some(cursor(t.next_seq, 0)), lost).await {
                        return;
                    }
                }
                Some(Payload::Exec(_)) | None => {}
            }
        }
    }

    async fn pid(&mut self) -> Option<u32> {
        let runs = self
            .client
            .list_runs(rpb::ListRunsRequest {})
            .await
            .ok()?
            .into_inner()
            .runs;
        let want = run_id(&self.id, self.run);
        runs.into_iter()
            .find(|r| r.run_id == want)
            .map(|r| r.pid)
            .filter(|p| *p > 0)
    }

    /// Feeds one stdout chunk: whole lines go to the parser with their cursors, and the
    /// events of consecutive lines to the loop as one command (at most
    /// [`LINES_INPUTS_MAX`] inputs, never part of a line's).
    async fn stdout(&mut self, seq: u64, text: &str) -> bool {
        let mut from = 0;
        if let Some((skip_seq, skip_off)) = self.skip {
            if seq < skip_seq {
                return true;
            }
            if seq == skip_seq {
                // Just after a line's `\n`, so on a character's boundary.
                from = text.floor_char_boundary(skip_off);
            }
            self.skip = None;
        }
        let mut lines = Vec::new();
        self.stdout.feed_text(&text[from..], &mut lines);
        let mut batch: Vec<Input> = Vec::with_capacity(lines.len().min(LINES_INPUTS_MAX));
        // One line's events, in room used again for every line.
        let mut inputs = Vec::new();
        for line in lines {
            let end = from + line.end;
            if line.text.is_empty() {
                continue;
            }
            // A chunk holds hundreds of lines: its parsing lets the worker's other tasks (the
            // clients' streams) run between lines as a line per command did.
            tokio::task::consume_budget().await;
            let parsed = self.parser.parse_line(&line.text);
            inputs.reserve(parsed.len());
            for parsed in parsed {
                match parsed {
                    Parsed::Event(event) => inputs.push(Input::Provider {
                        id: self.id.clone(),
                        run: self.run,
                        cursor: None,
                        event,
                    }),
                    Parsed::Reply(line) => {
                        // After what the lines before it made, as if each went on its own.
                        if !send_lines(&self.tx, &self.room, &mut batch).await {
                            return false;
                        }
                        let mut client = self.client.clone();
                        let req = rpb::WriteStdinRequest {
                            run_id: run_id(&self.id, self.run),
                            data: (line + "\n").into_bytes(),
                            close: false,
                        };
                        let _ = Box::pin(client.write_stdin(req)).await;
                    }
                    Parsed::Unrecognized(line) => {
                        if !send_lines(&self.tx, &self.room, &mut batch).await {
                            return false;
                        }
                        // As `send`: the command is made once there is room.
                        let Ok(room) = self.tx.reserve().await else {
                            return false;
                        };
                        room.send(Command::Unrecognized {
                            id: self.id.clone(),
                            run: self.run,
                            line,
                        });
                    }
                }
            }
            // The line's events go in one command (one batch, one transaction); the last one
            // carries the line's end as the cursor the session stores.
            if let Some(Input::Provider { cursor: c, .. }) = inputs.last_mut() {
                *c = Some(cursor(seq, end));
            }
            if batch.len() + inputs.len() > LINES_INPUTS_MAX
                && !send_lines(&self.tx, &self.room, &mut batch).await
            {
                return false;
            }
            batch.append(&mut inputs);
        }
        send_lines(&self.tx, &self.room, &mut batch).await
    }

    async fn finish(mut self, state: rpb::RunState, exit_code: i32, message: &str) {
        let event = if !self.started && state == rpb::RunState::Failed {
            ProviderEvent::SpawnFailed {
                reason: paddock_core::run::spawn_failure_reason(message).to_string(),
            }
        } else {
            let (code, signal) = exit_of(state, exit_code);
            ProviderEvent::Exited {
                code,
                signal,
                stderr_tail: self.stderr.text(),
            }
        };
        self.send(None, event).await;
    }

    /// The run can no longer be followed: report it ended, with the reason.
    async fn lost(mut self, why: String) {
        tracing::warn!(session = %self.id, run = self.run, "{why}");
        let mut tail = self.stderr.text();
        if !tail.is_empty() {
            tail.push('\n');
        }
        tail.push_str(&why);
        let event = if self.started {
            ProviderEvent::Exited {
                code: None,
                signal: None,
                stderr_tail: tail,
            }
        } else {
            ProviderEvent::SpawnFailed { reason: why }
        };
        self.send(None, event).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_grow_with_the_position_and_round_trip() {
        let a = cursor(3, 10);
        let b = cursor(3, 11);
        let c = cursor(4, 0);
        assert!(a < b && b < c);
        assert_eq!(position(b), (3, 11));
        assert_eq!(position(cursor(1 << 40, 65_536)), (1 << 40, 65_536));
    }

    #[test]
    fn acknowledgements_follow_the_committed_cursor_and_release_a_run_left_behind() {
        let a = SessionId("a".into());
        let mut st = AckState::default();
        st.session(&a, Some((1, stored_through(0))));
        assert!(st.pending.is_empty(), "nothing applied: nothing stored");
        // A line ending in event 7 is stored: 1..=6 are; 7 may hold the next line's start.
        st.session(&a, Some((1, stored_through(cursor(7, 120)))));
        assert_eq!(st.pending.get(&run_id(&a, 1)), Some(&6));
        // Coalesced, and never back.
        st.session(&a, Some((1, stored_through(cursor(9, 3)))));
        st.session(&a, Some((1, stored_through(cursor(5, 3)))));
        assert_eq!(st.pending.get(&run_id(&a, 1)), Some(&8));
        assert_eq!(
            st.sessions.get(&a),
            Some(&Acked {
                run: 1,
                seq: 8,
                run_id: run_id(&a, 1)
            })
        );
        st.pending.clear();
        // A new run: the old one is read no more, whole; the new one starts from nothing.
        st.session(&a, Some((2, 0)));
        assert_eq!(st.pending.get(&run_id(&a, 1)), Some(&u64::MAX));
        assert_eq!(st.pending.get(&run_id(&a, 2)), None);
        st.pending.clear();
        // Exited (no run), or deleted: released whole.
        st.session(&a, None);
        assert_eq!(st.pending.get(&run_id(&a, 2)), Some(&u64::MAX));
        assert!(st.sessions.is_empty());
    }

    /// Agents' events wait in the loop's queue no deeper than its room, however many lines a
    /// command carries: a command waits until the loop has taken enough of those before it.
    #[tokio::test]
    async fn a_command_of_lines_waits_for_room_for_its_events() {
        let (tx, mut rx) = mpsc::channel(16);
        let room = Arc::new(Semaphore::new(10));
        let events = |n: usize| -> Vec<Input> {
            (0..n)
                .map(|_| Input::Provider {
                    id: SessionId("s".into()),
                    run: 1,
                    cursor: None,
                    event: ProviderEvent::Started { pid: None },
                })
                .collect()
        };
        let mut first = events(6);
        assert!(send_lines(&tx, &room, &mut first).await);
        assert!(first.is_empty());
        assert_eq!(room.available_permits(), 4);
        // Six more do not fit until the loop takes the first six.
        let second = tokio::spawn({
            let (tx, room) = (tx.clone(), room.clone());
            async move { send_lines(&tx, &room, &mut events(6)).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!second.is_finished());
        let Some(Command::ProviderLines(taken, permit)) = rx.recv().await else {
            panic!("the first command")
        };
        assert_eq!(taken.len(), 6);
        drop(permit);
        assert!(second.await.unwrap());
        assert_eq!(room.available_permits(), 4);
        let Some(Command::ProviderLines(_, permit)) = rx.recv().await else {
            panic!("the second command")
        };
        drop(permit);
        // Nothing is sent for no events, and no room is taken.
        assert!(send_lines(&tx, &room, &mut Vec::new()).await);
        assert_eq!(room.available_permits(), 10);
        assert!(rx.try_recv().is_err());
        // A line of more events than the loop's whole room takes all of it, and goes.
        let whole = crate::port::COMMAND_QUEUE;
        let room = Arc::new(Semaphore::new(whole));
        assert!(send_lines(&tx, &room, &mut events(whole + 5)).await);
        assert_eq!(room.available_permits(), 0);
        let Some(Command::ProviderLines(taken, _)) = rx.recv().await else {
            panic!("the third command")
        };
        assert_eq!(taken.len(), whole + 5);
    }

    #[test]
    fn run_ids_round_trip() {
        let id = SessionId("sess_01ABC".into());
        assert_eq!(parse_run_id(&run_id(&id, 42)), Some((id, 42)));
        assert_eq!(parse_run_id("task:x:1"), None);
        assert_eq!(parse_run_id("agent:x:y"), None);
        assert_eq!(parse_task_run_id(&task_run_id("t:1")), Some("t:1"));
        assert_eq!(parse_task_run_id("agent:x:1"), None);
    }
}
