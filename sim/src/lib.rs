//! paddock's deterministic simulator: the real session core (`paddock-core`, the code the
//! daemon runs) driven through faults by a seeded world, and checked after every step against a
//! reference model.
//!
//! # Running it
//!
//! ```text
//! cargo test -p sim --release                      # the sweep: 10,000 seeds, then coverage
//! PADDOCK_SIM_SEEDS=100000 cargo test -p sim --release --test sweep   # explore more seeds
//! PADDOCK_SIM_SEED_START=500000 cargo test -p sim --release --test sweep  # ... other seeds
//! PADDOCK_SIM_SEED=1234 cargo test -p sim --test sweep -- --nocapture     # replay one seed
//! ```
//!
//! # Reading a failure
//!
//! A failing seed prints exactly one line:
//!
//! ```text
//! sim failed: seed=1234 step=87 phase=chaos | <the invariant and what broke it> | faults: … |
//!   limits: … | replay: PADDOCK_SIM_SEED=1234 cargo test -p sim --test sweep
//! ```
//!
//! - `seed` reproduces everything: the faults and limits, the client, every provider line and
//!   every clock jump. Nothing else feeds the run (no wall clock, no hash-map order, no threads).
//! - `step` is the step at which an invariant broke; `phase` says whether faults were being
//!   injected (`chaos`), whether every session was being given time to settle after the faults
//!   healed (`liveness`), or whether everything was being force-stopped and reaped (`drain`).
//! - `faults` are the rates this seed picked (per mille, `daemon_crash` per 10,000 steps; 0 is
//!   off) and `limits` the engine's grace periods and live-session limit.
//!
//! Replaying with `PADDOCK_SIM_SEED` keeps the event log as text and prints its last 80 entries
//! before the failure line: `#step t+ms in <Input>` for every input fed, `out <Effect>` for
//! every effect, `clock +Nms`, `the daemon crashes`, `restored N sessions`. Read it backwards
//! from the failure.
//!
//! # Layout
//!
//! - [`rng`]: the seeded PRNG (SplitMix64) and the stable hash (FNV-1a).
//! - [`world`]: the faults a seed picks, the fake store (commit boundary per step), the fake
//!   provider processes (realistic turns, and their faults).
//! - [`client`]: the random client.
//! - [`model`]: the reference model and its invariants.
//! - `driver` (re-exported here): the loop — chaos, liveness, drain — and the daemon crashes.
//!
//! # The invariants
//!
//! Checked on every effect batch (the result of one `Engine::handle`):
//! - the drain rule: every `Persist` comes before every other effect, and every emitted status
//!   or activity is persisted, in order, in the same batch (nothing reaches a client that a
//!   crash could lose);
//! - every status event pairs the true previous status with the new one, its `seq` is the last
//!   plus one, and the pair is one the reference relation allows for the cause (the input that
//!   made it): nothing leaves STOPPED or FAILED except through a restart (and then to STARTING,
//!   with `restart_count` one higher);
//! - one turn at a time per session; every turn's stream ends exactly once (one COMPLETION or
//!   ERROR with `ends_turn`), and nothing is added to it afterwards;
//! - tokens never go down and never pass `max_tokens` by more than the event that crossed it;
//! - every reply answers a request that is waiting for one, exactly once, with what the state
//!   at the time allows (refusals at once and with the right OBEY code; starts once started;
//!   stops once stopped), and carries the committed record;
//! - every `Spawn` uses a fresh run id, for a session that has no process, with its config,
//!   restart count and conversation to resume; no `Write` or `Signal` addresses a run whose
//!   exit (or spawn failure) was delivered, or which never reported it started; a `Write` never
//!   reaches a provider still answering the previous message.
//!
//! Checked after every step:
//! - the engine's records equal the committed ones (no change is left unpersisted), and equal
//!   what clients saw (status, seqs, tokens, turns, restart count, config);
//! - `ended_at` is set exactly when terminal, an error is kept exactly while FAILED;
//! - an open turn means WORKING (or a graceful STOPPING), and never an exhausted budget;
//! - the engine's idea of each process matches the world's (no lost process, no ghost);
//! - after a Tick, no deadline is due.
//!
//! After a daemon crash: the rebuilt engine equals the store, active sessions FAILED with
//! OBEY-2032. After the faults heal: every session idle or terminal within a bounded number of
//! steps. At the end: every request answered, every process reaped, no deadline left.

pub mod client;
mod driver;
pub mod log;
pub mod model;
pub mod rng;
pub mod world;

pub use driver::{
    faults_of, run_seed, Coverage, Failure, Options, Outcome, Phase, Stats, RESTART_CASES,
};
pub use log::LogMode;
pub use world::Faults;
