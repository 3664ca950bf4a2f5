//! The consumer's batches on DynamoDB (moto): each message's claim, its
//! writes and its completion join one `TransactWriteItems` per batch (the
//! claim a consistent read, its write conditioned on what it read); a
//! poison message parks only itself, a duplicate inside a batch applies
//! once, a message claimed in two batches at once applies once (the batch
//! that commits second is cancelled by the claim's condition and falls back
//! to one message per transaction, where the message is a duplicate), a
//! refused commit falls back to one message per transaction, a batch over
//! DynamoDB's 100 items commits in several, messages of one aggregate in one
//! batch apply in order (one write per item: the second waits for the next
//! transaction), and sixteen batches at once apply every version of every
//! aggregate once, in order.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

/// The consumer's in-process broker, from its own tests.
#[path = "../../idem-consumer/tests/common/mod.rs"]
mod broker;
mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker::{Broker, TestSource, deliveries, event, outcomes, plain};
use idem_consumer::{Consumer, ConsumerOptions, Handled, Handler, RedeliveryHorizon, Settled};
use idem_core::store::{InboundMessage, VersionCheck, VersionStore};
use idem_core::{HandlerError, StoreError, async_trait};
use idem_dynamo::aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, Put, TransactWriteItem,
};
use idem_dynamo::{DynamoStore, DynamoTransaction, VersionedItems};
use idem_memory::MemoryParking;
use tokio::sync::Notify;

/// Generous: the machine running these is busy, and moto is one process.
const PATIENCE: Duration = Duration::from_secs(120);

/// The payload of a message whose writes carry a condition that fails:
/// its transaction's commit is refused.
const REFUSED_AT_COMMIT: &str = "refused at commit";

/// The prefix of an effect item's key.
const EFFECT: &str = "effect#";

/// A held message's gates: notified on entry, then waits for the second.
type Gates = (Arc<Notify>, Arc<Notify>);

/// Writes one effect item per applied message (and steps its aggregate's
/// version item, for an event) in the inbox's transaction; counts the
/// transactions it opens.
#[derive(Clone)]
struct Books {
    inbox: DynamoStore,
    versions: VersionedItems,
    domain: String,
    fail: Arc<Mutex<HashMap<String, u32>>>,
    hold: Arc<Mutex<HashMap<String, Gates>>>,
    begun: Arc<AtomicU64>,
}

#[async_trait]
impl Handler for Books {
    type Tx = DynamoTransaction;

    async fn begin(&self) -> Result<DynamoTransaction, StoreError> {
        self.begun.fetch_add(1, Ordering::SeqCst);
        self.inbox.begin().await
    }

    async fn handle(
        &self,
        message: &InboundMessage,
        mut tx: DynamoTransaction,
    ) -> Result<(DynamoTransaction, Handled), HandlerError> {
        let id = message.id().as_str().to_string();
        let gates = self.hold.lock().unwrap().remove(&id);
        if let Some((entered, go)) = gates {
            entered.notify_one();
            go.notified().await;
        }
        if let Some(left) = self.fail.lock().unwrap().get_mut(&id).filter(|n| **n > 0) {
            *left -= 1;
            return Err(format!("{id} is refused").into());
        }
        let (aggregate, version) = match (message.aggregate(), message.version()) {
            (Some(aggregate), Some(version)) => {
                let check = self.versions.advance(&mut tx, aggregate, version).await?;
                if check != VersionCheck::Apply {
                    return Ok((tx, check.into()));
                }
                (aggregate.to_string(), version)
            }
            _ => (id.clone(), 0),
        };
        let effect = Put::builder()
            .table_name(&self.domain)
            .item(
                "pk",
                AttributeValue::S(format!("{EFFECT}{id}#{}", uuid::Uuid::new_v4().simple())),
            )
            .item("aggregate", AttributeValue::S(aggregate))
            .item("version", AttributeValue::N(version.to_string()))
            .build()?;
        tx.push(TransactWriteItem::builder().put(effect).build());
        if message.payload() == REFUSED_AT_COMMIT.as_bytes() {
            let never = ConditionCheck::builder()
                .table_name(&self.domain)
                .key("pk", AttributeValue::S("never written".into()))
                .condition_expression("attribute_exists(pk)")
                .build()?;
            tx.push(TransactWriteItem::builder().condition_check(never).build());
        }
        Ok((tx, Handled::Applied))
    }
}

/// A consumer over tables of its own: its books.
async fn consumer(options: ConsumerOptions) -> (Consumer<Books>, Books) {
    let inbox = common::own_store("cb-inbox").await;
    let domain = common::app_table("cb-domain", false).await;
    let versions = VersionedItems::keyed(&domain, "version", |aggregate| {
        HashMap::from([(
            "pk".to_string(),
            AttributeValue::S(format!("agg#{aggregate}")),
        )])
    })
    .unwrap();
    let books = Books {
        inbox: inbox.clone(),
        versions,
        domain,
        fail: Arc::default(),
        hold: Arc::default(),
        begun: Arc::default(),
    };
    let consumer = Consumer::with_options(
        "batches",
        Arc::new(inbox),
        Arc::new(MemoryParking::new()),
        books.clone(),
        options,
    )
    .unwrap();
    (consumer, books)
}

impl Books {
    /// Every item of the domain table.
    async fn items(&self) -> Vec<HashMap<String, AttributeValue>> {
        common::scan(&self.domain).await
    }

    /// The messages with an effect, each as often as it had one, sorted.
    async fn effects(&self) -> Vec<String> {
        let mut effects: Vec<String> = self
            .items()
            .await
            .iter()
            .filter_map(|item| {
                let pk = item["pk"].as_s().unwrap();
                let (id, _) = pk.strip_prefix(EFFECT)?.rsplit_once('#')?;
                Some(id.to_string())
            })
            .collect();
        effects.sort();
        effects
    }

    /// Each aggregate's version.
    async fn versions(&self) -> HashMap<String, u64> {
        self.items()
            .await
            .iter()
            .filter_map(|item| {
                let aggregate = item["pk"].as_s().unwrap().strip_prefix("agg#")?;
                let version = item["version"].as_n().unwrap().parse().unwrap();
                Some((aggregate.to_string(), version))
            })
            .collect()
    }

    async fn delete(self) {
        common::delete_table(self.inbox.table()).await;
        common::delete_table(&self.domain).await;
    }
}

fn options(max_deliveries: u32) -> ConsumerOptions {
    ConsumerOptions::default()
        .max_deliveries(max_deliveries)
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
}

fn sorted(mut ids: Vec<String>) -> Vec<String> {
    ids.sort();
    ids
}

#[tokio::test]
async fn a_batch_commits_once_and_its_redelivery_is_all_duplicates() {
    let (consumer, books) = consumer(options(5)).await;
    let inbox = books.inbox.table().to_string();
    let ids: Vec<String> = (0..10).map(|n| format!("m-{n}")).collect();
    let batch = deliveries(ids.iter().map(|id| plain(id, id)).collect());
    let before = common::requests(&inbox).await;
    let settled = outcomes(consumer.consume_batch(&batch).await);
    assert_eq!(settled, vec![Settled::Applied; 10]);
    assert_eq!(books.begun.load(Ordering::SeqCst), 1, "one transaction");
    // Each claim one consistent read, then one TransactWriteItems.
    assert_eq!(common::requests(&inbox).await - before, 10 + 1);
    assert_eq!(books.effects().await, sorted(ids.clone()));
    // Killed between the commit and the acks: the broker delivers the
    // batch again, and nothing applies twice (one read each, nothing to
    // commit).
    let again = deliveries(ids.iter().map(|id| plain(id, id)).collect());
    let before = common::requests(&inbox).await;
    let settled = outcomes(consumer.consume_batch(&again).await);
    assert_eq!(settled, vec![Settled::Duplicate; 10]);
    assert_eq!(common::requests(&inbox).await - before, 10);
    assert_eq!(books.effects().await.len(), 10);
    books.delete().await;
}

#[tokio::test]
async fn a_poison_message_inside_a_batch_parks_only_itself_and_its_batch_mates_apply() {
    let (consumer, books) = consumer(options(1)).await;
    books
        .fail
        .lock()
        .unwrap()
        .insert("m-2".to_string(), u32::MAX);
    let batch = deliveries((0..5).map(|n| plain(&format!("m-{n}"), "x")).collect());
    let settled = outcomes(consumer.consume_batch(&batch).await);
    assert_eq!(settled[..2], [Settled::Applied, Settled::Applied]);
    assert!(
        matches!(&settled[2], Settled::Parked { reason } if reason.contains("m-2 is refused")),
        "{settled:?}"
    );
    assert_eq!(settled[3..], [Settled::Applied, Settled::Applied]);
    assert_eq!(
        books.effects().await,
        ["m-0", "m-1", "m-3", "m-4"],
        "the poison message's writes never committed"
    );
    // The failed handler dropped the transaction it was given: the batch
    // began once more without it, and committed once.
    assert_eq!(books.begun.load(Ordering::SeqCst), 2);
    let parked = consumer.parked(None, 10).await.unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].parked.message.id().as_str(), "m-2");
    books.delete().await;
}

#[tokio::test]
async fn a_gap_inside_a_batch_rolls_back_only_its_savepoint() {
    let (consumer, books) = consumer(options(5)).await;
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
    assert_eq!(books.effects().await, ["a-1", "c-1"]);
    assert_eq!(books.begun.load(Ordering::SeqCst), 1);
    // The gap left no claim behind: its next delivery, once the
    // predecessor applied, applies.
    let filled = deliveries(vec![event("b-1", "b", 1), event("b-2", "b", 2)]);
    for delivery in &filled {
        assert_eq!(consumer.consume(delivery).await.unwrap(), Settled::Applied);
    }
    books.delete().await;
}

#[tokio::test]
async fn a_duplicate_inside_one_batch_applies_once() {
    let (consumer, books) = consumer(options(5)).await;
    let batch = deliveries(vec![
        plain("m-1", "x"),
        plain("twice", "y"),
        plain("m-2", "x"),
        plain("twice", "y"),
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
    assert_eq!(books.effects().await, ["m-1", "m-2", "twice"]);
    assert_eq!(books.begun.load(Ordering::SeqCst), 1);
    books.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_deliveries_of_one_message_in_two_batches_at_once_apply_once() {
    let (consumer, books) = consumer(options(5)).await;
    let (entered, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    books
        .hold
        .lock()
        .unwrap()
        .insert("m".to_string(), (entered.clone(), go.clone()));
    // The first batch claims `m` in its transaction (it read no record)
    // and is held inside its handler, nothing committed.
    let first = tokio::spawn({
        let consumer = consumer.clone();
        async move {
            let batch = deliveries(vec![plain("m", "x")]);
            outcomes(consumer.consume_batch(&batch).await)
        }
    });
    tokio::time::timeout(PATIENCE, entered.notified())
        .await
        .expect("the first batch reached its handler");
    // The second batch claims `m` too (it reads no record either) and
    // commits first.
    let batch = deliveries(vec![plain("other", "x"), plain("m", "x")]);
    let second = outcomes(consumer.consume_batch(&batch).await);
    assert_eq!(second, [Settled::Applied, Settled::Applied]);
    // The first batch's commit is cancelled by its claim's condition; on
    // its own, the message is a duplicate.
    go.notify_one();
    assert_eq!(first.await.unwrap(), [Settled::Duplicate]);
    assert_eq!(books.effects().await, ["m", "other"]);
    // Two batches; on its own, the duplicate opens no transaction.
    assert_eq!(books.begun.load(Ordering::SeqCst), 2);
    books.delete().await;
}

#[tokio::test]
async fn a_refused_commit_falls_back_to_one_message_per_transaction() {
    let (consumer, books) = consumer(options(1)).await;
    let batch = deliveries(vec![
        plain("m-0", "x"),
        plain("bad", REFUSED_AT_COMMIT),
        plain("m-2", "x"),
        plain("m-3", "x"),
    ]);
    let settled = outcomes(consumer.consume_batch(&batch).await);
    assert_eq!(settled[0], Settled::Applied);
    assert!(
        matches!(&settled[1], Settled::Parked { reason } if reason.contains("ConditionalCheckFailed")),
        "the cancelled item's cause is named: {settled:?}"
    );
    assert_eq!(settled[2..], [Settled::Applied, Settled::Applied]);
    assert_eq!(books.effects().await, ["m-0", "m-2", "m-3"]);
    // The batch's transaction, then one per message.
    assert_eq!(books.begun.load(Ordering::SeqCst), 1 + 4);
    books.delete().await;
}

#[tokio::test]
async fn a_batch_over_a_transactions_100_items_commits_in_several() {
    let (consumer, books) = consumer(options(5)).await;
    // Two items a message (its record and its effect): 50 a transaction.
    let ids: Vec<String> = (0..64).map(|n| format!("m-{n:02}")).collect();
    let batch = deliveries(ids.iter().map(|id| plain(id, "x")).collect());
    let settled = outcomes(consumer.consume_batch(&batch).await);
    // Every message applies once, in two transactions (one of 64 messages
    // would be refused: 128 items).
    assert_eq!(books.effects().await, ids);
    let (first, second) = settled.split_at(50);
    let each = |part: &[Settled], outcome: Settled| part.iter().all(|s| *s == outcome);
    if each(&settled, Settled::Applied) {
        assert_eq!(books.begun.load(Ordering::SeqCst), 2);
    } else {
        // On a loaded machine moto can answer a commit after the store's
        // operation timeout: its outcome is unknown, so its messages go
        // one by one and each finds itself applied (a duplicate, with no
        // transaction of its own); the other transaction's apply.
        let one_lost = (each(first, Settled::Duplicate) && each(second, Settled::Applied))
            || (each(first, Settled::Applied) && each(second, Settled::Duplicate));
        assert!(one_lost, "{settled:?}");
    }
    books.delete().await;
}

#[tokio::test]
async fn messages_of_one_aggregate_in_one_batch_apply_in_order() {
    let (consumer, books) = consumer(options(5)).await;
    let batch = deliveries(vec![
        event("a-1", "a", 1),
        event("a-2", "a", 2),
        event("b-1", "b", 1),
        event("a-3", "a", 3),
    ]);
    let settled = outcomes(consumer.consume_batch(&batch).await);
    assert_eq!(settled, vec![Settled::Applied; 4]);
    // a-2 checks `a` again: the first transaction commits a-1 without
    // it; the second takes a-2 and b-1 and commits without a-3.
    assert_eq!(books.begun.load(Ordering::SeqCst), 3);
    let versions = books.versions().await;
    assert_eq!((versions["a"], versions["b"]), (3, 1));
    assert_eq!(books.effects().await, ["a-1", "a-2", "a-3", "b-1"]);
    books.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_batches_at_once_apply_every_version_of_every_aggregate_once_in_order() {
    // Fewer than on Postgres: moto is one Python process.
    const AGGREGATES: u64 = 20;
    const VERSIONS: u64 = 10;
    let (consumer, books) = consumer(options(20).concurrency(16)).await;
    let broker = Broker::default();
    for version in 1..=VERSIONS {
        for aggregate in 0..AGGREGATES {
            let id = format!("agg-{aggregate}@{version}");
            broker.publish(event(&id, &format!("agg-{aggregate}"), version));
        }
    }
    broker.close();
    let mut source = TestSource {
        broker: broker.clone(),
        horizon: RedeliveryHorizon::new("test", Duration::from_secs(1)),
    };
    tokio::time::timeout(
        PATIENCE,
        consumer.run(&mut source, std::future::pending::<()>()),
    )
    .await
    .expect("every delivery handled within the patience")
    .unwrap();
    let versions = books.versions().await;
    assert_eq!(versions.len() as u64, AGGREGATES);
    assert!(
        versions.values().all(|v| *v == VERSIONS),
        "every aggregate at {VERSIONS}: {versions:?}"
    );
    let effects = books.effects().await;
    let mut distinct = effects.clone();
    distinct.dedup();
    assert_eq!(distinct.len() as u64, AGGREGATES * VERSIONS, "no gap");
    assert_eq!(distinct, effects, "nothing applied twice");
    assert!(consumer.parked(None, 10).await.unwrap().is_empty());
    // Batches, not one transaction per message.
    let begun = books.begun.load(Ordering::SeqCst);
    assert!(
        begun < AGGREGATES * VERSIONS,
        "{begun} transactions for {} messages",
        AGGREGATES * VERSIONS
    );
    books.delete().await;
}
