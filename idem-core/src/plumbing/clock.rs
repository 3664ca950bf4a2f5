//! The one place idem reads the wall clock.
//!
//! Stores without a clock of their own (memory, DynamoDB) judge leases and
//! retention by a [`Clock`]; tests inject a [`ManualClock`].

use std::fmt;
use std::ops::{Add, Sub};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time: whole milliseconds since the Unix epoch.
///
/// Arithmetic saturates instead of overflowing, so no input can panic.
///
/// ```
/// use std::time::Duration;
/// use idem_core::store::Timestamp;
///
/// let t = Timestamp::from_unix_millis(1_000);
/// assert_eq!((t + Duration::from_secs(1)).as_unix_millis(), 2_000);
/// assert_eq!(t.saturating_duration_since(t + Duration::from_secs(1)), Duration::ZERO);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(i64);

impl Timestamp {
    /// The timestamp `millis` milliseconds after the Unix epoch.
    pub const fn from_unix_millis(millis: i64) -> Self {
        Self(millis)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_unix_millis(self) -> i64 {
        self.0
    }

    /// Whole seconds since the Unix epoch, rounded up (for TTL attributes
    /// that must not fire before the record expires).
    pub const fn as_unix_secs_ceil(self) -> i64 {
        self.0.div_euclid(1000) + if self.0.rem_euclid(1000) > 0 { 1 } else { 0 }
    }

    /// How long from `earlier` to `self`, or zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        let millis = self.0.saturating_sub(earlier.0);
        Duration::from_millis(u64::try_from(millis).unwrap_or(0))
    }
}

fn duration_millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Add<Duration> for Timestamp {
    type Output = Timestamp;

    fn add(self, rhs: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(duration_millis(rhs)))
    }
}

impl Sub<Duration> for Timestamp {
    type Output = Timestamp;

    fn sub(self, rhs: Duration) -> Timestamp {
        Timestamp(self.0.saturating_sub(duration_millis(rhs)))
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Self {
        match t.duration_since(UNIX_EPOCH) {
            Ok(after) => Timestamp(duration_millis(after)),
            Err(before) => Timestamp(duration_millis(before.duration()).saturating_neg()),
        }
    }
}

/// A source of the current time.
///
/// ```
/// use idem_core::store::{Clock, SystemClock};
///
/// let now = SystemClock.now();
/// assert!(now.as_unix_millis() > 1_700_000_000_000);
/// ```
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}

/// The machine's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // the one sanctioned read of the wall clock
    fn now(&self) -> Timestamp {
        Timestamp::from(SystemTime::now())
    }
}

/// A clock that moves only when told; clones share one time.
///
/// ```
/// use std::time::Duration;
/// use idem_core::store::{Clock, Timestamp};
/// use idem_core::ManualClock;
///
/// let clock = ManualClock::new(Timestamp::from_unix_millis(0));
/// let seen_by_store = clock.clone();
/// clock.advance(Duration::from_secs(5));
/// assert_eq!(seen_by_store.now().as_unix_millis(), 5_000);
/// ```
#[derive(Debug, Clone)]
pub struct ManualClock {
    millis: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self {
            millis: Arc::new(AtomicI64::new(start.as_unix_millis())),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let by = duration_millis(by);
        // fetch_update never fails when the closure always returns Some.
        let _ = self
            .millis
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |m| {
                Some(m.saturating_add(by))
            });
    }

    /// Sets the clock to `to` (backwards too, to test skew).
    pub fn set(&self, to: Timestamp) {
        self.millis.store(to.as_unix_millis(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.millis.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamp_arithmetic_saturates() {
        let max = Timestamp::from_unix_millis(i64::MAX);
        assert_eq!(max + Duration::from_secs(1), max);
        assert_eq!(
            Timestamp::from_unix_millis(i64::MIN) - Duration::MAX,
            Timestamp::from_unix_millis(i64::MIN)
        );
    }

    #[test]
    fn ttl_seconds_round_up() {
        assert_eq!(Timestamp::from_unix_millis(2_000).as_unix_secs_ceil(), 2);
        assert_eq!(Timestamp::from_unix_millis(2_001).as_unix_secs_ceil(), 3);
        assert_eq!(Timestamp::from_unix_millis(-1).as_unix_secs_ceil(), 0);
    }
}
