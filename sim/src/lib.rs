//! paddock's deterministic simulator: the real session core (`paddock-core`, the code the
//! daemon runs) driven through faults by a seeded world, and checked after every step against a
//! reference model.
//!
//! # Running it
//!
//! ```text
//! cargo test -p sim --release                      # the sweep: 10,000 seeds, then coverage;
//!                                                  # the daemon sweep (tasks, campaigns,
//!                                                  # crashes, shutdown): 2,000 seeds
//! PADDOCK_SIM_SEEDS=100000 cargo test -p sim --release --test sweep   # explore more seeds
//! PADDOCK_SIM_SEED_START=500000 cargo test -p sim --release --test sweep  # ... other seeds
//! PADDOCK_SIM_SEED=1234 cargo test -p sim --test sweep -- --nocapture     # replay one seed
//! PADDOCK_SIM_SEED=22 cargo test -p sim --test daemon -- --nocapture      # ... of the daemon sweep
//! ```
//!
//! The session sweep (`driver`, `model`, `world`) drives sessions through the daemon's own
//! effect executor (`paddock_exec`, on the fake ports of `ports`: the fake agents and the fake
//! store), so recall before an input, processes before the commit, messages and stored answers
//! after it, and eviction are the daemon's code here too. On half the seeds the daemon is now
//! and then a moment late to an output line (up to 250 ms, never past a deadline of its own)
//! and takes up to 3 more lines of other sessions that came meanwhile into the same batch; a
//! client's request is likewise followed by lines of other sessions already due. One commit for
//! all; each input's effects are checked against the reference in order, and against the store
//! as it stands after that input (the batch's transaction must equal its inputs' records
//! applied one after another); the whole state after the commit. The daemon sweep
//! ([`daemon`]) drives the same engine's Aria tasks (output, cancel, timeout, TERM → KILL
//! escalation, processes that ignore TERM, spawn failures), campaigns, daemon crashes with task
//! processes the runner still runs (each killed at start-up, its task FAILED), and the
//! shutdown (every task ended, every process reaped, no launch accepted, no deadline left).
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
//! (`PADDOCK_SIM_TAIL=N`: the last N) before the failure line: `#step t+ms in <Input>` for every input fed (provider inputs show
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
//!   `Engine::restore_with` (nothing adopted) as if from a cold start, and fails what was active (OBEY-2032).
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
//! Every output line (activity, session ref, ask) carries its cursor: 1, 2, 3, … per run, given
//! when it is first delivered and kept when it is replayed. Start, spawn failure and exit have
//! none. The stored requests for a human are loaded as the shell's store gives them (every
//! open one, the 32 most recently resolved of each session), adopted or not.
//!
//! # Environments
//!
//! Most seeds create a share of their sessions with an environment of their own (a bubblewrap
//! sandbox, a worktree, or both; now and then a `local` one that needs nothing made and starts
//! at once). Such a create stays CREATED and asks for its environment (`Effect::Provision`);
//! the world answers after a moment (`Input::Environment`) — or, as the seed's faults say, late
//! (`slow_provision`: half to twice the start-up timeout), with `ProvisionFailed`
//! (`provision_fail`), or never (`provision_hang`: the start-up timeout ends the session). The
//! making is the daemon's own work: a daemon crash drops it (the new daemon fails the session),
//! and a delete drops what is left of it (`Effect::Forget`). A report that comes after the making
//! was given up (a stop, the timeout) is still delivered, and must change nothing. The client
//! aims some stops at sessions making their environment, and a third of the seeds end the chaos
//! phase with the daemon's shutdown (graceful or not), which stops every live session at once.
//!
//! # Projects
//!
//! Half the sessions belong to one of two sunbeam projects. Most of those come from an attach
//! (`Input::Attach`, sunbeam's StartSession), which the reference answers from what the
//! clients saw: the project's newest session its client did not close is joined while live
//! (answered at once, nothing stored), restarted with the attach's context once ended (as a
//! `Restart`), and only with none is a session made (as a `Create`; now and then with a
//! configuration the shell refused, which refuses the attach). The client also closes
//! sessions (`Input::Close`), and every step checks which session each project would resume.
//! Every message to an agent is checked against its stored turn: the session's system prompt
//! goes ahead of the first one when the agent has no channel for it, and nowhere else.
//!
//! # Approvals
//!
//! Each seed picks how often its agents ask (`ask`, per mille of turns; 0 on a quarter of the
//! seeds), how often they do not wait for the answer (`abandon_ask`) and how often they ask
//! outside any turn (`stray_ask`); its sessions get a mix of permission policies (none,
//! `allow-all`, `deny`, `allow:Read,Grep`, `ask`, `ask:Read,Grep`), approval timeouts (none,
//! short ones of 100 ms – 5 s that expire, or up to 10 minutes) and defaults (`allow` or
//! `deny` on expiry); a restart's config override often changes them. A turn that asks does
//! so at one or two points, one or two requests at a time (permissions for Read, Bash, Edit,
//! Grep, Write; questions; client-side tools), maybe with a line while it waits, and holds the
//! rest of the turn until every request is answered. The agent records the one answer each
//! key gets. The client answers what it saw open (approve, deny, answer; sometimes the wrong
//! kind), answers resolved requests again, answers ids that never existed, on some seeds never
//! answers at all (everything expires), and deletes sessions (ended ones, and live ones that
//! must be refused).
//!
//! # Layout
//!
//! - [`rng`]: the seeded PRNG (SplitMix64) and the stable hash (FNV-1a).
//! - [`world`]: the faults a seed picks, the fake store (commit boundary per step; requests
//!   for a human upserted by id; a delete takes the session's rows with it), the fake runner
//!   and its provider processes (realistic turns, their faults, asks they wait on, numbered
//!   output kept for replay, surviving a daemon crash).
//! - [`client`]: the random client, the humans who answer, and agents reporting activity for
//!   sessions (StreamAgentActivity: their session's activity, ending no turn, counting no token).
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
//!   (a spawn failure, an exit before the agent is ready or the start-up timeout OBEY-2004, an
//!   environment not made in time OBEY-2005, the budget OBEY-2013, the session timeout
//!   OBEY-2014, a later exit OBEY-2031, a lost process OBEY-2032); STARTING becomes RUNNING only
//!   on the ready answer of the session's current run, and every start of a STARTING session
//!   asks its agent once;
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
//!   previous message, nor an agent waiting for an answer;
//! - an `Ask` is settled at once (one `Answer`, nothing stored) exactly when the reference
//!   policy settles it (`allow-all`, `deny`, `allow:…` for permissions; questions denied unless
//!   the policy asks; client tools never) or the session is stopping with its process still
//!   going; otherwise it opens exactly one request (stored pending, shown, a STATUS note), with
//!   the expiry the session's `approval_timeout` gives, and the session goes WAITING; while
//!   the process is being killed, or the table ignores it, nothing happens;
//! - every request emitted is persisted in the same transaction; a request is opened once,
//!   by its own Ask, and resolved once, as itself: by the client's resolve (the state and
//!   `allowed` the decision implies, `resolved_by` the client), by expiry (a Tick, only once
//!   due, `allowed` the session's default) or cancelled (never by a resolve or an ask, and
//!   only when the session stops waiting for good: afterwards it is neither WAITING nor
//!   WORKING); the store refuses any other write (resolved → pending, resolved twice);
//! - every request resolved by a client or by expiry is answered to its agent exactly once
//!   in that batch, a cancelled one only when a graceful stop tells the agent no; an `Answer`
//!   goes only to the run that asked, which must be the session's live process (not being
//!   killed), says `allowed` as the state implies, and comes once per key, ever (the fake agent
//!   checks the same from its side: a key it asked, answered once);
//! - a `Resolve` is answered at once, as the reference says from what clients saw when it was
//!   made: the request (as stored and shown) for an open one and an answer of its kind;
//!   OBEY-2011 for the wrong kind (a permission answered with text, a client tool approved);
//!   OBEY-2041 for one resolved, however long ago (the engine remembers the 32 most recently
//!   resolved of a session; beyond them the Resolve carries the store's copy, which the driver
//!   puts in as the shell does); OBEY-2040 for anything else (unknown, its session deleted);
//!   a refusal has no other effect;
//! - a `Delete` is answered at once: an ended session without a process is removed (its
//!   `Record::Delete` alone in its transaction, the store's rows gone with it, the engine and
//!   clients no longer know it); any other is refused (OBEY-2011; OBEY-2010 if unknown);
//! - environments: a create whose environment needs making stays CREATED, asks for it once
//!   (`Provision`, with the session's config) and spawns nothing; only the report that it was
//!   made starts the agent (CREATED → STARTING, one `Spawn`; the create still answered when the
//!   agent starts); a report that it could not be made refuses the create (OBEY-2005) and
//!   leaves nothing (`Record::Delete` alone in its transaction); a stop or the shutdown while it
//!   is made refuses the create (OBEY-2004) and ends the session STOPPED at once, the stop
//!   answered; the start-up timeout (counted from the create) fails it (OBEY-2005, the create
//!   answered with that error), a daemon restart too (OBEY-2032); a report on anything but a
//!   CREATED session changes nothing; a restart of a CREATED session is refused (OBEY-2011);
//! - every session removed (deleted, or a refused create discarded, after a failed spawn too)
//!   is forgotten (`Effect::Forget`) in the same batch, once, and nothing else is;
//! - a shutdown is answered at once with the number of live sessions, and stops each of them
//!   (a graceful one lets turns finish, a forced one interrupts them); nobody waits for those
//!   stops' replies.
//!
//! Checked after every step:
//! - the engine's records equal the committed ones (no change is left unpersisted), and equal
//!   what clients saw (status, seqs, tokens, turns, restart count, config, the cursor applied,
//!   the environment's state: `creating` while it is made, `ready` once made or once an agent
//!   started in it, `failed` once its making was given up);
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
//!   deadlines itself (the start-up timeout while STARTING or making its environment, the
//!   session timeout while RUNNING or WORKING, the grace period of a graceful stop waiting for a turn, the KILL due a kill grace
//!   period after a TERM until the process is gone or KILLed), and each session's
//!   `next_deadline` and `Engine::poll_timeout` must be the earliest of them (and the earliest
//!   expiry of an open request) (the driver sleeps
//!   until `poll_timeout`, so a later one would fire late); KILL is sent only when due;
//! - STARTING means a spawn is in flight or a started agent not yet ready, RUNNING, WORKING and
//!   WAITING a live process, STOPPED
//!   none (a spawn failure while STARTING fails the session in the same step); the process the
//!   engine names is the one the reference tracks from spawns, TERMs and exits;
//! - a session is WAITING exactly while it has an open request, and the engine's open
//!   requests are the store's and those clients saw open, field for field; each belongs to
//!   the session's live process; only WORKING, WAITING and STOPPING have a turn open;
//! - every agent that waits for an answer is waited for: once its ask was applied, while its
//!   process is the session's live one, the engine holds the request open (so a human, its
//!   expiry or the session's end answers it);
//! - the conversation id a run reports (`SessionRef`, unless the session has ended) is what
//!   the record keeps and what the next `Spawn` resumes;
//! - run ids are never reused while the runner remembers them: the engine avoids those the
//!   records name by itself (`restore_with`), the driver reserves the others
//!   (`reserve_runs_through`, as the shell does), and a cold start (the runner died too) uses
//!   `Engine::restore_with`.
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
//!   what clients saw;
//! - an adopted session that carries on (RUNNING, WORKING, WAITING) has exactly the requests
//!   open that were open before the crash (the input in flight is lost with its transaction),
//!   with their expiry as its deadline if earlier; every other session has none open once
//!   the restore's effects are applied (its open ones cancelled, no agent told); every resolved
//!   request loaded is known again for a late answer.
//!
//! Every restart case (committed status × adopted or not × turn open or not; CREATED, lost, is
//! a daemon that crashed while it made an environment) must be reached by the CI set, like
//! every legal pair of the table and every way an environment's making ends (made, refused,
//! stopped, shut down, timed out, lost in a crash, reported late). After the faults heal (the agents still
//! ask; the client stops sessions and answers requests): every session idle or terminal, so
//! every request resolved, within a bounded number of steps. At the end: every request
//! answered, every request for a human closed, every process reaped, no deadline left.
//!
//! The config comparisons of the whole-state check (the costliest part of it) run whenever the
//! session's record was written and on every 16th step: a config only changes with a
//! persisted restart, and a divergence never heals, so it is still caught.

#![forbid(unsafe_code)]

pub mod client;
pub mod daemon;
mod driver;
pub mod log;
pub mod model;
mod ports;
pub mod rng;
pub mod world;

pub use driver::{
    faults_of, run_seed, Coverage, Failure, Options, Outcome, Phase, Stats, RESTART_CASES,
};
pub use log::LogMode;
pub use world::Faults;
