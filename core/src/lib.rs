//! paddock's core: pure, synchronous state machines for agent sessions.
//!
//! `(state, input) -> (state, effects)`. No I/O, no clock, no randomness, no tokio: time, ids
//! and configuration come in as inputs ([`Engine::handle`] takes `now`), and everything the
//! world must do comes out as an [`Effect`]. The shell (the daemon) and the simulator drive
//! this same code.
//!
//! - [`session::table`]: which (status, input) pairs are legal — the transition table.
//! - [`session::machine`]: one session's machine (turns, stops, restarts, budget, timeouts,
//!   the provider process from spawn to reap).
//! - [`Engine`]: the daemon's one engine — its sessions, Aria tasks and campaigns, one
//!   [`Input`] enum in, one [`Effect`] enum out; the next deadline and why
//!   ([`Engine::poll_timeout`]).
//! - [`task`]: Aria tasks, a part of the engine.
//! - [`approval`]: what an agent may do without asking, and requests that wait for a human.
//! - [`campaign`]: campaigns and the rules for adding and removing them.
//! - [`environment`]: where a session's agent runs (its driver) and that place's life.
//! - [`grid`]: the one Markdown renderer of the transition tables.
//! - [`process`]: the one signal type, exit-status wording, and [`process::Termination`]: the
//!   one TERM → grace → KILL rule every machine that ends a process holds.
//! - [`time`]: monotonic [`Instant`]s for deadlines, [`Duration`]s, recorded [`Timestamp`]s.
//! - [`error`]: the OBEY-NNNN registry; [`budget`]: the one place that says "over".

#![forbid(unsafe_code)]

pub mod approval;
pub mod budget;
pub mod campaign;
pub mod container;
pub mod engine;
pub mod environment;
pub mod error;
pub mod grid;
pub mod model;
pub mod process;
pub mod provider_config;
pub mod run;
pub mod session;
pub mod task;
pub mod time;

pub use approval::{
    Approval, ApprovalId, ApprovalSettings, ApprovalState, AskKind, Decision, Policy, PolicyAnswer,
    PolicyError,
};
pub use engine::{Deadline, Engine, Limits, Stored, Surviving};
pub use environment::{
    Driver, EnvEvent, EnvSpec, EnvSpecError, EnvState, KubeOptions, PodmanOptions, QemuOptions,
    SshTarget,
};
pub use error::{Error, ErrorCode, ErrorKind};
pub use model::*;
pub use provider_config::{
    AgentSettings, ClientTool, ClientToolsError, ConfigError, ProviderConfig, CLIENT_TOOLS_KEY,
    CLIENT_TOOLS_MAX, COMMAND_KEY, OWN_TOOLS, SCRIPT_KEY, SYSTEM_PROMPT_KEY,
};
pub use session::effect::{Effect, Record, Signal, SpawnSpec};
pub use session::input::{Ask, Input, ProviderEvent};
pub use session::machine::{Run, Session, Step, Timer};
pub use session::table::{InputKind, Rule};
pub use time::{Duration, Instant, Now, Timestamp};
