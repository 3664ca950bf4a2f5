//! End to end on real servers: orders over HTTP (idem-http, retried with
//! the same key) → the business transaction with its outbox row → the
//! relay (which fails after the broker's confirmation, so it publishes
//! again past JetStream's duplicate window) → JetStream → the consumer
//! (inbox, version check, one delivery whose consumer dies between its
//! commit and its ack) → the consumer's shipment row. Counted: every
//! committed order event has exactly one effect, in version order per
//! order; nothing lost, nothing parked, nothing pending.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use axum::routing::post;
use axum::{Extension, Router};
use http::StatusCode;
use idem_conformance::consumers::KilledBeforeAck;
use idem_consumer::{
    Consumed, Consumer, ConsumerOptions, Delivery, Handled, Handler, Source, async_trait,
};
use idem_core::store::{
    IdempotencyStore, InboundMessage, NewMessage, OutboxMessage, OutboxStore, VersionCheck,
    VersionStore,
};
use idem_core::{HandlerError, Idempotency, StoreError};
use idem_http::{IdempotencyLayer, IdempotencyTransaction};
use idem_nats::{JetStreamOptions, JetStreamPublisher, JetStreamSource};
use idem_outbox::{PublishError, Published, Publisher, Relay, RelayError, RelayOptions};
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool};
use idem_postgres::{
    PgTransaction, PostgresOptions, PostgresOutbox, PostgresOutboxOptions, PostgresParking,
    PostgresParkingOptions, PostgresStore, VersionedTable,
};

const ORDERS: usize = 12;
const STATUSES: [&str; 3] = ["placed", "paid", "shipped"];
/// Short, so the relay's second publish lands past it.
const WINDOW: Duration = Duration::from_millis(100);
const PATIENCE: Duration = Duration::from_secs(120);

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// Publishes, then fails the first batch as a relay killed before its mark
/// would leave it: the message is published again later.
struct FailsAfterConfirm {
    inner: JetStreamPublisher,
    failed: AtomicBool,
}

#[async_trait]
impl Publisher for FailsAfterConfirm {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>> {
        let results = self.inner.publish(batch).await;
        if self.failed.swap(true, Ordering::SeqCst) {
            return results;
        }
        results
            .into_iter()
            .map(|_| {
                Err(PublishError::new(
                    "nats",
                    "killed before its mark".to_string(),
                ))
            })
            .collect()
    }
}

/// The consumer's side: the shipment row at the event's version, and one
/// row per effect, so a second effect would show.
struct Shipping {
    inbox: PostgresStore,
    versions: VersionedTable,
    shipments: String,
    effects: String,
}

#[async_trait]
impl Handler for Shipping {
    type Tx = PgTransaction;

    async fn begin(&self) -> Result<PgTransaction, StoreError> {
        self.inbox.begin().await
    }

    async fn handle(
        &self,
        message: &InboundMessage,
        mut tx: PgTransaction,
    ) -> Result<(PgTransaction, Handled), HandlerError> {
        let order = message.aggregate().ok_or("no order")?;
        let version = message.version().ok_or("no version")?;
        let status = std::str::from_utf8(message.payload())?.to_string();
        let check = self.versions.advance(&mut *tx, order, version).await?;
        if check == VersionCheck::Apply {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {} (id, version, status) VALUES ($1, $2, $3) \
                 ON CONFLICT (id) DO UPDATE SET status = excluded.status",
                self.shipments
            )))
            .bind(order)
            .bind(i64::try_from(version)?)
            .bind(&status)
            .execute(&mut *tx)
            .await?;
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {} (id, version) VALUES ($1, $2)",
                self.effects
            )))
            .bind(order)
            .bind(i64::try_from(version)?)
            .execute(&mut *tx)
            .await?;
        }
        Ok((tx, check.into()))
    }
}

async fn sql(pool: &PgPool, statement: String) {
    sqlx::raw_sql(AssertSqlSafe(statement))
        .execute(pool)
        .await
        .unwrap();
}

async fn count(pool: &PgPool, query: String) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(query))
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_committed_order_event_has_one_effect_at_the_consumer() {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&env(
            "IDEM_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        ))
        .await
        .expect("connect to IDEM_POSTGRES_URL");
    let nats_url = env("IDEM_NATS_URL", "nats://127.0.0.1:4222");
    let run = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let table = |name: &str| format!("e2e_{name}_{run}");

    // The order service: HTTP records, orders, and the outbox, one database.
    let records = PostgresStore::with_options(
        pool.clone(),
        PostgresOptions::default().table(&table("records")),
    )
    .unwrap();
    records.migrate().await.unwrap();
    let outbox = Arc::new(
        PostgresOutbox::with_options(
            pool.clone(),
            PostgresOutboxOptions::default().table(&table("outbox")),
        )
        .unwrap(),
    );
    outbox.migrate().await.unwrap();
    let orders = table("orders");
    sql(
        &pool,
        format!("CREATE TABLE {orders} (id text PRIMARY KEY, status text NOT NULL)"),
    )
    .await;

    let upsert = format!(
        "INSERT INTO {orders} (id, status) VALUES ($1, $2) \
         ON CONFLICT (id) DO UPDATE SET status = excluded.status"
    );
    let route_outbox = outbox.clone();
    let handler = move |Extension(tx): Extension<IdempotencyTransaction<PgTransaction>>,
                        body: String| {
        let (upsert, outbox) = (upsert.clone(), route_outbox.clone());
        async move {
            let (order, status) = body.split_once(' ').unwrap();
            let mut tx = tx.lock().await.unwrap();
            sqlx::query(AssertSqlSafe(upsert))
                .bind(order)
                .bind(status)
                .execute(&mut **tx)
                .await
                .unwrap();
            let event =
                NewMessage::new(order, "order.changed", status.as_bytes().to_vec()).unwrap();
            outbox.enqueue_in(&mut tx, &event).await.unwrap();
            (StatusCode::CREATED, format!("{order} {status}"))
        }
    };
    let any: Arc<dyn IdempotencyStore> = Arc::new(records.clone());
    let layer = IdempotencyLayer::new(Idempotency::new(any)).in_transaction({
        let records = records.clone();
        move || records.begin()
    });
    let app = Router::new().route("/orders", post(handler)).layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    // Every order's three events, each request sent twice (a client retry
    // with the same key): the retry is a replay and enqueues nothing.
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut replays = 0;
    for status in STATUSES {
        for n in 0..ORDERS {
            for _attempt in 0..2 {
                let answer = client
                    .post(format!("{base}/orders"))
                    .header("idempotency-key", format!("\"order-{n}-{status}-{run}\""))
                    .body(format!("order-{n} {status}"))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(answer.status(), StatusCode::CREATED);
                replays += usize::from(answer.headers().contains_key("idempotent-replayed"));
            }
        }
    }
    let committed = ORDERS * STATUSES.len();
    assert_eq!(replays, committed);
    assert_eq!(outbox.stats().await.unwrap().pending, committed as u64);

    // The relay to a stream whose duplicate window is short; its first
    // batch fails after the confirm, so it is published twice.
    let context = jetstream::new(async_nats::connect(&nats_url).await.unwrap());
    let stream = format!("E2E_{run}");
    let prefix = format!("e2e-{run}");
    context
        .create_stream(jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            storage: jetstream::stream::StorageType::Memory,
            duplicate_window: WINDOW,
            max_age: Duration::from_secs(600),
            ..Default::default()
        })
        .await
        .unwrap();
    let publisher = FailsAfterConfirm {
        inner: JetStreamPublisher::connect(&nats_url, JetStreamOptions::new(&prefix).unwrap())
            .await
            .unwrap(),
        failed: AtomicBool::new(false),
    };
    let options = RelayOptions::default()
        .with_batch(100)
        .unwrap()
        .with_retries(5, WINDOW * 3, WINDOW * 6)
        .unwrap();
    let relay = Relay::new(outbox.clone(), Arc::new(publisher), options);
    let relaying = tokio::spawn({
        let outbox = outbox.clone();
        async move {
            // A store call that times out on a loaded machine is retried, as
            // `Relay::run` does; anything else fails the test.
            loop {
                match outbox.stats().await {
                    Ok(stats) if stats.pending == 0 => break,
                    Ok(_) => {}
                    Err(error) => assert!(error.is_retryable(), "{error}"),
                }
                if let Err(RelayError::Store(error)) = relay.relay_once().await {
                    assert!(error.is_retryable(), "{error}");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    });

    // The shipping service.
    let inbox = PostgresStore::with_options(
        pool.clone(),
        PostgresOptions::default().table(&table("inbox")),
    )
    .unwrap();
    inbox.migrate().await.unwrap();
    let parking = PostgresParking::with_options(
        pool.clone(),
        PostgresParkingOptions::default().table(&table("parked")),
    )
    .unwrap();
    parking.migrate().await.unwrap();
    let (shipments, effects) = (table("shipments"), table("effects"));
    sql(&pool, format!("CREATE TABLE {shipments} (id text PRIMARY KEY, version bigint NOT NULL, status text NOT NULL)")).await;
    sql(
        &pool,
        format!("CREATE TABLE {effects} (seq bigserial PRIMARY KEY, id text NOT NULL, version bigint NOT NULL)"),
    )
    .await;
    let shipping = Shipping {
        inbox: inbox.clone(),
        versions: VersionedTable::new(&shipments, "id", "version").unwrap(),
        shipments: shipments.clone(),
        effects: effects.clone(),
    };
    let max = 10;
    let options = ConsumerOptions::default()
        .max_deliveries(max)
        .backoff(Duration::from_millis(50), Duration::from_millis(500));
    let consumer = Consumer::with_options(
        "shipping",
        Arc::new(inbox),
        Arc::new(parking),
        shipping,
        options,
    )
    .unwrap();
    let config = JetStreamSource::durable("shipping", max, Duration::from_secs(1));
    let mut source = JetStreamSource::attach(&context, &stream, config)
        .await
        .unwrap();
    consumer.check(&source.horizon()).unwrap();

    let mut outcomes: std::collections::BTreeMap<&'static str, usize> = Default::default();
    // The first delivery's consumer dies after its commit: the loop runs
    // until JetStream has delivered that message again (after its ack
    // wait) and every order is at its last version.
    let mut killed: Option<idem_core::IdempotencyKey> = None;
    let mut redelivered = false;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let done = format!("SELECT count(*) FROM {shipments} WHERE version = 3");
    while count(&pool, done.clone()).await < ORDERS as i64 || !redelivered {
        let next = tokio::time::timeout_at(deadline, source.next()).await;
        let delivery = next
            .expect("deliveries within the patience")
            .unwrap()
            .unwrap();
        let id = delivery.message().id().clone();
        if killed.is_none() {
            let dead = consumer.consume(&KilledBeforeAck(delivery)).await;
            assert!(dead.is_err(), "{dead:?}");
            *outcomes.entry("killed before its ack").or_default() += 1;
            killed = Some(id);
            continue;
        }
        let outcome = consumer.consume(&delivery).await.unwrap();
        assert!(!matches!(outcome, Consumed::Parked { .. }), "{outcome:?}");
        if killed.as_ref() == Some(&id) && delivery.deliveries() > 1 {
            assert_eq!(
                outcome,
                Consumed::Duplicate,
                "the redelivery after the kill"
            );
            redelivered = true;
        }
        *outcomes.entry(outcome.as_str()).or_default() += 1;
    }
    relaying.await.unwrap();

    let stored = context
        .get_stream(&stream)
        .await
        .unwrap()
        .get_info()
        .await
        .unwrap()
        .state
        .messages;
    let effects_total = count(&pool, format!("SELECT count(*) FROM {effects}")).await;
    let distinct = count(
        &pool,
        format!("SELECT count(*) FROM (SELECT DISTINCT id, version FROM {effects}) d"),
    )
    .await;
    let in_order = count(
        &pool,
        format!(
            "SELECT count(*) FROM (SELECT array_agg(version ORDER BY seq) AS applied \
             FROM {effects} GROUP BY id) a WHERE applied = ARRAY[1, 2, 3]::bigint[]"
        ),
    )
    .await;
    let shipped = count(
        &pool,
        format!("SELECT count(*) FROM {shipments} WHERE version = 3 AND status = 'shipped'"),
    )
    .await;
    println!("committed order events: {committed} ({replays} HTTP retries replayed)");
    println!("in the stream: {stored} (the relay published its first batch twice)");
    println!("deliveries: {outcomes:?}");
    println!(
        "effects: {effects_total}, distinct: {distinct}; orders applied 1, 2, 3: {in_order}, shipped: {shipped}"
    );
    assert_eq!(
        effects_total, committed as i64,
        "one effect per committed event"
    );
    assert_eq!(distinct, effects_total, "no event applied twice");
    assert_eq!(
        in_order, ORDERS as i64,
        "each order's versions applied 1, 2, 3"
    );
    assert_eq!(shipped, ORDERS as i64, "every order at its last version");
    assert!(
        stored > committed as u64,
        "the relay's second publish got through"
    );
    assert!(consumer.parked(None, 10).await.unwrap().is_empty());
    assert_eq!(outbox.stats().await.unwrap().pending, 0);

    context.delete_stream(&stream).await.unwrap();
    let mut tables: Vec<String> = [
        "records",
        "outbox",
        "orders",
        "inbox",
        "parked",
        "shipments",
        "effects",
    ]
    .into_iter()
    .map(table)
    .collect();
    tables.push(format!("{}_aggregates", table("outbox")));
    for name in tables {
        sql(&pool, format!("DROP TABLE IF EXISTS {name} CASCADE")).await;
    }
}
