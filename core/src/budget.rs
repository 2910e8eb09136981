//! Tokens and time: the one place that says "over".

use crate::error::{Error, ErrorCode};
use crate::time::{Duration, Instant};

/// A token budget; `max == 0` means unlimited (the obey seed's convention).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenBudget {
    pub max: u64,
}

impl TokenBudget {
    /// True when `used` has reached the budget: a turn that gets here is interrupted and a new
    /// message is refused with OBEY-2013.
    pub fn exhausted(self, used: u64) -> bool {
        self.max > 0 && used >= self.max
    }

    /// True when `used` went past the budget: a session whose usage gets here fails with
    /// OBEY-2013, whenever its agent reports it (mid-turn, or with the turn's end: agents
    /// that report usage per turn are held to the same rule as those that stream it).
    pub fn exceeded(self, used: u64) -> bool {
        self.max > 0 && used > self.max
    }

    /// OBEY-2013, the one wording for every way a session meets its budget: `what` is
    /// "exhausted" (a message refused) or "exceeded" (a turn or session ended).
    pub fn error(self, what: &str, used: u64) -> Error {
        Error::new(
            ErrorCode::BudgetExceeded,
            format!("token budget {what}: {used} of {} tokens used", self.max),
        )
    }
}

/// The instant a session times out, if it has a timeout (`timeout_ms == 0` means none).
pub fn timeout_deadline(started: Instant, timeout_ms: u64) -> Option<Instant> {
    (timeout_ms > 0).then(|| started + Duration::from_millis(timeout_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlimited_is_never_exhausted() {
        assert!(!TokenBudget { max: 0 }.exhausted(u64::MAX));
    }

    #[test]
    fn exhausted_at_the_limit() {
        let b = TokenBudget { max: 100 };
        assert!(!b.exhausted(99));
        assert!(b.exhausted(100));
        assert!(b.exhausted(101));
    }

    #[test]
    fn exceeded_past_the_limit() {
        let b = TokenBudget { max: 100 };
        assert!(!b.exceeded(100));
        assert!(b.exceeded(101));
        assert!(!TokenBudget { max: 0 }.exceeded(u64::MAX));
    }

    #[test]
    fn deadlines() {
        let at = Instant::from_millis;
        assert_eq!(timeout_deadline(at(10), 0), None);
        assert_eq!(timeout_deadline(at(10), 5), Some(at(15)));
        assert_eq!(timeout_deadline(Instant::MAX, 5), Some(Instant::MAX));
    }
}
