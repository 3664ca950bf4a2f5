//! The claim decision table as a pure function, for stores that decide in
//! process (memory, or any store that can read and write one record atomically).

use std::time::Duration;

use crate::clock::Timestamp;
use crate::error::InvalidInput;
use crate::fingerprint::Fingerprint;
use crate::record::{Lease, OwnerToken, Record, RecordState};
use crate::scope::Scope;
use crate::store::ClaimOutcome;

/// The shortest lease or retention accepted: stores keep milliseconds.
pub const MIN_DURATION: Duration = Duration::from_millis(1);
/// The longest lease accepted.
pub const MAX_LEASE: Duration = Duration::from_secs(7 * 24 * 3600);
/// The longest retention accepted.
pub const MAX_RETENTION: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

/// What a claim asks for: the scope, the request's fingerprint, how long to
/// hold the key, and how long to keep the record.
///
/// ```
/// use std::time::Duration;
/// use idem_core::{ClaimRequest, Fingerprint, Scope};
///
/// let request = ClaimRequest::new(Scope::parse("acme", "k")?, Fingerprint::of_bytes(b"x"))
///     .with_lease_ttl(Duration::from_secs(10))?
///     .with_retention(Duration::from_secs(86_400))?;
/// assert_eq!(request.lease_ttl(), Duration::from_secs(10));
/// assert!(request.clone().with_lease_ttl(Duration::ZERO).is_err());
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    scope: Scope,
    fingerprint: Fingerprint,
    lease_ttl: Duration,
    retention: Duration,
}

fn check_range(
    field: &'static str,
    value: Duration,
    max: Duration,
    reason: &'static str,
) -> Result<Duration, InvalidInput> {
    if value < MIN_DURATION || value > max {
        return Err(InvalidInput::OutOfRange { field, reason });
    }
    // Stores keep whole milliseconds; round down so every store agrees.
    Ok(Duration::from_millis(value.as_millis() as u64))
}

/// Validates a lease duration (for claims, renewals and runners): 1 ms to 7
/// days, rounded down to whole milliseconds.
///
/// ```
/// use std::time::Duration;
/// assert!(idem_core::validate_lease_ttl(Duration::from_secs(30)).is_ok());
/// assert!(idem_core::validate_lease_ttl(Duration::ZERO).is_err());
/// ```
///
/// # Errors
///
/// [`InvalidInput::OutOfRange`] outside that range.
pub fn validate_lease_ttl(ttl: Duration) -> Result<Duration, InvalidInput> {
    check_range("lease ttl", ttl, MAX_LEASE, "must be 1 ms to 7 days")
}

/// Validates a retention: 1 ms to 10 years, rounded down to whole milliseconds.
///
/// # Errors
///
/// [`InvalidInput::OutOfRange`] outside that range.
pub fn validate_retention(retention: Duration) -> Result<Duration, InvalidInput> {
    check_range(
        "retention",
        retention,
        MAX_RETENTION,
        "must be 1 ms to 10 years",
    )
}

impl ClaimRequest {
    /// The default lease: 30 seconds.
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(30);
    /// The default retention: 24 hours.
    pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);

    /// A claim with the default lease and retention.
    pub fn new(scope: Scope, fingerprint: Fingerprint) -> Self {
        Self {
            scope,
            fingerprint,
            lease_ttl: Self::DEFAULT_LEASE_TTL,
            retention: Self::DEFAULT_RETENTION,
        }
    }

    /// Sets how long the claim holds the key before another request may take it over.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::OutOfRange`] outside 1 ms to 7 days.
    pub fn with_lease_ttl(mut self, ttl: Duration) -> Result<Self, InvalidInput> {
        self.lease_ttl = validate_lease_ttl(ttl)?;
        Ok(self)
    }

    /// Sets how long the record is kept (from the claim, and again from completion).
    ///
    /// # Errors
    ///
    /// [`InvalidInput::OutOfRange`] outside 1 ms to 10 years.
    pub fn with_retention(mut self, retention: Duration) -> Result<Self, InvalidInput> {
        self.retention = validate_retention(retention)?;
        Ok(self)
    }

    /// The scope.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The request's fingerprint.
    pub fn fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    /// The lease duration.
    pub fn lease_ttl(&self) -> Duration {
        self.lease_ttl
    }

    /// The retention.
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// How long a record claimed now must live: at least its lease.
    pub fn record_ttl(&self) -> Duration {
        self.retention.max(self.lease_ttl)
    }
}

/// What a store must do for one claim: write `write` (if any) and answer `outcome`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Decision {
    /// The record to store in place of the existing one; `None` leaves it untouched.
    pub write: Option<Record>,
    /// The answer to the caller.
    pub outcome: ClaimOutcome,
}

/// The claim decision table (DESIGN.md, "The claim"), judged at `now`.
///
/// | record                     | same fingerprint      | other fingerprint |
/// |----------------------------|-----------------------|-------------------|
/// | absent or past retention   | Claimed (attempt 1)   | Claimed           |
/// | in flight, lease valid     | InProgress            | Mismatch          |
/// | in flight, lease expired   | Claimed, takeover     | Mismatch          |
/// | completed                  | Completed (replay)    | Mismatch          |
///
/// A lease is valid while `now < lease_expires_at`; a record is live while
/// `now < expires_at`. `new_owner` becomes the owner if the decision claims.
///
/// ```
/// use idem_core::{decide, ClaimOutcome, ClaimRequest, Fingerprint, OwnerToken, Scope, Timestamp};
///
/// let scope = Scope::parse("acme", "k")?;
/// let first = ClaimRequest::new(scope.clone(), Fingerprint::of_bytes(b"a"));
/// let now = Timestamp::from_unix_millis(0);
/// let claimed = decide(None, &first, now, OwnerToken::generate());
/// let record = claimed.write.expect("a claim writes");
///
/// let duplicate = decide(Some(&record), &first, now, OwnerToken::generate());
/// assert!(matches!(duplicate.outcome, ClaimOutcome::InProgress { .. }));
/// assert!(duplicate.write.is_none());
///
/// let other = ClaimRequest::new(scope, Fingerprint::of_bytes(b"b"));
/// assert_eq!(decide(Some(&record), &other, now, OwnerToken::generate()).outcome, ClaimOutcome::Mismatch);
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
pub fn decide(
    existing: Option<&Record>,
    request: &ClaimRequest,
    now: Timestamp,
    new_owner: OwnerToken,
) -> Decision {
    let Some(existing) = existing.filter(|r| r.is_live(now)) else {
        return claim(request, now, new_owner, 1, None);
    };
    if existing.fingerprint != request.fingerprint {
        return answer(ClaimOutcome::Mismatch);
    }
    match &existing.state {
        RecordState::Completed { response } => answer(ClaimOutcome::Completed(response.clone())),
        RecordState::InFlight { lease_expires_at } if now < *lease_expires_at => {
            answer(ClaimOutcome::InProgress {
                retry_after: lease_expires_at.saturating_duration_since(now),
            })
        }
        RecordState::InFlight { .. } => claim(
            request,
            now,
            new_owner,
            existing.attempt.saturating_add(1),
            existing.checkpoint.clone(),
        ),
    }
}

fn answer(outcome: ClaimOutcome) -> Decision {
    Decision {
        write: None,
        outcome,
    }
}

fn claim(
    request: &ClaimRequest,
    now: Timestamp,
    owner: OwnerToken,
    attempt: u32,
    checkpoint: Option<crate::record::Checkpoint>,
) -> Decision {
    let lease_expires_at = now + request.lease_ttl;
    let mut record = Record::in_flight(
        request.scope.clone(),
        request.fingerprint,
        owner,
        attempt,
        lease_expires_at,
        now + request.record_ttl(),
    );
    record.checkpoint = checkpoint.clone();
    let lease = Lease::issued(
        request.scope.clone(),
        owner,
        attempt,
        lease_expires_at,
        request.retention,
    );
    Decision {
        write: Some(record),
        outcome: ClaimOutcome::Claimed { lease, checkpoint },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Checkpoint, StoredResponse};

    const T0: Timestamp = Timestamp::from_unix_millis(1_000_000);
    const LEASE: Duration = Duration::from_secs(10);
    const RETENTION: Duration = Duration::from_secs(100);

    fn request(body: &[u8]) -> ClaimRequest {
        ClaimRequest::new(
            Scope::parse("tenant", "key").unwrap(),
            Fingerprint::of_bytes(body),
        )
        .with_lease_ttl(LEASE)
        .unwrap()
        .with_retention(RETENTION)
        .unwrap()
    }

    fn in_flight() -> Record {
        let mut record = decide(None, &request(b"a"), T0, OwnerToken::generate())
            .write
            .unwrap();
        record.checkpoint = Some(Checkpoint::new("step", &1).unwrap());
        record
    }

    fn completed() -> Record {
        let mut record = in_flight();
        record.state = RecordState::Completed {
            response: StoredResponse::new(200, "done"),
        };
        record
    }

    fn at(offset: Duration) -> Timestamp {
        T0 + offset
    }

    #[test]
    fn absent_record_is_claimed_at_attempt_one() {
        for body in [&b"a"[..], b"b"] {
            let owner = OwnerToken::generate();
            let d = decide(None, &request(body), T0, owner);
            let record = d.write.unwrap();
            assert_eq!(record.attempt, 1);
            assert_eq!(record.owner, owner);
            assert_eq!(record.expires_at, T0 + RETENTION);
            assert_eq!(
                record.state,
                RecordState::InFlight {
                    lease_expires_at: T0 + LEASE
                }
            );
            let ClaimOutcome::Claimed { lease, checkpoint } = d.outcome else {
                panic!("not claimed")
            };
            assert_eq!(lease.owner(), owner);
            assert_eq!(checkpoint, None);
        }
    }

    #[test]
    fn record_past_retention_is_claimed_whatever_the_fingerprint() {
        let record = completed();
        for body in [&b"a"[..], b"b"] {
            let d = decide(
                Some(&record),
                &request(body),
                at(RETENTION),
                OwnerToken::generate(),
            );
            assert!(matches!(d.outcome, ClaimOutcome::Claimed { .. }));
            assert_eq!(d.write.unwrap().attempt, 1);
        }
    }

    #[test]
    fn record_one_millisecond_before_retention_still_counts() {
        let record = completed();
        let now = at(RETENTION) - Duration::from_millis(1);
        let d = decide(Some(&record), &request(b"a"), now, OwnerToken::generate());
        assert!(matches!(d.outcome, ClaimOutcome::Completed(_)));
    }

    #[test]
    fn valid_lease_same_fingerprint_is_in_progress_with_remaining_time() {
        let d = decide(
            Some(&in_flight()),
            &request(b"a"),
            at(Duration::from_secs(4)),
            OwnerToken::generate(),
        );
        assert_eq!(
            d.outcome,
            ClaimOutcome::InProgress {
                retry_after: Duration::from_secs(6)
            }
        );
        assert!(d.write.is_none());
    }

    #[test]
    fn valid_lease_other_fingerprint_is_mismatch() {
        let d = decide(
            Some(&in_flight()),
            &request(b"b"),
            T0,
            OwnerToken::generate(),
        );
        assert_eq!(d.outcome, ClaimOutcome::Mismatch);
        assert!(d.write.is_none());
    }

    #[test]
    fn lease_one_millisecond_before_expiry_is_still_held() {
        let now = at(LEASE) - Duration::from_millis(1);
        let d = decide(
            Some(&in_flight()),
            &request(b"a"),
            now,
            OwnerToken::generate(),
        );
        assert_eq!(
            d.outcome,
            ClaimOutcome::InProgress {
                retry_after: Duration::from_millis(1)
            }
        );
    }

    #[test]
    fn expired_lease_same_fingerprint_is_taken_over_with_checkpoint() {
        let old = in_flight();
        let owner = OwnerToken::generate();
        let d = decide(Some(&old), &request(b"a"), at(LEASE), owner);
        let record = d.write.unwrap();
        assert_eq!(record.attempt, 2);
        assert_eq!(record.owner, owner);
        assert_ne!(record.owner, old.owner);
        assert_eq!(record.checkpoint, old.checkpoint);
        assert_eq!(
            record.state,
            RecordState::InFlight {
                lease_expires_at: at(LEASE) + LEASE
            }
        );
        let ClaimOutcome::Claimed { lease, checkpoint } = d.outcome else {
            panic!("not claimed")
        };
        assert_eq!(lease.attempt(), 2);
        assert_eq!(checkpoint, old.checkpoint);
    }

    #[test]
    fn expired_lease_other_fingerprint_is_mismatch() {
        let d = decide(
            Some(&in_flight()),
            &request(b"b"),
            at(LEASE),
            OwnerToken::generate(),
        );
        assert_eq!(d.outcome, ClaimOutcome::Mismatch);
        assert!(d.write.is_none());
    }

    #[test]
    fn completed_same_fingerprint_replays() {
        let d = decide(
            Some(&completed()),
            &request(b"a"),
            at(LEASE),
            OwnerToken::generate(),
        );
        assert_eq!(
            d.outcome,
            ClaimOutcome::Completed(StoredResponse::new(200, "done"))
        );
        assert!(d.write.is_none());
    }

    #[test]
    fn completed_other_fingerprint_is_mismatch() {
        let d = decide(
            Some(&completed()),
            &request(b"b"),
            T0,
            OwnerToken::generate(),
        );
        assert_eq!(d.outcome, ClaimOutcome::Mismatch);
    }

    #[test]
    fn record_lives_at_least_as_long_as_its_lease() {
        let req = request(b"a")
            .with_retention(Duration::from_secs(1))
            .unwrap();
        let record = decide(None, &req, T0, OwnerToken::generate())
            .write
            .unwrap();
        assert_eq!(record.expires_at, T0 + LEASE);
    }

    #[test]
    fn attempt_saturates_instead_of_overflowing() {
        let mut old = in_flight();
        old.attempt = u32::MAX;
        let d = decide(
            Some(&old),
            &request(b"a"),
            at(LEASE),
            OwnerToken::generate(),
        );
        assert_eq!(d.write.unwrap().attempt, u32::MAX);
    }

    #[test]
    fn durations_out_of_range_are_refused() {
        let r = request(b"a");
        assert!(
            r.clone()
                .with_lease_ttl(Duration::from_micros(999))
                .is_err()
        );
        assert!(r.clone().with_lease_ttl(MAX_LEASE + MIN_DURATION).is_err());
        assert!(r.clone().with_retention(Duration::ZERO).is_err());
        assert!(r.with_retention(Duration::MAX).is_err());
    }
}
