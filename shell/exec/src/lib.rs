//! The daemon's effect executor, behind ports: the one place that says what happens to each
//! [`Effect`] and when.
//!
//! The engine decides; the executor carries its decisions out through [`Ports`] — processes,
//! the store, deliveries to clients — and feeds what comes back into the engine. The daemon
//! runs it with real ports (child processes or the runner, SQLite, gRPC streams); the
//! simulator runs the very same code with fake ones, so the rules below are checked by the
//! simulator's sweep and not only by end-to-end tests:
//!
//! - **Inputs in order, one batch at a time.** Inputs are queued with [`Executor::push`], which
//!   first recalls a settled session the input names from the store ([`Input::recalls`]), and
//!   handled by [`Executor::run`] in the order they came.
//! - **Processes at once, before the commit.** A spawn, a signal, closing an input, the ready
//!   question, a provisioning or a container's work is done while the batch runs. A spawn whose
//!   outcome is known at once (a child of the daemon's own) comes back as an input of the same
//!   batch. An answer nothing stores (the policy's) goes to the agent at once too: a crash
//!   before the commit replays the ask. What the crash leaves behind is the next daemon's to
//!   decide: a run no stored record names is killed at start-up (`Engine::restore`).
//! - **A message only after its commit.** A user message reaches the agent once the turn it
//!   opens is stored, so an agent never answers a turn a crash lost. A write the process's
//!   input refuses comes back as [`ProviderEvent::DeliveryFailed`].
//! - **Records in one commit.** Every [`Effect::Persist`] of the batch is committed by
//!   [`Executor::commit`] in one call of [`Ports::commit`]. A failed commit keeps them, and
//!   everything that waits for them, for the next try.
//! - **What clients see only after the commit.** Status, activity and approval events, replies,
//!   a stored answer or a message to an agent, a deleted session's leftovers and a container's
//!   destroy are delivered once the records they follow are stored: nobody sees what a crash
//!   could lose.
//! - **Settled sessions go back to the store.** After a commit (and the reads the caller
//!   answers from it), [`Executor::evict_settled`] lets the engine forget what is settled.

#![forbid(unsafe_code)]

use std::collections::VecDeque;

use paddock_core::container::{ContainerRecord, ContainerWork};
use paddock_core::task::{TaskInput, TaskRecord, TaskSpec};
use paddock_core::{
    Approval, Effect, Engine, Input, Now, ProviderEvent, Record, RunId, SessionConfig, SessionId,
    SessionRecord, Signal, SpawnSpec,
};

/// Inputs the daemon takes into one batch, and so one commit, at most (the command that
/// crosses it is taken whole: a line of an agent's output is applied whole).
pub const MAX_BATCH: usize = 512;

/// Deliveries a batch's buffer keeps room for between batches (a full batch of events makes
/// about one each, 96 bytes).
const DELIVER_KEPT: usize = MAX_BATCH * 2;
/// The room for one step's effects kept between runs.
const STEP_KEPT: usize = 64;

/// A line written on an agent's input.
#[derive(Debug, Clone, Copy)]
pub enum Line<'a> {
    /// A user message.
    Message(&'a str),
    /// The question whether the agent is ready (an ACP agent answers when it is).
    Ready,
    /// The answer to a request the agent made.
    Answer(&'a Approval),
}

/// What the executor needs from the world. Each method does one thing the engine decided;
/// none decides anything itself.
pub trait Ports {
    /// A store failure.
    type Error;

    /// The clock, read once per [`Executor::run`]: every input of a batch is handled at the
    /// time its run began.
    fn now(&self) -> Now;

    /// Starts an agent's run. `Some` when its outcome is known at once (a child of the daemon:
    /// `Started` with its pid, or `SpawnFailed`), `None` when it comes back later as an input
    /// (the runner reports it).
    fn spawn(&mut self, id: &SessionId, run: RunId, spec: SpawnSpec) -> Option<ProviderEvent>;

    /// Writes `line` on the input of run `run` of session `id`. False only when that run's
    /// input refused it (its queue is full or its writer gone); a run the ports do not know
    /// (it exited) takes nothing and refuses nothing.
    fn write(&mut self, id: &SessionId, run: RunId, line: Line<'_>) -> bool;

    /// Closes the run's input (a graceful end: the agent finishes and exits).
    fn close_input(&mut self, id: &SessionId, run: RunId);

    /// Signals the run's process group.
    fn signal(&mut self, id: &SessionId, run: RunId, pid: Option<u32>, signal: Signal);

    /// Makes session `id`'s environment; its outcome comes back later as an input.
    fn provision(&mut self, id: SessionId, config: SessionConfig);

    /// Starts task `id` (`engine` tells in which session's environment or container it runs).
    /// As [`Ports::spawn`]: `Some` when its outcome is known at once.
    fn spawn_task(&mut self, engine: &Engine, id: String, spec: TaskSpec) -> Option<TaskInput>;

    /// Signals a task's process group.
    fn signal_task(&mut self, id: &str, pid: Option<u32>, signal: Signal);

    /// Does a container's work, after the container's previous work; a make's or a start's
    /// outcome comes back later as an input.
    fn container(&mut self, work: ContainerWork, record: Box<ContainerRecord>);

    /// A settled session the store has and the engine does not, with its newest resolved
    /// requests ([`Engine::recall`]).
    #[allow(clippy::type_complexity)]
    fn settled(
        &mut self,
        id: &SessionId,
    ) -> Result<Option<(SessionRecord, Vec<Approval>)>, Self::Error>;

    /// An ended task the store has and the engine does not ([`Engine::recall_task`]).
    fn ended_task(&mut self, id: &str) -> Result<Option<TaskRecord>, Self::Error>;

    /// The newest session stored for `project` that the core's rule could resume
    /// ([`paddock_core::session_to_resume`] over the stored records) among those `skip` does
    /// not name: the engine's own copy of a session it holds is the one that counts.
    fn resumable(
        &mut self,
        project: &str,
        skip: &dyn Fn(&SessionId) -> bool,
    ) -> Result<Option<SessionId>, Self::Error>;

    /// Stores the batch's records in one transaction (with whatever rows of its own the caller
    /// keeps for the same batch).
    fn commit(&mut self, records: &[Record]) -> Result<(), Self::Error>;

    /// Delivers what a client or a driver sees once the batch is stored: events, replies,
    /// notices, a deleted session's leftovers.
    fn deliver(&mut self, effect: Effect);

    /// An input is about to be handled (the daemon lets go of an exited process's handle here,
    /// so that nothing more is sent to its pid).
    fn taking(&mut self, _input: &Input) {}

    /// What the engine made of the input just handled, before it is carried out.
    fn observe(&mut self, _effects: &[Effect]) {}
}

/// The engine with its batch: queued inputs, records waiting for the commit, effects waiting
/// for it to be delivered.
#[derive(Debug)]
pub struct Executor {
    engine: Engine,
    inputs: VecDeque<Input>,
    records: Vec<Record>,
    deliver: Vec<Effect>,
    /// The effects of the step being carried out (empty between steps).
    step: Vec<Effect>,
}

impl Executor {
    pub fn new(engine: Engine) -> Self {
        Executor {
            engine,
            inputs: VecDeque::new(),
            records: Vec::new(),
            deliver: Vec::new(),
            step: Vec::new(),
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// For start-up and tests: the engine outside a batch.
    pub fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// Whether inputs wait to be run (a write refused after the last commit came back as one).
    pub fn has_inputs(&self) -> bool {
        !self.inputs.is_empty()
    }

    /// The records waiting for the commit.
    pub fn uncommitted(&self) -> &[Record] {
        &self.records
    }

    /// Hands the engine the settled session `id` from the store, if it holds it not already.
    /// Not one whose delete waits in this batch (a commit held back by a full disk): the store
    /// still has it, and the engine rightly does not.
    pub fn recall<P: Ports>(&mut self, id: &SessionId, ports: &mut P) -> Result<bool, P::Error> {
        if self.engine.session(id).is_some() || self.deleting(id) {
            return Ok(false);
        }
        match ports.settled(id)? {
            Some((record, resolved)) => {
                self.engine.recall(record, resolved);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Whether the batch deletes session `id` (its commit may be held back: the store still
    /// has it).
    fn deleting(&self, id: &SessionId) -> bool {
        self.records
            .iter()
            .any(|r| matches!(r, Record::Delete(d) if d == id))
    }

    /// Queues `input`, recalling first the settled session it names, or the newest resumable
    /// session of the project it attaches to that the engine does not hold (with those it
    /// holds, the engine then sees every candidate). On a failed read nothing is queued.
    pub fn push<P: Ports>(&mut self, input: Input, ports: &mut P) -> Result<(), P::Error> {
        if let Some(id) = input.recalls() {
            self.recall(&id, ports)?;
        }
        if let Some(id) = input.recalls_task() {
            // An ended task's record is committed before the engine lets it go: the store's
            // copy is the one the engine had.
            if self.engine.task(id).is_none() {
                let stored = ports.ended_task(id)?;
                if let Some(record) = stored.filter(|r| r.status.is_terminal()) {
                    self.engine.recall_task(record);
                }
            }
        }
        if let Some(project) = input.project() {
            let held = |id: &SessionId| self.engine.session(id).is_some() || self.deleting(id);
            if let Some(id) = ports.resumable(project, &held)? {
                self.recall(&id, ports)?;
            }
        }
        self.inputs.push_back(input);
        Ok(())
    }

    /// Runs every queued input (and those their effects bring back), carrying out each one's
    /// effects before the next.
    ///
    /// The clock is read once: the inputs of a run arrived together (a batch of at most a few
    /// hundred), and their time is when the loop took them. Reading it for each of a fast
    /// agent's events (a monotonic and a wall reading) was a twentieth of the event loop's
    /// time (`perf`, P2).
    pub fn run<P: Ports>(&mut self, ports: &mut P) {
        let now = ports.now();
        // One step's effects at a time, in room kept between steps and runs.
        let mut step = std::mem::take(&mut self.step);
        while let Some(input) = self.inputs.pop_front() {
            ports.taking(&input);
            self.engine.handle_into(now, input, &mut step);
            ports.observe(&step);
            self.execute(step.drain(..), ports);
        }
        step.shrink_to(STEP_KEPT);
        self.step = step;
    }

    /// Carries out `effects` (a step's, or those of the engine's start-up): records and
    /// deliveries wait for the commit, everything else is done now.
    pub fn execute<P: Ports>(&mut self, effects: impl IntoIterator<Item = Effect>, ports: &mut P) {
        for effect in effects {
            match effect {
                Effect::Persist(record) => self.records.push(record),
                Effect::Spawn { id, run, spec } => {
                    if let Some(event) = ports.spawn(&id, run, *spec) {
                        self.inputs.push_back(Input::Provider {
                            id,
                            run,
                            cursor: None,
                            event,
                        });
                    }
                }
                // A message waits for its commit: the agent must never act on a message whose
                // turn a crash could still lose (after the restart it would answer a turn
                // nobody knows, and take the next message as a second turn at once).
                e @ Effect::Write { .. } => self.deliver.push(e),
                Effect::AskReady { id, run } => {
                    self.write(ports, id, run, Line::Ready, "the ready request")
                }
                Effect::CloseInput { id, run } => ports.close_input(&id, run),
                Effect::Signal {
                    id,
                    run,
                    pid,
                    signal,
                } => ports.signal(&id, run, pid, signal),
                Effect::Answer {
                    id,
                    run,
                    approval,
                    at_once: true,
                } => self.write(ports, id, run, Line::Answer(&approval), "an answer"),
                Effect::Provision { id, config } => ports.provision(id, *config),
                Effect::SpawnTask { id, spec } => {
                    if let Some(event) = ports.spawn_task(&self.engine, id, *spec) {
                        self.inputs.push_back(Input::Task(event));
                    }
                }
                Effect::SignalTask { id, pid, signal } => ports.signal_task(&id, pid, signal),
                // A destroy waits for the commit, like a session's environment.
                Effect::Container {
                    work: ContainerWork::Destroy,
                    record,
                } => self.deliver.push(Effect::Container {
                    work: ContainerWork::Destroy,
                    record,
                }),
                Effect::Container { work, record } => ports.container(work, record),
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
                | Effect::ReplyShutdown { .. }) => self.deliver.push(e),
            }
        }
    }

    /// Commits the batch's records, then delivers what waited for them. A failed commit
    /// delivers nothing and keeps it all for the next try (the caller's to decide when).
    pub fn commit<P: Ports>(&mut self, ports: &mut P) -> Result<(), P::Error> {
        ports.commit(&self.records)?;
        self.records.clear();
        // Drained, not taken: the next batch's deliveries reuse the room.
        let mut deliver = std::mem::take(&mut self.deliver);
        for effect in deliver.drain(..) {
            match effect {
                // Stored: the answer may go. One the agent's input refuses comes back as an
                // input of the next batch.
                Effect::Answer {
                    id, run, approval, ..
                } => self.write(ports, id, run, Line::Answer(&approval), "an answer"),
                Effect::Write { id, run, text } => {
                    self.write(ports, id, run, Line::Message(&text), "a message")
                }
                Effect::Container { work, record } => ports.container(work, record),
                // Only what `execute` held back is here: events, replies, leftovers.
                e => ports.deliver(e),
            }
        }
        deliver.shrink_to(DELIVER_KEPT);
        self.deliver = deliver;
        Ok(())
    }

    /// After a commit and the reads answered from it: the engine lets go of every session
    /// that settled (recalled when named again). Returns those let go.
    pub fn evict_settled(&mut self) -> Vec<SessionId> {
        debug_assert!(
            self.records.is_empty() && self.deliver.is_empty(),
            "eviction only after a commit"
        );
        self.engine.evict_settled()
    }

    /// Writes `line`; one the run's input refused is the session's `DeliveryFailed`, which the
    /// core rules on (OBEY-2012 for a message).
    fn write<P: Ports>(
        &mut self,
        ports: &mut P,
        id: SessionId,
        run: RunId,
        line: Line,
        what: &str,
    ) {
        if !ports.write(&id, run, line) {
            self.inputs.push_back(Input::Provider {
                id,
                run,
                cursor: None,
                event: ProviderEvent::DeliveryFailed {
                    reason: format!(
                        "{what} could not be queued for the agent's input (full, or closed)"
                    ),
                },
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use paddock_core::{Duration, Instant, Limits, Provider, Status, Timestamp};

    /// What the executor asked, in order.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Call {
        Spawn(RunId),
        Ready(RunId),
        Message(String),
        Commit(usize),
        Delivered(&'static str),
    }

    #[derive(Default)]
    struct Fake {
        calls: Vec<Call>,
        /// The next commits fail (a full disk).
        fail_commits: usize,
        /// Messages the agent's input refuses.
        refuse_messages: bool,
        /// A settled session the store has.
        stored: Option<SessionRecord>,
        t: u64,
    }

    impl Ports for Fake {
        type Error = String;
        fn now(&self) -> Now {
            Now {
                at: Instant::from_millis(self.t),
                wall: Timestamp::from_millis(1_700_000_000_000 + self.t),
            }
        }
        fn spawn(&mut self, _: &SessionId, run: RunId, _: SpawnSpec) -> Option<ProviderEvent> {
            self.calls.push(Call::Spawn(run));
            Some(ProviderEvent::Started { pid: Some(7) })
        }
        fn write(&mut self, _: &SessionId, run: RunId, line: Line<'_>) -> bool {
            match line {
                Line::Ready => self.calls.push(Call::Ready(run)),
                Line::Message(m) => {
                    self.calls.push(Call::Message(m.to_string()));
                    return !self.refuse_messages;
                }
                Line::Answer(_) => {}
            }
            true
        }
        fn close_input(&mut self, _: &SessionId, _: RunId) {}
        fn signal(&mut self, _: &SessionId, _: RunId, _: Option<u32>, _: Signal) {}
        fn provision(&mut self, _: SessionId, _: SessionConfig) {}
        fn spawn_task(&mut self, _: &Engine, _: String, _: TaskSpec) -> Option<TaskInput> {
            None
        }
        fn signal_task(&mut self, _: &str, _: Option<u32>, _: Signal) {}
        fn container(&mut self, _: ContainerWork, _: Box<ContainerRecord>) {}
        fn settled(
            &mut self,
            id: &SessionId,
        ) -> Result<Option<(SessionRecord, Vec<Approval>)>, String> {
            Ok(self
                .stored
                .clone()
                .filter(|r| &r.id == id)
                .map(|r| (r, vec![])))
        }
        fn ended_task(&mut self, _: &str) -> Result<Option<TaskRecord>, String> {
            Ok(None)
        }
        fn resumable(
            &mut self,
            project: &str,
            skip: &dyn Fn(&SessionId) -> bool,
        ) -> Result<Option<SessionId>, String> {
            let stored = self.stored.iter().filter(|r| !skip(&r.id));
            Ok(paddock_core::session_to_resume(project, stored).map(|r| r.id.clone()))
        }
        fn commit(&mut self, records: &[Record]) -> Result<(), String> {
            if self.fail_commits > 0 {
                self.fail_commits -= 1;
                return Err("disk full".into());
            }
            self.calls.push(Call::Commit(records.len()));
            Ok(())
        }
        fn deliver(&mut self, effect: Effect) {
            self.calls.push(Call::Delivered(match effect {
                Effect::Reply { .. } => "reply",
                Effect::EmitStatus(_) => "status",
                Effect::EmitActivity(_) => "activity",
                _ => "other",
            }));
        }
    }

    fn id() -> SessionId {
        SessionId("s1".into())
    }

    /// A session created, started and ready, its batch committed.
    fn running() -> (Executor, Fake) {
        let mut exec = Executor::new(Engine::new(Limits::default()));
        let mut io = Fake::default();
        let config = SessionConfig::new("c", Provider::Scripted, "/tmp");
        exec.push(
            Input::Create {
                req: 1,
                id: id(),
                config: config.into(),
            },
            &mut io,
        )
        .unwrap();
        exec.run(&mut io);
        exec.push(
            Input::Provider {
                id: id(),
                run: 1,
                cursor: None,
                event: ProviderEvent::Ready,
            },
            &mut io,
        )
        .unwrap();
        exec.run(&mut io);
        exec.commit(&mut io).unwrap();
        assert_eq!(
            exec.engine().session(&id()).unwrap().status(),
            Status::Running
        );
        // Nothing came back: the loop may wait for the world.
        assert!(!exec.has_inputs());
        (exec, io)
    }

    #[test]
    fn a_spawn_known_at_once_comes_back_in_the_same_batch_and_processes_go_before_the_commit() {
        let (_, io) = running();
        // Spawned, its Started handled in the same run (so it was asked whether it is
        // ready), all before the one commit; the replies and events after it.
        assert_eq!(io.calls[0], Call::Spawn(1));
        assert_eq!(io.calls[1], Call::Ready(1));
        let commit = io
            .calls
            .iter()
            .position(|c| matches!(c, Call::Commit(_)))
            .expect("one commit");
        assert!(matches!(io.calls[commit], Call::Commit(n) if n > 0));
        assert!(io.calls[commit + 1..]
            .iter()
            .all(|c| matches!(c, Call::Delivered(_))));
        assert!(io.calls[commit + 1..].contains(&Call::Delivered("reply")));
    }

    #[test]
    fn a_message_waits_for_its_commit_and_a_refused_one_comes_back_as_an_input() {
        let (mut exec, mut io) = running();
        io.calls.clear();
        io.refuse_messages = true;
        let send = Input::Send {
            req: 2,
            id: id(),
            text: "hi".into(),
        };
        exec.push(send, &mut io).unwrap();
        exec.run(&mut io);
        assert!(
            !io.calls.iter().any(|c| matches!(c, Call::Message(_))),
            "nothing written before the commit: {:?}",
            io.calls
        );
        exec.commit(&mut io).unwrap();
        let commit = io.calls.iter().position(|c| matches!(c, Call::Commit(_)));
        let message = io.calls.iter().position(|c| matches!(c, Call::Message(_)));
        assert!(commit < message, "{:?}", io.calls);
        // Refused: the session's DeliveryFailed waits to be run.
        assert!(exec.has_inputs());
        exec.run(&mut io);
        exec.commit(&mut io).unwrap();
        let s = exec.engine().session(&id()).unwrap();
        // The core's rule for a message that never reached its agent: the turn fails, and so
        // does the session (OBEY-2012).
        assert_eq!(s.status(), Status::Failed);
        assert!(!s.record.turn_open && s.record.last_turn_failed);
        assert_eq!(
            s.record.error.as_ref().map(|e| e.code),
            Some(paddock_core::ErrorCode::DeliveryFailed)
        );
    }

    #[test]
    fn a_failed_commit_keeps_the_batch_and_delivers_nothing_until_one_succeeds() {
        let mut exec = Executor::new(Engine::new(Limits::default()));
        let mut io = Fake {
            fail_commits: 2,
            ..Fake::default()
        };
        exec.push(
            Input::Create {
                req: 1,
                id: id(),
                config: SessionConfig::new("c", Provider::Scripted, "/tmp").into(),
            },
            &mut io,
        )
        .unwrap();
        exec.run(&mut io);
        let held = exec.uncommitted().len();
        assert!(held > 0);
        for _ in 0..2 {
            assert!(exec.commit(&mut io).is_err());
            assert_eq!(exec.uncommitted().len(), held);
            assert!(!io.calls.iter().any(|c| matches!(c, Call::Delivered(_))));
        }
        exec.commit(&mut io).unwrap();
        assert!(exec.uncommitted().is_empty());
        assert!(io.calls.contains(&Call::Commit(held)));
        assert!(io.calls.iter().any(|c| matches!(c, Call::Delivered(_))));
    }

    #[test]
    fn an_input_naming_a_settled_session_recalls_it_first() {
        let (mut exec, mut io) = running();
        // Stopped, settled and let go: only the store has it now.
        exec.push(
            Input::Stop {
                req: 3,
                id: id(),
                graceful: false,
            },
            &mut io,
        )
        .unwrap();
        exec.run(&mut io);
        io.t += Duration::from_millis(10).millis();
        exec.push(
            Input::Provider {
                id: id(),
                run: 1,
                cursor: None,
                event: ProviderEvent::Exited {
                    code: None,
                    signal: Some(15),
                    stderr_tail: String::new(),
                },
            },
            &mut io,
        )
        .unwrap();
        exec.run(&mut io);
        exec.commit(&mut io).unwrap();
        let record = exec.engine().session(&id()).unwrap().record.clone();
        assert!(record.is_settled());
        assert_eq!(exec.evict_settled().len(), 1);
        assert!(exec.engine().session(&id()).is_none());
        io.stored = Some(record);
        exec.push(Input::Delete { req: 4, id: id() }, &mut io)
            .unwrap();
        assert!(
            exec.engine().session(&id()).is_some(),
            "recalled before it runs"
        );
        exec.run(&mut io);
        exec.commit(&mut io).unwrap();
        assert!(exec.engine().session(&id()).is_none(), "and deleted");
    }

    #[test]
    fn an_attach_recalls_its_projects_newest_stored_session_and_resumes_it() {
        let mut exec = Executor::new(Engine::new(Limits::default()));
        let mut io = Fake::default();
        let attach = |req, id: &str| Input::Attach {
            req,
            project: "/p".into(),
            context: "ctx".into(),
            id: SessionId(id.into()),
            config: Ok(Box::new(SessionConfig::new("c", Provider::Scripted, "/p"))),
        };
        exec.push(attach(1, "s1"), &mut io).unwrap();
        exec.run(&mut io);
        for event in [
            ProviderEvent::Ready,
            ProviderEvent::Exited {
                code: Some(0),
                signal: None,
                stderr_tail: String::new(),
            },
        ] {
            io.t += 1;
            let input = Input::Provider {
                id: id(),
                run: 1,
                cursor: None,
                event,
            };
            exec.push(input, &mut io).unwrap();
            exec.run(&mut io);
        }
        exec.commit(&mut io).unwrap();
        let record = exec.engine().session(&id()).unwrap().record.clone();
        assert!(
            record.is_settled() && record.resumable_for("/p"),
            "{record:?}"
        );
        assert_eq!(exec.evict_settled().len(), 1);
        io.stored = Some(record);
        io.calls.clear();

        exec.push(attach(2, "s2"), &mut io).unwrap();
        assert!(exec.engine().session(&id()).is_some(), "recalled first");
        exec.run(&mut io);
        assert!(
            exec.engine().session(&SessionId("s2".into())).is_none(),
            "no second session for the project"
        );
        assert_eq!(io.calls.first(), Some(&Call::Spawn(2)), "{:?}", io.calls);
    }
}
