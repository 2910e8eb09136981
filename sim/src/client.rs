//! The random client: many sessions under create, send, graceful and forced stop, restart,
//! watch and list — including calls that are illegal in the session's current state, calls for
//! sessions that do not exist and creates of ids that do.
//!
//! It aims most calls where they can do something (a message at a session it last saw
//! RUNNING, a restart at one it saw end) so that turns and restarts really happen, and the rest
//! anywhere.

use std::collections::BTreeMap;

use paddock_core::{Input, Provider, RequestId, SessionConfig, SessionId, Status};

use crate::model::Model;
use crate::rng::Rng;

/// What the client does in one step.
#[derive(Debug, Clone)]
pub enum Action {
    /// A request to the engine.
    Request(Box<Input>),
    /// Read one session's state (as WatchSession / GetSession would).
    Watch(SessionId),
    /// Read every session (as ListSessions would).
    List,
}

/// How often the client does what, picked per seed (swarm testing again: a seed that mostly
/// stops and restarts finds other bugs than one that mostly talks).
#[derive(Debug, Clone, Copy)]
struct Mix {
    create: u32,
    send: u32,
    stop_graceful: u32,
    stop_forced: u32,
    restart: u32,
    watch: u32,
    list: u32,
}

#[derive(Debug, Clone)]
pub struct Client {
    rng: Rng,
    mix: Mix,
    ids: Vec<SessionId>,
    /// How many sessions this client creates at most.
    max_sessions: usize,
    next_req: RequestId,
    /// The liveness phase: only stops.
    only_stops: bool,
}

impl Client {
    pub fn new(mut rng: Rng) -> Self {
        let mix = Mix {
            create: rng.range(1, 10) as u32,
            send: rng.range(5, 40) as u32,
            stop_graceful: rng.range(0, 8) as u32,
            stop_forced: rng.range(0, 8) as u32,
            restart: rng.range(0, 8) as u32,
            watch: rng.range(0, 4) as u32,
            list: rng.range(0, 2) as u32,
        };
        let max_sessions = rng.range(1, 10) as usize;
        Client {
            rng,
            mix,
            ids: Vec::new(),
            max_sessions,
            next_req: 1,
            only_stops: false,
        }
    }

    /// From now on the client only stops sessions (the liveness phase).
    pub fn only_stops(&mut self) {
        self.only_stops = true;
    }

    pub fn req(&mut self) -> RequestId {
        let r = self.next_req;
        self.next_req += 1;
        r
    }

    /// One action, aimed using what the client has seen so far (`model`).
    pub fn act(&mut self, model: &Model) -> Action {
        if self.only_stops {
            let id = self.target(model, |_| true);
            let graceful = self.rng.chance(1, 2);
            let req = self.req();
            return Action::Request(Box::new(Input::Stop { req, id, graceful }));
        }
        let m = self.mix;
        let create = if self.ids.len() < self.max_sessions {
            m.create
        } else {
            // Past its own quota the client still creates now and then (the live-session limit,
            // and duplicate ids, get exercised).
            m.create / 4
        };
        let weights = [
            create,
            m.send,
            m.stop_graceful,
            m.stop_forced,
            m.restart,
            m.watch,
            m.list,
        ];
        let choice = if self.ids.is_empty() {
            0
        } else {
            self.rng.weighted(&weights)
        };
        match choice {
            0 => self.create(),
            1 => {
                let id = self.target(model, |s| s == Status::Running);
                let req = self.req();
                let text = format!("message {req}");
                Action::Request(Box::new(Input::Send { req, id, text }))
            }
            2 | 3 => {
                let id = self.target(model, |s| !s.is_terminal());
                let req = self.req();
                Action::Request(Box::new(Input::Stop {
                    req,
                    id,
                    graceful: choice == 2,
                }))
            }
            4 => {
                let id = self.target(model, Status::is_terminal);
                let req = self.req();
                let provider_config = self.rng.chance(1, 3).then(|| {
                    let mut m = BTreeMap::new();
                    m.insert("effort".to_string(), format!("{}", self.rng.range(1, 3)));
                    m
                });
                Action::Request(Box::new(Input::Restart {
                    req,
                    id,
                    provider_config,
                }))
            }
            5 => Action::Watch(self.target(model, |_| true)),
            _ => Action::List,
        }
    }

    /// A session to address: mostly one whose last seen status fits `good`, sometimes any of
    /// ours, now and then one that does not exist.
    fn target(&mut self, model: &Model, good: impl Fn(Status) -> bool) -> SessionId {
        if self.ids.is_empty() || self.rng.chance(1, 40) {
            return SessionId::from("s-unknown");
        }
        if self.rng.chance(3, 4) {
            let fit: Vec<&SessionId> = self
                .ids
                .iter()
                .filter(|id| model.status(id).is_some_and(&good))
                .collect();
            if !fit.is_empty() {
                return (*self.rng.pick(&fit)).clone();
            }
        }
        self.rng.pick(&self.ids).clone()
    }

    fn create(&mut self) -> Action {
        let req = self.req();
        let id = if !self.ids.is_empty() && self.rng.chance(1, 30) {
            self.rng.pick(&self.ids).clone() // a duplicate id: refused
        } else {
            let id = SessionId(format!("s{:03}", self.ids.len() + 1));
            self.ids.push(id.clone());
            id
        };
        let provider = *self.rng.pick(&Provider::ALL);
        let mut config = SessionConfig::new("campaign-1", provider, "/campaigns/c1");
        config.model = "model-a".to_string();
        config.agent_name = format!("agent-{}", id.0);
        if self.rng.chance(2, 5) {
            config.max_tokens = self.rng.range(500, 40_000);
        }
        if self.rng.chance(2, 5) {
            config.timeout_ms = self.rng.range(2_000, 300_000);
        }
        if self.rng.chance(1, 2) {
            config.initial_message = "read the task and begin".to_string();
        }
        if self.rng.chance(1, 3) {
            config
                .provider_config
                .insert("effort".to_string(), "2".to_string());
        }
        Action::Request(Box::new(Input::Create { req, id, config }))
    }
}
