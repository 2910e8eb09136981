//! The fake ports the simulator runs the daemon's executor on (`paddock_exec`): the fake world
//! of processes ([`World`]), the fake store ([`Store`]) and the seed's clock. The executor is the
//! daemon's own code; only what its effects reach is fake.
//!
//! A fault the world finds in what it was told to do (a write to a process that exited, a run
//! id reused, …) cannot be returned through a port: the first one is kept in
//! [`SimPorts::failure`] and the driver fails the step with it.

use std::collections::{BTreeMap, BTreeSet};

use paddock_core::container::{ContainerRecord, ContainerWork};
use paddock_core::task::{TaskInput, TaskRecord, TaskSpec};
use paddock_core::{
    Approval, Effect, Engine, Now, ProviderEvent, Record, RunId, SessionConfig, SessionId,
    SessionRecord, Signal, SpawnSpec,
};
use paddock_exec::{Line, Ports};

use crate::world::{now, Millis, Store, World};

/// The world and the store, as the executor sees them.
pub struct SimPorts {
    pub world: World,
    pub store: Store,
    /// The seed's clock, set by the driver before each step.
    pub now: Millis,
    /// Every effect the engine made in this step, in order, for the driver's checks.
    pub observed: Vec<Effect>,
    /// The first thing the world refused.
    pub failure: Option<String>,
    /// Settled sessions handed back to the engine from the store.
    pub recalled: u64,
    /// Runs the runner listed at the last restart that no record names: the new daemon must
    /// KILL each (the runner then reaps it).
    pub orphans: BTreeSet<RunId>,
}

impl SimPorts {
    pub fn new(world: World) -> Self {
        SimPorts {
            world,
            store: Store::default(),
            now: 0,
            observed: Vec::new(),
            failure: None,
            recalled: 0,
            orphans: BTreeSet::new(),
        }
    }

    /// Keeps the first failure.
    fn check(&mut self, r: Result<(), String>) {
        if let Err(e) = r {
            self.failure.get_or_insert(e);
        }
    }

    /// The session sweep has no tasks and no containers: an effect for one is a failure.
    fn unexpected(&mut self, what: &str) {
        self.check(Err(format!("the session sweep made {what}")));
    }
}

impl Ports for SimPorts {
    type Error = String;

    fn now(&self) -> Now {
        now(self.now)
    }

    /// Its outcome is one of the process's scripted lines, fed later.
    fn spawn(&mut self, id: &SessionId, run: RunId, spec: SpawnSpec) -> Option<ProviderEvent> {
        let r = self.world.spawn(self.now, id, run, &spec);
        self.check(r);
        None
    }

    /// The world takes every write; a broken pipe is one of its scripted faults, reported
    /// as the process's next line.
    fn write(&mut self, id: &SessionId, run: RunId, line: Line<'_>) -> bool {
        let r = match line {
            Line::Message(_) => self.world.write(self.now, id, run),
            Line::Ready => self.world.ask_ready(self.now, id, run),
            Line::Answer(approval) => self.world.answer(self.now, id, run, approval),
        };
        self.check(r);
        true
    }

    fn close_input(&mut self, id: &SessionId, run: RunId) {
        let r = self.world.close_input(self.now, id, run);
        self.check(r);
    }

    fn signal(&mut self, id: &SessionId, run: RunId, pid: Option<u32>, signal: Signal) {
        if self.orphans.contains(&run) {
            // A run the new daemon did not adopt: KILLed at once, by the runner.
            let r = if signal == Signal::Kill {
                self.orphans.remove(&run);
                self.world.reap(run);
                Ok(())
            } else {
                Err(format!(
                    "{signal:?} to run {run} of {id}, which no record names"
                ))
            };
            return self.check(r);
        }
        let r = self.world.signal(self.now, id, run, pid, signal);
        self.check(r);
    }

    fn provision(&mut self, id: SessionId, config: SessionConfig) {
        let r = self.world.provision(self.now, &id, &config);
        self.check(r);
    }

    fn spawn_task(&mut self, _: &Engine, id: String, _: TaskSpec) -> Option<TaskInput> {
        self.unexpected(&format!("a spawn of task {id}"));
        None
    }

    fn signal_task(&mut self, id: &str, _: Option<u32>, _: Signal) {
        self.unexpected(&format!("a signal to task {id}"));
    }

    fn container(&mut self, _: ContainerWork, record: Box<ContainerRecord>) {
        self.unexpected(&format!("work on container {}", record.id));
    }

    fn settled(
        &mut self,
        id: &SessionId,
    ) -> Result<Option<(SessionRecord, Vec<Approval>)>, String> {
        let Some(rec) = self.store.sessions.get(id) else {
            return Ok(None);
        };
        self.recalled += 1;
        Ok(Some((rec.clone(), self.store.resolved_of(id))))
    }

    /// The session sweep has no tasks.
    fn ended_task(&mut self, _: &str) -> Result<Option<TaskRecord>, String> {
        Ok(None)
    }

    fn resumable(
        &mut self,
        project: &str,
        skip: &dyn Fn(&SessionId) -> bool,
    ) -> Result<Option<SessionId>, String> {
        let candidates = self.store.sessions.values().filter(|r| !skip(&r.id));
        Ok(paddock_core::session_to_resume(project, candidates).map(|r| r.id.clone()))
    }

    fn commit(&mut self, records: &[Record]) -> Result<(), String> {
        self.store.commit(records)
    }

    /// Clients are the driver's model, which reads the step's effects; only a deleted
    /// session's leftovers reach the world.
    fn deliver(&mut self, effect: Effect) {
        if let Effect::Forget(rec) = &effect {
            let r = self.world.forget(rec);
            self.check(r);
        }
    }

    fn observe(&mut self, effects: &[Effect]) {
        self.observed.extend_from_slice(effects);
    }
}

/// What the executor asked of the world, in order: the daemon sweep's ports. Its checks read the
/// log after each step (a task's signal at the moment it is sent, a status only once it is
/// stored), so every port only records.
#[derive(Debug)]
pub enum Logged {
    /// Done at once, while the batch runs (a spawn, a signal).
    At(Effect),
    /// The batch's one transaction.
    Commit(Vec<Record>),
    /// Delivered after the commit.
    Delivered(Effect),
}

/// Ports that record ([`Logged`]) and answer nothing at once: a spawn's outcome is a later
/// input of the sweep's own.
#[derive(Debug, Default)]
pub struct Recorder {
    pub now: Millis,
    pub log: Vec<Logged>,
    /// The tasks committed, as committed: what an ended task is recalled from.
    pub tasks: BTreeMap<String, TaskRecord>,
}

impl Ports for Recorder {
    type Error = String;

    fn now(&self) -> Now {
        now(self.now)
    }

    fn spawn(&mut self, id: &SessionId, run: RunId, spec: SpawnSpec) -> Option<ProviderEvent> {
        self.log.push(Logged::At(Effect::Spawn {
            id: id.clone(),
            run,
            spec: spec.into(),
        }));
        None
    }

    fn write(&mut self, id: &SessionId, run: RunId, line: Line<'_>) -> bool {
        let e = match line {
            Line::Message(text) => Effect::Write {
                id: id.clone(),
                run,
                text: text.to_string(),
            },
            Line::Ready => Effect::AskReady {
                id: id.clone(),
                run,
            },
            Line::Answer(approval) => Effect::Answer {
                id: id.clone(),
                run,
                approval: Box::new(approval.clone()),
                at_once: true,
            },
        };
        self.log.push(Logged::At(e));
        true
    }

    fn close_input(&mut self, id: &SessionId, run: RunId) {
        self.log.push(Logged::At(Effect::CloseInput {
            id: id.clone(),
            run,
        }));
    }

    fn signal(&mut self, id: &SessionId, run: RunId, pid: Option<u32>, signal: Signal) {
        self.log.push(Logged::At(Effect::Signal {
            id: id.clone(),
            run,
            pid,
            signal,
        }));
    }

    fn provision(&mut self, id: SessionId, config: SessionConfig) {
        self.log.push(Logged::At(Effect::Provision {
            id,
            config: Box::new(config),
        }));
    }

    fn spawn_task(&mut self, _: &Engine, id: String, spec: TaskSpec) -> Option<TaskInput> {
        self.log.push(Logged::At(Effect::SpawnTask {
            id,
            spec: Box::new(spec),
        }));
        None
    }

    fn signal_task(&mut self, id: &str, pid: Option<u32>, signal: Signal) {
        self.log.push(Logged::At(Effect::SignalTask {
            id: id.to_string(),
            pid,
            signal,
        }));
    }

    fn container(&mut self, work: ContainerWork, record: Box<ContainerRecord>) {
        self.log
            .push(Logged::At(Effect::Container { work, record }));
    }

    /// The daemon sweep has no sessions to recall.
    fn settled(&mut self, _: &SessionId) -> Result<Option<(SessionRecord, Vec<Approval>)>, String> {
        Ok(None)
    }

    /// The tasks the task sweep committed.
    fn ended_task(&mut self, id: &str) -> Result<Option<TaskRecord>, String> {
        Ok(self.tasks.get(id).cloned())
    }

    fn resumable(
        &mut self,
        _: &str,
        _: &dyn Fn(&SessionId) -> bool,
    ) -> Result<Option<SessionId>, String> {
        Ok(None)
    }

    fn commit(&mut self, records: &[Record]) -> Result<(), String> {
        for r in records {
            if let Record::Task(t) = r {
                self.tasks.insert(t.id.clone(), (**t).clone());
            }
        }
        self.log.push(Logged::Commit(records.to_vec()));
        Ok(())
    }

    fn deliver(&mut self, effect: Effect) {
        self.log.push(Logged::Delivered(effect));
    }
}
