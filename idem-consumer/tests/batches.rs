//! A consumer's batches on the memory inbox (`MemoryTransaction`): one
//! commit per batch, a message's failure or gap confined to its own
//! savepoint, and a message in two batches at once applied once, with the
//! rules Postgres and DynamoDB keep in their own tests.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::time::Duration;

use common::{deliveries, event, outcomes, plain};
use idem_conformance::consumers::{ConsumerBackend, MemoryBackend, consumer_with};
use idem_consumer::{ConsumerOptions, Settled};
use idem_core::store::{IdempotencyStore, ParkingStore};
use idem_core::{IdempotencyKey, Scope};

const PATIENCE: Duration = Duration::from_secs(30);

fn options(max_deliveries: u32) -> ConsumerOptions {
    ConsumerOptions::default()
        .max_deliveries(max_deliveries)
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
}

fn ids(count: usize) -> Vec<String> {
    (0..count).map(|n| format!("m-{n}")).collect()
}

async fn sorted_effects(shop: &common::Shop) -> Vec<String> {
    let mut effects = shop.effects().await;
    effects.sort();
    effects
}

#[tokio::test]
async fn a_batch_commits_once_and_its_redelivery_is_all_duplicates() {
    let (consumer, shop, _) = consumer_with(options(5));
    let ids = ids(10);
    let batch = deliveries(ids.iter().map(|id| plain(id, id)).collect());
    let settled = outcomes(consumer.consume_batch(&batch).await);
    assert_eq!(settled, vec![Settled::Applied; 10]);
    assert_eq!(shop.begun(), 1, "one transaction");
    assert_eq!(sorted_effects(&shop).await, ids);
    // Killed between the commit and the acks: the broker delivers the
    // batch again, and nothing applies twice.
    let again = deliveries(ids.iter().map(|id| plain(id, id)).collect());
    let settled = outcomes(consumer.consume_batch(&again).await);
    assert_eq!(settled, vec![Settled::Duplicate; 10]);
    assert_eq!(shop.effects().await.len(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_of_a_batch_shows_before_its_one_commit() {
    let (consumer, shop, _) = consumer_with(options(5));
    let (entered, go) = shop.hold("m-2");
    let running = tokio::spawn({
        let consumer = consumer.clone();
        async move {
            let batch = deliveries(ids(3).iter().map(|id| plain(id, id)).collect());
            outcomes(consumer.consume_batch(&batch).await)
        }
    });
    tokio::time::timeout(PATIENCE, entered.notified())
        .await
        .expect("the last message reached its handler");
    // The first two are claimed, handled and completed in the
    // transaction: neither their effects nor their records show yet.
    assert!(shop.effects().await.is_empty());
    let first = Scope::new(
        consumer.name().inbox_tenant(),
        IdempotencyKey::new("m-0").unwrap(),
    );
    assert!(shop.books.store.get(&first).await.unwrap().is_none());
    go.notify_one();
    assert_eq!(running.await.unwrap(), vec![Settled::Applied; 3]);
    assert_eq!(sorted_effects(&shop).await, ids(3));
    assert!(shop.books.store.get(&first).await.unwrap().is_some());
}

#[tokio::test]
async fn a_poison_message_inside_a_batch_parks_only_itself_and_its_batch_mates_apply() {
    let (consumer, shop, _) = consumer_with(options(1));
    shop.fail("m-2", u32::MAX);
    let batch = deliveries(ids(5).iter().map(|id| plain(id, id)).collect());
    let settled = outcomes(consumer.consume_batch(&batch).await);
    assert_eq!(settled[..2], [Settled::Applied, Settled::Applied]);
    assert!(
        matches!(&settled[2], Settled::Parked { reason } if reason.contains("m-2 is refused")),
        "{settled:?}"
    );
    assert_eq!(settled[3..], [Settled::Applied, Settled::Applied]);
    assert_eq!(
        sorted_effects(&shop).await,
        ["m-0", "m-1", "m-3", "m-4"],
        "the poison message's writes never committed"
    );
    // The failed handler dropped the transaction it was given: the batch
    // began once more without it, and committed once.
    assert_eq!(shop.begun(), 2);
    let parked = consumer.parked(None, 10).await.unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].parked.message.id().as_str(), "m-2");
}

#[tokio::test]
async fn a_gap_inside_a_batch_rolls_back_only_its_savepoint() {
    let (consumer, shop, parking) = consumer_with(options(5));
    let batch = deliveries(vec![
        event("a-1", "a", 1),
        event("b-2", "b", 2),
        event("c-1", "c", 1),
    ]);
    let settled = outcomes(consumer.consume_batch(&batch).await);
    assert_eq!(settled[0], Settled::Applied);
    assert!(
        matches!(&settled[1], Settled::Retried { reason, .. } if reason.contains("version gap")),
        "{settled:?}"
    );
    assert_eq!(settled[2], Settled::Applied);
    assert_eq!(sorted_effects(&shop).await, ["a@1", "c@1"]);
    assert_eq!(shop.begun(), 1);
    assert_eq!(parking.count(consumer.name()).await.unwrap(), 0);
    // The gap left no claim behind: its next delivery, once the
    // predecessor applied, applies.
    let filled = deliveries(vec![event("b-1", "b", 1), event("b-2", "b", 2)]);
    for delivery in &filled {
        assert_eq!(consumer.consume(delivery).await.unwrap(), Settled::Applied);
    }
}

#[tokio::test]
async fn a_duplicate_inside_one_batch_applies_once() {
    let (consumer, shop, _) = consumer_with(options(5));
    let batch = deliveries(vec![
        plain("m-1", "m-1"),
        plain("twice", "twice"),
        plain("m-2", "m-2"),
        plain("twice", "twice"),
    ]);
    let settled = outcomes(consumer.consume_batch(&batch).await);
    assert_eq!(
        settled,
        [
            Settled::Applied,
            Settled::Applied,
            Settled::Applied,
            Settled::Duplicate
        ]
    );
    assert_eq!(sorted_effects(&shop).await, ["m-1", "m-2", "twice"]);
    assert_eq!(shop.begun(), 1);
}

/// The memory store decides at the commit: the batch that commits first
/// applies the message, and the other's commit is refused with nothing
/// written, so its messages go on one by one and find it applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_deliveries_of_one_message_in_two_batches_at_once_apply_once() {
    let (consumer, shop, _) = consumer_with(options(5));
    // The first batch claims `m` in its transaction and is held inside
    // its handler, its claim uncommitted.
    let (entered, go) = shop.hold("m");
    let first = tokio::spawn({
        let consumer = consumer.clone();
        async move {
            let batch = deliveries(vec![plain("m", "m")]);
            outcomes(consumer.consume_batch(&batch).await)
        }
    });
    tokio::time::timeout(PATIENCE, entered.notified())
        .await
        .expect("the first batch reached its handler");
    // The second batch claims `m` too, and commits first.
    let batch = deliveries(vec![plain("other", "other"), plain("m", "m")]);
    let second = outcomes(consumer.consume_batch(&batch).await);
    assert_eq!(second, [Settled::Applied, Settled::Applied]);
    go.notify_one();
    assert_eq!(first.await.unwrap(), [Settled::Duplicate]);
    assert_eq!(sorted_effects(&shop).await, ["m", "other"]);
    // Two transactions: the refused batch's message, on its own, found
    // its record completed before it opened another.
    assert_eq!(shop.begun(), 2);
}

#[tokio::test]
async fn a_batch_with_nothing_parked_lists_the_parking_store_once_not_per_event() {
    let (consumer, _, parking) = MemoryBackend.consumer(options(1)).await;
    let batch = deliveries(
        (0..10)
            .map(|n| event(&format!("o{n}-1"), &format!("o{n}"), 1))
            .collect(),
    );
    let settled = outcomes(consumer.consume_batch(&batch).await);
    assert_eq!(settled, vec![Settled::Applied; 10]);
    assert_eq!(parking.listings(), 1);
}

#[tokio::test]
async fn a_batch_releases_what_waits_behind_each_of_its_events_once_anything_is_parked() {
    let (consumer, shop, parking) = MemoryBackend.consumer(options(1)).await;
    // Versions 2 of two aggregates arrive first and are parked as gaps.
    for early in deliveries(vec![event("b-2", "b", 2), event("d-2", "d", 2)]) {
        let settled = consumer.consume(&early).await.unwrap();
        assert!(matches!(settled, Settled::Parked { .. }), "{settled:?}");
    }
    let batch = deliveries(vec![
        event("a-1", "a", 1),
        event("b-1", "b", 1),
        event("c-1", "c", 1),
        event("d-1", "d", 1),
    ]);
    let settled = outcomes(consumer.consume_batch(&batch).await);
    assert_eq!(settled, vec![Settled::Applied; 4]);
    assert_eq!(
        sorted_effects(&shop).await,
        ["a@1", "b@1", "b@2", "c@1", "d@1", "d@2"]
    );
    assert!(consumer.parked(None, 10).await.unwrap().is_empty());
    assert!(parking.listings() > 1);
}
