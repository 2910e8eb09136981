//! The event loop: the one task that owns the engine, the store and the children.
//!
//! Each iteration waits for a command or the engine's next deadline, drains what else is
//! queued (up to [`MAX_BATCH`]), feeds every input to the core — one engine, one `Input`
//! enum —, executes the effects — one `match` on the one `Effect` enum — and commits the
//! batch's records in one transaction. Only then are status events, activities and replies
//! delivered (one map of who waits for which request): a client never sees what a crash could
//! still lose, and a fast agent costs one commit per batch, not one per event.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;

use paddock_core::campaign::{Campaign, CampaignError};
use paddock_core::container::ContainerWork;
use paddock_core::task::{TaskInput, TaskReply, TaskSpec};
use paddock_core::{
    Approval, Effect, Engine, Error, Input, ProviderEvent, Record, RequestId, RunId, SessionId,
    SessionRecord,
};
use tokio::sync::{broadcast, mpsc, watch};

use super::port::{shutting_down, DaemonView, HistoryView, Query, Reply, SessionView, TurnStream};
pub use super::port::{Command, Hub, Request};
use super::supervisor::{self, RunHandle};
use crate::paths::{now_ms, Clock};
use crate::store::{Row, Store, StoreError, UnrecognizedLine};

/// Commands drained per iteration (and so per commit) at most.
pub const MAX_BATCH: usize = 512;
/// The command queue's bound: provider readers wait (and so slow their agent down) when the
/// loop is behind, instead of buffering without limit.
pub const COMMAND_QUEUE: usize = 4096;

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

/// The loop's state.
pub struct State {
    engine: Engine,
    store: Store,
    hub: Hub,
    started_at: u64,
    /// The core's clocks: monotonic since the daemon started (deadlines), and the wall clock.
    clock: Clock,
    socket: PathBuf,
    data_dir: PathBuf,
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
    next_req: RequestId,
    /// Told `true` when the loop has finished (after a shutdown).
    done: watch::Sender<bool>,
    /// Unrecognized provider lines per session, as committed.
    pub(super) unrecognized: BTreeMap<String, u64>,
}

#[derive(Default)]
struct Batch {
    records: Vec<Record>,
    rows: Vec<Row>,
    deliver: Vec<Effect>,
    inputs: VecDeque<Input>,
    acks: Vec<Ack>,
    queries: Vec<Query>,
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
            env,
            container_work: BTreeMap::new(),
            engine,
            store,
            hub,
            started_at: now_ms(),
            clock,
            socket,
            data_dir,
            runner: None,
            exe,
            tx,
            runs: BTreeMap::new(),
            task_runs: BTreeMap::new(),
            pending: BTreeMap::new(),
            turn_streams: BTreeMap::new(),
            next_req: 1,
            done,
            unrecognized: BTreeMap::new(),
        }
    }

    /// `spec` as it runs in its session's environment (as it is, for a task of no session or
    /// of a session on the host without a worktree).
    fn in_session_env(&self, spec: TaskSpec) -> Result<TaskSpec, String> {
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
            let c = self
                .engine
                .containers()
                .get(&spec.container_id)
                .ok_or_else(|| format!("container {} is gone", spec.container_id))?;
            crate::env::container::enter(&self.env, c, plan)?
        } else {
            if spec.session_id.is_empty() {
                return Ok(spec);
            }
            let id = SessionId(spec.session_id.clone());
            // Never on the host instead: a session that is gone has no environment to run in.
            let config = self
                .engine
                .session(&id)
                .map(|s| &s.record.config)
                .ok_or_else(|| format!("session {id} is gone"))?;
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

    /// Whether the engine knows Aria container `id`.
    pub fn has_container(&self, id: &str) -> bool {
        self.engine.containers().get(id).is_some()
    }

    /// Whether Aria container `id` should be running.
    pub fn container_runs(&self, id: &str) -> bool {
        self.engine
            .containers()
            .get(id)
            .is_some_and(|c| c.state == paddock_core::container::ContainerState::Running)
    }

    /// Whether session `id` exists: the engine holds it or the store does (a settled session
    /// is not recalled for this). A failed read says yes: nothing is removed on a doubt.
    pub fn has_session(&self, id: &SessionId) -> bool {
        self.engine.session(id).is_some() || self.store.has_session(&id.0).unwrap_or(true)
    }

    /// Hands the engine a settled session start-up left in the store, or that the engine let
    /// go once it settled ([`Engine::recall`]),
    /// before an input or a query that names it is handled, so every rule sees it as if it
    /// had been restored. Not one whose delete waits in this batch (a commit held back by a
    /// full disk): the store still has it, and the engine rightly does not.
    fn recall(&mut self, id: &SessionId, batch: &Batch) -> Result<(), StoreError> {
        if self.engine.session(id).is_some()
            || batch
                .records
                .iter()
                .any(|r| matches!(r, Record::Delete(d) if d == id))
        {
            return Ok(());
        }
        if let Some(record) = self.store.session(&id.0)? {
            let resolved = self.store.resolved_approvals(&id.0)?;
            tracing::debug!(session = %id, "recalled a settled session from the store");
            self.engine.recall(record, resolved);
        }
        Ok(())
    }

    /// [`Self::recall`] for a read or a report that cannot be refused: a failed read is
    /// logged, and the engine answers as for a session it does not have.
    fn recall_or_log(&mut self, id: &SessionId, batch: &Batch) {
        if let Err(e) = self.recall(id, batch) {
            tracing::error!(session = %id, "cannot read the session from the store: {e}");
        }
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
        self.engine.is_shutting_down()
            && self.engine.live_sessions() == 0
            && self.runs.is_empty()
            && self.task_runs.is_empty()
    }

    /// Queues a request for the core under a fresh request id; `waiting` gets its answer.
    fn request(
        &mut self,
        waiting: Waiting,
        input: impl FnOnce(RequestId) -> Input,
        batch: &mut Batch,
    ) {
        let req = self.next_req;
        self.next_req += 1;
        let input = input(req);
        if let Some(id) = input.recalls() {
            if let Err(e) = self.recall(&id, batch) {
                waiting.fail(read_failed("the session", e));
                return;
            }
        }
        self.pending.insert(req, waiting);
        batch.inputs.push_back(input);
    }

    /// The one `match` on the port's commands.
    fn command(&mut self, cmd: Command, batch: &mut Batch) {
        match cmd {
            Command::Provider(input) => batch.inputs.push_back(input),
            Command::ProviderLine(inputs) => batch.inputs.extend(inputs),
            Command::Environment { id, event } => {
                if !self.has_session(&id) {
                    // Made after its session was deleted (a delete during the making): what
                    // was made goes too.
                    let remove = crate::env::destroy(&self.env, &id, None);
                    tokio::task::spawn_blocking(remove);
                    return;
                }
                batch.inputs.push_back(Input::Environment { id, event })
            }
            Command::Request {
                request,
                reply,
                turn,
            } => {
                let input = |req| match request {
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
                self.request(Waiting::Session { reply, turn }, input, batch);
            }
            Command::Resolve {
                approval,
                session,
                decision,
                by,
                reply,
            } => {
                // What the store holds, for a request older than the engine remembers.
                let stored = match self.store.approval(&approval) {
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
                self.request(Waiting::Approval(reply), input, batch);
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
                self.request(Waiting::Task(reply), input, batch);
            }
            Command::TaskEvent(input) => batch.inputs.push_back(Input::Task(input)),
            Command::Unrecognized { id, run, line } => {
                tracing::debug!(session = %id, run, "unrecognised provider line: {}", line.chars().take(200).collect::<String>());
                batch.rows.push(Row::Unrecognized(UnrecognizedLine {
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
                self.request(Waiting::Shutdown(reply), input, batch);
            }
            Command::AddCampaign {
                id,
                root,
                how,
                reply,
            } => {
                let input = |req| Input::AddCampaign { req, id, root, how };
                self.request(Waiting::AddCampaign(reply), input, batch);
            }
            Command::RemoveCampaign { key, reply } => {
                let input = |req| Input::RemoveCampaign { req, key };
                self.request(Waiting::RemoveCampaign(reply), input, batch);
            }
            Command::ContainerRequest { id, request, reply } => {
                let input = |req| Input::Container { req, id, request };
                self.request(Waiting::Container(reply), input, batch);
            }
            Command::ContainerReport { id, event } => {
                batch.inputs.push_back(Input::ContainerReport { id, event })
            }
            Command::Report { event, reply } => {
                batch.rows.push(Row::Event(event));
                batch.acks.push(Ack::Event(reply));
            }
            Command::External { rows, reply } => {
                // A report for a session the engine has is that session's activity (numbered,
                // stored and shown with its own); one for another id is kept apart, as
                // received (the seed lets agents report for sessions obey did not start).
                let n = rows.len();
                let named: std::collections::BTreeSet<&str> =
                    rows.iter().map(|r| r.session_id.as_str()).collect();
                for id in named {
                    self.recall_or_log(&SessionId(id.to_string()), batch);
                }
                let (known, apart): (Vec<_>, Vec<_>) = rows.into_iter().partition(|r| {
                    self.engine
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
                    batch.inputs.push_back(Input::Report {
                        id: paddock_core::SessionId(r.session_id),
                        activity,
                    });
                }
                if !apart.is_empty() {
                    batch.rows.push(Row::External(apart));
                }
                batch.acks.push(Ack::Count(reply, n));
            }
            Command::Query(q) => {
                match &q {
                    Query::Session(id, _) | Query::History { session: id, .. } => {
                        let id = id.clone();
                        self.recall_or_log(&id, batch);
                    }
                    _ => {}
                }
                batch.queries.push(q)
            }
        }
    }

    /// Answers a query from what is committed.
    fn answer_query(&self, q: Query) {
        let view = |s: &paddock_core::Session| self.view(s.record.clone(), s.pending().len());
        // A reply nobody waits for any more (the client went) is dropped.
        match q {
            Query::Daemon(reply) => {
                let _ = reply.send(self.store.session_count().map(|sessions| DaemonView {
                    started_at: self.started_at,
                    socket: self.socket.clone(),
                    data_dir: self.data_dir.clone(),
                    campaigns: self.engine.campaigns().len(),
                    sessions: sessions as usize,
                    live: self.engine.live().map(|s| s.record.clone()).collect(),
                }));
            }
            Query::Session(id, reply) => {
                let _ = reply.send(self.engine.session(&id).map(view));
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
                let _ = reply.send(self.engine.campaigns().get(&key).cloned());
            }
            Query::Campaigns(reply) => {
                let _ = reply.send(self.engine.campaigns().all());
            }
            Query::Activities {
                session,
                after,
                limit,
                reply,
            } => {
                let _ = reply.send(self.store.activities(&session.0, after, limit));
            }
            Query::History {
                session,
                limit,
                reply,
            } => {
                let read = || {
                    let messages = self.store.user_messages(&session.0)?;
                    let (activities, truncated) = self.store.last_activities(&session.0, limit)?;
                    Ok(HistoryView {
                        messages,
                        activities,
                        truncated,
                        record: self.engine.session(&session).map(|s| s.record.clone()),
                    })
                };
                let _ = reply.send(read());
            }
            Query::TurnTokens {
                session,
                turn,
                reply,
            } => {
                let _ = reply.send(self.store.turn_tokens(&session.0, turn));
            }
            Query::ReportedPayloads {
                campaign,
                event_type,
                limit,
                reply,
            } => {
                let _ = reply.send(self.store.reported_payloads(&campaign, &event_type, limit));
            }
            Query::Approvals {
                session,
                all,
                limit,
                reply,
            } => {
                let session = session.as_ref().map(|s| s.0.as_str());
                let _ = reply.send(self.store.approvals(session, all, limit));
            }
            Query::PendingApprovals(session, reply) => {
                let _ = reply.send(
                    self.engine
                        .pending_approvals()
                        .filter(|a| session.as_ref().is_none_or(|id| &a.session == id))
                        .cloned()
                        .collect(),
                );
            }
            Query::Task(id, reply) => {
                let _ = reply.send(self.engine.task(&id).cloned());
            }
            Query::Tasks {
                session,
                limit,
                reply,
            } => {
                // Newest first by creation (Aria's `task_…` and Execute's `exec_…` ids do not
                // sort together), ties by id.
                let mut matching: Vec<&paddock_core::task::TaskRecord> = self
                    .engine
                    .tasks()
                    .filter(|t| session.as_ref().is_none_or(|s| &t.spec.session_id == s))
                    .collect();
                matching.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
                let more = matching.len() > limit;
                let page = matching.into_iter().take(limit).cloned().collect();
                let _ = reply.send((page, more));
            }
            Query::TaskOutput {
                task,
                after,
                limit,
                reply,
            } => {
                let _ = reply.send(self.store.task_output(&task, after, limit));
            }
            Query::Container(id, reply) => {
                let _ = reply.send(self.engine.containers().get(&id).cloned());
            }
            Query::Containers { session, reply } => {
                let _ = reply.send(self.engine.containers().list(session.as_ref()));
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
                .engine
                .live()
                .filter(|s| pick(&s.record))
                .take(limit)
                .map(|s| view(s.record.clone(), s.pending().len()))
                .collect());
        }
        let mut out = Vec::new();
        let mut after = scope.after.clone();
        while out.len() < limit {
            let asked = (limit - out.len()).clamp(32, PAGE);
            let page = self.store.sessions_after(
                &after,
                scope.campaign.as_deref(),
                scope.working_dir.as_deref(),
                asked,
            )?;
            // A short page is the store's last: no query after it.
            let last_page = page.len() < asked;
            let Some(last) = page.last() else {
                break;
            };
            after = last.id.0.clone();
            for stored in page {
                match self.engine.session(&stored.id) {
                    Some(s) if pick(&s.record) => {
                        out.push(view(s.record.clone(), s.pending().len()))
                    }
                    Some(_) => {}
                    // Settled: no open request.
                    None if pick(&stored) => out.push(view(stored, 0)),
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
            unrecognized: self.unrecognized.get(&record.id.0).copied().unwrap_or(0),
            record,
            pending,
        }
    }

    /// Feeds every queued input to the core, executing effects as they come.
    fn run_inputs(&mut self, batch: &mut Batch) {
        while let Some(input) = batch.inputs.pop_front() {
            // A process's exit ends its handle (its output was read to the end).
            match &input {
                Input::Provider {
                    id,
                    run,
                    event: ProviderEvent::Exited { .. },
                    ..
                } => {
                    self.runs.remove(&(id.clone(), *run));
                }
                Input::Task(TaskInput::Exited { id, .. }) => {
                    self.task_runs.remove(id);
                }
                _ => {}
            }
            let effects = self.engine.handle(self.clock.now(), input);
            self.execute(effects, batch);
        }
    }

    /// The effect executor: one match on the one `Effect` enum. Records join the batch's
    /// transaction; spawns, writes and signals happen at once (a spawn's outcome comes back as
    /// an input of this same batch); what clients see waits for the commit.
    fn execute(&mut self, effects: Vec<Effect>, batch: &mut Batch) {
        for effect in effects {
            match effect {
                Effect::Persist(record) => {
                    if let Record::Delete(id) = &record {
                        self.unrecognized.remove(&id.0);
                    }
                    batch.records.push(record)
                }
                Effect::SpawnTask { id, spec } => {
                    // A task of a session runs in the session's environment.
                    let spec = match self.in_session_env(spec) {
                        Ok(spec) => spec,
                        Err(reason) => {
                            batch
                                .inputs
                                .push_back(Input::Task(TaskInput::SpawnFailed { id, reason }));
                            continue;
                        }
                    };
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
                    batch.inputs.push_back(Input::Task(event));
                }
                // A run of the runner is addressed by its task's id, which names one process
                // ever (task ids are never reused): a late signal, or one to a task process
                // the previous daemon left (start-up), reaches nothing else. A child of ours
                // is addressed by pid: only while the daemon knows it lives.
                Effect::SignalTask { id, pid, signal } => match (&self.runner, pid) {
                    (Some(link), _) => link.signal_task(&id, signal),
                    (None, Some(pid)) if self.task_runs.contains_key(&id) => {
                        supervisor::signal_group(pid, signal)
                    }
                    (None, _) => {}
                },
                // Made on a blocking thread (git, file copies): the loop goes on, and the
                // report comes back as a command. A report the loop can no longer take (it
                // ended) is moot: the next daemon fails the CREATED session.
                Effect::Provision { id, config } => {
                    let (host, tx) = (self.env.clone(), self.tx.clone());
                    tokio::task::spawn_blocking(move || {
                        let event = match crate::env::provision(&host, &id, &config) {
                            Ok(_) => paddock_core::EnvEvent::Provisioned,
                            Err(reason) => paddock_core::EnvEvent::ProvisionFailed { reason },
                        };
                        let _ = tx.blocking_send(Command::Environment { id, event });
                    });
                }
                Effect::Spawn { id, run, spec } => {
                    let planned =
                        crate::providers::plan(&spec, &self.exe).and_then(|(plan, parser)| {
                            Ok((
                                crate::env::enter(
                                    &self.env,
                                    &id,
                                    &spec.config,
                                    plan,
                                    crate::env::Role::Agent,
                                )?,
                                parser,
                            ))
                        });
                    let event = match (planned, &self.runner) {
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
                            // Its input queue is full or its writer gone: the message never
                            // reaches it, which the core rules on (OBEY-2012).
                            batch.inputs.push_back(undelivered(id, run, "a message"));
                        }
                    }
                }
                Effect::AskReady { id, run } => {
                    if let Some(h) = self.runs.get(&(id.clone(), run)) {
                        if !h.write_line(crate::providers::stream_json::ready_request()) {
                            batch
                                .inputs
                                .push_back(undelivered(id, run, "the ready request"));
                        }
                    }
                }
                Effect::CloseInput { id, run } => {
                    if let Some(h) = self.runs.get(&(id, run)) {
                        h.close_input();
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
                | Effect::Notice(_)
                | Effect::EmitTaskStatus(_)
                | Effect::EmitTaskOutput(_)
                | Effect::Forget(_)
                | Effect::Reply { .. }
                | Effect::ReplyApproval { .. }
                | Effect::ReplyTask { .. }
                | Effect::ReplyAddCampaign { .. }
                | Effect::ReplyRemoveCampaign { .. }
                | Effect::ReplyContainer { .. }
                | Effect::ReplyShutdown { .. }) => batch.deliver.push(e),
                // Made, started or stopped on a blocking thread (podman takes a while); a make
                // or a start is reported back as a command. A destroy waits for the commit,
                // like a session's environment.
                // Made, started or stopped on a blocking thread (podman takes a while), in
                // order; a make or a start is reported back as a command. A destroy waits for
                // the commit, like a session's environment.
                Effect::Container { work, record } => match work {
                    ContainerWork::Destroy => {
                        batch.deliver.push(Effect::Container { work, record })
                    }
                    work => self.container_work(work, record),
                },
            }
        }
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

    /// Writes a request's answer on the stdin of the run that asked.
    fn answer(&self, id: &SessionId, run: RunId, approval: &Approval) {
        if let Some(h) = self.runs.get(&(id.clone(), run)) {
            if !h.write_line(crate::providers::answer_line(approval)) {
                // Undeliverable: the core rules on it like any failed write (an answer goes
                // out at once or after a commit, so it comes back as a command of its own).
                let input = undelivered(id.clone(), run, "an answer");
                if self.tx.try_send(Command::Provider(input)).is_err() {
                    tracing::warn!(session = %id, run, approval = %approval.id, "could not deliver an answer to the provider");
                }
            }
        }
    }

    /// Commits the batch, then delivers what it acknowledged. A failed commit acknowledges
    /// nothing of the batch and is the caller's to decide (SQLite already waited up to its busy
    /// timeout for a lock).
    fn commit(&mut self, batch: &mut Batch) -> Result<(), StoreError> {
        let mut events = Vec::new();
        if !batch.records.is_empty() || !batch.rows.is_empty() {
            events = self.store.apply_all(&batch.records, &batch.rows)?;
            if let Some(link) = &self.runner {
                // Stored now: the runner need not keep it for us any more.
                link.committed(&batch.records);
            }
            batch.records.clear();
            for row in batch.rows.drain(..) {
                if let Row::Unrecognized(l) = row {
                    *self.unrecognized.entry(l.session_id).or_default() += 1;
                }
            }
        }
        let mut events = events.into_iter();
        for ack in batch.acks.drain(..) {
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
                Effect::Notice(n) => self.hub.raise_notice(n),
                Effect::EmitTaskStatus(ev) => {
                    let _ = self.hub.task_status.send(ev);
                }
                Effect::EmitTaskOutput(o) => {
                    let _ = self.hub.task_output.send(o);
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
                        let _ = reply.send(result);
                    }
                }
                Effect::ReplyApproval { req, result } => {
                    if let Some(Waiting::Approval(reply)) = self.waiting(req) {
                        let _ = reply.send(result);
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
                        let _ = reply.send(result);
                    }
                }
                Effect::Container { work, record } => self.container_work(work, record),
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
                Effect::Persist(_)
                | Effect::Spawn { .. }
                | Effect::Provision { .. }
                | Effect::Write { .. }
                | Effect::AskReady { .. }
                | Effect::CloseInput { .. }
                | Effect::Signal { .. }
                | Effect::SpawnTask { .. }
                | Effect::SignalTask { .. } => {
                    unreachable!("executed at once, never delivered: {effect:?}")
                }
            }
        }
        Ok(())
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
}

impl State {
    /// Feeds a turn's stream from the store, from activity `after_seq` on, until the turn's
    /// last activity (or the client goes): a client slower than its agent still gets every
    /// activity of its turn, in order, ending with the one that ends it. The loop never waits
    /// for a client; the store is the buffer.
    fn catch_up(&self, stream: TurnStream, session: SessionId, turn: u64, after_seq: u64) {
        const PAGE: usize = 256;
        let tx = self.tx.clone();
        // Woken by every committed activity (subscribed before the first read, so none falls
        // in between): a short page waits for the next commit, not for a timer.
        let mut committed = self.hub.activity.subscribe();
        tokio::spawn(async move {
            let mut after = after_seq;
            loop {
                let (reply, rrx) = tokio::sync::oneshot::channel();
                let read = Query::Activities {
                    session: session.clone(),
                    after,
                    limit: PAGE,
                    reply,
                };
                if tx.send(Command::Query(read)).await.is_err() {
                    return; // the loop is gone
                }
                let page = match rrx.await {
                    Ok(Ok(page)) => page,
                    Ok(Err(e)) => {
                        let _ = stream
                            .send(Err(read_failed("the turn's activities", e)))
                            .await;
                        return;
                    }
                    Err(_) => return, // the loop is gone
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
                    tokio::select! {
                        biased;
                        _ = stream.closed() => return,
                        // Fell behind the hub too: the store has it all, read on.
                        woke = committed.recv() => {
                            if let Err(broadcast::error::RecvError::Closed) = woke {
                                return;
                            }
                        }
                    }
                }
            }
        });
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
    let mut batch = Batch::default();
    state.execute(restore, &mut batch);
    state.run_inputs(&mut batch);
    commit_or_wait(&mut state, &mut batch, &mut rx).await?;
    state.engine.evict_settled();
    loop {
        let deadline = state.engine.poll_timeout().and_then(|(at, why)| {
            tracing::trace!(
                at = at.millis(),
                "next deadline: {} ({why:?})",
                why.reason()
            );
            state.clock.deadline(at)
        });
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
        state.run_inputs(&mut batch);
        commit_or_wait(&mut state, &mut batch, &mut rx).await?;
        for q in std::mem::take(&mut batch.queries) {
            state.answer_query(q);
        }
        // What this batch settled is stored now and its reads are answered: the engine lets
        // it go (it is recalled when named again).
        state.engine.evict_settled();
        if state.finished() {
            break;
        }
    }
    // Refuse whatever is still queued.
    for (_, w) in std::mem::take(&mut state.pending) {
        w.refuse();
    }
    let _ = state.done.send(true);
    Ok(())
}

/// Commands held at most while the disk is full (past it, the queue itself holds the rest and
/// the agents' readers wait, which stops the agents at their next write).
const HELD_MAX: usize = COMMAND_QUEUE;
/// How often a commit is tried again while the disk is full, at most.
const FULL_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// Commits the batch; when the disk is full, degrades instead of dying: see [`wait_for_space`].
/// Any other store failure is returned (crash-only: nothing of the batch was acknowledged).
async fn commit_or_wait(
    state: &mut State,
    batch: &mut Batch,
    rx: &mut mpsc::Receiver<Command>,
) -> Result<(), StoreError> {
    loop {
        match state.commit(batch) {
            Ok(()) => return Ok(()),
            Err(e) if e.is_out_of_space() => {
                let held = wait_for_space(state, batch, rx, &e).await?;
                if held.is_empty() {
                    return Ok(());
                }
                // What waited goes in, in the order it came, and is committed in its turn.
                for c in held {
                    state.command(c, batch);
                }
                state.run_inputs(batch);
            }
            Err(e) => return Err(e),
        }
    }
}

/// The disk is full: the batch that failed (rolled back, nothing of it acknowledged) is tried
/// again with backoff until it commits. Meanwhile the process and the agents live on, and
/// nothing is lost: a request that would write is refused with `OBEY-2050` (RESOURCE_EXHAUSTED,
/// "disk full"); reads are answered (what they show may include the one batch still waiting to
/// be stored); agents' output, task events, a shutdown and the other writes wait, in order,
/// up to [`HELD_MAX`], then in the bounded queue, which stops the agents at their next write.
/// Deadlines wait too. Returns what waited once the batch is stored.
async fn wait_for_space(
    state: &mut State,
    batch: &mut Batch,
    rx: &mut mpsc::Receiver<Command>,
    first: &StoreError,
) -> Result<VecDeque<Command>, StoreError> {
    tracing::error!(
        "disk full: cannot store ({first}); refusing new work until space is freed in {}",
        state.data_dir.display()
    );
    let dir = state.data_dir.display().to_string();
    let refusal = || {
        Error::new(
            paddock_core::ErrorCode::StorageFull,
            format!(
                "disk full: the daemon cannot store anything in {dir} until space is freed; \
                 running agents are kept and nothing stored is lost"
            ),
        )
    };
    let mut held = VecDeque::new();
    let mut delay = std::time::Duration::from_millis(200);
    let mut retry = Box::pin(tokio::time::sleep(delay));
    loop {
        tokio::select! {
            _ = &mut retry => {
                match state.commit(batch) {
                    Ok(()) => {
                        tracing::warn!(waiting = held.len(), "space is back: storing again");
                        return Ok(held);
                    }
                    Err(e) if e.is_out_of_space() => {
                        delay = (delay * 2).min(FULL_RETRY_MAX);
                        retry = Box::pin(tokio::time::sleep(delay));
                    }
                    Err(e) => return Err(e),
                }
            }
            cmd = rx.recv(), if held.len() < HELD_MAX => match cmd {
                Some(Command::Query(q)) => state.answer_query(q),
                Some(Command::Request { reply, .. }) => {
                    let _ = reply.send(Err(refusal()));
                }
                Some(Command::Resolve { reply, .. }) => {
                    let _ = reply.send(Err(refusal()));
                }
                Some(Command::TaskRequest { reply, .. }) => {
                    let _ = reply.send(Err(refusal()));
                }
                Some(c) => held.push_back(c),
                // Every sender is gone: what waits can only be stored once there is space.
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

/// A write the agent's input queue did not take (full, or its writer gone after an earlier
/// failure): the session's `DeliveryFailed`.
fn undelivered(id: SessionId, run: RunId, what: &str) -> Input {
    Input::Provider {
        id,
        run,
        cursor: None,
        event: ProviderEvent::DeliveryFailed {
            reason: format!("{what} could not be queued for the agent's input (full, or closed)"),
        },
    }
}
