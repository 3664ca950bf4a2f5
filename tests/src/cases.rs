//! One function per behaviour of the contract. Each takes a fresh tenant, so
//! cases run in parallel against one store and never interfere.

use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{
    ClaimOutcome, ClaimRequest, IdempotencyStore, Lease, RecordState, Timestamp,
};
use idem_core::{
    Checkpoint, HandlerError, Idempotency, RunContext, RunError, RunOutcome, Scope, StoreError,
    StoredResponse, Tenant,
};

use crate::support::*;

// ---- The decision table -------------------------------------------------

/// An absent record is claimed by a new owner at attempt 1, with no checkpoint.
pub async fn absent_record_is_claimed_at_attempt_one<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let scope = fresh_scope();
    let (lease, checkpoint) = must_claim(&*store, &long(&scope, "a")).await;
    assert_eq!(lease.attempt(), 1);
    assert_eq!(lease.scope(), &scope);
    assert_eq!(checkpoint, None);
    let record = store.get(&scope).await.unwrap().expect("claimed record");
    assert!(record.is_in_flight());
    assert_eq!(record.owner(), lease.owner());
}

/// A duplicate while the lease is valid is told to retry within the lease.
pub async fn duplicate_while_lease_valid_is_in_progress<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let request = long(&scope, "a");
    must_claim(&*store, &request).await;
    match claim(&*store, &request).await {
        ClaimOutcome::InProgress { retry_after } => {
            assert!(retry_after > Duration::ZERO, "retry_after is zero");
            assert!(
                retry_after <= LONG_LEASE,
                "retry_after {retry_after:?} beyond the lease"
            );
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
}

/// `InProgress::retry_after` is the lease's remaining time, not the whole
/// lease: a duplicate arriving late in the lease waits less.
pub async fn in_progress_waits_only_the_remaining_lease<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    // Half the lease waited, and as long again for a loaded machine's
    // round trips before the lease could lapse.
    let lease = Duration::from_secs(6);
    let scope = fresh_scope();
    let request = crate::support::request(&scope, "a", lease);
    must_claim(&*store, &request).await;
    tokio::time::sleep(lease / 2).await;
    match claim(&*store, &request).await {
        ClaimOutcome::InProgress { retry_after } => {
            assert!(retry_after > Duration::ZERO);
            assert!(
                retry_after <= lease - Duration::from_secs(2),
                "retry_after {retry_after:?} halfway through a {lease:?} lease"
            );
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
}

/// Another fingerprint while the lease is valid is a mismatch.
pub async fn other_fingerprint_while_in_flight_is_mismatch<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    must_claim(&*store, &long(&scope, "a")).await;
    assert_eq!(
        claim(&*store, &long(&scope, "b")).await,
        ClaimOutcome::Mismatch
    );
}

/// An expired lease is taken over by a new owner at the next attempt.
pub async fn expired_lease_is_taken_over_with_next_attempt<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let request = short(&scope, "a");
    let (first, _) = must_claim(&*store, &request).await;
    let (second, _) = wait_for_claim(&*store, &request).await;
    assert_eq!(second.attempt(), 2);
    assert_ne!(second.owner(), first.owner());
    let (third, _) = wait_for_claim(&*store, &request).await;
    assert_eq!(third.attempt(), 3);
    let record = store.get(&scope).await.unwrap().expect("record");
    assert_eq!(record.owner(), third.owner());
    assert_eq!(record.attempt(), 3);
}

/// A takeover receives the checkpoint the previous owner recorded.
pub async fn takeover_carries_the_checkpoint<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let scope = fresh_scope();
    let request = short(&scope, "a");
    let (first, _) = must_claim(&*store, &request).await;
    let point = Checkpoint::new("charged", &serde_json_value()).unwrap();
    store.checkpoint(&first, &point).await.unwrap();
    let (_, carried) = wait_for_claim(&*store, &request).await;
    assert_eq!(carried, Some(point));
}

fn serde_json_value() -> impl serde::Serialize {
    #[derive(serde::Serialize)]
    struct Point {
        charge_id: &'static str,
        amount: u32,
        tags: [&'static str; 2],
    }
    Point {
        charge_id: "ch_1",
        amount: 1000,
        tags: ["a", "ü"],
    }
}

/// Another fingerprint on an expired lease is a mismatch, not a takeover.
pub async fn other_fingerprint_on_expired_lease_is_mismatch<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let (first, _) = must_claim(&*store, &short(&scope, "a")).await;
    outlive(SHORT_LEASE).await;
    assert_eq!(
        claim(&*store, &short(&scope, "b")).await,
        ClaimOutcome::Mismatch
    );
    let record = store.get(&scope).await.unwrap().expect("record");
    assert_eq!(
        record.owner(),
        first.owner(),
        "a mismatch must not take over"
    );
}

/// A completed record replays its response.
pub async fn completed_record_replays_its_response<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let scope = fresh_scope();
    let request = long(&scope, "a");
    let stored = response("created");
    claim_and_complete(&*store, &request, &stored).await;
    for _ in 0..3 {
        assert_eq!(
            claim(&*store, &request).await,
            ClaimOutcome::Completed(stored.clone())
        );
    }
}

/// Another fingerprint on a completed record is a mismatch.
pub async fn other_fingerprint_on_completed_record_is_mismatch<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    claim_and_complete(&*store, &long(&scope, "a"), &response("x")).await;
    assert_eq!(
        claim(&*store, &long(&scope, "b")).await,
        ClaimOutcome::Mismatch
    );
}

/// A record past retention is claimed afresh, at attempt 1, with the same fingerprint.
pub async fn record_past_retention_is_claimed_afresh<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let scope = fresh_scope();
    let request = brief(long(&scope, "a"));
    claim_and_complete(&*store, &request, &response("old")).await;
    wait_until_absent(&*store, &scope).await;
    let (lease, checkpoint) = must_claim(&*store, &request).await;
    assert_eq!(lease.attempt(), 1);
    assert_eq!(checkpoint, None);
}

/// A record past retention is claimed by a request with any fingerprint.
pub async fn record_past_retention_is_claimed_with_any_fingerprint<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    claim_and_complete(&*store, &brief(long(&scope, "a")), &response("old")).await;
    wait_until_absent(&*store, &scope).await;
    let (lease, _) = must_claim(&*store, &long(&scope, "b")).await;
    assert_eq!(lease.attempt(), 1);
}

// ---- Fencing -------------------------------------------------------------

async fn taken_over<S: IdempotencyStore + ?Sized>(store: &S) -> (Scope, Lease, Lease) {
    let scope = fresh_scope();
    let request = short(&scope, "a");
    let (stale, _) = must_claim(store, &request).await;
    let (fresh, _) = wait_for_claim(store, &request).await;
    (scope, stale, fresh)
}

/// After a takeover the stale owner cannot complete, and the new owner can.
pub async fn stale_owner_cannot_complete_after_takeover<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let (scope, stale, fresh) = taken_over(&*store).await;
    assert_lost(
        "stale complete",
        store.complete(&stale, &response("stale")).await,
    );
    let record = store.get(&scope).await.unwrap().expect("record");
    assert!(record.is_in_flight(), "stale complete changed the record");
    store.complete(&fresh, &response("fresh")).await.unwrap();
    assert_eq!(
        claim(&*store, &short(&scope, "a")).await,
        ClaimOutcome::Completed(response("fresh"))
    );
}

/// After a takeover the stale owner cannot extend the new owner's lease.
pub async fn stale_owner_cannot_renew_after_takeover<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let (scope, stale, fresh) = taken_over(&*store).await;
    let before = store.get(&scope).await.unwrap().expect("record");
    assert_lost("stale renew", store.renew(&stale, LONG_LEASE).await);
    let after = store.get(&scope).await.unwrap().expect("record");
    assert_eq!(before.state(), after.state(), "stale renew moved the lease");
    assert_eq!(after.owner(), fresh.owner());
}

/// After a takeover the stale owner cannot delete the new owner's record.
pub async fn stale_owner_cannot_release_after_takeover<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let (scope, stale, fresh) = taken_over(&*store).await;
    assert_lost("stale release", store.release(&stale).await);
    let record = store
        .get(&scope)
        .await
        .unwrap()
        .expect("stale release deleted the record");
    assert_eq!(record.owner(), fresh.owner());
}

/// After a takeover the stale owner cannot overwrite the checkpoint.
pub async fn stale_owner_cannot_checkpoint_after_takeover<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let (scope, stale, fresh) = taken_over(&*store).await;
    let mine = Checkpoint::new("fresh", &1).unwrap();
    store.checkpoint(&fresh, &mine).await.unwrap();
    let theirs = Checkpoint::new("stale", &2).unwrap();
    assert_lost("stale checkpoint", store.checkpoint(&stale, &theirs).await);
    let record = store.get(&scope).await.unwrap().expect("record");
    assert_eq!(record.checkpoint(), Some(&mine));
}

/// A stale owner never overwrites, even with exactly the response the new
/// owner stored: that is another owner's completion, not its own delivered
/// again, so it is `LostLease` and the record stays the new owner's.
pub async fn stale_owner_cannot_complete_even_with_the_new_owners_response<
    S: IdempotencyStore + ?Sized,
>(
    store: Arc<S>,
) {
    let (scope, stale, fresh) = taken_over(&*store).await;
    let same = response("the same response");
    store.complete(&fresh, &same).await.unwrap();
    assert_lost(
        "stale complete with the new owner's response",
        store.complete(&stale, &same).await,
    );
    let record = store.get(&scope).await.unwrap().expect("record");
    assert_eq!(record.owner(), fresh.owner());
    assert_eq!(record.attempt(), fresh.attempt());
    assert_eq!(record.response(), Some(&same));
}

/// An owner whose lease expired, but which nobody took over, still completes.
pub async fn owner_with_expired_lease_can_still_complete<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let request = short(&scope, "a");
    let (lease, _) = must_claim(&*store, &request).await;
    outlive(SHORT_LEASE).await;
    store.complete(&lease, &response("late")).await.unwrap();
    assert_eq!(
        claim(&*store, &request).await,
        ClaimOutcome::Completed(response("late"))
    );
}

/// An expired lease that nobody has taken over still owns for every fenced
/// operation, not only completion: its owner renews, checkpoints and
/// releases after the expiry.
pub async fn owner_with_expired_lease_can_still_renew_checkpoint_and_release<
    S: IdempotencyStore + ?Sized,
>(
    store: Arc<S>,
) {
    let tenant = fresh_tenant();
    let kept = Scope::new(tenant.clone(), key("kept"));
    let freed = Scope::new(tenant, key("freed"));
    let (lease, _) = must_claim(&*store, &short(&kept, "a")).await;
    let (to_free, _) = must_claim(&*store, &short(&freed, "a")).await;
    wait_for_the_store_clock(&*store, &kept, lease.expires_at()).await;
    wait_for_the_store_clock(&*store, &freed, to_free.expires_at()).await;

    let point = Checkpoint::new("late", &1).unwrap();
    store
        .checkpoint(&lease, &point)
        .await
        .expect("a checkpoint by the owner of an expired lease nobody took over");
    let renewed = store
        .renew(&lease, LONG_LEASE)
        .await
        .expect("a renewal by the owner of an expired lease nobody took over");
    let record = store.get(&kept).await.unwrap().expect("record");
    assert_eq!(record.checkpoint(), Some(&point));
    assert_eq!(record.lease_expires_at(), Some(renewed.expires_at()));
    assert!(matches!(
        claim(&*store, &short(&kept, "a")).await,
        ClaimOutcome::InProgress { .. }
    ));

    store
        .release(&to_free)
        .await
        .expect("a release by the owner of an expired lease nobody took over");
    assert_eq!(
        store.get(&freed).await.unwrap(),
        None,
        "the release left the record"
    );
    let (next, carried) = must_claim(&*store, &long(&freed, "a")).await;
    assert_eq!((next.attempt(), carried), (1, None));
}

/// A completed record cannot be completed again, even by its owner.
pub async fn completed_record_cannot_be_completed_again<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let request = long(&scope, "a");
    let lease = claim_and_complete(&*store, &request, &response("first")).await;
    assert_lost(
        "second complete",
        store.complete(&lease, &response("second")).await,
    );
    assert_lost(
        "renew after complete",
        store.renew(&lease, LONG_LEASE).await,
    );
    assert_lost("release after complete", store.release(&lease).await);
    assert_eq!(
        claim(&*store, &request).await,
        ClaimOutcome::Completed(response("first"))
    );
}

/// Release deletes the claim, so the next claim gets in at once.
pub async fn release_lets_the_next_claim_in_at_once<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let scope = fresh_scope();
    let request = long(&scope, "a");
    let (first, _) = must_claim(&*store, &request).await;
    store.release(&first).await.unwrap();
    assert_eq!(store.get(&scope).await.unwrap(), None);
    let (second, _) = must_claim(&*store, &long(&scope, "b")).await;
    assert_eq!(second.attempt(), 1);
}

/// A released lease holds nothing: it can neither complete nor release again.
pub async fn released_lease_cannot_complete<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let scope = fresh_scope();
    let (lease, _) = must_claim(&*store, &long(&scope, "a")).await;
    store.release(&lease).await.unwrap();
    assert_lost(
        "complete after release",
        store.complete(&lease, &response("x")).await,
    );
    store
        .release(&lease)
        .await
        .expect("a release delivered again answers as the first did");
    assert_eq!(store.get(&scope).await.unwrap(), None);
}

/// Renewal pushes the lease out, so a duplicate stays in progress past the
/// original expiry.
pub async fn renew_extends_the_lease<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let scope = fresh_scope();
    let request = short(&scope, "a");
    let (lease, _) = must_claim(&*store, &request).await;
    let renewed = store.renew(&lease, LONG_LEASE).await.unwrap();
    assert!(renewed.expires_at() > lease.expires_at());
    assert_eq!(renewed.owner(), lease.owner());
    outlive(SHORT_LEASE).await;
    assert!(matches!(
        claim(&*store, &request).await,
        ClaimOutcome::InProgress { .. }
    ));
    store.complete(&renewed, &response("done")).await.unwrap();
}

/// Renewal counts from now, not from the old expiry: renewing a long lease
/// by a short time shortens it.
pub async fn renewal_counts_from_now_not_from_the_old_expiry<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let (lease, _) = must_claim(&*store, &long(&scope, "a")).await;
    let renewed = store.renew(&lease, Duration::from_secs(1)).await.unwrap();
    assert!(
        renewed.expires_at() < lease.expires_at() - Duration::from_secs(30),
        "renewal by 1 s moved a 60 s lease from {:?} to {:?}",
        lease.expires_at(),
        renewed.expires_at()
    );
    let record = store.get(&scope).await.unwrap().expect("record");
    assert_eq!(record.lease_expires_at(), Some(renewed.expires_at()));
}

/// An `extend` outside 1 ms to 7 days is `InvalidInput`, and the lease is unchanged.
pub async fn renewal_outside_the_lease_range_is_invalid_input<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let (lease, _) = must_claim(&*store, &long(&scope, "a")).await;
    let before = store.get(&scope).await.unwrap().expect("record");
    for extend in [
        Duration::ZERO,
        idem_core::store::MAX_LEASE + Duration::from_secs(1),
    ] {
        match store.renew(&lease, extend).await {
            Err(idem_core::StoreError::InvalidInput(_)) => {}
            other => panic!("renew by {extend:?}: expected InvalidInput, got {other:?}"),
        }
    }
    let after = store.get(&scope).await.unwrap().expect("record");
    assert_eq!(before, after, "a refused renewal changed the record");
}

/// After a renewal the record is retained until the later of its old
/// retention and the new lease's expiry: a renewal never shortens
/// retention, and a renewed lease never outlives its record.
pub async fn renewal_keeps_the_later_of_retention_and_the_new_lease<
    S: IdempotencyStore + ?Sized,
>(
    store: Arc<S>,
) {
    // A long retention: a short renewal must not shorten it.
    let scope = fresh_scope();
    let (lease, _) = must_claim(&*store, &long(&scope, "a")).await;
    let before = store.get(&scope).await.unwrap().expect("record");
    let renewed = store
        .renew(&lease, Duration::from_millis(500))
        .await
        .unwrap();
    let after = store.get(&scope).await.unwrap().expect("record");
    assert_eq!(
        after.retained_until(),
        before.retained_until().max(renewed.expires_at()),
        "a short renewal changed a long retention"
    );
    // A short retention: a long renewal stretches it to the new lease. The
    // lease outlives a loaded machine's claim, read and renewal.
    let scope = fresh_scope();
    let request = crate::support::request(&scope, "a", Duration::from_secs(2))
        .with_retention(Duration::from_secs(1))
        .unwrap();
    let (lease, _) = must_claim(&*store, &request).await;
    let before = store.get(&scope).await.unwrap().expect("record");
    let renewed = store.renew(&lease, Duration::from_secs(5)).await.unwrap();
    let after = store.get(&scope).await.unwrap().expect("record");
    assert_eq!(
        after.retained_until(),
        before.retained_until().max(renewed.expires_at())
    );
    // Past the old retention the renewed claim still holds the key.
    wait_for_the_store_clock(&*store, &scope, before.retained_until()).await;
    assert!(
        matches!(
            claim(&*store, &request).await,
            ClaimOutcome::InProgress { .. }
        ),
        "the record ended before its renewed lease"
    );
}

/// A checkpoint is kept on the record, and a later one replaces it.
pub async fn checkpoint_is_kept_on_the_record<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let scope = fresh_scope();
    let (lease, _) = must_claim(&*store, &long(&scope, "a")).await;
    let first = Checkpoint::new("step-1", &serde_json_value()).unwrap();
    store.checkpoint(&lease, &first).await.unwrap();
    assert_eq!(
        store.get(&scope).await.unwrap().unwrap().checkpoint(),
        Some(&first)
    );
    let second = Checkpoint::new("step-2", &[1, 2, 3]).unwrap();
    store.checkpoint(&lease, &second).await.unwrap();
    assert_eq!(
        store.get(&scope).await.unwrap().unwrap().checkpoint(),
        Some(&second)
    );
}

/// A completed record takes no checkpoint: `LostLease`, and the replay is unchanged.
pub async fn checkpoint_after_completion_is_a_lost_lease<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let request = long(&scope, "a");
    let lease = claim_and_complete(&*store, &request, &response("done")).await;
    let point = Checkpoint::new("late", &1).unwrap();
    assert_lost(
        "checkpoint after completion",
        store.checkpoint(&lease, &point).await,
    );
    let record = store.get(&scope).await.unwrap().expect("record");
    assert_eq!(record.checkpoint(), None);
    assert_eq!(
        claim(&*store, &request).await,
        ClaimOutcome::Completed(response("done"))
    );
}

/// A completed record has no checkpoint: the recovery point belongs to
/// in-flight work, and completion drops it.
pub async fn completion_drops_the_checkpoint<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let scope = fresh_scope();
    let (lease, _) = must_claim(&*store, &long(&scope, "a")).await;
    let point = Checkpoint::new("charged", &"ch_3").unwrap();
    store.checkpoint(&lease, &point).await.unwrap();
    store.complete(&lease, &response("done")).await.unwrap();
    let record = store.get(&scope).await.unwrap().expect("record");
    assert_eq!(record.response(), Some(&response("done")));
    assert_eq!(
        record.checkpoint(),
        None,
        "a completed record kept its checkpoint"
    );
}

/// A record past its retention is owned by nobody: every fenced write on it
/// is `LostLease` (a release finds nothing left to release) and none brings
/// it back.
pub async fn fenced_writes_past_retention_are_lost_leases<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let (lease, _) = must_claim(&*store, &brief(short(&scope, "a"))).await;
    wait_until_absent(&*store, &scope).await;
    let point = Checkpoint::new("late", &1).unwrap();
    assert_lost(
        "checkpoint past retention",
        store.checkpoint(&lease, &point).await,
    );
    assert_lost(
        "renew past retention",
        store.renew(&lease, LONG_LEASE).await,
    );
    // Nobody holds a record past retention: a release finds it released.
    store.release(&lease).await.unwrap();
    assert_lost(
        "complete past retention",
        store.complete(&lease, &response("late")).await,
    );
    assert_eq!(
        store.get(&scope).await.unwrap(),
        None,
        "a late write revived the record"
    );
}

/// `get` shows the record in flight and then completed, with what the claim wrote.
pub async fn get_shows_in_flight_and_completed_records<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let request = long(&scope, "a");
    assert_eq!(store.get(&scope).await.unwrap(), None);
    let (lease, _) = must_claim(&*store, &request).await;
    let record = store.get(&scope).await.unwrap().expect("in-flight record");
    assert_eq!(record.scope(), &scope);
    assert_eq!(record.fingerprint(), request.fingerprint());
    assert_eq!(record.attempt(), 1);
    match record.state() {
        RecordState::InFlight { lease_expires_at } => {
            assert_eq!(*lease_expires_at, lease.expires_at());
        }
        other => panic!("expected in flight, got {other:?}"),
    }
    assert!(record.retained_until() >= lease.expires_at());
    store.complete(&lease, &response("done")).await.unwrap();
    let record = store.get(&scope).await.unwrap().expect("completed record");
    assert_eq!(record.response(), Some(&response("done")));
    assert_eq!(record.fingerprint(), request.fingerprint());
}

// ---- Delivered twice -----------------------------------------------------

/// The same claim delivered twice (a driver's resend after a lost reply, a
/// caller's retry after `Unavailable`) is one claim: the second delivery gets
/// the lease the first made, and another caller is still refused.
pub async fn claim_delivered_twice_gets_the_same_lease<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let request = long(&scope, "a");
    let first = store.claim(&request).await.unwrap();
    let again = store.claim(&request).await.unwrap();
    let (ClaimOutcome::Claimed { lease: first, .. }, ClaimOutcome::Claimed { lease: again, .. }) =
        (first, again)
    else {
        panic!("a claim delivered twice was not answered as claimed both times");
    };
    assert_eq!(again.owner(), first.owner());
    assert_eq!(again.attempt(), first.attempt());
    assert_eq!(again.expires_at(), first.expires_at());
    assert!(matches!(
        claim(&*store, &request).await,
        ClaimOutcome::InProgress { .. }
    ));
    store.complete(&again, &response("once")).await.unwrap();
}

/// A claim delivered again later, not in the same millisecond, writes
/// nothing: it answers the lease the first delivery made, and neither the
/// lease's expiry nor the record's retention moves.
pub async fn claim_delivered_again_later_writes_nothing<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let request = long(&scope, "a");
    let ClaimOutcome::Claimed { lease: first, .. } = store.claim(&request).await.unwrap() else {
        panic!("the first delivery of a claim was not claimed");
    };
    let before = store.get(&scope).await.unwrap().expect("claimed record");
    // Far enough apart that a store restarting the lease would move it.
    let_the_store_clock_pass(&*store, &scope, Duration::from_millis(20)).await;
    let ClaimOutcome::Claimed { lease: again, .. } = store.claim(&request).await.unwrap() else {
        panic!("a claim delivered again was not answered as claimed");
    };
    assert_eq!(
        again.expires_at(),
        first.expires_at(),
        "a claim delivered again moved the lease's expiry"
    );
    assert_eq!(again.attempt(), first.attempt());
    let after = store.get(&scope).await.unwrap().expect("claimed record");
    assert_eq!(after, before, "a claim delivered again wrote the record");
}

/// The owner's own claim delivered again after its lease expired, with
/// nobody having taken over, is still its own claim: the same attempt and
/// the lease it holds, not a takeover.
pub async fn own_claim_delivered_after_its_lease_expired_is_not_a_takeover<
    S: IdempotencyStore + ?Sized,
>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let request = short(&scope, "a");
    let ClaimOutcome::Claimed { lease: first, .. } = store.claim(&request).await.unwrap() else {
        panic!("the first delivery of a claim was not claimed");
    };
    wait_for_the_store_clock(&*store, &scope, first.expires_at()).await;
    match store.claim(&request).await.unwrap() {
        ClaimOutcome::Claimed { lease, .. } => {
            assert_eq!(lease.owner(), request.owner());
            assert_eq!(lease.attempt(), 1, "its own claim was taken as a takeover");
            assert_eq!(lease.expires_at(), first.expires_at());
        }
        other => panic!("the owner's claim delivered after its lease expired got {other:?}"),
    }
    let record = store.get(&scope).await.unwrap().expect("record");
    assert_eq!((record.owner(), record.attempt()), (request.owner(), 1));
    assert_eq!(record.lease_expires_at(), Some(first.expires_at()));
    let (next, _) = must_claim(&*store, &request).await;
    assert_eq!(next.attempt(), 2, "another caller's claim is the takeover");
}

/// The owner's claim delivered again answers the lease as the record holds
/// it now, not as the first claim was answered: after a renewal, its
/// moved expiry; after a checkpoint, that checkpoint.
pub async fn own_claim_delivered_again_answers_the_lease_as_it_stands_now<
    S: IdempotencyStore + ?Sized,
>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let request = long(&scope, "a");
    let ClaimOutcome::Claimed { lease: first, .. } = store.claim(&request).await.unwrap() else {
        panic!("the first delivery of a claim was not claimed");
    };
    let renewed = store.renew(&first, LONG_LEASE * 2).await.unwrap();
    assert_ne!(renewed.expires_at(), first.expires_at());
    let point = Checkpoint::new("charged", &"ch_1").unwrap();
    store.checkpoint(&renewed, &point).await.unwrap();
    match store.claim(&request).await.unwrap() {
        ClaimOutcome::Claimed { lease, checkpoint } => {
            assert_eq!(lease.owner(), first.owner());
            assert_eq!(lease.attempt(), 1);
            assert_eq!(
                lease.expires_at(),
                renewed.expires_at(),
                "answered with the first claim's expiry, not the renewed one"
            );
            assert_eq!(
                checkpoint.as_ref(),
                Some(&point),
                "answered without its checkpoint"
            );
        }
        other => panic!("the owner's claim delivered again got {other:?}"),
    }
}

/// The owner's claim delivered after its lease expired, nobody having taken
/// over, writes nothing: the checkpoint the owner wrote survives it on the
/// record.
pub async fn own_claim_delivered_after_its_lease_expired_keeps_the_checkpoint<
    S: IdempotencyStore + ?Sized,
>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let request = short(&scope, "a");
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&request).await.unwrap() else {
        panic!("the first delivery of a claim was not claimed");
    };
    let point = Checkpoint::new("charged", &"ch_2").unwrap();
    store.checkpoint(&lease, &point).await.unwrap();
    let before = store.get(&scope).await.unwrap().expect("record");
    wait_for_the_store_clock(&*store, &scope, lease.expires_at()).await;
    let again = store.claim(&request).await.unwrap();
    assert!(
        matches!(&again, ClaimOutcome::Claimed { lease, .. } if lease.attempt() == 1),
        "the owner's claim delivered after its lease expired got {again:?}"
    );
    let after = store.get(&scope).await.unwrap().expect("record");
    assert_eq!(after.checkpoint(), Some(&point), "the checkpoint was lost");
    assert_eq!(
        after, before,
        "the owner's claim delivered again wrote the record"
    );
}

/// A takeover delivered twice is one takeover: the same attempt and the
/// checkpoint it carried.
pub async fn takeover_delivered_twice_gets_the_same_attempt_and_checkpoint<
    S: IdempotencyStore + ?Sized,
>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let (old, _) = must_claim(&*store, &short(&scope, "a")).await;
    let point = Checkpoint::new("charged", &"ch_7").unwrap();
    store.checkpoint(&old, &point).await.unwrap();
    outlive(SHORT_LEASE).await;
    let takeover = long(&scope, "a");
    let outcomes = [
        store.claim(&takeover).await.unwrap(),
        store.claim(&takeover).await.unwrap(),
    ];
    for outcome in outcomes {
        match outcome {
            ClaimOutcome::Claimed { lease, checkpoint } => {
                assert_eq!(lease.owner(), takeover.owner());
                assert_eq!(lease.attempt(), 2);
                assert_eq!(checkpoint.as_ref(), Some(&point));
            }
            other => panic!("a takeover delivered twice got {other:?}"),
        }
    }
}

/// A completion delivered twice succeeds both times and stores once; a
/// different response under the same lease is not the same completion.
pub async fn completion_delivered_twice_succeeds_and_stores_once<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let request = long(&scope, "a");
    let lease = claim_and_complete(&*store, &request, &response("done")).await;
    store
        .complete(&lease, &response("done"))
        .await
        .expect("a completion delivered again answers as the first did");
    assert_lost(
        "another response under the same lease",
        store.complete(&lease, &response("other")).await,
    );
    assert_eq!(
        claim(&*store, &request).await,
        ClaimOutcome::Completed(response("done"))
    );
}

/// A completion delivered again does not restart the retention: the
/// record stays retained until the moment the first completion set.
pub async fn completion_delivered_twice_keeps_the_first_retention<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let request = long(&scope, "a");
    let lease = claim_and_complete(&*store, &request, &response("done")).await;
    let first = store.get(&scope).await.unwrap().expect("record");
    // Far enough apart that a store restarting the retention would move it.
    let_the_store_clock_pass(&*store, &scope, Duration::from_millis(20)).await;
    store.complete(&lease, &response("done")).await.unwrap();
    let again = store.get(&scope).await.unwrap().expect("record");
    assert_eq!(
        again.retained_until(),
        first.retained_until(),
        "a completion delivered again restarted the retention"
    );
}

/// Renewals and checkpoints delivered twice succeed both times.
pub async fn renewal_and_checkpoint_delivered_twice_succeed<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let (lease, _) = must_claim(&*store, &long(&scope, "a")).await;
    let point = Checkpoint::new("step", &1).unwrap();
    for _ in 0..2 {
        store.renew(&lease, LONG_LEASE).await.unwrap();
        store.checkpoint(&lease, &point).await.unwrap();
    }
    let record = store.get(&scope).await.unwrap().expect("record");
    assert_eq!(record.checkpoint(), Some(&point));
    store.complete(&lease, &response("done")).await.unwrap();
}

/// A renewal and a checkpoint delivered again after the lease's expiry moved
/// simply apply again: the lease they name fences by its owner, not by the
/// expiry it had, and the renewal counts from now once more.
pub async fn renewal_and_checkpoint_delivered_after_the_expiry_moved_apply_again<
    S: IdempotencyStore + ?Sized,
>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let (lease, _) = must_claim(&*store, &long(&scope, "a")).await;
    // Half the lease: the expiry certainly moves from the one `lease` names.
    let extend = LONG_LEASE / 2;
    let first = store.renew(&lease, extend).await.unwrap();
    assert_ne!(first.expires_at(), lease.expires_at());
    let_the_store_clock_pass(&*store, &scope, Duration::from_millis(20)).await;
    let again = store
        .renew(&lease, extend)
        .await
        .expect("a renewal delivered again after the expiry moved");
    assert!(
        again.expires_at() > first.expires_at(),
        "a renewal delivered again did not count from now: {:?}, then {:?}",
        first.expires_at(),
        again.expires_at()
    );
    let point = Checkpoint::new("step", &1).unwrap();
    for _ in 0..2 {
        store
            .checkpoint(&lease, &point)
            .await
            .expect("a checkpoint naming the lease before its expiry moved");
    }
    let record = store.get(&scope).await.unwrap().expect("record");
    assert_eq!(record.lease_expires_at(), Some(again.expires_at()));
    assert_eq!(record.checkpoint(), Some(&point));
}

/// A release delivered twice succeeds both times; once another owner holds
/// the key, the old lease's release is `LostLease` and changes nothing.
pub async fn release_delivered_twice_succeeds<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let scope = fresh_scope();
    let (lease, _) = must_claim(&*store, &long(&scope, "a")).await;
    store.release(&lease).await.unwrap();
    store
        .release(&lease)
        .await
        .expect("a release delivered again answers as the first did");
    let (next, _) = must_claim(&*store, &long(&scope, "a")).await;
    assert_lost("release by a former owner", store.release(&lease).await);
    let record = store.get(&scope).await.unwrap().expect("record");
    assert_eq!(record.owner(), next.owner());
}

// ---- Retention -----------------------------------------------------------

/// A completed record past retention counts as absent.
pub async fn completed_record_past_retention_counts_as_absent<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let request = brief(long(&scope, "a"));
    claim_and_complete(&*store, &request, &response("x")).await;
    wait_until_absent(&*store, &scope).await;
    assert!(matches!(
        claim(&*store, &request).await,
        ClaimOutcome::Claimed { .. }
    ));
}

/// `purge_expired` deletes nothing that is still live, and what is past
/// retention stays absent after it.
pub async fn purge_expired_removes_only_what_is_past_retention<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let tenant = fresh_tenant();
    let at = |k: &str| Scope::new(tenant.clone(), key(k));
    let live_done = at("live-completed");
    let live_flight = at("live-in-flight");
    claim_and_complete(&*store, &long(&live_done, "a"), &response("keep")).await;
    must_claim(&*store, &long(&live_flight, "a")).await;
    let old: Vec<Scope> = (0..3).map(|i| at(&format!("old-{i}"))).collect();
    for scope in &old {
        claim_and_complete(&*store, &brief(long(scope, "a")), &response("old")).await;
    }
    let old_flight = at("old-in-flight");
    must_claim(&*store, &brief(short(&old_flight, "a"))).await;
    for scope in old.iter().chain([&old_flight]) {
        wait_until_absent(&*store, scope).await;
    }
    store.purge_expired().await.unwrap();
    for scope in old.iter().chain([&old_flight]) {
        assert_eq!(store.get(scope).await.unwrap(), None);
    }
    let kept = store
        .get(&live_done)
        .await
        .unwrap()
        .expect("purge deleted a live completed record");
    assert_eq!(kept.response(), Some(&response("keep")));
    let kept = store
        .get(&live_flight)
        .await
        .unwrap()
        .expect("purge deleted a live claim");
    assert!(kept.is_in_flight());
}

/// Completion retains the record for the retention again, counted from the
/// completion: a record completed late in its claim's retention is kept
/// past the moment the claim's retention would have ended.
pub async fn completion_restarts_retention<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let retention = Duration::from_secs(5);
    let scope = fresh_scope();
    let request = short(&scope, "a").with_retention(retention).unwrap();
    let (lease, _) = must_claim(&*store, &request).await;
    let claimed = store.get(&scope).await.unwrap().expect("record");
    // Well into the claim's retention, by the store's clock.
    let late = claimed.retained_until() - (retention - Duration::from_secs(1));
    wait_for_the_store_clock(&*store, &scope, late).await;
    let before = store.now(&scope).await.unwrap();
    store.complete(&lease, &response("late")).await.unwrap();
    let after = store.now(&scope).await.unwrap();
    let record = store.get(&scope).await.unwrap().expect("record");
    assert_retained_from(
        "a record completed late",
        &record,
        (before, after),
        retention,
    );
    assert!(
        record.retained_until() > claimed.retained_until(),
        "a record completed late kept its claim's retention"
    );
}

/// Completion retains the record for the retention from the moment of
/// completion, and for no longer: not the later of that and the claim's
/// retention, which a lease longer than the retention stretched.
pub async fn completion_retains_for_the_retention_from_completion_alone<
    S: IdempotencyStore + ?Sized,
>(
    store: Arc<S>,
) {
    let retention = Duration::from_secs(10);
    let scope = fresh_scope();
    // The lease outlasts the retention: the claim retains for the lease.
    let request = long(&scope, "a").with_retention(retention).unwrap();
    let (lease, _) = must_claim(&*store, &request).await;
    let before = store.now(&scope).await.unwrap();
    store.complete(&lease, &response("done")).await.unwrap();
    let after = store.now(&scope).await.unwrap();
    let record = store.get(&scope).await.unwrap().expect("record");
    assert_retained_from("the completed record", &record, (before, after), retention);
}

/// A claim retains the record for its retention, or for its lease where
/// that is longer; a takeover is a claim, its retention counted from the
/// takeover, not from the claim it took over.
pub async fn claims_and_takeovers_retain_the_record_from_their_own_moment<
    S: IdempotencyStore + ?Sized,
>(
    store: Arc<S>,
) {
    async fn claimed<S: IdempotencyStore + ?Sized>(
        store: &S,
        request: &ClaimRequest,
    ) -> (Lease, (Timestamp, Timestamp)) {
        let before = store.now(request.scope()).await.unwrap();
        let (lease, _) = must_claim(store, request).await;
        let after = store.now(request.scope()).await.unwrap();
        (lease, (before, after))
    }
    let retention = Duration::from_secs(30);
    // The retention outlasts the lease.
    let scope = fresh_scope();
    let request = short(&scope, "a").with_retention(retention).unwrap();
    let (first, around) = claimed(&*store, &request).await;
    let record = store.get(&scope).await.unwrap().expect("record");
    assert_retained_from("a claim", &record, around, retention);
    // The lease outlasts the retention.
    let longer = fresh_scope();
    let request_longer = long(&longer, "a")
        .with_retention(Duration::from_secs(10))
        .unwrap();
    let (_, around) = claimed(&*store, &request_longer).await;
    let record = store.get(&longer).await.unwrap().expect("record");
    assert_retained_from("a claim with a longer lease", &record, around, LONG_LEASE);
    // A takeover, at least the short lease after the first claim.
    wait_for_the_store_clock(&*store, &scope, first.expires_at()).await;
    let (taken, around) = claimed(&*store, &request).await;
    assert_eq!(taken.attempt(), 2);
    let record = store.get(&scope).await.unwrap().expect("record");
    assert_retained_from("a takeover", &record, around, retention);
}

/// A takeover whose lease is longer than the retention retains the record
/// for its lease from the takeover, as a claim does, so its record never
/// ends before its lease.
pub async fn a_takeover_retains_for_its_lease_where_longer_than_the_retention<
    S: IdempotencyStore + ?Sized,
>(
    store: Arc<S>,
) {
    let retention = Duration::from_secs(10);
    let scope = fresh_scope();
    let first = short(&scope, "a").with_retention(retention).unwrap();
    let (lease, _) = must_claim(&*store, &first).await;
    wait_for_the_store_clock(&*store, &scope, lease.expires_at()).await;
    // LONG_LEASE outlasts the retention.
    let takeover = long(&scope, "a").with_retention(retention).unwrap();
    let before = store.now(&scope).await.unwrap();
    let (taken, _) = must_claim(&*store, &takeover).await;
    let after = store.now(&scope).await.unwrap();
    assert_eq!(taken.attempt(), 2);
    let record = store.get(&scope).await.unwrap().expect("record");
    assert_retained_from(
        "a takeover with a longer lease",
        &record,
        (before, after),
        LONG_LEASE,
    );
}

/// A sweep keeps a record within retention even when its lease expired: its
/// attempt count and checkpoint belong to the owner that takes it over.
pub async fn purge_keeps_an_in_flight_record_whose_lease_expired<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let request = short(&scope, "a");
    let (lease, _) = must_claim(&*store, &request).await;
    let point = Checkpoint::new("charged", &"ch_1").unwrap();
    store.checkpoint(&lease, &point).await.unwrap();
    outlive(SHORT_LEASE).await;
    store.purge_expired().await.unwrap();
    let record = store
        .get(&scope)
        .await
        .unwrap()
        .expect("purge deleted a record within retention");
    assert!(record.is_in_flight());
    let (taken, carried) = must_claim(&*store, &request).await;
    assert_eq!(taken.attempt(), 2);
    assert_eq!(carried, Some(point));
}

// ---- Isolation -----------------------------------------------------------

/// One key in two tenants is two records.
pub async fn tenants_never_share_a_record<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let a = Scope::new(fresh_tenant(), key("shared-key"));
    let b = Scope::new(fresh_tenant(), key("shared-key"));
    claim_and_complete(&*store, &long(&a, "a"), &response("tenant a")).await;
    let (lease, _) = must_claim(&*store, &long(&b, "other payload")).await;
    assert_eq!(lease.attempt(), 1);
    store.complete(&lease, &response("tenant b")).await.unwrap();
    assert_eq!(
        claim(&*store, &long(&a, "a")).await,
        ClaimOutcome::Completed(response("tenant a"))
    );
    assert_eq!(
        claim(&*store, &long(&b, "other payload")).await,
        ClaimOutcome::Completed(response("tenant b"))
    );
}

/// Tenants and keys holding `:`, `{`, `}`, `/` never meet, however the
/// separators line up.
pub async fn separator_laden_scopes_never_collide<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let base = fresh_tenant();
    let b = base.as_str();
    let pairs = [
        (format!("{b}:a"), "b".to_string()),
        (b.to_string(), "a:b".to_string()),
        (format!("{b}:a:b"), "c".to_string()),
        (format!("{b}{{a}}"), "b".to_string()),
        (format!("{b}{{a"), "}b".to_string()),
        (format!("{b}/a"), "b".to_string()),
        (b.to_string(), "a/b".to_string()),
        (format!("{b}:"), ":".to_string()),
        (format!("{b}\\"), ":a".to_string()),
        (format!("{b}%3A"), "a".to_string()),
    ];
    let scopes: Vec<Scope> = pairs
        .iter()
        .map(|(t, k)| Scope::parse(t, k).unwrap())
        .collect();
    for (i, scope) in scopes.iter().enumerate() {
        let (lease, _) = must_claim(&*store, &long(scope, "same")).await;
        assert_eq!(lease.attempt(), 1, "scope {i} met an earlier one");
        store
            .complete(&lease, &response(&format!("scope {i}")))
            .await
            .unwrap();
    }
    for (i, scope) in scopes.iter().enumerate() {
        assert_eq!(
            claim(&*store, &long(scope, "same")).await,
            ClaimOutcome::Completed(response(&format!("scope {i}")))
        );
    }
}

/// Non-ASCII tenants and keys are kept and read back exactly.
pub async fn non_ascii_scopes_round_trip<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let tenant = Tenant::new(format!("mandant-ü-日本-{}", uuid::Uuid::new_v4())).unwrap();
    let scope = Scope::new(tenant, key("ключ-🔑-{ä}/:"));
    let lease = claim_and_complete(&*store, &long(&scope, "a"), &response("ok")).await;
    let record = store.get(&scope).await.unwrap().expect("record");
    assert_eq!(record.scope(), &scope);
    assert_eq!(lease.scope(), &scope);
    let near = Scope::new(scope.tenant().clone(), key("ключ-🔑-{a}/:"));
    assert_eq!(store.get(&near).await.unwrap(), None);
}

// ---- Operating a store ---------------------------------------------------

/// Deleting a completed record removes it: it replays no more, and the next
/// claim is a fresh claim at attempt 1.
pub async fn deleted_completed_record_is_claimed_afresh<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let request = long(&scope, "a");
    claim_and_complete(&*store, &request, &response("old")).await;
    assert!(
        store.delete(&scope).await.unwrap(),
        "deleting a completed record reported nothing deleted"
    );
    assert_eq!(store.get(&scope).await.unwrap(), None);
    let (lease, checkpoint) = must_claim(&*store, &request).await;
    assert_eq!((lease.attempt(), checkpoint), (1, None));
    store.complete(&lease, &response("new")).await.unwrap();
    assert_eq!(
        claim(&*store, &request).await,
        ClaimOutcome::Completed(response("new"))
    );
}

/// Deleting an in-flight record is outside the fencing protocol and fences
/// its owner out: the owner's later complete, renew and checkpoint are
/// `LostLease` (its release succeeds, as nobody holds the record), and the
/// next claim starts afresh at attempt 1 without the old checkpoint.
pub async fn deleted_in_flight_record_fences_out_its_owner<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let request = long(&scope, "a");
    let (old, _) = must_claim(&*store, &request).await;
    let point = Checkpoint::new("charged", &1).unwrap();
    store.checkpoint(&old, &point).await.unwrap();
    assert!(
        store.delete(&scope).await.unwrap(),
        "deleting an in-flight record reported nothing deleted"
    );
    assert_lost(
        "complete after delete",
        store.complete(&old, &response("stale")).await,
    );
    assert_lost("renew after delete", store.renew(&old, LONG_LEASE).await);
    assert_lost(
        "checkpoint after delete",
        store.checkpoint(&old, &point).await,
    );
    store
        .release(&old)
        .await
        .expect("a release of a record nobody holds succeeds");
    assert_eq!(store.get(&scope).await.unwrap(), None);
    let (new, checkpoint) = must_claim(&*store, &request).await;
    assert_eq!((new.attempt(), checkpoint), (1, None));
    assert_lost(
        "the old owner's complete after a new claim",
        store.complete(&old, &response("stale")).await,
    );
    store.complete(&new, &response("new")).await.unwrap();
}

/// `delete` answers whether a live record was there: not for a scope never
/// claimed, nor for one deleted already (a second delivery), nor for a
/// record past retention, which counts as absent.
pub async fn delete_reports_whether_a_live_record_was_there<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    assert!(
        !store.delete(&fresh_scope()).await.unwrap(),
        "never claimed"
    );
    let scope = fresh_scope();
    must_claim(&*store, &long(&scope, "a")).await;
    assert!(store.delete(&scope).await.unwrap(), "a live record");
    assert!(!store.delete(&scope).await.unwrap(), "deleted already");
    let expired = fresh_scope();
    claim_and_complete(&*store, &brief(long(&expired, "a")), &response("old")).await;
    wait_until_absent(&*store, &expired).await;
    assert!(
        !store.delete(&expired).await.unwrap(),
        "a record past retention counts as absent"
    );
}

/// `delete` removes one scope: the same key in another tenant, another key
/// in the same tenant and a key that extends the deleted one (`key-1`,
/// `key-10`) still replay.
pub async fn delete_leaves_every_other_scope_alone<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let scope = fresh_scope();
    let same_tenant = Scope::new(scope.tenant().clone(), key("key-2"));
    let extending = Scope::new(
        scope.tenant().clone(),
        key(&format!("{}0", scope.key().as_str())),
    );
    let same_key = Scope::new(fresh_tenant(), scope.key().clone());
    let others = [&same_tenant, &extending, &same_key];
    for each in others.iter().chain([&&scope]) {
        claim_and_complete(&*store, &long(each, "a"), &response("kept")).await;
    }
    assert!(store.delete(&scope).await.unwrap());
    for other in others {
        assert!(
            store.get(other).await.unwrap().is_some(),
            "{other:?} deleted"
        );
        assert_eq!(
            claim(&*store, &long(other, "a")).await,
            ClaimOutcome::Completed(response("kept"))
        );
    }
}

/// `delete` matches the key exactly, byte for byte: `Key-1` is not `key-1`.
pub async fn delete_matches_the_key_exactly<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let tenant = fresh_tenant();
    let upper = Scope::new(tenant.clone(), key("Key-1"));
    let lower = Scope::new(tenant, key("key-1"));
    for scope in [&upper, &lower] {
        claim_and_complete(&*store, &long(scope, "a"), &response("kept")).await;
    }
    assert!(store.delete(&upper).await.unwrap());
    assert!(store.get(&upper).await.unwrap().is_none());
    assert_eq!(
        claim(&*store, &long(&lower, "a")).await,
        ClaimOutcome::Completed(response("kept")),
        "deleting Key-1 deleted key-1"
    );
}

/// `now` reads the clock that judges the store's records: a record just
/// completed is retained for its retention from about that reading, and
/// once a record counts as absent the clock reads past its retention.
pub async fn now_reads_the_clock_that_judges_retention<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    claim_and_complete(&*store, &long(&scope, "a"), &response("x")).await;
    let now = store.now(&scope).await.unwrap();
    let record = store.get(&scope).await.unwrap().expect("record");
    let retention = ClaimRequest::DEFAULT_RETENTION;
    let left = record.retained_until().saturating_duration_since(now);
    assert!(
        left <= retention && left + DEADLINE >= retention,
        "a record retained for {retention:?} has {left:?} left by the store's clock"
    );
    let brief_scope = fresh_scope();
    let before = store.now(&brief_scope).await.unwrap();
    claim_and_complete(&*store, &brief(long(&brief_scope, "a")), &response("x")).await;
    wait_until_absent(&*store, &brief_scope).await;
    let after = store.now(&brief_scope).await.unwrap();
    assert!(
        after >= before + SHORT_RETENTION,
        "the record counted as absent at {after:?}, before its retention from {before:?}"
    );
}

/// `Capabilities::store` is one short lowercase word, fit for a metric
/// label: ASCII lowercase letters and digits, starting with a letter, at
/// most 16 bytes.
pub async fn store_name_is_one_short_lowercase_word<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let name = store.capabilities().store;
    assert!(
        name.len() <= 16
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
        "the store's name {name:?} is not one short lowercase word"
    );
}

// ---- Concurrency ---------------------------------------------------------

/// 64 concurrent claims of one fresh key: exactly one is claimed, the rest
/// are in progress.
pub async fn concurrent_claims_of_one_key_have_one_winner<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    // Round after round on fresh keys, for a bounded time: a check-then-insert
    // loses a race only now and then, so one round would catch it by luck.
    let tenant = fresh_tenant();
    let until = tokio::time::Instant::now() + RACE_TIME;
    let mut round = 0;
    while round < MIN_RACE_ROUNDS || tokio::time::Instant::now() < until {
        let request = long(
            &Scope::new(tenant.clone(), key(&format!("race-{round}"))),
            "a",
        );
        let outcomes = concurrently(&store, RACERS, |store| {
            let request = request.clone().with_new_owner();
            async move { store.claim(&request).await }
        })
        .await;
        let claimed = outcomes
            .iter()
            .filter(|o| matches!(o, Ok(ClaimOutcome::Claimed { .. })))
            .count();
        let waiting = outcomes
            .iter()
            .filter(|o| matches!(o, Ok(ClaimOutcome::InProgress { .. })))
            .count();
        assert_eq!(
            claimed, 1,
            "round {round}: winners among {RACERS} racing claims: {outcomes:?}"
        );
        assert_eq!(waiting, RACERS - 1, "round {round}: outcomes: {outcomes:?}");
        round += 1;
    }
}

/// Concurrent takeovers of one expired lease: exactly one wins, the rest
/// are in progress.
pub async fn concurrent_takeovers_of_an_expired_lease_have_one_winner<
    S: IdempotencyStore + ?Sized,
>(
    store: Arc<S>,
) {
    // A round per key, as for fresh claims: a takeover that checks and then
    // writes loses the race only now and then. Every key's lease runs out
    // at once, so the rounds cost one wait.
    let tenant = fresh_tenant();
    let mut expired = Vec::new();
    for round in 0..MIN_RACE_ROUNDS {
        let scope = Scope::new(tenant.clone(), key(&format!("takeover-{round}")));
        let (lease, _) = must_claim(&*store, &short(&scope, "a")).await;
        expired.push((scope, lease));
    }
    for (scope, lease) in &expired {
        wait_for_the_store_clock(&*store, scope, lease.expires_at()).await;
    }
    for (round, (scope, _)) in expired.iter().enumerate() {
        let takeover = long(scope, "a");
        let outcomes = concurrently(&store, RACERS, |store| {
            let request = takeover.clone().with_new_owner();
            async move { store.claim(&request).await }
        })
        .await;
        let winners: Vec<u32> = outcomes
            .iter()
            .filter_map(|o| match o {
                Ok(ClaimOutcome::Claimed { lease, .. }) => Some(lease.attempt()),
                _ => None,
            })
            .collect();
        assert_eq!(winners, vec![2], "round {round}: takeovers: {outcomes:?}");
        assert!(
            outcomes.iter().all(|o| matches!(
                o,
                Ok(ClaimOutcome::Claimed { .. } | ClaimOutcome::InProgress { .. })
            )),
            "round {round}: {outcomes:?}"
        );
    }
}

/// Racing claims of a key whose record is past its retention, though still
/// stored (a lazy server's), have one winner: the record counts as absent,
/// and the claim that replaces it is as atomic as a fresh one.
pub async fn concurrent_claims_of_a_record_past_retention_have_one_winner<
    S: IdempotencyStore + ?Sized,
>(
    store: Arc<S>,
) {
    let tenant = fresh_tenant();
    let mut scopes = Vec::new();
    for round in 0..MIN_RACE_ROUNDS {
        let scope = Scope::new(tenant.clone(), key(&format!("expired-{round}")));
        claim_and_complete(&*store, &brief(long(&scope, "a")), &response("old")).await;
        scopes.push(scope);
    }
    for scope in &scopes {
        wait_until_absent(&*store, scope).await;
    }
    for (round, scope) in scopes.iter().enumerate() {
        let request = long(scope, "a");
        let outcomes = concurrently(&store, RACERS, |store| {
            let request = request.clone().with_new_owner();
            async move { store.claim(&request).await }
        })
        .await;
        let winners = outcomes
            .iter()
            .filter(|o| matches!(o, Ok(ClaimOutcome::Claimed { .. })))
            .count();
        assert_eq!(winners, 1, "round {round}: {outcomes:?}");
        assert!(
            outcomes.iter().all(|o| matches!(
                o,
                Ok(ClaimOutcome::Claimed { .. } | ClaimOutcome::InProgress { .. })
            )),
            "round {round}: {outcomes:?}"
        );
    }
}

/// A completion racing a takeover of its expired lease never overwrites
/// the new owner's record: the fence check and the write are one step, so
/// either the completion lands first (the takeover then replays it) or the
/// takeover does (the completion is then `LostLease`), never both.
pub async fn a_completion_racing_a_takeover_never_overwrites_the_new_owner<
    S: IdempotencyStore + ?Sized,
>(
    store: Arc<S>,
) {
    let tenant = fresh_tenant();
    let mut expired = Vec::new();
    for round in 0..MIN_RACE_ROUNDS {
        let scope = Scope::new(tenant.clone(), key(&format!("racing-{round}")));
        let (lease, _) = must_claim(&*store, &short(&scope, "a")).await;
        expired.push((scope, lease));
    }
    for (scope, lease) in &expired {
        wait_for_the_store_clock(&*store, scope, lease.expires_at()).await;
    }
    for (round, (scope, lease)) in expired.into_iter().enumerate() {
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let completing = tokio::spawn({
            let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
            async move {
                barrier.wait().await;
                store.complete(&lease, &response("stale")).await
            }
        });
        let taking_over = tokio::spawn({
            let (store, barrier, scope) = (Arc::clone(&store), Arc::clone(&barrier), scope.clone());
            async move {
                barrier.wait().await;
                store.claim(&long(&scope, "a")).await
            }
        });
        let completed = completing.await.expect("completion");
        let taken = taking_over.await.expect("takeover").expect("claim");
        match (&completed, &taken) {
            (Err(StoreError::LostLease), ClaimOutcome::Claimed { lease, .. }) => {
                let record = store.get(&scope).await.unwrap().expect("record");
                assert!(record.is_in_flight(), "round {round}: {record:?}");
                assert_eq!(record.owner(), lease.owner(), "round {round}");
            }
            (Ok(()), ClaimOutcome::Completed(replayed)) => {
                assert_eq!(replayed, &response("stale"), "round {round}");
            }
            other => panic!("round {round}: the completion and the takeover both won: {other:?}"),
        }
    }
}

/// Concurrent retries of a completed key all replay the same response.
pub async fn concurrent_retries_of_a_completed_key_all_replay<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let request = long(&scope, "a");
    claim_and_complete(&*store, &request, &response("once")).await;
    let outcomes = concurrently(&store, 16, |store| {
        let request = request.clone().with_new_owner();
        async move { store.claim(&request).await }
    })
    .await;
    for outcome in outcomes {
        assert_eq!(outcome.unwrap(), ClaimOutcome::Completed(response("once")));
    }
}

// ---- Responses -----------------------------------------------------------

/// Binary bodies and header values, duplicate and mixed-case header names,
/// and any status come back byte for byte.
pub async fn replay_is_byte_exact_for_binary_bodies_and_headers<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let scope = fresh_scope();
    let request = long(&scope, "a");
    let body: Vec<u8> = (0..=255u8).chain([0, 0xff, 0xc3, 0x28, 0x00]).collect();
    let stored = StoredResponse::new(299, body)
        .with_header("Content-Type", "application/octet-stream")
        .with_header("set-cookie", "a=1")
        .with_header("Set-Cookie", "b=2")
        .with_header("x-binary", vec![0u8, 1, 0xfe, 0xff, b'\r', b'\n'])
        .with_header("x-empty", Vec::new());
    claim_and_complete(&*store, &request, &stored).await;
    match claim(&*store, &request).await {
        ClaimOutcome::Completed(replayed) => {
            assert_eq!(replayed.status(), 299);
            assert_eq!(replayed.headers(), stored.headers());
            assert_eq!(replayed.body(), stored.body());
        }
        other => panic!("expected a replay, got {other:?}"),
    }
}

/// An empty body and no headers replay as such.
pub async fn empty_response_round_trips<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let scope = fresh_scope();
    let request = long(&scope, "a");
    let empty = StoredResponse::new(204, Vec::new());
    claim_and_complete(&*store, &request, &empty).await;
    assert_eq!(
        claim(&*store, &request).await,
        ClaimOutcome::Completed(empty)
    );
}

fn sized_response(size: usize) -> StoredResponse {
    let header = ("x-size", size.to_string());
    let overhead = header.0.len() + header.1.len();
    let body: Vec<u8> = (0..size.saturating_sub(overhead))
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    let response = StoredResponse::new(200, body).with_header(header.0, header.1);
    assert_eq!(response.size(), size);
    response
}

/// A response of exactly the advertised maximum is stored whole.
pub async fn response_at_the_advertised_maximum_is_stored_whole<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    // An unlimited store (usize::MAX) is held to a size every store can test.
    let max = store
        .capabilities()
        .max_response_bytes
        .min(UNLIMITED_STAND_IN);
    let scope = fresh_scope();
    let request = long(&scope, "a");
    let big = sized_response(max);
    claim_and_complete(&*store, &request, &big).await;
    match claim(&*store, &request).await {
        ClaimOutcome::Completed(replayed) => assert!(replayed == big, "large response changed"),
        other => panic!(
            "expected a replay, got {:?}",
            std::mem::discriminant(&other)
        ),
    }
}

/// One byte over the maximum is refused with `TooLarge`, and nothing is
/// written: the lease still holds and can complete with a smaller response.
pub async fn response_over_the_maximum_is_refused_and_nothing_written<
    S: IdempotencyStore + ?Sized,
>(
    store: Arc<S>,
) {
    let max = store.capabilities().max_response_bytes;
    let scope = fresh_scope();
    let request = long(&scope, "a");
    let (lease, _) = must_claim(&*store, &request).await;
    if max == usize::MAX {
        // No limit: a response past the stand-in size is stored, not refused.
        let big = sized_response(UNLIMITED_STAND_IN + 1);
        store.complete(&lease, &big).await.unwrap();
        assert!(claim(&*store, &request).await == ClaimOutcome::Completed(big));
        return;
    }
    match store.complete(&lease, &sized_response(max + 1)).await {
        Err(idem_core::StoreError::TooLarge { size, max: limit }) => {
            assert_eq!(size, max + 1);
            assert_eq!(limit, max);
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(
        store
            .get(&scope)
            .await
            .unwrap()
            .expect("record")
            .is_in_flight()
    );
    store.complete(&lease, &response("small")).await.unwrap();
    assert_eq!(
        claim(&*store, &request).await,
        ClaimOutcome::Completed(response("small"))
    );
}

// ---- The runner ----------------------------------------------------------

type Outcome = Result<RunOutcome, RunError>;

fn ok(text: &str) -> Result<StoredResponse, HandlerError> {
    Ok(response(text))
}

/// Runs `handler` through the runner until the previous attempt's lease has
/// run out and the run takes the key over.
async fn run_once_the_lease_expires<S, F, Fut>(
    idem: &Idempotency<S>,
    scope: &Scope,
    fp: idem_core::Fingerprint,
    handler: F,
) -> Outcome
where
    S: IdempotencyStore + ?Sized,
    F: Fn(RunContext<S>) -> Fut,
    Fut: std::future::Future<Output = Result<StoredResponse, HandlerError>>,
{
    eventually("takeover after the lease expires", || async {
        match idem.run(scope.clone(), fp, &handler).await {
            Err(RunError::InProgress { .. }) => None,
            other => Some(other),
        }
    })
    .await
}

/// The runner executes the handler once and replays it to every retry.
pub async fn runner_executes_once_and_replays_retries<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let idem = Idempotency::new(store);
    let scope = fresh_scope();
    let fp = idem_core::Fingerprint::json(r#"{"qty": 1}"#).unwrap();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for expected_replay in [false, true, true] {
        let runs = Arc::clone(&runs);
        let outcome: Outcome = idem
            .run(scope.clone(), fp, |_ctx| async move {
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                ok("made")
            })
            .await;
        let outcome = outcome.unwrap();
        assert_eq!(outcome.is_replay(), expected_replay);
        assert_eq!(outcome.response(), &response("made"));
    }
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A duplicate arriving while the handler runs is refused as in progress.
pub async fn runner_refuses_a_concurrent_duplicate<S: IdempotencyStore + ?Sized>(store: Arc<S>) {
    let idem = Idempotency::new(store);
    let scope = fresh_scope();
    let fp = idem_core::Fingerprint::of_bytes("a");
    let (started_tx, started_rx) = tokio::sync::oneshot::channel::<()>();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let idem = idem.clone();
        let scope = scope.clone();
        tokio::spawn(async move {
            let outcome: Outcome = idem
                .run(scope, fp, |_ctx| async move {
                    let _ = started_tx.send(());
                    let _ = finish_rx.await;
                    ok("first")
                })
                .await;
            outcome
        })
    };
    started_rx.await.unwrap();
    let duplicate: Outcome = idem
        .run(scope.clone(), fp, |_ctx| async { ok("duplicate ran") })
        .await;
    match duplicate {
        Err(ref e @ RunError::InProgress { retry_after }) => {
            assert!(retry_after > Duration::ZERO);
            assert_eq!(e.http_status(), Some(409));
        }
        other => panic!("expected InProgress, got {other:?}"),
    }
    finish_tx.send(()).unwrap();
    assert_eq!(
        first.await.unwrap().unwrap(),
        RunOutcome::Executed(response("first"))
    );
}

/// A key reused with another payload is refused as a mismatch.
pub async fn runner_refuses_a_reused_key_with_another_payload<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let idem = Idempotency::new(store);
    let scope = fresh_scope();
    let first: Outcome = idem
        .run(
            scope.clone(),
            idem_core::Fingerprint::of_bytes("a"),
            |_| async { ok("a") },
        )
        .await;
    first.unwrap();
    let second: Outcome = idem
        .run(scope, idem_core::Fingerprint::of_bytes("b"), |_| async {
            ok("b")
        })
        .await;
    match second {
        Err(e @ RunError::Mismatch) => assert_eq!(e.http_status(), Some(422)),
        other => panic!("expected Mismatch, got {other:?}"),
    }
}

/// A handler that says nothing started releases the claim: the retry runs at once.
pub async fn runner_releases_the_claim_when_nothing_started<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let idem = Idempotency::new(Arc::clone(&store));
    let scope = fresh_scope();
    let fp = idem_core::Fingerprint::of_bytes("a");
    let rejected: Outcome = idem
        .run(scope.clone(), fp, |_| async {
            Err::<StoredResponse, _>(HandlerError::not_started("invalid"))
        })
        .await;
    assert!(
        matches!(rejected, Err(RunError::NotStarted(ref e)) if e.to_string() == "invalid"),
        "{rejected:?}"
    );
    assert_eq!(store.get(&scope).await.unwrap(), None);
    let retry: Outcome = idem.run(scope, fp, |_| async { ok("fixed") }).await;
    assert_eq!(retry.unwrap(), RunOutcome::Executed(response("fixed")));
}

/// A handler that failed after it may have started keeps the claim until its
/// lease expires; the retry after that takes over.
pub async fn runner_keeps_the_claim_when_the_handler_failed<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let idem = Idempotency::new(Arc::clone(&store))
        .with_lease(SHORT_LEASE)
        .unwrap();
    let scope = fresh_scope();
    let fp = idem_core::Fingerprint::of_bytes("a");
    let failed: Outcome = idem
        .run(scope.clone(), fp, |_| async {
            Err::<StoredResponse, _>("boom".into())
        })
        .await;
    assert!(
        matches!(failed, Err(RunError::Failed(ref e)) if e.to_string() == "boom"),
        "{failed:?}"
    );
    assert!(
        store
            .get(&scope)
            .await
            .unwrap()
            .expect("claim kept")
            .is_in_flight()
    );
    let retried = run_once_the_lease_expires(&idem, &scope, fp, |ctx| async move {
        ok(&format!("attempt {}", ctx.attempt()))
    })
    .await;
    assert_eq!(
        retried.unwrap(),
        RunOutcome::Executed(response("attempt 2"))
    );
}

/// When the lease is taken over before completion, the runner reports
/// `LostLease`, never a quiet success, and the new owner's response stands.
/// (Without renewal, which would keep a live handler's lease.)
pub async fn runner_reports_a_lost_lease_instead_of_success<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    let idem = Idempotency::new(Arc::clone(&store))
        .with_lease(SHORT_LEASE)
        .unwrap()
        .without_auto_renew();
    let scope = fresh_scope();
    let fp = idem_core::Fingerprint::of_bytes("a");
    let slow: Outcome = idem
        .run(scope.clone(), fp, |_| {
            let store = Arc::clone(&store);
            let scope = scope.clone();
            async move {
                // While this handler is slow, a retry takes the key over and finishes.
                let takeover = short(&scope, "a");
                let (lease, _) = wait_for_claim(&*store, &takeover).await;
                store
                    .complete(&lease, &response("new owner"))
                    .await
                    .unwrap();
                ok("stale owner")
            }
        })
        .await;
    assert!(matches!(slow, Err(RunError::LostLease)), "{slow:?}");
    assert_eq!(
        claim(&*store, &short(&scope, "a")).await,
        ClaimOutcome::Completed(response("new owner"))
    );
}

/// A takeover's handler sees the next attempt and the previous checkpoint,
/// and downstream keys are identical across attempts.
pub async fn runner_gives_a_takeover_the_checkpoint_and_the_same_downstream_key<
    S: IdempotencyStore + ?Sized,
>(
    store: Arc<S>,
) {
    let idem = Idempotency::new(store).with_lease(SHORT_LEASE).unwrap();
    let scope = fresh_scope();
    let fp = idem_core::Fingerprint::of_bytes("a");
    let first_key = Arc::new(std::sync::Mutex::new(None));
    let seen = Arc::clone(&first_key);
    let failed: Outcome = idem
        .run(scope.clone(), fp, |ctx| async move {
            *seen.lock().unwrap() = Some(ctx.downstream_key("charge"));
            ctx.checkpoint("charged", &"ch_42").await.unwrap();
            Err::<StoredResponse, _>("crashed after charging".into())
        })
        .await;
    assert!(matches!(failed, Err(RunError::Failed(_))));
    let outcome = run_once_the_lease_expires(&idem, &scope, fp, |ctx| {
        let first_key = Arc::clone(&first_key);
        async move {
            assert_eq!(ctx.attempt(), 2);
            let point = ctx.previous_checkpoint().expect("checkpoint carried");
            assert_eq!(point.name(), "charged");
            assert_eq!(point.data(), "ch_42");
            let key = ctx.downstream_key("charge");
            assert_eq!(Some(&key), first_key.lock().unwrap().as_ref());
            assert_ne!(key, ctx.downstream_key("email"));
            ok("resumed")
        }
    })
    .await;
    assert_eq!(outcome.unwrap(), RunOutcome::Executed(response("resumed")));
}

/// Automatic renewal keeps the key held while a handler runs past its lease.
pub async fn runner_auto_renewal_holds_the_key_past_the_lease<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
) {
    // Renewals come every 500 ms: a loaded machine may delay one by up to
    // a second before the key lapses.
    let lease = Duration::from_millis(1_500);
    let idem = Idempotency::new(Arc::clone(&store))
        .with_lease(lease)
        .unwrap()
        .with_max_run_time(Duration::from_secs(30))
        .unwrap();
    let scope = fresh_scope();
    let fp = idem_core::Fingerprint::of_bytes("a");
    let outcome: Outcome = idem
        .run(scope.clone(), fp, |_| {
            let store = Arc::clone(&store);
            let scope = scope.clone();
            async move {
                // Three lease lengths: every duplicate in that time must wait.
                let until = tokio::time::Instant::now() + lease * 3;
                while tokio::time::Instant::now() < until {
                    let duplicate = claim(&*store, &short(&scope, "a")).await;
                    assert!(
                        matches!(duplicate, ClaimOutcome::InProgress { .. }),
                        "lease lapsed under auto-renewal: {duplicate:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                ok("long job")
            }
        })
        .await;
    assert_eq!(outcome.unwrap(), RunOutcome::Executed(response("long job")));
}

// ---- Two instances -------------------------------------------------------

/// `Capabilities::store` is the same for every instance of a store: two
/// built alike report one name, as spans and metrics label them.
pub async fn every_instance_of_a_store_reports_one_name<S: IdempotencyStore + ?Sized>(
    first: Arc<S>,
    second: Arc<S>,
) {
    assert_eq!(
        first.capabilities().store,
        second.capabilities().store,
        "two instances of one store report two names"
    );
}
