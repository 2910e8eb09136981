//! Aria's containers: environments of their own, made and managed directly (ContainerService)
//! rather than for an agent. A container is made by a driver like a session's environment
//! (bubblewrap: the host read-only over a HOME and /tmp of its own; podman: a container from
//! an image), and commands run in it as tasks (`container:exec`).
//!
//! Its life ([`ContainerState`]):
//!
//! ```text
//!   Creating ──Made──► Running ──Stop──► Stopped ──Start──► Running
//!      │                  │  ▲                                 │
//!      └──MakeFailed──►(refused: the create fails, nothing stays)
//!                         └──StartFailed / the driver lost it──► Failed
//!   any state ──Remove──► (destroyed: the row is gone)
//! ```
//!
//! A create is answered once the driver made it (or refused, leaving nothing: no ghost row).
//! Stopping or removing a container cancels the tasks running in it; a task may be launched in
//! a container only while it runs. A container bound to a session goes with the session's
//! delete unless it is `persistent`.

use std::collections::{BTreeMap, BTreeSet};

use crate::environment::Driver;
use crate::error::{Error, ErrorCode};
use crate::model::{RequestId, SessionId};
use crate::session::effect::{Effect, Record};
use crate::session::machine::Out;
use crate::time::Timestamp;

/// What a container is made from (fixed at create).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerSpec {
    pub name: String,
    /// What the driver starts from: for podman an image reference, an image archive or a root
    /// directory; empty for bubblewrap (the host's root, read-only).
    pub image: String,
    pub driver: Driver,
    pub network: bool,
    /// Variables of every command run in it.
    pub environment: BTreeMap<String, String>,
    /// Survives its session's delete.
    pub persistent: bool,
    /// The session it belongs to, if any.
    pub session: Option<SessionId>,
    /// Who made it.
    pub user: String,
    /// Its writable workspace (commands start there).
    pub working_dir: String,
}

/// Where a container is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ContainerState {
    Creating,
    Running,
    Stopped,
    Failed,
}

impl ContainerState {
    pub const ALL: [ContainerState; 4] = [
        ContainerState::Creating,
        ContainerState::Running,
        ContainerState::Stopped,
        ContainerState::Failed,
    ];

    /// The number the store keeps.
    pub fn number(self) -> i64 {
        match self {
            ContainerState::Creating => 0,
            ContainerState::Running => 1,
            ContainerState::Stopped => 2,
            ContainerState::Failed => 3,
        }
    }

    pub fn from_number(n: i64) -> Option<ContainerState> {
        Self::ALL.into_iter().find(|s| s.number() == n)
    }

    pub fn name(self) -> &'static str {
        match self {
            ContainerState::Creating => "creating",
            ContainerState::Running => "running",
            ContainerState::Stopped => "stopped",
            ContainerState::Failed => "failed",
        }
    }
}

/// A container as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRecord {
    pub id: String,
    pub spec: ContainerSpec,
    pub state: ContainerState,
    pub created_at: Timestamp,
    /// Why it failed.
    pub error: Option<String>,
}

/// A client's request about a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerRequest {
    /// The shell checked what the host can give and made the id.
    Create(Box<ContainerSpec>),
    Start,
    Stop,
    Remove,
}

/// What the shell reports of the driver's work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerEvent {
    Made,
    MakeFailed(String),
    /// A start is done: the container runs.
    Started,
    /// A start (or a restart at daemon start-up) failed; the container is unusable.
    StartFailed(String),
}

/// What the driver is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContainerWork {
    Make,
    Start,
    Stop,
    Destroy,
}

/// Every container the daemon knows, and the rules of their life.
#[derive(Debug, Clone, Default)]
pub struct Containers {
    all: BTreeMap<String, ContainerRecord>,
    /// Creates waiting for the driver: container → the request to answer.
    creating: BTreeMap<String, RequestId>,
    /// Starts waiting for the driver, likewise.
    starting: BTreeMap<String, RequestId>,
    /// Containers being made whose session was deleted meanwhile: their making is refused
    /// when it ends.
    orphaned: BTreeSet<String>,
}

fn not_found(id: &str) -> Error {
    Error::new(
        ErrorCode::ContainerNotFound,
        format!("container \"{id}\" not found"),
    )
}

impl Containers {
    /// The containers the store holds at start-up. One still being made when the daemon went
    /// away was never answered: its create failed, so nothing of it stays (what the driver
    /// made of it is destroyed).
    pub(crate) fn restore(stored: Vec<ContainerRecord>, out: &mut Out) -> Containers {
        let mut all = BTreeMap::new();
        for c in stored {
            if c.state == ContainerState::Creating {
                Self::destroy(&c, out);
                continue;
            }
            all.insert(c.id.clone(), c);
        }
        Containers {
            all,
            creating: BTreeMap::new(),
            starting: BTreeMap::new(),
            orphaned: BTreeSet::new(),
        }
    }

    pub fn get(&self, id: &str) -> Option<&ContainerRecord> {
        self.all.get(id)
    }

    /// Every container, by id; of one session when `session` is given.
    pub fn list(&self, session: Option<&SessionId>) -> Vec<ContainerRecord> {
        self.all
            .values()
            .filter(|c| session.is_none_or(|s| c.spec.session.as_ref() == Some(s)))
            .cloned()
            .collect()
    }

    /// The container a task may run in: it exists and runs.
    pub fn runnable(&self, id: &str) -> Result<&ContainerRecord, Error> {
        let c = self.all.get(id).ok_or_else(|| not_found(id))?;
        if self.starting.contains_key(id) {
            return Err(Error::new(
                ErrorCode::WrongState,
                format!("container \"{id}\" is being started"),
            ));
        }
        if c.state != ContainerState::Running {
            return Err(Error::new(
                ErrorCode::WrongState,
                format!(
                    "container \"{id}\" is {}: a command runs only in a running container",
                    c.state.name()
                ),
            ));
        }
        Ok(c)
    }

    /// A client's request. Returns the container whose tasks must end (a stop, a remove).
    pub(crate) fn handle(
        &mut self,
        now: Timestamp,
        req: RequestId,
        id: String,
        request: ContainerRequest,
        out: &mut Out,
    ) -> Option<String> {
        let reply = |out: &mut Out, result| out.rest.push(Effect::ReplyContainer { req, result });
        if let ContainerRequest::Create(spec) = request {
            if self.all.contains_key(&id) {
                reply(
                    out,
                    Err(Error::new(
                        ErrorCode::Generic,
                        format!("a container with id {id} already exists"),
                    )),
                );
                return None;
            }
            let record = ContainerRecord {
                id: id.clone(),
                spec: *spec,
                state: ContainerState::Creating,
                created_at: now,
                error: None,
            };
            out.persist
                .push(Effect::Persist(Record::Container(Box::new(record.clone()))));
            out.rest.push(Effect::Container {
                work: ContainerWork::Make,
                record: Box::new(record.clone()),
            });
            self.all.insert(id.clone(), record);
            self.creating.insert(id, req);
            return None;
        }
        let Some(c) = self.all.get_mut(&id) else {
            reply(out, Err(not_found(&id)));
            return None;
        };
        let wrong = |c: &ContainerRecord, what: &str| {
            Err(Error::new(
                ErrorCode::WrongState,
                format!(
                    "container \"{}\" is {}: it cannot be {what}",
                    c.id,
                    c.state.name()
                ),
            ))
        };
        match (request, c.state) {
            (ContainerRequest::Create(_), _) => unreachable!("handled above"),
            (ContainerRequest::Start, ContainerState::Running)
                if !self.starting.contains_key(&id) =>
            {
                reply(out, Ok(Box::new(c.clone())))
            }
            (ContainerRequest::Start, ContainerState::Running) => {
                reply(out, wrong(c, "started again while it is being started"))
            }
            // Answered once the driver started it: a command launched after the answer runs.
            (ContainerRequest::Start, ContainerState::Stopped | ContainerState::Failed) => {
                c.state = ContainerState::Running;
                c.error = None;
                out.persist
                    .push(Effect::Persist(Record::Container(Box::new(c.clone()))));
                out.rest.push(Effect::Container {
                    work: ContainerWork::Start,
                    record: Box::new(c.clone()),
                });
                self.starting.insert(id, req);
            }
            (ContainerRequest::Stop, ContainerState::Stopped) => {
                reply(out, Ok(Box::new(c.clone())))
            }
            (ContainerRequest::Stop, ContainerState::Running | ContainerState::Failed) => {
                if let Some(start) = self.starting.remove(&id) {
                    out.rest.push(Effect::ReplyContainer {
                        req: start,
                        result: Err(Error::new(
                            ErrorCode::WrongState,
                            format!("container \"{id}\" was stopped before it started"),
                        )),
                    });
                }
                c.state = ContainerState::Stopped;
                out.persist
                    .push(Effect::Persist(Record::Container(Box::new(c.clone()))));
                out.rest.push(Effect::Container {
                    work: ContainerWork::Stop,
                    record: Box::new(c.clone()),
                });
                reply(out, Ok(Box::new(c.clone())));
                return Some(id);
            }
            (ContainerRequest::Start | ContainerRequest::Stop, ContainerState::Creating) => {
                let what = "started or stopped while it is being made";
                reply(out, wrong(c, what))
            }
            (ContainerRequest::Remove, ContainerState::Creating) => {
                reply(out, wrong(c, "removed while it is being made"))
            }
            (ContainerRequest::Remove, _) => {
                let c = self.all.remove(&id).expect("looked up above");
                if let Some(start) = self.starting.remove(&id) {
                    out.rest.push(Effect::ReplyContainer {
                        req: start,
                        result: Err(not_found(&id)),
                    });
                }
                Self::destroy(&c, out);
                reply(out, Ok(Box::new(c)));
                return Some(id);
            }
        }
        None
    }

    fn destroy(c: &ContainerRecord, out: &mut Out) {
        out.persist
            .push(Effect::Persist(Record::RemoveContainer(c.id.clone())));
        out.rest.push(Effect::Container {
            work: ContainerWork::Destroy,
            record: Box::new(c.clone()),
        });
    }

    /// The driver's report. A failed making refuses the create and leaves nothing; so does a
    /// making that ends after the container's session was deleted ([`Self::session_deleted`]),
    /// unless the container is persistent.
    pub(crate) fn report(&mut self, id: &str, event: ContainerEvent, out: &mut Out) {
        let orphan = self.orphaned.remove(id);
        let Some(c) = self.all.get_mut(id) else {
            return;
        };
        debug_assert!(!orphan || (c.state == ContainerState::Creating && !c.spec.persistent));
        let event = match event {
            ContainerEvent::Made if orphan => {
                ContainerEvent::MakeFailed("its session was deleted while it was made".into())
            }
            e => e,
        };
        match (event, c.state) {
            (ContainerEvent::Made, ContainerState::Creating) => {
                c.state = ContainerState::Running;
                out.persist
                    .push(Effect::Persist(Record::Container(Box::new(c.clone()))));
                if let Some(req) = self.creating.remove(id) {
                    out.rest.push(Effect::ReplyContainer {
                        req,
                        result: Ok(Box::new(c.clone())),
                    });
                }
            }
            (ContainerEvent::MakeFailed(reason), ContainerState::Creating) => {
                let c = self.all.remove(id).expect("looked up above");
                Self::destroy(&c, out);
                if let Some(req) = self.creating.remove(id) {
                    let code = if orphan {
                        ErrorCode::SessionNotFound
                    } else {
                        ErrorCode::SandboxInitFailed
                    };
                    out.rest.push(Effect::ReplyContainer {
                        req,
                        result: Err(Error::new(code, reason)),
                    });
                }
            }
            (ContainerEvent::Started, ContainerState::Running) => {
                if let Some(req) = self.starting.remove(id) {
                    out.rest.push(Effect::ReplyContainer {
                        req,
                        result: Ok(Box::new(c.clone())),
                    });
                }
            }
            (ContainerEvent::StartFailed(reason), ContainerState::Running) => {
                c.state = ContainerState::Failed;
                c.error = Some(reason.clone());
                out.persist
                    .push(Effect::Persist(Record::Container(Box::new(c.clone()))));
                if let Some(req) = self.starting.remove(id) {
                    out.rest.push(Effect::ReplyContainer {
                        req,
                        result: Err(Error::new(ErrorCode::SandboxInitFailed, reason)),
                    });
                }
            }
            // A late or repeated report: nothing changes.
            _ => {}
        }
    }

    /// Session `session` was deleted: its containers go too, but the persistent ones (they
    /// stay, no longer bound to it... as Aria says, they survive the session's end). Returns
    /// the containers removed (their tasks must end).
    pub(crate) fn session_deleted(&mut self, session: &SessionId, out: &mut Out) -> Vec<String> {
        let mine =
            |c: &&ContainerRecord| c.spec.session.as_ref() == Some(session) && !c.spec.persistent;
        // One being made goes when its making ends ([`Self::report`]).
        let making = self
            .all
            .values()
            .filter(mine)
            .filter(|c| c.state == ContainerState::Creating)
            .map(|c| c.id.clone());
        self.orphaned.extend(making);
        let gone: Vec<String> = self
            .all
            .values()
            .filter(mine)
            .filter(|c| c.state != ContainerState::Creating)
            .map(|c| c.id.clone())
            .collect();
        for id in &gone {
            let c = self.all.remove(id).expect("listed above");
            Self::destroy(&c, out);
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> Box<ContainerSpec> {
        Box::new(ContainerSpec {
            name: "build".into(),
            driver: Driver::Bubblewrap,
            session: Some(SessionId("s1".into())),
            ..ContainerSpec::default()
        })
    }

    /// A request about container `id`: what `handle` returns, and the effects.
    fn ask(cs: &mut Containers, id: &str, request: ContainerRequest) -> (Option<String>, Out) {
        let mut out = Out::default();
        let ended = cs.handle(Timestamp::from_millis(1), 1, id.into(), request, &mut out);
        (ended, out)
    }

    fn replies(out: &Out) -> Vec<Result<ContainerState, ErrorCode>> {
        out.rest
            .iter()
            .filter_map(|e| match e {
                Effect::ReplyContainer { result, .. } => {
                    Some(result.as_ref().map(|c| c.state).map_err(|e| e.code))
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_create_is_answered_once_made_and_a_failed_one_leaves_nothing() {
        let mut cs = Containers::default();
        let (_, out) = ask(&mut cs, "c1", ContainerRequest::Create(spec()));
        assert!(replies(&out).is_empty(), "not before the driver made it");
        assert_eq!(cs.get("c1").unwrap().state, ContainerState::Creating);
        let mut out = Out::default();
        cs.report("c1", ContainerEvent::Made, &mut out);
        assert_eq!(replies(&out), vec![Ok(ContainerState::Running)]);

        ask(&mut cs, "c2", ContainerRequest::Create(spec()));
        let mut out = Out::default();
        let failed = ContainerEvent::MakeFailed("no image".into());
        cs.report("c2", failed, &mut out);
        assert_eq!(replies(&out), vec![Err(ErrorCode::SandboxInitFailed)]);
        assert!(cs.get("c2").is_none());
        assert!(out
            .persist
            .contains(&Effect::Persist(Record::RemoveContainer("c2".into()))));
    }

    #[test]
    fn states_keep_their_stored_numbers_and_names() {
        // The store keeps the number: a change would misread every stored container.
        let numbers = ContainerState::ALL.map(ContainerState::number);
        assert_eq!(numbers, [0, 1, 2, 3]);
        for s in ContainerState::ALL {
            assert_eq!(ContainerState::from_number(s.number()), Some(s));
        }
        assert_eq!(ContainerState::from_number(4), None);
        let names = ContainerState::ALL.map(ContainerState::name);
        assert_eq!(names, ["creating", "running", "stopped", "failed"]);
    }

    #[test]
    fn a_start_while_one_is_under_way_is_refused_and_one_of_a_running_container_is_answered() {
        let mut cs = Containers::default();
        ask(&mut cs, "c", ContainerRequest::Create(spec()));
        cs.report("c", ContainerEvent::Made, &mut Out::default());
        // Running and not being started: answered at once, as it is.
        let (_, out) = ask(&mut cs, "c", ContainerRequest::Start);
        assert_eq!(replies(&out), vec![Ok(ContainerState::Running)]);
        ask(&mut cs, "c", ContainerRequest::Stop);
        let (_, out) = ask(&mut cs, "c", ContainerRequest::Start);
        assert!(replies(&out).is_empty(), "answered once started");
        // A second start before the driver reports: refused, the first still waits.
        let (_, out) = ask(&mut cs, "c", ContainerRequest::Start);
        assert_eq!(replies(&out), vec![Err(ErrorCode::WrongState)]);
        let mut out = Out::default();
        cs.report("c", ContainerEvent::Started, &mut out);
        assert_eq!(replies(&out), vec![Ok(ContainerState::Running)]);
    }

    #[test]
    fn stop_start_and_remove_follow_the_diagram() {
        let mut cs = Containers::default();
        ask(&mut cs, "c", ContainerRequest::Create(spec()));
        let (r, out) = ask(&mut cs, "c", ContainerRequest::Stop);
        assert_eq!(
            replies(&out),
            vec![Err(ErrorCode::WrongState)],
            "still being made"
        );
        assert_eq!(r, None);
        cs.report("c", ContainerEvent::Made, &mut Out::default());
        assert!(cs.runnable("c").is_ok());
        let (r, out) = ask(&mut cs, "c", ContainerRequest::Stop);
        assert_eq!(r.as_deref(), Some("c"), "its tasks end");
        assert_eq!(replies(&out), vec![Ok(ContainerState::Stopped)]);
        assert_eq!(cs.runnable("c").unwrap_err().code, ErrorCode::WrongState);
        let (_, out) = ask(&mut cs, "c", ContainerRequest::Start);
        assert!(replies(&out).is_empty(), "answered once started");
        assert_eq!(cs.runnable("c").unwrap_err().code, ErrorCode::WrongState);
        let mut out = Out::default();
        cs.report("c", ContainerEvent::Started, &mut out);
        assert_eq!(replies(&out), vec![Ok(ContainerState::Running)]);
        assert!(cs.runnable("c").is_ok());
        // A start that fails: the container is Failed, the start answered with why.
        ask(&mut cs, "c", ContainerRequest::Stop);
        ask(&mut cs, "c", ContainerRequest::Start);
        let mut out = Out::default();
        let failed = ContainerEvent::StartFailed("gone".into());
        cs.report("c", failed, &mut out);
        assert_eq!(replies(&out), vec![Err(ErrorCode::SandboxInitFailed)]);
        assert_eq!(cs.get("c").unwrap().state, ContainerState::Failed);
        let (r, _) = ask(&mut cs, "c", ContainerRequest::Remove);
        assert_eq!(r.as_deref(), Some("c"));
        assert!(cs.get("c").is_none());
        let (_, out) = ask(&mut cs, "c", ContainerRequest::Remove);
        assert_eq!(replies(&out), vec![Err(ErrorCode::ContainerNotFound)]);
    }

    #[test]
    fn a_sessions_delete_takes_its_containers_but_the_persistent_ones() {
        let mut cs = Containers::default();
        for (id, persistent) in [("a", false), ("b", true)] {
            let s = Box::new(ContainerSpec {
                persistent,
                ..*spec()
            });
            ask(&mut cs, id, ContainerRequest::Create(s));
            cs.report(id, ContainerEvent::Made, &mut Out::default());
        }
        let mut out = Out::default();
        let gone = cs.session_deleted(&SessionId("s1".into()), &mut out);
        assert_eq!(gone, vec!["a".to_string()]);
        assert!(cs.get("b").is_some());
        assert_eq!(cs.list(Some(&SessionId("s1".into()))).len(), 1);
        // Made after its session was deleted: refused, nothing stays.
        ask(&mut cs, "late", ContainerRequest::Create(spec()));
        let mut out = Out::default();
        cs.session_deleted(&SessionId("s1".into()), &mut Out::default());
        cs.report("late", ContainerEvent::Made, &mut out);
        assert_eq!(replies(&out), vec![Err(ErrorCode::SessionNotFound)]);
        assert!(cs.get("late").is_none());
        // A daemon restart destroys what was being made (its create was never answered).
        let mut half = cs.get("b").unwrap().clone();
        half.state = ContainerState::Creating;
        let mut out = Out::default();
        let cs = Containers::restore(vec![half], &mut out);
        assert!(cs.get("b").is_none());
        assert_eq!(
            out.persist,
            vec![Effect::Persist(Record::RemoveContainer("b".into()))]
        );
    }
}
