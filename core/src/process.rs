//! What every machine that owns a child process shares: the one signal type, the one model of
//! a child's life ([`Life`]), the one TERM → KILL grace period ([`Termination`]), and the one
//! way an exit status is put in words and in a number.
//!
//! The session machine (a provider's process), the task machine (an Aria task's command) and
//! the run machine (the runner's child) all hold their process as a [`Life`] and end it the
//! same way: TERM to its group now, KILL once [`KILL_GRACE`] (or the configured grace) has
//! passed without an exit.

use crate::time::{Duration, Instant};

/// TERM → KILL: how long a terminated process group gets to exit before KILL (the centaurx
/// server's `/z`: "send SIGTERM, wait 10s, if still running send SIGKILL"). The default of
/// every machine's grace and of the daemon's `--kill-grace-secs`.
pub const KILL_GRACE: Duration = Duration::from_secs(10);

/// EOF → TERM: how long an agent asked to end its own way (its input closed, as an interactive
/// agent's `/exit` would) gets before TERM, in a graceful stop. Agents that read their input
/// to its end (Claude Code's stream-json, paddock's bridges, the scripted agent) exit within
/// a second.
pub const END_GRACE: Duration = Duration::from_secs(3);

/// How long a session may take from its create to an agent that says it is ready: its
/// environment made, its process started and its answer to paddock's ready request. An ACP
/// agent answers only once its own session is set up (a first `npx` download, a long
/// conversation loaded), so it is more than a process's start.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// A signal for a child's whole process group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Signal {
    Hup,
    Term,
    Kill,
}

impl Signal {
    /// The POSIX signal number (the same on every Unix for these three).
    pub fn number(self) -> i32 {
        match self {
            Signal::Hup => 1,
            Signal::Term => 15,
            Signal::Kill => 9,
        }
    }

    pub fn name(self) -> &'static str {
        signal_name(self.number())
    }
}

/// The usual name of a signal number (Linux numbering beyond the POSIX-fixed ones).
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        _ => "signal",
    }
}

/// The shell's exit-code convention: the code, or 128 + the signal that ended the process.
pub fn exit_code(code: Option<i32>, signal: Option<i32>) -> Option<i32> {
    match (code, signal) {
        (_, Some(sig)) => Some(128 + sig),
        (code, None) => code,
    }
}

/// An exit status in words: `exit code 3`, `killed by signal 9 (SIGKILL)`, or `exit status
/// unknown`.
pub fn describe_exit(code: Option<i32>, signal: Option<i32>) -> String {
    match (code, signal) {
        (_, Some(sig)) => format!("killed by signal {sig} ({})", signal_name(sig)),
        (Some(c), None) => format!("exit code {c}"),
        (None, None) => "exit status unknown".to_string(),
    }
}

/// The deadline of the KILL that follows a TERM sent at `now`.
pub fn kill_deadline(now: Instant, grace: Duration) -> Instant {
    now + grace
}

/// A process being ended: TERM was sent, and KILL follows once its grace has passed unless the
/// process exits first. The one TERM → grace → KILL rule: the session machine (an agent), the
/// task machine (a task's command) and the run machine (the runner's child) each hold one
/// from their TERM to the process's exit, and none writes the rule again.
///
/// ```text
///   begin(now, grace) ─▶ TERM; KILL due at now + grace
///   tick(t ≥ due)     ─▶ KILL, once (escalated)
///   killed()          ─▶ a KILL sent otherwise: none is due
///   hasten(now, g)    ─▶ a second stop: the sooner KILL stands
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Termination {
    /// When KILL is due; `None` once a KILL was sent.
    kill_at: Option<Instant>,
    /// The grace of the deadline that stands.
    grace: Duration,
    /// KILL was sent because the grace ran out.
    escalated: bool,
}

impl Termination {
    /// Ends a process at `now`: the signal to send now (TERM) and the termination, whose KILL
    /// is due after `grace`.
    #[must_use]
    pub fn begin(now: Instant, grace: Duration) -> (Termination, Signal) {
        let t = Termination {
            kill_at: Some(kill_deadline(now, grace)),
            grace,
            escalated: false,
        };
        (t, Signal::Term)
    }

    /// When KILL is due (`None` once one was sent).
    pub fn kill_at(&self) -> Option<Instant> {
        self.kill_at
    }

    /// The grace of the deadline that stands.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// KILL was sent because the grace ran out (not by a client's signal).
    pub fn escalated(&self) -> bool {
        self.escalated
    }

    /// Another stop at `now` with its own grace: the sooner KILL stands (a KILL already sent
    /// stays sent).
    pub fn hasten(&mut self, now: Instant, grace: Duration) {
        let at = kill_deadline(now, grace);
        if let Some(due) = self.kill_at.as_mut() {
            if at < *due {
                *due = at;
                self.grace = grace;
            }
        }
    }

    /// The time is `now`: KILL when it is due, once.
    #[must_use]
    pub fn tick(&mut self, now: Instant) -> Option<Signal> {
        match self.kill_at {
            Some(at) if at <= now => {
                self.kill_at = None;
                self.escalated = true;
                Some(Signal::Kill)
            }
            _ => None,
        }
    }

    /// A KILL was sent by other means (a client's signal): none is due any more.
    pub fn killed(&mut self) {
        self.kill_at = None;
    }
}

/// A child process's life as the machine that owns it sees it, from the spawn it asked for to
/// its exit (gone, it is no `Life` at all). The one shape of "not started yet / running /
/// asked to end / terminating" the session machine (an agent), the task machine (a task's
/// command) and the run machine (the runner's child) hold; each uses the states it needs
/// (only a session asks its agent to end its own way first).
///
/// ```text
///   Starting ─started(pid)─▶ Alive ─end(now, g, kg)──▶ Ending{term_at = now + g}
///                              │                          │ tick(t ≥ term_at): TERM
///                              └─terminate(now, kg)─▶ Terminating{term} ◀┘
///                                 TERM (from Ending too)   │ tick(t ≥ kill_at): KILL, once
///                                                          │ terminate again: hastens
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Life {
    /// The spawn was asked for; its outcome (a process, or a failure) is not in yet.
    Starting,
    /// Running.
    Alive { pid: Option<u32> },
    /// Asked to end its own way (its input closed); TERM at `term_at` unless it exits first,
    /// with KILL `kill_grace` after it.
    Ending {
        pid: Option<u32>,
        term_at: Instant,
        kill_grace: Duration,
    },
    /// TERM was sent; KILL when the termination says, unless it exits first.
    Terminating { pid: Option<u32>, term: Termination },
}

impl Life {
    /// The spawn gave a process (`Starting` → `Alive`).
    pub fn started(&mut self, pid: Option<u32>) {
        assert_eq!(*self, Life::Starting, "only a process being spawned starts");
        *self = Life::Alive { pid };
    }

    /// Asks a running process to end its own way at `now` (its input is closed by the
    /// caller): TERM is due after `grace`, and KILL `kill_grace` after that (`Alive` →
    /// `Ending`).
    pub fn end(&mut self, now: Instant, grace: Duration, kill_grace: Duration) {
        let Life::Alive { pid } = *self else {
            panic!("only a running process is asked to end, not one {self:?}");
        };
        *self = Life::Ending {
            pid,
            term_at: now + grace,
            kill_grace,
        };
    }

    /// Ends the process at `now`: TERM, with KILL due after `grace` (`Alive` or `Ending` →
    /// `Terminating`). A process already terminating is not signalled again: the sooner KILL
    /// stands ([`Termination::hasten`]). There must be a process (not `Starting`).
    #[must_use]
    pub fn terminate(&mut self, now: Instant, grace: Duration) -> Option<Signal> {
        match self {
            Life::Starting => panic!("a process being spawned has nothing to terminate yet"),
            Life::Alive { pid } | Life::Ending { pid, .. } => {
                let (term, signal) = Termination::begin(now, grace);
                *self = Life::Terminating { pid: *pid, term };
                Some(signal)
            }
            Life::Terminating { term, .. } => {
                term.hasten(now, grace);
                None
            }
        }
    }

    /// The time is `now`: TERM when an `Ending` is due, KILL when a termination's is (once);
    /// nothing otherwise.
    #[must_use]
    pub fn tick(&mut self, now: Instant) -> Option<Signal> {
        match *self {
            Life::Ending {
                term_at,
                kill_grace,
                ..
            } if term_at <= now => self.terminate(now, kill_grace),
            Life::Terminating { ref mut term, .. } => term.tick(now),
            _ => None,
        }
    }

    /// A KILL was sent by other means (a client's signal): none is due any more.
    pub fn killed(&mut self) {
        if let Life::Terminating { term, .. } = self {
            term.killed();
        }
    }

    /// When [`Life::tick`] next has something to send: the TERM of an `Ending`, the KILL of a
    /// termination.
    pub fn deadline(&self) -> Option<Instant> {
        match self {
            Life::Ending { term_at, .. } => Some(*term_at),
            Life::Terminating { term, .. } => term.kill_at(),
            Life::Starting | Life::Alive { .. } => None,
        }
    }

    /// The process's pid, once started (and if the spawn said it).
    pub fn pid(&self) -> Option<u32> {
        match self {
            Life::Starting => None,
            Life::Alive { pid } | Life::Ending { pid, .. } | Life::Terminating { pid, .. } => *pid,
        }
    }

    /// There is a process (it started and has not exited): every state but `Starting`.
    pub fn has_process(&self) -> bool {
        *self != Life::Starting
    }

    /// The termination under way, once TERM was sent.
    pub fn termination(&self) -> Option<&Termination> {
        match self {
            Life::Terminating { term, .. } => Some(term),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_termination_kills_once_when_its_grace_has_passed() {
        let at = Instant::from_millis;
        let (mut t, now) = Termination::begin(at(1_000), KILL_GRACE);
        assert_eq!(now, Signal::Term);
        assert_eq!(t.kill_at(), Some(at(11_000)));
        assert_eq!(t.tick(at(10_999)), None, "not before its grace");
        assert!(!t.escalated());
        assert_eq!(t.tick(at(11_000)), Some(Signal::Kill));
        assert!(t.escalated());
        assert_eq!(t.kill_at(), None);
        assert_eq!(t.tick(at(99_000)), None, "one KILL");
        t.hasten(at(12_000), Duration::ZERO);
        assert_eq!(t.kill_at(), None, "a KILL sent stays sent");

        let (mut t, _) = Termination::begin(at(0), KILL_GRACE);
        t.hasten(at(1_000), Duration::from_secs(60));
        assert_eq!(
            t.kill_at(),
            Some(at(10_000)),
            "a later KILL does not move it"
        );
        t.hasten(at(1_000), Duration::from_secs(2));
        assert_eq!(
            (t.kill_at(), t.grace()),
            (Some(at(3_000)), Duration::from_secs(2))
        );
        // A stop whose KILL falls when the standing one does changes nothing: the process has
        // ignored TERM since the first (the escalation's message says how long).
        let (mut same, _) = Termination::begin(at(0), KILL_GRACE);
        same.hasten(at(5_000), Duration::from_secs(5));
        assert_eq!(
            (same.kill_at(), same.grace()),
            (Some(at(10_000)), KILL_GRACE)
        );
        t.killed();
        assert_eq!(t.tick(at(3_000)), None, "a client's KILL: none is due");
        assert!(!t.escalated(), "nor was it escalated");
    }

    #[test]
    fn exit_statuses_in_words_and_numbers() {
        assert_eq!(describe_exit(Some(3), None), "exit code 3");
        assert_eq!(describe_exit(None, Some(9)), "killed by signal 9 (SIGKILL)");
        assert_eq!(describe_exit(None, None), "exit status unknown");
        assert_eq!(exit_code(None, Some(15)), Some(143));
        assert_eq!(exit_code(Some(2), None), Some(2));
        assert_eq!(exit_code(None, None), None);
        assert_eq!(Signal::Term.name(), "SIGTERM");
        assert_eq!(
            kill_deadline(Instant::from_millis(u64::MAX - 1), KILL_GRACE),
            Instant::MAX
        );
        assert_eq!(
            kill_deadline(Instant::from_millis(5), KILL_GRACE),
            Instant::from_millis(10_005)
        );
    }

    #[test]
    fn a_life_starts_runs_and_is_terminated() {
        let at = Instant::from_millis;
        let mut life = Life::Starting;
        assert!(!life.has_process());
        assert_eq!((life.pid(), life.deadline()), (None, None));
        assert_eq!(life.tick(at(99_000)), None, "nothing runs yet");
        life.started(Some(7));
        assert_eq!(life, Life::Alive { pid: Some(7) });
        assert!(life.has_process());
        assert_eq!((life.pid(), life.deadline()), (Some(7), None));
        assert_eq!(
            life.tick(at(99_000)),
            None,
            "a running process has no timer"
        );

        assert_eq!(life.terminate(at(1_000), KILL_GRACE), Some(Signal::Term));
        assert_eq!(life.deadline(), Some(at(11_000)));
        assert_eq!(life.pid(), Some(7));
        assert_eq!(life.tick(at(10_999)), None, "not before its grace");
        // A second stop sends nothing; a shorter grace brings the KILL forward.
        assert_eq!(life.terminate(at(2_000), KILL_GRACE), None);
        assert_eq!(
            life.deadline(),
            Some(at(11_000)),
            "a later KILL does not move it"
        );
        assert_eq!(life.terminate(at(2_000), Duration::from_secs(1)), None);
        assert_eq!(life.deadline(), Some(at(3_000)));
        assert_eq!(life.tick(at(3_000)), Some(Signal::Kill));
        assert!(life.termination().is_some_and(|t| t.escalated()));
        assert_eq!(life.deadline(), None);
        assert_eq!(life.tick(at(99_000)), None, "one KILL");
        assert_eq!(
            life.terminate(at(99_000), Duration::ZERO),
            None,
            "nor after a stop"
        );
    }

    #[test]
    fn a_life_asked_to_end_is_termed_when_its_grace_runs_out() {
        let at = Instant::from_millis;
        let mut life = Life::Alive { pid: None };
        assert_eq!(life.termination(), None);
        life.end(at(1_000), END_GRACE, KILL_GRACE);
        assert_eq!(
            life,
            Life::Ending {
                pid: None,
                term_at: at(4_000),
                kill_grace: KILL_GRACE,
            }
        );
        assert_eq!(life.deadline(), Some(at(4_000)));
        assert!(life.has_process());
        assert_eq!(life.tick(at(3_999)), None, "not before its grace");
        assert_eq!(life.tick(at(4_500)), Some(Signal::Term));
        assert_eq!(
            life.deadline(),
            Some(at(14_500)),
            "KILL after its own grace"
        );
        assert_eq!(life.tick(at(14_499)), None);
        assert_eq!(life.tick(at(14_500)), Some(Signal::Kill));
        assert_eq!(life.tick(at(14_500)), None, "one KILL");

        // A stop that does not wait: TERM at once.
        let mut life = Life::Alive { pid: Some(3) };
        life.end(at(0), END_GRACE, KILL_GRACE);
        assert_eq!(life.terminate(at(1_000), KILL_GRACE), Some(Signal::Term));
        assert_eq!((life.pid(), life.deadline()), (Some(3), Some(at(11_000))));
        // A client's KILL: none is due any more, and it was not escalated.
        life.killed();
        assert_eq!(life.deadline(), None);
        assert_eq!(life.tick(at(99_000)), None);
        assert!(life.termination().is_some_and(|t| !t.escalated()));
    }

    #[test]
    #[should_panic(expected = "only a process being spawned starts")]
    fn a_life_starts_once() {
        let mut life = Life::Alive { pid: None };
        life.started(Some(1));
    }

    #[test]
    #[should_panic(expected = "only a running process is asked to end")]
    fn only_a_running_life_is_asked_to_end() {
        let mut life = Life::Starting;
        life.end(Instant::from_millis(0), END_GRACE, KILL_GRACE);
    }

    #[test]
    #[should_panic(expected = "nothing to terminate yet")]
    fn a_life_being_spawned_is_not_terminated() {
        let mut life = Life::Starting;
        let _ = life.terminate(Instant::from_millis(0), KILL_GRACE);
    }
}
