//! The consumer's batches on Postgres: one transaction and one commit per
//! batch, each message's claim and writes under a savepoint of its own; a
//! poison message parks only itself, a duplicate inside a batch applies
//! once, a message claimed in two batches at once applies once (the second
//! claim waits on the first's uncommitted inbox row), a refused commit
//! falls back to one message per transaction, and sixteen batches at once
//! apply every version of every aggregate once, in order.

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
use idem_memory::MemoryParking;
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool};
use idem_postgres::{PgTransaction, PostgresOptions, PostgresStore, VersionedTable};
use tokio::sync::Notify;

/// Generous: the machine running these is busy.
const PATIENCE: Duration = Duration::from_secs(120);

/// The payload of a message whose writes break a deferred constraint: its
/// transaction's commit is refused.
const REFUSED_AT_COMMIT: &str = "refused at commit";

/// A held message's gates: notified on entry, then waits for the second.
type Gates = (Arc<Notify>, Arc<Notify>);

/// Writes one effect row per applied message (and steps its aggregate's
/// version, for an event) in the inbox's transaction; counts the
/// transactions it opens.
#[derive(Clone)]
struct Books {
    inbox: PostgresStore,
    versions: VersionedTable,
    table: String,
    fail: Arc<Mutex<HashMap<String, u32>>>,
    hold: Arc<Mutex<HashMap<String, Gates>>>,
    begun: Arc<AtomicU64>,
}

#[async_trait]
impl Handler for Books {
    type Tx = PgTransaction;

    async fn begin(&self) -> Result<PgTransaction, StoreError> {
        self.begun.fetch_add(1, Ordering::SeqCst);
        self.inbox.begin().await
    }

    async fn handle(
        &self,
        message: &InboundMessage,
        mut tx: PgTransaction,
    ) -> Result<(PgTransaction, Handled), HandlerError> {
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
                let check = self.versions.advance(&mut *tx, aggregate, version).await?;
                if check != VersionCheck::Apply {
                    return Ok((tx, check.into()));
                }
                if version == 1 {
                    sqlx::query(AssertSqlSafe(format!(
                        "INSERT INTO {} (id, version) VALUES ($1, 1)",
                        self.table
                    )))
                    .bind(aggregate)
                    .execute(&mut *tx)
                    .await?;
                }
                (aggregate.to_string(), i64::try_from(version)?)
            }
            _ => (id.clone(), 0),
        };
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {}_effects (aggregate, version, message) VALUES ($1, $2, $3)",
            self.table
        )))
        .bind(&aggregate)
        .bind(version)
        .bind(&id)
        .execute(&mut *tx)
        .await?;
        if message.payload() == REFUSED_AT_COMMIT.as_bytes() {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {}_deferred (k) VALUES (1), (1)",
                self.table
            )))
            .execute(&mut *tx)
            .await?;
        }
        Ok((tx, Handled::Applied))
    }
}

/// A consumer over fresh tables: its books and the pool.
async fn consumer(options: ConsumerOptions, connections: u32) -> (Consumer<Books>, Books, PgPool) {
    let pool = common::pool_for(&common::url(), connections).await;
    let table = format!("cb_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
    let inbox = PostgresStore::with_options(
        pool.clone(),
        PostgresOptions::default().table(&format!("{table}_inbox")),
    )
    .unwrap();
    inbox.migrate().await.unwrap();
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {table} (id text PRIMARY KEY, version bigint NOT NULL); \
         CREATE TABLE {table}_effects (aggregate text NOT NULL, version bigint NOT NULL, \
                                       message text NOT NULL); \
         CREATE TABLE {table}_deferred (k int, \
             CONSTRAINT {table}_once UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let books = Books {
        inbox: inbox.clone(),
        versions: VersionedTable::new(&table, "id", "version").unwrap(),
        table: table.clone(),
        fail: Arc::default(),
        hold: Arc::default(),
        begun: Arc::default(),
    };
    let consumer = Consumer::with_options(
        &table,
        Arc::new(inbox),
        Arc::new(MemoryParking::new()),
        books.clone(),
        options,
    )
    .unwrap();
    (consumer, books, pool)
}

fn options(max_deliveries: u32) -> ConsumerOptions {
    ConsumerOptions::default()
        .max_deliveries(max_deliveries)
        .backoff(Duration::from_millis(10), Duration::from_millis(50))
}

/// The messages with an effect, each as often as it had one, sorted.
async fn effects(pool: &PgPool, books: &Books) -> Vec<String> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT message FROM {}_effects ORDER BY message",
        books.table
    )))
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_batch_commits_once_and_its_redelivery_is_all_duplicates() {
    let (consumer, books, pool) = consumer(options(5), 4).await;
    let ids: Vec<String> = (0..10).map(|n| format!("m-{n}")).collect();
    let batch = deliveries(ids.iter().map(|id| plain(id, id)).collect());
    let settled = outcomes(consumer.consume_batch(&batch).await);
    assert_eq!(settled, vec![Settled::Applied; 10]);
    assert_eq!(books.begun.load(Ordering::SeqCst), 1, "one transaction");
    assert_eq!(effects(&pool, &books).await, {
        let mut sorted = ids.clone();
        sorted.sort();
        sorted
    });
    // Killed between the commit and the acks: the broker delivers the
    // batch again, and nothing applies twice.
    let again = deliveries(ids.iter().map(|id| plain(id, id)).collect());
    let settled = outcomes(consumer.consume_batch(&again).await);
    assert_eq!(settled, vec![Settled::Duplicate; 10]);
    assert_eq!(effects(&pool, &books).await.len(), 10);
}

#[tokio::test]
async fn a_poison_message_inside_a_batch_parks_only_itself_and_its_batch_mates_apply() {
    let (consumer, books, pool) = consumer(options(1), 4).await;
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
        effects(&pool, &books).await,
        ["m-0", "m-1", "m-3", "m-4"],
        "the poison message's writes never committed"
    );
    // The batch at once failed in its handler and began again one message
    // at a time; there the failed handler dropped the transaction it was
    // given, and the batch began once more without it, and committed once.
    assert_eq!(books.begun.load(Ordering::SeqCst), 3);
    let parked = consumer.parked(None, 10).await.unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].parked.message.id().as_str(), "m-2");
}

#[tokio::test]
async fn a_gap_inside_a_batch_rolls_back_only_its_savepoint() {
    let (consumer, books, pool) = consumer(options(5), 4).await;
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
    assert_eq!(effects(&pool, &books).await, ["a-1", "c-1"]);
    // The batch ran without savepoints until the gap had to be undone
    // alone: then it began again with one per message, and committed once.
    assert_eq!(books.begun.load(Ordering::SeqCst), 2);
    // The gap left no claim behind: its next delivery, once the
    // predecessor applied, applies.
    let filled = deliveries(vec![event("b-1", "b", 1), event("b-2", "b", 2)]);
    for delivery in &filled {
        assert_eq!(consumer.consume(delivery).await.unwrap(), Settled::Applied);
    }
}

#[tokio::test]
async fn a_duplicate_inside_one_batch_applies_once() {
    let (consumer, books, pool) = consumer(options(5), 4).await;
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
    assert_eq!(effects(&pool, &books).await, ["m-1", "m-2", "twice"]);
    assert_eq!(books.begun.load(Ordering::SeqCst), 1);
}

/// Whether a claim of `books`' inbox is waiting on a lock (another
/// transaction's uncommitted inbox row), read by the server.
async fn a_claim_waits_on_a_lock(pool: &PgPool, books: &Books) -> bool {
    sqlx::query_scalar::<_, bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
         WHERE wait_event_type = 'Lock' AND position($1 in query) > 0)",
    )
    .bind(format!("{}_inbox_claim(", books.table))
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_deliveries_of_one_message_in_two_batches_at_once_apply_once() {
    let (consumer, books, pool) = consumer(options(5), 6).await;
    let (entered, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    books
        .hold
        .lock()
        .unwrap()
        .insert("m".to_string(), (entered.clone(), go.clone()));
    // The first batch claims `m` in its transaction and is held inside
    // its handler, its claim uncommitted.
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
    // The second batch's claim of `m` waits on the first's inbox row.
    let second = tokio::spawn({
        let consumer = consumer.clone();
        async move {
            let batch = deliveries(vec![plain("other", "x"), plain("m", "x")]);
            outcomes(consumer.consume_batch(&batch).await)
        }
    });
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !a_claim_waits_on_a_lock(&pool, &books).await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second claim never waited"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    go.notify_one();
    assert_eq!(first.await.unwrap(), [Settled::Applied]);
    assert_eq!(
        second.await.unwrap(),
        [Settled::Applied, Settled::Duplicate]
    );
    assert_eq!(effects(&pool, &books).await, ["m", "other"]);
}

#[tokio::test]
async fn a_refused_commit_falls_back_to_one_message_per_transaction() {
    let (consumer, books, pool) = consumer(options(1), 4).await;
    let batch = deliveries(vec![
        plain("m-0", "x"),
        plain("bad", REFUSED_AT_COMMIT),
        plain("m-2", "x"),
        plain("m-3", "x"),
    ]);
    let settled = outcomes(consumer.consume_batch(&batch).await);
    assert_eq!(settled[0], Settled::Applied);
    assert!(
        matches!(&settled[1], Settled::Parked { reason } if reason.contains("unique")),
        "{settled:?}"
    );
    assert_eq!(settled[2..], [Settled::Applied, Settled::Applied]);
    assert_eq!(effects(&pool, &books).await, ["m-0", "m-2", "m-3"]);
    // The batch's transaction, then one per message.
    assert_eq!(books.begun.load(Ordering::SeqCst), 1 + 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_batches_at_once_apply_every_version_of_every_aggregate_once_in_order() {
    const AGGREGATES: u64 = 100;
    const VERSIONS: u64 = 50;
    let (consumer, books, pool) = consumer(options(5).concurrency(16), 20).await;
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
    let at: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT id, version FROM {} ORDER BY id",
        books.table
    )))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(at.len() as u64, AGGREGATES);
    assert!(
        at.iter().all(|(_, v)| *v == VERSIONS as i64),
        "every aggregate at {VERSIONS}: {at:?}"
    );
    let counts: Vec<(String, i64, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT aggregate, version, count(*) FROM {}_effects GROUP BY 1, 2",
        books.table
    )))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(counts.len() as u64, AGGREGATES * VERSIONS, "no gap");
    assert!(
        counts.iter().all(|(_, _, n)| *n == 1),
        "nothing applied twice"
    );
    // Batches, not one transaction per message.
    let begun = books.begun.load(Ordering::SeqCst);
    assert!(
        begun < AGGREGATES * VERSIONS / 2,
        "{begun} transactions for {} messages",
        AGGREGATES * VERSIONS
    );
}
