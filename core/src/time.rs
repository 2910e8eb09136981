//! Time, typed: deadlines run on a monotonic clock, wall-clock time is only recorded.
//!
//! - [`Instant`]: a point on the daemon's monotonic clock (milliseconds since an arbitrary
//!   origin — the shell's is its start). Every deadline is one; it never jumps when the wall
//!   clock is set.
//! - [`Duration`]: a length of time (a grace period, a timeout).
//! - [`Timestamp`]: a wall-clock time (milliseconds since the Unix epoch), written into records
//!   and events for people and clients; never compared with a deadline.
//! - [`Now`]: both, as the shell (or the simulator's fake clock) reads them for one input.
//!
//! The one place the two clocks meet is start-up: a deadline that was stored as a wall-clock
//! time (a request's expiry, a session's timeout counted from its start) is brought onto the
//! new daemon's monotonic clock by [`Now::instant_of`].

use std::fmt;
use std::ops::{Add, Sub};

/// A point on the monotonic clock, in milliseconds since the clock's origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

/// A length of time, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(u64);

/// A wall-clock time, in milliseconds since the Unix epoch: recorded, never a deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Instant {
    /// The clock's origin.
    pub const ORIGIN: Instant = Instant(0);
    /// Never (an instant no clock reaches).
    pub const MAX: Instant = Instant(u64::MAX);

    pub const fn from_millis(ms: u64) -> Instant {
        Instant(ms)
    }

    /// Milliseconds since the clock's origin.
    pub const fn millis(self) -> u64 {
        self.0
    }

    /// How long after `earlier` this is (zero if it is not after it).
    pub fn since(self, earlier: Instant) -> Duration {
        Duration(self.0.saturating_sub(earlier.0))
    }
}

impl Duration {
    pub const ZERO: Duration = Duration(0);

    pub const fn from_millis(ms: u64) -> Duration {
        Duration(ms)
    }

    pub const fn from_secs(s: u64) -> Duration {
        Duration(s.saturating_mul(1000))
    }

    pub const fn millis(self) -> u64 {
        self.0
    }

    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }
}

impl Timestamp {
    pub const fn from_millis(ms: u64) -> Timestamp {
        Timestamp(ms)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn millis(self) -> u64 {
        self.0
    }

    /// How long after `earlier` this is (zero if it is not after it).
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration(self.0.saturating_sub(earlier.0))
    }
}

/// Later by `d`; saturates at [`Instant::MAX`] (a deadline that never comes).
impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        Instant(self.0.saturating_add(d.0))
    }
}

impl Add<Duration> for Timestamp {
    type Output = Timestamp;
    fn add(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(d.0))
    }
}

impl Add for Duration {
    type Output = Duration;
    fn add(self, d: Duration) -> Duration {
        Duration(self.0.saturating_add(d.0))
    }
}

/// Earlier by `d`; saturates at the origin.
impl Sub<Duration> for Instant {
    type Output = Instant;
    fn sub(self, d: Duration) -> Instant {
        Instant(self.0.saturating_sub(d.0))
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ms", self.0)
    }
}

/// The time of one input: the monotonic instant (for deadlines) and the wall clock (for
/// records), read together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Now {
    pub at: Instant,
    pub wall: Timestamp,
}

impl Now {
    pub const fn new(at: Instant, wall: Timestamp) -> Now {
        Now { at, wall }
    }

    /// The later of two readings, clock by clock: time never goes backwards inside the core
    /// (a wall clock set back reads as the latest time seen).
    pub fn max(self, other: Now) -> Now {
        Now {
            at: self.at.max(other.at),
            wall: self.wall.max(other.wall),
        }
    }

    /// `d` from now, on the monotonic clock: a deadline.
    pub fn after(self, d: Duration) -> Instant {
        self.at + d
    }

    /// The monotonic instant of a stored wall-clock time, as far as this reading can tell:
    /// what was due `d` after (or before) the wall clock's now is due `d` after (or before) the
    /// monotonic now. Used at start-up only, for deadlines a previous daemon stored.
    pub fn instant_of(self, t: Timestamp) -> Instant {
        if t >= self.wall {
            self.at + t.since(self.wall)
        } else {
            self.at - self.wall.since(t)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates_and_stored_times_convert() {
        let i = Instant::from_millis(10);
        assert_eq!(i + Duration::from_millis(5), Instant::from_millis(15));
        assert_eq!(Instant::MAX + Duration::from_secs(1), Instant::MAX);
        assert_eq!(i - Duration::from_millis(50), Instant::ORIGIN);
        assert_eq!(i.since(Instant::from_millis(20)), Duration::ZERO);
        assert_eq!(Duration::from_secs(2).millis(), 2_000);
        let now = Now::new(Instant::from_millis(1_000), Timestamp::from_millis(50_000));
        assert_eq!(
            now.instant_of(Timestamp::from_millis(53_000)),
            Instant::from_millis(4_000),
            "due in 3 s"
        );
        assert_eq!(
            now.instant_of(Timestamp::from_millis(49_500)),
            Instant::from_millis(500),
            "due 0.5 s ago"
        );
        assert_eq!(
            now.instant_of(Timestamp::from_millis(1)),
            Instant::ORIGIN,
            "long past"
        );
        let later = Now::new(Instant::from_millis(900), Timestamp::from_millis(60_000));
        assert_eq!(
            now.max(later),
            Now::new(Instant::from_millis(1_000), Timestamp::from_millis(60_000))
        );
        assert_eq!(
            now.after(Duration::from_millis(1)),
            Instant::from_millis(1_001)
        );
    }
}
