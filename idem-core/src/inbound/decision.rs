//! The claim decision table as a pure function, for stores that decide in
//! process (memory, or any store that can read and write one record atomically).

use crate::inbound::claim::{ClaimOutcome, ClaimRequest};
use crate::inbound::record::{Checkpoint, Lease, Record, RecordState};
use crate::plumbing::clock::Timestamp;

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
/// `now < retained_until`. The request's owner becomes the owner if the
/// decision claims; a live in-flight record that this owner already holds is
/// the same claim delivered again, and is answered as the first delivery was
/// (`Claimed` with the lease it holds), writing nothing. Stores that read the record and write it in one atomic step call
/// this; stores that decide on the server use it to answer from the record
/// that refused them.
///
/// ```
/// use idem_core::{Fingerprint, Scope};
/// use idem_core::store::{decide, ClaimOutcome, ClaimRequest, Timestamp};
///
/// let scope = Scope::parse("acme", "k")?;
/// let first = ClaimRequest::new(scope.clone(), Fingerprint::of_bytes(b"a"));
/// let now = Timestamp::from_unix_millis(0);
/// let claimed = decide(None, &first, now);
/// let record = claimed.write.expect("a claim writes");
///
/// let duplicate = decide(Some(&record), &first.clone().with_new_owner(), now);
/// assert!(matches!(duplicate.outcome, ClaimOutcome::InProgress { .. }));
/// assert!(duplicate.write.is_none());
///
/// let other = ClaimRequest::new(scope, Fingerprint::of_bytes(b"b"));
/// assert_eq!(decide(Some(&record), &other, now).outcome, ClaimOutcome::Mismatch);
///
/// // The first claim delivered again is answered as it was the first time.
/// assert!(matches!(decide(Some(&record), &first, now).outcome, ClaimOutcome::Claimed { .. }));
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
pub fn decide(existing: Option<&Record>, request: &ClaimRequest, now: Timestamp) -> Decision {
    let Some(existing) = existing.filter(|r| r.is_live(now)) else {
        return claim(request, now, 1, None);
    };
    if existing.fingerprint() != request.fingerprint() {
        return answer(ClaimOutcome::Mismatch);
    }
    match existing.state() {
        RecordState::Completed { response } => answer(ClaimOutcome::Completed(response.clone())),
        RecordState::InFlight { lease_expires_at } if existing.owner() == request.owner() => {
            answer(ClaimOutcome::Claimed {
                lease: Lease::issued(
                    request.scope().clone(),
                    request.owner(),
                    existing.attempt(),
                    *lease_expires_at,
                    request.retention(),
                ),
                checkpoint: existing.checkpoint().cloned(),
            })
        }
        RecordState::InFlight { lease_expires_at } if now < *lease_expires_at => {
            answer(ClaimOutcome::InProgress {
                retry_after: crate::inbound::codec::retry_after(*lease_expires_at, now),
            })
        }
        RecordState::InFlight { .. } => claim(
            request,
            now,
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
    attempt: u32,
    checkpoint: Option<Checkpoint>,
) -> Decision {
    let owner = request.owner();
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
    use crate::inbound::claim::{MAX_LEASE, MIN_DURATION};
    use crate::inbound::fingerprint::Fingerprint;
    use crate::inbound::record::StoredResponse;
    use crate::plumbing::scope::Scope;

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
        decide(None, &request(b"a"), T0)
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
            let req = request(body);
            let owner = req.owner();
            let d = decide(None, &req, T0);
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
            let d = decide(Some(&record), &request(body), at(RETENTION));
            assert!(matches!(d.outcome, ClaimOutcome::Claimed { .. }));
            assert_eq!(d.write.unwrap().attempt(), 1);
        }
    }

    #[test]
    fn record_one_millisecond_before_retention_still_counts() {
        let record = completed();
        let now = at(RETENTION) - Duration::from_millis(1);
        let d = decide(Some(&record), &request(b"a"), now);
        assert!(matches!(d.outcome, ClaimOutcome::Completed(_)));
    }

    #[test]
    fn valid_lease_same_fingerprint_is_in_progress_with_remaining_time() {
        let d = decide(
            Some(&in_flight()),
            &request(b"a"),
            at(Duration::from_secs(4)),
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
        let d = decide(Some(&in_flight()), &request(b"b"), T0);
        assert_eq!(d.outcome, ClaimOutcome::Mismatch);
        assert!(d.write.is_none());
    }

    #[test]
    fn lease_one_millisecond_before_expiry_is_still_held() {
        let now = at(LEASE) - Duration::from_millis(1);
        let d = decide(Some(&in_flight()), &request(b"a"), now);
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
        let req = request(b"a");
        let owner = req.owner();
        let d = decide(Some(&old), &req, at(LEASE));
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
        let d = decide(Some(&in_flight()), &request(b"b"), at(LEASE));
        assert_eq!(d.outcome, ClaimOutcome::Mismatch);
        assert!(d.write.is_none());
    }

    #[test]
    fn completed_same_fingerprint_replays() {
        let d = decide(Some(&completed()), &request(b"a"), at(LEASE));
        assert_eq!(
            d.outcome,
            ClaimOutcome::Completed(StoredResponse::new(200, "done"))
        );
        assert!(d.write.is_none());
    }

    #[test]
    fn completed_other_fingerprint_is_mismatch() {
        let d = decide(Some(&completed()), &request(b"b"), T0);
        assert_eq!(d.outcome, ClaimOutcome::Mismatch);
    }

    #[test]
    fn record_lives_at_least_as_long_as_its_lease() {
        let req = request(b"a")
            .with_retention(Duration::from_secs(1))
            .unwrap();
        let record = decide(None, &req, T0).write.unwrap();
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
        let d = decide(Some(&old), &request(b"a"), at(LEASE));
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

    #[test]
    fn the_same_claim_delivered_again_is_answered_as_the_first_time() {
        let req = request(b"a");
        let first = decide(None, &req, T0);
        let record = first.write.unwrap();
        let ClaimOutcome::Claimed { lease, .. } = first.outcome else {
            panic!("not claimed")
        };
        let again = decide(Some(&record), &req, at(Duration::from_secs(1)));
        assert!(again.write.is_none(), "a redelivery wrote");
        assert_eq!(
            again.outcome,
            ClaimOutcome::Claimed {
                lease,
                checkpoint: None
            }
        );
        let other = decide(Some(&record), &req.clone().with_new_owner(), T0);
        assert!(matches!(other.outcome, ClaimOutcome::InProgress { .. }));
    }
}
