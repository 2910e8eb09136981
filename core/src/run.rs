//! One child process's life, as the runner (`paddock runner`) sees it: started, running, being
//! stopped (TERM, then KILL after a grace period), exited. Until its exit the run holds the
//! process's [`Life`] (the phases `Starting`, `Running` and `Terminating` are its `Starting`,
//! `Alive` and `Terminating`), then its final status.
//!
//! ```text
//!   Starting ─Started─▶ Running ─Stop{now}─▶ Terminating{kill_at} ─Tick{now ≥ kill_at}─▶ KILL
//!      │                   │                      │                                      │
//!      └─SpawnFailed─▶ Exited ◀──────Exited───────┴────────────────Exited────────────────┘
//! ```
//!
//! Same shape as the session machine: `handle(input) -> Result<Vec<Effect>, Refusal>` is the
//! only way the state changes; getters take `&self`; [`RunMachine::poll_timeout`] says when the
//! shell must next feed [`Input::Tick`]. Time comes in with the inputs that need it (`Stop`,
//! `Tick`): the machine never reads a clock, and a time that goes backwards is treated as the
//! latest time seen.
//!
//! The drain rule: the effects of one `handle` call are carried out in order (a `Signal` before
//! the `Emit` that follows it). The shell feeds `Exited` only after the child's output was read
//! to its end, so the final status is always the last thing a run emits.
//!
//! Which (phase, input) pairs are legal is [`rule`], printable with [`render`].

use crate::process::Life;
use crate::time::{Duration, Instant};

pub use crate::process::{signal_name, Signal, KILL_GRACE as DEFAULT_KILL_GRACE};

/// How a run's `Failed` status begins when its process could not start.
const COULD_NOT_START: &str = "could not start: ";

/// The reason a run whose process could not start gave ([`Input::SpawnFailed`]'s), read back
/// from its status message: a client that says "could not start" in its own words (the
/// daemon's session and task machines) does not say it twice.
pub fn spawn_failure_reason(message: &str) -> &str {
    message.strip_prefix(COULD_NOT_START).unwrap_or(message)
}

/// How a run's status line reads: the seed's `RunState` without `UNSPECIFIED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StatusKind {
    Started,
    Finished,
    Failed,
}

/// One lifecycle status for the run's stream (`RunStatus` on the wire).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub kind: StatusKind,
    /// The exit code for `Finished`; for `Failed`, 128 + the signal number when a signal
    /// ended the process (the shell's convention), the launch error's code otherwise.
    pub exit_code: i32,
    pub message: String,
}

/// Where the process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Spawn was asked for; no answer yet.
    Starting,
    Running,
    /// TERM was sent by a stop; KILL follows at the deadline unless the process exits first.
    Terminating,
    /// Gone (or never started): the final status was emitted.
    Exited,
}

impl Phase {
    pub const ALL: [Phase; 4] = [
        Phase::Starting,
        Phase::Running,
        Phase::Terminating,
        Phase::Exited,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Starting => "Starting",
            Phase::Running => "Running",
            Phase::Terminating => "Terminating",
            Phase::Exited => "Exited",
        }
    }
}

/// One input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// The process was spawned.
    Started { pid: u32 },
    /// The process could not be spawned; `exit_code` as a shell would report it (127 not
    /// found, 126 not executable, -1 otherwise).
    SpawnFailed { reason: String, exit_code: i32 },
    /// The process printed something (one event's worth).
    Output { bytes: u64 },
    /// The process exited and its output was read to the end. `detail`: what it said on
    /// stderr last, if anything (for the status message of a failure).
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
        detail: String,
    },
    /// A client asked for `signal` to be sent once (SignalSession): no escalation.
    Signal { signal: Signal },
    /// Stop: TERM now, KILL at `now + grace` if the process is still there.
    Stop { now: Instant, grace: Duration },
    /// Time passed.
    Tick { now: Instant },
}

/// The class of an input, for the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum InputKind {
    Started,
    SpawnFailed,
    Output,
    Exited,
    Signal,
    Stop,
    Tick,
}

impl InputKind {
    pub const ALL: [InputKind; 7] = [
        InputKind::Started,
        InputKind::SpawnFailed,
        InputKind::Output,
        InputKind::Exited,
        InputKind::Signal,
        InputKind::Stop,
        InputKind::Tick,
    ];

    pub fn name(self) -> &'static str {
        match self {
            InputKind::Started => "Started",
            InputKind::SpawnFailed => "SpawnFailed",
            InputKind::Output => "Output",
            InputKind::Exited => "Exited",
            InputKind::Signal => "Signal",
            InputKind::Stop => "Stop",
            InputKind::Tick => "Tick",
        }
    }
}

impl Input {
    pub fn kind(&self) -> InputKind {
        match self {
            Input::Started { .. } => InputKind::Started,
            Input::SpawnFailed { .. } => InputKind::SpawnFailed,
            Input::Output { .. } => InputKind::Output,
            Input::Exited { .. } => InputKind::Exited,
            Input::Signal { .. } => InputKind::Signal,
            Input::Stop { .. } => InputKind::Stop,
            Input::Tick { .. } => InputKind::Tick,
        }
    }
}

/// What the shell must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Send this signal to the child's process group.
    Signal(Signal),
    /// Append this status to the run's event log.
    Emit(Status),
}

/// Why a request (`Signal`, `Stop`) was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The process is not running yet.
    NotStarted,
    /// The process is gone.
    AlreadyExited,
}

impl Refusal {
    /// The wording the seed's `SignalResponse.message` suggests.
    pub fn message(self) -> &'static str {
        match self {
            Refusal::NotStarted => "not started yet",
            Refusal::AlreadyExited => "already exited",
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

/// What the machine does with a (phase, input) pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    Legal,
    Refuse(Refusal),
    /// Dropped without effect (a late or irrelevant input).
    Ignore,
}

/// The transition table: the one place that says which pairs are legal.
pub fn rule(phase: Phase, input: InputKind) -> Rule {
    use InputKind as I;
    use Phase as P;
    use Rule::{Ignore, Legal, Refuse};
    match (phase, input) {
        (P::Starting, I::Started | I::SpawnFailed) => Legal,
        (P::Starting, I::Signal | I::Stop) => Refuse(Refusal::NotStarted),
        (P::Starting, I::Output | I::Exited | I::Tick) => Ignore,

        (P::Running, I::Output | I::Exited | I::Signal | I::Stop) => Legal,
        // Nothing runs on a timer while the process just runs.
        (P::Running, I::Started | I::SpawnFailed | I::Tick) => Ignore,

        (P::Terminating, I::Output | I::Exited | I::Signal | I::Stop | I::Tick) => Legal,
        (P::Terminating, I::Started | I::SpawnFailed) => Ignore,

        (P::Exited, I::Signal | I::Stop) => Refuse(Refusal::AlreadyExited),
        (P::Exited, _) => Ignore,
    }
}

/// The table as Markdown: one row per phase, one column per input.
pub fn render() -> String {
    crate::grid::render(
        "phase",
        &Phase::ALL,
        &InputKind::ALL,
        Phase::name,
        InputKind::name,
        |p, i| match rule(p, i) {
            Rule::Legal => "legal".to_string(),
            Rule::Refuse(r) => format!("refuse: {r}"),
            Rule::Ignore => "·".to_string(),
        },
    )
}

/// The process's [`Life`] (the runner never asks its child to end its own way: no
/// `Ending`), then its final status.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    Live(Life),
    Exited { status: Status },
}

/// One child process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunMachine {
    state: State,
    /// The latest time seen (time never goes backwards here).
    now: Instant,
    output_events: u64,
    output_bytes: u64,
    /// A stop was asked for (so a TERM death is expected, not a crash).
    stopped: bool,
}

impl Default for RunMachine {
    fn default() -> Self {
        Self::new()
    }
}

impl RunMachine {
    pub fn new() -> Self {
        RunMachine {
            state: State::Live(Life::Starting),
            now: Instant::ORIGIN,
            output_events: 0,
            output_bytes: 0,
            stopped: false,
        }
    }

    // ── getters ────────────────────────────────────────────────────────────

    pub fn phase(&self) -> Phase {
        match self.state {
            State::Live(Life::Starting) => Phase::Starting,
            State::Live(Life::Alive { .. }) => Phase::Running,
            State::Live(Life::Terminating { .. }) => Phase::Terminating,
            State::Live(Life::Ending { .. }) => unreachable!("a run is never asked to end"),
            State::Exited { .. } => Phase::Exited,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        match self.state {
            State::Live(life) => life.pid(),
            State::Exited { .. } => None,
        }
    }

    /// The final status, once the run is over.
    pub fn outcome(&self) -> Option<&Status> {
        match &self.state {
            State::Exited { status } => Some(status),
            _ => None,
        }
    }

    pub fn is_exited(&self) -> bool {
        self.phase() == Phase::Exited
    }

    /// A stop was asked for.
    pub fn is_stopping(&self) -> bool {
        self.stopped
    }

    pub fn output_events(&self) -> u64 {
        self.output_events
    }

    pub fn output_bytes(&self) -> u64 {
        self.output_bytes
    }

    /// The next deadline and what it is for: when the shell must feed `Tick`.
    pub fn poll_timeout(&self) -> Option<(Instant, &'static str)> {
        match self.state {
            State::Live(life) => life.deadline().map(|at| (at, "TERM to KILL escalation")),
            State::Exited { .. } => None,
        }
    }

    // ── handle ─────────────────────────────────────────────────────────────

    /// Feeds one input. `Err` for a refused request (nothing changed); `Ok(vec![])` for an
    /// ignored input.
    pub fn handle(&mut self, input: Input) -> Result<Vec<Effect>, Refusal> {
        match rule(self.phase(), input.kind()) {
            Rule::Legal => {}
            Rule::Ignore => return Ok(Vec::new()),
            Rule::Refuse(r) => return Err(r),
        }
        let before = self.phase();
        let out = self.apply(input);
        self.check(before, &out);
        Ok(out)
    }

    /// The machine's invariants, after every applied input (debug builds; the simulator and
    /// the tests run them): the phase only moves forward; a status is emitted exactly when the
    /// run starts or ends; a stop begins with TERM; a pending escalation belongs to a stop, is
    /// never later than its grace from the latest time seen, and ends with the KILL.
    fn check(&self, before: Phase, out: &[Effect]) {
        if !cfg!(debug_assertions) {
            return;
        }
        let after = self.phase();
        debug_assert!(
            after >= before,
            "a run never goes back: {before:?} -> {after:?}"
        );
        let emitted = out.iter().filter(|e| matches!(e, Effect::Emit(_))).count();
        let entered = after != before && matches!(after, Phase::Running | Phase::Exited);
        debug_assert_eq!(
            emitted,
            usize::from(entered),
            "a status is emitted exactly when the run starts or ends ({before:?} -> {after:?})"
        );
        if after == Phase::Terminating {
            debug_assert!(self.stopped, "only a stop terminates or escalates");
        }
        if let Some(term) = self.termination() {
            if let Some(at) = term.kill_at() {
                debug_assert!(!term.escalated(), "an escalation is pending until its KILL");
                debug_assert!(
                    at.millis() <= self.now.millis().saturating_add(term.grace().millis()),
                    "the KILL is due within the grace"
                );
            }
        }
        if before == Phase::Running && after == Phase::Terminating {
            debug_assert_eq!(
                out,
                [Effect::Signal(Signal::Term)],
                "a stop begins with TERM"
            );
        }
    }

    /// One legal input's change.
    fn apply(&mut self, input: Input) -> Vec<Effect> {
        let mut out = Vec::new();
        match input {
            Input::Started { pid } => {
                if let State::Live(life) = &mut self.state {
                    life.started(Some(pid));
                }
                out.push(Effect::Emit(Status {
                    kind: StatusKind::Started,
                    exit_code: 0,
                    message: format!("started (pid {pid})"),
                }));
            }
            Input::SpawnFailed { reason, exit_code } => {
                let status = Status {
                    kind: StatusKind::Failed,
                    exit_code,
                    message: format!("{COULD_NOT_START}{reason}"),
                };
                self.state = State::Exited {
                    status: status.clone(),
                };
                out.push(Effect::Emit(status));
            }
            Input::Output { bytes } => {
                self.output_events += 1;
                self.output_bytes = self.output_bytes.saturating_add(bytes);
            }
            Input::Exited {
                code,
                signal,
                detail,
            } => {
                let status = self.exit_status(code, signal, &detail);
                self.state = State::Exited {
                    status: status.clone(),
                };
                out.push(Effect::Emit(status));
            }
            Input::Signal { signal } => {
                if signal == Signal::Kill {
                    // KILL cannot be outdone: no escalation is pending any more.
                    if let State::Live(life) = &mut self.state {
                        life.killed();
                    }
                }
                out.push(Effect::Signal(signal));
            }
            Input::Stop { now, grace } => {
                let now = self.advance(now);
                self.stopped = true;
                // TERM; a second stop joins the first, a shorter grace cutting the wait short.
                if let State::Live(life) = &mut self.state {
                    out.extend(life.terminate(now, grace).map(Effect::Signal));
                }
            }
            Input::Tick { now } => {
                let now = self.advance(now);
                if let State::Live(life) = &mut self.state {
                    out.extend(life.tick(now).map(Effect::Signal));
                }
            }
        }
        out
    }

    /// The termination under way, once a stop sent TERM.
    fn termination(&self) -> Option<&crate::process::Termination> {
        match &self.state {
            State::Live(life) => life.termination(),
            State::Exited { .. } => None,
        }
    }

    fn advance(&mut self, now: Instant) -> Instant {
        self.now = self.now.max(now);
        self.now
    }

    fn exit_status(&self, code: Option<i32>, signal: Option<i32>, detail: &str) -> Status {
        let detail = detail.trim();
        let with_detail = |mut msg: String| {
            if !detail.is_empty() {
                msg.push_str("; stderr: ");
                msg.push_str(detail);
            }
            msg
        };
        match (code, signal) {
            (_, Some(_)) => {
                let mut msg = crate::process::describe_exit(code, signal);
                let escalated = self
                    .termination()
                    .and_then(|term| term.escalated().then(|| term.grace()));
                if let Some(grace) = escalated {
                    let grace = grace.millis();
                    msg.push_str(&format!(
                        " after ignoring SIGTERM for {grace} ms (stop escalated to SIGKILL)"
                    ));
                } else if self.stopped {
                    msg.push_str(" (stopped)");
                }
                let msg = if self.stopped { msg } else { with_detail(msg) };
                Status {
                    kind: StatusKind::Failed,
                    exit_code: crate::process::exit_code(code, signal)
                        .expect("a signal's exit has a code"),
                    message: msg,
                }
            }
            (Some(c), None) => {
                let msg = if self.stopped {
                    format!("exited with code {c} after SIGTERM (stopped)")
                } else if c == 0 {
                    crate::process::describe_exit(code, signal)
                } else {
                    with_detail(crate::process::describe_exit(code, signal))
                };
                Status {
                    kind: StatusKind::Finished,
                    exit_code: c,
                    message: msg,
                }
            }
            (None, None) => Status {
                kind: StatusKind::Failed,
                exit_code: -1,
                message: with_detail(crate::process::describe_exit(code, signal)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(pid: u32) -> RunMachine {
        let mut m = RunMachine::new();
        m.handle(Input::Started { pid }).unwrap();
        m
    }

    fn exited(code: Option<i32>, signal: Option<i32>) -> Input {
        Input::Exited {
            code,
            signal,
            detail: String::new(),
        }
    }

    fn emitted(effects: &[Effect]) -> &Status {
        match effects {
            [Effect::Emit(s)] => s,
            other => panic!("expected one Emit, got {other:?}"),
        }
    }

    #[test]
    fn a_run_starts_and_finishes() {
        let mut m = RunMachine::new();
        assert_eq!(m.phase(), Phase::Starting);
        let fx = m.handle(Input::Started { pid: 42 }).unwrap();
        let s = emitted(&fx);
        assert_eq!(s.kind, StatusKind::Started);
        assert_eq!(m.pid(), Some(42));
        assert!(m.handle(Input::Output { bytes: 10 }).unwrap().is_empty());
        let fx = m.handle(exited(Some(3), None)).unwrap();
        let s = emitted(&fx);
        assert_eq!((s.kind, s.exit_code), (StatusKind::Finished, 3));
        assert!(m.is_exited());
        assert_eq!(m.outcome(), Some(s));
        assert_eq!((m.output_events(), m.output_bytes()), (1, 10));
        assert_eq!(m.pid(), None);
    }

    #[test]
    #[should_panic(expected = "a run never goes back")]
    fn the_checker_catches_a_run_going_back() {
        running(5).check(Phase::Exited, &[]);
    }

    #[test]
    #[should_panic(expected = "a status is emitted exactly when the run starts or ends")]
    fn the_checker_catches_a_start_without_its_status() {
        running(5).check(Phase::Starting, &[]);
    }

    #[test]
    fn output_is_counted_by_event_and_byte() {
        let mut m = running(5);
        for bytes in [3, 4, 5] {
            m.handle(Input::Output { bytes }).unwrap();
        }
        assert_eq!((m.output_events(), m.output_bytes()), (3, 12));
    }

    #[test]
    fn an_exit_with_neither_code_nor_signal_is_a_failure_with_code_minus_one() {
        let mut m = running(5);
        let fx = m.handle(exited(None, None)).unwrap();
        let s = emitted(&fx);
        assert_eq!((s.kind, s.exit_code), (StatusKind::Failed, -1));
        assert!(!m.is_stopping(), "no stop was asked for");
    }

    #[test]
    fn a_failed_spawn_is_a_failed_status_and_the_end() {
        let mut m = RunMachine::new();
        let fx = m
            .handle(Input::SpawnFailed {
                reason: "codex: No such file or directory".into(),
                exit_code: 127,
            })
            .unwrap();
        let s = emitted(&fx);
        assert_eq!((s.kind, s.exit_code), (StatusKind::Failed, 127));
        assert_eq!(
            s.message,
            "could not start: codex: No such file or directory"
        );
        // The reason reads back from the message, for a client that words the failure itself.
        assert_eq!(
            spawn_failure_reason(&s.message),
            "codex: No such file or directory"
        );
        assert_eq!(
            spawn_failure_reason("the runner went away"),
            "the runner went away"
        );
        assert_eq!(
            m.handle(Input::Stop {
                now: Instant::from_millis(0),
                grace: Duration::from_millis(1)
            }),
            Err(Refusal::AlreadyExited)
        );
    }

    #[test]
    fn stop_terms_then_kills_after_the_grace_period() {
        let mut m = running(7);
        assert!(!m.is_stopping());
        let fx = m
            .handle(Input::Stop {
                now: Instant::from_millis(1_000),
                grace: DEFAULT_KILL_GRACE,
            })
            .unwrap();
        assert_eq!(fx, vec![Effect::Signal(Signal::Term)]);
        assert_eq!(m.phase(), Phase::Terminating);
        assert!(m.is_stopping());
        assert_eq!(
            m.poll_timeout(),
            Some((Instant::from_millis(11_000), "TERM to KILL escalation"))
        );
        // Too early: nothing.
        assert!(m
            .handle(Input::Tick {
                now: Instant::from_millis(10_999)
            })
            .unwrap()
            .is_empty());
        let fx = m
            .handle(Input::Tick {
                now: Instant::from_millis(11_000),
            })
            .unwrap();
        assert_eq!(fx, vec![Effect::Signal(Signal::Kill)]);
        assert_eq!(m.poll_timeout(), None, "KILL is sent once");
        assert!(m
            .handle(Input::Tick {
                now: Instant::from_millis(20_000)
            })
            .unwrap()
            .is_empty());
        let fx = m.handle(exited(None, Some(9))).unwrap();
        let s = emitted(&fx);
        assert_eq!((s.kind, s.exit_code), (StatusKind::Failed, 137));
        assert!(s.message.contains("SIGKILL"), "{}", s.message);
        assert!(s.message.contains("10000 ms"), "{}", s.message);
    }

    #[test]
    fn a_process_that_honours_term_is_not_killed() {
        let mut m = running(7);
        m.handle(Input::Stop {
            now: Instant::from_millis(0),
            grace: Duration::from_millis(500),
        })
        .unwrap();
        let fx = m.handle(exited(None, Some(15))).unwrap();
        let s = emitted(&fx);
        assert_eq!((s.kind, s.exit_code), (StatusKind::Failed, 143));
        assert!(s.message.contains("(stopped)"), "{}", s.message);
        assert_eq!(m.poll_timeout(), None);
        assert!(m
            .handle(Input::Tick {
                now: Instant::from_millis(1_000)
            })
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_clean_exit_after_term_is_finished() {
        let mut m = running(7);
        m.handle(Input::Stop {
            now: Instant::from_millis(0),
            grace: Duration::from_millis(500),
        })
        .unwrap();
        let s = emitted(&m.handle(exited(Some(0), None)).unwrap()).clone();
        assert_eq!((s.kind, s.exit_code), (StatusKind::Finished, 0));
    }

    #[test]
    fn a_second_stop_joins_and_may_shorten_the_wait() {
        let mut m = running(1);
        m.handle(Input::Stop {
            now: Instant::from_millis(0),
            grace: Duration::from_millis(10_000),
        })
        .unwrap();
        // No second TERM; a longer grace does not postpone the KILL.
        assert!(m
            .handle(Input::Stop {
                now: Instant::from_millis(100),
                grace: Duration::from_millis(60_000)
            })
            .unwrap()
            .is_empty());
        assert_eq!(m.poll_timeout().map(|t| t.0.millis()), Some(10_000));
        assert!(m
            .handle(Input::Stop {
                now: Instant::from_millis(200),
                grace: Duration::from_millis(0)
            })
            .unwrap()
            .is_empty());
        assert_eq!(m.poll_timeout().map(|t| t.0.millis()), Some(200));
        assert_eq!(
            m.handle(Input::Tick {
                now: Instant::from_millis(200)
            })
            .unwrap(),
            vec![Effect::Signal(Signal::Kill)]
        );
    }

    #[test]
    fn time_never_goes_backwards() {
        let mut m = running(1);
        m.handle(Input::Stop {
            now: Instant::from_millis(5_000),
            grace: Duration::from_millis(1_000),
        })
        .unwrap();
        // A clock that jumped back cannot fire the deadline early...
        assert!(m
            .handle(Input::Tick {
                now: Instant::from_millis(10)
            })
            .unwrap()
            .is_empty());
        // ...and a stop at an earlier time counts from the latest time seen.
        m.handle(Input::Stop {
            now: Instant::from_millis(0),
            grace: Duration::from_millis(0),
        })
        .unwrap();
        assert_eq!(m.poll_timeout().map(|t| t.0.millis()), Some(5_000));
    }

    #[test]
    fn signals_pass_through_while_the_process_lives() {
        let mut m = running(1);
        assert_eq!(
            m.handle(Input::Signal {
                signal: Signal::Hup
            })
            .unwrap(),
            vec![Effect::Signal(Signal::Hup)]
        );
        assert_eq!(
            m.phase(),
            Phase::Running,
            "a raw signal does not start a stop"
        );
        m.handle(Input::Stop {
            now: Instant::from_millis(0),
            grace: Duration::from_millis(1_000),
        })
        .unwrap();
        m.handle(Input::Signal {
            signal: Signal::Kill,
        })
        .unwrap();
        assert_eq!(
            m.poll_timeout(),
            None,
            "an explicit KILL ends the escalation"
        );
        m.handle(exited(None, Some(9))).unwrap();
        assert_eq!(
            m.handle(Input::Signal {
                signal: Signal::Term
            }),
            Err(Refusal::AlreadyExited)
        );
    }

    #[test]
    fn requests_before_the_start_are_refused() {
        let mut m = RunMachine::new();
        assert_eq!(
            m.handle(Input::Signal {
                signal: Signal::Term
            }),
            Err(Refusal::NotStarted)
        );
        assert_eq!(
            m.handle(Input::Stop {
                now: Instant::from_millis(0),
                grace: Duration::from_millis(0)
            }),
            Err(Refusal::NotStarted)
        );
        assert_eq!(m.phase(), Phase::Starting);
    }

    #[test]
    fn late_inputs_are_ignored() {
        let mut m = running(1);
        m.handle(exited(Some(0), None)).unwrap();
        let before = m.clone();
        for input in [
            Input::Output { bytes: 5 },
            Input::Started { pid: 9 },
            exited(Some(1), None),
            Input::Tick {
                now: Instant::from_millis(99),
            },
        ] {
            assert!(m.handle(input).unwrap().is_empty());
        }
        assert_eq!(m, before);
    }

    #[test]
    fn a_crash_carries_the_stderr_tail() {
        let mut m = running(1);
        let fx = m
            .handle(Input::Exited {
                code: Some(2),
                signal: None,
                detail: "error: no auth\n".into(),
            })
            .unwrap();
        assert_eq!(emitted(&fx).message, "exit code 2; stderr: error: no auth");
        let mut m = running(1);
        let fx = m
            .handle(Input::Exited {
                code: None,
                signal: Some(11),
                detail: "boom".into(),
            })
            .unwrap();
        let s = emitted(&fx);
        assert_eq!(s.exit_code, 139);
        assert!(s.message.contains("SIGSEGV") && s.message.contains("boom"));
    }

    #[test]
    fn requests_are_never_silently_ignored_and_the_table_renders() {
        for p in Phase::ALL {
            for i in [InputKind::Signal, InputKind::Stop] {
                assert_ne!(rule(p, i), Rule::Ignore, "{p:?} {i:?}");
            }
        }
        let t = render();
        assert_eq!(t.lines().count(), 2 + Phase::ALL.len());
        assert!(t.contains("| Exited | · | · | · | · | refuse: already exited |"));
    }

    fn arb_input() -> impl proptest::strategy::Strategy<Value = Input> {
        use proptest::prelude::*;
        let at = || (0u64..200_000).prop_map(Instant::from_millis);
        prop_oneof![
            (1u32..1_000).prop_map(|pid| Input::Started { pid }),
            (-1i32..128).prop_map(|exit_code| Input::SpawnFailed {
                reason: "no such file".into(),
                exit_code
            }),
            (0u64..4_096).prop_map(|bytes| Input::Output { bytes }),
            (
                proptest::option::of(0i32..3),
                proptest::option::of(1i32..16)
            )
                .prop_map(|(code, signal)| Input::Exited {
                    code,
                    signal,
                    detail: String::new()
                }),
            prop_oneof![Just(Signal::Hup), Just(Signal::Term), Just(Signal::Kill)]
                .prop_map(|signal| Input::Signal { signal }),
            (at(), (0u64..20_000).prop_map(Duration::from_millis))
                .prop_map(|(now, grace)| Input::Stop { now, grace }),
            at().prop_map(|now| Input::Tick { now }),
        ]
    }

    proptest::proptest! {
        /// Any sequence of inputs keeps the machine's invariants (`check`, on in this build)
        /// and these: an outcome exactly once exited, no deadline after that, a KILL of its own
        /// only at or after the deadline it announced.
        #[test]
        fn any_input_sequence_keeps_the_invariants(
            inputs in proptest::collection::vec(arb_input(), 0..40)
        ) {
            let mut m = RunMachine::new();
            for input in inputs {
                let due = m.poll_timeout().map(|(at, _)| at);
                let tick = match &input {
                    Input::Tick { now } => Some(*now),
                    _ => None,
                };
                let Ok(out) = m.handle(input) else { continue };
                proptest::prop_assert_eq!(m.is_exited(), m.outcome().is_some());
                if m.is_exited() {
                    proptest::prop_assert!(m.poll_timeout().is_none());
                }
                if let (Some(now), true) = (tick, out.contains(&Effect::Signal(Signal::Kill))) {
                    proptest::prop_assert!(due.is_some_and(|at| at <= now.max(m.now)));
                }
            }
        }
    }
}
