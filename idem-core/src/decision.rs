//! The claim decision table as a pure function, for stores that decide in
//! process (memory, or any store that can read and write one record atomically).

use crate::claim::{ClaimOutcome, ClaimRequest};
use crate::clock::Timestamp;
use crate::record::{Checkpoint, Lease, OwnerToken, Record, RecordState};

/// What a store must do for one claim: write `write` (if any) and answer `outcome`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Decision {
    /// The record to store in place of the existing one; `None` leaves it untouched.
    pub write: Option<Record>,
    /// The answer to the caller.
    pub outcome: ClaimOutcome,
}

/// The claim decision table of the [`store`](crate::store) module, judged at `now`.
///
/// A lease is valid while `now < lease_expires_at`; a record is live while
/// `now < retained_until`. `new_owner` becomes the owner if the decision
/// claims. Stores that read the record and write it in one atomic step call
/// this; stores that decide on the server use it to answer from the record
/// that refused them.
///
/// ```
/// use idem_core::{Fingerprint, Scope};
/// use idem_core::store::{decide, ClaimOutcome, ClaimRequest, OwnerToken, Timestamp};
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
    if existing.fingerprint() != request.fingerprint() {
        return answer(ClaimOutcome::Mismatch);
    }
    match existing.state() {
        RecordState::Completed { response } => answer(ClaimOutcome::Completed(response.clone())),
        RecordState::InFlight { lease_expires_at } if now < *lease_expires_at => {
            answer(ClaimOutcome::InProgress {
                retry_after: crate::codec::retry_after(*lease_expires_at, now),
            })
        }
        RecordState::InFlight { .. } => claim(
            request,
            now,
            new_owner,
            existing.attempt().saturating_add(1),
            existing.checkpoint().cloned(),
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
    checkpoint: Option<Checkpoint>,
) -> Decision {
    let lease_expires_at = now + request.lease();
    let record = Record::in_flight(
        request.scope().clone(),
        request.fingerprint(),
        owner,
        attempt,
        lease_expires_at,
        now + request.claim_retention(),
    )
    .with_checkpoint(checkpoint.clone());
    let lease = Lease::issued(
        request.scope().clone(),
        owner,
        attempt,
        lease_expires_at,
        request.retention(),
    );
    Decision {
        write: Some(record),
        outcome: ClaimOutcome::Claimed { lease, checkpoint },
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::claim::{MAX_LEASE, MIN_DURATION};
    use crate::fingerprint::Fingerprint;
    use crate::record::StoredResponse;
    use crate::scope::Scope;

    const T0: Timestamp = Timestamp::from_unix_millis(1_000_000);
    const LEASE: Duration = Duration::from_secs(10);
    const RETENTION: Duration = Duration::from_secs(100);

    fn request(body: &[u8]) -> ClaimRequest {
        ClaimRequest::new(
            Scope::parse("tenant", "key").unwrap(),
            Fingerprint::of_bytes(body),
        )
        .with_lease(LEASE)
        .unwrap()
        .with_retention(RETENTION)
        .unwrap()
    }

    fn in_flight() -> Record {
        decide(None, &request(b"a"), T0, OwnerToken::generate())
            .write
            .unwrap()
            .with_checkpoint(Some(Checkpoint::new("step", &1).unwrap()))
    }

    fn completed() -> Record {
        in_flight().completed(StoredResponse::new(200, "done"), T0 + RETENTION)
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
            assert_eq!(record.attempt(), 1);
            assert_eq!(record.owner(), owner);
            assert_eq!(record.retained_until(), T0 + RETENTION);
            assert_eq!(
                *record.state(),
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
            assert_eq!(d.write.unwrap().attempt(), 1);
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
        assert_eq!(record.attempt(), 2);
        assert_eq!(record.owner(), owner);
        assert_ne!(record.owner(), old.owner());
        assert_eq!(record.checkpoint(), old.checkpoint());
        assert_eq!(
            *record.state(),
            RecordState::InFlight {
                lease_expires_at: at(LEASE) + LEASE
            }
        );
        let ClaimOutcome::Claimed { lease, checkpoint } = d.outcome else {
            panic!("not claimed")
        };
        assert_eq!(lease.attempt(), 2);
        assert_eq!(checkpoint.as_ref(), old.checkpoint());
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
        assert_eq!(record.retained_until(), T0 + LEASE);
    }

    #[test]
    fn attempt_saturates_instead_of_overflowing() {
        let fresh = in_flight();
        let old = Record::in_flight(
            fresh.scope().clone(),
            fresh.fingerprint(),
            fresh.owner(),
            u32::MAX,
            T0 + LEASE,
            T0 + RETENTION,
        );
        let d = decide(
            Some(&old),
            &request(b"a"),
            at(LEASE),
            OwnerToken::generate(),
        );
        assert_eq!(d.write.unwrap().attempt(), u32::MAX);
    }

    #[test]
    fn durations_out_of_range_are_refused() {
        let r = request(b"a");
        assert!(r.clone().with_lease(Duration::from_micros(999)).is_err());
        assert!(r.clone().with_lease(MAX_LEASE + MIN_DURATION).is_err());
        assert!(r.clone().with_retention(Duration::ZERO).is_err());
        assert!(r.with_retention(Duration::MAX).is_err());
    }
}
