//! The event loop: the one task that owns the engine, the store and the children.
//!
//! Each iteration waits for a command or the engine's next deadline, drains what else is
//! queued (up to [`MAX_BATCH`]), feeds every input to the core, executes the effects — one
//! `match` on `Effect` — and commits the batch's records in one transaction. Only then are
//! status events, activities and replies delivered: a client never sees what a crash could
//! still lose, and a fast agent costs one commit per batch, not one per event.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::time::Duration;

use paddock_core::task::{TaskEffect, TaskInput, TaskOutput, TaskReply, TaskStatusEvent, Tasks};
use paddock_core::{
    ActivityEvent, Approval, ApprovalId, Decision, Effect, Engine, Error, ErrorCode, Input,
    ProviderEvent, Record, RequestId, RunId, SessionId, SessionRecord, StatusEvent,
};
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use super::supervisor::{self, RunHandle};
use crate::paths::now_ms;
use crate::store::tasks::TaskRow;
use crate::store::{Store, UnrecognizedLine};

/// Commands drained per iteration (and so per commit) at most.
pub const MAX_BATCH: usize = 512;
/// The command queue's bound: provider readers wait (and so slow their agent down) when the
/// loop is behind, instead of buffering without limit.
pub const COMMAND_QUEUE: usize = 4096;
/// Activities buffered for one SendMessage client; a client that falls this far behind loses
/// its stream (everything is still in the store: ListActivities / WatchActivity).
pub const TURN_STREAM_BUFFER: usize = 4096;
/// Events buffered per watcher before it is told it fell behind.
pub const WATCH_BUFFER: usize = 4096;

pub type Reply = oneshot::Sender<Result<SessionRecord, Error>>;
pub type ApprovalReply = oneshot::Sender<Result<Approval, Error>>;
pub type TaskReplyTx = oneshot::Sender<Result<TaskReply, Error>>;
pub type TurnStream = mpsc::Sender<Result<ActivityEvent, Error>>;

/// A request for the core; the loop gives it its request id.
#[derive(Debug)]
pub enum Request {
    Create {
        id: SessionId,
        config: Box<paddock_core::SessionConfig>,
    },
    Send {
        id: SessionId,
        text: String,
    },
    Stop {
        id: SessionId,
        graceful: bool,
    },
    Restart {
        id: SessionId,
        provider_config: Option<BTreeMap<String, String>>,
    },
    /// DeleteSession: forget a terminal session and everything stored about it.
    Delete {
        id: SessionId,
    },
}

/// A closure run on the loop's state.
pub type Call = Box<dyn FnOnce(&mut State) + Send>;

/// Something for the loop to do.
pub enum Command {
    /// A provider's event (from a child's reader or waiter).
    Provider(Input),
    /// The events of one line of a provider's output: handled in one batch, so they are
    /// committed together (a line is applied whole or not at all).
    ProviderLine(Vec<Input>),
    /// A session request; `turn` receives the activities of the turn a Send starts.
    Request {
        request: Request,
        reply: Reply,
        turn: Option<TurnStream>,
    },
    /// Resolve a request for a human; `by` names the client.
    Resolve {
        approval: ApprovalId,
        /// Only a request of this session.
        session: Option<SessionId>,
        decision: Decision,
        by: String,
        reply: ApprovalReply,
    },
    /// A task request (launch, cancel); the loop gives it its request id.
    TaskRequest {
        input: TaskInput,
        reply: TaskReplyTx,
    },
    /// A task process's output or exit.
    TaskEvent(TaskInput),
    /// Read or change shell state, run after the current batch committed.
    Call(Call),
    /// A provider line its adapter did not understand: stored raw and counted.
    Unrecognized {
        id: SessionId,
        run: RunId,
        line: String,
    },
}

/// Where status events and activities are published for watchers.
#[derive(Clone)]
pub struct Hub {
    pub status: broadcast::Sender<StatusEvent>,
    pub activity: broadcast::Sender<ActivityEvent>,
    pub task_status: broadcast::Sender<TaskStatusEvent>,
    pub task_output: broadcast::Sender<TaskOutput>,
    /// Requests for a human, as they are opened and resolved.
    pub approval: broadcast::Sender<Approval>,
}

impl Default for Hub {
    fn default() -> Self {
        Self::new()
    }
}

impl Hub {
    pub fn new() -> Self {
        Hub {
            status: broadcast::channel(WATCH_BUFFER).0,
            activity: broadcast::channel(WATCH_BUFFER).0,
            task_status: broadcast::channel(WATCH_BUFFER).0,
            task_output: broadcast::channel(WATCH_BUFFER).0,
            approval: broadcast::channel(WATCH_BUFFER).0,
        }
    }
}

struct Pending {
    reply: Reply,
    turn: Option<TurnStream>,
}

/// The loop's state.
pub struct State {
    pub engine: Engine,
    pub tasks: Tasks,
    pub store: Store,
    pub hub: Hub,
    pub started_at: u64,
    pub socket: PathBuf,
    pub data_dir: PathBuf,
    /// Set by Shutdown / SIGTERM: no new sessions, every session is being stopped.
    pub shutting_down: bool,
    /// The runner agents run in (`None`: they are the daemon's own children).
    pub runner: Option<super::runner_link::RunnerLink>,
    exe: PathBuf,
    tx: mpsc::Sender<Command>,
    runs: BTreeMap<(SessionId, RunId), RunHandle>,
    task_runs: BTreeMap<String, u32>,
    pending: BTreeMap<RequestId, Pending>,
    task_pending: BTreeMap<RequestId, TaskReplyTx>,
    approval_pending: BTreeMap<RequestId, ApprovalReply>,
    turn_streams: BTreeMap<(SessionId, u64), TurnStream>,
    next_req: RequestId,
    /// Told `true` when the loop has finished (after a shutdown).
    done: watch::Sender<bool>,
    /// Unrecognized provider lines per session, as committed.
    pub unrecognized: BTreeMap<String, u64>,
}

#[derive(Default)]
struct Batch {
    records: Vec<Record>,
    unrecognized: Vec<UnrecognizedLine>,
    deliver: Vec<Effect>,
    inputs: VecDeque<Input>,
    task_rows: Vec<TaskRow>,
    task_deliver: Vec<TaskEffect>,
    task_inputs: VecDeque<TaskInput>,
    calls: Vec<Call>,
}

impl State {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        engine: Engine,
        tasks: Tasks,
        store: Store,
        hub: Hub,
        socket: PathBuf,
        data_dir: PathBuf,
        exe: PathBuf,
        tx: mpsc::Sender<Command>,
        done: watch::Sender<bool>,
    ) -> Self {
        State {
            engine,
            tasks,
            store,
            hub,
            started_at: now_ms(),
            socket,
            data_dir,
            shutting_down: false,
            runner: None,
            exe,
            tx,
            runs: BTreeMap::new(),
            task_runs: BTreeMap::new(),
            pending: BTreeMap::new(),
            task_pending: BTreeMap::new(),
            approval_pending: BTreeMap::new(),
            turn_streams: BTreeMap::new(),
            next_req: 1,
            done,
            unrecognized: BTreeMap::new(),
        }
    }

    /// Begins a graceful shutdown: every live session is stopped gracefully; the loop ends
    /// when all are terminal and every child was reaped.
    pub fn begin_shutdown(&mut self) -> usize {
        self.begin_shutdown_with(true)
    }

    /// As [`State::begin_shutdown`]; `graceful = false` interrupts running turns at once.
    pub fn begin_shutdown_with(&mut self, graceful: bool) -> usize {
        if self.shutting_down {
            return self.engine.live_sessions();
        }
        self.shutting_down = true;
        let live: Vec<SessionId> = self
            .engine
            .sessions()
            .filter(|s| !s.status().is_terminal())
            .map(|s| s.record.id.clone())
            .collect();
        let n = live.len();
        tracing::info!("shutting down: stopping {n} live session(s)");
        let running: Vec<String> = self
            .tasks
            .all()
            .filter(|t| !t.status.is_terminal())
            .map(|t| t.id.clone())
            .collect();
        for id in running {
            let (reply, _) = oneshot::channel();
            let _ = self.tx.try_send(Command::TaskRequest {
                input: TaskInput::Cancel { req: 0, id },
                reply,
            });
        }
        for id in live {
            let (reply, _) = oneshot::channel();
            let _ = self.tx.try_send(Command::Request {
                request: Request::Stop { id, graceful },
                reply,
                turn: None,
            });
        }
        n
    }

    /// Takes back the agent runs the engine adopted at start-up (they outlived the previous
    /// daemon in the runner): their output is read again from where each session got to.
    pub fn reattach_adopted(&mut self) {
        let Some(link) = self.runner.clone() else {
            return;
        };
        let adopted: Vec<(SessionId, RunId, u64, paddock_core::SessionRecord)> = self
            .engine
            .sessions()
            .filter_map(|s| {
                let run = s.run().id()?;
                Some((
                    s.record.id.clone(),
                    run,
                    s.record.provider_cursor,
                    s.record.clone(),
                ))
            })
            .collect();
        for (id, run, cursor, record) in adopted {
            let spec = paddock_core::SpawnSpec {
                config: record.config.clone(),
                resume: record.provider_session.clone(),
                restart_count: record.restart_count,
            };
            let mut parser = match crate::providers::plan(&spec, &self.exe) {
                Ok((_, parser)) => parser,
                Err(e) => {
                    tracing::warn!(session = %id, "cannot read the adopted run: {e}");
                    continue;
                }
            };
            if record.turn_open {
                // The turn goes on: what it already counted must not be counted again.
                match self.store.turn_tokens(&id.0, record.turns) {
                    Ok(tokens) => parser.resume_turn(tokens),
                    Err(e) => tracing::warn!(session = %id, "cannot read the turn's tokens: {e}"),
                }
            }
            tracing::info!(session = %id, run, cursor, at = ?super::runner_link::position(cursor), "reattached to a run that outlived the daemon");
            let handle = link.attach_agent(id.clone(), run, cursor, parser, self.tx.clone());
            self.runs.insert((id, run), handle);
        }
    }

    fn finished(&self) -> bool {
        self.shutting_down
            && self.engine.live_sessions() == 0
            && self.runs.is_empty()
            && self.task_runs.is_empty()
    }

    fn command(&mut self, cmd: Command, batch: &mut Batch) {
        match cmd {
            Command::Provider(input) => batch.inputs.push_back(input),
            Command::ProviderLine(inputs) => batch.inputs.extend(inputs),
            Command::Request {
                request,
                reply,
                turn,
            } => {
                let req = self.next_req;
                self.next_req += 1;
                self.pending.insert(req, Pending { reply, turn });
                let input = match request {
                    Request::Create { id, config } => Input::Create {
                        req,
                        id,
                        config: *config,
                    },
                    Request::Send { id, text } => Input::Send { req, id, text },
                    Request::Stop { id, graceful } => Input::Stop { req, id, graceful },
                    Request::Restart {
                        id,
                        provider_config,
                    } => Input::Restart {
                        req,
                        id,
                        provider_config,
                    },
                    Request::Delete { id } => Input::Delete { req, id },
                };
                batch.inputs.push_back(input);
            }
            Command::Resolve {
                approval,
                session,
                decision,
                by,
                reply,
            } => {
                let req = self.next_req;
                self.next_req += 1;
                self.approval_pending.insert(req, reply);
                // What the store holds, for a request older than the engine remembers.
                let stored = match self.store.approval(&approval) {
                    Ok(a) => a.map(Box::new),
                    Err(e) => {
                        tracing::warn!(approval = %approval, "cannot read the approval: {e}");
                        None
                    }
                };
                batch.inputs.push_back(Input::Resolve {
                    req,
                    approval,
                    session,
                    decision,
                    by,
                    stored,
                });
            }
            Command::TaskRequest { mut input, reply } => {
                let req = self.next_req;
                self.next_req += 1;
                match &mut input {
                    TaskInput::Launch { req: r, .. } | TaskInput::Cancel { req: r, .. } => *r = req,
                    _ => {}
                }
                self.task_pending.insert(req, reply);
                batch.task_inputs.push_back(input);
            }
            Command::TaskEvent(input) => batch.task_inputs.push_back(input),
            Command::Call(f) => batch.calls.push(f),
            Command::Unrecognized { id, run, line } => {
                tracing::debug!(session = %id, run, "unrecognised provider line: {}", line.chars().take(200).collect::<String>());
                batch.unrecognized.push(UnrecognizedLine {
                    session_id: id.0,
                    run,
                    at_ms: now_ms() as i64,
                    line,
                });
            }
        }
    }

    /// Feeds every queued task input to the task machine.
    fn run_task_inputs(&mut self, batch: &mut Batch) {
        while let Some(input) = batch.task_inputs.pop_front() {
            if let TaskInput::Exited { id, .. } = &input {
                self.task_runs.remove(id);
            }
            let effects = self.tasks.handle(now_ms(), input);
            self.execute_tasks(effects, batch);
        }
    }

    /// The task effect executor: one match.
    fn execute_tasks(&mut self, effects: Vec<TaskEffect>, batch: &mut Batch) {
        {
            for effect in effects {
                match effect {
                    TaskEffect::Persist(r) => batch.task_rows.push(TaskRow::Task(Box::new(r))),
                    TaskEffect::PersistOutput(o) => batch.task_rows.push(TaskRow::Output(o)),
                    TaskEffect::Spawn { id, spec } => {
                        if let Some(link) = &self.runner {
                            // Started / SpawnFailed come back from the runner as task inputs.
                            link.spawn_task(&id, &spec, self.tx.clone());
                            self.task_runs.insert(id, 0);
                            continue;
                        }
                        let event = match supervisor::spawn_task(&id, &spec, self.tx.clone()) {
                            Ok(pid) => {
                                self.task_runs.insert(id.clone(), pid);
                                TaskInput::Started { id, pid }
                            }
                            Err(reason) => TaskInput::SpawnFailed { id, reason },
                        };
                        batch.task_inputs.push_back(event);
                    }
                    TaskEffect::Signal { id, pid, kill } => {
                        if self.task_runs.contains_key(&id) {
                            match &self.runner {
                                Some(link) => link.signal_task(&id, kill),
                                None => supervisor::signal_group(pid, kill),
                            }
                        }
                    }
                    e @ (TaskEffect::EmitStatus(_)
                    | TaskEffect::EmitOutput(_)
                    | TaskEffect::Reply { .. }) => batch.task_deliver.push(e),
                }
            }
        }
    }

    /// Feeds every queued input to the core, executing effects as they come.
    fn run_inputs(&mut self, batch: &mut Batch) {
        while let Some(input) = batch.inputs.pop_front() {
            let exited = match &input {
                Input::Provider {
                    id,
                    run,
                    event: ProviderEvent::Exited { .. },
                    ..
                } => Some((id.clone(), *run)),
                _ => None,
            };
            let effects = self.engine.handle(now_ms(), input);
            if let Some(key) = exited {
                self.runs.remove(&key);
            }
            self.execute(effects, batch);
        }
    }

    /// The effect executor: one match.
    fn execute(&mut self, effects: Vec<Effect>, batch: &mut Batch) {
        for effect in effects {
            match effect {
                Effect::Persist(record) => {
                    if let Record::Delete(id) = &record {
                        self.unrecognized.remove(&id.0);
                    }
                    batch.records.push(record)
                }
                Effect::Spawn { id, run, spec } => {
                    let event = match (crate::providers::plan(&spec, &self.exe), &self.runner) {
                        (Ok((plan, parser)), Some(link)) => {
                            // Started / SpawnFailed come back from the runner as inputs.
                            let handle =
                                link.spawn_agent(&plan, id.clone(), run, parser, self.tx.clone());
                            self.runs.insert((id, run), handle);
                            continue;
                        }
                        (Ok((plan, parser)), None) => {
                            match supervisor::spawn(&plan, id.clone(), run, parser, self.tx.clone())
                            {
                                Ok(handle) => {
                                    let pid = handle.pid;
                                    self.runs.insert((id.clone(), run), handle);
                                    ProviderEvent::Started { pid: Some(pid) }
                                }
                                Err(reason) => ProviderEvent::SpawnFailed { reason },
                            }
                        }
                        (Err(reason), _) => ProviderEvent::SpawnFailed { reason },
                    };
                    batch.inputs.push_back(Input::Provider {
                        id,
                        run,
                        cursor: None,
                        event,
                    });
                }
                Effect::Write { id, run, text } => {
                    if let Some(h) = self.runs.get(&(id.clone(), run)) {
                        if !h.write_line(crate::providers::user_message_line(&text)) {
                            tracing::warn!(session = %id, run, "could not deliver a message to the provider");
                        }
                    }
                }
                Effect::Signal {
                    id, run, signal, ..
                } => {
                    if let Some(h) = self.runs.get(&(id, run)) {
                        h.signal(signal);
                    }
                }
                // An answer nothing stores (the policy's) goes to the agent at once: a crash
                // before the commit replays the ask, one after it must not lose the answer.
                Effect::Answer {
                    id,
                    run,
                    approval,
                    at_once: true,
                } => self.answer(&id, run, &approval),
                // A stored resolution's answer goes only once it is committed: a crash in
                // between loses nothing (the adopted agent is sent it again).
                e @ (Effect::Answer { at_once: false, .. }
                | Effect::EmitStatus(_)
                | Effect::EmitActivity(_)
                | Effect::EmitApproval(_)
                | Effect::Reply { .. }
                | Effect::ReplyApproval { .. }) => batch.deliver.push(e),
            }
        }
    }

    /// Writes a request's answer on the stdin of the run that asked.
    fn answer(&self, id: &SessionId, run: RunId, approval: &Approval) {
        if let Some(h) = self.runs.get(&(id.clone(), run)) {
            if !h.write_line(crate::providers::answer_line(approval)) {
                tracing::warn!(session = %id, run, approval = %approval.id, "could not deliver an answer to the provider");
            }
        }
    }

    /// Commits the batch, then delivers what it acknowledged.
    fn commit(&mut self, batch: &mut Batch) {
        if !batch.records.is_empty()
            || !batch.task_rows.is_empty()
            || !batch.unrecognized.is_empty()
        {
            let mut attempt = 0;
            loop {
                match self
                    .store
                    .apply_all(&batch.records, &batch.task_rows, &batch.unrecognized)
                {
                    Ok(()) => break,
                    Err(e) if attempt < 3 => {
                        attempt += 1;
                        tracing::warn!("store commit failed (attempt {attempt}): {e}");
                        std::thread::sleep(Duration::from_millis(50 * attempt));
                    }
                    Err(e) => {
                        // Nothing of this batch may be acknowledged. Crash-only: exit, and the
                        // next start reconciles from what the store has.
                        tracing::error!("store commit failed, exiting: {e}");
                        std::process::exit(70);
                    }
                }
            }
            batch.records.clear();
            batch.task_rows.clear();
            for l in batch.unrecognized.drain(..) {
                *self.unrecognized.entry(l.session_id).or_default() += 1;
            }
        }
        for effect in batch.task_deliver.drain(..) {
            match effect {
                TaskEffect::EmitStatus(ev) => {
                    let _ = self.hub.task_status.send(ev);
                }
                TaskEffect::EmitOutput(o) => {
                    let _ = self.hub.task_output.send(o);
                }
                TaskEffect::Reply { req, result } => {
                    if let Some(tx) = self.task_pending.remove(&req) {
                        let _ = tx.send(result);
                    }
                }
                _ => {}
            }
        }
        for effect in batch.deliver.drain(..) {
            match effect {
                Effect::EmitStatus(ev) => {
                    let _ = self.hub.status.send(ev);
                }
                Effect::EmitActivity(ev) => {
                    if let Some(turn) = ev.turn {
                        let key = (ev.session.clone(), turn);
                        if let Some(stream) = self.turn_streams.get(&key) {
                            match stream.try_send(Ok(ev.clone())) {
                                Ok(()) if !ev.ends_turn => {}
                                Err(mpsc::error::TrySendError::Full(_)) => {
                                    // The client fell behind: the rest of its turn comes
                                    // from the store, at the client's pace.
                                    if let Some(stream) = self.turn_streams.remove(&key) {
                                        self.catch_up(stream, key.0.clone(), turn, ev.seq - 1);
                                    }
                                }
                                _ => {
                                    self.turn_streams.remove(&key);
                                }
                            }
                        }
                    }
                    let _ = self.hub.activity.send(ev);
                }
                Effect::Answer {
                    id, run, approval, ..
                } => self.answer(&id, run, &approval),
                Effect::EmitApproval(a) => {
                    let _ = self.hub.approval.send(a);
                }
                Effect::ReplyApproval { req, result } => {
                    if let Some(tx) = self.approval_pending.remove(&req) {
                        let _ = tx.send(result);
                    }
                }
                Effect::Reply { req, result } => {
                    if let Some(p) = self.pending.remove(&req) {
                        if let (Ok(record), Some(stream)) = (&result, p.turn) {
                            self.turn_streams
                                .insert((record.id.clone(), record.turns), stream);
                        }
                        let _ = p.reply.send(result);
                    }
                }
                _ => {}
            }
        }
    }
}

impl State {
    /// Feeds a turn's stream from the store, from activity `after_seq` on, until the turn's
    /// last activity (or the client goes): a client slower than its agent still gets every
    /// activity of its turn, in order, ending with the one that ends it. The loop never waits
    /// for a client; the store is the buffer.
    fn catch_up(&self, stream: TurnStream, session: SessionId, turn: u64, after_seq: u64) {
        const PAGE: usize = 256;
        let tx = self.tx.clone();
        tokio::spawn(async move {
            let mut after = after_seq;
            loop {
                let (rtx, rrx) = oneshot::channel();
                let sid = session.0.clone();
                let read = Box::new(move |s: &mut State| {
                    let _ = rtx.send(s.store.activities(&sid, after, PAGE));
                });
                if tx.send(Command::Call(read)).await.is_err() {
                    return; // the loop is gone
                }
                let Ok(Ok(page)) = rrx.await else {
                    return;
                };
                let full = page.len() == PAGE;
                for ev in page {
                    after = ev.seq;
                    if ev.turn != Some(turn) {
                        continue;
                    }
                    let ends = ev.ends_turn;
                    if stream.send(Ok(ev)).await.is_err() || ends {
                        return;
                    }
                }
                if !full {
                    if stream.is_closed() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        });
    }
}

/// Runs the loop until a shutdown has stopped every session.
pub async fn run(
    mut state: State,
    mut rx: mpsc::Receiver<Command>,
    restore: Vec<Effect>,
    task_restore: Vec<TaskEffect>,
) {
    let mut batch = Batch::default();
    state.execute(restore, &mut batch);
    state.execute_tasks(task_restore, &mut batch);
    state.commit(&mut batch);
    loop {
        let deadline = [
            state.engine.poll_timeout().map(|(at, _, _)| at),
            state.tasks.poll_timeout().map(|(at, _, _)| at),
        ]
        .into_iter()
        .flatten()
        .min();
        let first = tokio::select! {
            biased;
            cmd = rx.recv() => match cmd {
                Some(c) => Some(c),
                None => break,
            },
            _ = sleep_until(deadline) => None,
        };
        if let Some(c) = first {
            state.command(c, &mut batch);
        }
        for _ in 0..MAX_BATCH {
            match rx.try_recv() {
                Ok(c) => state.command(c, &mut batch),
                Err(_) => break,
            }
        }
        batch.inputs.push_back(Input::Tick);
        batch.task_inputs.push_back(TaskInput::Tick);
        state.run_inputs(&mut batch);
        state.run_task_inputs(&mut batch);
        state.commit(&mut batch);
        for call in std::mem::take(&mut batch.calls) {
            call(&mut state);
            // A call may have queued requests (shutdown); they run next iteration.
        }
        if state.finished() {
            break;
        }
    }
    // Refuse whatever is still queued.
    for (_, tx) in std::mem::take(&mut state.task_pending) {
        let _ = tx.send(Err(Error::new(
            ErrorCode::AdapterNotInitialized,
            "the daemon is shutting down",
        )));
    }
    for (_, p) in std::mem::take(&mut state.pending) {
        let _ = p.reply.send(Err(Error::new(
            ErrorCode::AdapterNotInitialized,
            "the daemon is shutting down",
        )));
    }
    let _ = state.done.send(true);
}

async fn sleep_until(deadline: Option<u64>) {
    match deadline {
        Some(at) => {
            let now = now_ms();
            tokio::time::sleep(Duration::from_millis(at.saturating_sub(now))).await
        }
        None => std::future::pending().await,
    }
}

/// The loop's handle, for the API layer.
#[derive(Clone)]
pub struct Handle {
    pub tx: mpsc::Sender<Command>,
    pub hub: Hub,
    /// Becomes `true` when the loop has finished: every long-lived stream ends then.
    pub done: watch::Receiver<bool>,
}

impl Handle {
    /// Resolves when the daemon is done (after a shutdown stopped every session): streams
    /// select on it so that no open stream keeps the daemon alive.
    pub async fn closed(&self) {
        let mut done = self.done.clone();
        let _ = done.wait_for(|d| *d).await;
    }

    /// Sends a session request and waits for the core's answer.
    pub async fn request(
        &self,
        request: Request,
        turn: Option<TurnStream>,
    ) -> Result<SessionRecord, Error> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Request {
                request,
                reply,
                turn,
            })
            .await
            .map_err(|_| unavailable())?;
        rx.await.map_err(|_| unavailable())?
    }

    /// CreateSession, for every protocol: the configuration checked (OBEY-2002/3/4), refused
    /// while the daemon shuts down (OBEY-2030), then the core's answer.
    pub async fn create_session(
        &self,
        id: SessionId,
        config: paddock_core::SessionConfig,
    ) -> Result<SessionRecord, Error> {
        crate::providers::validate(&config)?;
        if self.call(|s| s.shutting_down).await? {
            return Err(Error::new(
                ErrorCode::AdapterNotInitialized,
                "the daemon is shutting down",
            ));
        }
        let config = Box::new(config);
        self.request(Request::Create { id, config }, None).await
    }

    /// Resolves a request for a human (from client `by`) and waits for the core's answer.
    pub async fn resolve(
        &self,
        approval: ApprovalId,
        session: Option<SessionId>,
        decision: Decision,
        by: &str,
    ) -> Result<Approval, Error> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Resolve {
                approval,
                session,
                decision,
                by: by.to_string(),
                reply,
            })
            .await
            .map_err(|_| unavailable())?;
        rx.await.map_err(|_| unavailable())?
    }

    /// The open requests of one session (or all), oldest first, as the engine has them.
    pub async fn pending_approvals(
        &self,
        session: Option<SessionId>,
    ) -> Result<Vec<Approval>, Error> {
        self.call(move |s| {
            s.engine
                .pending_approvals()
                .filter(|a| session.as_ref().is_none_or(|id| &a.session == id))
                .cloned()
                .collect()
        })
        .await
    }

    /// Sends a task request (launch, cancel) and waits for the task machine's answer.
    pub async fn task(&self, input: TaskInput) -> Result<TaskReply, Error> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::TaskRequest { input, reply })
            .await
            .map_err(|_| unavailable())?;
        rx.await.map_err(|_| unavailable())?
    }

    /// Runs `f` on the loop's state (after the current batch committed) and returns its result.
    pub async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut State) -> T + Send + 'static,
    ) -> Result<T, Error> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Call(Box::new(move |s| {
                let _ = tx.send(f(s));
            })))
            .await
            .map_err(|_| unavailable())?;
        rx.await.map_err(|_| unavailable())
    }
}

fn unavailable() -> Error {
    Error::new(
        ErrorCode::AdapterNotInitialized,
        "the daemon's session engine is not running (shutting down?)",
    )
}
