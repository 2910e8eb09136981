//! The daemon's engine: every session, every Aria task and every campaign of a daemon, fed
//! one [`Input`] at a time.
//!
//! `handle(now, input) -> Vec<Effect>` is the only way state changes: one input enum, one
//! effect enum, for the whole daemon. The engine is composed of the session machines
//! ([`Session`]), the task machine ([`Tasks`]) and the campaign rules ([`Campaigns`]); it
//! routes each input to its part and the shutdown and the ticks to all. Getters take `&self`;
//! [`Engine::poll_timeout`] names the earliest deadline of any part (and why), when the shell
//! must next call `handle(now, Input::Tick)`.

use std::collections::{BTreeMap, BTreeSet};

use crate::approval::Approval;
use crate::campaign::{Campaign, CampaignError, Campaigns};
use crate::container::{ContainerRecord, ContainerRequest, Containers};
use crate::error::{Error, ErrorCode};
use crate::model::{RunId, SessionId, SessionRecord, Status};
use crate::session::effect::{Effect, Record, Signal};
use crate::session::input::Input;
use crate::session::machine::{Ctx, Out, Session, Step, Timer};
use crate::task::{TaskInput, TaskLimits, TaskRecord, TaskTimer, Tasks};
use crate::time::{Duration, Instant, Now};

/// Every bound the engine enforces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// How long a graceful stop waits for the current turn before force-stopping (OBEY-2021).
    pub stop_grace: Duration,
    /// TERM → KILL: how long a terminated process gets to exit ([`crate::process`]'s rule).
    pub kill_grace: Duration,
    /// A graceful end's first step: how long an agent whose input was closed (asked to end
    /// its own way) gets before TERM. Zero: TERM at once.
    pub end_grace: Duration,
    /// How long a provider may take to report it started.
    pub startup_timeout: Duration,
    /// Sessions that are not terminal at once; a create beyond it is refused (OBEY-2004),
    /// because every live session owns a process.
    pub max_live_sessions: usize,
    /// The Aria tasks' bounds.
    pub tasks: TaskLimits,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            stop_grace: Duration::from_secs(30),
            kill_grace: crate::process::KILL_GRACE,
            end_grace: crate::process::END_GRACE,
            startup_timeout: crate::process::STARTUP_TIMEOUT,
            max_live_sessions: 64,
            tasks: TaskLimits::default(),
        }
    }
}

/// Why the engine next needs a tick: the deadline's owner and its timer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Deadline {
    /// A session's timer (start-up, session timeout, graceful-stop grace, TERM → KILL,
    /// a request's expiry).
    Session(SessionId, Timer),
    /// A task's timeout or its TERM → KILL.
    Task(String, TaskTimer),
}

impl Deadline {
    /// Why, in words (for logs).
    pub fn reason(&self) -> &'static str {
        match self {
            Deadline::Session(_, t) => t.reason(),
            Deadline::Task(_, t) => t.reason(),
        }
    }
}

/// What the store holds, loaded at daemon start-up.
#[derive(Debug, Clone, Default)]
pub struct Stored {
    /// Every session that is not [settled](SessionRecord::is_settled) (the start-up decides
    /// what becomes of each), and any settled ones the shell chooses to hand over now; the
    /// others are [recalled](Engine::recall) when something names them.
    pub sessions: Vec<SessionRecord>,
    /// Every open request for a human, and the newest resolved ones of each of those sessions.
    pub approvals: Vec<Approval>,
    pub tasks: Vec<TaskRecord>,
    pub campaigns: Vec<Campaign>,
    pub containers: Vec<ContainerRecord>,
}

/// The processes that outlived the previous daemon (in the runner), found at start-up.
#[derive(Debug, Clone, Default)]
pub struct Surviving {
    /// Every agent run the runner lists (live, or finished with output), with its pid while
    /// it runs. A session may have more than one: a run started in a batch that the crash lost
    /// (a restart's new process beside the old one, a create's first) is named by no record.
    pub agents: BTreeMap<(SessionId, RunId), Option<u32>>,
    /// Task id → pid: the task runs still running.
    pub tasks: BTreeMap<String, Option<u32>>,
}

/// The daemon's engine: sessions, tasks, campaigns.
#[derive(Debug, Clone)]
pub struct Engine {
    sessions: BTreeMap<SessionId, Session>,
    /// The sessions that are not terminal: what a create is counted against and what a
    /// shutdown stops, without visiting every session ever stored.
    live: BTreeSet<SessionId>,
    /// The sessions held that are [settled](SessionRecord::is_settled): nothing about them
    /// changes until an input names them again, so [`Engine::evict_settled`] may let them go
    /// back to the store.
    settled: BTreeSet<SessionId>,
    /// Each session's earliest deadline, and the same ordered by time: `poll_timeout` and a
    /// tick touch only what is due (a daemon may keep thousands of ended sessions).
    deadline_of: BTreeMap<SessionId, Instant>,
    due: BTreeSet<(Instant, SessionId)>,
    tasks: Tasks,
    campaigns: Campaigns,
    containers: Containers,
    limits: Limits,
    next_run: RunId,
    /// The latest time seen, clock by clock: time never goes backwards inside the engine.
    now: Now,
    trace: Option<Vec<Step>>,
    /// Set by [`Input::Shutdown`]: no new session from then on.
    shutting_down: bool,
    /// The room of a step's effects, empty between steps.
    out: Out,
}

impl Engine {
    pub fn new(limits: Limits) -> Self {
        Engine {
            sessions: BTreeMap::new(),
            live: BTreeSet::new(),
            settled: BTreeSet::new(),
            deadline_of: BTreeMap::new(),
            due: BTreeSet::new(),
            tasks: Tasks::new(limits.tasks.clone()),
            campaigns: Campaigns::default(),
            containers: Containers::default(),
            limits,
            next_run: 1,
            now: Now::default(),
            trace: None,
            shutting_down: false,
            out: Out::default(),
        }
    }

    /// Rebuilds the engine from the store at daemon start-up and decides what becomes of the
    /// processes that outlived the previous daemon (`surviving`). An agent whose run the
    /// session's record names is adopted: the session carries on where it was (a turn in
    /// progress stays in progress, a request for a human stays open; a stop in progress is
    /// finished); a session whose process is gone is FAILED with OBEY-2032 and its open
    /// requests are cancelled. Tasks are never adopted (`Tasks::restore`): what ran is
    /// FAILED and every surviving task process is killed. The effects are the shell's to
    /// carry out before the socket accepts a call.
    ///
    /// Deadlines the previous daemon stored as wall-clock times (a request's expiry, a session
    /// timeout counted from its start) are brought onto this daemon's monotonic clock here
    /// ([`Now::instant_of`]).
    ///
    /// A daemon with 10,000 ended sessions stored starts with the few it must decide on: the
    /// settled ones come back through [`Engine::recall`].
    pub fn restore(
        limits: Limits,
        now: Now,
        stored: Stored,
        surviving: &Surviving,
    ) -> (Self, Vec<Effect>) {
        let mut engine = Engine::new(limits);
        engine.now = now;
        let mut out = Out::default();
        engine.tasks = Tasks::restore(
            engine.limits.tasks.clone(),
            now,
            stored.tasks,
            &surviving.tasks,
            &mut out,
        );
        engine.campaigns = Campaigns::new(stored.campaigns);
        engine.containers = Containers::restore(stored.containers, &mut out);
        let mut by_session: BTreeMap<SessionId, Vec<Approval>> = BTreeMap::new();
        for a in stored.approvals {
            // A request names the run that asked; that run id must never name another process
            // (its answer may be sent again to the run that asked it).
            engine.next_run = engine.next_run.max(a.run + 1);
            by_session.entry(a.session.clone()).or_default().push(a);
        }
        for record in stored.sessions {
            let id = record.id.clone();
            assert!(
                !engine.sessions.contains_key(&id),
                "session {id} is stored once"
            );
            // Run ids stay unique across daemon lifetimes: the runner may still know old ones.
            if let Some(r) = record.run {
                engine.next_run = engine.next_run.max(r + 1);
            }
            let survivor = record.run.and_then(|run| {
                let pid = *surviving.agents.get(&(id.clone(), run))?;
                Some((run, pid))
            });
            let mut s = Session::from_record(record);
            restore_requests(&mut s, by_session.remove(&id).unwrap_or_default(), now);
            let mut cx = Ctx {
                now,
                lim: &engine.limits,
                next_run: &mut engine.next_run,
                trace: &mut engine.trace,
                out,
            };
            match survivor {
                Some((run, pid)) => s.adopt(run, pid, &mut cx),
                None => s.reconcile(&mut cx),
            }
            s.flush(&mut cx);
            out = cx.out;
            engine.sessions.insert(id.clone(), s);
            engine.reindex(&id);
        }
        // A run no record names (its session ended or was deleted, or the batch that started it
        // was lost in the crash) has no session to belong to: it is killed, never adopted.
        for ((id, run), pid) in &surviving.agents {
            let named = engine
                .sessions
                .get(id)
                .is_some_and(|s| s.run().id() == Some(*run));
            if !named && pid.is_some() {
                out.rest.push(Effect::Signal {
                    id: id.clone(),
                    run: *run,
                    pid: *pid,
                    signal: Signal::Kill,
                });
            }
        }
        // The other half of the store's rule: a session with an open request is not settled,
        // so it was restored above and took its requests.
        debug_assert!(
            by_session.values().flatten().all(|a| !a.is_pending()),
            "an open request's session was not restored"
        );
        engine.check_index();
        (engine, out.into_effects())
    }

    /// Takes back a [settled](SessionRecord::is_settled) session that start-up left in the
    /// store, or that [`Engine::evict_settled`] let go, with its newest resolved requests (the window of late answers, as
    /// [`Engine::restore`] gives every session it restores), once every run id the store names
    /// is reserved ([`Engine::reserve_runs_through`]). The shell calls it before an
    /// input or a query that names the session, so every rule sees the session as if it had
    /// been restored: nothing about it is decided here, and nothing comes out.
    pub fn recall(&mut self, record: SessionRecord, resolved: Vec<Approval>) {
        let id = record.id.clone();
        assert!(
            record.is_settled(),
            "only a settled session is recalled ({id} is {})",
            record.status
        );
        assert!(
            !self.sessions.contains_key(&id),
            "session {id} is recalled once"
        );
        assert!(
            resolved.iter().all(|a| !a.is_pending() && a.session == id),
            "a settled session's requests are resolved ({id})"
        );
        // A request names the run that asked, which must never name another process: the
        // shell reserved every run id the store names ([`Engine::reserve_runs_through`]).
        assert!(
            resolved.iter().all(|a| a.run < self.next_run),
            "a recalled request's run id is reserved ({id})"
        );
        let mut s = Session::from_record(record);
        restore_requests(&mut s, resolved, self.now);
        self.sessions.insert(id.clone(), s);
        self.reindex(&id);
        debug_assert!(!self.live.contains(&id) && !self.deadline_of.contains_key(&id));
        self.check_index();
    }

    // ── getters ────────────────────────────────────────────────────────────

    /// Whether an [`Input::Shutdown`] was handled.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    pub fn session(&self, id: &SessionId) -> Option<&Session> {
        self.sessions.get(id)
    }

    /// Every session the engine holds (the live ones, and the ended ones restored or recalled),
    /// in id order (ULIDs: creation order).
    pub fn sessions(&self) -> impl Iterator<Item = &Session> {
        self.sessions.values()
    }

    /// The sessions that are not terminal, in id order (`.rev()`: newest first): what a list of
    /// active sessions, a dashboard or a shutdown looks at, without visiting every session ever
    /// stored.
    pub fn live(&self) -> impl DoubleEndedIterator<Item = &Session> {
        self.live.iter().map(|id| &self.sessions[id])
    }

    /// Every request waiting for a human, oldest session first. Only a live session has one
    /// (a session is WAITING exactly while it has an open request, and an end answers them).
    pub fn pending_approvals(&self) -> impl Iterator<Item = &Approval> {
        self.live().flat_map(|s| s.pending().iter())
    }

    pub fn live_sessions(&self) -> usize {
        self.live.len()
    }

    /// The task with this id.
    pub fn task(&self, id: &str) -> Option<&TaskRecord> {
        self.tasks.get(id)
    }

    /// Every task held, in id order: the live ones and those that ended since the last
    /// [`Engine::evict_settled`] (or were recalled).
    pub fn tasks(&self) -> impl Iterator<Item = &TaskRecord> {
        self.tasks.all()
    }

    /// Takes back an ended task that [`Engine::evict_settled`] let go (or that start-up left in
    /// the store). The shell calls it before an input that names the task
    /// ([`Input::recalls_task`]), so that a launch with its id is refused and a cancel is
    /// answered as for an ended task.
    pub fn recall_task(&mut self, record: TaskRecord) {
        self.tasks.recall(record);
    }

    /// Tasks not yet terminal, or whose process still runs.
    pub fn live_tasks(&self) -> usize {
        self.tasks.live()
    }

    /// Every container (Aria's ContainerService).
    pub fn containers(&self) -> &Containers {
        &self.containers
    }

    /// Every campaign.
    pub fn campaigns(&self) -> &Campaigns {
        &self.campaigns
    }

    /// The earliest deadline of anything the daemon schedules — every session's timers,
    /// every task's timeout and TERM → KILL: when, and why. The shell sleeps until then (or
    /// the next input) and calls `handle(now, Input::Tick)`. Ties go to sessions, then to the
    /// smaller id.
    pub fn poll_timeout(&self) -> Option<(Instant, Deadline)> {
        let session = self.due.first().map(|(at, id)| {
            let (_, t) = self.sessions[id]
                .next_deadline()
                .expect("an indexed session has a deadline");
            (*at, Deadline::Session(id.clone(), t))
        });
        let task = self
            .tasks
            .poll_timeout()
            .map(|(at, id, t)| (at, Deadline::Task(id.clone(), t)));
        match (session, task) {
            (Some(s), Some(t)) if t.0 < s.0 => Some(t),
            (Some(s), _) => Some(s),
            (None, t) => t,
        }
    }

    /// Makes every run id this engine hands out greater than `floor`: the runner may still
    /// remember runs (even finished ones) that no stored record names any more, and refuses
    /// to start a run under an id it knows.
    pub fn reserve_runs_through(&mut self, floor: RunId) {
        let before = self.next_run;
        self.next_run = self.next_run.max(floor.saturating_add(1));
        assert!(self.next_run >= before, "run ids only increase");
    }

    /// Turns on recording of every table lookup (for coverage in the simulator).
    pub fn set_trace(&mut self, on: bool) {
        self.trace = on.then(Vec::new);
    }

    /// The table lookups recorded since the last call.
    pub fn take_trace(&mut self) -> Vec<Step> {
        self.trace.as_mut().map(std::mem::take).unwrap_or_default()
    }

    // ── input ──────────────────────────────────────────────────────────────

    /// Feeds one input at time `now`; returns its effects (persists first: the drain rule).
    pub fn handle(&mut self, now: Now, input: Input) -> Vec<Effect> {
        let mut effects = Vec::new();
        self.handle_into(now, input, &mut effects);
        effects
    }

    /// [`Engine::handle`], its effects appended to `effects` (the executor's, used again for
    /// every input).
    pub fn handle_into(&mut self, now: Now, input: Input, effects: &mut Vec<Effect>) {
        // Time never goes backwards inside the engine: an earlier `now` is read as the latest.
        self.now = self.now.max(now);
        let now = self.now;
        // The sessions this input may change: their index entries are brought up to date
        // once it is handled.
        let mut touched: Vec<SessionId> = match &input {
            Input::Create { id, .. }
            | Input::Send { id, .. }
            | Input::Stop { id, .. }
            | Input::Close { id, .. }
            | Input::Restart { id, .. }
            | Input::Delete { id, .. }
            | Input::Report { id, .. }
            | Input::Environment { id, .. }
            | Input::Provider { id, .. } => vec![id.clone()],
            // Every live session, and every ended one whose restart waits for its old process.
            Input::Shutdown { .. } => self
                .live
                .iter()
                .cloned()
                .chain(
                    self.sessions
                        .values()
                        .filter(|s| s.restart_pending())
                        .map(|s| s.record.id.clone()),
                )
                .collect(),
            // Due now, in id order (as every tick has visited them).
            Input::Tick => {
                let due: BTreeSet<SessionId> = self
                    .due
                    .iter()
                    .take_while(|(at, _)| *at <= now.at)
                    .map(|(_, id)| id.clone())
                    .collect();
                due.into_iter().collect()
            }
            // The session it resumes or makes: known once it is handled.
            Input::Attach { .. }
            | Input::Resolve { .. }
            | Input::Task(_)
            | Input::AddCampaign { .. }
            | Input::RemoveCampaign { .. }
            | Input::Container { .. }
            | Input::ContainerReport { .. } => Vec::new(),
        };
        let mut cx = Ctx {
            now,
            lim: &self.limits,
            next_run: &mut self.next_run,
            trace: &mut self.trace,
            // The room of the steps before: a fast agent's events are written into memory
            // that is already in cache, not into a new allocation each (`perf`, P2).
            out: std::mem::take(&mut self.out),
        };
        match input {
            Input::Create { req, id, config } => create(
                &mut self.sessions,
                self.live.len(),
                self.shutting_down,
                req,
                id,
                *config,
                &mut cx,
            ),
            Input::Attach {
                req,
                project,
                context,
                id,
                config,
            } => {
                let found = crate::model::session_to_resume(
                    &project,
                    self.sessions.values().map(|s| &s.record),
                )
                .map(|r| r.id.clone());
                match found {
                    Some(id) => {
                        touched.push(id.clone());
                        let s = self.sessions.get_mut(&id).expect("found among them");
                        if !s.record.status.is_terminal() {
                            // Live: the client joins it as it is.
                            cx.out.rest.push(Effect::Reply {
                                req,
                                result: Ok(Box::new(s.record.clone())),
                            });
                        } else if self.shutting_down {
                            cx.out.rest.push(Effect::Reply {
                                req,
                                result: Err(shutting_down()),
                            });
                        } else {
                            // Restarted with this attach's context (the files may have
                            // changed since).
                            let pc = s
                                .record
                                .config
                                .provider_config
                                .clone()
                                .with(crate::SYSTEM_PROMPT_KEY, context)
                                .expect("the system prompt is no setting");
                            s.handle_restart(req, Some(pc), &mut cx);
                            s.flush(&mut cx);
                        }
                    }
                    None => match config {
                        Ok(mut config) => {
                            touched.push(id.clone());
                            let pc = &mut config.provider_config;
                            pc.insert(crate::PROJECT_KEY, project)
                                .expect("the project is no setting");
                            pc.insert(crate::SYSTEM_PROMPT_KEY, context)
                                .expect("the system prompt is no setting");
                            create(
                                &mut self.sessions,
                                self.live.len(),
                                self.shutting_down,
                                req,
                                id,
                                *config,
                                &mut cx,
                            );
                        }
                        Err(e) => cx.out.rest.push(Effect::Reply { req, result: Err(e) }),
                    },
                }
            }
            Input::Send { req, id, text } => match self.sessions.get_mut(&id) {
                Some(s) => {
                    s.handle_send(req, text, &mut cx);
                    s.flush(&mut cx);
                }
                None => not_found(&mut cx, req, &id),
            },
            Input::Stop { req, id, graceful } => match self.sessions.get_mut(&id) {
                Some(s) => {
                    s.handle_stop(req, graceful, &mut cx);
                    s.flush(&mut cx);
                }
                None => not_found(&mut cx, req, &id),
            },
            Input::Close { req, id } => match self.sessions.get_mut(&id) {
                Some(s) => {
                    s.handle_close(req, &mut cx);
                    s.flush(&mut cx);
                }
                None => not_found(&mut cx, req, &id),
            },
            // No agent starts once the daemon shuts down: it would outlive it.
            Input::Restart { req, .. } if self.shutting_down => cx.out.rest.push(Effect::Reply {
                req,
                result: Err(shutting_down()),
            }),
            Input::Restart {
                req,
                id,
                provider_config,
            } => match self.sessions.get_mut(&id) {
                Some(s) => {
                    s.handle_restart(req, provider_config, &mut cx);
                    s.flush(&mut cx);
                }
                None => not_found(&mut cx, req, &id),
            },
            Input::Resolve {
                req,
                approval,
                session,
                decision,
                by,
                stored,
            } => match self.sessions.values_mut().find(|s| {
                s.approval(&approval).is_some()
                    && session.as_ref().is_none_or(|id| &s.record.id == id)
            }) {
                Some(s) => {
                    touched.push(s.record.id.clone());
                    s.handle_resolve(req, &approval, decision, &by, &mut cx);
                    s.flush(&mut cx);
                }
                // Resolved longer ago than the sessions remember (or before a restart): the
                // store says so, and it is still a second answer.
                None if stored.as_ref().is_some_and(|a| {
                    !a.is_pending()
                        && a.id == approval
                        && session.as_ref().is_none_or(|id| &a.session == id)
                }) =>
                {
                    let done = stored.expect("checked");
                    cx.out.rest.push(Effect::ReplyApproval {
                        req,
                        result: Err(crate::session::machine::already_resolved(&done)),
                    })
                }
                None => cx.out.rest.push(Effect::ReplyApproval {
                    req,
                    result: Err(Error::new(
                        ErrorCode::ApprovalNotFound,
                        match &session {
                            Some(id) => format!(
                                "no open approval request or client-side tool call \"{approval}\" in session {id}"
                            ),
                            None => format!("no open approval \"{approval}\""),
                        },
                    )),
                }),
            },
            Input::Delete { req, id } => match self.sessions.get(&id) {
                Some(s) => match s.check_delete(&mut cx) {
                    Ok(()) => {
                        let record = s.record.clone();
                        self.sessions.remove(&id);
                        // Its containers go with it (but the persistent ones), and what ran in
                        // them.
                        for c in self.containers.session_deleted(&id, &mut cx.out) {
                            self.tasks.end_in_container(now, &c, &mut cx.out);
                        }
                        self.tasks.end_of_session(now, &id.0, &mut cx.out);
                        cx.out.persist.push(Effect::Persist(Record::Delete(id)));
                        cx.out.rest.push(Effect::Forget(Box::new(record.clone())));
                        cx.out.rest.push(Effect::Reply {
                            req,
                            result: Ok(Box::new(record)),
                        });
                    }
                    Err(e) => cx.out.rest.push(Effect::Reply {
                        req,
                        result: Err(e),
                    }),
                },
                None => not_found(&mut cx, req, &id),
            },
            Input::Report { id, activity } => {
                if let Some(s) = self.sessions.get_mut(&id) {
                    s.handle_report(activity, &mut cx);
                    s.flush(&mut cx);
                }
            }
            Input::Provider {
                id,
                run,
                cursor,
                event,
            } => {
                if let Some(s) = self.sessions.get_mut(&id) {
                    s.handle_provider(run, cursor, event, &mut cx);
                    s.flush(&mut cx);
                    discard_if_refused(&mut self.sessions, &id, &mut cx.out);
                }
            }
            Input::Environment { id, event } => {
                if let Some(s) = self.sessions.get_mut(&id) {
                    s.handle_environment(event, &mut cx);
                    s.flush(&mut cx);
                    discard_if_refused(&mut self.sessions, &id, &mut cx.out);
                }
            }
            // Nothing new once the daemon shuts down: a task launched then would outlive it.
            Input::Task(TaskInput::Launch { req, .. }) if self.shutting_down => {
                cx.out.rest.push(Effect::ReplyTask {
                    req,
                    result: Err(shutting_down()),
                })
            }
            // A command for a container runs only while the container does, in its workspace,
            // with its variables under the command's own.
            Input::Task(TaskInput::Launch { req, id, mut spec }) if !spec.container_id.is_empty() => {
                match self.containers.runnable(&spec.container_id) {
                    Ok(c) => {
                        for (k, v) in &c.spec.environment {
                            spec.environment.entry(k.clone()).or_insert_with(|| v.clone());
                        }
                        spec.working_dir = c.spec.working_dir.clone();
                        let input = TaskInput::Launch { req, id, spec };
                        self.tasks.handle(now, input, &mut cx.out)
                    }
                    Err(e) => cx.out.rest.push(Effect::ReplyTask {
                        req,
                        result: Err(e),
                    }),
                }
            }
            // A command for a session runs only while the engine knows the session (its
            // environment is the session's: without it the command would run on the host),
            // with the session's variables under the command's own, as its agent has them.
            Input::Task(TaskInput::Launch { req, id, mut spec }) if !spec.session_id.is_empty() => {
                match self.sessions.get(&SessionId(spec.session_id.clone())) {
                    Some(s) => {
                        for (k, v) in &s.record.config.environment {
                            spec.environment.entry(k.clone()).or_insert_with(|| v.clone());
                        }
                        let input = TaskInput::Launch { req, id, spec };
                        self.tasks.handle(now, input, &mut cx.out)
                    }
                    None => cx.out.rest.push(Effect::ReplyTask {
                        req,
                        result: Err(Error::new(
                            ErrorCode::SessionNotFound,
                            format!("session \"{}\" not found", spec.session_id),
                        )),
                    }),
                }
            }
            Input::Task(input) => self.tasks.handle(now, input, &mut cx.out),
            Input::Container { req, .. } if self.shutting_down => {
                cx.out.rest.push(Effect::ReplyContainer {
                    req,
                    result: Err(shutting_down()),
                })
            }
            Input::Container {
                req,
                request: ContainerRequest::Create(spec),
                ..
            } if spec
                .session
                .as_ref()
                .is_some_and(|s| !self.sessions.contains_key(s)) =>
            {
                let s = spec.session.as_ref().expect("checked by the guard");
                cx.out.rest.push(Effect::ReplyContainer {
                    req,
                    result: Err(Error::new(
                        ErrorCode::SessionNotFound,
                        format!("session \"{s}\" not found"),
                    )),
                })
            }
            Input::Container { req, id, request } => {
                if let Some(ended) =
                    self.containers
                        .handle(now.wall, req, id, request, &mut cx.out)
                {
                    self.tasks.end_in_container(now, &ended, &mut cx.out);
                }
            }
            Input::ContainerReport { id, event } => self.containers.report(&id, event, &mut cx.out),
            // Nothing new once the daemon shuts down, as for sessions, tasks and containers.
            Input::AddCampaign { req, .. } if self.shutting_down => {
                cx.out.rest.push(Effect::ReplyAddCampaign {
                    req,
                    result: Err(CampaignError::ShuttingDown),
                })
            }
            Input::RemoveCampaign { req, .. } if self.shutting_down => {
                cx.out.rest.push(Effect::ReplyRemoveCampaign {
                    req,
                    result: Err(CampaignError::ShuttingDown),
                })
            }
            Input::AddCampaign { req, id, root, how } => {
                let result = self.campaigns.handle_add(&id, &root, how, now.wall);
                if let Ok((c, true)) = &result {
                    cx.out.persist.push(Effect::Persist(Record::Campaign(c.clone())));
                }
                cx.out.rest.push(Effect::ReplyAddCampaign { req, result });
            }
            Input::RemoveCampaign { req, key } => {
                let sessions = &self.sessions;
                let live = &self.live;
                let result = self.campaigns.handle_remove(&key, |campaign| {
                    live.iter()
                        .filter(|id| sessions[*id].record.config.campaign_id == campaign)
                        .count()
                });
                if let Ok(Some(c)) = &result {
                    cx.out
                        .persist
                        .push(Effect::Persist(Record::RemoveCampaign(c.id.clone())));
                }
                cx.out.rest.push(Effect::ReplyRemoveCampaign {
                    req,
                    result: result.map(|c| c.is_some()),
                });
            }
            Input::Shutdown { req, graceful } => {
                let live = self.live.len();
                self.shutting_down = true;
                for id in &touched {
                    let s = self.sessions.get_mut(id).expect("a touched session exists");
                    if s.status().is_terminal() {
                        s.cancel_pending_restart(&mut cx);
                    } else {
                        s.handle_stop(crate::NO_REPLY, graceful, &mut cx);
                    }
                    s.flush(&mut cx);
                }
                self.tasks.handle_shutdown(now, &mut cx.out);
                cx.out.rest.push(Effect::ReplyShutdown { req, live });
            }
            Input::Tick => {
                // Fire every due deadline, earliest first; a fired timer may set new ones
                // (a KILL after a TERM), which are due later than `now` unless a limit is 0, so
                // the loop is bounded by the number of timers a session can have.
                for id in &touched {
                    let s = self.sessions.get_mut(id).expect("an indexed session exists");
                    for _ in 0..8 {
                        match s.next_deadline() {
                            Some((at, t)) if at <= now.at => s.handle_timer(t, &mut cx),
                            _ => break,
                        }
                    }
                    s.flush(&mut cx);
                }
                self.tasks.handle_tick(now, &mut cx.out);
            }
        }
        // What was run in a session (`session exec`, an Aria task bound to it) ends when the
        // session does: stopped, failed, timed out, over budget, or gone.
        for id in &touched {
            let ended = self
                .sessions
                .get(id)
                .is_none_or(|s| s.status().is_terminal());
            if ended && self.live.contains(id) {
                self.tasks.end_of_session(now, &id.0, &mut cx.out);
            }
        }
        cx.out.drain_into(effects);
        self.out = cx.out;
        for id in &touched {
            self.reindex(id);
        }
        self.check_index();
    }

    /// Brings session `id`'s entries in the live set and the deadline index up to date (it
    /// may be gone: deleted, or a refused create).
    fn reindex(&mut self, id: &SessionId) {
        let (live, at, settled) = match self.sessions.get(id) {
            Some(s) => (
                !s.status().is_terminal(),
                s.next_deadline().map(|(at, _)| at),
                s.is_settled(),
            ),
            None => (false, None, false),
        };
        if settled {
            self.settled.insert(id.clone());
        } else {
            self.settled.remove(id);
        }
        if live != self.live.contains(id) {
            if live {
                self.live.insert(id.clone());
            } else {
                self.live.remove(id);
            }
        }
        let old = self.deadline_of.get(id).copied();
        if at != old {
            if let Some(old) = old {
                self.due.remove(&(old, id.clone()));
                self.deadline_of.remove(id);
            }
            if let Some(at) = at {
                self.deadline_of.insert(id.clone(), at);
                self.due.insert((at, id.clone()));
            }
        }
    }

    /// Lets go of every session that is [settled](SessionRecord::is_settled): the store holds
    /// it as it is (the shell calls this once the batch that settled it is committed and the
    /// reads of that batch are answered), and [`Engine::recall`] brings it back, with the same
    /// answers, when something names it. A daemon's memory follows its live sessions, not its
    /// history. Those let go, in id order (what the shell keeps beside each goes too). Ended
    /// tasks go the same way ([`Engine::recall_task`]).
    pub fn evict_settled(&mut self) -> Vec<SessionId> {
        self.tasks.evict_ended();
        let settled = std::mem::take(&mut self.settled);
        for id in &settled {
            let s = self.sessions.remove(id).expect("a settled session is held");
            // Nothing of it lives only in memory: no process, no open request, no deadline.
            assert!(
                s.is_settled() && !self.live.contains(id) && !self.deadline_of.contains_key(id),
                "session {id} is evicted only when settled"
            );
        }
        self.check_index();
        settled.into_iter().collect()
    }

    /// Debug builds (the tests, the simulator) check after every input that the index is what
    /// a scan of every session gives: no session changed without being reindexed.
    fn check_index(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        let live: BTreeSet<&SessionId> = self
            .sessions
            .iter()
            .filter(|(_, s)| !s.status().is_terminal())
            .map(|(id, _)| id)
            .collect();
        assert_eq!(live, self.live.iter().collect(), "the live set drifted");
        assert!(
            self.sessions
                .values()
                .filter(|s| s.status().is_terminal())
                .all(|s| s.pending().is_empty()),
            "an ended session keeps a request open"
        );
        let due: BTreeSet<(Instant, SessionId)> = self
            .sessions
            .iter()
            .filter_map(|(id, s)| s.next_deadline().map(|(at, _)| (at, id.clone())))
            .collect();
        assert_eq!(due, self.due, "the deadline index drifted");
        assert_eq!(self.due.len(), self.deadline_of.len());
        let settled: BTreeSet<&SessionId> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.is_settled())
            .map(|(id, _)| id)
            .collect();
        assert_eq!(
            settled,
            self.settled.iter().collect(),
            "the settled set drifted"
        );
    }
}

/// A session's stored requests, as the daemon that stored them had them: open ones in the
/// order they were asked, resolved ones in the order they were resolved (the window of late
/// answers).
fn restore_requests(s: &mut Session, mut requests: Vec<Approval>, now: Now) {
    requests.sort_by(|a, b| {
        (a.resolved_at, a.created_at, &a.id).cmp(&(b.resolved_at, b.created_at, &b.id))
    });
    for a in requests {
        s.restore_approval(a, now);
    }
}

/// A new session `id` (CreateSession, or an attach that found none to resume): refused while
/// the daemon shuts down, when the id is taken or when the live sessions are at their limit.
#[allow(clippy::too_many_arguments)]
fn create(
    sessions: &mut BTreeMap<SessionId, Session>,
    live: usize,
    shutting_down: bool,
    req: u64,
    id: SessionId,
    config: crate::SessionConfig,
    cx: &mut Ctx,
) {
    let refuse = if shutting_down {
        Some(self::shutting_down())
    } else if sessions.contains_key(&id) {
        Some(Error::new(
            ErrorCode::CreationFailed,
            format!("a session with id {id} already exists"),
        ))
    } else if live >= cx.lim.max_live_sessions {
        Some(Error::new(
            ErrorCode::CreationFailed,
            format!(
                "limit of {} live sessions reached; stop one first",
                cx.lim.max_live_sessions
            ),
        ))
    } else {
        None
    };
    if let Some(e) = refuse {
        cx.out.rest.push(Effect::Reply {
            req,
            result: Err(e),
        });
        return;
    }
    let record = new_record(id.clone(), config, cx.now);
    let mut s = Session::from_record(record);
    s.handle_created(req, cx);
    s.flush(cx);
    sessions.insert(id, s);
}

/// The refusal of anything new once the daemon shuts down (OBEY-2051).
pub(crate) fn shutting_down() -> Error {
    Error::new(ErrorCode::ShuttingDown, "the daemon is shutting down")
}

fn not_found(cx: &mut Ctx, req: u64, id: &SessionId) {
    cx.out.rest.push(Effect::Reply {
        req,
        result: Err(Error::new(
            ErrorCode::SessionNotFound,
            format!("session \"{id}\" not found"),
        )),
    });
}

/// After a one-session input: a create refused after all (its environment or provider
/// could not be made) leaves nothing. Everything the input would have stored is that
/// session's, so the delete replaces it (a delete is its own transaction); what the
/// driver made is removed after the commit.
fn discard_if_refused(sessions: &mut BTreeMap<SessionId, Session>, id: &SessionId, out: &mut Out) {
    if !sessions.get(id).is_some_and(Session::is_discarded) {
        return;
    }
    let s = sessions.remove(id).expect("checked");
    out.persist.clear();
    out.persist
        .push(Effect::Persist(Record::Delete(id.clone())));
    out.rest.push(Effect::Forget(Box::new(s.record)));
}

pub(crate) fn new_record(id: SessionId, config: crate::SessionConfig, now: Now) -> SessionRecord {
    SessionRecord {
        id,
        status: Status::Created,
        tokens_input: 0,
        tokens_output: 0,
        pid: None,
        restart_count: 0,
        created_at: now.wall,
        started_at: None,
        last_activity_at: None,
        ended_at: None,
        error: None,
        provider_session: None,
        last_activity_seq: 0,
        last_status_seq: 0,
        turns: 0,
        turn_open: false,
        run: None,
        provider_cursor: 0,
        last_turn_failed: false,
        env_state: if config.env.needs_provisioning() {
            crate::environment::EnvState::Creating
        } else {
            crate::environment::EnvState::Ready
        },
        disconnected: false,
        closed_by_client: false,
        config: config.into(),
    }
}

/// Each checker fires on the drift it guards against.
#[cfg(test)]
mod checks {
    use super::*;

    #[test]
    fn an_engine_as_made_keeps_its_index() {
        Engine::new(Limits::default()).check_index();
    }

    #[test]
    #[should_panic(expected = "the live set drifted")]
    fn a_live_set_that_drifted_is_caught() {
        let mut e = Engine::new(Limits::default());
        e.live.insert(SessionId("sess_ghost".into()));
        e.check_index();
    }
}
