//! The reference model: what a client has seen (every status change, every activity, every
//! reply, delivered only after its transaction committed) and what it may therefore expect.
//! Its invariants are checked on every effect batch and after every step; a broken one is a
//! `String` saying what went wrong, which the driver turns into a failure line.
//!
//! The model is deliberately not a second implementation of the machine: it knows which
//! (previous, new) status pairs a cause may produce, which replies a request may get given the
//! state it was made in, and how turns and tokens add up — not how the engine gets there.

use std::collections::{BTreeMap, BTreeSet};

use paddock_core::{
    Activity, ActivityEvent, ActivityKind, Approval, ApprovalId, ApprovalSettings, ApprovalState,
    AskKind, Deadline, Decision, Effect, Engine, EnvState, Error, ErrorCode, Input, Limits,
    Provider, ProviderConfig, Record, RequestId, Run, RunId, SessionConfig, SessionId,
    SessionRecord, Signal, SpawnSpec, Status, StatusEvent, Timer,
};

use crate::world::{at, ts, Millis, Store};
use paddock_core::process::Life;

/// The payloads of the effects that match `pattern`, which binds `x`: `pick!(effects, ev =>
/// Effect::EmitStatus(ev))`.
macro_rules! pick {
    ($effects:expr, $x:ident => $pattern:pat) => {
        $effects
            .iter()
            .filter_map(|e| match e {
                $pattern => Some($x),
                _ => None,
            })
            .collect()
    };
}

/// The kind of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReqKind {
    Create,
    Send,
    StopGraceful,
    StopForced,
    Restart,
    /// ResolveApproval.
    Resolve,
    /// DeleteSession.
    Delete,
    /// An attach that found its project's session live: answered at once with it as it is.
    /// (One that found an ended one is a `Restart` of it; one that found none, a `Create`.)
    Attached,
    /// An attach that found nothing to resume, with a configuration the shell refused:
    /// refused at once with the shell's code.
    AttachRefused(ErrorCode),
}

/// The kind of a provider event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Started,
    /// The started agent answered the ready request.
    Ready,
    SpawnFailed,
    Activity,
    TurnEnd,
    SessionRef,
    Exited,
    Ask,
    OutputLost,
    /// A message could not be written to the provider.
    DeliveryFailed,
    /// The connection to the agent's machine dropped or came back.
    Connection,
}

/// What an `Ask` asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AskSeen {
    pub approval: ApprovalId,
    pub key: String,
    pub kind: AskKind,
    pub tool: String,
}

/// What caused an effect batch.
#[derive(Debug, Clone)]
pub enum Cause {
    Request {
        req: RequestId,
        id: SessionId,
        kind: ReqKind,
    },
    Provider {
        id: SessionId,
        run: RunId,
        /// The event's position in the run's output (output events only).
        cursor: Option<u64>,
        event: EventKind,
        activity: Option<Activity>,
        /// The conversation id a `SessionRef` reports.
        session_ref: Option<String>,
        /// What an `Ask` asks.
        ask: Option<Box<AskSeen>>,
    },
    Tick,
    /// An agent's report for session `id` (obey's StreamAgentActivity).
    Report {
        id: SessionId,
        activity: Activity,
    },
    /// A restarted daemon reconciling what the store says.
    Restore,
    /// The daemon's report on session `id`'s environment: made (`ok`) or not.
    Environment {
        id: SessionId,
        ok: bool,
    },
    /// The daemon shuts down: every live session is stopped (nobody waits for those stops'
    /// replies), and the shutdown is answered at once with how many there were.
    Shutdown {
        req: RequestId,
        graceful: bool,
    },
}

impl Cause {
    fn req(&self, k: ReqKind) -> bool {
        matches!(self, Cause::Request { kind, .. } if *kind == k)
    }

    /// A stop, one of the stops a shutdown makes included.
    fn stop(&self) -> bool {
        self.req(ReqKind::StopGraceful)
            || self.req(ReqKind::StopForced)
            || matches!(self, Cause::Shutdown { .. })
    }

    /// A graceful stop (or shutdown): an open turn may finish, and what was asked is told no.
    fn graceful_stop(&self) -> bool {
        self.req(ReqKind::StopGraceful) || matches!(self, Cause::Shutdown { graceful: true, .. })
    }

    /// A forced stop (or shutdown): an open turn is interrupted.
    fn forced_stop(&self) -> bool {
        self.req(ReqKind::StopForced)
            || matches!(
                self,
                Cause::Shutdown {
                    graceful: false,
                    ..
                }
            )
    }

    fn ev(&self, k: EventKind) -> bool {
        matches!(self, Cause::Provider { event, .. } if *event == k)
    }

    fn tick(&self) -> bool {
        matches!(self, Cause::Tick)
    }

    fn restore(&self) -> bool {
        matches!(self, Cause::Restore)
    }

    /// A report that the environment was made (`ok`) or could not be.
    fn env(&self, ok: bool) -> bool {
        matches!(self, Cause::Environment { ok: o, .. } if *o == ok)
    }

    /// The one session a request or a provider event may change.
    fn session(&self) -> Option<&SessionId> {
        match self {
            Cause::Request { id, .. }
            | Cause::Provider { id, .. }
            | Cause::Environment { id, .. }
            | Cause::Report { id, .. } => Some(id),
            Cause::Tick | Cause::Restore | Cause::Shutdown { .. } => None,
        }
    }
}

/// What a session does after STOPPING, as far as the requests made so far say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    Stop,
    Restart,
}

/// One session as the client has seen it.
#[derive(Debug, Clone)]
pub struct SessionModel {
    pub config: SessionConfig,
    pub status: Status,
    pub status_seq: u64,
    pub activity_seq: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    /// Transitions into STARTING seen (the first is the creation), or the creation itself for
    /// a session that first waits for its environment: `restart_count + 1`.
    pub starts: u32,
    /// Turns started (user messages stored).
    pub turns: u64,
    /// Turns whose stream ended (a COMPLETION or ERROR that ends it), across every daemon.
    pub turns_ended: u64,
    pub open_turn: Option<u64>,
    /// When the status last changed.
    pub since: Millis,
    /// When the provider last reported it started (the session timeout counts from there).
    pub started_at: Option<Millis>,
    /// A restart was asked for while the session was STOPPED or FAILED.
    restart_asked: bool,
    /// What the pending stop leads to.
    after_stop: Option<Then>,
    /// The daemon restarting now adopts this session's process (meaningful in the restore
    /// batch only).
    adopted: bool,
    /// The run whose output the session has applied, and how far (the last cursor applied).
    applied: Option<(RunId, u64)>,
    /// The provider's conversation id, as the runs reported it (`SessionRef`): what the
    /// record keeps and the next `Spawn` resumes.
    pub provider_session: Option<String>,
    /// Its client closed it (`Input::Close`, accepted or not): it is never resumed.
    closed: bool,
    /// When it was created (an id of a deleted session may be given again, later).
    created: Millis,
    /// The process TERMed and not yet gone (nor KILLed): when KILL is due.
    kill_at: Option<(RunId, Millis)>,
    /// The session's process (from its `Spawn` until its exit or spawn failure is read), and
    /// whether it was TERMed.
    proc_run: Option<RunId>,
    terminating: bool,
    /// Its input was closed (a graceful end's first step), not yet TERMed: when TERM is due.
    ending: Option<Millis>,
    /// Its open requests for a human: id → when each expires.
    pub open: BTreeMap<ApprovalId, Millis>,
    /// Where its environment is in its life: `Creating` from a create that needs one made
    /// until the report (`Ready`), or until its making is given up (a stop, the start-up
    /// timeout, a daemon restart: `Failed`); `Ready` again once an agent starts in it.
    pub env: EnvState,
}

impl SessionModel {
    pub fn tokens(&self) -> u64 {
        self.tokens_in.saturating_add(self.tokens_out)
    }

    fn exhausted(&self) -> bool {
        self.config.max_tokens > 0 && self.tokens() >= self.config.max_tokens
    }

    /// Past the budget (not just at it).
    fn exceeded(&self) -> bool {
        self.config.max_tokens > 0 && self.tokens() > self.config.max_tokens
    }
}

/// A request waiting for its reply, with what the client knew when it made it.
#[derive(Debug, Clone)]
struct Pending {
    kind: ReqKind,
    id: SessionId,
    /// The session's status then (`None`: no such session).
    pre: Option<Status>,
    exhausted: bool,
    /// A create that must be refused: the id exists, or the live-session limit is reached.
    refuse_create: bool,
    config: Option<SessionConfig>,
    /// A resolve: what it resolves, how, and the answer it must get.
    resolve: Option<ResolveExpect>,
    /// A delete: the session had a process then.
    had_process: bool,
    /// A close (`Input::Close`): once its step is committed the session is closed.
    close: bool,
}

impl Pending {
    /// A request of `kind` for session `id`, then `pre`, with nothing more to expect.
    fn new(kind: ReqKind, id: SessionId, pre: Option<Status>) -> Self {
        Pending {
            kind,
            id,
            pre,
            exhausted: false,
            refuse_create: false,
            config: None,
            resolve: None,
            had_process: false,
            close: false,
        }
    }
}

/// What a `Resolve` must get, decided from what clients saw when it was made.
#[derive(Debug, Clone)]
struct ResolveExpect {
    approval: ApprovalId,
    decision: Decision,
    by: String,
    /// `Ok` (it resolves the request) or the refusal's code.
    want: Result<(), ErrorCode>,
}

/// Counters for the run summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelStats {
    /// Attaches to a project (sunbeam's StartSession), and those that restarted an ended
    /// session.
    pub attaches: u64,
    pub attaches_joined: u64,
    pub attaches_restarted: u64,
    pub attaches_refused: u64,
    /// First messages that carried the session's system prompt to an agent without one.
    pub prompts_with_message: u64,
    /// Checks of which session a project resumes that found one.
    pub resumable_checked: u64,
    pub requests: u64,
    pub replies_ok: u64,
    pub replies_err: u64,
    /// Requests in flight when the daemon crashed (their clients saw the connection drop).
    pub requests_lost: u64,
    pub turns_completed: u64,
    pub turns_errored: u64,
    /// Turns a daemon crash left open that the new daemon ended with OBEY-2032 (their
    /// process was lost).
    pub turns_cut: u64,
    /// Turns a daemon crash left open that went on in an adopted process.
    pub turns_adopted: u64,
    /// Agents' reports (StreamAgentActivity), and those recorded as their session's activity
    /// (the rest named no session the daemon has).
    pub reports: u64,
    pub reports_recorded: u64,
    /// Output events replayed after a restart that had been applied already (and were
    /// recognised as such).
    pub replays_ignored: u64,
    /// Asks applied, settled at once (the policy, or a stop), and opened for a human.
    pub asks: u64,
    pub asks_settled: u64,
    pub approvals_opened: u64,
    /// How the opened ones ended.
    pub approvals_resolved: u64,
    pub approvals_expired: u64,
    pub approvals_cancelled: u64,
    /// Resolves refused: already resolved (OBEY-2041), unknown (OBEY-2040), the wrong kind of
    /// answer (OBEY-2011).
    pub resolves_late: u64,
    pub resolves_unknown: u64,
    pub resolves_wrong: u64,
    /// Answers the agents got.
    pub answers: u64,
    /// Answers sent again to an agent adopted after a restart.
    pub answers_repeated: u64,
    /// Creates refused because their provider could not be started (nothing of them stays).
    pub creates_discarded: u64,
    /// Environments: made (the agent then spawned), refused (OBEY-2005, nothing stays), given
    /// up by a stop (OBEY-2004, STOPPED), by the start-up timeout (FAILED, OBEY-2005) or by a
    /// daemon restart; reports that came after the making was given up (ignored).
    pub envs_made: u64,
    pub envs_refused: u64,
    pub envs_stopped: u64,
    /// ... of those, by the daemon's shutdown.
    pub envs_shutdown: u64,
    pub envs_timed_out: u64,
    pub envs_lost: u64,
    pub env_reports_ignored: u64,
    /// Sessions deleted, and deletes refused (the session was live or still had a process).
    pub deleted: u64,
    pub deletes_refused: u64,
}

#[derive(Debug, Clone)]
pub struct Model {
    sessions: BTreeMap<SessionId, SessionModel>,
    pending: BTreeMap<RequestId, Pending>,
    limits: Limits,
    /// The time of the current batch.
    now: Millis,
    /// In the current batch: the provider's own activity was recorded already.
    provider_activity_seen: bool,
    /// The status of the session the request of the current batch was made for, then.
    pending_pre: Option<Status>,
    /// Every request for a human clients saw, as they last saw it (a deleted session's are
    /// forgotten with it).
    approvals: BTreeMap<ApprovalId, Approval>,
    /// Every agent key that got its answer: one answer per key, ever.
    answered: BTreeSet<String>,
    /// The requests opened or resolved in the current batch (their notes are the engine's
    /// own activities).
    batch_approvals: BTreeSet<ApprovalId>,
    /// The sessions whose record the current batch wrote.
    batch_persisted: BTreeSet<SessionId>,
    /// In the current batch: sessions removed (deleted, or a refused create discarded), and
    /// the `Forget`s (one per removal, and no other); environments asked for
    /// (`Provision`), spawns; and what a session's status must be once the batch is done.
    batch_removed: Vec<SessionId>,
    batch_forgotten: Vec<SessionId>,
    batch_provisions: Vec<SessionId>,
    batch_spawns: Vec<SessionId>,
    batch_expect: Vec<(SessionId, Status, &'static str)>,
    /// A shutdown waiting for its reply: its request and how many sessions were live.
    shutdown: Option<(RequestId, usize)>,
    /// Whole-state checks so far (every 16th compares every configuration).
    checks: u64,
    pub stats: ModelStats,
}

impl Model {
    pub fn new(limits: Limits) -> Self {
        Model {
            sessions: BTreeMap::new(),
            pending: BTreeMap::new(),
            limits,
            now: 0,
            provider_activity_seen: false,
            pending_pre: None,
            approvals: BTreeMap::new(),
            answered: BTreeSet::new(),
            batch_approvals: BTreeSet::new(),
            batch_persisted: BTreeSet::new(),
            batch_removed: Vec::new(),
            batch_forgotten: Vec::new(),
            batch_provisions: Vec::new(),
            batch_spawns: Vec::new(),
            batch_expect: Vec::new(),
            shutdown: None,
            checks: 0,
            stats: ModelStats::default(),
        }
    }

    pub fn status(&self, id: &SessionId) -> Option<Status> {
        self.sessions.get(id).map(|s| s.status)
    }

    pub fn session(&self, id: &SessionId) -> Option<&SessionModel> {
        self.sessions.get(id)
    }

    pub fn sessions(&self) -> impl Iterator<Item = (&SessionId, &SessionModel)> {
        self.sessions.iter()
    }

    pub fn live(&self) -> usize {
        self.sessions
            .values()
            .filter(|s| !s.status.is_terminal())
            .count()
    }

    /// Requests still waiting for a reply.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// The requests for a human that clients saw open, oldest session first.
    pub fn open_approvals(&self) -> Vec<&Approval> {
        self.sessions
            .values()
            .flat_map(|s| s.open.keys())
            .filter_map(|id| self.approvals.get(id))
            .collect()
    }

    /// The requests clients saw resolved (what a second answer goes to), oldest first (ids
    /// are numbered in the order the agents asked).
    pub fn resolved_approvals(&self) -> impl Iterator<Item = &Approval> {
        self.approvals.values().filter(|a| !a.is_pending())
    }

    /// What a `Resolve` of `approval` with `decision` must get now.
    fn resolve_expectation(
        &self,
        approval: &ApprovalId,
        decision: &Decision,
    ) -> (Option<SessionId>, Result<(), ErrorCode>) {
        let Some(a) = self.approvals.get(approval) else {
            return (None, Err(ErrorCode::ApprovalNotFound));
        };
        let Some(sm) = self.sessions.get(&a.session) else {
            return (None, Err(ErrorCode::ApprovalNotFound));
        };
        let session = Some(a.session.clone());
        if !a.is_pending() {
            // A second answer, however old: the engine remembers the newest, and beyond them
            // the Resolve carries the store's copy (the driver passes it, as the shell does).
            return (session, Err(ErrorCode::ApprovalResolved));
        }
        let fits = !matches!(
            (a.kind, decision),
            (AskKind::Permission, Decision::Answer { .. })
                | (AskKind::ClientTool, Decision::Approve)
        );
        if sm.status != Status::Waiting || !fits {
            return (session, Err(ErrorCode::WrongState));
        }
        (session, Ok(()))
    }

    // ── requests ─────────────────────────────────────────────────────────

    /// A request is about to be fed: remember what its reply may be.
    pub fn on_request(&mut self, input: &Input) -> Cause {
        if let Input::Report { id, activity } = input {
            self.stats.reports += 1;
            return Cause::Report {
                id: id.clone(),
                activity: activity.clone(),
            };
        }
        if let Input::Attach {
            req,
            project,
            context,
            id,
            config,
        } = input
        {
            return self.on_attach(*req, project, context, id, config);
        }
        if let Input::Resolve {
            req,
            approval,
            decision,
            by,
            ..
        } = input
        {
            self.stats.requests += 1;
            let (session, want) = self.resolve_expectation(approval, decision);
            // A request for no session the client knows: effects for any session are wrong.
            let id = session.unwrap_or_else(|| SessionId::from("s-none"));
            let pre = self.status(&id);
            self.pending_pre = pre;
            self.pending.insert(
                *req,
                Pending {
                    resolve: Some(ResolveExpect {
                        approval: approval.clone(),
                        decision: decision.clone(),
                        by: by.clone(),
                        want,
                    }),
                    ..Pending::new(ReqKind::Resolve, id.clone(), pre)
                },
            );
            return Cause::Request {
                req: *req,
                id,
                kind: ReqKind::Resolve,
            };
        }
        let (req, id, kind) = match input {
            Input::Create { req, id, .. } => (*req, id, ReqKind::Create),
            Input::Send { req, id, .. } => (*req, id, ReqKind::Send),
            Input::Stop { req, id, graceful } => (
                *req,
                id,
                if *graceful {
                    ReqKind::StopGraceful
                } else {
                    ReqKind::StopForced
                },
            ),
            // A close is a graceful stop that also marks the session closed.
            Input::Close { req, id } => (*req, id, ReqKind::StopGraceful),
            Input::Restart { req, id, .. } => (*req, id, ReqKind::Restart),
            Input::Delete { req, id } => (*req, id, ReqKind::Delete),
            // Not a session request of a client: a Resolve and an Attach are predicted above, a
            // Shutdown by `on_shutdown`; tasks, campaigns and containers are the daemon sweep's
            // (`daemon.rs`); provider and environment events and ticks are the world's and
            // the clock's; an agent's report (`Input::Report`) is taken above.
            Input::Resolve { .. }
            | Input::Attach { .. }
            | Input::Provider { .. }
            | Input::Environment { .. }
            | Input::Report { .. }
            | Input::Task(_)
            | Input::AddCampaign { .. }
            | Input::RemoveCampaign { .. }
            | Input::Container { .. }
            | Input::ContainerReport { .. }
            | Input::Shutdown { .. }
            | Input::Tick => {
                unreachable!("not a session request")
            }
        };
        self.stats.requests += 1;
        let live = self.live();
        let sm = self.sessions.get_mut(id);
        let pre = sm.as_ref().map(|s| s.status);
        let exhausted = sm.as_ref().is_some_and(|s| s.exhausted());
        let had_process = sm.as_ref().is_some_and(|s| s.proc_run.is_some());
        let mut config = None;
        if let Some(sm) = sm {
            match (input, pre) {
                (Input::Stop { .. } | Input::Close { .. }, Some(s)) if !s.is_terminal() => {
                    sm.after_stop = Some(Then::Stop);
                }
                (
                    Input::Restart {
                        provider_config, ..
                    },
                    Some(s),
                ) if s != Status::Stopping && s != Status::Created => {
                    if s.is_terminal() {
                        sm.restart_asked = true;
                    } else {
                        sm.after_stop = Some(Then::Restart);
                    }
                    if let Some(pc) = provider_config {
                        // The override keeps the session's permissions unless it names its own.
                        let mut pc = pc.as_map().clone();
                        if let Some(p) = sm.config.provider_config.get("permissions") {
                            pc.entry("permissions".into()).or_insert_with(|| p.clone());
                        }
                        sm.config.provider_config =
                            ProviderConfig::parse(pc).expect("both maps were valid");
                    }
                }
                _ => {}
            }
        } else if let Input::Create { config: c, .. } = input {
            config = Some(SessionConfig::clone(c));
        }
        let refuse_create =
            kind == ReqKind::Create && (pre.is_some() || live >= self.limits.max_live_sessions);
        self.pending_pre = pre;
        self.pending.insert(
            req,
            Pending {
                exhausted,
                refuse_create,
                config,
                had_process,
                close: matches!(input, Input::Close { .. }),
                ..Pending::new(kind, id.clone(), pre)
            },
        );
        Cause::Request {
            req,
            id: id.clone(),
            kind,
        }
    }

    /// A message to an agent is the turn's message stored in the same step, with the
    /// session's system prompt ahead of it on the first turn of an agent that takes none.
    fn check_write(
        &mut self,
        id: &SessionId,
        text: &str,
        stored: &[&paddock_core::UserMessage],
    ) -> Result<(), String> {
        let Some(m) = stored.iter().find(|m| &m.session == id) else {
            return Err(format!(
                "{id}: a message to its agent with no turn stored in its step"
            ));
        };
        let config = &self.sessions[id].config;
        // The reference's own list (not the core's `takes_system_prompt`): the agents that
        // get a system prompt on their command line or as their system message.
        let own_channel = matches!(
            config.provider,
            Provider::ClaudeCode | Provider::Scripted | Provider::OpenAiApi
        );
        let want = match config.provider_config.system_prompt() {
            Some(p) if m.turn == 1 && !own_channel => {
                self.stats.prompts_with_message += 1;
                paddock_core::provider_config::with_system_prompt(p, &m.text)
            }
            _ => m.text.clone(),
        };
        if text != want {
            return Err(format!(
                "{id}: turn {} reached its agent ({}) as {text:?}; expected {want:?}",
                m.turn,
                config.provider.name()
            ));
        }
        Ok(())
    }

    /// An attach (sunbeam's StartSession): by the clients' view, the project's session that
    /// it resumes — joined if live, restarted with the attach's context if ended — or the
    /// session it makes. The last two are what a `Restart` or a `Create` of them would be.
    fn on_attach(
        &mut self,
        req: RequestId,
        project: &str,
        context: &str,
        id: &SessionId,
        config: &Result<Box<SessionConfig>, paddock_core::Error>,
    ) -> Cause {
        self.stats.attaches += 1;
        let found = self.resumes(project).cloned();
        let (id, kind) = match (found, config) {
            (Some(found), _) if !self.sessions[&found].status.is_terminal() => {
                self.stats.attaches_joined += 1;
                (found, ReqKind::Attached)
            }
            (Some(found), _) => {
                self.stats.attaches_restarted += 1;
                let provider_config = self.sessions[&found]
                    .config
                    .provider_config
                    .clone()
                    .with(paddock_core::SYSTEM_PROMPT_KEY, context)
                    .expect("no setting");
                return self.on_request(&Input::Restart {
                    req,
                    id: found,
                    provider_config: Some(provider_config),
                });
            }
            (None, Ok(config)) => {
                let mut config = (**config).clone();
                let pc = &mut config.provider_config;
                pc.insert(paddock_core::PROJECT_KEY, project)
                    .expect("no setting");
                pc.insert(paddock_core::SYSTEM_PROMPT_KEY, context)
                    .expect("no setting");
                return self.on_request(&Input::Create {
                    req,
                    id: id.clone(),
                    config: config.into(),
                });
            }
            (None, Err(e)) => {
                self.stats.attaches_refused += 1;
                (id.clone(), ReqKind::AttachRefused(e.code))
            }
        };
        self.stats.requests += 1;
        let pre = self.status(&id);
        self.pending_pre = pre;
        self.pending
            .insert(req, Pending::new(kind, id.clone(), pre));
        Cause::Request { req, id, kind }
    }

    /// The session an attach of `project` resumes, by what the clients saw: the newest made
    /// for the project that its client has not closed.
    fn resumes(&self, project: &str) -> Option<&SessionId> {
        self.sessions
            .iter()
            .filter(|(_, sm)| {
                !sm.closed
                    && sm
                        .config
                        .provider_config
                        .get(paddock_core::PROJECT_KEY)
                        .map(String::as_str)
                        == Some(project)
            })
            .max_by_key(|(id, sm)| (sm.created, *id))
            .map(|(id, _)| id)
    }

    /// The daemon is asked to shut down: every live session is stopped as by a stop nobody
    /// waits for (a session making its environment ends STOPPED at once, its create refused).
    pub fn on_shutdown(&mut self, req: RequestId, graceful: bool) -> Cause {
        self.stats.requests += 1;
        let live = self.live();
        for sm in self.sessions.values_mut() {
            if !sm.status.is_terminal() {
                sm.after_stop = Some(Then::Stop);
            }
        }
        self.pending_pre = None;
        self.shutdown = Some((req, live));
        Cause::Shutdown { req, graceful }
    }

    // ── effect batches ───────────────────────────────────────────────────

    /// Checks one `handle` result (after its persists were committed to `store`) and learns
    /// from what it delivers to clients.
    pub fn on_batch(
        &mut self,
        now: Millis,
        cause: &Cause,
        effects: &[Effect],
        store: &Store,
    ) -> Result<(), String> {
        self.now = now;
        // A close is stored in its own step, whatever its stop's answer.
        if let Cause::Request { req, id, .. } = cause {
            if self.pending.get(req).is_some_and(|p| p.close) {
                if let Some(sm) = self.sessions.get_mut(id) {
                    sm.closed = true;
                }
            }
        }
        self.batch_removed.clear();
        self.batch_forgotten.clear();
        self.batch_provisions.clear();
        self.batch_spawns.clear();
        self.batch_expect.clear();
        // The drain rule: every Persist comes before every other effect.
        let rest_at = effects
            .iter()
            .position(|e| !e.is_persist())
            .unwrap_or(effects.len());
        if let Some(i) = effects[rest_at..].iter().position(Effect::is_persist) {
            return Err(format!(
                "drain rule: a Persist (effect #{}) comes after a non-persist effect (#{rest_at}): \
                 {:?}",
                rest_at + i,
                effects[rest_at + i]
            ));
        }
        let (persists, rest) = effects.split_at(rest_at);
        // Nothing reaches a client that is not in this transaction: every emitted status or
        // activity was persisted, in the same order, with the same content.
        let mut p_status: Vec<&StatusEvent> = Vec::new();
        let mut p_activity: Vec<&std::sync::Arc<ActivityEvent>> = Vec::new();
        let mut messages: Vec<(&SessionId, u64)> = Vec::new();
        let mut stored_messages: Vec<&paddock_core::UserMessage> = Vec::new();
        for e in persists {
            match e {
                Effect::Persist(Record::Status(ev)) => p_status.push(ev),
                Effect::Persist(Record::Activity(ev)) => p_activity.push(ev),
                Effect::Persist(Record::UserMessage(m)) => {
                    messages.push((&m.session, m.turn));
                    stored_messages.push(m);
                }
                _ => {}
            }
        }
        let e_status: Vec<&StatusEvent> = pick!(rest, ev => Effect::EmitStatus(ev));
        let e_activity: Vec<&std::sync::Arc<ActivityEvent>> =
            pick!(rest, ev => Effect::EmitActivity(ev));
        if e_status != p_status {
            return Err(format!(
                "emitted status events {e_status:?} are not the persisted ones {p_status:?}"
            ));
        }
        if e_activity != p_activity {
            return Err(format!(
                "emitted activities {e_activity:?} are not the persisted ones {p_activity:?}"
            ));
        }
        if let Some(id) = cause.session() {
            for e in persists {
                let sid = match e {
                    Effect::Persist(Record::Session(r)) => &r.id,
                    Effect::Persist(Record::Status(ev)) => &ev.session,
                    Effect::Persist(Record::Activity(ev)) => &ev.session,
                    Effect::Persist(Record::UserMessage(m)) => &m.session,
                    Effect::Persist(Record::Approval(a)) => &a.session,
                    Effect::Persist(Record::Delete(d)) => d,
                    _ => continue,
                };
                if sid != id {
                    return Err(format!(
                        "an input for {id} persisted a row of another session, {sid}"
                    ));
                }
            }
        }
        // Every request opened or resolved is stored in this transaction, as it is shown.
        let p_approvals: Vec<&Box<Approval>> =
            pick!(persists, a => Effect::Persist(Record::Approval(a)));
        let e_approvals: Vec<&Box<Approval>> = pick!(rest, a => Effect::EmitApproval(a));
        if p_approvals != e_approvals {
            return Err(format!(
                "emitted requests {e_approvals:?} are not the persisted ones {p_approvals:?}"
            ));
        }
        self.batch_approvals = e_approvals.iter().map(|a| a.id.clone()).collect();
        self.batch_persisted = persists
            .iter()
            .filter_map(|e| match e {
                Effect::Persist(Record::Session(r)) => Some(r.id.clone()),
                _ => None,
            })
            .collect();
        let mut applied = true;
        if let Cause::Provider {
            id,
            run,
            cursor: Some(c),
            ..
        } = cause
        {
            applied = self.on_cursor(cause, id, *run, *c, effects)?;
        }
        // The session as it was before this batch (what an Ask is settled against).
        let before = cause
            .session()
            .and_then(|id| self.sessions.get(id))
            .map(|sm| {
                (
                    sm.status,
                    sm.terminating || sm.ending.is_some(),
                    sm.config.clone(),
                )
            });
        // The session's status before this batch (what an environment report is judged by),
        // and whether this is its spawning process reporting it started (then its agent runs
        // in its environment: made, whatever became of an earlier making).
        let pre_status = cause
            .session()
            .and_then(|id| self.sessions.get(id))
            .map(|sm| sm.status);
        let starts_agent = match cause {
            Cause::Provider {
                id,
                run,
                event: EventKind::Started,
                ..
            } => self.sessions.get(id).is_some_and(|sm| {
                sm.proc_run == Some(*run)
                    && matches!(
                        sm.status,
                        Status::Starting | Status::Stopping | Status::Failed
                    )
            }),
            _ => false,
        };
        if let Cause::Provider {
            id,
            run,
            event: EventKind::Exited | EventKind::SpawnFailed,
            ..
        } = cause
        {
            // The process is gone: no KILL is due any more, and it can be deleted.
            if let Some(sm) = self.sessions.get_mut(id) {
                if sm.kill_at.is_some_and(|(r, _)| r == *run) {
                    sm.kill_at = None;
                }
                if sm.proc_run == Some(*run) {
                    sm.proc_run = None;
                    sm.terminating = false;
                    sm.ending = None;
                }
            }
        }
        self.provider_activity_seen = false;
        let mut answers: Vec<&Approval> = Vec::new();
        let mut resolved: Vec<&Approval> = Vec::new();
        let mut refused_resolve = false;
        let mut asked_ready = false;
        for e in rest {
            match e {
                Effect::EmitStatus(ev) => self.on_status(cause, ev, &messages, store)?,
                Effect::EmitActivity(ev) => self.on_activity(cause, ev)?,
                // A stop the shutdown made: nobody waits for its reply.
                Effect::Reply { req, .. } if *req == paddock_core::NO_REPLY => {}
                Effect::Reply { req, result } => self.on_reply(cause, *req, result, store)?,
                Effect::ReplyShutdown { req, live } => {
                    let want = match cause {
                        Cause::Shutdown { req: r, .. } if r == req => self.shutdown.take(),
                        _ => None,
                    };
                    if want != Some((*req, *live)) {
                        return Err(format!(
                            "shutdown {req} answered on {cause:?} with {live} live sessions; the \
                             reference says {want:?} (at once, with the live sessions counted)"
                        ));
                    }
                }
                Effect::Spawn { id, run, spec } => self.on_spawn(cause, id, *run, spec, store)?,
                Effect::Write { id, text, .. } => {
                    same_session(cause, id)?;
                    self.check_write(id, text, &stored_messages)?;
                }
                Effect::AskReady { id, run } => {
                    same_session(cause, id)?;
                    asked_ready = true;
                    if !cause.ev(EventKind::Started) {
                        return Err(format!(
                            "{id}: AskReady for run {run} on {cause:?}: an agent is asked once, \
                             when it reports it started"
                        ));
                    }
                }
                Effect::CloseInput { id, run } => {
                    same_session(cause, id)?;
                    self.on_close_input(id, *run)?;
                }
                Effect::Forget(rec) => {
                    same_session(cause, &rec.id)?;
                    self.batch_forgotten.push(rec.id.clone());
                }
                Effect::Provision { id, config } => self.on_provision(cause, id, config)?,
                Effect::Notice(n) => same_session(cause, &n.session)?,
                // At start-up, a run the runner lists that is not the session's (adopted)
                // process is killed: started in a batch the crash lost, or its session ended.
                Effect::Signal {
                    id,
                    run,
                    signal: Signal::Kill,
                    ..
                } if cause.restore()
                    && self
                        .sessions
                        .get(id)
                        .is_none_or(|sm| sm.proc_run != Some(*run)) => {}
                Effect::Signal {
                    id, run, signal, ..
                } => {
                    same_session(cause, id)?;
                    self.on_signal(id, *run, *signal)?;
                }
                Effect::EmitApproval(a) => {
                    self.on_approval(cause, a)?;
                    if !a.is_pending() {
                        resolved.push(a);
                    }
                }
                Effect::Answer {
                    id,
                    run,
                    approval,
                    at_once,
                } => {
                    // Only what nothing stores (the policy's answers) goes out before the
                    // commit.
                    if *at_once == self.approvals.contains_key(&approval.id) {
                        return Err(format!(
                            "an Answer for {} ({}) with at_once={at_once}: only answers nothing \
                             stores go out before their batch commits",
                            approval.id, approval.resolved_by
                        ));
                    }
                    self.on_answer(cause, id, *run, approval)?;
                    answers.push(approval);
                }
                Effect::ReplyApproval { req, result } => {
                    refused_resolve = result.is_err();
                    self.on_reply_approval(cause, *req, result)?;
                }
                Effect::Persist(_) => unreachable!("persists come first"),
                // The driver sends no task, campaign or shutdown input.
                Effect::SpawnTask { .. }
                | Effect::SignalTask { .. }
                | Effect::EmitTaskStatus(_)
                | Effect::EmitTaskOutput(_)
                | Effect::ReplyTask { .. }
                | Effect::ReplyAddCampaign { .. }
                | Effect::ReplyRemoveCampaign { .. }
                | Effect::Container { .. }
                | Effect::ReplyContainer { .. } => {
                    return Err(format!("{cause:?} had an effect of no session: {e:?}"))
                }
            }
        }
        if refused_resolve && effects.len() != 1 {
            return Err(format!(
                "a refused Resolve changed something: {effects:?} (a refusal changes nothing)"
            ));
        }
        self.check_answers(cause, applied, before, &answers, &resolved)?;
        // The spawning process of a STARTING session reported it started: it is asked, once,
        // whether it is ready (else the session could only time out).
        if starts_agent && pre_status == Some(Status::Starting) && !asked_ready {
            return Err(format!(
                "{cause:?}: the started agent of a STARTING session was not asked whether it is \
                 ready (no AskReady)"
            ));
        }
        if starts_agent {
            if let Some(sm) = cause.session().and_then(|id| self.sessions.get_mut(id)) {
                sm.env = EnvState::Ready;
            }
        }
        self.check_environment(cause, pre_status, effects)?;
        if let Cause::Report { id, .. } = cause {
            // Recorded exactly when the session exists: the activity, and the session's row
            // (its last activity), nothing else.
            let recorded = effects
                .iter()
                .filter(|e| matches!(e, Effect::EmitActivity(_)))
                .count();
            let only = effects.iter().all(|e| {
                matches!(
                    e,
                    Effect::Persist(Record::Activity(_) | Record::Session(_))
                        | Effect::EmitActivity(_)
                )
            });
            if recorded != usize::from(self.sessions.contains_key(id)) || !only {
                return Err(format!(
                    "a report for {id} (known: {}) did {effects:?}",
                    self.sessions.contains_key(id)
                ));
            }
        }
        if cause.tick() {
            // Every due deadline fired: a due KILL was sent (or, the table ignoring it, dropped).
            for sm in self.sessions.values_mut() {
                if sm.kill_at.is_some_and(|(_, at)| at <= now) {
                    sm.kill_at = None;
                }
            }
        }
        self.end_batch(cause)
    }

    /// Every request a human (or expiry) resolved is answered to its agent exactly once; one
    /// the session cancelled only when a graceful stop tells the agent no; an Ask is settled at
    /// once (one Answer, nothing stored) exactly when the session's policy settles it or the
    /// session is stopping, and otherwise opens one request and makes the session WAITING.
    fn check_answers(
        &mut self,
        cause: &Cause,
        applied: bool,
        before: Option<(Status, bool, SessionConfig)>,
        answers: &[&Approval],
        resolved: &[&Approval],
    ) -> Result<(), String> {
        let graceful = cause.graceful_stop();
        for a in resolved {
            let n = answers.iter().filter(|x| x.id == a.id).count();
            let want = match a.state {
                ApprovalState::Cancelled => usize::from(graceful),
                _ => 1,
            };
            if n != want {
                return Err(format!(
                    "request {} ended {} ({}) on {cause:?} and its agent got {n} answers, not \
                     {want}",
                    a.id,
                    a.state.name(),
                    a.resolved_by
                ));
            }
            if a.state == ApprovalState::Cancelled {
                // Cancelled only when the session stops waiting for good: its turn, process or
                // life ended.
                let now = self.sessions.get(&a.session).map(|s| s.status);
                if matches!(now, Some(Status::Waiting | Status::Working)) {
                    return Err(format!(
                        "request {} was cancelled ({}) on {cause:?}, yet the session is still \
                         {now:?}",
                        a.id, a.answer
                    ));
                }
            }
        }
        let settled: Vec<&&Approval> = answers
            .iter()
            .filter(|x| !resolved.iter().any(|a| a.id == x.id))
            // An adopted agent is sent again the answers of its resolved requests (at least
            // once): each exactly as stored.
            .filter(|x| {
                !(cause.restore() && !x.is_pending() && self.approvals.get(&x.id) == Some(**x))
            })
            .collect();
        let Cause::Provider {
            event: EventKind::Ask,
            ask: Some(ask),
            id,
            ..
        } = cause
        else {
            if let Some(a) = settled.first() {
                return Err(format!(
                    "an Answer on {cause:?} for a request that was not resolved here: {a:?}"
                ));
            }
            return Ok(());
        };
        let opened = self.batch_approvals.contains(&ask.approval);
        if !applied {
            return Ok(()); // a replay: on_cursor checked it changed nothing
        }
        self.stats.asks += 1;
        let Some((status, terminating, config)) = before else {
            return Err(format!("an Ask applied for {id}, which clients never saw"));
        };
        // Requests open before this ask (the one it opened, if any, is in the set already).
        let open_before = self
            .sessions
            .get(id)
            .map_or(0, |sm| sm.open.len() - usize::from(opened));
        let (want, by): (Option<Option<bool>>, &str) = match status {
            // Too many open: told no at once.
            Status::Running | Status::Working | Status::Waiting
                if open_before >= paddock_core::approval::MAX_OPEN_REQUESTS =>
            {
                (Some(Some(false)), "paddock")
            }
            Status::Running | Status::Working | Status::Waiting => {
                (Some(policy_settles(&config, ask.kind, &ask.tool)), "policy")
            }
            // A stopping session tells a process that is still going no, at once.
            Status::Stopping if !terminating => (Some(Some(false)), "paddock"),
            _ => (None, ""), // ignored (the table), or a process being killed
        };
        let got_answer = settled.first().map(|a| a.allowed);
        let ok = match want {
            None => settled.is_empty() && !opened,
            Some(Some(allowed)) => {
                settled.len() == 1
                    && got_answer == Some(allowed)
                    && !opened
                    && settled[0].id == ask.approval
                    && settled[0].key == ask.key
                    && settled[0].resolved_by == by
            }
            Some(None) => settled.is_empty() && opened,
        };
        if !ok {
            return Err(format!(
                "{id} ({status}{}) got Ask {ask:?} under permissions {:?}: the reference says \
                 {}, the engine answered {got_answer:?} and {} a request",
                if terminating {
                    ", its process TERMed"
                } else {
                    ""
                },
                config.provider_config.get("permissions"),
                match want {
                    None => "nothing happens".to_string(),
                    Some(Some(a)) => format!("answered at once, allowed={a}"),
                    Some(None) => "a request for a human".to_string(),
                },
                if opened { "opened" } else { "did not open" }
            ));
        }
        if want.is_some_and(|w| w.is_some()) {
            self.stats.asks_settled += 1;
        }
        Ok(())
    }

    /// A request opened or resolved, as clients see it.
    fn on_approval(&mut self, cause: &Cause, a: &Approval) -> Result<(), String> {
        same_session(cause, &a.session)?;
        let now = self.now;
        let Some(sm) = self.sessions.get_mut(&a.session) else {
            return Err(format!("a request of a session never created: {a:?}"));
        };
        if a.is_pending() {
            let ok = match cause {
                Cause::Provider {
                    run,
                    event: EventKind::Ask,
                    ask: Some(ask),
                    ..
                } => {
                    a.id == ask.approval
                        && a.key == ask.key
                        && a.kind == ask.kind
                        && a.tool == ask.tool
                        && a.run == *run
                }
                _ => false,
            };
            if !ok || self.approvals.contains_key(&a.id) {
                return Err(format!(
                    "request {} opened on {cause:?} (it must be opened once, by its own Ask): \
                     {a:?}",
                    a.id
                ));
            }
            let expires = now.saturating_add(approval_timeout_ms(&sm.config));
            if a.created_at != ts(now) || a.expires_at != ts(expires) || a.turn != sm.open_turn {
                return Err(format!(
                    "request {} opened at {} expiring at {} in turn {:?}; the reference says \
                     {now}, {expires} (approval_timeout {:?}), turn {:?}",
                    a.id,
                    a.created_at.millis(),
                    a.expires_at.millis(),
                    a.turn,
                    sm.config.provider_config.get("approval_timeout"),
                    sm.open_turn
                ));
            }
            self.stats.approvals_opened += 1;
            sm.open.insert(a.id.clone(), a.expires_at.millis());
            self.approvals.insert(a.id.clone(), a.clone());
            return Ok(());
        }
        let Some(old) = self.approvals.get(&a.id) else {
            return Err(format!(
                "request {} resolved, but it was never open: {a:?}",
                a.id
            ));
        };
        if !old.is_pending() {
            return Err(format!(
                "request {} resolved twice: {} ({}) and now {} ({})",
                a.id,
                old.state.name(),
                old.resolved_by,
                a.state.name(),
                a.resolved_by
            ));
        }
        let same = old.session == a.session
            && old.run == a.run
            && old.key == a.key
            && old.kind == a.kind
            && old.created_at == a.created_at
            && old.expires_at == a.expires_at
            && old.turn == a.turn;
        if !same || a.resolved_at != Some(ts(now)) {
            return Err(format!(
                "request {} resolved as another one, or not now: {old:?} -> {a:?}",
                a.id
            ));
        }
        // The default decides a permission only; a question or client tool expires as no.
        let default_allow = approval_default_allow(&sm.config) && a.kind == AskKind::Permission;
        match a.state {
            ApprovalState::Approved | ApprovalState::Denied | ApprovalState::Answered => {
                let want = match cause {
                    Cause::Request {
                        req,
                        kind: ReqKind::Resolve,
                        ..
                    } => self
                        .pending
                        .get(req)
                        .and_then(|p| p.resolve.as_ref())
                        .filter(|r| r.approval == a.id && r.want.is_ok())
                        .map(|r| (decided(&r.decision), r.by.clone())),
                    _ => None,
                };
                if want != Some(((a.state, a.allowed), a.resolved_by.clone())) {
                    return Err(format!(
                        "request {} was {} (allowed={}, by {}) on {cause:?}; the resolve asked \
                         for {want:?}",
                        a.id,
                        a.state.name(),
                        a.allowed,
                        a.resolved_by
                    ));
                }
                self.stats.approvals_resolved += 1;
            }
            ApprovalState::Expired => {
                if !cause.tick() || a.expires_at > ts(now) || a.allowed != default_allow {
                    return Err(format!(
                        "request {} expired on {cause:?} at {now} (due {}), allowed={} (the \
                         session's default is allow={default_allow})",
                        a.id,
                        a.expires_at.millis(),
                        a.allowed
                    ));
                }
                self.stats.approvals_expired += 1;
            }
            ApprovalState::Cancelled => {
                if a.allowed
                    || cause.req(ReqKind::Resolve)
                    || cause.ev(EventKind::Ask)
                    || cause.req(ReqKind::Send)
                {
                    return Err(format!(
                        "request {} cancelled on {cause:?} (allowed={}): {a:?}",
                        a.id, a.allowed
                    ));
                }
                self.stats.approvals_cancelled += 1;
            }
            ApprovalState::Pending => unreachable!("resolved"),
        }
        sm.open.remove(&a.id);
        self.approvals.insert(a.id.clone(), a.clone());
        Ok(())
    }

    /// One answer to one agent: to the process that asked (the session's, not being killed),
    /// once per key, saying what the request's state says.
    fn on_answer(
        &mut self,
        cause: &Cause,
        id: &SessionId,
        run: RunId,
        a: &Approval,
    ) -> Result<(), String> {
        same_session(cause, id)?;
        let Some(sm) = self.sessions.get(id) else {
            return Err(format!("an Answer for a session never created: {a:?}"));
        };
        if &a.session != id || a.run != run || sm.proc_run != Some(run) || sm.terminating {
            return Err(format!(
                "an Answer for {} of run {} went to run {run} of {id} (the session's process is \
                 {:?}{}): an answer goes to the process that asked and to no other",
                a.key,
                a.run,
                sm.proc_run,
                if sm.terminating { ", being killed" } else { "" }
            ));
        }
        if cause.restore() && !a.is_pending() && self.approvals.get(&a.id) == Some(a) {
            // Sent again when an adopted agent is taken back (answers go out after their
            // resolution is stored, so a restart re-sends them: at least once), exactly as
            // stored (and checked when it was first sent, under the config of that time).
            if self.answered.insert(a.key.clone()) {
                self.stats.answers += 1;
            } else {
                self.stats.answers_repeated += 1;
            }
            return Ok(());
        }
        let allowed = match a.state {
            ApprovalState::Pending => {
                return Err(format!("an Answer for a request still open: {a:?}"))
            }
            ApprovalState::Approved | ApprovalState::Answered => true,
            ApprovalState::Denied | ApprovalState::Cancelled => false,
            ApprovalState::Expired => {
                approval_default_allow(&sm.config) && a.kind == AskKind::Permission
            }
        };
        if a.allowed != allowed {
            return Err(format!(
                "an Answer says allowed={} for a request {}: {a:?}",
                a.allowed,
                a.state.name()
            ));
        }
        if !self.answered.insert(a.key.clone()) {
            return Err(format!(
                "a second Answer for {} (request {}, run {run} of {id}): one answer per ask",
                a.key, a.id
            ));
        }
        self.stats.answers += 1;
        Ok(())
    }

    /// The reply to a `Resolve`: at once, what the reference said when it was made.
    fn on_reply_approval(
        &mut self,
        cause: &Cause,
        req: RequestId,
        result: &Result<Box<Approval>, Error>,
    ) -> Result<(), String> {
        let Some(p) = self.pending.remove(&req) else {
            return Err(format!(
                "a reply to resolve {req}, which is not waiting for one: {result:?}"
            ));
        };
        let Some(r) = p.resolve else {
            return Err(format!(
                "{:?} {req} for {} was answered as a resolve: {result:?}",
                p.kind, p.id
            ));
        };
        if !matches!(cause, Cause::Request { req: q, .. } if *q == req) {
            return Err(format!(
                "resolve {req} was not answered at once: {result:?}"
            ));
        }
        let what = format!(
            "resolve {req} of {} with {:?} (made while {:?})",
            r.approval, r.decision, p.pre
        );
        match (&r.want, result) {
            (Ok(()), Ok(a)) => {
                if self.approvals.get(&a.id) != Some(a) || a.id != r.approval {
                    return Err(format!(
                        "{what} was answered with {a:?}, not the request as stored and shown"
                    ));
                }
                self.stats.replies_ok += 1;
            }
            (Err(want), Err(e)) if e.code == *want => {
                self.stats.replies_err += 1;
                match want {
                    ErrorCode::ApprovalResolved => self.stats.resolves_late += 1,
                    ErrorCode::ApprovalNotFound => self.stats.resolves_unknown += 1,
                    _ => self.stats.resolves_wrong += 1,
                }
            }
            (want, got) => {
                return Err(format!(
                    "{what}: the reference says {want:?}, the engine {got:?}"
                ))
            }
        }
        Ok(())
    }

    /// `Provision`: only for a create that was just accepted, whose environment needs
    /// something made, with its configuration; once.
    fn on_provision(
        &mut self,
        cause: &Cause,
        id: &SessionId,
        config: &SessionConfig,
    ) -> Result<(), String> {
        same_session(cause, id)?;
        let Some(sm) = self.sessions.get(id) else {
            return Err(format!("Provision for a session never created: {id}"));
        };
        let created = matches!(
            cause,
            Cause::Request { req, kind: ReqKind::Create, .. }
                if self.pending.get(req).is_some_and(|p| p.config.is_some())
        );
        if !created
            || sm.status != Status::Created
            || sm.env != EnvState::Creating
            || !sm.config.env.needs_provisioning()
            || *config != sm.config
            || self.batch_provisions.contains(id)
        {
            return Err(format!(
                "Provision for {id} ({}, environment {:?}) on {cause:?} with config {config:?}: \
                 only a create whose environment needs making asks for it, once, with the \
                 session's config {:?}",
                sm.status, sm.env, sm.config
            ));
        }
        self.batch_provisions.push(id.clone());
        Ok(())
    }

    /// The end of a batch, for environments: a report on one being made starts the agent
    /// (CREATED → STARTING, one Spawn, the create still waiting for the agent) or refuses the
    /// create (answered OBEY-2005, nothing of the session left, what was made forgotten); a
    /// report on anything else changes nothing. What a stop or the start-up timeout did to a
    /// making (checked as it happened) left the status it must. Every session removed is
    /// forgotten (`Forget`: its environment, its conversation), once, and only those.
    fn check_environment(
        &mut self,
        cause: &Cause,
        pre: Option<Status>,
        effects: &[Effect],
    ) -> Result<(), String> {
        if let Cause::Environment { id, ok } = cause {
            let now = self.sessions.get(id).map(|sm| sm.status);
            if pre != Some(Status::Created) {
                if !effects.is_empty() {
                    return Err(format!(
                        "a late report on {id}'s environment (ok={ok}; the session is {pre:?}) \
                         changed something: {effects:?}"
                    ));
                }
                self.stats.env_reports_ignored += 1;
            } else if *ok {
                if now != Some(Status::Starting) || self.batch_spawns != [id.clone()] {
                    return Err(format!(
                        "{id}'s environment was made, yet the session is {now:?} with spawns \
                         {:?} (its agent starts now, once)",
                        self.batch_spawns
                    ));
                }
                self.stats.envs_made += 1;
            } else {
                if now.is_some() || self.batch_removed != [id.clone()] {
                    return Err(format!(
                        "{id}'s environment could not be made, yet the session is {now:?} \
                         (its create must be refused with OBEY-2005 and nothing of it stay)"
                    ));
                }
                self.stats.envs_refused += 1;
            }
        }
        for (id, want, why) in std::mem::take(&mut self.batch_expect) {
            let now = self.sessions.get(&id).map(|sm| sm.status);
            if now != Some(want) {
                return Err(format!(
                    "{id} is {now:?} after {cause:?}, not {want}: {why}"
                ));
            }
        }
        let mut removed = self.batch_removed.clone();
        let mut forgotten = self.batch_forgotten.clone();
        removed.sort();
        forgotten.sort();
        if removed != forgotten {
            return Err(format!(
                "{cause:?} removed sessions {removed:?} and forgot {forgotten:?}: what a \
                 session kept outside the store (its environment) is forgotten exactly when it \
                 is removed"
            ));
        }
        Ok(())
    }

    /// TERM starts the kill grace period of a process; KILL ends it.
    /// A graceful end's first step: only for the session's own process, not yet ending or
    /// TERMed, and only while it stops.
    fn on_close_input(&mut self, id: &SessionId, run: RunId) -> Result<(), String> {
        let Some(sm) = self.sessions.get_mut(id) else {
            return Err(format!("CloseInput for a session never created: {id}"));
        };
        if sm.proc_run != Some(run) || sm.terminating || sm.ending.is_some() {
            return Err(format!(
                "{id}: CloseInput to run {run}, but its process is {:?}{}{}",
                sm.proc_run,
                if sm.terminating { " (TERMed)" } else { "" },
                if sm.ending.is_some() {
                    " (closed already)"
                } else {
                    ""
                }
            ));
        }
        if sm.after_stop != Some(Then::Stop) {
            return Err(format!(
                "{id}: CloseInput to run {run} without a stop under way ({:?})",
                sm.after_stop
            ));
        }
        sm.ending = Some(self.now.saturating_add(self.limits.end_grace.millis()));
        Ok(())
    }

    fn on_signal(&mut self, id: &SessionId, run: RunId, signal: Signal) -> Result<(), String> {
        let Some(sm) = self.sessions.get_mut(id) else {
            return Err(format!("a signal for a session never created: {id}"));
        };
        match signal {
            Signal::Term => {
                if sm.proc_run != Some(run) || sm.terminating {
                    return Err(format!(
                        "{id}: TERM to run {run}, but its process is {:?}{}",
                        sm.proc_run,
                        if sm.terminating {
                            " (TERMed already)"
                        } else {
                            ""
                        }
                    ));
                }
                sm.terminating = true;
                sm.ending = None;
                sm.kill_at = Some((
                    run,
                    self.now.saturating_add(self.limits.kill_grace.millis()),
                ));
            }
            Signal::Kill => {
                if sm.kill_at.is_none_or(|(r, at)| r != run || at > self.now) {
                    return Err(format!(
                        "{id}: KILL to run {run} at {}, but its kill deadline is {:?}",
                        self.now, sm.kill_at
                    ));
                }
                sm.kill_at = None;
            }
            Signal::Hup => {
                return Err(format!(
                    "{id}: HUP to run {run}: a session's process is only ever TERMed and KILLed"
                ));
            }
        }
        Ok(())
    }

    /// An output event at cursor `c` of `run`: applied exactly once. One the session has
    /// applied already (replayed after a restart) changes nothing; any other is applied, and
    /// the cursor is stored with what it did (in the same transaction).
    fn on_cursor(
        &mut self,
        cause: &Cause,
        id: &SessionId,
        run: RunId,
        c: u64,
        effects: &[Effect],
    ) -> Result<bool, String> {
        let Some(sm) = self.sessions.get_mut(id) else {
            return Err(format!(
                "output of run {run} for {id}, which clients never saw"
            ));
        };
        let last = match sm.applied {
            Some((r, n)) if r == run => n,
            _ => 0,
        };
        if c <= last {
            if !effects.is_empty() {
                return Err(format!(
                    "{id}: output at cursor {c} of run {run} was applied already (up to {last}); \
                     replayed after a restart, it was applied again: {effects:?}"
                ));
            }
            self.stats.replays_ignored += 1;
            return Ok(false);
        }
        let stored = effects.iter().find_map(|e| match e {
            Effect::Persist(Record::Session(r)) if &r.id == id => Some(r),
            _ => None,
        });
        match stored {
            Some(r) if r.run == Some(run) && r.provider_cursor == c => {}
            other => {
                return Err(format!(
                    "{id}: output at cursor {c} of run {run} (applied up to {last}) was not \
                     applied, or its cursor not stored with it: the record stored is {:?}",
                    other.map(|r| (r.run, r.provider_cursor))
                ))
            }
        }
        sm.applied = Some((run, c));
        if let Cause::Provider {
            session_ref: Some(r),
            ..
        } = cause
        {
            // A conversation id is kept (and resumed) unless the session has ended.
            if !sm.status.is_terminal() {
                sm.provider_session = Some(r.clone());
            }
        }
        Ok(true)
    }

    fn on_status(
        &mut self,
        cause: &Cause,
        ev: &StatusEvent,
        messages: &[(&SessionId, u64)],
        store: &Store,
    ) -> Result<(), String> {
        same_session(cause, &ev.session)?;
        let id = &ev.session;
        if ev.at != ts(self.now) {
            return Err(format!(
                "status event at {} while the time is {}: {ev:?}",
                ev.at.millis(),
                self.now
            ));
        }
        let Some(prev) = ev.previous else {
            // The first event of a session: its creation.
            let config: Option<SessionConfig> = match cause {
                Cause::Request {
                    req,
                    kind: ReqKind::Create,
                    ..
                } => self.pending.get(req).and_then(|p| p.config.clone()),
                _ => None,
            };
            let Some(config) = config else {
                return Err(format!(
                    "status event {ev:?} has no previous status, but {cause:?} creates nothing"
                ));
            };
            if self.sessions.contains_key(id) || ev.seq != 1 || ev.new != Status::Created {
                return Err(format!("a second or malformed creation event: {ev:?}"));
            }
            let env = if config.env.needs_provisioning() {
                EnvState::Creating
            } else {
                EnvState::Ready
            };
            self.sessions.insert(
                id.clone(),
                SessionModel {
                    config,
                    status: Status::Created,
                    status_seq: 1,
                    activity_seq: 0,
                    tokens_in: 0,
                    tokens_out: 0,
                    // A create that waits for its environment counts as its first start
                    // already (`restart_count` is 0 until a restart, whether or not the making
                    // was given up).
                    starts: u32::from(env == EnvState::Creating),
                    turns: 0,
                    turns_ended: 0,
                    open_turn: None,
                    since: ev.at.millis(),
                    started_at: None,
                    restart_asked: false,
                    after_stop: None,
                    adopted: false,
                    applied: None,
                    provider_session: None,
                    closed: false,
                    created: ev.at.millis(),
                    kill_at: None,
                    proc_run: None,
                    terminating: false,
                    ending: None,
                    open: BTreeMap::new(),
                    env,
                },
            );
            return Ok(());
        };
        let Some(sm) = self.sessions.get_mut(id) else {
            return Err(format!("status event for a session never created: {ev:?}"));
        };
        if ev.seq != sm.status_seq + 1 {
            return Err(format!(
                "status seq of {id} jumps from {} to {}: {ev:?}",
                sm.status_seq, ev.seq
            ));
        }
        if prev != sm.status {
            return Err(format!(
                "status event of {id} says {prev} -> {}, but the last status seen was {}",
                ev.new, sm.status
            ));
        }
        allowed(sm, prev, ev.new, cause).map_err(|why| {
            format!(
                "illegal transition of {id}: {prev} -> {} on {cause:?} ({why}); message {:?}",
                ev.new, ev.message
            )
        })?;
        if cause.tick() && ev.new == Status::Failed {
            // A deadline fired: not before it was due.
            let due = match prev {
                Status::Created | Status::Starting => {
                    Some(sm.since + self.limits.startup_timeout.millis())
                }
                // No timeout configured (0): no session deadline exists at all.
                _ => sm
                    .started_at
                    .filter(|_| sm.config.timeout_ms > 0)
                    .map(|t| t + sm.config.timeout_ms),
            };
            if due.is_none_or(|due| self.now < due) {
                return Err(format!(
                    "{id} failed on a deadline at {} that was due at {due:?} ({prev} since {}, \
                     started at {:?})",
                    self.now, sm.since, sm.started_at
                ));
            }
        }
        if ev.new == Status::Failed {
            // Every failure says why, with the code its cause implies.
            use EventKind as E;
            let want = match cause {
                Cause::Tick if prev == Status::Starting => Some(ErrorCode::CreationFailed),
                // Its environment was not made in time.
                Cause::Tick if prev == Status::Created => Some(ErrorCode::SandboxInitFailed),
                Cause::Tick => Some(ErrorCode::Timeout),
                Cause::Restore => Some(ErrorCode::ConnectionLost),
                c if c.ev(E::SpawnFailed) => Some(ErrorCode::CreationFailed),
                // It exited before it was ready: a start that failed.
                c if c.ev(E::Exited) && prev == Status::Starting => Some(ErrorCode::CreationFailed),
                c if c.ev(E::Exited) => Some(ErrorCode::ProviderCrashed),
                c if c.ev(E::DeliveryFailed) => Some(ErrorCode::DeliveryFailed),
                c if c.ev(E::Activity) || c.ev(E::TurnEnd) => Some(ErrorCode::BudgetExceeded),
                _ => None,
            };
            let got = store
                .sessions
                .get(id)
                .and_then(|r| r.error.as_ref())
                .map(|e| e.code);
            if want.is_none() || got != want {
                return Err(format!(
                    "{id} went {prev} -> FAILED on {cause:?} with error {got:?}, not {want:?}"
                ));
            }
        }
        if prev == Status::Starting && ev.new == Status::Running {
            sm.started_at = Some(ev.at.millis());
        }
        if prev == Status::Created {
            match ev.new {
                // Made (or nothing to make): the agent is spawned in it.
                Status::Starting => sm.env = EnvState::Ready,
                // Its making was given up: a stop, the start-up timeout, a daemon restart.
                _ => {
                    sm.env = EnvState::Failed;
                    if cause.tick() {
                        self.stats.envs_timed_out += 1;
                    } else if cause.restore() {
                        self.stats.envs_lost += 1;
                    } else {
                        self.stats.envs_stopped += 1;
                        if matches!(cause, Cause::Shutdown { .. }) {
                            self.stats.envs_shutdown += 1;
                        }
                    }
                }
            }
        }
        sm.status = ev.new;
        sm.status_seq = ev.seq;
        sm.since = ev.at.millis();
        match ev.new {
            Status::Starting => {
                if !(prev == Status::Created && cause.env(true)) {
                    sm.starts += 1;
                }
                sm.after_stop = None;
                sm.restart_asked = false;
            }
            // Back to work once the human answered: the same turn goes on.
            Status::Working if prev == Status::Waiting && sm.open_turn.is_none() => {
                return Err(format!("{id} went WAITING -> WORKING with no turn open"));
            }
            Status::Working if prev == Status::Waiting => {}
            Status::Working => {
                if let Some(t) = sm.open_turn {
                    return Err(format!(
                        "{id} starts a turn while turn {t} is still open: two turns at once"
                    ));
                }
                sm.turns += 1;
                sm.open_turn = Some(sm.turns);
                if !messages.contains(&(id, sm.turns)) {
                    return Err(format!(
                        "{id} went WORKING on turn {} without storing its user message",
                        sm.turns
                    ));
                }
            }
            _ => {}
        }
        if ev.new.is_terminal() {
            sm.after_stop = None;
        }
        if !matches!(ev.new, Status::Working | Status::Waiting | Status::Stopping) {
            if let Some(t) = sm.open_turn {
                return Err(format!(
                    "{id} went {} with turn {t} still open (its stream never ended)",
                    ev.new
                ));
            }
        }
        Ok(())
    }

    fn on_activity(&mut self, cause: &Cause, ev: &ActivityEvent) -> Result<(), String> {
        same_session(cause, &ev.session)?;
        let id = &ev.session;
        let Some(sm) = self.sessions.get_mut(id) else {
            return Err(format!("activity for a session never created: {ev:?}"));
        };
        if ev.seq != sm.activity_seq + 1 {
            return Err(format!(
                "activity seq of {id} jumps from {} to {}",
                sm.activity_seq, ev.seq
            ));
        }
        sm.activity_seq = ev.seq;
        if ev.at != ts(self.now) {
            return Err(format!(
                "activity at {} while the time is {}: {ev:?}",
                ev.at.millis(),
                self.now
            ));
        }
        // An agent's report: its session's activity, numbered with its own, in whatever state
        // the session is, and nothing more: its tokens are not counted and it ends no turn.
        if let Cause::Report { activity: fed, .. } = cause {
            if std::mem::replace(&mut self.provider_activity_seen, true) {
                return Err(format!("{id}: one report was recorded twice: {ev:?}"));
            }
            if &ev.activity != fed {
                return Err(format!("{id}: the report {fed:?} was recorded as {ev:?}"));
            }
            if ev.ends_turn || ev.turn != sm.open_turn {
                return Err(format!(
                    "{id}: a report is of the open turn ({:?}) and ends none: {ev:?}",
                    sm.open_turn
                ));
            }
            self.stats.reports_recorded += 1;
            return Ok(());
        }
        // The engine's own notes about requests for a human (opened, answered, expired): a
        // STATUS line without tokens naming a request opened or resolved in this batch.
        let note = {
            let a = &ev.activity;
            a.kind() == ActivityKind::Status
                && !ev.ends_turn
                && a.tokens_input == 0
                && a.tokens_output == 0
                && self.batch_approvals.contains(&a.tool_call_id)
                && (cause.ev(EventKind::Ask) || cause.req(ReqKind::Resolve) || cause.tick())
        };
        if cause.tick() && !note {
            // A deadline interrupted the turn: the stop's grace period, or the session timeout.
            let due = match sm.status {
                Status::Stopping => Some(sm.since + self.limits.stop_grace.millis()),
                // No timeout configured (0): no session deadline exists at all.
                _ => sm
                    .started_at
                    .filter(|_| sm.config.timeout_ms > 0)
                    .map(|t| t + sm.config.timeout_ms),
            };
            if due.is_none_or(|due| self.now < due) {
                return Err(format!(
                    "{id}: a deadline interrupted turn {:?} at {} while it was due at {due:?} \
                     ({} since {})",
                    ev.turn, self.now, sm.status, sm.since
                ));
            }
        }
        if !matches!(
            sm.status,
            Status::Running | Status::Working | Status::Waiting | Status::Stopping
        ) {
            return Err(format!(
                "{id} recorded an activity while {}: {ev:?}",
                sm.status
            ));
        }
        let a = &ev.activity;
        let delta = a.tokens_input.saturating_add(a.tokens_output);
        let max = sm.config.max_tokens;
        if max > 0 && sm.tokens() >= max && delta > 0 {
            return Err(format!(
                "budget: {id} had already used {} of its {max} tokens, and still {delta} more \
                 were counted (seq {}, {} in {:?} while {}): tokens may pass the budget only by \
                 the event that crossed it",
                sm.tokens(),
                ev.seq,
                a.kind().name(),
                ev.turn,
                sm.status
            ));
        }
        sm.tokens_in = sm.tokens_in.saturating_add(a.tokens_input);
        sm.tokens_out = sm.tokens_out.saturating_add(a.tokens_output);
        let from_provider = match cause {
            Cause::Provider {
                activity: Some(fed),
                ..
            } if !self.provider_activity_seen => {
                self.provider_activity_seen = true;
                if fed != a {
                    return Err(format!(
                        "{id} recorded {a:?}, but the provider said {fed:?}"
                    ));
                }
                true
            }
            _ => false,
        };
        let interruption = a.kind() == ActivityKind::Error && ev.ends_turn && delta == 0;
        if !from_provider
            && interruption
            && !(cause.forced_stop()
                || cause.req(ReqKind::Restart)
                || cause.tick()
                || cause.ev(EventKind::Exited)
                || cause.ev(EventKind::Activity)
                || cause.ev(EventKind::DeliveryFailed)
                || cause.restore())
        {
            return Err(format!(
                "{id}: {cause:?} interrupted turn {:?} (only a forced stop, a restart, a deadline,                  the budget, an exit or a daemon restart ends a turn; a graceful stop waits for                  it): {ev:?}",
                ev.turn
            ));
        }
        if !(from_provider || interruption || note) {
            return Err(format!(
                "{id}: the engine recorded an activity of its own that neither ends a turn with \
                 an ERROR nor notes a request for a human: {ev:?}"
            ));
        }
        if cause.restore() {
            // A restart ends a turn the old daemon left open: with OBEY-2032 if its process
            // was lost; an adopted one only if the session was stopping (the stop goes on).
            let lost = ErrorCode::ConnectionLost.to_string();
            if !sm.adopted && !a.content.starts_with(&lost) {
                return Err(format!(
                    "{id}: a restart that lost the process ended turn {:?} without saying \
                     {lost}: {ev:?}",
                    ev.turn
                ));
            }
            if sm.adopted && sm.status != Status::Stopping {
                return Err(format!(
                    "{id}: an adopted {} session had turn {:?} interrupted: {ev:?}",
                    sm.status, ev.turn
                ));
            }
            if !sm.adopted {
                self.stats.turns_cut += 1;
            }
        }
        match ev.turn {
            Some(t) => {
                if sm.open_turn != Some(t) {
                    return Err(format!(
                        "{id}: an activity of turn {t} while the open turn is {:?} (a stream \
                         that ended got more, or one that never started did): {ev:?}",
                        sm.open_turn
                    ));
                }
                if ev.ends_turn {
                    if !a.kind().ends_turn() {
                        return Err(format!("{id}: a {} ends turn {t}", a.kind().name()));
                    }
                    sm.open_turn = None;
                    sm.turns_ended += 1;
                    if a.kind() == ActivityKind::Completion {
                        self.stats.turns_completed += 1;
                    } else {
                        self.stats.turns_errored += 1;
                    }
                } else if a.kind().ends_turn() {
                    return Err(format!(
                        "{id}: a {} inside turn {t} does not end it",
                        a.kind().name()
                    ));
                }
            }
            None => {
                if ev.ends_turn {
                    return Err(format!("{id}: an activity outside any turn ends a turn"));
                }
                if let Some(t) = sm.open_turn {
                    return Err(format!(
                        "{id}: an activity outside any turn while turn {t} is open"
                    ));
                }
            }
        }
        Ok(())
    }

    fn on_reply(
        &mut self,
        cause: &Cause,
        req: RequestId,
        result: &Result<Box<SessionRecord>, Error>,
        store: &Store,
    ) -> Result<(), String> {
        let Some(p) = self.pending.remove(&req) else {
            return Err(format!(
                "a reply to request {req}, which is not waiting for one (never made, already \
                 answered, or lost in a crash): {result:?}"
            ));
        };
        match result {
            Ok(_) => self.stats.replies_ok += 1,
            Err(_) => self.stats.replies_err += 1,
        }
        let immediate = matches!(cause, Cause::Request { req: r, .. } if *r == req);
        let what = format!("{:?} {req} for {} (made while {:?})", p.kind, p.id, p.pre);
        if p.kind == ReqKind::Resolve {
            return Err(format!(
                "{what} was answered as a session request: {result:?}"
            ));
        }
        if p.kind == ReqKind::Delete {
            return self.on_delete_reply(&p, immediate, result, store, &what);
        }
        if let ReqKind::AttachRefused(want) = p.kind {
            return match result {
                Err(e) if immediate && e.code == want => Ok(()),
                _ => Err(format!("{what}: expected {want} at once; got {result:?}")),
            };
        }
        if p.kind == ReqKind::Attached {
            // The record itself is checked against the committed one below.
            if !immediate || result.is_err() {
                return Err(format!(
                    "{what}: a live session is joined at once as it is; got {result:?}"
                ));
            }
        }
        if let Ok(rec) = result {
            if rec.id != p.id {
                return Err(format!("{what} was answered with the record of {}", rec.id));
            }
            match store.sessions.get(&rec.id) {
                Some(stored) if *stored == **rec => {}
                Some(stored) => {
                    return Err(format!(
                        "{what} was answered with a record that is not the committed one: {}",
                        diff(stored, rec)
                    ))
                }
                None => return Err(format!("{what} was answered before its session was stored")),
            }
        }
        let code = result.as_ref().err().map(|e| e.code);
        let now = self.sessions.get(&p.id);
        let now_status = now.map(|s| s.status);
        let bad = |why: &str| Err(format!("{what}: {why}; got {result:?}"));
        let expect_now = |want: ErrorCode| -> Result<(), String> {
            if !immediate {
                return bad("a refusal must come at once");
            }
            if code != Some(want) {
                return bad(&format!("expected {want}"));
            }
            Ok(())
        };
        if p.pre.is_none() && p.kind != ReqKind::Create {
            return expect_now(ErrorCode::SessionNotFound);
        }
        match p.kind {
            ReqKind::Resolve | ReqKind::Delete | ReqKind::AttachRefused(_) => {
                unreachable!("answered above")
            }
            ReqKind::Attached => Ok(()),
            ReqKind::Create if p.refuse_create => expect_now(ErrorCode::CreationFailed),
            ReqKind::Create | ReqKind::Restart if p.pre == Some(Status::Stopping) => {
                expect_now(ErrorCode::WrongState)
            }
            // Nothing to restart while the environment is being made.
            ReqKind::Restart if p.pre == Some(Status::Created) => expect_now(ErrorCode::WrongState),
            ReqKind::Create | ReqKind::Restart => {
                if immediate {
                    return bad("a start is answered when the agent is ready, not at once");
                }
                match result {
                    Ok(rec) => {
                        if !matches!(rec.status, Status::Running | Status::Working)
                            || now_status != Some(rec.status)
                        {
                            return bad(&format!("started, but the session is {now_status:?}"));
                        }
                    }
                    Err(e) if e.code == ErrorCode::WrongState => {
                        if !matches!(now_status, Some(Status::Stopping | Status::Stopped)) {
                            return bad("superseded by a stop, but no stop is under way");
                        }
                    }
                    // Refused means nothing written: a create whose provider could not be
                    // started at all, or exited before it was ready, leaves no session.
                    Err(e)
                        if p.kind == ReqKind::Create
                            && e.code == ErrorCode::CreationFailed
                            && (cause.ev(EventKind::SpawnFailed)
                                || cause.ev(EventKind::Exited))
                            && !store.sessions.contains_key(&p.id) =>
                    {
                        self.sessions.remove(&p.id);
                        self.approvals.retain(|_, a| a.session != p.id);
                        self.stats.creates_discarded += 1;
                        self.batch_removed.push(p.id.clone());
                    }
                    // ... and so does one whose environment could not be made.
                    Err(e)
                        if p.kind == ReqKind::Create
                            && e.code == ErrorCode::SandboxInitFailed
                            && cause.env(false)
                            && now_status == Some(Status::Created)
                            && !store.sessions.contains_key(&p.id) =>
                    {
                        self.sessions.remove(&p.id);
                        self.approvals.retain(|_, a| a.session != p.id);
                        self.stats.creates_discarded += 1;
                        self.batch_removed.push(p.id.clone());
                    }
                    // A stop while its environment was being made: the create is refused,
                    // and the session ends STOPPED (checked once the batch is done).
                    Err(e)
                        if p.kind == ReqKind::Create
                            && e.code == ErrorCode::CreationFailed
                            && cause.stop()
                            && now_status == Some(Status::Created) =>
                    {
                        self.batch_expect.push((
                            p.id.clone(),
                            Status::Stopped,
                            "a stop while the environment is made ends the session STOPPED",
                        ));
                    }
                    // A restart that waited for the old process of an ended session when the
                    // daemon shut down: refused, so no agent starts after the shutdown; the
                    // session stays as it ended.
                    Err(e)
                        if p.kind == ReqKind::Restart
                            && e.code == ErrorCode::ShuttingDown
                            && matches!(cause, Cause::Shutdown { .. })
                            && now_status.is_some_and(Status::is_terminal) =>
                    {
                        if let Some(sm) = self.sessions.get_mut(&p.id) {
                            sm.restart_asked = false;
                        }
                    }
                    Err(e) => {
                        let stored = store.sessions.get(&p.id).and_then(|r| r.error.as_ref());
                        if now_status != Some(Status::Failed) || stored != Some(e) {
                            return bad(&format!(
                                "a failed start must leave the session FAILED with that error \
                                 (it is {now_status:?} with {stored:?})"
                            ));
                        }
                    }
                }
                Ok(())
            }
            ReqKind::Send => {
                let pre = p.pre.expect("known");
                if !immediate {
                    return bad("SendMessage is answered at once");
                }
                if pre != Status::Running {
                    return expect_now(ErrorCode::WrongState);
                }
                if p.exhausted {
                    return expect_now(ErrorCode::BudgetExceeded);
                }
                match result {
                    Ok(rec)
                        if rec.status == Status::Working
                            && now.and_then(|s| s.open_turn) == Some(rec.turns) =>
                    {
                        Ok(())
                    }
                    _ => bad("a message to an idle session within budget starts a turn"),
                }
            }
            ReqKind::StopGraceful | ReqKind::StopForced => {
                let pre = p.pre.expect("known");
                if pre.is_terminal() {
                    return expect_now(ErrorCode::AlreadyStopped);
                }
                let ok = match result {
                    Ok(rec) => rec.status == Status::Stopped,
                    Err(e) => e.code == ErrorCode::GracefulStopTimedOut,
                };
                if !ok || now_status != Some(Status::Stopped) {
                    return bad(&format!(
                        "a stop is answered when the session is STOPPED (it is {now_status:?})"
                    ));
                }
                Ok(())
            }
        }
    }

    /// DeleteSession: an ended session without a process is forgotten (by the engine, the
    /// store and so by every client); any other is refused at once (OBEY-2010 unknown, else
    /// OBEY-2011), changing nothing.
    fn on_delete_reply(
        &mut self,
        p: &Pending,
        immediate: bool,
        result: &Result<Box<SessionRecord>, Error>,
        store: &Store,
        what: &str,
    ) -> Result<(), String> {
        let bad = |why: &str| Err(format!("{what}: {why}; got {result:?}"));
        if !immediate {
            return bad("a delete is answered at once");
        }
        let Some(pre) = p.pre else {
            return match result {
                Err(e) if e.code == ErrorCode::SessionNotFound => Ok(()),
                _ => bad("expected OBEY-2010"),
            };
        };
        let deletable = pre.is_terminal() && !p.had_process;
        match result {
            Ok(rec) if deletable => {
                if rec.id != p.id || !rec.status.is_terminal() || rec.run.is_some() {
                    return bad("the reply is not the ended session's record");
                }
                let rows_left = store.sessions.contains_key(&p.id)
                    || store.approvals.values().any(|a| a.session == p.id);
                if rows_left {
                    return bad("the store still holds rows of the deleted session");
                }
                self.sessions.remove(&p.id);
                self.approvals.retain(|_, a| a.session != p.id);
                self.stats.deleted += 1;
                self.batch_removed.push(p.id.clone());
                Ok(())
            }
            Err(e) if !deletable && e.code == ErrorCode::WrongState => {
                self.stats.deletes_refused += 1;
                Ok(())
            }
            _ => bad(&format!(
                "the session was {pre}{}, so the delete must {}",
                if p.had_process {
                    " with its process still going away"
                } else {
                    ""
                },
                if deletable {
                    "succeed"
                } else {
                    "be refused with OBEY-2011"
                }
            )),
        }
    }

    fn on_spawn(
        &mut self,
        cause: &Cause,
        id: &SessionId,
        run: RunId,
        spec: &SpawnSpec,
        store: &Store,
    ) -> Result<(), String> {
        same_session(cause, id)?;
        let Some(sm) = self.sessions.get_mut(id) else {
            return Err(format!("Spawn for a session never created: {id}"));
        };
        if let Some(old) = sm.proc_run {
            return Err(format!(
                "Spawn of run {run} for {id} while its run {old} is not gone: two processes"
            ));
        }
        sm.proc_run = Some(run);
        self.batch_spawns.push(id.clone());
        let sm = &self.sessions[id];
        if sm.env == EnvState::Creating {
            return Err(format!("Spawn for {id} before its environment was made"));
        }
        if sm.status != Status::Starting {
            return Err(format!("Spawn for {id} while it is {}", sm.status));
        }
        if spec.config != sm.config {
            return Err(format!(
                "Spawn for {id} with config {:?}; the session's is {:?}",
                spec.config, sm.config
            ));
        }
        if spec.restart_count + 1 != sm.starts {
            return Err(format!(
                "Spawn for {id} says restart #{}, but this is start #{}",
                spec.restart_count, sm.starts
            ));
        }
        let stored = store
            .sessions
            .get(id)
            .and_then(|r| r.provider_session.clone());
        if spec.resume != stored || spec.resume != sm.provider_session {
            return Err(format!(
                "Spawn for {id} resumes {:?}, but the stored conversation is {stored:?} and the \
                 last one its runs reported {:?}",
                spec.resume, sm.provider_session
            ));
        }
        Ok(())
    }

    fn end_batch(&mut self, cause: &Cause) -> Result<(), String> {
        let Cause::Request { req, id, kind } = cause else {
            return Ok(());
        };
        if let Some(p) = self.pending.get(req) {
            let must_now = matches!(p.kind, ReqKind::Send | ReqKind::Resolve | ReqKind::Delete)
                || (p.pre.is_none() && p.kind != ReqKind::Create)
                || p.refuse_create
                || (p.kind == ReqKind::Restart
                    && matches!(p.pre, Some(Status::Stopping | Status::Created)))
                || (matches!(p.kind, ReqKind::StopGraceful | ReqKind::StopForced)
                    && p.pre.is_some_and(Status::is_terminal));
            if must_now {
                return Err(format!(
                    "{kind:?} {req} for {id} (made while {:?}) was not answered at once",
                    p.pre
                ));
            }
            if p.kind == ReqKind::Create {
                // A session whose environment must be made waits for it, CREATED, having
                // asked for it once; any other is spawned at once.
                let making = p
                    .config
                    .as_ref()
                    .is_some_and(|c| c.env.needs_provisioning());
                let want = if making {
                    Status::Created
                } else {
                    Status::Starting
                };
                if self.status(id) != Some(want) || self.batch_provisions.contains(id) != making {
                    return Err(format!(
                        "an accepted create of {id} left it {:?}, not {want}, with Provisions \
                         {:?} (environment {:?})",
                        self.status(id),
                        self.batch_provisions,
                        p.config.as_ref().map(|c| &c.env)
                    ));
                }
            }
        }
        // An accepted forced stop or restart interrupts the turn (a refused one changes
        // nothing: a restart while a graceful stop waits for the turn leaves it open).
        let accepted = self
            .pending_pre
            .is_some_and(|pre| !pre.is_terminal() && pre != Status::Stopping)
            || (*kind == ReqKind::StopForced && self.pending_pre == Some(Status::Stopping));
        if accepted && matches!(kind, ReqKind::StopForced | ReqKind::Restart) {
            if let Some(t) = self.sessions.get(id).and_then(|s| s.open_turn) {
                return Err(format!(
                    "{kind:?} {req} left turn {t} of {id} open (a forced stop or restart \
                     interrupts the turn)"
                ));
            }
        }
        Ok(())
    }

    // ── whole-state checks ───────────────────────────────────────────────

    /// After every step: the engine's state, the store and what clients saw agree.
    pub fn check(&mut self, engine: &Engine, store: &Store, tick: bool) -> Result<(), String> {
        self.checks += 1;
        let sample = self.checks.is_multiple_of(16);
        if store.sessions.len() != self.sessions.len() {
            return Err(format!(
                "the store has {} sessions, the clients saw {}",
                store.sessions.len(),
                self.sessions.len()
            ));
        }
        // Which session a project's StartSession resumes (sunbeam): the core's rule over what
        // the store has must name the newest session made for the project that its client has
        // not closed, as the clients saw them.
        for project in crate::client::PROJECTS {
            let want = self.resumes(project);
            let got = paddock_core::session_to_resume(project, store.sessions.values());
            if got.map(|r| &r.id) != want {
                let seen: Vec<String> = store
                    .sessions
                    .values()
                    .filter(|r| r.project() == Some(project))
                    .map(|r| {
                        format!(
                            "{} (created {}, closed {})",
                            r.id,
                            r.created_at.millis(),
                            r.closed_by_client
                        )
                    })
                    .collect();
                return Err(format!(
                    "project {project} would resume {:?}; the clients expect {want:?}; the \
                     store has {seen:?}",
                    got.map(|r| &r.id)
                ));
            }
            if want.is_some() {
                self.stats.resumable_checked += 1;
            }
        }
        // The engine holds every session that is not settled; a settled one it may have let
        // go is the store's, exactly as the clients last saw it (nothing changes it until an
        // input names it and it is recalled).
        for (id, rec) in &store.sessions {
            if engine.session(id).is_some() {
                continue;
            }
            let open = store
                .open
                .iter()
                .any(|a| store.approvals.get(a).is_some_and(|a| &a.session == id));
            if !rec.is_settled() || open {
                return Err(format!(
                    "{id} ({}, pid {:?}, run {:?}, open requests: {open}) is only in the store: \
                     the engine let go of a session that was not settled",
                    rec.status, rec.pid, rec.run
                ));
            }
            if self.sessions.get(id).map(|sm| sm.status) != Some(rec.status) {
                return Err(format!(
                    "{id}: the store says {}, the clients saw {:?}",
                    rec.status,
                    self.sessions.get(id).map(|sm| sm.status)
                ));
            }
        }
        for s in engine.sessions() {
            let rec = &s.record;
            let id = &rec.id;
            let Some(stored) = store.sessions.get(id) else {
                return Err(format!("{id} is in the engine but was never stored"));
            };
            // A configuration changes only with a persisted restart, and a divergence never
            // heals: it is compared whenever the record was written, and on a sample of steps
            // (comparing every config every step was most of the sweep's time).
            if stored.closed_by_client != self.sessions.get(id).is_some_and(|sm| sm.closed) {
                return Err(format!(
                    "{id}: the store says closed_by_client={}, the clients closed it: {}",
                    stored.closed_by_client, !stored.closed_by_client
                ));
            }
            let full = sample || self.batch_persisted.contains(id);
            if !same_record(stored, rec, full) {
                return Err(format!(
                    "{id}: the engine's record differs from the committed one (a change that was \
                     never persisted): {}",
                    diff(stored, rec)
                ));
            }
            let Some(sm) = self.sessions.get(id) else {
                return Err(format!("{id} is in the engine but clients never saw it"));
            };
            let mismatch = |what: &str, engine: String, seen: String| {
                Err(format!(
                    "{id}: the engine says {what} {engine}, the clients saw {seen}"
                ))
            };
            if rec.status != sm.status {
                return mismatch("status", rec.status.to_string(), sm.status.to_string());
            }
            if rec.last_status_seq != sm.status_seq || rec.last_activity_seq != sm.activity_seq {
                return mismatch(
                    "status/activity seq",
                    format!("{}/{}", rec.last_status_seq, rec.last_activity_seq),
                    format!("{}/{}", sm.status_seq, sm.activity_seq),
                );
            }
            if rec.tokens_input != sm.tokens_in || rec.tokens_output != sm.tokens_out {
                return mismatch(
                    "tokens in/out",
                    format!("{}/{}", rec.tokens_input, rec.tokens_output),
                    format!("{}/{}", sm.tokens_in, sm.tokens_out),
                );
            }
            if rec.restart_count + 1 != sm.starts {
                return mismatch(
                    "restart_count",
                    rec.restart_count.to_string(),
                    format!("{} starts", sm.starts),
                );
            }
            if sm.turns != sm.turns_ended + u64::from(sm.open_turn.is_some()) {
                return Err(format!(
                    "{id}: {} turns began, {} ended and {:?} is open: every turn ends exactly \
                     once (across daemon restarts too)",
                    sm.turns, sm.turns_ended, sm.open_turn
                ));
            }
            if rec.turns != sm.turns || s.turn() != sm.open_turn {
                return mismatch(
                    "turns/open turn",
                    format!("{}/{:?}", rec.turns, s.turn()),
                    format!("{}/{:?}", sm.turns, sm.open_turn),
                );
            }
            if full && *rec.config != sm.config {
                return mismatch(
                    "config",
                    format!("{:?}", rec.config),
                    format!("{:?}", sm.config),
                );
            }
            if rec.env_state != sm.env {
                return mismatch(
                    "environment",
                    rec.env_state.name().to_string(),
                    sm.env.name().to_string(),
                );
            }
            if rec.started_at != sm.started_at.map(ts) {
                return mismatch(
                    "started_at",
                    format!("{:?}", rec.started_at),
                    format!("{:?}", sm.started_at),
                );
            }
            if tick {
                self.check_deadlines(id, sm)?;
            }
            let want = self.deadline(sm);
            if s.next_deadline() != want.map(|(due, t)| (at(due), t)) {
                return Err(format!(
                    "{id} ({}, process {:?}): the engine's next deadline is {:?}, the reference \
                     one {want:?} (one next deadline, with its reason; a later one fires late)",
                    sm.status,
                    s.run(),
                    s.next_deadline()
                ));
            }
            if rec.provider_session != sm.provider_session {
                return mismatch(
                    "provider_session",
                    format!("{:?}", rec.provider_session),
                    format!("{:?}", sm.provider_session),
                );
            }
            let run_ok = match rec.status {
                // Its environment is being made (or nothing at all happened yet).
                Status::Created => s.run() == Run::Idle,
                Status::Starting => {
                    matches!(s.run().life(), Some(Life::Starting | Life::Alive { .. }))
                }
                Status::Running | Status::Working | Status::Waiting => {
                    matches!(s.run().life(), Some(Life::Alive { .. }))
                }
                Status::Stopped => s.run() == Run::Idle,
                _ => true,
            };
            if !run_ok {
                return Err(format!(
                    "{id} is {} with process {:?} (CREATED means none yet, STARTING a spawn in \
                     flight or a started agent not yet ready, RUNNING, WORKING and WAITING a live process, STOPPED none)",
                    rec.status,
                    s.run()
                ));
            }
            let terminal = rec.status.is_terminal();
            if rec.ended_at.is_some() != terminal {
                return Err(format!(
                    "{id} is {} with ended_at {:?}: ended_at is set exactly when terminal",
                    rec.status, rec.ended_at
                ));
            }
            if rec.error.is_some() != (rec.status == Status::Failed) {
                return Err(format!(
                    "{id} is {} with error {:?}: an error is kept exactly while FAILED",
                    rec.status, rec.error
                ));
            }
            if let Some(t) = sm.open_turn {
                if sm.exhausted() {
                    return Err(format!(
                        "{id}: turn {t} is still open with {} of {} tokens used (a turn that \
                         crosses the budget is interrupted)",
                        sm.tokens(),
                        sm.config.max_tokens
                    ));
                }
            }
            let turn_ok = match rec.status {
                Status::Working => sm.open_turn.is_some(),
                // Blocked on a human inside a turn, or on a prompt outside any.
                Status::Waiting | Status::Stopping => true,
                _ => sm.open_turn.is_none(),
            };
            if !turn_ok {
                return Err(format!(
                    "{id} is {} with open turn {:?}: WORKING means a turn is open, and only \
                     WORKING, WAITING and STOPPING have one",
                    rec.status, sm.open_turn
                ));
            }
            self.check_approvals(s, sm, store)?;
            if rec.run != s.run().id() {
                return Err(format!(
                    "{id}: the record names run {:?}, its process is {:?} (a restarted daemon \
                     would adopt the wrong one)",
                    rec.run,
                    s.run()
                ));
            }
            if rec.turn_open != s.turn().is_some() {
                return Err(format!(
                    "{id}: the record says turn_open={}, the open turn is {:?} (a restarted \
                     daemon would end or continue the wrong turn)",
                    rec.turn_open,
                    s.turn()
                ));
            }
            let applied = match (sm.applied, rec.run) {
                (Some((r, n)), Some(run)) if r == run => n,
                _ => 0,
            };
            if rec.provider_cursor != applied {
                return mismatch(
                    "output applied up to cursor",
                    format!("{} (run {:?})", rec.provider_cursor, rec.run),
                    applied.to_string(),
                );
            }
            if rec.status == Status::Running
                && rec.turns == 0
                && !rec.config.initial_message.is_empty()
            {
                return Err(format!(
                    "{id} is RUNNING after its first start and its initial message was never \
                     sent (no turn began)"
                ));
            }
            let run_pid = s.run().life().and_then(|l| l.pid());
            if rec.pid != run_pid {
                return Err(format!(
                    "{id}: the record's pid is {:?}, its process's {run_pid:?} ({:?})",
                    rec.pid,
                    s.run()
                ));
            }
        }
        let engine_open = engine.pending_approvals().count();
        if engine_open != store.open.len() {
            return Err(format!(
                "the engine has {engine_open} open requests, the store {}",
                store.open.len()
            ));
        }
        // The engine's next deadline is the earliest of every session's.
        let earliest = self
            .sessions
            .iter()
            .filter_map(|(id, sm)| self.deadline(sm).map(|(at, t)| (at, id, t)))
            .min_by_key(|(at, _, _)| *at);
        let got = engine.poll_timeout();
        let ok = match (&got, earliest) {
            (None, None) => true,
            (Some((due, Deadline::Session(id, t))), Some((want, _, _))) => {
                due.millis() == want
                    && self.sessions.get(id).and_then(|sm| self.deadline(sm))
                        == Some((due.millis(), *t))
            }
            _ => false,
        };
        if !ok {
            return Err(format!(
                "the engine's next deadline is {got:?}, the reference earliest {earliest:?}"
            ));
        }
        Ok(())
    }

    /// The reference deadline of a session: the earliest of those it has (the start-up timeout
    /// while STARTING, the session timeout while RUNNING or WORKING, the grace period of a
    /// graceful stop waiting for a turn, the KILL of a TERMed process), ties in `Timer` order.
    fn deadline(&self, sm: &SessionModel) -> Option<(Millis, Timer)> {
        let mut all = Vec::new();
        match sm.status {
            // Making its environment counts against the start-up timeout.
            Status::Created if sm.env == EnvState::Creating => all.push((
                sm.since
                    .saturating_add(self.limits.startup_timeout.millis()),
                Timer::Startup,
            )),
            Status::Starting => all.push((
                sm.since
                    .saturating_add(self.limits.startup_timeout.millis()),
                Timer::Startup,
            )),
            Status::Running | Status::Working | Status::Waiting if sm.config.timeout_ms > 0 => {
                if let Some(t) = sm.started_at {
                    all.push((
                        t.saturating_add(sm.config.timeout_ms),
                        Timer::SessionTimeout,
                    ));
                }
            }
            Status::Stopping if sm.open_turn.is_some() => all.push((
                sm.since.saturating_add(self.limits.stop_grace.millis()),
                Timer::StopGrace,
            )),
            _ => {}
        }
        if let Some((_, at)) = sm.kill_at {
            all.push((at, Timer::Kill));
        }
        if let Some(at) = sm.ending {
            all.push((at, Timer::Kill));
        }
        if let Some(at) = sm.open.values().min() {
            all.push((*at, Timer::ApprovalExpiry));
        }
        all.into_iter().min()
    }

    /// After a Tick at `now`, no deadline that was due is left unenforced.
    fn check_deadlines(&self, id: &SessionId, sm: &SessionModel) -> Result<(), String> {
        let now = self.now;
        let late = |what: &str, due: Millis| {
            Err(format!(
                "{id} is still {} at {now}, though its {what} was due at {due}",
                sm.status
            ))
        };
        match sm.status {
            Status::Created | Status::Starting => {
                let due = sm.since + self.limits.startup_timeout.millis();
                if now >= due {
                    return late("start-up timeout", due);
                }
            }
            Status::Running | Status::Working | Status::Waiting if sm.config.timeout_ms > 0 => {
                if let Some(due) = sm.started_at.map(|t| t + sm.config.timeout_ms) {
                    if now >= due {
                        return late("session timeout", due);
                    }
                }
            }
            Status::Stopping if sm.open_turn.is_some() => {
                let due = sm.since + self.limits.stop_grace.millis();
                if now >= due {
                    return late("graceful stop's grace period (the turn is still open)", due);
                }
            }
            _ => {}
        }
        if let Some(due) = sm.ending {
            if now >= due {
                return late(
                    "TERM after its closed input (the agent did not end its own way)",
                    due,
                );
            }
        }
        if let Some(due) = sm.open.values().min() {
            if now >= *due {
                return late("approval timeout (a request is still open)", *due);
            }
        }
        Ok(())
    }

    /// One session's requests for a human: the engine's open ones are the committed ones and
    /// the ones clients saw open, to the field; the session is WAITING exactly while one is
    /// open; each belongs to the session's live process (the one that asked, which the answer
    /// must reach).
    fn check_approvals(
        &self,
        s: &paddock_core::Session,
        sm: &SessionModel,
        store: &Store,
    ) -> Result<(), String> {
        let id = &s.record.id;
        let engine: Vec<&ApprovalId> = s.pending().iter().map(|a| &a.id).collect();
        let seen: Vec<&ApprovalId> = sm.open.keys().collect();
        let mut sorted = engine.clone();
        sorted.sort();
        if sorted != seen {
            return Err(format!(
                "{id}: the engine's open requests are {engine:?}, the clients saw {seen:?} open"
            ));
        }
        for a in s.pending() {
            let stored = store.approvals.get(&a.id);
            if stored != Some(a) || self.approvals.get(&a.id) != Some(a) {
                return Err(format!(
                    "{id}: open request {} differs between the engine {a:?}, the store \
                     {stored:?} and what clients saw {:?}",
                    a.id,
                    self.approvals.get(&a.id)
                ));
            }
            if !matches!(s.run(), Run::Live { run, life: Life::Alive { .. } } if run == a.run) {
                return Err(format!(
                    "{id}: request {} of run {} is open while the session's process is {:?}",
                    a.id,
                    a.run,
                    s.run()
                ));
            }
        }
        if (s.status() == Status::Waiting) == engine.is_empty() {
            return Err(format!(
                "{id} is {} with open requests {engine:?}: WAITING means a request is open, \
                 and only then",
                s.status()
            ));
        }
        let run = s.run().id();
        let terminating = matches!(s.run().life(), Some(Life::Terminating { .. }));
        let ending = matches!(s.run().life(), Some(Life::Ending { .. }));
        if sm.proc_run != run || sm.terminating != terminating || sm.ending.is_some() != ending {
            return Err(format!(
                "{id}: the engine's process is {:?}; the reference, from spawns, closed inputs, \
                 TERMs and exits: run {:?}{}{}",
                s.run(),
                sm.proc_run,
                if sm.ending.is_some() {
                    ", input closed"
                } else {
                    ""
                },
                if sm.terminating { ", TERMed" } else { "" }
            ));
        }
        Ok(())
    }

    /// The daemon crashed. Clients lose their connections: requests in flight get no reply,
    /// turn streams are cut. Everything they saw was committed, so it is what the store says.
    pub fn on_crash(&mut self, store: &Store) -> Result<(), String> {
        self.stats.requests_lost += self.pending.len() as u64;
        self.pending.clear();
        if self.sessions.len() != store.sessions.len() {
            return Err(format!(
                "clients saw {} sessions, the store has {}",
                self.sessions.len(),
                store.sessions.len()
            ));
        }
        for (id, sm) in &mut self.sessions {
            let Some(rec) = store.sessions.get(id) else {
                return Err(format!("clients saw {id}, the store never had it"));
            };
            if rec.status != sm.status
                || rec.last_status_seq != sm.status_seq
                || rec.env_state != sm.env
            {
                return Err(format!(
                    "clients saw {id} {} (seq {}, environment {:?}), the store has {} (seq {}, \
                     environment {:?})",
                    sm.status,
                    sm.status_seq,
                    sm.env,
                    rec.status,
                    rec.last_status_seq,
                    rec.env_state
                ));
            }
            // A turn in progress stays in progress in the store: the new daemon ends it or,
            // adopting its process, lets it go on. Either way it ends exactly once.
            if rec.turn_open != sm.open_turn.is_some() || rec.turns != sm.turns {
                return Err(format!(
                    "clients saw {id} with turn {:?} of {} open, the store says turn_open={} of \
                     {}",
                    sm.open_turn, sm.turns, rec.turn_open, rec.turns
                ));
            }
            if rec.provider_session != sm.provider_session {
                return Err(format!(
                    "clients saw {id} with conversation {:?}, the store has {:?}",
                    sm.provider_session, rec.provider_session
                ));
            }
            // The new daemon TERMs afresh what it must.
            sm.kill_at = None;
            sm.terminating = false;
            sm.ending = None;
            sm.adopted = false;
            sm.after_stop = None;
            sm.restart_asked = false;
            sm.started_at = rec.started_at.map(|t| t.millis());
            // A restart's override was only kept if its step committed.
            sm.config = SessionConfig::clone(&rec.config);
        }
        Ok(())
    }

    /// The new daemon is about to adopt the processes of `adopted`: a stop in progress goes
    /// on (to STOPPED: its requester is gone), and what was applied of their output is what
    /// the store says.
    pub fn on_restore(
        &mut self,
        adopted: &BTreeSet<SessionId>,
        store: &Store,
    ) -> Result<(), String> {
        for (id, sm) in &mut self.sessions {
            sm.adopted = adopted.contains(id);
            if !sm.adopted {
                // Its run is gone (a new daemon may reuse the number for another process).
                sm.applied = None;
                sm.proc_run = None;
                continue;
            }
            let rec = &store.sessions[id];
            let run = rec.run.expect("an adopted session's record names its run");
            sm.proc_run = Some(run);
            // Its agent runs, so in its environment.
            sm.env = EnvState::Ready;
            let applied = match sm.applied {
                Some((r, n)) if r == run => n,
                _ => 0,
            };
            if rec.provider_cursor != applied {
                return Err(format!(
                    "{id}: the store says run {run}'s output was applied up to cursor {}, the \
                     clients saw it applied up to {applied}",
                    rec.provider_cursor
                ));
            }
            if sm.status == Status::Stopping {
                sm.after_stop = Some(Then::Stop);
            }
            if sm.open_turn.is_some() && matches!(sm.status, Status::Working | Status::Waiting) {
                self.stats.turns_adopted += 1;
            }
        }
        Ok(())
    }

    /// Sessions not yet idle (RUNNING with no turn) nor terminal.
    pub fn unsettled(&self) -> Vec<(SessionId, Status)> {
        self.sessions
            .iter()
            .filter(|(_, s)| {
                !(s.status.is_terminal() || (s.status == Status::Running && s.open_turn.is_none()))
            })
            .map(|(id, s)| (id.clone(), s.status))
            .collect()
    }

    /// Requests never answered (the end of the run: every request gets its reply).
    pub fn unanswered(&self) -> Vec<String> {
        self.pending
            .iter()
            .map(|(req, p)| format!("{:?} {req} for {} (made while {:?})", p.kind, p.id, p.pre))
            .collect()
    }
}

/// The reference transition relation: may `cause` move a session from `from` to `to`?
fn allowed(sm: &SessionModel, from: Status, to: Status, cause: &Cause) -> Result<(), &'static str> {
    use EventKind as E;
    use ReqKind as R;
    use Status::*;
    // A restart fails what it did not adopt, and carries on what it did.
    let lost = cause.restore() && !sm.adopted;
    let adopted = cause.restore() && sm.adopted;
    let ok = match (from, to) {
        // A create spawns at once unless its environment must be made first: then only the
        // report that it was made does.
        (Created, Starting) => {
            (cause.req(R::Create) && !sm.config.env.needs_provisioning()) || cause.env(true)
        }
        // A stop while the environment is made ends the session before it started.
        (Created, Stopped) => {
            if sm.after_stop != Some(Then::Stop) {
                return Err("no stop was asked for");
            }
            cause.stop()
        }
        // Not made in time, or the daemon restarted meanwhile.
        (Created, Failed) => cause.tick() || lost,
        // Running once its current agent says it is ready (an adopted one is: it outlived a
        // daemon).
        (Starting, Running) => {
            matches!(cause, Cause::Provider { run, event: E::Ready, .. } if sm.proc_run == Some(*run))
                || adopted
        }
        (Starting, Failed) => {
            cause.ev(E::SpawnFailed) || cause.ev(E::Exited) || cause.tick() || lost
        }
        (Starting | Running | Working, Stopping) => cause.stop() || cause.req(R::Restart),
        (Running, Working) => {
            cause.req(R::Send)
                || ((cause.ev(E::Ready) || adopted)
                    && sm.turns == 0
                    && !sm.config.initial_message.is_empty())
        }
        (Running, Failed) => cause.ev(E::Exited) || cause.tick() || lost,
        // A turn's end within the budget; one whose report goes past it fails the session.
        (Working, Running) => cause.ev(E::TurnEnd) && !sm.exceeded(),
        // Blocked on a human: an ask the policy does not settle.
        (Running | Working, Waiting) => cause.ev(E::Ask),
        // Unblocked: the last open request answered or expired (back to the turn, or idle),
        // or the turn ended (what was open is moot).
        (Waiting, Working) => cause.req(R::Resolve) || cause.tick(),
        (Waiting, Running) => {
            cause.req(R::Resolve) || cause.tick() || (cause.ev(E::TurnEnd) && !sm.exceeded())
        }
        (Waiting, Stopping) => cause.stop() || cause.req(R::Restart),
        (Waiting, Failed) => {
            cause.ev(E::Activity)
                || (cause.ev(E::TurnEnd) && sm.exceeded())
                || cause.ev(E::Exited)
                || cause.ev(E::DeliveryFailed)
                || cause.tick()
                || lost
        }
        (Working, Failed) => {
            // The budget (an activity, or a turn's end past it), a crash, a message that
            // could not be delivered, the session timeout, a daemon restart.
            cause.ev(E::Activity)
                || (cause.ev(E::TurnEnd) && sm.exceeded())
                || cause.ev(E::Exited)
                || cause.ev(E::DeliveryFailed)
                || cause.tick()
                || lost
        }
        (Stopping, Stopped) => {
            if sm.after_stop != Some(Then::Stop) {
                return Err("no stop was asked for (or a restart is under way)");
            }
            cause.stop() || cause.ev(E::Exited) || cause.ev(E::SpawnFailed)
        }
        (Stopping, Starting) => {
            if sm.after_stop != Some(Then::Restart) {
                return Err("no restart is under way");
            }
            cause.req(R::Restart) || cause.ev(E::Exited) || cause.ev(E::SpawnFailed)
        }
        (Stopping, Failed) => lost,
        (Stopped | Failed, Starting) => {
            if !sm.restart_asked {
                return Err("a terminal session leaves only through a restart");
            }
            cause.req(R::Restart) || cause.ev(E::Exited) || cause.ev(E::SpawnFailed)
        }
        (Stopped | Failed, _) => return Err("a terminal session leaves only through a restart"),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err("not a transition this cause can make")
    }
}

/// The reference permission policy (`provider_config["permissions"]`, as the client writes
/// it): `Some(allowed)` when the policy settles the ask at once, `None` when a human must.
fn policy_settles(config: &SessionConfig, kind: AskKind, tool: &str) -> Option<bool> {
    let policy = config
        .provider_config
        .get("permissions")
        .map_or("allow-all", String::as_str);
    // (asks a human, the tools allowed without asking; None: every tool)
    let (asks, allowed): (bool, Option<Vec<&str>>) = match policy {
        "allow-all" => (false, None),
        "deny" => (false, Some(Vec::new())),
        "ask" => (true, Some(Vec::new())),
        p if p.starts_with("allow:") => (false, Some(p["allow:".len()..].split(',').collect())),
        p if p.starts_with("ask:") => (true, Some(p["ask:".len()..].split(',').collect())),
        other => unreachable!("the client writes no policy like {other:?}"),
    };
    match kind {
        // The client runs its own tools: always a request.
        AskKind::ClientTool => None,
        AskKind::Question if asks => None,
        AskKind::Question => Some(false),
        AskKind::Permission if allowed.is_none_or(|l| l.contains(&tool)) => Some(true),
        AskKind::Permission if asks => None,
        AskKind::Permission => Some(false),
    }
}

/// The reference approval timeout (`provider_config["approval_timeout"]`, as the client writes
/// it: `250ms`, `5s`, `2m`; none: the default).
fn approval_timeout_ms(config: &SessionConfig) -> u64 {
    let Some(t) = config.provider_config.get("approval_timeout") else {
        return ApprovalSettings::DEFAULT_TIMEOUT_MS;
    };
    let num = |suffix: &str| -> u64 {
        t[..t.len() - suffix.len()]
            .parse()
            .unwrap_or_else(|_| unreachable!("the client writes no timeout like {t:?}"))
    };
    if t.ends_with("ms") {
        num("ms")
    } else if t.ends_with('s') {
        num("s") * 1000
    } else if t.ends_with('m') {
        num("m") * 60_000
    } else {
        unreachable!("the client writes no timeout like {t:?}")
    }
}

/// On expiry the request is approved only if the session says so.
fn approval_default_allow(config: &SessionConfig) -> bool {
    config
        .provider_config
        .get("approval_default")
        .is_some_and(|d| d == "allow")
}

/// What a decision makes of a request: its state and whether the agent may go ahead.
fn decided(d: &Decision) -> (ApprovalState, bool) {
    match d {
        Decision::Approve => (ApprovalState::Approved, true),
        Decision::Deny { .. } => (ApprovalState::Denied, false),
        Decision::Answer { .. } => (ApprovalState::Answered, true),
    }
}

fn same_session(cause: &Cause, id: &SessionId) -> Result<(), String> {
    match cause.session() {
        Some(c) if c != id => Err(format!(
            "an input for {c} produced an effect for another session, {id}"
        )),
        _ => Ok(()),
    }
}

/// Two records are equal (their configurations compared only if `config`).
fn same_record(a: &SessionRecord, b: &SessionRecord, config: bool) -> bool {
    differing(a, b)
        .iter()
        .all(|(field, _)| !config && *field == "config")
}

/// The fields in which two records differ, for failure messages.
pub fn diff(want: &SessionRecord, got: &SessionRecord) -> String {
    let fields: Vec<String> = differing(want, got)
        .into_iter()
        .map(|(field, values)| format!("{field}: {values}"))
        .collect();
    format!("[{}]", fields.join("; "))
}

/// Each field in which `got` differs from `want`, with both values. The record is
/// destructured, so that a new field cannot be left out of the comparison.
fn differing(want: &SessionRecord, got: &SessionRecord) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    macro_rules! compare {
        ($($f:ident),*) => {
            let SessionRecord { $($f),* } = want;
            $(
                if *$f != got.$f {
                    out.push((stringify!($f), format!("{:?} vs {:?}", $f, got.$f)));
                }
            )*
        };
    }
    compare!(
        id,
        config,
        status,
        tokens_input,
        tokens_output,
        pid,
        restart_count,
        created_at,
        started_at,
        last_activity_at,
        ended_at,
        error,
        provider_session,
        last_activity_seq,
        last_status_seq,
        turns,
        turn_open,
        run,
        provider_cursor,
        last_turn_failed,
        env_state,
        disconnected,
        closed_by_client
    );
    out
}
