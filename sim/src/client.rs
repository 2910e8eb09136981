//! The random client: many sessions under create, send, graceful and forced stop, restart,
//! delete, watch and list, agents reporting activity for them (StreamAgentActivity), and a
//! human answering the agents' requests — including calls that
//! are illegal in the session's current state, calls for sessions that do not exist, creates of
//! ids that do, second answers, answers to unknown requests and answers of the wrong kind.
//!
//! It aims most calls where they can do something (a message at a session it last saw
//! RUNNING, a restart at one it saw end, an answer to a request it saw open) so that turns,
//! restarts and approvals really happen, and the rest anywhere.

use std::collections::BTreeMap;

use paddock_core::{
    Activity, ActivityKind, ApprovalId, AskKind, Decision, Driver, EnvSpec, Input, Provider,
    ProviderConfig, RequestId, SessionConfig, SessionId, Status,
};

use crate::model::Model;
use crate::rng::Rng;

/// The sunbeam projects sessions are made for.
pub const PROJECTS: [&str; 2] = ["/campaigns/c1/app", "/campaigns/c1/lib"];
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
    /// Answer a request (0: this seed's humans never answer; everything expires).
    resolve: u32,
    delete: u32,
    /// An agent reports an activity for a session (obey's StreamAgentActivity).
    report: u32,
    /// Per mille of creates whose session gets an environment of its own (a bubblewrap
    /// sandbox, a worktree, or both: it is made before the agent starts); 0 on some seeds.
    env: u32,
}

/// How this seed's humans answer, and which policies its sessions run under.
#[derive(Debug, Clone, Copy)]
struct Humans {
    /// Per mille of answers given to a request resolved already (a second answer, maybe too
    /// late to be remembered), to a request that never existed, and of the wrong kind
    /// (a permission answered with text, a client tool "approved").
    again: u32,
    unknown: u32,
    wrong: u32,
    /// Weights of the permission policies sessions are created with: none (allow-all by
    /// default), allow-all, deny, allow:Read,Grep, ask, ask:Read,Grep.
    policies: [u32; 6],
    /// The approval timeouts sessions get: 0 none (15 minutes), 1 short (100 ms – 5 s, so
    /// expiry happens), 2 a mix of short and long (10 s – 10 min).
    timeouts: u32,
    /// Per mille of sessions whose expired requests are approved rather than denied.
    default_allow: u32,
}

const POLICIES: [Option<&str>; 6] = [
    None,
    Some("allow-all"),
    Some("deny"),
    Some("allow:Read,Grep"),
    Some("ask"),
    Some("ask:Read,Grep"),
];

#[derive(Debug, Clone)]
pub struct Client {
    rng: Rng,
    mix: Mix,
    ids: Vec<SessionId>,
    /// How many sessions this client creates at most.
    max_sessions: usize,
    next_req: RequestId,
    humans: Humans,
    /// The liveness phase: only stops and answers.
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
            resolve: if rng.chance(1, 5) {
                0
            } else {
                rng.range(2, 30) as u32
            },
            delete: rng.range(0, 2) as u32,
            report: if rng.chance(1, 3) {
                0
            } else {
                rng.range(1, 6) as u32
            },
            env: if rng.chance(1, 5) {
                0
            } else {
                rng.range(100, 900) as u32
            },
        };
        let max_sessions = rng.range(1, 10) as usize;
        let mut policies = [0; 6];
        for w in &mut policies {
            *w = if rng.chance(2, 3) {
                rng.range(1, 10) as u32
            } else {
                0
            };
        }
        let humans = Humans {
            again: rng.range(0, 200) as u32,
            unknown: rng.range(0, 60) as u32,
            wrong: rng.range(0, 150) as u32,
            policies,
            timeouts: rng.range(0, 2) as u32,
            default_allow: rng.range(0, 1000) as u32,
        };
        Client {
            rng,
            mix,
            ids: Vec::new(),
            max_sessions,
            next_req: 1,
            humans,
            only_stops: false,
        }
    }

    /// From now on the client only stops sessions and answers requests (the liveness phase).
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
            if self.mix.resolve > 0 && self.rng.chance(1, 2) {
                return self.resolve(model);
            }
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
            // Answers go where requests are open; with none open, a late or unknown one now
            // and then.
            if model.open_approvals().is_empty() {
                m.resolve / 8
            } else {
                m.resolve * 3
            },
            m.delete,
            m.report,
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
                // Now and then aimed at a session whose environment is still being made.
                let making: Vec<&SessionId> = self
                    .ids
                    .iter()
                    .filter(|id| model.status(id) == Some(Status::Created))
                    .collect();
                let id = if !making.is_empty() && self.rng.chance(1, 2) {
                    (*self.rng.pick(&making)).clone()
                } else {
                    self.target(model, |s| !s.is_terminal())
                };
                let req = self.req();
                // Now and then the client is done with it for good (sunbeam's EndSession).
                if choice == 2 && self.rng.chance(1, 4) {
                    return Action::Request(Box::new(Input::Close { req, id }));
                }
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
                    // The override replaces the whole configuration: often with other
                    // approval settings.
                    if self.rng.chance(2, 3) {
                        self.approval_settings(&mut m);
                    }
                    ProviderConfig::parse(m).expect("the simulator's settings are valid")
                });
                Action::Request(Box::new(Input::Restart {
                    req,
                    id,
                    provider_config,
                }))
            }
            5 => Action::Watch(self.target(model, |_| true)),
            6 => Action::List,
            7 => self.resolve(model),
            9 => self.report(),
            _ => {
                // Mostly sessions that ended (some still have a process going away), the
                // rest anywhere (live ones are refused).
                let id = self.target(model, Status::is_terminal);
                let req = self.req();
                Action::Request(Box::new(Input::Delete { req, id }))
            }
        }
    }

    /// An agent reports an activity of any kind, with or without tokens, for any session
    /// (one that never existed now and then).
    fn report(&mut self) -> Action {
        let id = if self.ids.is_empty() || self.rng.chance(1, 40) {
            SessionId::from("s-unknown")
        } else {
            self.rng.pick(&self.ids).clone()
        };
        let kind = *self.rng.pick(&ActivityKind::ALL);
        let n = self.rng.range(0, 1_000);
        let mut activity = Activity::new(kind, format!("reported {n}"));
        if self.rng.chance(1, 2) {
            activity = activity.with_tokens(self.rng.range(0, 50), self.rng.range(0, 50));
        }
        if matches!(kind, ActivityKind::ToolCall | ActivityKind::ToolResult) {
            activity = activity.with_tool("Bash".to_string(), format!("rep-{n}"));
            activity.tool_success = self.rng.chance(3, 4);
        }
        Action::Request(Box::new(Input::Report { id, activity }))
    }

    /// A human answers: mostly a request seen open, with an answer of the right kind; now and
    /// then a second answer, an answer to a request that never existed, or the wrong kind.
    fn resolve(&mut self, model: &Model) -> Action {
        let h = self.humans;
        let open = model.open_approvals();
        let again = self.rng.per_mille(h.again) || open.is_empty();
        let (approval, kind): (ApprovalId, Option<AskKind>) = if self.rng.per_mille(h.unknown) {
            ("ap-unknown".to_string(), None)
        } else if again {
            let done: Vec<_> = model.resolved_approvals().collect();
            if done.is_empty() {
                ("ap-unknown".to_string(), None)
            } else {
                // Mostly a recent one (still remembered), sometimes any.
                let i = if self.rng.chance(3, 4) {
                    done.len() - 1 - self.rng.index(done.len().min(8))
                } else {
                    self.rng.index(done.len())
                };
                (done[i].id.clone(), Some(done[i].kind))
            }
        } else {
            let a = *self.rng.pick(&open);
            (a.id.clone(), Some(a.kind))
        };
        let wrong = self.rng.per_mille(h.wrong);
        let text = |rng: &mut Rng| Decision::Answer {
            text: "use the staging database".to_string(),
            is_error: rng.chance(1, 5),
        };
        let deny = Decision::Deny {
            reason: "not on this branch".to_string(),
        };
        let decision = match (kind, wrong) {
            (Some(AskKind::Permission), true) => text(&mut self.rng),
            (Some(AskKind::ClientTool), true) => Decision::Approve,
            (Some(AskKind::Permission), false) => {
                if self.rng.chance(2, 3) {
                    Decision::Approve
                } else {
                    deny
                }
            }
            (Some(AskKind::ClientTool), false) => {
                if self.rng.chance(4, 5) {
                    text(&mut self.rng)
                } else {
                    deny
                }
            }
            // A question: answered, or denied, or (an empty answer) approved.
            (_, _) => match self.rng.below(3) {
                0 => text(&mut self.rng),
                1 => deny,
                _ => Decision::Approve,
            },
        };
        let req = self.req();
        let by = if self.rng.chance(1, 2) {
            "cli"
        } else {
            "sunbeam"
        };
        Action::Request(Box::new(Input::Resolve {
            req,
            approval,
            session: None,
            // (The driver puts the store's copy in, as the shell does.)
            stored: None,
            decision,
            by: by.to_string(),
        }))
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
        let mut pc = BTreeMap::new();
        // Half the sessions are a sunbeam project's (its resume rule is checked every step).
        // Most of those come from an attach to the project (sunbeam's StartSession), which
        // makes one only when it finds none to resume.
        let mut attach = None;
        if self.rng.chance(1, 2) {
            let project = *self.rng.pick(&PROJECTS);
            if self.rng.chance(2, 3) {
                attach = Some(project);
            } else {
                pc.insert(paddock_core::PROJECT_KEY.to_string(), project.to_string());
            }
        }
        if self.rng.chance(1, 3) {
            pc.insert("effort".to_string(), "2".to_string());
        }
        self.approval_settings(&mut pc);
        config.provider_config =
            ProviderConfig::parse(pc).expect("the simulator's settings are valid");
        if self.rng.per_mille(self.mix.env) {
            // A sandbox, a worktree, or both; now and then a local one that needs nothing
            // made after all (it starts at once).
            let driver = if self.rng.chance(2, 3) {
                Driver::Bubblewrap
            } else {
                Driver::Local
            };
            #[allow(
                clippy::needless_update,
                reason = "the spec grows (the sandbox's limits): new fields keep their defaults"
            )]
            let env = EnvSpec {
                driver,
                worktree: self.rng.chance(1, 2),
                network: driver.isolates() && self.rng.chance(1, 3),
                ..EnvSpec::default()
            };
            config.env = env;
        }
        let Some(project) = attach else {
            return Action::Request(Box::new(Input::Create {
                req,
                id,
                config: Box::new(config),
            }));
        };
        // Now and then the shell refused the configuration (used only if nothing resumes).
        let config = if self.rng.chance(1, 20) {
            Err(paddock_core::Error::new(
                paddock_core::ErrorCode::CreationFailed,
                "the agent's script cannot be read",
            ))
        } else {
            Ok(Box::new(config))
        };
        Action::Request(Box::new(Input::Attach {
            req,
            project: project.to_string(),
            context: format!("context of attach {req}"),
            id,
            config,
        }))
    }

    /// A session's permission policy, approval timeout and default, as this seed's humans
    /// like them.
    fn approval_settings(&mut self, pc: &mut BTreeMap<String, String>) {
        let h = self.humans;
        if let Some(p) = POLICIES[self.rng.weighted(&h.policies)] {
            pc.insert("permissions".to_string(), p.to_string());
        }
        let timeout = match h.timeouts {
            0 => None,
            1 => Some(self.short_timeout()),
            _ if self.rng.chance(1, 2) => Some(self.short_timeout()),
            _ => Some(format!("{}s", self.rng.range(10, 600))),
        };
        if let Some(t) = timeout {
            pc.insert("approval_timeout".to_string(), t);
        }
        if self.rng.per_mille(h.default_allow) {
            pc.insert("approval_default".to_string(), "allow".to_string());
        } else if self.rng.chance(1, 4) {
            pc.insert("approval_default".to_string(), "deny".to_string());
        }
    }

    fn short_timeout(&mut self) -> String {
        if self.rng.chance(1, 2) {
            format!("{}ms", self.rng.range(100, 5_000))
        } else {
            format!("{}s", self.rng.range(1, 5))
        }
    }
}
