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

#[cfg(test)]
mod tests {
    use super::*;

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
