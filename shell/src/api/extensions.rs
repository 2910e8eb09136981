//! What a client understands beyond the seeds, so that paddock's additions never surprise a
//! client generated from a seed.
//!
//! paddock adds values the seeds do not have: `SessionStatus` WAITING (8) and `ActivityType`
//! TEXT (7, the agent's own words between its tool calls) in obey, and Aria's session-status
//! notification (payload 100). A client says it understands them with the request metadata key
//! [`KEY`], a comma-separated list of [`WAITING`], [`TEXT`], [`SESSION_NOTIFICATIONS`] or `all`
//! (paddock's own CLI sends `all`). A client that does not say so sees the nearest seed value:
//! WAITING reads as WORKING (a status event that becomes WORKING → WORKING is not sent), a
//! ListSessions asking for WORKING gets the waiting sessions too, TEXT reads as THINKING (the
//! type the seed's own example gives an agent's narration; STATUS stays what the seed says, a
//! status change notification), and Aria's notification stream carries only the seed's
//! payloads.

use paddock_proto::obey::local::v1 as pb;

/// The request metadata key (the transport's: paddock's clients send it).
pub use crate::transport::EXTENSIONS_KEY as KEY;
/// The token for `SessionStatus` WAITING.
pub const WAITING: &str = "waiting";
/// The token for `ActivityType` TEXT.
pub const TEXT: &str = "text";
/// The token for Aria's session-status notifications.
pub const SESSION_NOTIFICATIONS: &str = "session-notifications";

/// What one request's client understands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Understood {
    pub waiting: bool,
    pub text: bool,
    pub session_notifications: bool,
}

const STATUS_WAITING: i32 = pb::SessionStatus::Waiting as i32;
const STATUS_WORKING: i32 = pb::SessionStatus::Working as i32;
const ACTIVITY_TEXT: i32 = pb::ActivityType::Text as i32;

impl Understood {
    /// Everything paddock adds (its own clients).
    pub const ALL: Understood = Understood {
        waiting: true,
        text: true,
        session_notifications: true,
    };

    /// Read from a request's metadata.
    pub fn of<T>(request: &tonic::Request<T>) -> Understood {
        let mut u = Understood::default();
        for value in request.metadata().get_all(KEY) {
            for token in value.to_str().unwrap_or("").split(',') {
                match token.trim() {
                    "all" => u = Understood::ALL,
                    WAITING => u.waiting = true,
                    TEXT => u.text = true,
                    SESSION_NOTIFICATIONS => u.session_notifications = true,
                    _ => {}
                }
            }
        }
        u
    }

    /// A `SessionStatus` number as this client may see it.
    pub fn status(self, n: i32) -> i32 {
        if n == STATUS_WAITING && !self.waiting {
            STATUS_WORKING
        } else {
            n
        }
    }

    /// The statuses a ListSessions filter means: to a client that sees WAITING as WORKING,
    /// asking for WORKING asks for both.
    pub fn statuses(self, mut asked: Vec<i32>) -> Vec<i32> {
        if !self.waiting && asked.contains(&STATUS_WORKING) && !asked.contains(&STATUS_WAITING) {
            asked.push(STATUS_WAITING);
        }
        asked
    }

    pub fn info(self, mut info: pb::SessionInfo) -> pb::SessionInfo {
        info.status = self.status(info.status);
        info
    }

    pub fn summary(self, mut s: pb::SessionSummary) -> pb::SessionSummary {
        s.status = self.status(s.status);
        s
    }

    /// An activity as this client may see it: TEXT as THINKING to one that did not ask for it.
    pub fn activity(self, mut a: pb::SessionActivityEvent) -> pb::SessionActivityEvent {
        if a.r#type == ACTIVITY_TEXT && !self.text {
            a.r#type = pb::ActivityType::Thinking as i32;
        }
        a
    }

    /// A status event as this client may see it; `None` when it says nothing to it (WORKING
    /// → WAITING read as WORKING → WORKING).
    pub fn event(self, mut e: pb::SessionStatusEvent) -> Option<pb::SessionStatusEvent> {
        e.previous_status = self.status(e.previous_status);
        e.new_status = self.status(e.new_status);
        (e.previous_status != e.new_status).then_some(e)
    }
}

/// paddock's own clients' interceptor (the transport's).
pub use crate::transport::UnderstandAll;

#[cfg(test)]
mod tests {
    use super::*;

    fn req(value: Option<&str>) -> tonic::Request<()> {
        let mut r = tonic::Request::new(());
        if let Some(v) = value {
            r.metadata_mut().insert(KEY, v.parse().unwrap());
        }
        r
    }

    #[test]
    fn a_seed_client_sees_seed_values_and_a_client_that_says_so_sees_paddocks() {
        let seed = Understood::of(&req(None));
        assert_eq!(seed, Understood::default());
        assert_eq!(seed.status(STATUS_WAITING), STATUS_WORKING);
        assert_eq!(
            seed.statuses(vec![STATUS_WORKING]),
            [STATUS_WORKING, STATUS_WAITING]
        );
        let to_waiting = pb::SessionStatusEvent {
            previous_status: STATUS_WORKING,
            new_status: STATUS_WAITING,
            ..Default::default()
        };
        assert_eq!(seed.event(to_waiting.clone()), None);
        let done = pb::SessionStatusEvent {
            previous_status: STATUS_WAITING,
            new_status: pb::SessionStatus::Stopped as i32,
            ..Default::default()
        };
        assert_eq!(seed.event(done).unwrap().previous_status, STATUS_WORKING);
        let text = pb::SessionActivityEvent {
            r#type: ACTIVITY_TEXT,
            ..Default::default()
        };
        assert_eq!(
            seed.activity(text.clone()).r#type,
            pb::ActivityType::Thinking as i32
        );
        assert_eq!(Understood::ALL.activity(text.clone()).r#type, ACTIVITY_TEXT);
        assert_eq!(
            Understood::of(&req(Some("text"))).activity(text).r#type,
            ACTIVITY_TEXT
        );

        let aware = Understood::of(&req(Some("waiting")));
        assert!(aware.waiting && !aware.session_notifications);
        assert_eq!(aware.status(STATUS_WAITING), STATUS_WAITING);
        assert_eq!(aware.event(to_waiting.clone()), Some(to_waiting));
        assert_eq!(
            Understood::of(&req(Some(" session-notifications , waiting, text"))),
            Understood::ALL
        );
        assert_eq!(Understood::of(&req(Some("all"))), Understood::ALL);
        let mut r = tonic::Request::new(());
        r = tonic::service::Interceptor::call(&mut UnderstandAll, r).unwrap();
        assert_eq!(Understood::of(&r), Understood::ALL);
    }
}
