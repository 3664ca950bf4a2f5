//! End to end on real servers, once per broker (NATS JetStream on a private
//! `nats-server`, RabbitMQ behind a cutting proxy): orders over HTTP
//! (idem-http, each request retried with the same key) → the business
//! transaction with its outbox row → a relay killed for real between the
//! broker's confirmation and its cursor move (its task aborted), and a
//! second relay that takes the batch over once the first one's lease
//! lapsed and publishes it again (JetStream drops the copies within its
//! duplicate window; RabbitMQ delivers them, with their message ids) → the
//! broker → the consumer (inbox, version check; its first delivery's
//! consumer dies between its commit and its ack, and a new one attaches) →
//! the consumer's shipment row. Mid-run the broker goes away while orders
//! keep committing (the JetStream server killed and started again on its
//! store; every RabbitMQ connection cut and nothing forwarded for 2 s), and
//! publisher and sources reconnect by themselves. Counted and printed per
//! broker; asserted: every committed order event has exactly one effect,
//! in version order per order; nothing lost, nothing parked, nothing
//! pending in the outbox or the broker.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

#[path = "end_to_end/brokers.rs"]
mod brokers;
/// RabbitMQ's test topology, shared with idem-rabbitmq's own tests.
#[path = "../../idem-rabbitmq/tests/common/mod.rs"]
mod rabbit;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::post;
use axum::{Extension, Router};
use brokers::{Broker, Nats, Rabbit, answered};
use http::StatusCode;
use idem_conformance::consumers::KilledBeforeAck;
use idem_conformance::relays::{DiesAfterConfirm, wait_until};
use idem_consumer::{
    Consumed, Consumer, ConsumerError, ConsumerOptions, Delivery, Handled, Handler, Source,
    async_trait,
};
use idem_core::store::{
    IdempotencyStore, InboundMessage, NewMessage, OutboxStore, VersionCheck, VersionStore,
};
use idem_core::{HandlerError, Idempotency, StoreError};
use idem_http::{IdempotencyLayer, IdempotencyTransaction};
use idem_outbox::{Publisher, Relay, RelayError, RelayOptions, RelayPass};
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool};
use idem_postgres::{
    PgTransaction, PostgresOptions, PostgresOutbox, PostgresOutboxOptions, PostgresParking,
    PostgresParkingOptions, PostgresStore, VersionedTable,
};
use tokio::sync::watch;
use tokio::time::Instant;

const ORDERS: usize = 12;
const STATUSES: [&str; 3] = ["placed", "paid", "shipped"];
const PATIENCE: Duration = Duration::from_secs(120);
/// The relays' lease: short, so the second relay takes the killed one's
/// batch over soon; long enough for a loaded machine to claim, publish and
/// mark a batch within it.
const LEASE: Duration = Duration::from_secs(2);
/// A batch's time limit at the broker: under the lease.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(1);
/// How often a relay looks for messages.
const POLL: Duration = Duration::from_millis(50);
/// How long the broker stays away at least.
const DOWN: Duration = Duration::from_secs(2);
/// Deliveries before a message is parked, and the broker's limit.
const MAX_DELIVERIES: u32 = 10;
/// The shipping service's consumer: its inbox tenant and durable name.
const CONSUMER: &str = "shipping";

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
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

/// What the outbox still has to publish; a store call that timed out on a
/// loaded machine is asked again.
async fn pending(outbox: &PostgresOutbox) -> u64 {
    answered("the outbox's stats", || outbox.stats())
        .await
        .pending
}

/// Posts `status` for every order, each request twice (a client's retry
/// with the same key); answers how many answers were replays.
async fn post_all(client: &reqwest::Client, base: &str, run: &str, status: &str) -> usize {
    let mut replays = 0;
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
    replays
}

/// Relays until told to stop, as `Relay::run` does: a store error that
/// may pass is retried (anything else fails the test); a broker's is the
/// message's, retried with back-off by the relay itself. Adds up what the
/// passes did in `done`.
async fn relay(
    relay: Relay<PostgresOutbox, dyn Publisher>,
    done: Arc<Mutex<RelayPass>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        match relay.drain().await {
            Ok(pass) => {
                let mut done = done.lock().unwrap();
                done.published += pass.published;
                done.duplicates += pass.duplicates;
                done.failed += pass.failed;
                done.parked += pass.parked;
                done.lost += pass.lost;
            }
            Err(RelayError::Store(error)) => assert!(error.is_retryable(), "{error}"),
            Err(error) => panic!("{error}"),
        }
        tokio::select! {
            _ = stop.wait_for(|stop| *stop) => return,
            () = tokio::time::sleep(POLL) => {}
        }
    }
}

/// What the consumer saw.
#[derive(Debug)]
struct Tally {
    /// Deliveries by outcome.
    outcomes: BTreeMap<&'static str, usize>,
    /// Deliveries per message id.
    deliveries: HashMap<String, usize>,
    /// Errors the source answered (then asked again).
    source_errors: usize,
    /// Sources attached after the first: the killed consumer's successor.
    attached: usize,
    /// The message whose consumer died between its commit and its ack.
    killed: Option<String>,
}

impl Tally {
    fn new() -> Self {
        let outcomes = [
            "applied",
            "duplicate",
            "stale",
            "retried",
            "in_progress",
            "parked",
            KILLED,
            FAILED,
        ];
        Self {
            outcomes: outcomes.into_iter().map(|o| (o, 0)).collect(),
            deliveries: HashMap::new(),
            source_errors: 0,
            attached: 0,
            killed: None,
        }
    }

    fn count(&mut self, outcome: &'static str) {
        *self.outcomes.entry(outcome).or_default() += 1;
    }

    /// A consume that failed, left to the broker's redelivery: a store
    /// call that timed out, an ack on a connection that was cut.
    fn failed(&mut self, error: &ConsumerError) {
        let retryable = match error {
            ConsumerError::Store(error) => error.is_retryable(),
            ConsumerError::Broker(error) => error.is_retryable(),
            _ => false,
        };
        assert!(retryable, "{error}");
        self.count(FAILED);
    }
}

const KILLED: &str = "killed before its ack";
const FAILED: &str = "failed, left to redelivery";

/// The shipping service's loop: its first delivery's consumer dies between
/// its commit and its ack, and a new one attaches; a source error is asked
/// again (the sources reconnect by themselves). It ends once every order is
/// at its last version, the killed delivery came again as a duplicate and
/// the broker has nothing left for it.
async fn consume<B: Broker>(
    broker: Arc<B>,
    consumer: Consumer<Shipping>,
    pool: PgPool,
    shipments: String,
) -> (Tally, Consumer<Shipping>) {
    let mut tally = Tally::new();
    let mut source = broker.source().await;
    consumer.check(&source.horizon()).unwrap();
    let mut redelivered = false;
    let deadline = Instant::now() + PATIENCE;
    let shipped = format!("SELECT count(*) FROM {shipments} WHERE version = 3");
    loop {
        let finishing = redelivered && count(&pool, shipped.clone()).await == ORDERS as i64;
        if finishing && broker.outstanding().await == 0 {
            return (tally, consumer);
        }
        assert!(
            Instant::now() < deadline,
            "not done within the patience: {tally:?}"
        );
        // At the end, nothing more may come: the broker is asked again.
        let wait = match finishing {
            true => Duration::from_secs(1),
            false => deadline.saturating_duration_since(Instant::now()),
        };
        let Ok(next) = tokio::time::timeout(wait, source.next()).await else {
            continue;
        };
        let delivery = match next {
            Ok(Some(delivery)) => delivery,
            Ok(None) => panic!("the source closed"),
            Err(error) => {
                assert!(error.is_retryable(), "{error}");
                tally.source_errors += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let id = delivery.message().id().as_str().to_string();
        *tally.deliveries.entry(id.clone()).or_default() += 1;
        if tally.killed.is_none() {
            match consumer.consume(&KilledBeforeAck(delivery)).await {
                Err(ConsumerError::Broker(error)) if error.operation == "ack" => {
                    tally.count(KILLED);
                    tally.killed = Some(id);
                    broker.kill(source).await;
                    source = broker.source().await;
                    tally.attached += 1;
                }
                Ok(outcome) => tally.count(outcome.as_str()),
                Err(error) => tally.failed(&error),
            }
            continue;
        }
        match consumer.consume(&delivery).await {
            Ok(outcome) => {
                assert!(!matches!(outcome, Consumed::Parked { .. }), "{outcome:?}");
                if tally.killed.as_ref() == Some(&id) && delivery.deliveries() > 1 {
                    assert_eq!(
                        outcome,
                        Consumed::Duplicate,
                        "the redelivery after the kill"
                    );
                    redelivered = true;
                }
                tally.count(outcome.as_str());
            }
            Err(error) => tally.failed(&error),
        }
    }
}

/// The order service: HTTP records, orders and the outbox in one database,
/// a `POST /orders` of `<order> <status>` that writes the order and its
/// event in the request's transaction; answers the outbox and the base URL.
async fn order_service(
    pool: &PgPool,
    table: impl Fn(&str) -> String,
) -> (Arc<PostgresOutbox>, String) {
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
        pool,
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
    (outbox, base)
}

/// The shipping service: its inbox, parking, shipments and one row per
/// effect; answers its consumer and the two tables.
async fn shipping_service(
    pool: &PgPool,
    table: impl Fn(&str) -> String,
) -> (Consumer<Shipping>, String, String) {
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
    sql(pool, format!("CREATE TABLE {shipments} (id text PRIMARY KEY, version bigint NOT NULL, status text NOT NULL)")).await;
    sql(
        pool,
        format!("CREATE TABLE {effects} (seq bigserial PRIMARY KEY, id text NOT NULL, version bigint NOT NULL)"),
    )
    .await;
    let shipping = Shipping {
        inbox: inbox.clone(),
        versions: VersionedTable::new(&shipments, "id", "version").unwrap(),
        shipments: shipments.clone(),
        effects: effects.clone(),
    };
    // A version gap (a later event delivered while its predecessor waits
    // out the killed consumer's ack wait) is retried for seconds before it
    // would park.
    // Four deliveries at once (of four aggregates), as a consumer that
    // keeps up with its broker runs; the pool has room for them.
    let options = ConsumerOptions::default()
        .max_deliveries(MAX_DELIVERIES)
        .backoff(Duration::from_millis(100), Duration::from_secs(1))
        .concurrency(4);
    let consumer = Consumer::with_options(
        CONSUMER,
        Arc::new(inbox),
        Arc::new(parking),
        shipping,
        options,
    )
    .unwrap();
    (consumer, shipments, effects)
}

/// The whole path on `broker`, with its faults; prints what it counted.
async fn every_committed_order_event_has_one_effect<B: Broker>(broker: B) {
    let broker = Arc::new(broker);
    let name = B::NAME;
    let pool = idem_postgres::guarded(sqlx::postgres::PgPoolOptions::new())
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&env(
            "IDEM_POSTGRES_URL",
            "postgres://postgres@127.0.0.1:5432/test",
        ))
        .await
        .expect("connect to IDEM_POSTGRES_URL");
    let run = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let table = |name: &str| format!("e2e_{name}_{run}");
    let (outbox, base) = order_service(&pool, table).await;
    let (consumer, shipments, effects) = shipping_service(&pool, table).await;
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();

    // Every order placed; the first relay publishes them, the broker
    // confirms, and the relay is killed before its cursor moves.
    let mut replays = post_all(&client, &base, &run, "placed").await;
    let options = RelayOptions::default()
        .with_batch(100)
        .unwrap()
        .with_lease(LEASE)
        .unwrap()
        .with_retries(1_000, Duration::from_millis(50), Duration::from_millis(500))
        .unwrap();
    let (stop, stopped) = watch::channel(false);
    let dying = Arc::new(DiesAfterConfirm::new(broker.publisher().await));
    let publisher: Arc<dyn Publisher> = dying.clone();
    let killed_relay = tokio::spawn(relay(
        Relay::new(outbox.clone(), publisher, options),
        Arc::default(),
        stopped.clone(),
    ));
    tokio::time::timeout(PATIENCE, dying.confirmed.notified())
        .await
        .expect("the first relay published");
    killed_relay.abort();
    assert!(killed_relay.await.unwrap_err().is_cancelled());
    let killed_at = Instant::now();
    let killed_batch = dying.confirmed_ids();
    assert!(!killed_batch.is_empty(), "the broker confirmed its batch");

    // The second relay takes the batch over once the lease lapsed; the
    // consumer runs.
    let survivor = Arc::new(Mutex::new(RelayPass::default()));
    let relaying = tokio::spawn(relay(
        Relay::new(outbox.clone(), broker.publisher().await, options),
        survivor.clone(),
        stopped,
    ));
    let consuming = tokio::spawn(consume(
        broker.clone(),
        consumer,
        pool.clone(),
        shipments.clone(),
    ));
    wait_until(
        "the second relay took the killed one's batch over",
        || async { pending(&outbox).await == 0 },
    )
    .await;
    let takeover = killed_at.elapsed();

    // Every order paid; once they flow, the broker goes away, and every
    // order ships while it is away: the relay retries, the sources
    // reconnect.
    replays += post_all(&client, &base, &run, "paid").await;
    let paid = format!("SELECT count(*) FROM {shipments} WHERE version >= 2");
    wait_until("a paid order reaches the consumer", || async {
        count(&pool, paid.clone()).await > 0
    })
    .await;
    broker.go_down().await;
    let down_at = Instant::now();
    replays += post_all(&client, &base, &run, "shipped").await;
    tokio::time::sleep(DOWN.saturating_sub(down_at.elapsed())).await;
    broker.come_back().await;
    let down_for = down_at.elapsed();

    let (tally, consumer) = tokio::time::timeout(PATIENCE, consuming)
        .await
        .expect("the consumer is done within the patience")
        .unwrap();
    stop.send(true).unwrap();
    relaying.await.unwrap();
    let survivor = survivor.lock().unwrap().clone();

    let committed = ORDERS * STATUSES.len();
    let stored = broker.stored().await;
    let outstanding = broker.outstanding().await;
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
    let parked = consumer.parked(None, 10).await.unwrap().len();
    let left = pending(&outbox).await;
    let delivered: usize = tally.deliveries.values().sum();
    let copies_delivered = killed_batch
        .iter()
        .filter(|id| tally.deliveries.get(*id).copied().unwrap_or(0) >= 2)
        .count();
    println!("[{name}] committed order events: {committed} ({replays} HTTP retries replayed)");
    println!(
        "[{name}] relays: the killed one's batch of {} was confirmed; the second took it over \
         {takeover:.1?} after the kill and marked {} sent ({} of them duplicates the broker \
         dropped), {} failed attempts (the broker away for {down_for:.1?}), {} lost leases, \
         {} parked",
        killed_batch.len(),
        survivor.published,
        survivor.duplicates,
        survivor.failed,
        survivor.lost,
        survivor.parked,
    );
    println!(
        "[{name}] broker: stored {}, delivered {delivered} deliveries of {} messages \
         ({copies_delivered} of the killed relay's {} delivered twice or more)",
        stored.map_or("-".to_string(), |s| s.to_string()),
        tally.deliveries.len(),
        killed_batch.len(),
    );
    println!(
        "[{name}] deliveries: {:?}; source errors asked again: {}, sources attached after the \
         kill: {}",
        tally.outcomes, tally.source_errors, tally.attached
    );
    println!(
        "[{name}] effects: {effects_total}, distinct: {distinct}; orders applied 1, 2, 3: \
         {in_order}, shipped: {shipped}; parked: {parked}; pending at the end: {left} in the \
         outbox, {outstanding} in the broker"
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
    assert_eq!(tally.deliveries.len(), committed, "every event delivered");
    assert_eq!(tally.outcomes[KILLED], 1);
    // The killed consumer's commit stood; so may that of a consume whose
    // ack was cut off.
    let applied = tally.outcomes["applied"] + tally.outcomes[KILLED];
    assert!(
        applied <= committed && committed <= applied + tally.outcomes[FAILED],
        "each event applied once: {tally:?}"
    );
    if broker.deduplicates() {
        assert_eq!(stored, Some(committed as u64), "one copy of each stored");
        assert!(
            survivor.duplicates >= killed_batch.len(),
            "the killed relay's batch, published again, was dropped: {survivor:?}"
        );
    } else {
        assert_eq!(
            copies_delivered,
            killed_batch.len(),
            "the killed relay's batch was delivered again"
        );
        assert!(
            tally.outcomes["duplicate"] > killed_batch.len(),
            "its copies and the killed consumer's redelivery are duplicates: {tally:?}"
        );
    }
    assert_eq!(parked, 0, "nothing parked");
    assert_eq!(left, 0, "nothing pending in the outbox");
    assert_eq!(outstanding, 0, "nothing left in the broker");

    broker.delete().await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_jetstream_every_committed_order_event_has_one_effect_through_kills_and_a_server_restart()
 {
    let run = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    every_committed_order_event_has_one_effect(Nats::new(&run).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rabbitmq_every_committed_order_event_has_one_effect_through_kills_and_a_cut_off_broker()
{
    every_committed_order_event_has_one_effect(Rabbit::new().await).await;
}
