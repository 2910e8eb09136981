//! The transition table: every (status, input) pair and what the machine does with it.
//!
//! This is the one place that says which pairs are legal. [`rule`] is consulted by the
//! session machine before it acts on any input, so a pair that is not `Legal` here can never
//! change a session. `Refuse` pairs answer the request with a typed error (OBEY-2011 / 2020);
//! `Ignore` pairs are inputs that can arrive late or out of band (a provider line after the
//! session failed, a timer that is no longer relevant) and are dropped without effect.
//!
//! `WAITING` means the agent is blocked on a human (or a client): at least one request is
//! open. It is entered by `Ask` (when the policy does not settle the request) and left when
//! the last request is resolved (`Resolve`, `ApprovalExpired`), the turn ends, or the session
//! stops, restarts or fails.

use crate::error::ErrorCode;
use crate::model::Status;

/// The class of an input, as far as the table is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum InputKind {
    /// A user message (SendMessage).
    Send,
    /// StopSession with `graceful = true`.
    StopGraceful,
    /// StopSession with `graceful = false`.
    StopForced,
    /// RestartSession.
    Restart,
    /// The provider process was spawned.
    Started,
    /// The provider process could not be spawned.
    SpawnFailed,
    /// The started agent reported that it is ready for messages.
    Ready,
    /// An activity that does not end a turn (thinking, tool call, tool result, status).
    Activity,
    /// A COMPLETION or ERROR activity: it ends the turn.
    TurnEnd,
    /// The provider process exited (and its output was fully read).
    Exited,
    /// A message could not be written to the provider (its stdin is closed).
    DeliveryFailed,
    /// The provider did not report it started in time.
    StartupTimeout,
    /// The session's `timeout` elapsed.
    SessionTimeout,
    /// A graceful stop waited its whole grace period for the current turn.
    StopGraceTimeout,
    /// A TERMed process did not exit within the kill grace period.
    KillTimeout,
    /// The agent asks something (permission, a question, a client-side tool).
    Ask,
    /// A client resolves an open request.
    Resolve,
    /// An open request waited its whole approval timeout.
    ApprovalExpired,
    /// DeleteSession.
    Delete,
    /// The session's environment was made.
    EnvReady,
    /// The session's environment could not be made.
    EnvFailed,
}

impl InputKind {
    pub const ALL: [InputKind; 21] = [
        InputKind::Send,
        InputKind::StopGraceful,
        InputKind::StopForced,
        InputKind::Restart,
        InputKind::Started,
        InputKind::SpawnFailed,
        InputKind::Ready,
        InputKind::Activity,
        InputKind::TurnEnd,
        InputKind::Exited,
        InputKind::DeliveryFailed,
        InputKind::StartupTimeout,
        InputKind::SessionTimeout,
        InputKind::StopGraceTimeout,
        InputKind::KillTimeout,
        InputKind::Ask,
        InputKind::Resolve,
        InputKind::ApprovalExpired,
        InputKind::Delete,
        InputKind::EnvReady,
        InputKind::EnvFailed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            InputKind::Send => "Send",
            InputKind::StopGraceful => "StopGraceful",
            InputKind::StopForced => "StopForced",
            InputKind::Restart => "Restart",
            InputKind::Started => "Started",
            InputKind::SpawnFailed => "SpawnFailed",
            InputKind::Ready => "Ready",
            InputKind::Activity => "Activity",
            InputKind::TurnEnd => "TurnEnd",
            InputKind::Exited => "Exited",
            InputKind::DeliveryFailed => "DeliveryFailed",
            InputKind::StartupTimeout => "StartupTimeout",
            InputKind::SessionTimeout => "SessionTimeout",
            InputKind::StopGraceTimeout => "StopGraceTimeout",
            InputKind::KillTimeout => "KillTimeout",
            InputKind::Ask => "Ask",
            InputKind::Resolve => "Resolve",
            InputKind::ApprovalExpired => "ApprovalExpired",
            InputKind::Delete => "Delete",
            InputKind::EnvReady => "EnvReady",
            InputKind::EnvFailed => "EnvFailed",
        }
    }
}

/// What the machine does with a (status, input) pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The machine acts on it.
    Legal,
    /// A request refused with this code; nothing changes.
    Refuse(ErrorCode),
    /// Dropped without effect (late or irrelevant input).
    Ignore,
}

/// The transition table.
pub fn rule(status: Status, input: InputKind) -> Rule {
    use InputKind as I;
    use Rule::{Ignore, Legal, Refuse};
    use Status as S;
    let wrong_state = Refuse(ErrorCode::WrongState);
    match (status, input) {
        // A live session is deleted only after it stopped; a request is answered only while
        // the session waits for it (a resolved or unknown one is refused before this table,
        // with OBEY-2041 / OBEY-2040).
        (S::Stopped | S::Failed, I::Delete) => Legal,
        (_, I::Delete) => wrong_state,
        (S::Waiting, I::Resolve) => Legal,
        (_, I::Resolve) => wrong_state,

        // CREATED lasts while the session's environment is made (for a session that needs
        // none, only inside the Create input): the driver's report starts the agent or refuses
        // the create; a stop ends it before it started; its making counts against the start-up
        // timeout.
        (S::Created, I::EnvReady | I::EnvFailed | I::StartupTimeout) => Legal,
        (S::Created, I::StopGraceful | I::StopForced) => Legal,
        (S::Created, I::Send | I::Restart) => wrong_state,
        (S::Created, _) => Ignore,

        (S::Starting, I::Send) => wrong_state,
        (S::Starting, I::StopGraceful | I::StopForced | I::Restart) => Legal,
        // STARTING lasts from the spawn until the agent says it is ready (it answered paddock's
        // ready request); an exit before that is a start that failed.
        (S::Starting, I::Started | I::SpawnFailed | I::Ready | I::Exited | I::StartupTimeout) => {
            Legal
        }
        // The session timeout counts from the agent being ready: no deadline runs while
        // STARTING. An agent's requests and activities before it is ready are dropped (none of
        // the agents paddock runs says anything before its first message), and a ready request
        // that could not be written ends at the agent's exit or the start-up timeout.
        (S::Starting, _) => Ignore,

        (S::Running, I::Send | I::StopGraceful | I::StopForced | I::Restart) => Legal,
        (S::Running, I::Activity | I::TurnEnd | I::Exited | I::SessionTimeout | I::Ask) => Legal,
        (S::Running, _) => Ignore,

        (S::Working, I::Send) => wrong_state,
        (S::Working, I::StopGraceful | I::StopForced | I::Restart) => Legal,
        (S::Working, I::Activity | I::TurnEnd | I::Exited | I::SessionTimeout | I::Ask) => Legal,
        // The turn's message never reached the agent: the turn, and the session, fail (2012).
        (S::Working | S::Waiting, I::DeliveryFailed) => Legal,
        (S::Working, _) => Ignore,

        // Blocked on a human: a message waits for the answer; a stop, restart, the turn's end,
        // an exit or the session timeout cancel what is open.
        (S::Waiting, I::Send) => wrong_state,
        (S::Waiting, I::StopGraceful | I::StopForced | I::Restart) => Legal,
        (S::Waiting, I::Activity | I::TurnEnd | I::Exited | I::SessionTimeout | I::Ask) => Legal,
        (S::Waiting, I::ApprovalExpired) => Legal,
        (S::Waiting, _) => Ignore,

        (S::Stopping, I::Send | I::Restart) => wrong_state,
        (S::Stopping, I::StopGraceful | I::StopForced) => Legal,
        (S::Stopping, I::Started | I::SpawnFailed | I::Activity | I::TurnEnd | I::Exited) => Legal,
        (S::Stopping, I::StopGraceTimeout | I::KillTimeout) => Legal,
        // A turn finishing during a graceful stop may still ask: it is told no at once.
        (S::Stopping, I::Ask) => Legal,
        (S::Stopping, _) => Ignore,

        (S::Stopped | S::Failed, I::Send) => wrong_state,
        (S::Stopped | S::Failed, I::StopGraceful | I::StopForced) => {
            Refuse(ErrorCode::AlreadyStopped)
        }
        (S::Stopped | S::Failed, I::Restart) => Legal,
        // A session can fail while its process is still being spawned or killed (budget,
        // timeout, startup timeout): the process is still reaped (whether it exits or its
        // spawn fails late) and, if it only now reports it started, terminated.
        (S::Failed, I::Started | I::SpawnFailed | I::Exited | I::KillTimeout) => Legal,
        (S::Stopped | S::Failed, _) => Ignore,
    }
}

/// Every legal pair, in table order.
pub fn legal_pairs() -> Vec<(Status, InputKind)> {
    let mut out = Vec::new();
    for s in Status::ALL {
        for i in InputKind::ALL {
            if rule(s, i) == Rule::Legal {
                out.push((s, i));
            }
        }
    }
    out
}

/// The table as Markdown: one row per status, one column per input.
pub fn render() -> String {
    crate::grid::render(
        "status",
        &Status::ALL,
        &InputKind::ALL,
        Status::name,
        InputKind::name,
        |s, i| match rule(s, i) {
            Rule::Legal => "legal".to_string(),
            Rule::Refuse(code) => code.to_string(),
            Rule::Ignore => "·".to_string(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_states_refuse_stop_with_2020_and_send_with_2011() {
        for s in [Status::Stopped, Status::Failed] {
            assert_eq!(
                rule(s, InputKind::StopGraceful),
                Rule::Refuse(ErrorCode::AlreadyStopped)
            );
            assert_eq!(
                rule(s, InputKind::StopForced),
                Rule::Refuse(ErrorCode::AlreadyStopped)
            );
            assert_eq!(
                rule(s, InputKind::Send),
                Rule::Refuse(ErrorCode::WrongState)
            );
            assert_eq!(rule(s, InputKind::Restart), Rule::Legal);
        }
    }

    #[test]
    fn only_running_accepts_a_message() {
        for s in Status::ALL {
            let r = rule(s, InputKind::Send);
            if s == Status::Running {
                assert_eq!(r, Rule::Legal);
            } else {
                assert_eq!(r, Rule::Refuse(ErrorCode::WrongState), "{s}");
            }
        }
    }

    #[test]
    fn requests_are_never_silently_ignored() {
        for s in Status::ALL {
            for i in [
                InputKind::Send,
                InputKind::StopGraceful,
                InputKind::StopForced,
                InputKind::Restart,
                InputKind::Resolve,
                InputKind::Delete,
            ] {
                assert_ne!(rule(s, i), Rule::Ignore, "{s} {i:?}");
            }
        }
    }

    #[test]
    fn the_table_renders_every_cell() {
        let t = render();
        assert_eq!(t.lines().count(), 2 + Status::ALL.len());
        assert!(t.contains("| STOPPED |"));
        assert!(t.contains("OBEY-2020"));
        assert!(legal_pairs().contains(&(Status::Working, InputKind::TurnEnd)));
    }
}
