//! The parking store's cases: one `pub async fn` per sentence of
//! [`ParkingStore`]'s contract. A purge sees every consumer's entries, so
//! each case needs a store of its own (an empty table, a fresh process
//! store); every case also parks under a consumer of its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::store::{
    InboundMessage, MAX_OUTBOX_BATCH, NewParked, ParkedMessage, ParkedQuery, ParkedState,
    ParkingStore, Resolution,
};
use idem_core::{ConsumerName, IdempotencyKey, StoreError};

use crate::support::{eventually, fresh_consumer};

/// A message `id` of `aggregate` at `version`.
pub fn inbound(id: &str, aggregate: &str, version: Option<u64>) -> InboundMessage {
    InboundMessage::new(id, "order.placed", format!("{id}@{version:?}").into_bytes())
        .and_then(|m| m.with_aggregate(aggregate, version))
        .and_then(|m| m.with_header("content-type", "text/plain"))
        .expect("valid message")
}

fn new_parked(consumer: &ConsumerName, message: InboundMessage, reason: &str) -> NewParked {
    NewParked {
        consumer: consumer.clone(),
        message,
        reason: reason.to_string(),
        deliveries: 5,
    }
}

async fn park<S: ParkingStore + ?Sized>(
    store: &S,
    consumer: &ConsumerName,
    message: InboundMessage,
) -> ParkedMessage {
    store
        .park(&new_parked(consumer, message, "handler failed"))
        .await
        .expect("park")
}

fn key(id: &str) -> IdempotencyKey {
    IdempotencyKey::new(id).expect("valid id")
}

fn ids(entries: &[ParkedMessage]) -> Vec<String> {
    entries
        .iter()
        .map(|e| e.parked.message.id().as_str().to_string())
        .collect()
}

async fn listed<S: ParkingStore + ?Sized>(
    store: &S,
    consumer: &ConsumerName,
    aggregate: Option<&str>,
) -> Vec<String> {
    let mut query = ParkedQuery::new(consumer.clone()).limit(MAX_OUTBOX_BATCH);
    query.aggregate = aggregate.map(str::to_string);
    ids(&store.parked(&query).await.expect("list"))
}

/// Waits until the store's clock has moved past `at` (a later entry then
/// has a later time).
async fn tick() {
    tokio::time::sleep(Duration::from_millis(5)).await;
}

/// Park: kept parked with its reason and deliveries, as given.
pub async fn park_keeps_the_message_its_reason_and_deliveries<S: ParkingStore + ?Sized>(
    store: Arc<S>,
) {
    let consumer = fresh_consumer();
    let new = new_parked(&consumer, inbound("m-1", "order-1", Some(3)), "bad total");
    let entry = store.park(&new).await.unwrap();
    assert_eq!(entry.parked, new);
    assert_eq!(entry.state, ParkedState::Parked);
    assert_eq!(
        (entry.resolved_at, entry.resolution.as_deref()),
        (None, None)
    );
    let read = store.get(&consumer, &key("m-1")).await.unwrap();
    assert_eq!(read.as_ref(), Some(&entry));
}

/// Park: a second park of one message keeps one entry, with the new reason,
/// whatever its state was.
pub async fn parking_a_message_again_keeps_one_entry_with_the_new_reason<
    S: ParkingStore + ?Sized,
>(
    store: Arc<S>,
) {
    let consumer = fresh_consumer();
    let message = inbound("m-1", "order-1", None);
    park(&*store, &consumer, message.clone()).await;
    let mut again = new_parked(&consumer, message.clone(), "still failing");
    again.deliveries = 9;
    let entry = store.park(&again).await.unwrap();
    assert_eq!(
        (entry.parked.reason.as_str(), entry.parked.deliveries),
        ("still failing", 9)
    );
    assert_eq!(listed(&*store, &consumer, None).await, ["m-1"]);
    assert!(
        store
            .resolve(
                &consumer,
                &key("m-1"),
                &Resolution::Dropped("given up".into())
            )
            .await
            .unwrap()
    );
    let parked_again = store
        .park(&new_parked(&consumer, message, "replay failed"))
        .await
        .unwrap();
    assert_eq!(
        parked_again.state,
        ParkedState::Parked,
        "a resolved entry parks again"
    );
    assert_eq!(
        (parked_again.resolved_at, parked_again.resolution.as_deref()),
        (None, None)
    );
    assert_eq!(store.count(&consumer).await.unwrap(), 1);
}

/// Park: parking a message again stamps it with the store's time anew, so
/// the listing by age puts it after the entries parked in between.
pub async fn parking_a_message_again_moves_it_after_those_parked_since<S: ParkingStore + ?Sized>(
    store: Arc<S>,
) {
    let consumer = fresh_consumer();
    let first = park(&*store, &consumer, inbound("m-1", "order-1", None)).await;
    tick().await;
    park(&*store, &consumer, inbound("m-2", "order-2", None)).await;
    tick().await;
    let again = park(&*store, &consumer, inbound("m-1", "order-1", None)).await;
    assert!(
        again.parked_at > first.parked_at,
        "parked again at {:?}, first at {:?}",
        again.parked_at,
        first.parked_at
    );
    assert_eq!(listed(&*store, &consumer, None).await, ["m-2", "m-1"]);
}

/// Cancellation: each operation is one write that lands whole or not at
/// all: a park dropped after any number of polls leaves one entry, parked,
/// with the reason and deliveries of one park (the one before, or the
/// dropped one, even if it lands later), never none.
pub async fn a_dropped_park_leaves_the_entry_whole<S: ParkingStore + ?Sized>(store: Arc<S>) {
    let consumer = fresh_consumer();
    let message = inbound("m-1", "order-1", Some(1));
    park(&*store, &consumer, message.clone()).await;
    // Each park's reason with its deliveries.
    let mut parks = vec![("handler failed".to_string(), 5)];
    for polls in 1..=8 {
        let mut again = new_parked(&consumer, message.clone(), &format!("again {polls}"));
        again.deliveries = 5 + polls;
        parks.push((again.reason.clone(), again.deliveries));
        let mut call = store.park(&again);
        for _ in 0..polls {
            let ready = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(call.as_mut().poll(cx).is_ready())
            })
            .await;
            if ready {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(call);
        let entry = store
            .get(&consumer, &key("m-1"))
            .await
            .expect("get")
            .unwrap_or_else(|| panic!("a park dropped after {polls} polls left no entry"));
        assert_eq!(entry.state, ParkedState::Parked);
        let found = (entry.parked.reason.clone(), entry.parked.deliveries);
        assert!(
            parks.contains(&found),
            "an entry no park wrote whole after {polls} polls: {found:?}"
        );
        assert_eq!(listed(&*store, &consumer, None).await, ["m-1"]);
    }
}

/// Get: one entry in any state; none for another consumer or id.
pub async fn get_reads_an_entry_in_any_state_and_nothing_else<S: ParkingStore + ?Sized>(
    store: Arc<S>,
) {
    let consumer = fresh_consumer();
    park(&*store, &consumer, inbound("m-1", "order-1", None)).await;
    assert!(store.get(&consumer, &key("m-2")).await.unwrap().is_none());
    assert!(
        store
            .get(&fresh_consumer(), &key("m-1"))
            .await
            .unwrap()
            .is_none()
    );
    store
        .resolve(&consumer, &key("m-1"), &Resolution::Replayed)
        .await
        .unwrap();
    let read = store
        .get(&consumer, &key("m-1"))
        .await
        .unwrap()
        .expect("kept");
    assert_eq!(read.state, ParkedState::Replayed);
    assert!(read.resolved_at.is_some_and(|at| at >= read.parked_at));
}

/// List: a consumer's parked entries only, oldest first.
pub async fn list_gives_the_consumers_parked_entries_oldest_first<S: ParkingStore + ?Sized>(
    store: Arc<S>,
) {
    let consumer = fresh_consumer();
    // Versions opposite to the age: a consumer's listing is by age alone.
    for (id, aggregate, version) in [
        ("m-b", "order-2", Some(9)),
        ("m-a", "order-1", Some(2)),
        ("m-c", "order-1", Some(3)),
    ] {
        park(&*store, &consumer, inbound(id, aggregate, version)).await;
        tick().await;
    }
    park(
        &*store,
        &fresh_consumer(),
        inbound("m-other", "order-1", None),
    )
    .await;
    assert_eq!(
        listed(&*store, &consumer, None).await,
        ["m-b", "m-a", "m-c"]
    );
    store
        .resolve(&consumer, &key("m-a"), &Resolution::Replayed)
        .await
        .unwrap();
    assert_eq!(listed(&*store, &consumer, None).await, ["m-b", "m-c"]);
    assert_eq!(listed(&*store, &consumer, Some("order-1")).await, ["m-c"]);
}

/// List: one aggregate's entries by version, versionless last.
pub async fn list_of_an_aggregate_orders_it_by_version<S: ParkingStore + ?Sized>(store: Arc<S>) {
    let consumer = fresh_consumer();
    for (id, version) in [
        ("v7", Some(7)),
        ("none", None),
        ("v5", Some(5)),
        ("v6", Some(6)),
    ] {
        park(&*store, &consumer, inbound(id, "order-1", version)).await;
        tick().await;
    }
    park(&*store, &consumer, inbound("elsewhere", "order-2", Some(1))).await;
    assert_eq!(
        listed(&*store, &consumer, Some("order-1")).await,
        ["v5", "v6", "v7", "none"]
    );
}

/// List: at most `limit` entries.
pub async fn list_holds_at_most_its_limit<S: ParkingStore + ?Sized>(store: Arc<S>) {
    let consumer = fresh_consumer();
    for i in 0..5 {
        park(
            &*store,
            &consumer,
            inbound(&format!("m-{i}"), "order-1", Some(i + 1)),
        )
        .await;
    }
    let two = store
        .parked(&ParkedQuery::new(consumer.clone()).limit(2))
        .await
        .unwrap();
    assert_eq!(two.len(), 2);
    let two = store
        .parked(
            &ParkedQuery::new(consumer.clone())
                .of_aggregate("order-1")
                .limit(2),
        )
        .await
        .unwrap();
    assert_eq!(ids(&two), ["m-0", "m-1"]);
}

/// Resolve: a parked entry once, replayed or dropped with the reason.
pub async fn resolve_settles_a_parked_entry_once<S: ParkingStore + ?Sized>(store: Arc<S>) {
    let consumer = fresh_consumer();
    park(&*store, &consumer, inbound("m-1", "order-1", None)).await;
    park(&*store, &consumer, inbound("m-2", "order-1", None)).await;
    let dropped = Resolution::Dropped("refunded by hand".into());
    assert!(
        store
            .resolve(&consumer, &key("m-1"), &dropped)
            .await
            .unwrap()
    );
    assert!(
        !store
            .resolve(&consumer, &key("m-1"), &Resolution::Replayed)
            .await
            .unwrap()
    );
    let m1 = store
        .get(&consumer, &key("m-1"))
        .await
        .unwrap()
        .expect("kept");
    assert_eq!(m1.state, ParkedState::Dropped);
    assert_eq!(m1.resolution.as_deref(), Some("refunded by hand"));
    assert!(
        store
            .resolve(&consumer, &key("m-2"), &Resolution::Replayed)
            .await
            .unwrap()
    );
    let m2 = store
        .get(&consumer, &key("m-2"))
        .await
        .unwrap()
        .expect("kept");
    assert_eq!((m2.state, m2.resolution), (ParkedState::Replayed, None));
    assert!(
        !store
            .resolve(&consumer, &key("absent"), &Resolution::Replayed)
            .await
            .unwrap()
    );
    assert!(
        !store
            .resolve(&fresh_consumer(), &key("m-2"), &Resolution::Replayed)
            .await
            .unwrap()
    );
}

/// Purge: resolved entries older than asked, never a parked one.
pub async fn purge_deletes_only_resolved_entries_older_than_asked<S: ParkingStore + ?Sized>(
    store: Arc<S>,
) {
    // "young" is parked with "old" and resolved an age later: a store that
    // ages entries from their parking purges both. Whether "young" is still
    // younger than the age when the purge ends depends on the machine's
    // pace, so a try that took longer is set aside and made again with a
    // longer age.
    let mut age = Duration::from_millis(300);
    let consumer = loop {
        let consumer = fresh_consumer();
        for id in ["old", "parked", "young"] {
            park(&*store, &consumer, inbound(id, "order-1", None)).await;
        }
        store
            .resolve(&consumer, &key("old"), &Resolution::Replayed)
            .await
            .unwrap();
        tokio::time::sleep(age + Duration::from_millis(50)).await;
        let young_resolved = Instant::now();
        store
            .resolve(&consumer, &key("young"), &Resolution::Dropped("no".into()))
            .await
            .unwrap();
        let purged = store.purge_resolved(age, MAX_OUTBOX_BATCH).await.unwrap();
        if young_resolved.elapsed() < age {
            assert_eq!(purged, 1, "purged what was resolved within {age:?}");
            break consumer;
        }
        store
            .purge_resolved(Duration::ZERO, MAX_OUTBOX_BATCH)
            .await
            .unwrap();
        age *= 2;
        assert!(
            age <= Duration::from_secs(40),
            "no resolve and purge took less than {age:?}"
        );
    };
    assert!(store.get(&consumer, &key("old")).await.unwrap().is_none());
    assert!(store.get(&consumer, &key("young")).await.unwrap().is_some());
    assert!(
        store
            .get(&consumer, &key("parked"))
            .await
            .unwrap()
            .is_some()
    );
    eventually("the young entry ages", || async {
        let purged = store.purge_resolved(age, 1).await.unwrap();
        (purged == 1).then_some(())
    })
    .await;
    assert_eq!(
        store
            .purge_resolved(Duration::ZERO, MAX_OUTBOX_BATCH)
            .await
            .unwrap(),
        0
    );
    assert_eq!(listed(&*store, &consumer, None).await, ["parked"]);
}

/// Purge: at most `limit` entries at a time.
pub async fn purge_deletes_up_to_its_limit<S: ParkingStore + ?Sized>(store: Arc<S>) {
    let consumer = fresh_consumer();
    for id in ["m-1", "m-2", "m-3"] {
        park(&*store, &consumer, inbound(id, "order-1", None)).await;
        let id = key(id);
        let resolved = store.resolve(&consumer, &id, &Resolution::Replayed);
        assert!(resolved.await.unwrap());
    }
    assert_eq!(store.purge_resolved(Duration::ZERO, 2).await.unwrap(), 2);
    assert_eq!(store.purge_resolved(Duration::ZERO, 2).await.unwrap(), 1);
}

/// Count: a consumer's parked entries.
pub async fn count_counts_a_consumers_parked_entries<S: ParkingStore + ?Sized>(store: Arc<S>) {
    let consumer = fresh_consumer();
    assert_eq!(store.count(&consumer).await.unwrap(), 0);
    for id in ["m-1", "m-2", "m-3"] {
        park(&*store, &consumer, inbound(id, "order-1", None)).await;
    }
    park(&*store, &fresh_consumer(), inbound("m-1", "order-1", None)).await;
    store
        .resolve(&consumer, &key("m-2"), &Resolution::Replayed)
        .await
        .unwrap();
    assert_eq!(store.count(&consumer).await.unwrap(), 2);
}

/// Limits: listing and purging outside 1 to 1000 are invalid input.
pub async fn parking_limits_out_of_range_are_invalid_input<S: ParkingStore + ?Sized>(
    store: Arc<S>,
) {
    let consumer = fresh_consumer();
    for limit in [0, MAX_OUTBOX_BATCH + 1] {
        let listed = store
            .parked(&ParkedQuery::new(consumer.clone()).limit(limit))
            .await;
        assert!(
            matches!(listed, Err(StoreError::InvalidInput(_))),
            "{listed:?}"
        );
        let purged = store.purge_resolved(Duration::ZERO, limit).await;
        assert!(
            matches!(purged, Err(StoreError::InvalidInput(_))),
            "{purged:?}"
        );
    }
}
