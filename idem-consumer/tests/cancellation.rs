//! Consumers over a Postgres inbox with version checks, their tasks
//! aborted at random while they consume: every event applies once, in
//! order, its effect and its version step committed with its inbox record,
//! and no pooled connection is ever handed out inside a transaction block.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{Broker, TestSource, event};
use idem_consumer::{Consumer, ConsumerOptions, Handled, Handler, RedeliveryHorizon, async_trait};
use idem_core::store::{InboundMessage, VersionCheck, VersionStore};
use idem_core::{HandlerError, StoreError};
use idem_memory::MemoryParking;
use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool, Row};
use idem_postgres::{PgTransaction, PostgresStore, VersionedTable};
use tokio::time::Instant;

const AGGREGATES: u64 = 8;
const VERSIONS: u64 = 8;
/// Generous: the machine running these is busy.
const DEADLINE: Duration = Duration::from_secs(180);

/// Applies an order event on its predecessor: its version step and one
/// effect row, in the inbox's transaction.
struct Orders {
    inbox: PostgresStore,
    versions: VersionedTable,
    table: String,
}

#[async_trait]
impl Handler for Orders {
    type Tx = PgTransaction;

    async fn begin(&self) -> Result<PgTransaction, StoreError> {
        self.inbox.begin().await
    }

    async fn handle(
        &self,
        message: &InboundMessage,
        mut tx: PgTransaction,
    ) -> Result<(PgTransaction, Handled), HandlerError> {
        let (Some(order), Some(version)) = (message.aggregate(), message.version()) else {
            return Err("an event without its version".into());
        };
        let check = self.versions.advance(&mut *tx, order, version).await?;
        if check == VersionCheck::Apply {
            if version == 1 {
                sqlx::query(AssertSqlSafe(format!(
                    "INSERT INTO {} (id, version) VALUES ($1, 1)",
                    self.table
                )))
                .bind(order)
                .execute(&mut *tx)
                .await?;
            }
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {}_effects (aggregate, version) VALUES ($1, $2)",
                self.table
            )))
            .bind(order)
            .bind(i64::try_from(version)?)
            .execute(&mut *tx)
            .await?;
            // A statement that takes a moment, for aborts to land inside.
            sqlx::query("SELECT pg_sleep(0.001)")
                .execute(&mut *tx)
                .await?;
        }
        Ok((tx, check.into()))
    }
}

/// Whether the session is outside any transaction block, read by the
/// server (a simple-protocol statement's own transaction starts with it).
async fn outside_any_block(conn: &mut sqlx::PgConnection) -> bool {
    let row = sqlx::raw_sql("SELECT now() = statement_timestamp()")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    row.get::<bool, _>(0)
}

/// A guarded pool of two connections counting hand-outs inside a block.
async fn watched_pool() -> (PgPool, Arc<AtomicU64>) {
    let url = std::env::var("IDEM_POSTGRES_URL")
        .expect("IDEM_POSTGRES_URL is not set (scripts/test sets it)");
    let options: PgConnectOptions = url.parse().unwrap();
    let inside = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&inside);
    let pool = idem_postgres::guarded(
        PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(30)),
    )
    .before_acquire(move |conn, _| {
        let counter = Arc::clone(&counter);
        Box::pin(async move {
            if !outside_any_block(conn).await {
                counter.fetch_add(1, Ordering::SeqCst);
            }
            Ok(true)
        })
    })
    .connect_with(options)
    .await
    .unwrap();
    (pool, inside)
}

/// A pseudo-random number below `n`.
fn below(n: u64) -> u64 {
    (uuid::Uuid::new_v4().as_u128() % u128::from(n.max(1))) as u64
}

fn source(broker: &Broker) -> TestSource {
    TestSource {
        broker: broker.clone(),
        horizon: RedeliveryHorizon::new("test", Duration::from_secs(1))
            .with_max_deliveries(u32::MAX),
    }
}

/// Two consumers of one queue: one runs `Consumer::run` in a task aborted
/// every 20–200 ms and started again; the other consumes deliveries one
/// by one, each in a task aborted at a random point (a process dying
/// mid-delivery; the broker delivers again what was never settled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_aborted_at_random_apply_every_version_once_in_order() {
    let (pool, inside) = watched_pool().await;
    let inbox = PostgresStore::new(pool.clone());
    inbox.migrate().await.unwrap();
    let table = format!("cc_{}", uuid::Uuid::new_v4().simple());
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {table} (id text PRIMARY KEY, version bigint NOT NULL); \
         CREATE TABLE {table}_effects (aggregate text NOT NULL, version bigint NOT NULL)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let handler = Orders {
        inbox: inbox.clone(),
        versions: VersionedTable::new(&table, "id", "version").unwrap(),
        table: table.clone(),
    };
    let options = ConsumerOptions::default()
        .max_deliveries(u32::MAX)
        .backoff(Duration::from_millis(1), Duration::from_millis(20))
        .lease(Duration::from_secs(2));
    let consumer = Consumer::with_options(
        &table,
        Arc::new(inbox),
        Arc::new(MemoryParking::new()),
        handler,
        options,
    )
    .unwrap();
    let broker = Broker::default();
    broker.redeliver_unsettled();
    for version in 1..=VERSIONS {
        for aggregate in 0..AGGREGATES {
            let id = format!("order-{aggregate}@{version}");
            broker.publish(event(&id, &format!("order-{aggregate}"), version));
        }
    }

    let applied = || async {
        sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!(
            "SELECT count(*) FROM {table}_effects"
        )))
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let deadline = Instant::now() + DEADLINE;
    let mut runs_aborted = 0;
    let deliveries_aborted = Arc::new(AtomicU64::new(0));
    let one_by_one = tokio::spawn({
        let (consumer, broker) = (consumer.clone(), broker.clone());
        let aborted = Arc::clone(&deliveries_aborted);
        async move {
            loop {
                let Some(delivery) = broker.deliver() else {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                };
                let consumer = consumer.clone();
                let task = tokio::spawn(async move { consumer.consume(&delivery).await });
                if below(3) == 0 {
                    tokio::time::sleep(Duration::from_micros(below(5_000))).await;
                    task.abort();
                    aborted.fetch_add(1, Ordering::SeqCst);
                }
                let _ = task.await;
            }
        }
    });
    while applied().await < i64::try_from(AGGREGATES * VERSIONS).unwrap() {
        assert!(Instant::now() < deadline, "not every event applied in time");
        let running = tokio::spawn({
            let (consumer, mut source) = (consumer.clone(), source(&broker));
            async move { consumer.run(&mut source, std::future::pending()).await }
        });
        tokio::time::sleep(Duration::from_millis(20 + below(180))).await;
        running.abort();
        let _ = running.await;
        runs_aborted += 1;
    }
    one_by_one.abort();
    let _ = one_by_one.await;
    assert!(runs_aborted > 0 && deliveries_aborted.load(Ordering::SeqCst) > 0);

    let at: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT id, version FROM {table} ORDER BY id"
    )))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(at.len() as u64, AGGREGATES, "{at:?}");
    assert!(
        at.iter().all(|(_, v)| *v == VERSIONS as i64),
        "every aggregate at its last version: {at:?}"
    );
    let effects: Vec<(String, i64, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT aggregate, version, count(*) FROM {table}_effects GROUP BY 1, 2 ORDER BY 1, 2"
    )))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(effects.len() as u64, AGGREGATES * VERSIONS, "{effects:?}");
    assert!(
        effects.iter().all(|(_, _, n)| *n == 1),
        "applied twice: {effects:?}"
    );
    assert_eq!(
        inside.load(Ordering::SeqCst),
        0,
        "handed out inside a block"
    );
}
