//! What every machine that owns a child process shares: the one signal type, the one TERM →
//! KILL grace period, and the one way an exit status is put in words and in a number.
//!
//! The session machine (a provider's process), the task machine (an Aria task's command) and
//! the run machine (the runner's child) all end a process the same way: TERM to its group now,
//! KILL once [`KILL_GRACE`] (or the configured grace) has passed without an exit.

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
}
