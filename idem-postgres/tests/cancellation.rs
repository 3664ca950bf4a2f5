//! Cancellation: a BEGIN cut off mid-flight never leaves the next borrower
//! of its connection inside its transaction, and tasks aborted at random
//! points of a run, a version check, a consumer's delivery, an enqueue, a
//! relay pass and a parking, over a pool of one or two connections, never
//! corrupt what the next one commits.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

/// The consumer's in-process broker, from its own tests.
#[path = "../../idem-consumer/tests/common/mod.rs"]
mod broker;
mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use broker::{Broker, TestSource, event};
use idem_conformance::support::{fresh_consumer, fresh_tenant};
use idem_consumer::{Consumer, ConsumerOptions, Handled, Handler, RedeliveryHorizon};
use idem_core::HandlerError;
use idem_core::store::{
    IdempotencyStore, InboundMessage, NewMessage, NewParked, OutboxMessage, OutboxStore,
    ParkedQuery, ParkingStore, VersionCheck, VersionStore,
};
use idem_core::{
    Fingerprint, Idempotency, RunError, RunOutcome, Scope, StoreError, StoredResponse, Verdict,
    async_trait,
};
use idem_memory::MemoryParking;
use idem_outbox::{PublishError, Published, Publisher, Relay, RelayOptions};
use idem_postgres::PgTransaction;
use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use idem_postgres::sqlx::{self, AssertSqlSafe, Connection, PgConnection, PgPool, Row};
use idem_postgres::{
    PostgresOptions, PostgresOutbox, PostgresOutboxOptions, PostgresParking,
    PostgresParkingOptions, PostgresStore, VersionedTable,
};
use tokio::time::Instant;

/// Generous: the machine running these is busy.
const DEADLINE: Duration = Duration::from_secs(120);

/// Whether the session of `conn` is outside any transaction block, read
/// by the server: a statement of the simple protocol starts its own
/// transaction, whose start is its own (`now() = statement_timestamp()`);
/// inside a block opened before it, the transaction started earlier.
async fn outside_any_block(conn: &mut PgConnection) -> bool {
    let row = sqlx::raw_sql("SELECT now() = statement_timestamp()")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    row.get::<bool, _>(0)
}

/// A pool of `max` connections to `options`, with the guard or without
/// (the pools of these rounds only idem's own code uses, which opens
/// every transaction whole and so needs no guard), whose every hand-out
/// of an idle connection is checked: one handed out inside a transaction
/// block is counted in `inside`.
async fn watched_pool(
    max: u32,
    options: PgConnectOptions,
    guarded: bool,
) -> (PgPool, Arc<AtomicU64>) {
    let inside = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&inside);
    let pool = common::pool_with_guard(max, guarded)
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

fn server_options() -> PgConnectOptions {
    common::server().0
}

/// A pseudo-random number below `n` (uuid's generator is the test's dice).
fn below(n: u64) -> u64 {
    (uuid::Uuid::new_v4().as_u128() % u128::from(n.max(1))) as u64
}

/// Spawns `work` and aborts it after a random pause of up to `within`
/// (microseconds apart, so aborts land at every point of the work); the
/// handle ends either way.
fn aborted_at_random<F>(work: F, within: Duration) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let task = tokio::spawn(work);
    let abort = task.abort_handle();
    let micros = u64::try_from(within.as_micros()).unwrap_or(u64::MAX);
    let pause = Duration::from_micros(below(micros + 1));
    tokio::spawn(async move {
        tokio::time::sleep(pause).await;
        abort.abort();
    });
    task
}

// ---------------------------------------------------------------- BEGIN

/// `begin`, cut off by a timeout while the network holds its BEGIN
/// (stalled by the proxy), then the network resumes and the connection
/// goes back to the pool: the next borrower must find no transaction.
async fn cut_off_begin_then_borrow<F, Fut>(begin: F) -> bool
where
    F: FnOnce(PgPool) -> Fut,
    Fut: Future<Output = ()>,
{
    let (proxy, options) = common::through_proxy().await;
    let pool = idem_postgres::guarded(
        PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30)),
    )
    .connect_with(options)
    .await
    .unwrap();
    proxy.stall();
    begin(pool.clone()).await;
    proxy.resume();
    let mut next = pool.acquire().await.unwrap();
    outside_any_block(&mut next).await
}

/// sqlx 0.9's `Pool::begin` dropped between BEGIN's request and its reply
/// leaves the session inside a block the driver does not track; the
/// guard's release check rolls it back before anyone borrows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_begin_cut_off_mid_flight_leaves_the_next_borrower_outside_any_transaction() {
    for _ in 0..3 {
        let outside = cut_off_begin_then_borrow(|pool| async move {
            let cut = tokio::time::timeout(Duration::from_millis(200), pool.begin()).await;
            assert!(cut.is_err(), "BEGIN answered across a stalled network");
        })
        .await;
        assert!(
            outside,
            "the next borrower ran inside the cut-off BEGIN's transaction"
        );
    }
}

/// The same for a transaction begun on a connection already held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_begin_cut_off_mid_flight_leaves_the_next_borrower_outside_any_transaction() {
    let outside = cut_off_begin_then_borrow(|pool| async move {
        let mut conn = pool.acquire().await.unwrap();
        let cut = tokio::time::timeout(Duration::from_millis(200), conn.begin()).await;
        assert!(cut.is_err(), "BEGIN answered across a stalled network");
    })
    .await;
    assert!(outside);
}

/// `PostgresStore::begin` cut off by the store's own operation timeout, on
/// a pool without the guard: the store's BEGIN runs whole in a task of its
/// own, so its transaction is tracked and rolled back, not left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_begin_cut_off_by_its_timeout_leaves_no_transaction_behind_on_any_pool() {
    let (proxy, options) = common::through_proxy().await;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(30))
        .test_before_acquire(false)
        .connect_with(options)
        .await
        .unwrap();
    let timeout =
        idem_core::StoreOptions::default().with_operation_timeout(Duration::from_millis(200));
    let store = PostgresStore::with_options(
        pool.clone(),
        PostgresOptions::default().store_options(timeout),
    )
    .unwrap();
    proxy.stall();
    let cut = store.begin().await;
    assert!(
        matches!(&cut, Err(StoreError::Unavailable { .. })),
        "{cut:?}"
    );
    proxy.resume();
    let mut next = pool.acquire().await.unwrap();
    assert!(outside_any_block(&mut next).await);
}

// ---------------------------------------------------------------- rounds

/// A transactional run of `scope` writing one business row.
async fn place(
    idem: &Idempotency,
    store: &PostgresStore,
    table: &str,
    scope: &Scope,
) -> Result<RunOutcome, RunError> {
    let insert = format!("INSERT INTO {table} (tenant, key) VALUES ($1, $2)");
    let (tenant, key) = (
        scope.tenant().as_str().to_string(),
        scope.key().as_str().to_string(),
    );
    idem.run_in(
        scope.clone(),
        Fingerprint::of_bytes(b"order"),
        store.begin(),
        |_ctx, mut tx| async move {
            sqlx::query(AssertSqlSafe(insert))
                .bind(tenant)
                .bind(key)
                .execute(&mut *tx)
                .await?;
            // A statement that takes a moment, for aborts to land inside.
            sqlx::query("SELECT pg_sleep(0.001)")
                .execute(&mut *tx)
                .await?;
            Ok((tx, StoredResponse::new(201, "placed")))
        },
    )
    .await
}

/// Runs `attempt` until it answers `Some`, retrying after refusals and
/// failures, within the deadline.
async fn settle<T, F, Fut>(what: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(done) = attempt().await {
            return done;
        }
        assert!(Instant::now() < deadline, "{what}: not settled in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Rounds of runs aborted at random over a pool of one, then two
/// connections: after each, every key run to its end has exactly one
/// business row, and no connection was ever handed out inside a
/// transaction block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_aborted_at_random_leave_every_completed_key_with_exactly_its_writes() {
    for (max, guarded) in [(1, true), (2, false), (1, false), (2, true)] {
        let (pool, inside) = watched_pool(max, server_options(), guarded).await;
        let store = PostgresStore::new(pool.clone());
        store.migrate().await.unwrap();
        let table = common::business_table(&pool, "tenant text NOT NULL, key text NOT NULL").await;
        let idem: Idempotency =
            Idempotency::new(Arc::new(store.clone()) as Arc<dyn IdempotencyStore>)
                .with_lease(Duration::from_millis(500))
                .unwrap();
        let tenant = fresh_tenant();
        let scopes: Vec<Scope> = (0..16)
            .map(|n| Scope::parse(tenant.as_str(), &format!("order-{n}")).unwrap())
            .collect();
        let tasks: Vec<_> = scopes
            .iter()
            .map(|scope| {
                let (idem, store, table, scope) =
                    (idem.clone(), store.clone(), table.clone(), scope.clone());
                aborted_at_random(
                    async move { place(&idem, &store, &table, &scope).await },
                    Duration::from_millis(8),
                )
            })
            .collect();
        for task in tasks {
            let _ = task.await;
        }
        for scope in &scopes {
            settle("a key run again to its end", || async {
                place(&idem, &store, &table, scope).await.ok()
            })
            .await;
        }
        let rows: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT key, count(*) FROM {table} GROUP BY key ORDER BY key"
        )))
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(rows.len(), scopes.len(), "{rows:?}");
        assert!(rows.iter().all(|(_, n)| *n == 1), "{rows:?}");
        assert_eq!(
            inside.load(Ordering::SeqCst),
            0,
            "handed out inside a block"
        );
    }
}

/// One event's delivery through the inbox (`run_in`) with a version check:
/// the effect row and the version step commit with the inbox record, a gap
/// writes nothing and frees the key.
async fn apply(
    idem: &Idempotency,
    store: &PostgresStore,
    versions: &VersionedTable,
    table: &str,
    aggregate: &str,
    version: u64,
) -> Result<RunOutcome, RunError> {
    let tenant = format!("{table}-inbox");
    let scope = Scope::parse(&tenant, &format!("{aggregate}@{version}")).unwrap();
    let (versions, aggregate) = (versions.clone(), aggregate.to_string());
    let effects = format!("INSERT INTO {table}_effects (aggregate, version) VALUES ($1, $2)");
    let insert = format!("INSERT INTO {table} (id, version) VALUES ($1, 1)");
    idem.run_in(
        scope,
        Fingerprint::of_bytes(b"event"),
        store.begin(),
        move |_ctx, mut tx| async move {
            let check = versions.advance(&mut *tx, &aggregate, version).await?;
            let event = i64::try_from(version).unwrap();
            match check {
                VersionCheck::Apply => {
                    if version == 1 {
                        sqlx::query(AssertSqlSafe(insert))
                            .bind(&aggregate)
                            .execute(&mut *tx)
                            .await?;
                    }
                    sqlx::query(AssertSqlSafe(effects))
                        .bind(&aggregate)
                        .bind(event)
                        .execute(&mut *tx)
                        .await?;
                    sqlx::query("SELECT pg_sleep(0.001)")
                        .execute(&mut *tx)
                        .await?;
                    Ok((tx, Verdict::Store(StoredResponse::new(200, "applied"))))
                }
                VersionCheck::Stale { .. } => {
                    Ok((tx, Verdict::Store(StoredResponse::new(200, "stale"))))
                }
                _ => Ok((tx, Verdict::Release(StoredResponse::new(409, "gap")))),
            }
        },
    )
    .await
}

/// A migrated inbox, and a table of its own (`<prefix>_<random>`) whose
/// rows carry an aggregate's version, with the effects table beside it.
async fn versioned_tables(pool: &PgPool, prefix: &str) -> (PostgresStore, String, VersionedTable) {
    let store = PostgresStore::new(pool.clone());
    store.migrate().await.unwrap();
    let table = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {table} (id text PRIMARY KEY, version bigint NOT NULL); \
         CREATE TABLE {table}_effects (aggregate text NOT NULL, version bigint NOT NULL)"
    )))
    .execute(pool)
    .await
    .unwrap();
    let versions = VersionedTable::new(&table, "id", "version").unwrap();
    (store, table, versions)
}

/// Every aggregate of `table` is at `versions`, and each of its versions
/// has exactly one effect.
async fn each_version_applied_once(pool: &PgPool, table: &str, aggregates: u64, versions: u64) {
    let at: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT id, version FROM {table} ORDER BY id"
    )))
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(at.len() as u64, aggregates, "{at:?}");
    assert!(
        at.iter().all(|(_, v)| *v == versions as i64),
        "every aggregate at its last version: {at:?}"
    );
    let effects: Vec<(String, i64, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT aggregate, version, count(*) FROM {table}_effects GROUP BY 1, 2 ORDER BY 1, 2"
    )))
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(effects.len() as u64, aggregates * versions, "{effects:?}");
    assert!(
        effects.iter().all(|(_, _, n)| *n == 1),
        "applied twice: {effects:?}"
    );
}

/// Versions 1 to 6 of four aggregates, every event delivered at once in
/// waves (so an aggregate's versions race each other, as two pullers of
/// one stream make them), tasks aborted at random, over a pool of one,
/// then two connections, until every event is applied: each aggregate
/// ends at 6, each version has exactly one effect, every event recorded
/// applied has its version step, and no connection was handed out inside
/// a transaction block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_checked_deliveries_aborted_at_random_apply_each_version_once_in_order() {
    const AGGREGATES: usize = 4;
    const VERSIONS: u64 = 6;
    for (max, guarded) in [(1, false), (2, true)] {
        let (pool, inside) = watched_pool(max, server_options(), guarded).await;
        let (store, table, versions) = versioned_tables(&pool, "vc").await;
        let idem: Idempotency =
            Idempotency::new(Arc::new(store.clone()) as Arc<dyn IdempotencyStore>)
                .with_lease(Duration::from_millis(500))
                .unwrap();
        let mut pending: Vec<(String, u64)> = (0..AGGREGATES)
            .flat_map(|a| (1..=VERSIONS).map(move |v| (format!("order-{a}"), v)))
            .collect();
        let deadline = Instant::now() + DEADLINE;
        let mut waves = 0;
        while !pending.is_empty() {
            assert!(Instant::now() < deadline, "still pending: {pending:?}");
            waves += 1;
            let tasks: Vec<_> = pending
                .iter()
                .map(|(aggregate, version)| {
                    let (idem, store, versions, table) =
                        (idem.clone(), store.clone(), versions.clone(), table.clone());
                    let (aggregate, version) = (aggregate.clone(), *version);
                    let work = async move {
                        apply(&idem, &store, &versions, &table, &aggregate, version).await
                    };
                    // Every third wave runs unaborted, so each ends.
                    let within = if waves % 3 == 0 {
                        Duration::from_secs(3600)
                    } else {
                        Duration::from_millis(10)
                    };
                    aborted_at_random(work, within)
                })
                .collect();
            let mut left = Vec::new();
            for ((aggregate, version), task) in pending.iter().zip(tasks) {
                let done = match task.await {
                    Ok(Ok(outcome)) => outcome.response().body() != b"gap",
                    _ => false,
                };
                if !done {
                    left.push((aggregate.clone(), *version));
                }
            }
            pending = left;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        each_version_applied_once(&pool, &table, AGGREGATES as u64, VERSIONS).await;
        assert_eq!(
            inside.load(Ordering::SeqCst),
            0,
            "handed out inside a block"
        );
    }
}

/// Remembers every message published, in publish order.
#[derive(Default)]
struct Recorder {
    got: Mutex<Vec<OutboxMessage>>,
}

#[async_trait]
impl Publisher for Recorder {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>> {
        self.got.lock().unwrap().extend(batch.iter().cloned());
        batch.iter().map(|_| Ok(Published::stored())).collect()
    }
}

impl Recorder {
    /// Each aggregate's distinct sequences, in the order first published.
    fn first_published(&self) -> BTreeMap<String, Vec<u64>> {
        let mut seen = HashSet::new();
        let mut order: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for message in self.got.lock().unwrap().iter() {
            if seen.insert(message.id().to_string()) {
                order
                    .entry(message.message().aggregate().to_string())
                    .or_default()
                    .push(message.parts().sequence);
            }
        }
        order
    }
}

async fn outbox_on(pool: PgPool) -> PostgresOutbox {
    let table = format!("oc_{}", uuid::Uuid::new_v4().simple());
    let outbox =
        PostgresOutbox::with_options(pool, PostgresOutboxOptions::default().table(&table)).unwrap();
    outbox.migrate().await.unwrap();
    outbox
}

/// Business transactions writing a row and its event, aborted at random,
/// over a pool of one opening them whole (`idem_postgres::begin`), then a
/// guarded pool of two opening them with sqlx's `begin`: each row committed has
/// exactly one event, each event its row, and each aggregate's events
/// are numbered 1, 2, 3... with nothing missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueues_aborted_at_random_commit_each_event_exactly_with_its_change() {
    for (max, guarded) in [(1, false), (2, true)] {
        let (pool, inside) = watched_pool(max, server_options(), guarded).await;
        let outbox = Arc::new(outbox_on(pool.clone()).await);
        let table = common::business_table(&pool, "aggregate text NOT NULL").await;
        let tasks: Vec<_> = (0..40)
            .map(|n| {
                let (pool, outbox, table) = (pool.clone(), Arc::clone(&outbox), table.clone());
                let aggregate = format!("order-{}", n % 4);
                aborted_at_random(
                    async move {
                        // Without the guard a pool is safe only where every
                        // transaction opens whole; with it, sqlx's own
                        // `begin` cut off mid-flight is healed on release.
                        let mut tx = match guarded {
                            true => pool.begin().await?,
                            false => idem_postgres::begin(&pool).await?,
                        };
                        sqlx::query(AssertSqlSafe(format!(
                            "INSERT INTO {table} (aggregate) VALUES ($1)"
                        )))
                        .bind(&aggregate)
                        .execute(&mut *tx)
                        .await?;
                        let event = NewMessage::new(&aggregate, "order.changed", b"{}".to_vec())
                            .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
                        outbox
                            .enqueue_in(&mut tx, &event)
                            .await
                            .map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
                        sqlx::query("SELECT pg_sleep(0.001)")
                            .execute(&mut *tx)
                            .await?;
                        tx.commit().await
                    },
                    Duration::from_millis(20),
                )
            })
            .collect();
        for task in tasks {
            let _ = task.await;
        }
        let recorder = Arc::new(Recorder::default());
        let relay = Relay::new(
            Arc::clone(&outbox) as Arc<dyn idem_core::store::OutboxStore>,
            Arc::clone(&recorder) as Arc<dyn Publisher>,
            RelayOptions::default(),
        );
        relay.drain().await.unwrap();
        let rows: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT aggregate, count(*) FROM {table} GROUP BY 1 ORDER BY 1"
        )))
        .fetch_all(&pool)
        .await
        .unwrap();
        let published = recorder.first_published();
        for (aggregate, count) in &rows {
            let sequences = published.get(aggregate).cloned().unwrap_or_default();
            let expected: Vec<u64> = (1..=u64::try_from(*count).unwrap()).collect();
            assert_eq!(sequences, expected, "{aggregate}: rows {count}");
        }
        assert_eq!(
            published.len(),
            rows.len(),
            "events without rows: {published:?}"
        );
        assert_eq!(
            inside.load(Ordering::SeqCst),
            0,
            "handed out inside a block"
        );
    }
}

/// Relays aborted at random mid-drain, 3 at a time, over a pool of one,
/// then two connections: every message is published, each aggregate's in
/// order of its sequence (a message published again is the same message).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_aborted_at_random_publish_every_message_in_order() {
    const MESSAGES: u64 = 120;
    for (max, guarded) in [(1, false), (2, true)] {
        let (pool, inside) = watched_pool(max, server_options(), guarded).await;
        let outbox = Arc::new(outbox_on(pool.clone()).await);
        for n in 0..MESSAGES {
            let event = NewMessage::new(&format!("order-{}", n % 6), "event", vec![]).unwrap();
            outbox.enqueue(&event).await.unwrap();
        }
        let recorder = Arc::new(Recorder::default());
        let options = RelayOptions::default()
            .with_batch(10)
            .unwrap()
            .with_lease(Duration::from_millis(300))
            .unwrap();
        let waves = Arc::new(AtomicU64::new(0));
        settle("every message published", || {
            let (outbox, recorder, waves) = (
                Arc::clone(&outbox),
                Arc::clone(&recorder),
                Arc::clone(&waves),
            );
            async move {
                // Three relays (processes) at once, each killed at random;
                // every third wave, one lives to the end of its drain.
                let wave = waves.fetch_add(1, Ordering::SeqCst);
                let relays: Vec<_> = (0..3)
                    .map(|n| {
                        let relay = Relay::new(
                            Arc::clone(&outbox) as Arc<dyn OutboxStore>,
                            Arc::clone(&recorder) as Arc<dyn Publisher>,
                            options,
                        );
                        let within = if n == 0 && wave % 3 == 2 {
                            Duration::from_secs(3600)
                        } else {
                            Duration::from_millis(15)
                        };
                        aborted_at_random(async move { relay.drain().await }, within)
                    })
                    .collect();
                for relay in relays {
                    let _ = relay.await;
                }
                let published: usize = recorder.first_published().values().map(Vec::len).sum();
                (published as u64 == MESSAGES).then_some(())
            }
        })
        .await;
        for (aggregate, sequences) in recorder.first_published() {
            let expected: Vec<u64> = (1..=MESSAGES / 6).collect();
            assert_eq!(sequences, expected, "{aggregate}");
        }
        let mut by_id: HashMap<String, u64> = HashMap::new();
        for message in recorder.got.lock().unwrap().iter() {
            *by_id.entry(message.id().to_string()).or_default() += 1;
        }
        assert_eq!(by_id.len() as u64, MESSAGES);
        assert_eq!(
            inside.load(Ordering::SeqCst),
            0,
            "handed out inside a block"
        );
    }
}

/// Parkings of 20 messages aborted at random over a pool of one
/// connection, then each parked again to its end: each message has one
/// entry, with the reason and delivery count of its last parking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parkings_aborted_at_random_leave_one_entry_per_message_with_its_last_reason() {
    let (pool, inside) = watched_pool(1, server_options(), true).await;
    let table = format!("pc_{}", uuid::Uuid::new_v4().simple());
    let parking = Arc::new(
        PostgresParking::with_options(
            pool.clone(),
            PostgresParkingOptions::default().table(&table),
        )
        .unwrap(),
    );
    parking.migrate().await.unwrap();
    let consumer = fresh_consumer();
    let parked = |n: u32, reason: &str, deliveries: u32| NewParked {
        consumer: consumer.clone(),
        message: InboundMessage::new(&format!("m-{n}"), "order.placed", b"{}".to_vec()).unwrap(),
        reason: reason.to_string(),
        deliveries,
    };
    let tasks: Vec<_> = (0..20)
        .map(|n| {
            let (parking, first) = (Arc::clone(&parking), parked(n, "first", 1));
            aborted_at_random(
                async move { parking.park(&first).await },
                Duration::from_millis(5),
            )
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
    for n in 0..20 {
        parking.park(&parked(n, "last", 2)).await.unwrap();
    }
    let listed = parking
        .parked(&ParkedQuery::new(consumer.clone()).limit(100))
        .await
        .unwrap();
    assert_eq!(listed.len(), 20);
    assert!(
        listed
            .iter()
            .all(|entry| entry.parked.reason == "last" && entry.parked.deliveries == 2),
        "{listed:?}"
    );
    assert_eq!(
        inside.load(Ordering::SeqCst),
        0,
        "handed out inside a block"
    );
}

// ---------------------------------------------------------------- consumers

/// The consumer's test: its aggregates and versions.
const CONSUMED_AGGREGATES: u64 = 8;
const CONSUMED_VERSIONS: u64 = 8;

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

/// The in-process broker as a consumer's source, redelivering without limit.
fn source(broker: &Broker) -> TestSource {
    TestSource {
        broker: broker.clone(),
        horizon: RedeliveryHorizon::new("test", Duration::from_secs(1)),
    }
}

/// Two consumers of one queue: one runs `Consumer::run` in a task aborted
/// every 20–200 ms and started again; the other consumes deliveries one
/// by one, each in a task aborted at a random point (a process dying
/// mid-delivery; the broker delivers again what was never settled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_aborted_at_random_apply_every_version_once_in_order() {
    let (pool, inside) = watched_pool(2, server_options(), false).await;
    let (inbox, table, versions) = versioned_tables(&pool, "cc").await;
    let handler = Orders {
        inbox: inbox.clone(),
        versions,
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
    for version in 1..=CONSUMED_VERSIONS {
        for aggregate in 0..CONSUMED_AGGREGATES {
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
    while applied().await < i64::try_from(CONSUMED_AGGREGATES * CONSUMED_VERSIONS).unwrap() {
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

    each_version_applied_once(&pool, &table, CONSUMED_AGGREGATES, CONSUMED_VERSIONS).await;
    assert_eq!(
        inside.load(Ordering::SeqCst),
        0,
        "handed out inside a block"
    );
}
