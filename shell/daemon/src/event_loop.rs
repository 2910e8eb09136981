//! The event loop: the one task that owns the engine, the store and the children.
//!
//! Each iteration waits for a command or the engine's next deadline, drains what else is
//! queued (up to [`MAX_BATCH`]) and hands the inputs to the executor (`paddock_exec`), which
//! feeds them to the core — one engine, one `Input` enum — and carries out the effects through
//! this loop's ports ([`Io`]): processes at once, the batch's records in one transaction, and
//! only then status events, activities and replies (one map of who waits for which request). A
//! client never sees what a crash could still lose, and a fast agent costs one commit per
//! batch, not one per event. The simulator runs the same executor with fake ports.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

use paddock_core::campaign::{Campaign, CampaignError};
use paddock_core::container::{ContainerRecord, ContainerWork};
use paddock_core::task::{TaskInput, TaskReply, TaskSpec};
use paddock_core::{
    Approval, Effect, Engine, Error, Input, Now, ProviderEvent, Record, RequestId, RunId,
    SessionConfig, SessionId, SessionRecord, Signal, SpawnSpec,
};
pub use paddock_exec::MAX_BATCH;
use paddock_exec::{Executor, Line, Ports};
use tokio::sync::{mpsc, watch};

use super::fanout::Heard;
use super::port::{
    shutting_down, CaughtUp, DaemonView, HistoryView, Query, Reply, SessionView, TurnStream,
};
pub use super::port::{Command, Hub, Request};
use super::supervisor::{self, RunHandle};
use crate::paths::{now_ms, Clock};
use crate::store::{Row, Store, StoreError, UnrecognizedLine};

pub use super::port::COMMAND_QUEUE;

/// Who waits for the core's answer to a request: one map, keyed by the request id the loop
/// gave it, answered by the `Reply*` effects once their batch committed.
enum Waiting {
    /// A session request; `turn` receives the activities of the turn a Send starts.
    Session {
        reply: Reply<Result<SessionRecord, Error>>,
        turn: Option<TurnStream>,
    },
    Approval(Reply<Result<Approval, Error>>),
    Task(Reply<Result<TaskReply, Error>>),
    Container(Reply<Result<paddock_core::container::ContainerRecord, Error>>),
    AddCampaign(Reply<Result<(Campaign, bool), CampaignError>>),
    RemoveCampaign(Reply<Result<bool, CampaignError>>),
    Shutdown(Reply<usize>),
}

impl Waiting {
    /// The loop is done: whoever still waits is told the daemon is shutting down.
    fn refuse(self) {
        self.fail(shutting_down())
    }

    /// The request is answered with `e` before the core saw it.
    fn fail(self, e: Error) {
        // A refusal nobody waits for any more is dropped.
        match self {
            Waiting::Session { reply, .. } => drop(reply.send(Err(e))),
            Waiting::Approval(reply) => drop(reply.send(Err(e))),
            Waiting::Task(reply) => drop(reply.send(Err(e))),
            Waiting::Container(reply) => drop(reply.send(Err(e))),
            // Dropped unanswered: the caller sees the loop gone (`port::unavailable`).
            Waiting::AddCampaign(_) | Waiting::RemoveCampaign(_) | Waiting::Shutdown(_) => {}
        }
    }
}

/// The answer to a command the shell itself carries out (a row only the shell writes),
/// given once its batch has committed.
enum Ack {
    Count(Reply<usize>, usize),
    /// Answered with the id the store gave the batch's next reported event.
    Event(Reply<i64>),
}

/// The loop's state: the executor (the engine and its batch) and the ports it runs on.
pub struct State {
    exec: Executor,
    pub(super) io: Io,
    /// The batch's reads, answered once it is committed.
    queries: Vec<Query>,
    started_at: u64,
    socket: PathBuf,
    data_dir: PathBuf,
    next_req: RequestId,
    /// Told `true` when the loop has finished (after a shutdown).
    done: watch::Sender<bool>,
}

/// The daemon's ports: what the executor's effects become (processes, the store, deliveries
/// to clients), and the rows and acknowledgements only the shell adds to a batch.
pub struct Io {
    store: Store,
    hub: Hub,
    /// The core's clocks: monotonic since the daemon started (deadlines), and the wall clock.
    clock: Clock,
    /// The runner agents run in (`None`: they are the daemon's own children).
    pub(super) runner: Option<super::runner_link::RunnerLink>,
    /// Where sessions' environments are made and what a sandbox hides.
    pub(super) env: crate::env::Host,
    /// Per Aria container, its driver's latest work: each next one waits for it, so that a
    /// container's make, stops, starts and destroy happen in the order the core decided them.
    container_work: BTreeMap<String, tokio::task::JoinHandle<()>>,
    exe: PathBuf,
    tx: mpsc::Sender<Command>,
    runs: BTreeMap<(SessionId, RunId), RunHandle>,
    task_runs: BTreeMap<String, u32>,
    /// Who waits for which request's answer.
    pending: BTreeMap<RequestId, Waiting>,
    turn_streams: BTreeMap<(SessionId, u64), TurnStream>,
    /// Unrecognized provider lines per session, as committed, of the sessions the engine
    /// holds (those with none are absent): loaded with them at start and when one is
    /// recalled, let go with them (`State::evict_settled`). A listing of settled sessions
    /// reads each one's count with its row.
    pub(super) unrecognized: BTreeMap<String, u64>,
    /// Rows only the shell writes (reported events, unrecognized lines), stored with the
    /// batch's records, and who waits for them.
    rows: Vec<Row>,
    acks: Vec<Ack>,
}

impl State {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        engine: Engine,
        store: Store,
        hub: Hub,
        socket: PathBuf,
        data_dir: PathBuf,
        exe: PathBuf,
        tx: mpsc::Sender<Command>,
        done: watch::Sender<bool>,
        clock: Clock,
    ) -> Self {
        let env = crate::env::Host::new(&data_dir, &[&socket], &exe);
        State {
            exec: Executor::new(engine),
            io: Io {
                env,
                container_work: BTreeMap::new(),
                store,
                hub,
                clock,
                runner: None,
                exe,
                tx,
                runs: BTreeMap::new(),
                task_runs: BTreeMap::new(),
                pending: BTreeMap::new(),
                turn_streams: BTreeMap::new(),
                unrecognized: BTreeMap::new(),
                rows: Vec::new(),
                acks: Vec::new(),
            },
            queries: Vec::new(),
            started_at: now_ms(),
            socket,
            data_dir,
            next_req: 1,
            done,
        }
    }

    /// Whether the engine knows Aria container `id`.
    pub fn has_container(&self, id: &str) -> bool {
        self.exec.engine().containers().get(id).is_some()
    }

    /// Whether Aria container `id` should be running.
    pub fn container_runs(&self, id: &str) -> bool {
        self.exec
            .engine()
            .containers()
            .get(id)
            .is_some_and(|c| c.state == paddock_core::container::ContainerState::Running)
    }

    /// Whether session `id` exists: the engine holds it or the store does (a settled session
    /// is not recalled for this). A failed read says yes: nothing is removed on a doubt.
    pub fn has_session(&self, id: &SessionId) -> bool {
        self.exec.engine().session(id).is_some() || self.io.store.has_session(&id.0).unwrap_or(true)
    }

    /// [`Executor::recall`] for a read or a report that cannot be refused: a failed read is
    /// logged, and the engine answers as for a session it does not have.
    /// The engine lets go of what settled (after a commit and its reads), and the loop of
    /// what it holds beside each one.
    fn evict_settled(&mut self) {
        for id in self.exec.evict_settled() {
            self.io.unrecognized.remove(&id.0);
        }
    }

    fn recall_or_log(&mut self, id: &SessionId) {
        if let Err(e) = self.exec.recall(id, &mut self.io) {
            tracing::error!(session = %id, "cannot read the session from the store: {e}");
        }
    }

    /// Queues an input that comes from the world (a process, an environment, a report of a
    /// session the engine holds): none needs a read, so none can fail.
    fn queue(&mut self, input: Input) {
        if let Err(e) = self.exec.push(input, &mut self.io) {
            tracing::error!("cannot read a session from the store: {e}");
        }
    }

    /// Takes back the agent runs the engine adopted at start-up (they outlived the previous
    /// daemon in the runner): their output is read again from where each session got to.
    pub fn reattach_adopted(&mut self) {
        let Some(link) = self.io.runner.clone() else {
            return;
        };
        let adopted: Vec<(SessionId, RunId, u64, paddock_core::SessionRecord)> = self
            .exec
            .engine()
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
                config: SessionConfig::clone(&record.config),
                resume: record.provider_session.clone(),
                restart_count: record.restart_count,
            };
            let mut parser = match crate::providers::plan(&spec, &self.io.exe) {
                Ok((_, parser)) => parser,
                Err(e) => {
                    tracing::warn!(session = %id, "cannot read the adopted run: {e}");
                    continue;
                }
            };
            if record.turn_open {
                // The turn goes on: what it already counted must not be counted again.
                match self.io.store.turn_tokens(&id.0, record.turns) {
                    Ok(tokens) => parser.resume_turn(tokens),
                    Err(e) => tracing::warn!(session = %id, "cannot read the turn's tokens: {e}"),
                }
            }
            tracing::info!(session = %id, run, cursor, at = ?super::runner_link::position(cursor), "reattached to a run that outlived the daemon");
            let handle = link.attach_agent(id.clone(), run, cursor, parser, self.io.tx.clone());
            self.io.runs.insert((id, run), handle);
        }
    }

    fn finished(&self) -> bool {
        self.exec.engine().is_shutting_down()
            && self.exec.engine().live_sessions() == 0
            && self.io.runs.is_empty()
            && self.io.task_runs.is_empty()
    }

    /// Queues a request for the core under a fresh request id; `waiting` gets its answer. The
    /// settled session it names is recalled first; a failed read refuses it.
    fn request(&mut self, waiting: Waiting, input: impl FnOnce(RequestId) -> Input) {
        let req = self.next_req;
        self.next_req += 1;
        match self.exec.push(input(req), &mut self.io) {
            Ok(()) => {
                self.io.pending.insert(req, waiting);
            }
            Err(e) => waiting.fail(read_failed("the session", e)),
        }
    }

    /// The one `match` on the port's commands.
    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Provider(input) => self.queue(input),
            Command::ProviderLines(inputs, room) => {
                drop(room);
                for input in inputs {
                    self.queue(input)
                }
            }
            Command::Environment { id, event } => {
                if !self.has_session(&id) {
                    // Made after its session was deleted (a delete during the making): what
                    // was made goes too.
                    let remove = crate::env::destroy(&self.io.env, &id, None);
                    tokio::task::spawn_blocking(remove);
                    return;
                }
                self.queue(Input::Environment { id, event })
            }
            Command::Request {
                request,
                reply,
                turn,
            } => {
                let input = |req| match request {
                    Request::Create { id, config } => Input::Create { req, id, config },
                    Request::Send { id, text } => Input::Send { req, id, text },
                    Request::Stop { id, graceful } => Input::Stop { req, id, graceful },
                    Request::Close { id } => Input::Close { req, id },
                    Request::Attach {
                        project,
                        context,
                        id,
                        config,
                    } => Input::Attach {
                        req,
                        project,
                        context,
                        id,
                        config,
                    },
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
                self.request(Waiting::Session { reply, turn }, input);
            }
            Command::Resolve {
                approval,
                session,
                decision,
                by,
                reply,
            } => {
                // What the store holds, for a request older than the engine remembers.
                let stored = match self.io.store.approval(&approval) {
                    Ok(a) => a.map(Box::new),
                    Err(e) => {
                        let _ = reply.send(Err(read_failed("the approval", e)));
                        return;
                    }
                };

                let input = |req| Input::Resolve {
                    req,
                    approval,
                    session,
                    decision,
                    by,
                    stored,
                };
                self.request(Waiting::Approval(reply), input);
            }
            Command::TaskRequest { mut input, reply } => {
                let input = |req| {
                    match &mut input {
                        TaskInput::Launch { req: r, .. } | TaskInput::Cancel { req: r, .. } => {
                            *r = req
                        }
                        _ => {}
                    }
                    Input::Task(input)
                };
                self.request(Waiting::Task(reply), input);
            }
            Command::TaskEvent(input) => self.queue(Input::Task(input)),
            Command::Unrecognized { id, run, line } => {
                tracing::debug!(session = %id, run, "unrecognised provider line: {}", line.chars().take(200).collect::<String>());
                self.io.rows.push(Row::Unrecognized(UnrecognizedLine {
                    session_id: id.0,
                    run,
                    at_ms: now_ms() as i64,
                    line,
                }));
            }
            // In the batch's order with everything else: what was queued before the shutdown
            // (a session created earlier in this batch) is counted and stopped too.
            Command::Shutdown { graceful, reply } => {
                let input = |req| Input::Shutdown { req, graceful };
                self.request(Waiting::Shutdown(reply), input);
            }
            Command::AddCampaign {
                id,
                root,
                how,
                reply,
            } => {
                let input = |req| Input::AddCampaign { req, id, root, how };
                self.request(Waiting::AddCampaign(reply), input);
            }
            Command::RemoveCampaign { key, reply } => {
                let input = |req| Input::RemoveCampaign { req, key };
                self.request(Waiting::RemoveCampaign(reply), input);
            }
            Command::ContainerRequest { id, request, reply } => {
                let input = |req| Input::Container { req, id, request };
                self.request(Waiting::Container(reply), input);
            }
            Command::ContainerReport { id, event } => {
                self.queue(Input::ContainerReport { id, event })
            }
            Command::Report { event, reply } => {
                self.io.rows.push(Row::Event(event));
                self.io.acks.push(Ack::Event(reply));
            }
            Command::External { rows, reply } => {
                // A report for a session the engine has is that session's activity (numbered,
                // stored and shown with its own); one for another id is kept apart, as
                // received (the seed lets agents report for sessions obey did not start).
                let n = rows.len();
                let named: std::collections::BTreeSet<&str> =
                    rows.iter().map(|r| r.session_id.as_str()).collect();
                for id in named {
                    self.recall_or_log(&SessionId(id.to_string()));
                }
                let (known, apart): (Vec<_>, Vec<_>) = rows.into_iter().partition(|r| {
                    self.exec
                        .engine()
                        .session(&paddock_core::SessionId(r.session_id.clone()))
                        .is_some()
                });
                for r in known {
                    let Some(kind) = paddock_core::ActivityKind::from_number(r.kind) else {
                        continue; // checked by the API
                    };
                    let mut activity = paddock_core::Activity::new(kind, r.content)
                        .with_tokens(r.tokens_input.max(0) as u64, r.tokens_output.max(0) as u64);
                    if !r.tool_name.is_empty() || !r.tool_call_id.is_empty() {
                        activity = activity.with_tool(r.tool_name, r.tool_call_id);
                    }
                    activity.tool_success = r.tool_success;
                    self.queue(Input::Report {
                        id: paddock_core::SessionId(r.session_id),
                        activity,
                    });
                }
                if !apart.is_empty() {
                    self.io.rows.push(Row::External(apart));
                }
                self.io.acks.push(Ack::Count(reply, n));
            }
            Command::CatchUp {
                session,
                turn,
                after,
                stream,
                reply,
            } => {
                let _ = reply.send(self.catch_up_read(session, turn, after, stream));
            }
            Command::Query(q) => {
                match &q {
                    Query::Session(id, _) | Query::History { session: id, .. } => {
                        let id = id.clone();
                        self.recall_or_log(&id);
                    }
                    _ => {}
                }
                self.queries.push(q)
            }
        }
    }

    /// One step of a behind turn's catch-up ([`Command::CatchUp`]): what is stored after
    /// activity `after` goes into the stream, as much as it has room for; when that was all and
    /// the turn goes on, the stream is live again.
    ///
    /// Every batch before this command is committed and delivered, so the store holds every
    /// activity the session has made, and what it makes from here is delivered live, after
    /// what was read. The read and the switch are one step of the loop's: a reader that read
    /// through the loop's queries and then asked to go live found a flood's next batches
    /// committed meanwhile (500–5,000 activities in P2), and was fed from the store to its
    /// turn's end. The loop sends only what the stream has room for: it never waits for a
    /// client.
    fn catch_up_read(
        &mut self,
        session: SessionId,
        turn: u64,
        mut after: u64,
        stream: TurnStream,
    ) -> CaughtUp {
        let room = stream.capacity();
        let page = match self.io.store.activities(&session.0, after, room) {
            Ok(page) => page,
            Err(e) => {
                let _ = stream.try_send(Err(read_failed("the turn's activities", e)));
                return CaughtUp::Done;
            }
        };
        let more = page.len() == room;
        for ev in page {
            after = ev.seq;
            if ev.turn != Some(turn) {
                continue;
            }
            let ends = ev.ends_turn;
            // Room was counted (only this loop sends on the stream): only a client that went
            // refuses it.
            if stream.try_send(Ok(Arc::new(ev))).is_err() || ends {
                return CaughtUp::Done;
            }
        }
        let goes_on = self
            .exec
            .engine()
            .session(&session)
            .is_some_and(|s| s.record.turn_open && s.record.turns == turn);
        if more || !goes_on {
            return CaughtUp::Behind {
                stream,
                after,
                more,
            };
        }
        tracing::debug!(%session, turn, after, "a turn's stream is live again");
        self.io.turn_streams.insert((session, turn), stream);
        CaughtUp::Live
    }

    /// Answers a query from what is committed.
    fn answer_query(&self, q: Query) {
        let view = |s: &paddock_core::Session| self.view(s.record.clone(), s.pending().len());
        // A reply nobody waits for any more (the client went) is dropped.
        match q {
            Query::Daemon(reply) => {
                let _ = reply.send(self.io.store.session_count().map(|sessions| {
                    DaemonView {
                        started_at: self.started_at,
                        socket: self.socket.clone(),
                        data_dir: self.data_dir.clone(),
                        campaigns: self.exec.engine().campaigns().len(),
                        sessions: sessions as usize,
                        live: self
                            .exec
                            .engine()
                            .live()
                            .map(|s| s.record.clone())
                            .collect(),
                    }
                }));
            }
            Query::Session(id, reply) => {
                let _ = reply.send(self.exec.engine().session(&id).map(view));
            }
            Query::Sessions {
                scope,
                pick,
                limit,
                reply,
            } => {
                let _ = reply.send(self.sessions(&scope, &*pick, limit));
            }
            Query::Campaign(key, reply) => {
                let _ = reply.send(self.exec.engine().campaigns().get(&key).cloned());
            }
            Query::Campaigns(reply) => {
                let _ = reply.send(self.exec.engine().campaigns().all());
            }
            Query::Activities {
                session,
                after,
                limit,
                reply,
            } => {
                let _ = reply.send(self.io.store.activities(&session.0, after, limit));
            }
            Query::History {
                session,
                limit,
                reply,
            } => {
                let read = || {
                    let (activities, truncated) =
                        self.io.store.last_activities(&session.0, limit)?;
                    // A window that leaves older activities out shows no message of a turn
                    // before its first (`api::history::merge`): those are not read, so a
                    // long session's history costs its window, not every prompt it was sent.
                    let from = match truncated {
                        true => activities.iter().find_map(|a| a.turn).unwrap_or(0),
                        false => 0,
                    };
                    let messages = self.io.store.user_messages(&session.0, from)?;
                    Ok(HistoryView {
                        messages,
                        activities,
                        truncated,
                        record: self
                            .exec
                            .engine()
                            .session(&session)
                            .map(|s| s.record.clone()),
                    })
                };
                let _ = reply.send(read());
            }
            Query::TurnTokens {
                session,
                turn,
                reply,
            } => {
                let _ = reply.send(self.io.store.turn_tokens(&session.0, turn));
            }
            Query::Approvals {
                session,
                all,
                limit,
                reply,
            } => {
                let session = session.as_ref().map(|s| s.0.as_str());
                let _ = reply.send(self.io.store.approvals(session, all, limit));
            }
            Query::PendingApprovals(session, reply) => {
                let _ = reply.send(
                    self.exec
                        .engine()
                        .pending_approvals()
                        .filter(|a| session.as_ref().is_none_or(|id| &a.session == id))
                        .cloned()
                        .collect(),
                );
            }
            Query::Task(id, reply) => {
                // An ended task the engine let go is the store's (read after the commit, the
                // store has every task as the engine last had it).
                let task = match self.exec.engine().task(&id) {
                    Some(t) => Ok(Some(t.clone())),
                    None => self.io.store.task(&id),
                };
                let _ = reply.send(task);
            }
            Query::Tasks { of, limit, reply } => {
                // Newest first by creation (Aria's `task_…` and Execute's `exec_…` ids do not
                // sort together), ties by id: from the store, which after the commit has every
                // task as the engine has it, ended ones too.
                let _ = reply.send(self.io.store.newest_tasks(&of, limit));
            }
            Query::TaskOutput {
                task,
                after,
                limit,
                reply,
            } => {
                let _ = reply.send(self.io.store.task_output(&task, after, limit));
            }
            Query::Container(id, reply) => {
                let _ = reply.send(self.exec.engine().containers().get(&id).cloned());
            }
            Query::Containers { session, reply } => {
                let _ = reply.send(self.exec.engine().containers().list(session.as_ref()));
            }
        }
    }

    /// The first `limit` sessions `pick` keeps within `scope`, in id order. Live ones come
    /// from the engine; otherwise the store is read in pages (it has every session; settled
    /// ones only there) and the engine's copy stands in for a session it holds.
    fn sessions(
        &self,
        scope: &super::port::Scope,
        pick: &(dyn Fn(&SessionRecord) -> bool + Send),
        limit: usize,
    ) -> Result<Vec<SessionView>, StoreError> {
        /// Sessions read from the store at a time, at most.
        const PAGE: usize = 256;
        let view = |record, pending| self.view(record, pending);
        if scope.live_only {
            return Ok(self
                .exec
                .engine()
                .live()
                .rev()
                .filter(|s| pick(&s.record))
                .take(limit)
                .map(|s| view(s.record.clone(), s.pending().len()))
                .collect());
        }
        let mut out = Vec::new();
        let mut before = scope.before.clone();
        let mut first = true;
        while out.len() < limit {
            // The page itself first (a first page of one reads one row); after some rows were
            // filtered out, more at a time.
            let least = if first { 1 } else { 32 };
            first = false;
            let asked = (limit - out.len()).clamp(least, PAGE);
            let page = self.io.store.sessions_before(
                &before,
                scope.campaign.as_deref(),
                scope.working_dir.as_deref(),
                asked,
            )?;
            // A short page is the store's last: no query after it.
            let last_page = page.len() < asked;
            let Some(last) = page.last() else {
                break;
            };
            before = last.0.id.0.clone();
            for (stored, unrecognized) in page {
                match self.exec.engine().session(&stored.id) {
                    Some(s) if pick(&s.record) => {
                        out.push(view(s.record.clone(), s.pending().len()))
                    }
                    Some(_) => {}
                    // Settled: no open request.
                    None if pick(&stored) => out.push(SessionView {
                        record: stored,
                        unrecognized,
                        pending: 0,
                    }),
                    None => {}
                }
                if out.len() == limit {
                    break;
                }
            }
            if last_page {
                break;
            }
        }
        Ok(out)
    }

    /// What a client sees of one session: its record, its open requests and the lines of its
    /// agent that were not understood.
    fn view(&self, record: SessionRecord, pending: usize) -> SessionView {
        SessionView {
            unrecognized: self.io.unrecognized.get(&record.id.0).copied().unwrap_or(0),
            record: std::sync::Arc::new(record),
            pending,
        }
    }
}

/// Why a task cannot run where its session or container is.
#[derive(Debug, thiserror::Error)]
enum EnterError {
    #[error("container {0} is gone")]
    ContainerGone(String),
    /// Never on the host instead: a session that is gone has no environment to run in.
    #[error("session {0} is gone")]
    SessionGone(SessionId),
    #[error(transparent)]
    Env(#[from] crate::env::Error),
}

impl Io {
    /// `spec` as it runs in its session's environment (as it is, for a task of no session or
    /// of a session on the host without a worktree).
    fn in_session_env(&self, engine: &Engine, spec: TaskSpec) -> Result<TaskSpec, EnterError> {
        let Some((program, args)) = spec.command.split_first() else {
            return Ok(spec);
        };
        let plan = crate::proc::LaunchPlan {
            program: program.into(),
            args: args.to_vec(),
            // Named, so that a sandbox keeps them (the spawner sets their values).
            env: spec
                .environment
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            cwd: spec.working_dir.clone().into(),
        };
        let plan = if !spec.container_id.is_empty() {
            // The core launches a container's task only while the container runs.
            let c = engine
                .containers()
                .get(&spec.container_id)
                .ok_or_else(|| EnterError::ContainerGone(spec.container_id.clone()))?;
            crate::env::container::enter(&self.env, c, plan)?
        } else {
            if spec.session_id.is_empty() {
                return Ok(spec);
            }
            let id = SessionId(spec.session_id.clone());
            // Never on the host instead: a session that is gone has no environment to run in.
            let config = engine
                .session(&id)
                .map(|s| &s.record.config)
                .ok_or_else(|| EnterError::SessionGone(id.clone()))?;
            if !config.env.needs_provisioning() {
                return Ok(spec);
            }
            crate::env::enter(&self.env, &id, config, plan, crate::env::Role::Command)?
        };
        let mut command = vec![plan.program.to_string_lossy().to_string()];
        command.extend(plan.args);
        Ok(TaskSpec {
            command,
            working_dir: plan.cwd.to_string_lossy().to_string(),
            ..spec
        })
    }

    /// Runs `work` for container `record` once the container's previous work is done; its
    /// report (a make's, a start's) comes back as a command.
    fn container_work(
        &mut self,
        work: ContainerWork,
        record: Box<paddock_core::container::ContainerRecord>,
    ) {
        let (host, tx) = (self.env.clone(), self.tx.clone());
        let id = record.id.clone();
        let before = self.container_work.remove(&id);
        let last = matches!(work, ContainerWork::Destroy);
        let handle = tokio::spawn(async move {
            if let Some(before) = before {
                let _ = before.await;
            }
            let id = record.id.clone();
            let event = tokio::task::spawn_blocking(move || {
                crate::env::container::work(&host, &record, &work)
            })
            .await
            .ok()
            .flatten();
            if let Some(event) = event {
                let _ = tx.send(Command::ContainerReport { id, event }).await;
            }
        });
        // After a destroy nothing more comes for this container.
        if !last {
            self.container_work.insert(id, handle);
        }
    }

    /// Who waits for request `req` (taken: a request is answered once). A reply nobody waits
    /// for any more (the client went, or it is the core's own, `NO_REPLY`) is dropped.
    fn waiting(&mut self, req: RequestId) -> Option<Waiting> {
        let w = self.pending.remove(&req);
        debug_assert!(
            w.is_some() || req == paddock_core::NO_REPLY,
            "request {req} answered twice, or never asked"
        );
        w
    }

    /// Feeds a turn's stream from the store, from activity `after_seq` on, until the turn's
    /// last activity (or the client goes): a client slower than its agent still gets every
    /// activity of its turn, in order, ending with the one that ends it. The loop never waits
    /// for a client; the store is the buffer. A task waits for the stream to have room for a
    /// page, then asks the loop for what is stored ([`State::catch_up_read`]), which makes the
    /// stream live again once the client has read all of it: a client that fell behind for a
    /// moment (a burst; its process not scheduled) is not fed from the store for the rest of
    /// its turn.
    fn catch_up(&self, mut stream: TurnStream, session: SessionId, turn: u64, after_seq: u64) {
        /// The room the stream must have before the loop reads for it.
        const PAGE: usize = 256;
        tracing::debug!(%session, turn, after_seq, "a turn's client fell behind: fed from the store");
        let tx = self.tx.clone();
        // Woken by the session's committed activities (subscribed before the first read, so
        // none falls in between): a turn that cannot go live yet waits for the next one.
        let mut committed = self.hub.activity.subscribe(&session);
        tokio::spawn(async move {
            let mut after = after_seq;
            loop {
                // Room for a page (or the client went); a stream smaller than a page, all of it.
                match stream.reserve_many(PAGE.min(stream.max_capacity())).await {
                    Ok(room) => drop(room),
                    Err(_) => return,
                }
                let (reply, back) = tokio::sync::oneshot::channel();
                let step = Command::CatchUp {
                    session: session.clone(),
                    turn,
                    after,
                    stream,
                    reply,
                };
                if tx.send(step).await.is_err() {
                    return; // the loop is gone
                }
                let more;
                (stream, after, more) = match back.await {
                    Ok(CaughtUp::Behind {
                        stream,
                        after,
                        more,
                    }) => (stream, after, more),
                    // Live again, over, or the loop is gone.
                    Ok(CaughtUp::Live | CaughtUp::Done) | Err(_) => return,
                };
                if !more {
                    tokio::select! {
                        biased;
                        _ = stream.closed() => return,
                        // Fell behind the hub too: the store has it all, read on.
                        woke = committed.hear() => {
                            if let Heard::Over = woke {
                                return;
                            }
                        }
                    }
                }
            }
        });
    }
}

impl Ports for Io {
    type Error = StoreError;

    fn now(&self) -> Now {
        self.clock.now()
    }

    fn spawn(&mut self, id: &SessionId, run: RunId, spec: SpawnSpec) -> Option<ProviderEvent> {
        // The core is told the text of a failure (SpawnFailed's reason).
        let planned = crate::providers::plan(&spec, &self.exe)
            .map_err(|e| e.to_string())
            .and_then(|(plan, parser)| {
                let role = crate::env::Role::Agent;
                let plan = crate::env::enter(&self.env, id, &spec.config, plan, role)
                    .map_err(|e| e.to_string())?;
                Ok((plan, parser))
            });
        let (plan, parser) = match planned {
            Ok(planned) => planned,
            Err(reason) => return Some(ProviderEvent::SpawnFailed { reason }),
        };
        let ready = crate::providers::ready_request(spec.config.provider);
        if let Some(link) = &self.runner {
            // Started / SpawnFailed come back from the runner as inputs.
            let handle = link.spawn_agent(&plan, id.clone(), run, parser, self.tx.clone());
            self.runs
                .insert((id.clone(), run), handle.asking_ready_with(ready));
            return None;
        }
        Some(
            match supervisor::spawn(&plan, id.clone(), run, parser, self.tx.clone()) {
                Ok(handle) => {
                    let pid = handle.pid;
                    self.runs
                        .insert((id.clone(), run), handle.asking_ready_with(ready));
                    ProviderEvent::Started { pid: Some(pid) }
                }
                Err(e) => ProviderEvent::SpawnFailed {
                    reason: e.to_string(),
                },
            },
        )
    }

    fn write(&mut self, id: &SessionId, run: RunId, line: Line<'_>) -> bool {
        let Some(h) = self.runs.get(&(id.clone(), run)) else {
            return true; // exited: nothing to write to
        };
        h.write_line(match line {
            Line::Message(text) => crate::providers::user_message_line(text),
            Line::Ready => h.ready_request().to_string(),
            Line::Answer(approval) => crate::providers::answer_line(approval),
        })
    }

    fn close_input(&mut self, id: &SessionId, run: RunId) {
        if let Some(h) = self.runs.get(&(id.clone(), run)) {
            h.close_input();
        }
    }

    fn signal(&mut self, id: &SessionId, run: RunId, _pid: Option<u32>, signal: Signal) {
        match (self.runs.get(&(id.clone(), run)), &self.runner) {
            (Some(h), _) => h.signal(signal),
            // A run of the runner no record named at start-up: killed by its run id.
            (None, Some(link)) => link.signal_agent(id, run, signal),
            // A child of ours that exited: nothing to signal (its pid may be another's now).
            (None, None) => {}
        }
    }

    // Made on a blocking thread (git, file copies): the loop goes on, and the report comes back
    // as a command. A report the loop can no longer take (it ended) is moot: the next daemon
    // fails the CREATED session.
    fn provision(&mut self, id: SessionId, config: SessionConfig) {
        let (host, tx) = (self.env.clone(), self.tx.clone());
        tokio::task::spawn_blocking(move || {
            let event = match crate::env::provision(&host, &id, &config) {
                Ok(_) => paddock_core::EnvEvent::Provisioned,
                Err(e) => paddock_core::EnvEvent::ProvisionFailed {
                    reason: e.to_string(),
                },
            };
            let _ = tx.blocking_send(Command::Environment { id, event });
        });
    }

    fn spawn_task(&mut self, engine: &Engine, id: String, spec: TaskSpec) -> Option<TaskInput> {
        // A task of a session runs in the session's environment.
        let spec = match self.in_session_env(engine, spec) {
            Ok(spec) => spec,
            Err(e) => {
                return Some(TaskInput::SpawnFailed {
                    id,
                    reason: e.to_string(),
                })
            }
        };
        if let Some(link) = &self.runner {
            // Started / SpawnFailed come back from the runner as task inputs.
            link.spawn_task(&id, &spec, self.tx.clone());
            self.task_runs.insert(id, 0);
            return None;
        }
        Some(match supervisor::spawn_task(&id, &spec, self.tx.clone()) {
            Ok(pid) => {
                self.task_runs.insert(id.clone(), pid);
                TaskInput::Started { id, pid }
            }
            Err(e) => TaskInput::SpawnFailed {
                id,
                reason: e.to_string(),
            },
        })
    }

    // A run of the runner is addressed by its task's id, which names one process ever (task
    // ids are never reused): a late signal, or one to a task process the previous daemon left
    // (start-up), reaches nothing else. A child of ours is addressed by pid: only while the
    // daemon knows it lives.
    fn signal_task(&mut self, id: &str, pid: Option<u32>, signal: Signal) {
        match (&self.runner, pid) {
            (Some(link), _) => link.signal_task(id, signal),
            (None, Some(pid)) if self.task_runs.contains_key(id) => {
                supervisor::signal_group(pid, signal)
            }
            (None, _) => {}
        }
    }

    fn container(&mut self, work: ContainerWork, record: Box<ContainerRecord>) {
        self.container_work(work, record)
    }

    fn settled(
        &mut self,
        id: &SessionId,
    ) -> Result<Option<(SessionRecord, Vec<Approval>)>, StoreError> {
        let Some(record) = self.store.session(&id.0)? else {
            return Ok(None);
        };
        let resolved = self.store.resolved_approvals(&id.0)?;
        // Held beside the session while the engine holds it (see `unrecognized`).
        match self.store.unrecognized_count(&id.0)? {
            0 => {}
            n => {
                self.unrecognized.insert(id.0.clone(), n);
            }
        }
        tracing::debug!(session = %id, "recalled a settled session from the store");
        Ok(Some((record, resolved)))
    }

    fn ended_task(
        &mut self,
        id: &str,
    ) -> Result<Option<paddock_core::task::TaskRecord>, StoreError> {
        self.store.task(id)
    }

    fn resumable(
        &mut self,
        project: &str,
        skip: &dyn Fn(&SessionId) -> bool,
    ) -> Result<Option<SessionId>, StoreError> {
        self.store.resumable(project, skip)
    }

    /// The batch's records with the shell's own rows, in one transaction; then the rows'
    /// acknowledgements. A failed commit acknowledges nothing of the batch and is the caller's
    /// to decide (SQLite already waited up to its busy timeout for a lock).
    fn commit(&mut self, records: &[Record]) -> Result<(), StoreError> {
        let mut events = Vec::new();
        if !records.is_empty() || !self.rows.is_empty() {
            events = self.store.apply_all(records, &self.rows)?;
            if let Some(link) = &self.runner {
                // Stored now: the runner need not keep it for us any more.
                link.committed(records);
            }
            for r in records {
                if let Record::Delete(id) = r {
                    self.unrecognized.remove(&id.0);
                }
            }
            for row in self.rows.drain(..) {
                if let Row::Unrecognized(l) = row {
                    *self.unrecognized.entry(l.session_id).or_default() += 1;
                }
            }
        }
        let mut events = events.into_iter();
        for ack in self.acks.drain(..) {
            // A reply nobody waits for any more (the client went) is dropped.
            match ack {
                Ack::Count(reply, n) => {
                    let _ = reply.send(n);
                }
                Ack::Event(reply) => {
                    let id = events.next().expect("the store gives every event an id");
                    let _ = reply.send(id);
                }
            }
        }
        Ok(())
    }

    fn deliver(&mut self, effect: Effect) {
        // A reply nobody waits for any more (the client went) is dropped.
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
                                // The client fell behind: the rest of its turn comes from the
                                // store, at the client's pace.
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
                self.hub.activity.publish(&ev.session, &ev);
            }
            Effect::EmitApproval(a) => {
                let _ = self.hub.approval.send(*a);
            }
            Effect::Notice(n) => self.hub.raise_notice(n),
            Effect::EmitTaskStatus(ev) => {
                let _ = self.hub.task_status.send(ev);
            }
            Effect::EmitTaskOutput(o) => {
                if self.hub.task_output_all.receiver_count() > 0 {
                    let _ = self.hub.task_output_all.send(o.clone());
                }
                self.hub.task_output.publish(&o.task, &o);
            }
            Effect::Forget(rec) => {
                forget(&rec);
                // Moved away at once (the delete's answer means it is gone); its files are
                // removed off the loop.
                let remove = crate::env::destroy(&self.env, &rec.id, Some(&rec.config.env));
                tokio::task::spawn_blocking(remove);
            }
            Effect::Reply { req, result } => {
                if let Some(Waiting::Session { reply, turn }) = self.waiting(req) {
                    if let (Ok(record), Some(stream)) = (&result, turn) {
                        self.turn_streams
                            .insert((record.id.clone(), record.turns), stream);
                    }
                    let _ = reply.send(result.map(|r| *r));
                }
            }
            Effect::ReplyApproval { req, result } => {
                if let Some(Waiting::Approval(reply)) = self.waiting(req) {
                    let _ = reply.send(result.map(|a| *a));
                }
            }
            Effect::ReplyTask { req, result } => {
                if let Some(Waiting::Task(reply)) = self.waiting(req) {
                    let _ = reply.send(result);
                }
            }
            Effect::ReplyAddCampaign { req, result } => {
                if let Some(Waiting::AddCampaign(reply)) = self.waiting(req) {
                    let _ = reply.send(result);
                }
            }
            Effect::ReplyContainer { req, result } => {
                if let Some(Waiting::Container(reply)) = self.waiting(req) {
                    let _ = reply.send(result.map(|c| *c));
                }
            }
            Effect::ReplyRemoveCampaign { req, result } => {
                if let Some(Waiting::RemoveCampaign(reply)) = self.waiting(req) {
                    let _ = reply.send(result);
                }
            }
            Effect::ReplyShutdown { req, live } => {
                if let Some(Waiting::Shutdown(reply)) = self.waiting(req) {
                    tracing::info!("shutting down: stopping {live} live session(s)");
                    let _ = reply.send(live);
                }
            }
            e => unreachable!("the executor delivers no {e:?}"),
        }
    }

    /// A process's exit ends its handle (its output was read to the end): nothing more is
    /// written or signalled to its pid. So does a start that failed (the runner's run never
    /// had a process): a shutdown waits for every handle, and would wait for that one for good.
    fn taking(&mut self, input: &Input) {
        match input {
            Input::Provider {
                id,
                run,
                event: ProviderEvent::Exited { .. } | ProviderEvent::SpawnFailed { .. },
                ..
            } => {
                self.runs.remove(&(id.clone(), *run));
            }
            Input::Task(TaskInput::Exited { id, .. } | TaskInput::SpawnFailed { id, .. }) => {
                self.task_runs.remove(id);
            }
            _ => {}
        }
    }
}

/// Runs the loop until a shutdown has stopped every session, or until a batch cannot be
/// committed (returned: nothing of that batch was acknowledged; what it means for the daemon
/// is the composition root's decision).
pub async fn run(
    mut state: State,
    mut rx: mpsc::Receiver<Command>,
    restore: Vec<Effect>,
) -> Result<(), StoreError> {
    state.exec.execute(restore, &mut state.io);
    state.exec.run(&mut state.io);
    commit_or_wait(&mut state, &mut rx).await?;
    state.evict_settled();
    loop {
        let deadline = state.exec.engine().poll_timeout().and_then(|(at, why)| {
            tracing::trace!(
                at = at.millis(),
                "next deadline: {} ({why:?})",
                why.reason()
            );
            state.io.clock.deadline(at)
        });
        // Inputs already waiting (a write refused after the last commit) run at once.
        let first = if state.exec.has_inputs() {
            None
        } else {
            tokio::select! {
                biased;
                cmd = rx.recv() => match cmd {
                    Some(c) => Some(c),
                    None => break,
                },
                _ = sleep_until(deadline) => None,
            }
        };
        // Commands are taken while the batch has fewer than MAX_BATCH inputs (a command of
        // an agent's lines carries up to 64).
        let mut taken = 0;
        if let Some(c) = first {
            taken += c.inputs();
            state.command(c);
        }
        let mut waited = false;
        while taken < MAX_BATCH {
            match rx.try_recv() {
                Ok(c) => {
                    taken += c.inputs();
                    state.command(c);
                }
                // A flood (agents' output faster than it is stored): a moment more fills the
                // batch, and its commit is shared by more events.
                Err(_) if !waited && taken >= FLOOD_INPUTS => {
                    waited = true;
                    std::thread::sleep(FLOOD_WAIT);
                }
                Err(_) => break,
            }
        }
        state.queue(Input::Tick);
        state.exec.run(&mut state.io);
        commit_or_wait(&mut state, &mut rx).await?;
        for q in std::mem::take(&mut state.queries) {
            state.answer_query(q);
        }
        // What this batch settled is stored now and its reads are answered: the engine lets
        // it go (it is recalled when named again).
        state.evict_settled();
        if state.finished() {
            break;
        }
    }
    // Refuse whatever is still queued.
    for (_, w) in std::mem::take(&mut state.io.pending) {
        w.refuse();
    }
    let _ = state.done.send(true);
    Ok(())
}

/// A batch this large when the queue ran dry is a flood of agents' output (a reader's command
/// carries up to 64 lines): the loop waits [`FLOOD_WAIT`] for more before it commits. A
/// commit's fixed cost (the pages every commit rewrites: the last leaf of the activities and
/// the pages above it, each session's row) is then shared by more events: `cargo bench … P2`,
/// the daemon's CPU an event 2.46 → 2.35 µs (medians of 4 alternated runs). A batch below it
/// (a few agents, a person's requests) is committed at once, as before.
const FLOOD_INPUTS: usize = 64;
/// How long a flood's batch waits for more inputs: what adds to an event's latency then, at
/// most (the loop's thread sleeps; its tasks run on the runtime's workers).
const FLOOD_WAIT: std::time::Duration = std::time::Duration::from_micros(200);

/// Commands held at most while the store cannot take a batch (past it, the queue itself
/// holds the rest and the agents' readers wait, which stops the agents at their next write).
const HELD_MAX: usize = COMMAND_QUEUE;
/// How often a commit is tried again while the store cannot take it, at most.
const STALL_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(5);
/// How long each try of a waiting batch waits for a lock another program holds (a commit's
/// first wait is the store's full 5 s): the loop answers reads between tries.
const STALLED_LOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// Why the store cannot take a batch now, though it can once what stands in the way is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stall {
    /// The disk is full (or failing to write).
    Full,
    /// Another program holds the database's write lock.
    Locked,
}

impl Stall {
    fn of(e: &StoreError) -> Option<Stall> {
        if e.is_out_of_space() {
            Some(Stall::Full)
        } else if e.is_locked() {
            Some(Stall::Locked)
        } else {
            None
        }
    }

    /// What stands in the way, for the log.
    fn what(self) -> &'static str {
        match self {
            Stall::Full => "the disk is full",
            Stall::Locked => "another program holds the database's write lock",
        }
    }

    /// What a request that would write is told meanwhile.
    fn refusal(self, data_dir: &std::path::Path) -> Error {
        match self {
            Stall::Full => Error::new(
                paddock_core::ErrorCode::StorageFull,
                format!(
                    "disk full: the daemon cannot store anything in {} until space is freed; \
                     running agents are kept and nothing stored is lost",
                    data_dir.display()
                ),
            ),
            Stall::Locked => Error::new(
                paddock_core::ErrorCode::StorageLocked,
                format!(
                    "database locked: another program holds the write lock of {} (a sqlite3 \
                     shell in a transaction, a backup); the daemon cannot store anything until \
                     it lets go; running agents are kept and nothing stored is lost",
                    crate::paths::database(data_dir).display()
                ),
            ),
        }
    }
}

/// Commits the batch; when the disk is full or another program holds the database's lock,
/// degrades instead of dying: see [`wait_to_store`]. Any other store failure is returned
/// (crash-only: nothing of the batch was acknowledged).
async fn commit_or_wait(
    state: &mut State,
    rx: &mut mpsc::Receiver<Command>,
) -> Result<(), StoreError> {
    loop {
        match state.exec.commit(&mut state.io) {
            Ok(()) => return Ok(()),
            Err(e) => {
                let Some(stall) = Stall::of(&e) else {
                    return Err(e);
                };
                // Whatever stands in the way now, a lock may stand there at the next try.
                paddock_store::Store::set_lock_wait(Some(STALLED_LOCK_WAIT));
                let waited = wait_to_store(state, rx, stall, &e).await;
                paddock_store::Store::set_lock_wait(None);
                let held = waited?;
                if held.is_empty() {
                    return Ok(());
                }
                // What waited goes in, in the order it came, and is committed in its turn.
                for c in held {
                    state.command(c);
                }
                state.exec.run(&mut state.io);
            }
        }
    }
}

/// The store cannot take the batch now ([`Stall`]): the batch that failed (rolled back,
/// nothing of it acknowledged) is tried again with backoff until it commits. Meanwhile the
/// process and the agents live on, and nothing is lost: a request that would write is refused
/// with `OBEY-2050` (RESOURCE_EXHAUSTED, "disk full") or `OBEY-2052` (UNAVAILABLE, "database
/// locked"); reads are answered (what they show may include the one batch still waiting to be
/// stored); agents' output, task events and the other writes wait, in order, up to
/// [`HELD_MAX`], then in the bounded queue, which stops the agents at their next write.
/// Deadlines wait too. A shutdown ends the wait: the batch is stored if it now can be, else
/// the daemon exits without it (returned as the error). Returns what waited once the batch
/// is stored.
async fn wait_to_store(
    state: &mut State,
    rx: &mut mpsc::Receiver<Command>,
    mut stall: Stall,
    first: &StoreError,
) -> Result<VecDeque<Command>, StoreError> {
    let dir = state.data_dir.clone();
    match stall {
        Stall::Full => tracing::error!(
            "disk full: cannot store ({first}); refusing new work until space is freed in {}",
            dir.display()
        ),
        Stall::Locked => tracing::error!(
            "database locked by another program: cannot store ({first}); refusing new work \
             until it lets go of {}",
            crate::paths::database(&dir).display()
        ),
    }
    let mut held = VecDeque::new();
    let mut delay = std::time::Duration::from_millis(200);
    let mut retry = Box::pin(tokio::time::sleep(delay));
    loop {
        tokio::select! {
            _ = &mut retry => {
                match state.exec.commit(&mut state.io) {
                    Ok(()) => {
                        tracing::warn!(waiting = held.len(), "storing again");
                        return Ok(held);
                    }
                    Err(e) => {
                        // A lock that gave way to a full disk (or back) is waited for alike.
                        stall = Stall::of(&e).ok_or(e)?;
                        delay = (delay * 2).min(STALL_RETRY_MAX);
                        retry = Box::pin(tokio::time::sleep(delay));
                    }
                }
            }
            cmd = rx.recv(), if held.len() < HELD_MAX => match cmd {
                Some(Command::Query(q)) => state.answer_query(q),
                Some(Command::Request { reply, .. }) => {
                    let _ = reply.send(Err(stall.refusal(&dir)));
                }
                Some(Command::Resolve { reply, .. }) => {
                    let _ = reply.send(Err(stall.refusal(&dir)));
                }
                Some(Command::TaskRequest { reply, .. }) => {
                    let _ = reply.send(Err(stall.refusal(&dir)));
                }
                // A shutdown (SIGTERM, `daemon stop`) is not held: the batch gets one more
                // try, and if it still cannot be stored the daemon exits without it. Nothing
                // of it was acknowledged; agents in the runner live on and the next start
                // takes them back from what is stored.
                Some(c @ Command::Shutdown { .. }) => match state.exec.commit(&mut state.io) {
                    Ok(()) => {
                        held.push_back(c);
                        return Ok(held);
                    }
                    Err(e) => {
                        tracing::error!(
                            "asked to shut down while {}: exiting without storing the waiting \
                             batch (nothing of it was acknowledged)",
                            stall.what()
                        );
                        return Err(e);
                    }
                },
                Some(c) => held.push_back(c),
                // Every sender is gone: what waits can only be stored once the store takes it.
                None => {
                    retry.as_mut().await;
                }
            },
        }
    }
}

/// Sleeps until `deadline` on the monotonic clock (forever if there is none).
async fn sleep_until(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Removes what a deleted session's agent kept outside the store: the openai-api loop's saved
/// conversation (Claude Code, codex and gemini keep theirs in their own homes).
fn forget(rec: &SessionRecord) {
    let file = crate::providers::bridge::openai::conversation_file(
        &rec.config,
        rec.provider_session.as_deref(),
    );
    let Some(f) = file else {
        return;
    };
    match std::fs::remove_file(&f) {
        Ok(()) => {
            tracing::info!(session = %rec.id, file = %f.display(), "removed the deleted session's saved conversation")
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(session = %rec.id, file = %f.display(), "cannot remove the deleted session's saved conversation: {e}")
        }
    }
}

/// A store read that failed, as the client's error.
fn read_failed(what: &str, e: StoreError) -> Error {
    Error::new(
        paddock_core::ErrorCode::Generic,
        format!("cannot read {what}: {e}"),
    )
}
