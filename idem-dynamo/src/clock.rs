//! The service's clock: DynamoDB's time, read from the `Date` header every
//! response carries, so that callers whose own clocks disagree by hours
//! still judge leases, retention and the journal's key window alike.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::config::interceptors::BeforeDeserializationInterceptorContextRef;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use aws_sdk_dynamodb::primitives::{DateTime, DateTimeFormat};
use idem_core::store::{Clock, SystemClock, Timestamp};
use idem_core::{Operation, StoreError};

use crate::error::STORE;

/// How far past a record's retention, by the sweeping caller's clock, a
/// sweep waits before deleting it. Callers on the service's clock agree
/// within about a second plus a response's time in transit (each lags the
/// service by that much at most, and none is ahead of it); on their own
/// clocks, within their hosts' skew. A record deleted as soon as the
/// fastest caller saw its retention end would be gone for a caller that
/// still takes it for live (a replay cache in front of the store answers
/// it by that caller's clock), so the sweep leaves it this much longer.
pub(crate) const SWEEP_MARGIN: Duration = Duration::from_secs(5);

/// A correction moves the clock on by at most one part in this many of
/// the time that passes: a lease never lapses more than a tenth early for
/// the clock's own refinement.
const SLEW: i64 = 10;

/// DynamoDB's time, as its responses tell it: a local base clock (by
/// default the process's monotonic clock, anchored once to the system
/// clock) plus the offset of the service's `Date` headers from it.
///
/// A `Date` header has a second's precision and was written before the
/// response arrived, so each response proves the service's time at its
/// arrival is at least the header's second: the offset aimed at is the
/// largest such lower bound seen. The first response sets the clock; a
/// later, larger bound is reached gradually (a tenth of the time that
/// passes), so that a lease is never cut short by more than a tenth for
/// the clock's own refinement. So the clock is never ahead of the
/// service's, and behind it by less than a second plus a response's time
/// in transit, less once responses have arrived on both sides of a
/// second's turn and the clock has caught up. It never moves back, and a
/// jump of the system clock does not move it (the base is monotonic). Two
/// callers on it agree within that bound however far apart their own
/// clocks are: leases and windows must be longer than about a second,
/// which idem's defaults are by far.
///
/// Every DynamoDB part uses [`ServiceClock::shared`] unless its options set
/// another clock; a part on it installs the clock's reader on its client,
/// and before its first operation in a process asks DynamoDB once
/// (`ListTables` of one, whose answer, even a refusal, carries the time)
/// if no response has been read yet.
///
/// ```
/// use idem_core::store::Clock;
/// use idem_dynamo::ServiceClock;
///
/// let clock = ServiceClock::new();
/// assert!(!clock.is_synced());
/// let _before_any_response = clock.now(); // the base clock's time
/// ```
#[derive(Clone)]
pub struct ServiceClock {
    inner: Arc<Inner>,
}

struct Inner {
    base: Arc<dyn Clock>,
    /// The service's time minus the base's, once a response told it.
    offset: Mutex<Option<Offset>>,
}

/// The service's time minus the base's, in milliseconds: `applied` as of
/// the base's time `at`, moving toward `target` at the slew's pace.
#[derive(Debug, Clone, Copy)]
struct Offset {
    applied: i64,
    target: i64,
    at: i64,
}

impl Offset {
    fn at(&self, base: i64) -> i64 {
        let caught_up = base.saturating_sub(self.at).max(0) / SLEW;
        self.applied.saturating_add(caught_up).min(self.target)
    }
}

impl fmt::Debug for ServiceClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceClock")
            .field("base", &self.inner.base)
            .field("offset_ms", &self.offset_millis())
            .finish()
    }
}

impl Default for ServiceClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ServiceClock {
    /// A span on this clock that lasts `span` of real time at least: a
    /// tenth more, since a correction may run the clock that much fast
    /// (a back-off measured on it is then never cut short).
    pub(crate) fn at_least(span: Duration) -> Duration {
        span.saturating_add(span / u32::try_from(SLEW).unwrap_or(1))
    }

    /// A clock of its own on the process's monotonic clock, unsynced.
    pub fn new() -> Self {
        Self::on_base(MonotonicClock::new())
    }

    /// A clock of its own on `base` (tests: a caller's clock set hours
    /// off), unsynced.
    ///
    /// ```
    /// use idem_core::ManualClock;
    /// use idem_core::store::Timestamp;
    /// use idem_dynamo::ServiceClock;
    ///
    /// let clock = ServiceClock::on_base(ManualClock::new(Timestamp::from_unix_millis(0)));
    /// assert_eq!(clock.offset_millis(), None);
    /// ```
    pub fn on_base(base: impl Clock) -> Self {
        Self {
            inner: Arc::new(Inner {
                base: Arc::new(base),
                offset: Mutex::new(None),
            }),
        }
    }

    /// The process's one service clock, which every DynamoDB part uses by
    /// default: whatever any of them reads refines it for all.
    pub fn shared() -> Self {
        static SHARED: OnceLock<ServiceClock> = OnceLock::new();
        SHARED.get_or_init(ServiceClock::new).clone()
    }

    /// Whether a response's time has been read.
    pub fn is_synced(&self) -> bool {
        self.offset_millis().is_some()
    }

    /// The service's time minus the base's now, in milliseconds, once read.
    pub fn offset_millis(&self) -> Option<i64> {
        let base = self.inner.base.now().as_unix_millis();
        self.offset().map(|offset| offset.at(base))
    }

    fn offset(&self) -> Option<Offset> {
        // A panic elsewhere cannot leave an offset half-written.
        *self.inner.offset.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes in a response whose `Date` header said `date` (its second),
    /// read now.
    pub fn observe(&self, date: Timestamp) {
        let base = self.inner.base.now().as_unix_millis();
        let bound = date.as_unix_millis().saturating_sub(base);
        let mut offset = self.inner.offset.lock().unwrap_or_else(|e| e.into_inner());
        *offset = Some(match *offset {
            None => Offset {
                applied: bound,
                target: bound,
                at: base,
            },
            Some(known) => Offset {
                applied: known.at(base),
                target: known.target.max(bound),
                at: base,
            },
        });
    }

    /// What reads the `Date` header of every response of a client:
    /// installed on a part's client by the part itself.
    pub fn interceptor(&self) -> impl Intercept + 'static {
        DateReader {
            clock: self.clone(),
        }
    }

    /// Asks DynamoDB once through `client` unless a response was read, so
    /// that the clock is synced.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when no answer carried a time.
    pub(crate) async fn sync(
        &self,
        client: &aws_sdk_dynamodb::Client,
        operation: Operation,
    ) -> Result<(), StoreError> {
        if self.is_synced() {
            return Ok(());
        }
        // Refused or not, an answer carries the service's time; the
        // client's interceptor (this clock's) has read it by now.
        let _ = client.list_tables().limit(1).send().await;
        if self.is_synced() {
            return Ok(());
        }
        Err(StoreError::unavailable(
            STORE,
            operation,
            "no response of DynamoDB told its time, so the service clock cannot be read",
        ))
    }
}

impl Clock for ServiceClock {
    fn now(&self) -> Timestamp {
        let base = self.inner.base.now();
        match self.offset() {
            Some(offset) => {
                let base = base.as_unix_millis();
                Timestamp::from_unix_millis(base.saturating_add(offset.at(base)))
            }
            None => base,
        }
    }
}

/// The system clock read once, moved on by the monotonic clock: steady
/// whatever is done to the system's time meanwhile.
#[derive(Debug, Clone, Copy)]
struct MonotonicClock {
    anchor: Timestamp,
    since: Instant,
}

impl MonotonicClock {
    fn new() -> Self {
        Self {
            anchor: SystemClock.now(),
            since: Instant::now(),
        }
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Timestamp {
        self.anchor + self.since.elapsed()
    }
}

/// Reads the `Date` header of each response into its clock.
#[derive(Debug)]
struct DateReader {
    clock: ServiceClock,
}

impl Intercept for DateReader {
    fn name(&self) -> &'static str {
        "idem-service-clock"
    }

    fn read_after_transmit(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let date = context
            .response()
            .headers()
            .get("date")
            .and_then(|value| DateTime::from_str(value, DateTimeFormat::HttpDate).ok());
        if let Some(date) = date {
            self.clock.observe(Timestamp::from_unix_millis(
                date.secs().saturating_mul(1000),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::ManualClock;
    use std::time::Duration;

    #[test]
    fn the_offset_reaches_the_largest_lower_bound_gradually_and_never_moves_back() {
        let base = ManualClock::new(Timestamp::from_unix_millis(10_000));
        let clock = ServiceClock::on_base(base.clone());
        assert_eq!(
            clock.now(),
            Timestamp::from_unix_millis(10_000),
            "unsynced: the base"
        );
        // The service says second 7,200 (two hours on) at base 10,000: set
        // at once.
        clock.observe(Timestamp::from_unix_millis(7_200_000));
        assert_eq!(clock.offset_millis(), Some(7_190_000));
        base.advance(Duration::from_millis(700));
        // Still second 7,200: an older answer proves less, and changes
        // nothing.
        clock.observe(Timestamp::from_unix_millis(7_200_000));
        assert_eq!(clock.now(), Timestamp::from_unix_millis(7_200_700));
        base.advance(Duration::from_millis(200));
        // The second turned: the service is at least at 7,201 s now, 100 ms
        // more than the clock says; it catches up a tenth of the time that
        // passes.
        clock.observe(Timestamp::from_unix_millis(7_201_000));
        assert_eq!(clock.now(), Timestamp::from_unix_millis(7_200_900));
        base.advance(Duration::from_millis(50));
        assert_eq!(clock.now(), Timestamp::from_unix_millis(7_200_955));
        base.advance(Duration::from_millis(1_000));
        assert_eq!(
            clock.now(),
            Timestamp::from_unix_millis(7_202_050),
            "caught up"
        );
        assert_eq!(clock.offset_millis(), Some(7_190_100));
    }

    #[test]
    fn a_date_header_is_read_at_a_seconds_precision() {
        let parsed = DateTime::from_str("Thu, 03 Dec 2026 12:00:05 GMT", DateTimeFormat::HttpDate)
            .map(|d| d.secs());
        assert_eq!(parsed.ok(), Some(1_796_299_205));
    }
}
