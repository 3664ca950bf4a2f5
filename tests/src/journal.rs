//! The journal store's cases: one `pub async fn` per sentence of
//! [`JournalStore`]'s contract, each in a namespace of its own.

use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{
    Acquired, Finish, JournalRecord, JournalStore, ListQuery, MAX_LIST, NewOperation, OperationId,
    OperationKey, OperationState, OwnerToken,
};
use idem_core::{StoreError, Tenant};
use serde_json::json;

use crate::support::{DEADLINE, LONG_LEASE, RACERS, SHORT_LEASE, assert_lost, eventually};

/// A namespace no other case uses.
fn namespace() -> Tenant {
    Tenant::new(format!("journal-{}", uuid::Uuid::new_v4())).expect("valid namespace")
}

fn key_in(namespace: &Tenant, subject: &str) -> OperationKey {
    let id = OperationId::new(subject, "charge").expect("valid id");
    OperationKey::new(namespace.clone(), id)
}

fn fresh_key() -> OperationKey {
    key_in(&namespace(), "order-1")
}

fn new_operation(key: &OperationKey, amount: u64) -> NewOperation {
    NewOperation::new(key.clone(), json!({ "amount": amount, "currency": "EUR" }))
}

async fn recorded<S: JournalStore + ?Sized>(store: &S, key: &OperationKey) -> JournalRecord {
    store
        .record(&new_operation(key, 1000))
        .await
        .expect("record")
}

async fn held<S: JournalStore + ?Sized>(
    store: &S,
    key: &OperationKey,
    owner: OwnerToken,
    lease: Duration,
) -> (JournalRecord, idem_core::store::Timestamp) {
    match store
        .acquire(key.held_by(owner), lease)
        .await
        .expect("acquire")
    {
        Acquired::Held { record, now } => (record, now),
        other => panic!("expected the lease, got {other:?}"),
    }
}

async fn stored<S: JournalStore + ?Sized>(store: &S, key: &OperationKey) -> JournalRecord {
    store
        .get(key)
        .await
        .expect("get")
        .expect("the operation is stored")
}

fn settled(detail: &str) -> Finish {
    Finish::new(OperationState::Succeeded, Some(detail.to_string()))
        .with_provider_id(Some("ch_1".to_string()))
}

/// Record: a new operation is stored pending, never sent, as given.
pub async fn record_stores_a_new_operation_pending_and_unsent<S: JournalStore + ?Sized>(
    store: Arc<S>,
) {
    let key = fresh_key();
    let new = new_operation(&key, 1000);
    let record = store.record(&new).await.expect("record");
    assert_eq!(record.key(), &key);
    assert_eq!(record.request(), new.request());
    assert_eq!(record.provider_key(), new.provider_key());
    assert_eq!(record.state(), OperationState::Pending);
    let parts = record.parts();
    assert_eq!((parts.sends, parts.first_sent_at), (0, None));
    assert_eq!((parts.lease_owner, parts.lease_until), (None, None));
    assert_eq!(stored(&*store, &key).await, record);
}

/// Record: a second record of one key returns the first, unchanged.
pub async fn record_of_an_existing_key_returns_the_first_unchanged<S: JournalStore + ?Sized>(
    store: Arc<S>,
) {
    let key = fresh_key();
    let first = store.record(&new_operation(&key, 1000)).await.unwrap();
    let again = store.record(&new_operation(&key, 2000)).await.unwrap();
    assert_eq!(again, first, "the second record must not replace the first");
    assert_eq!(again.request()["amount"], 1000);
    assert_eq!(
        stored(&*store, &key).await.provider_key(),
        first.provider_key()
    );
}

/// Record: namespaces never meet.
pub async fn namespaces_never_share_an_operation<S: JournalStore + ?Sized>(store: Arc<S>) {
    let (a, b) = (namespace(), namespace());
    let in_a = store
        .record(&new_operation(&key_in(&a, "order-1"), 1))
        .await
        .unwrap();
    let in_b = store
        .record(&new_operation(&key_in(&b, "order-1"), 2))
        .await
        .unwrap();
    assert_ne!(in_a.provider_key(), in_b.provider_key());
    assert_eq!(
        stored(&*store, &key_in(&a, "order-1")).await.request()["amount"],
        1
    );
    assert_eq!(
        stored(&*store, &key_in(&b, "order-1")).await.request()["amount"],
        2
    );
    let listed = store
        .list(&ListQuery::new(a.clone(), &OperationState::ALL))
        .await
        .unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].key().namespace(), &a);
}

/// Lease: an absent operation is absent; nothing is created.
pub async fn acquire_of_an_absent_operation_is_absent<S: JournalStore + ?Sized>(store: Arc<S>) {
    let key = fresh_key();
    let acquired = store
        .acquire(key.held_by(OwnerToken::generate()), LONG_LEASE)
        .await;
    assert!(matches!(acquired, Ok(Acquired::Absent)), "{acquired:?}");
    assert_eq!(store.get(&key).await.unwrap(), None);
}

/// Lease: one owner at a time; another gets `Busy` with the time left.
pub async fn acquire_leases_an_open_operation_to_one_owner<S: JournalStore + ?Sized>(
    store: Arc<S>,
) {
    let key = fresh_key();
    recorded(&*store, &key).await;
    let first = OwnerToken::generate();
    let (record, now) = held(&*store, &key, first, LONG_LEASE).await;
    assert_eq!(record.parts().lease_owner, Some(first));
    assert_eq!(record.parts().lease_until, Some(now + LONG_LEASE));
    match store
        .acquire(key.held_by(OwnerToken::generate()), LONG_LEASE)
        .await
    {
        Ok(Acquired::Busy { retry_after, .. }) => {
            assert!(
                retry_after > Duration::ZERO && retry_after <= LONG_LEASE,
                "{retry_after:?}"
            );
        }
        other => panic!("a second owner must be busy, got {other:?}"),
    }
    assert_eq!(stored(&*store, &key).await.parts().lease_owner, Some(first));
}

/// Lease: `Busy` carries the time left on the holder's lease, not the
/// whole lease: after part of it has passed, the wait is shorter.
pub async fn busy_carries_the_time_left_on_the_holders_lease<S: JournalStore + ?Sized>(
    store: Arc<S>,
) {
    let lease = Duration::from_secs(6);
    let passed = Duration::from_millis(1500);
    let key = fresh_key();
    recorded(&*store, &key).await;
    held(&*store, &key, OwnerToken::generate(), lease).await;
    tokio::time::sleep(passed).await;
    match store
        .acquire(key.held_by(OwnerToken::generate()), lease)
        .await
    {
        Ok(Acquired::Busy { retry_after, .. }) => {
            // Half a second of slack for the store's clock's granularity.
            assert!(
                retry_after > Duration::ZERO
                    && retry_after <= lease - passed + Duration::from_millis(500),
                "{retry_after:?} after {passed:?} of a {lease:?} lease"
            );
        }
        other => panic!("a second owner must be busy, got {other:?}"),
    }
}

/// Lease: a lapsed lease is taken over.
pub async fn a_lapsed_lease_is_taken_over<S: JournalStore + ?Sized>(store: Arc<S>) {
    let key = fresh_key();
    recorded(&*store, &key).await;
    held(&*store, &key, OwnerToken::generate(), SHORT_LEASE).await;
    let next = OwnerToken::generate();
    let record = eventually("a takeover after the lease", || {
        let store = Arc::clone(&store);
        let key = key.clone();
        async move {
            match store.acquire(key.held_by(next), LONG_LEASE).await.unwrap() {
                Acquired::Held { record, .. } => Some(record),
                _ => None,
            }
        }
    })
    .await;
    assert_eq!(record.parts().lease_owner, Some(next));
}

/// Lease: the holder acquiring again (a second delivery) holds it, its
/// lease moved.
pub async fn the_holder_acquiring_again_keeps_it_with_its_lease_moved<S: JournalStore + ?Sized>(
    store: Arc<S>,
) {
    let key = fresh_key();
    recorded(&*store, &key).await;
    let owner = OwnerToken::generate();
    let (first, _) = held(&*store, &key, owner, SHORT_LEASE).await;
    let (again, now) = held(&*store, &key, owner, LONG_LEASE).await;
    assert_eq!(again.parts().lease_owner, Some(owner));
    assert_eq!(again.parts().lease_until, Some(now + LONG_LEASE));
    assert!(again.parts().lease_until > first.parts().lease_until);
}

/// Lease: a settled operation is never leased again.
pub async fn a_settled_operation_is_never_leased_again<S: JournalStore + ?Sized>(store: Arc<S>) {
    let key = fresh_key();
    recorded(&*store, &key).await;
    let owner = OwnerToken::generate();
    held(&*store, &key, owner, LONG_LEASE).await;
    store
        .finish(key.held_by(owner), &settled("succeeded"))
        .await
        .unwrap();
    for who in [owner, OwnerToken::generate()] {
        match store.acquire(key.held_by(who), LONG_LEASE).await.unwrap() {
            Acquired::Settled(record) => assert_eq!(record.state(), OperationState::Succeeded),
            other => panic!("a settled operation was leased: {other:?}"),
        }
    }
}

/// Lease: a lease outside 1 ms to 7 days is refused.
pub async fn a_lease_out_of_range_is_invalid_input<S: JournalStore + ?Sized>(store: Arc<S>) {
    let key = fresh_key();
    recorded(&*store, &key).await;
    for lease in [Duration::ZERO, Duration::from_secs(8 * 24 * 3600)] {
        let refused = store
            .acquire(key.held_by(OwnerToken::generate()), lease)
            .await;
        assert!(
            matches!(refused, Err(StoreError::InvalidInput(_))),
            "{lease:?}: {refused:?}"
        );
    }
    assert_eq!(stored(&*store, &key).await.parts().lease_owner, None);
}

/// Lease: of concurrent acquisitions, exactly one holds the operation.
pub async fn concurrent_acquisitions_have_one_holder<S: JournalStore + ?Sized>(store: Arc<S>) {
    for round in 0..4 {
        let key = key_in(&namespace(), &format!("order-{round}"));
        recorded(&*store, &key).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
        let racers: Vec<_> = (0..RACERS)
            .map(|_| {
                let (store, key, barrier) = (Arc::clone(&store), key.clone(), Arc::clone(&barrier));
                tokio::spawn(async move {
                    barrier.wait().await;
                    store
                        .acquire(key.held_by(OwnerToken::generate()), LONG_LEASE)
                        .await
                })
            })
            .collect();
        let mut holders = 0;
        for racer in racers {
            match racer.await.expect("racer") {
                Ok(Acquired::Held { .. }) => holders += 1,
                Ok(Acquired::Busy { .. }) => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            holders, 1,
            "round {round}: {holders} owners hold one operation"
        );
    }
}

/// Fencing: a send is counted only under the owner's live lease.
pub async fn mark_sent_without_the_lease_is_lost_and_counts_nothing<S: JournalStore + ?Sized>(
    store: Arc<S>,
) {
    let key = fresh_key();
    recorded(&*store, &key).await;
    let owner = OwnerToken::generate();
    assert_lost(
        "an unleased send",
        store.mark_sent(key.held_by(owner), 0).await,
    );
    held(&*store, &key, owner, SHORT_LEASE).await;
    assert_lost(
        "another owner's send",
        store
            .mark_sent(key.held_by(OwnerToken::generate()), 0)
            .await,
    );
    // A lapsed lease, taken over by nobody: sleeping longer only makes the
    // lapse surer, on any clock that runs at the pace of real time.
    tokio::time::sleep(SHORT_LEASE * 2).await;
    assert_lost(
        "a send on a lapsed lease",
        store.mark_sent(key.held_by(owner), 0).await,
    );
    let parts = stored(&*store, &key).await.parts().clone();
    assert_eq!((parts.sends, parts.first_sent_at), (0, None));
}

/// Sends: one send is counted after `sends`, and the first starts the key
/// window at the store's time.
pub async fn mark_sent_counts_a_send_and_the_first_starts_the_window<S: JournalStore + ?Sized>(
    store: Arc<S>,
) {
    let key = fresh_key();
    recorded(&*store, &key).await;
    let owner = OwnerToken::generate();
    let (_, leased_at) = held(&*store, &key, owner, LONG_LEASE).await;
    let first = store.mark_sent(key.held_by(owner), 0).await.unwrap();
    assert_eq!(first.parts().sends, 1);
    let window = first.parts().first_sent_at.expect("the window starts");
    assert!(
        window >= leased_at,
        "{window:?} before the lease at {leased_at:?}"
    );
    assert!(
        window <= leased_at + DEADLINE,
        "{window:?} far after {leased_at:?}"
    );
    // Later by more than a clock tick, so a window that restarts shows.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = store.mark_sent(key.held_by(owner), 1).await.unwrap();
    assert_eq!(second.parts().sends, 2);
    assert_eq!(
        second.parts().first_sent_at,
        Some(window),
        "the window moved"
    );
    assert_eq!(stored(&*store, &key).await, second);
}

/// Sends: delivered twice, a send counts once.
pub async fn mark_sent_delivered_twice_counts_once<S: JournalStore + ?Sized>(store: Arc<S>) {
    let key = fresh_key();
    recorded(&*store, &key).await;
    let owner = OwnerToken::generate();
    held(&*store, &key, owner, LONG_LEASE).await;
    let first = store.mark_sent(key.held_by(owner), 0).await.unwrap();
    let again = store.mark_sent(key.held_by(owner), 0).await.unwrap();
    assert_eq!(again.parts().sends, 1);
    assert_eq!(again.parts().first_sent_at, first.parts().first_sent_at);
    assert_eq!(stored(&*store, &key).await.parts().sends, 1);
}

/// Sends: a `sends` that is neither the stored count (a new send) nor one
/// below it (that send delivered again) is a stale executor's view:
/// `LostLease`, counting nothing.
pub async fn mark_sent_of_another_count_is_lost_and_counts_nothing<S: JournalStore + ?Sized>(
    store: Arc<S>,
) {
    let key = fresh_key();
    recorded(&*store, &key).await;
    let owner = OwnerToken::generate();
    held(&*store, &key, owner, LONG_LEASE).await;
    assert_eq!(
        store
            .mark_sent(key.held_by(owner), 0)
            .await
            .unwrap()
            .parts()
            .sends,
        1
    );
    for stale in [2, 3, 7] {
        assert_lost(
            &format!("a send after {stale} when 1 is stored"),
            store.mark_sent(key.held_by(owner), stale).await,
        );
    }
    assert_eq!(
        stored(&*store, &key).await.parts().sends,
        1,
        "a stale send counted"
    );
    assert_eq!(
        store
            .mark_sent(key.held_by(owner), 0)
            .await
            .unwrap()
            .parts()
            .sends,
        1,
        "the send delivered again"
    );
    assert_eq!(
        store
            .mark_sent(key.held_by(owner), 1)
            .await
            .unwrap()
            .parts()
            .sends,
        2
    );
    // Below too: only one below is the last send delivered again.
    assert_lost(
        "a send after 0 when 2 are stored",
        store.mark_sent(key.held_by(owner), 0).await,
    );
    assert_eq!(stored(&*store, &key).await.parts().sends, 2);
}

/// Fencing: a finish writes only under the owner's live lease.
pub async fn finish_without_the_lease_is_lost_and_writes_nothing<S: JournalStore + ?Sized>(
    store: Arc<S>,
) {
    let key = fresh_key();
    recorded(&*store, &key).await;
    let owner = OwnerToken::generate();
    assert_lost(
        "an unleased finish",
        store.finish(key.held_by(owner), &settled("x")).await,
    );
    held(&*store, &key, owner, LONG_LEASE).await;
    assert_lost(
        "another owner's finish",
        store
            .finish(key.held_by(OwnerToken::generate()), &settled("x"))
            .await,
    );
    let record = stored(&*store, &key).await;
    assert_eq!(record.state(), OperationState::Pending);
    assert_eq!(record.parts().provider_id, None);
    assert_eq!(record.parts().lease_owner, Some(owner));
}

/// Fencing: a lease taken over fences out its old owner.
pub async fn a_taken_over_owner_cannot_finish_or_send<S: JournalStore + ?Sized>(store: Arc<S>) {
    let key = fresh_key();
    recorded(&*store, &key).await;
    let old = OwnerToken::generate();
    held(&*store, &key, old, SHORT_LEASE).await;
    let new = OwnerToken::generate();
    eventually("a takeover", || {
        let store = Arc::clone(&store);
        let key = key.clone();
        async move {
            matches!(
                store.acquire(key.held_by(new), LONG_LEASE).await.unwrap(),
                Acquired::Held { .. }
            )
            .then_some(())
        }
    })
    .await;
    assert_lost(
        "the old owner's send",
        store.mark_sent(key.held_by(old), 0).await,
    );
    assert_lost(
        "the old owner's finish",
        store.finish(key.held_by(old), &settled("late")).await,
    );
    assert_eq!(stored(&*store, &key).await.state(), OperationState::Pending);
}

/// Finish: the outcome is written and the lease released.
pub async fn finish_writes_the_outcome_and_releases_the_lease<S: JournalStore + ?Sized>(
    store: Arc<S>,
) {
    let key = fresh_key();
    recorded(&*store, &key).await;
    let owner = OwnerToken::generate();
    held(&*store, &key, owner, LONG_LEASE).await;
    let unknown = Finish::new(OperationState::Unknown, Some("timed out".into()))
        .with_provider_id(Some("ch_9".into()));
    let written = store.finish(key.held_by(owner), &unknown).await.unwrap();
    assert_eq!(written.state(), OperationState::Unknown);
    assert_eq!(written.parts().provider_id.as_deref(), Some("ch_9"));
    assert_eq!(written.parts().detail.as_deref(), Some("timed out"));
    assert_eq!(written.parts().lease_until, None);
    assert_eq!(stored(&*store, &key).await, written);
    // Released: the next owner holds it at once.
    held(&*store, &key, OwnerToken::generate(), LONG_LEASE).await;
}

/// Finish: without a provider id the stored one stays; the search deadline
/// is written as given.
pub async fn finish_keeps_the_provider_id_and_writes_the_search_deadline<
    S: JournalStore + ?Sized,
>(
    store: Arc<S>,
) {
    let key = fresh_key();
    recorded(&*store, &key).await;
    let owner = OwnerToken::generate();
    let (_, now) = held(&*store, &key, owner, LONG_LEASE).await;
    let with_id = Finish::new(OperationState::Unknown, None).with_provider_id(Some("ch_1".into()));
    store.finish(key.held_by(owner), &with_id).await.unwrap();
    let next = OwnerToken::generate();
    held(&*store, &key, next, LONG_LEASE).await;
    let search = now + Duration::from_secs(3600);
    let review = Finish::new(OperationState::NeedsReview, Some("nothing found".into()))
        .with_search_until(Some(search));
    let written = store.finish(key.held_by(next), &review).await.unwrap();
    assert_eq!(written.parts().provider_id.as_deref(), Some("ch_1"));
    assert_eq!(written.parts().search_until, Some(search));
    assert_eq!(
        stored(&*store, &key).await.parts().search_until,
        Some(search)
    );
}

/// Finish: delivered twice, the second answers as the first.
pub async fn finish_delivered_twice_answers_as_the_first<S: JournalStore + ?Sized>(store: Arc<S>) {
    let key = fresh_key();
    recorded(&*store, &key).await;
    let owner = OwnerToken::generate();
    held(&*store, &key, owner, LONG_LEASE).await;
    let first = store
        .finish(key.held_by(owner), &settled("succeeded"))
        .await
        .unwrap();
    let again = store
        .finish(key.held_by(owner), &settled("succeeded"))
        .await
        .unwrap();
    assert_eq!(again, first);
}

/// Finish: a settled state never changes.
pub async fn a_settled_state_never_changes<S: JournalStore + ?Sized>(store: Arc<S>) {
    let key = fresh_key();
    recorded(&*store, &key).await;
    let owner = OwnerToken::generate();
    held(&*store, &key, owner, LONG_LEASE).await;
    store
        .finish(key.held_by(owner), &settled("succeeded"))
        .await
        .unwrap();
    let failed = Finish::new(OperationState::Failed, Some("declined".into()));
    assert_lost(
        "a finish after settling",
        store.finish(key.held_by(owner), &failed).await,
    );
    assert_lost(
        "a send after settling",
        store.mark_sent(key.held_by(owner), 0).await,
    );
    let record = stored(&*store, &key).await;
    assert_eq!(record.state(), OperationState::Succeeded);
    assert_eq!(record.parts().detail.as_deref(), Some("succeeded"));
}

/// List: one namespace, the given states, oldest change first, at most
/// `limit`.
pub async fn list_gives_the_states_asked_oldest_change_first<S: JournalStore + ?Sized>(
    store: Arc<S>,
) {
    let ns = namespace();
    let mut keys = Vec::new();
    for i in 0..4 {
        let key = key_in(&ns, &format!("order-{i}"));
        recorded(&*store, &key).await;
        keys.push(key);
        // Distinct change times, whatever the clock's resolution.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Order 0 changes last: it moves to the end of the unknown ones.
    let owner = OwnerToken::generate();
    held(&*store, &keys[0], owner, LONG_LEASE).await;
    let unknown = Finish::new(OperationState::Unknown, None);
    store
        .finish(keys[0].held_by(owner), &unknown)
        .await
        .unwrap();
    let open = [OperationState::Pending, OperationState::Unknown];
    let listed = store
        .list(&ListQuery::new(ns.clone(), &open))
        .await
        .unwrap();
    let order: Vec<_> = listed
        .iter()
        .map(|r| r.id().subject().to_string())
        .collect();
    assert_eq!(order, ["order-1", "order-2", "order-3", "order-0"]);
    let pending = store
        .list(&ListQuery::new(ns.clone(), &[OperationState::Pending]).limit(2))
        .await
        .unwrap();
    let order: Vec<_> = pending
        .iter()
        .map(|r| r.id().subject().to_string())
        .collect();
    assert_eq!(order, ["order-1", "order-2"]);
    let none = store
        .list(&ListQuery::new(ns.clone(), &[OperationState::Succeeded]))
        .await
        .unwrap();
    assert!(none.is_empty(), "{none:?}");
}

/// List: only what is unchanged for `older_than`, by the store's clock.
pub async fn list_gives_only_what_is_older_than_asked<S: JournalStore + ?Sized>(store: Arc<S>) {
    let ns = namespace();
    recorded(&*store, &key_in(&ns, "order-1")).await;
    let states = [OperationState::Pending];
    let recent = store
        .list(&ListQuery::new(ns.clone(), &states).older_than(Duration::from_secs(3600)))
        .await
        .unwrap();
    assert!(recent.is_empty(), "changed just now: {recent:?}");
    let listed = eventually("the operation to age", || {
        let store = Arc::clone(&store);
        let ns = ns.clone();
        async move {
            let listed = store
                .list(&ListQuery::new(ns.clone(), &states).older_than(Duration::from_millis(200)))
                .await
                .unwrap();
            (!listed.is_empty()).then_some(listed)
        }
    })
    .await;
    assert_eq!(listed.len(), 1);
}

/// List: a limit outside 1 to `MAX_LIST` is refused; `MAX_LIST` is not.
pub async fn list_limit_out_of_range_is_invalid_input<S: JournalStore + ?Sized>(store: Arc<S>) {
    let ns = namespace();
    recorded(&*store, &key_in(&ns, "order-1")).await;
    for limit in [0, MAX_LIST + 1, usize::MAX] {
        let refused = store
            .list(&ListQuery::new(ns.clone(), &OperationState::ALL).limit(limit))
            .await;
        assert!(
            matches!(refused, Err(StoreError::InvalidInput(_))),
            "{limit}: {refused:?}"
        );
    }
    let all = store
        .list(&ListQuery::new(ns.clone(), &OperationState::ALL))
        .await
        .unwrap();
    assert_eq!(all.len(), 1);
}

/// Time: every time is the store's clock's: a lease ends its length after
/// the acquisition's time, and records change at times the store reports.
pub async fn times_are_the_stores_clock<S: JournalStore + ?Sized>(store: Arc<S>) {
    let key = fresh_key();
    let record = recorded(&*store, &key).await;
    let owner = OwnerToken::generate();
    let (leased, now) = held(&*store, &key, owner, LONG_LEASE).await;
    assert_eq!(leased.parts().lease_until, Some(now + LONG_LEASE));
    assert!(now >= record.parts().created_at, "time ran backwards");
    assert!(
        now <= record.parts().created_at + DEADLINE,
        "{now:?} far after the record"
    );
}

/// Time: a record's `updated_at` never moves back, whatever the write:
/// read after each of a record, an acquisition, two sends around another
/// acquisition, and a finish, it only grows.
pub async fn updated_at_never_moves_back<S: JournalStore + ?Sized>(store: Arc<S>) {
    let key = fresh_key();
    let mut seen = vec![recorded(&*store, &key).await.parts().updated_at];
    let owner = OwnerToken::generate();
    seen.push(
        held(&*store, &key, owner, LONG_LEASE)
            .await
            .0
            .parts()
            .updated_at,
    );
    seen.push(
        store
            .mark_sent(key.held_by(owner), 0)
            .await
            .unwrap()
            .parts()
            .updated_at,
    );
    // Later by more than a clock tick, so a write that stamps an older
    // time shows.
    tokio::time::sleep(Duration::from_millis(20)).await;
    seen.push(
        held(&*store, &key, owner, LONG_LEASE)
            .await
            .0
            .parts()
            .updated_at,
    );
    seen.push(
        store
            .mark_sent(key.held_by(owner), 1)
            .await
            .unwrap()
            .parts()
            .updated_at,
    );
    seen.push(
        store
            .finish(key.held_by(owner), &settled("ok"))
            .await
            .unwrap()
            .parts()
            .updated_at,
    );
    seen.push(stored(&*store, &key).await.parts().updated_at);
    assert!(
        seen.windows(2).all(|w| w[0] <= w[1]),
        "updated_at moved back: {seen:?}"
    );
}

/// The store's name is one short lowercase word.
pub async fn journal_store_name_is_one_short_lowercase_word<S: JournalStore + ?Sized>(
    store: Arc<S>,
) {
    let name = store.capabilities().store;
    assert!(
        !name.is_empty()
            && name.len() <= 16
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
        "{name:?}"
    );
}
