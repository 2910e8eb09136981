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
//! before the failure line: `#step t+ms in <Input>` for every input fed (provider inputs show
//! their `cursor`), `out <Effect>` for every effect, `clock +Nms`, `the daemon crashes`, `the
//! runner survives`, `adopting run R of S: output replayed after cursor C`, `restored N
//! sessions`. Read it backwards from the failure.
//!
//! # Daemon crashes and the runner
//!
//! Provider processes run under a separate runner process. When the daemon crashes
//! (`daemon_crash`, maybe with an input in flight whose transaction is lost:
//! `crash_mid_step`), the runner survives it with probability `runner_survives`:
//!
//! - The runner died too: every process dies unheard; the new daemon is built with
//!   `Engine::restore` as if from a cold start, and fails what was active (OBEY-2032).
//! - The runner survived: its processes go on in simulated time through the downtime (their
//!   output and exits keep coming due). On half of these crashes it lists every process whose
//!   exit the daemon has not read — including one whose exit was the input in flight, and one
//!   still starting (as started; a spawn that fails made no process); on the other half only
//!   those still running (as the shell's `surviving_agents` does: a run that exited while the
//!   daemon was down is not adopted, and its last output is never read). Now and then it also
//!   lists a stale run its session no longer has. The new daemon is built with
//!   `Engine::restore_with(…, surviving)` and adopts the processes whose session's committed
//!   record names their run; any other is stopped unheard (never, so far: nothing should be
//!   left unnamed). Of every adopted run the runner replays the output after the committed
//!   `provider_cursor`, from up to 3 lines before it (those must be recognised as applied
//!   already), then the rest, its exit last.
//!
//! Every output line (activity, session ref) carries its cursor: 1, 2, 3, … per run, given when
//! it is first delivered and kept when it is replayed. Start, spawn failure and exit have
//! none.
//!
//! # Layout
//!
//! - [`rng`]: the seeded PRNG (SplitMix64) and the stable hash (FNV-1a).
//! - [`world`]: the faults a seed picks, the fake store (commit boundary per step), the fake
//!   runner and its provider processes (realistic turns, their faults, numbered output kept
//!   for replay, surviving a daemon crash).
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
//!   with `restart_count` one higher); every FAILED carries the error code its cause implies
//!   (a spawn failure or the start-up timeout OBEY-2004, the budget OBEY-2013, the session
//!   timeout OBEY-2014, an exit OBEY-2031, a lost process OBEY-2032);
//! - only a forced stop, a restart, a deadline, the budget, an exit or a daemon restart
//!   interrupts a turn: a graceful stop (a second one too) waits for it;
//! - one turn at a time per session; every turn's stream ends exactly once (one COMPLETION or
//!   ERROR with `ends_turn`), and nothing is added to it afterwards — across daemon crashes
//!   too: a turn open at a crash stays open in the store and either ends at restore (an ERROR
//!   saying OBEY-2032 if its process was lost; an ERROR if it was adopted while stopping) or
//!   goes on in the adopted process;
//! - every provider output event is applied exactly once per run: one at or before the
//!   session's applied cursor (a replay after a restart) changes nothing, any other is applied
//!   and its cursor stored in the same transaction; a provider event the table ignores
//!   changes nothing but that cursor;
//! - tokens never go down and never pass `max_tokens` by more than the event that crossed it;
//! - every reply answers a request that is waiting for one, exactly once, with what the state
//!   at the time allows (refusals at once and with the right OBEY code; starts once started;
//!   stops once stopped), and carries the committed record;
//! - every `Spawn` uses a fresh run id (never that of a process that outlived a daemon), for a
//!   session that has no process, with its config, restart count and conversation to resume;
//!   no `Write` or `Signal` addresses a run whose exit (or spawn failure) was delivered, or
//!   which never reported it started; a `Write` never reaches a provider still answering the
//!   previous message.
//!
//! Checked after every step:
//! - the engine's records equal the committed ones (no change is left unpersisted), and equal
//!   what clients saw (status, seqs, tokens, turns, restart count, config, the cursor applied);
//! - the record names the session's process (`run`) and says whether a turn is open
//!   (`turn_open`), so that a restarted daemon adopts the right process and ends or continues
//!   the right turn; turns begun = turns ended + the open one;
//! - `ended_at` is set exactly when terminal, an error is kept exactly while FAILED;
//! - an open turn means WORKING (or a graceful STOPPING), and never an exhausted budget;
//! - a first start sends the initial message (no session is RUNNING after its first start
//!   with an initial message and no turn);
//! - the engine's idea of each process matches the world's (no lost process, no ghost);
//! - after a Tick, no deadline is due;
//! - one next deadline, with its reason: the reference model computes every session's
//!   deadlines itself (the start-up timeout while STARTING, the session timeout while RUNNING or
//!   WORKING, the grace period of a graceful stop waiting for a turn, the KILL due a kill grace
//!   period after a TERM until the process is gone or KILLed), and each session's
//!   `next_deadline` and `Engine::poll_timeout` must be the earliest of them (the driver sleeps
//!   until `poll_timeout`, so a later one would fire late); KILL is sent only when due;
//! - STARTING means a spawn is in flight, RUNNING and WORKING a live process, STOPPED none (a
//!   spawn failure while STARTING fails the session in the same step);
//! - the conversation id a run reports (`SessionRef`, unless the session has ended) is what
//!   the record keeps and what the next `Spawn` resumes;
//! - run ids are never reused while the runner remembers them: the engine avoids those the
//!   records name by itself (`restore_with`), the driver reserves the others
//!   (`reserve_runs_through`, as the shell does), and a cold start (the runner died too) uses
//!   `Engine::restore`.
//!
//! After a daemon crash, the rebuilt engine equals the store changed exactly as the restart
//! rules say:
//! - adopted (the runner kept its process and the record names it): STARTING becomes RUNNING
//!   (started now; and WORKING on its initial message if this is its first start); RUNNING and
//!   WORKING carry on (same turn, session timeout from the stored start); STOPPING has its
//!   open turn interrupted and its process TERMed (the stop ends STOPPED, with no replies);
//!   FAILED has its process TERMed; each gets the deadline that implies, and the record's pid;
//! - not adopted: its record names no run (cursor 0, no pid); an active session is FAILED with
//!   OBEY-2032, its open turn ended first with an ERROR saying so;
//! - nothing the runner keeps alive is lost: every process it still has was adopted (or is
//!   named by no record, and is stopped); and what was applied of an adopted run's output is
//!   what clients saw.
//!
//! Every restart case (committed status × adopted or not × turn open or not) must be reached
//! by the CI set, like every legal pair of the table. After the faults heal: every session
//! idle or terminal within a bounded number of steps. At the end: every request answered,
//! every process reaped, no deadline left.

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
