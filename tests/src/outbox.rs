//! The outbox store's cases: one `pub async fn` per sentence of
//! [`OutboxStore`]'s contract. A claim sees the whole outbox, so each case
//! needs a store of its own (an empty table, a fresh process store).

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::StoreError;
use idem_core::store::{
    BatchClaim, MAX_OUTBOX_BATCH, MessageId, MessageState, NewMessage, OutboxMessage, OutboxStore,
    OwnerToken, PublishFailure,
};

use crate::support::{LONG_LEASE, RACERS, SHORT_LEASE, assert_lost, eventually};

fn message(aggregate: &str, kind: &str) -> NewMessage {
    NewMessage::new(aggregate, kind, format!("{aggregate}:{kind}").into_bytes())
        .and_then(|m| m.with_header("content-type", "text/plain"))
        .expect("valid message")
}

async fn enqueued<S: OutboxStore + ?Sized>(
    store: &S,
    aggregate: &str,
    kind: &str,
) -> OutboxMessage {
    store
        .enqueue(&message(aggregate, kind))
        .await
        .expect("enqueue")
}

async fn claim<S: OutboxStore + ?Sized>(store: &S, owner: OwnerToken) -> Vec<OutboxMessage> {
    store
        .claim(&BatchClaim::new(owner, LONG_LEASE, MAX_OUTBOX_BATCH))
        .await
        .expect("claim")
}

fn kinds(messages: &[OutboxMessage]) -> Vec<String> {
    let mut kinds: Vec<String> = messages
        .iter()
        .map(|m| format!("{}/{}", m.message().aggregate(), m.message().kind()))
        .collect();
    kinds.sort();
    kinds
}

/// Enqueue: pending, with its aggregate's next sequence, as given.
pub async fn enqueue_stores_a_pending_message_with_its_aggregates_next_sequence<
    S: OutboxStore + ?Sized,
>(
    store: Arc<S>,
) {
    let new = message("order-1", "placed");
    let first = store.enqueue(&new).await.unwrap();
    assert_eq!(first.message(), &new);
    assert_eq!(first.state(), MessageState::Pending);
    assert_eq!((first.parts().sequence, first.parts().attempts), (1, 0));
    assert_eq!(first.parts().lease_owner, None);
    let second = enqueued(&*store, "order-1", "paid").await;
    let other = enqueued(&*store, "order-2", "placed").await;
    assert_eq!(second.parts().sequence, 2);
    assert_eq!(other.parts().sequence, 1, "sequences are per aggregate");
}

/// Enqueue: a second enqueue of one id stores nothing more.
pub async fn enqueue_delivered_twice_stores_once<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let new = message("order-1", "placed");
    let first = store.enqueue(&new).await.unwrap();
    let again = store.enqueue(&new).await.unwrap();
    assert_eq!(again, first);
    let next = enqueued(&*store, "order-1", "paid").await;
    assert_eq!(
        next.parts().sequence,
        2,
        "the second enqueue took a sequence"
    );
    assert_eq!(store.stats().await.unwrap().pending, 2);
}

/// Claim: each aggregate's lowest pending sequence, never two of one.
pub async fn a_claim_gives_each_aggregate_its_head_only<S: OutboxStore + ?Sized>(store: Arc<S>) {
    for kind in ["placed", "paid", "shipped"] {
        enqueued(&*store, "order-1", kind).await;
    }
    for kind in ["placed", "paid"] {
        enqueued(&*store, "order-2", kind).await;
    }
    let owner = OwnerToken::generate();
    let claimed = claim(&*store, owner).await;
    assert_eq!(kinds(&claimed), ["order-1/placed", "order-2/placed"]);
    for m in &claimed {
        assert_eq!(m.parts().lease_owner, Some(owner));
        assert!(m.parts().lease_until.is_some());
    }
    let limited = store
        .claim(&BatchClaim::new(OwnerToken::generate(), LONG_LEASE, 1))
        .await
        .unwrap();
    assert!(
        limited.is_empty(),
        "an aggregate in flight was claimed again: {limited:?}"
    );
}

/// Claim: a claim holds `limit` messages at most.
pub async fn a_claim_holds_at_most_its_limit<S: OutboxStore + ?Sized>(store: Arc<S>) {
    for i in 0..5 {
        enqueued(&*store, &format!("order-{i}"), "placed").await;
    }
    let first = store
        .claim(&BatchClaim::new(OwnerToken::generate(), LONG_LEASE, 2))
        .await
        .unwrap();
    assert_eq!(first.len(), 2);
    let rest = claim(&*store, OwnerToken::generate()).await;
    assert_eq!(rest.len(), 3);
    let mut all: Vec<MessageId> = first.iter().chain(&rest).map(OutboxMessage::id).collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 5, "a message claimed twice");
}

/// Claim ahead: the owner of an aggregate's messages claims the next one,
/// under the earliest of their leases; nobody else claims anything of it.
pub async fn a_claim_takes_the_next_message_of_an_aggregate_its_owner_holds<
    S: OutboxStore + ?Sized,
>(
    store: Arc<S>,
) {
    for kind in ["placed", "paid", "shipped"] {
        enqueued(&*store, "order-1", kind).await;
    }
    enqueued(&*store, "order-2", "placed").await;
    let owner = OwnerToken::generate();
    let heads = claim(&*store, owner).await;
    assert_eq!(kinds(&heads), ["order-1/placed", "order-2/placed"]);
    let lease = heads
        .iter()
        .find(|m| m.message().aggregate() == "order-1")
        .and_then(|m| m.parts().lease_until);
    // Later claims: a lease of their own would end later.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let ahead = claim(&*store, owner).await;
    assert_eq!(kinds(&ahead), ["order-1/paid"], "not claimed ahead");
    assert_eq!(ahead[0].parts().lease_owner, Some(owner));
    assert_eq!(
        ahead[0].parts().lease_until,
        lease,
        "claimed ahead under a lease of its own"
    );
    let stranger = claim(&*store, OwnerToken::generate()).await;
    assert!(stranger.is_empty(), "another owner claimed: {stranger:?}");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let further = claim(&*store, owner).await;
    assert_eq!(kinds(&further), ["order-1/shipped"]);
    assert_eq!(further[0].parts().lease_until, lease);
    assert!(claim(&*store, owner).await.is_empty());
}

/// Claim ahead: never past a message its owner no longer holds, freed by a
/// failure or lapsed.
pub async fn a_claim_never_takes_a_message_past_one_its_owner_let_go<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    // A millisecond apart at least, so claims take them in this order.
    let mut stored = Vec::new();
    for (aggregate, kind) in [
        ("order-1", "placed"),
        ("order-2", "placed"),
        ("order-1", "paid"),
        ("order-2", "paid"),
    ] {
        stored.push(enqueued(&*store, aggregate, kind).await);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let (freed, lapsed) = (&stored[0], &stored[1]);
    let owner = OwnerToken::generate();
    let first = store
        .claim(&BatchClaim::new(owner, LONG_LEASE, 1))
        .await
        .unwrap();
    assert_eq!(kinds(&first), ["order-1/placed"]);
    let second = store
        .claim(&BatchClaim::new(owner, SHORT_LEASE, 1))
        .await
        .unwrap();
    assert_eq!(kinds(&second), ["order-2/placed"]);
    let hour = Duration::from_secs(3600);
    store
        .mark_failed(&PublishFailure::new(owner, freed.id(), "refused").retry_after(hour))
        .await
        .unwrap();
    tokio::time::sleep(SHORT_LEASE * 2).await;
    let again = claim(&*store, owner).await;
    assert_eq!(
        kinds(&again),
        ["order-2/placed"],
        "claimed past a message its owner let go"
    );
    assert_eq!(again[0].id(), lapsed.id());
}

/// Release: frees only what its owner holds, available at once, counting
/// no attempt; delivered twice, frees nothing more.
pub async fn release_frees_only_what_its_owner_holds_counting_nothing<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let placed = enqueued(&*store, "order-1", "placed").await;
    let owner = OwnerToken::generate();
    claim(&*store, owner).await;
    let stranger = store
        .release(OwnerToken::generate(), &[placed.id()])
        .await
        .unwrap();
    assert_eq!(stranger, 0, "another owner released a message");
    assert!(claim(&*store, OwnerToken::generate()).await.is_empty());
    assert_eq!(store.release(owner, &[placed.id()]).await.unwrap(), 1);
    assert_eq!(
        store.release(owner, &[placed.id()]).await.unwrap(),
        0,
        "released twice"
    );
    let again = claim(&*store, OwnerToken::generate()).await;
    assert_eq!(again.len(), 1, "a released message is not free: {again:?}");
    assert_eq!(again[0].id(), placed.id());
    assert_eq!(again[0].parts().attempts, 0, "a release counted an attempt");
    assert_eq!(again[0].parts().last_error, None);
}

/// Claim: a lapsed lease counts as none.
pub async fn a_lapsed_claim_is_claimed_again<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let placed = enqueued(&*store, "order-1", "placed").await;
    let first = store
        .claim(&BatchClaim::new(OwnerToken::generate(), SHORT_LEASE, 10))
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    let next = OwnerToken::generate();
    let again = eventually("the lease to lapse", || {
        let store = Arc::clone(&store);
        async move {
            let claimed = store
                .claim(&BatchClaim::new(next, LONG_LEASE, 10))
                .await
                .unwrap();
            (!claimed.is_empty()).then_some(claimed)
        }
    })
    .await;
    assert_eq!(again[0].id(), placed.id());
    assert_eq!(again[0].parts().lease_owner, Some(next));
}

/// Sent: only what the owner still holds, in one operation.
pub async fn mark_sent_marks_only_what_its_owner_holds<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let a = enqueued(&*store, "order-1", "placed").await;
    let b = enqueued(&*store, "order-2", "placed").await;
    let owner = OwnerToken::generate();
    claim(&*store, owner).await;
    let stranger = store
        .mark_sent(OwnerToken::generate(), &[a.id(), b.id()])
        .await
        .unwrap();
    assert_eq!(stranger, 0, "another owner marked messages sent");
    assert_eq!(store.stats().await.unwrap().pending, 2);
    assert_eq!(store.mark_sent(owner, &[a.id(), b.id()]).await.unwrap(), 2);
    assert_eq!(store.stats().await.unwrap().pending, 0);
}

/// Sent: a lease taken over marks nothing.
pub async fn a_taken_over_relay_marks_nothing<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let placed = enqueued(&*store, "order-1", "placed").await;
    let stale = OwnerToken::generate();
    store
        .claim(&BatchClaim::new(stale, SHORT_LEASE, 10))
        .await
        .unwrap();
    let fresh = OwnerToken::generate();
    eventually("a takeover", || {
        let store = Arc::clone(&store);
        async move {
            (!store
                .claim(&BatchClaim::new(fresh, LONG_LEASE, 10))
                .await
                .unwrap()
                .is_empty())
            .then_some(())
        }
    })
    .await;
    assert_eq!(store.mark_sent(stale, &[placed.id()]).await.unwrap(), 0);
    assert_lost(
        "a stale relay's failure",
        store
            .mark_failed(&PublishFailure::new(stale, placed.id(), "late"))
            .await,
    );
    assert_eq!(store.mark_sent(fresh, &[placed.id()]).await.unwrap(), 1);
}

/// Sent: delivered twice, the second marks nothing more and fails nothing.
pub async fn mark_sent_delivered_twice_marks_nothing_more<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let placed = enqueued(&*store, "order-1", "placed").await;
    let owner = OwnerToken::generate();
    claim(&*store, owner).await;
    assert_eq!(store.mark_sent(owner, &[placed.id()]).await.unwrap(), 1);
    assert_eq!(store.mark_sent(owner, &[placed.id()]).await.unwrap(), 0);
    assert!(claim(&*store, OwnerToken::generate()).await.is_empty());
}

/// Claim: once a head is sent, the next sequence is its aggregate's head.
pub async fn after_a_message_is_sent_the_next_of_its_aggregate_is_claimed<
    S: OutboxStore + ?Sized,
>(
    store: Arc<S>,
) {
    for kind in ["placed", "paid", "shipped"] {
        enqueued(&*store, "order-1", kind).await;
    }
    let mut seen = Vec::new();
    for _ in 0..3 {
        let owner = OwnerToken::generate();
        let claimed = claim(&*store, owner).await;
        assert_eq!(claimed.len(), 1, "{claimed:?}");
        seen.push(claimed[0].parts().sequence);
        store.mark_sent(owner, &[claimed[0].id()]).await.unwrap();
    }
    assert_eq!(seen, [1, 2, 3], "out of sequence");
    assert!(claim(&*store, OwnerToken::generate()).await.is_empty());
}

/// Failed: counted, kept, freed, available again after its back-off and
/// not before.
pub async fn a_failed_message_is_freed_and_waits_its_back_off<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let waits = enqueued(&*store, "order-1", "placed").await;
    let retried = enqueued(&*store, "order-2", "placed").await;
    let owner = OwnerToken::generate();
    assert_eq!(claim(&*store, owner).await.len(), 2);
    let hour = Duration::from_secs(3600);
    let left = store
        .mark_failed(
            &PublishFailure::new(owner, waits.id(), "broker refused")
                .retry_after(hour)
                .max_attempts(5),
        )
        .await
        .unwrap();
    assert_eq!(left, MessageState::Pending);
    store
        .mark_failed(&PublishFailure::new(owner, retried.id(), "broker refused").max_attempts(5))
        .await
        .unwrap();
    let again = claim(&*store, OwnerToken::generate()).await;
    assert_eq!(
        again.len(),
        1,
        "a message came back before its back-off: {again:?}"
    );
    assert_eq!(again[0].id(), retried.id());
    assert_eq!(again[0].parts().attempts, 1);
    assert_eq!(
        again[0].parts().last_error.as_deref(),
        Some("broker refused")
    );
    assert_eq!(store.stats().await.unwrap().pending, 2);
}

/// Failed: the last attempt parks the message, and its aggregate waits;
/// every other aggregate flows.
pub async fn the_last_failure_parks_the_message_and_its_aggregate_only<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let poison = enqueued(&*store, "order-1", "placed").await;
    enqueued(&*store, "order-1", "paid").await;
    let healthy = enqueued(&*store, "order-2", "placed").await;
    let owner = OwnerToken::generate();
    claim(&*store, owner).await;
    let left = store
        .mark_failed(&PublishFailure::new(owner, poison.id(), "cannot route").max_attempts(1))
        .await
        .unwrap();
    assert_eq!(left, MessageState::Parked);
    store.mark_sent(owner, &[healthy.id()]).await.unwrap();
    enqueued(&*store, "order-2", "paid").await;
    let next = claim(&*store, OwnerToken::generate()).await;
    assert_eq!(kinds(&next), ["order-2/paid"], "a parked aggregate flowed");
    let parked = store.parked(10).await.unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].id(), poison.id());
    assert_eq!(
        parked[0].parts().last_error.as_deref(),
        Some("cannot route")
    );
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.pending, stats.parked), (2, 1), "{stats:?}");
}

/// Failed: without the lease, nothing is written.
pub async fn a_failure_without_the_lease_is_lost<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let placed = enqueued(&*store, "order-1", "placed").await;
    assert_lost(
        "an unclaimed failure",
        store
            .mark_failed(
                &PublishFailure::new(OwnerToken::generate(), placed.id(), "x").max_attempts(1),
            )
            .await,
    );
    claim(&*store, OwnerToken::generate()).await;
    assert_lost(
        "another owner's failure",
        store
            .mark_failed(
                &PublishFailure::new(OwnerToken::generate(), placed.id(), "x").max_attempts(1),
            )
            .await,
    );
    assert_eq!(store.stats().await.unwrap().parked, 0);
}

/// Operator: a retry makes a parked message pending, its attempts reset.
pub async fn a_retried_message_is_pending_again<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let poison = enqueued(&*store, "order-1", "placed").await;
    let owner = OwnerToken::generate();
    claim(&*store, owner).await;
    store
        .mark_failed(&PublishFailure::new(owner, poison.id(), "down").max_attempts(1))
        .await
        .unwrap();
    assert!(store.retry(poison.id()).await.unwrap());
    assert!(
        !store.retry(poison.id()).await.unwrap(),
        "retried a pending message"
    );
    let again = claim(&*store, OwnerToken::generate()).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].parts().attempts, 0);
    assert!(!store.retry(MessageId::generate()).await.unwrap());
}

/// Operator: a drop keeps the reason and lets the aggregate flow.
pub async fn a_dropped_message_keeps_its_reason_and_frees_its_aggregate<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let poison = enqueued(&*store, "order-1", "placed").await;
    enqueued(&*store, "order-1", "paid").await;
    let owner = OwnerToken::generate();
    claim(&*store, owner).await;
    store
        .mark_failed(&PublishFailure::new(owner, poison.id(), "malformed").max_attempts(1))
        .await
        .unwrap();
    assert!(
        store
            .drop_message(poison.id(), "replaced by a fix")
            .await
            .unwrap()
    );
    assert!(!store.drop_message(poison.id(), "again").await.unwrap());
    let next = claim(&*store, OwnerToken::generate()).await;
    assert_eq!(kinds(&next), ["order-1/paid"]);
    assert!(store.parked(10).await.unwrap().is_empty());
    let dropped = store
        .message(poison.id())
        .await
        .unwrap()
        .expect("a dropped message is stored until purged");
    assert_eq!(dropped.state(), MessageState::Dropped);
    assert_eq!(
        dropped.parts().last_error.as_deref(),
        Some("replaced by a fix"),
        "the reason of the drop is not kept"
    );
    assert!(
        store
            .message(MessageId::generate())
            .await
            .unwrap()
            .is_none()
    );
}

/// Operator: a sent message is not dropped, and nothing of it changes.
pub async fn dropping_a_sent_message_changes_nothing<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let placed = enqueued(&*store, "order-1", "placed").await;
    let owner = OwnerToken::generate();
    claim(&*store, owner).await;
    assert_eq!(store.mark_sent(owner, &[placed.id()]).await.unwrap(), 1);
    let sent = store.message(placed.id()).await.unwrap();
    assert!(
        !store.drop_message(placed.id(), "too late").await.unwrap(),
        "a sent message was dropped"
    );
    assert_eq!(store.message(placed.id()).await.unwrap(), sent);
    assert_eq!(sent.map(|m| m.state()), Some(MessageState::Sent));
}

/// Operator: a retried message keeps its sequence, so it is claimed before
/// the later messages of its aggregate.
pub async fn a_retried_message_keeps_its_place_in_its_aggregate<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let poison = enqueued(&*store, "order-1", "placed").await;
    let later = enqueued(&*store, "order-1", "paid").await;
    let owner = OwnerToken::generate();
    claim(&*store, owner).await;
    store
        .mark_failed(&PublishFailure::new(owner, poison.id(), "down").max_attempts(1))
        .await
        .unwrap();
    assert!(store.retry(poison.id()).await.unwrap());
    let relay = OwnerToken::generate();
    let again = claim(&*store, relay).await;
    assert_eq!(
        kinds(&again),
        ["order-1/placed"],
        "a retried message lost its place"
    );
    assert_eq!(again[0].parts().sequence, poison.parts().sequence);
    store.mark_sent(relay, &[poison.id()]).await.unwrap();
    let next = claim(&*store, OwnerToken::generate()).await;
    assert_eq!(
        next.iter().map(|m| m.id()).collect::<Vec<_>>(),
        [later.id()]
    );
}

/// Operator: a retry keeps the last error, and the message is due at once
/// whatever its back-off.
pub async fn a_retried_message_keeps_its_last_error_and_is_due_at_once<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let poison = enqueued(&*store, "order-1", "placed").await;
    let owner = OwnerToken::generate();
    claim(&*store, owner).await;
    let hour = Duration::from_secs(3600);
    store
        .mark_failed(
            &PublishFailure::new(owner, poison.id(), "down")
                .retry_after(hour)
                .max_attempts(1),
        )
        .await
        .unwrap();
    assert!(store.retry(poison.id()).await.unwrap());
    let again = claim(&*store, OwnerToken::generate()).await;
    assert_eq!(again.len(), 1, "a retried message waits out its back-off");
    assert_eq!(again[0].parts().attempts, 0);
    assert_eq!(
        again[0].parts().last_error.as_deref(),
        Some("down"),
        "a retry cleared the last error"
    );
}

/// Release: the attempts and the last error of earlier failures stay as
/// they were, and the message is free at once.
pub async fn a_release_keeps_the_last_failure_and_frees_at_once<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let placed = enqueued(&*store, "order-1", "placed").await;
    let first = OwnerToken::generate();
    claim(&*store, first).await;
    store
        .mark_failed(&PublishFailure::new(first, placed.id(), "refused"))
        .await
        .unwrap();
    let second = OwnerToken::generate();
    assert_eq!(claim(&*store, second).await.len(), 1);
    assert_eq!(store.release(second, &[placed.id()]).await.unwrap(), 1);
    let again = claim(&*store, OwnerToken::generate()).await;
    assert_eq!(again.len(), 1, "a released message is not free: {again:?}");
    assert_eq!(again[0].parts().attempts, 1);
    assert_eq!(
        again[0].parts().last_error.as_deref(),
        Some("refused"),
        "a release cleared the last error"
    );
}

/// Purge: sent messages at least as old as asked (a message sent this
/// millisecond is purged with `older_than` zero), never an unsent one.
pub async fn purge_deletes_only_sent_messages_older_than_asked<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let sent = enqueued(&*store, "order-1", "placed").await;
    enqueued(&*store, "order-2", "placed").await;
    let owner = OwnerToken::generate();
    let claimed = claim(&*store, owner).await;
    assert_eq!(claimed.len(), 2);
    store.mark_sent(owner, &[sent.id()]).await.unwrap();
    assert_eq!(
        store
            .purge_sent(Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        0,
        "purged a message sent just now"
    );
    assert_eq!(store.purge_sent(Duration::ZERO, 100).await.unwrap(), 1);
    assert_eq!(store.purge_sent(Duration::ZERO, 100).await.unwrap(), 0);
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.pending, 1, "an unsent message was purged");
}

/// Purge: a dropped message too, aged from its drop (its `sent_at`).
pub async fn a_dropped_message_is_purged_aged_from_its_drop<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let placed = enqueued(&*store, "order-1", "placed").await;
    let gap = Duration::from_millis(1_200);
    tokio::time::sleep(gap).await;
    let dropping = Instant::now();
    assert!(store.drop_message(placed.id(), "obsolete").await.unwrap());
    let young = store.purge_sent(gap / 2, 100).await.unwrap();
    // Only a purge within half the gap of the drop proves anything; a
    // machine that stalled longer purges it rightly.
    if dropping.elapsed() < gap / 2 {
        assert_eq!(young, 0, "a message dropped just now was purged");
    }
    let dropped = store.message(placed.id()).await.unwrap();
    if let Some(dropped) = dropped {
        let at = dropped.parts().sent_at.expect("a drop records its time");
        assert!(
            at.saturating_duration_since(dropped.parts().enqueued_at) >= gap / 2,
            "the drop's time is not the drop's: {dropped:?}"
        );
    }
    let purged = young + store.purge_sent(Duration::ZERO, 100).await.unwrap();
    assert_eq!(purged, 1, "a dropped message was not purged");
    assert!(store.message(placed.id()).await.unwrap().is_none());
}

/// Enqueue: an aggregate's sequence keeps counting after its messages were
/// purged.
pub async fn an_aggregates_sequence_keeps_counting_after_a_purge<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let first = enqueued(&*store, "order-1", "placed").await;
    let owner = OwnerToken::generate();
    claim(&*store, owner).await;
    store.mark_sent(owner, &[first.id()]).await.unwrap();
    assert_eq!(store.purge_sent(Duration::ZERO, 100).await.unwrap(), 1);
    let next = enqueued(&*store, "order-1", "paid").await;
    assert_eq!(
        next.parts().sequence,
        first.parts().sequence + 1,
        "the sequence started again after a purge"
    );
}

/// Stats: only pending messages age the backlog, neither sent nor parked
/// ones.
pub async fn stats_age_only_the_pending_backlog<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let sent = enqueued(&*store, "order-1", "placed").await;
    let parked = enqueued(&*store, "order-2", "placed").await;
    let gap = Duration::from_millis(1_200);
    tokio::time::sleep(gap).await;
    let fresh_since = Instant::now();
    enqueued(&*store, "order-3", "placed").await;
    let owner = OwnerToken::generate();
    assert_eq!(claim(&*store, owner).await.len(), 3);
    store.mark_sent(owner, &[sent.id()]).await.unwrap();
    store
        .mark_failed(&PublishFailure::new(owner, parked.id(), "down").max_attempts(1))
        .await
        .unwrap();
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.pending, stats.parked), (1, 1), "{stats:?}");
    let age = stats.oldest_pending_age.expect("a pending message ages");
    // The fresh message is at most this old; the others at least `gap`.
    if fresh_since.elapsed() < gap / 2 {
        assert!(age < gap, "aged from a sent or parked message: {age:?}");
    }
}

/// Claim: a lease under a second lasts its length, not rounded to nothing.
pub async fn a_lease_under_a_second_holds_for_its_length<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let placed = enqueued(&*store, "order-1", "placed").await;
    let lease = Duration::from_millis(900);
    let claiming = Instant::now();
    let first = store
        .claim(&BatchClaim::new(OwnerToken::generate(), lease, 10))
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    let rival = claim(&*store, OwnerToken::generate()).await;
    // Only a rival inside the lease proves anything.
    if claiming.elapsed() < lease {
        assert!(
            rival.is_empty(),
            "a {lease:?} lease held nothing: {rival:?}"
        );
    }
    let until = first[0].parts().lease_until.expect("a claim leases");
    assert!(
        until.saturating_duration_since(placed.parts().enqueued_at) >= lease,
        "a {lease:?} lease ends at {until:?}, enqueued at {:?}",
        placed.parts().enqueued_at
    );
}

/// Sent: a lease that lapsed holds nothing for its owner, even when nobody
/// has claimed the message since.
pub async fn a_lapsed_owner_marks_nothing_even_unclaimed<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let placed = enqueued(&*store, "order-1", "placed").await;
    let owner = OwnerToken::generate();
    let claimed = store
        .claim(&BatchClaim::new(owner, SHORT_LEASE, 10))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    tokio::time::sleep(SHORT_LEASE * 2).await;
    assert_eq!(
        store.mark_sent(owner, &[placed.id()]).await.unwrap(),
        0,
        "a lapsed lease marked its message sent"
    );
    assert_eq!(store.release(owner, &[placed.id()]).await.unwrap(), 0);
    assert_lost(
        "a lapsed owner's failure",
        store
            .mark_failed(&PublishFailure::new(owner, placed.id(), "late"))
            .await,
    );
    let again = claim(&*store, OwnerToken::generate()).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].state(), MessageState::Pending);
}

/// Claim: when more heads are due than the limit, the oldest enqueued are
/// taken first.
pub async fn a_claim_takes_the_oldest_heads_first<S: OutboxStore + ?Sized>(store: Arc<S>) {
    // A millisecond apart at least, so enqueue times order them.
    let mut stored = Vec::new();
    for (aggregate, kind) in [
        ("order-1", "placed"),
        ("order-1", "paid"),
        ("order-2", "placed"),
    ] {
        stored.push(enqueued(&*store, aggregate, kind).await);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let owner = OwnerToken::generate();
    let first = store
        .claim(&BatchClaim::new(owner, LONG_LEASE, 1))
        .await
        .unwrap();
    assert_eq!(
        first.iter().map(|m| m.id()).collect::<Vec<_>>(),
        [stored[0].id()]
    );
    store.mark_sent(owner, &[stored[0].id()]).await.unwrap();
    let next = store
        .claim(&BatchClaim::new(OwnerToken::generate(), LONG_LEASE, 1))
        .await
        .unwrap();
    assert_eq!(
        kinds(&next),
        ["order-1/paid"],
        "a younger head was taken before the oldest"
    );
}

/// Stats: pending and parked counted, the oldest pending aged.
pub async fn stats_count_the_backlog_and_age_its_oldest<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let empty = store.stats().await.unwrap();
    assert_eq!(
        (empty.pending, empty.parked, empty.oldest_pending_age),
        (0, 0, None)
    );
    enqueued(&*store, "order-1", "placed").await;
    enqueued(&*store, "order-2", "placed").await;
    let aged = eventually("the backlog to age", || {
        let store = Arc::clone(&store);
        async move {
            let stats = store.stats().await.unwrap();
            stats
                .oldest_pending_age
                .filter(|age| *age >= Duration::from_millis(50))
                .map(|_| stats)
        }
    })
    .await;
    assert_eq!(aged.pending, 2);
}

/// Limits: 1 to `MAX_OUTBOX_BATCH` for claims, listings and purges; a
/// lease of 1 ms to 7 days.
pub async fn limits_out_of_range_are_invalid_input<S: OutboxStore + ?Sized>(store: Arc<S>) {
    enqueued(&*store, "order-1", "placed").await;
    for limit in [0, MAX_OUTBOX_BATCH + 1] {
        let owner = OwnerToken::generate();
        assert!(matches!(
            store
                .claim(&BatchClaim::new(owner, LONG_LEASE, limit))
                .await,
            Err(StoreError::InvalidInput(_))
        ));
        assert!(matches!(
            store.parked(limit).await,
            Err(StoreError::InvalidInput(_))
        ));
        assert!(matches!(
            store.purge_sent(Duration::ZERO, limit).await,
            Err(StoreError::InvalidInput(_))
        ));
    }
    assert!(matches!(
        store
            .claim(&BatchClaim::new(OwnerToken::generate(), Duration::ZERO, 10))
            .await,
        Err(StoreError::InvalidInput(_))
    ));
    assert_eq!(claim(&*store, OwnerToken::generate()).await.len(), 1);
}

/// Claim: concurrent relays never share an aggregate.
pub async fn concurrent_claims_never_share_an_aggregate<S: OutboxStore + ?Sized>(store: Arc<S>) {
    for i in 0..20 {
        for kind in ["placed", "paid"] {
            enqueued(&*store, &format!("order-{i}"), kind).await;
        }
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let racers: Vec<_> = (0..RACERS)
        .map(|_| {
            let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                store
                    .claim(&BatchClaim::new(OwnerToken::generate(), LONG_LEASE, 5))
                    .await
            })
        })
        .collect();
    let mut aggregates = Vec::new();
    for racer in racers {
        for m in racer.await.expect("racer").expect("claim") {
            aggregates.push(m.message().aggregate().to_string());
        }
    }
    let total = aggregates.len();
    aggregates.sort();
    aggregates.dedup();
    assert_eq!(aggregates.len(), total, "two relays hold one aggregate");
    assert_eq!(total, 20, "every aggregate's head was claimed once");
}
