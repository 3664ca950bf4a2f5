//! The public parking suite against a real Postgres, and the version checks
//! of `VersionedTable` over a table of the test's own: apply, stale, a gap,
//! racing handlers serialised by the update.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::sync::Arc;

use idem_core::store::{VersionCheck, VersionStore};
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool};
use idem_postgres::{PostgresParking, PostgresParkingOptions, VersionedTable};
use tokio::sync::Barrier;

/// A migrated parking store on a fresh table of its own: a purge sees the
/// whole table.
async fn parking() -> PostgresParking {
    let table = format!("pk_{}", uuid::Uuid::new_v4().simple());
    let options = PostgresParkingOptions::default().table(&table);
    let parking = PostgresParking::with_options(common::pool().await, options).unwrap();
    parking.migrate().await.expect("migrate");
    parking
}

mod suite {
    idem_conformance::parking_suite!(super::parking());
}

/// A table of the test's own, with one aggregate at `version`.
async fn orders(pool: &PgPool, version: i64) -> (String, VersionedTable) {
    let table = format!("vt_{}", uuid::Uuid::new_v4().simple());
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {table} (id text PRIMARY KEY, version bigint NOT NULL, total bigint NOT NULL); \
         INSERT INTO {table} VALUES ('order-1', {version}, 0)"
    )))
    .execute(pool)
    .await
    .unwrap();
    let versioned = VersionedTable::new(&table, "id", "version").unwrap();
    (table, versioned)
}

async fn version_of(pool: &PgPool, table: &str, id: &str) -> Option<i64> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT version FROM {table} WHERE id = $1"
    )))
    .bind(id)
    .fetch_optional(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn an_event_applies_on_its_predecessor_only() {
    let pool = common::pool().await;
    let (table, versioned) = orders(&pool, 2).await;
    let mut tx = pool.begin().await.unwrap();
    assert_eq!(
        versioned.advance(&mut *tx, "order-1", 3).await.unwrap(),
        VersionCheck::Apply
    );
    assert_eq!(
        versioned.advance(&mut *tx, "order-1", 3).await.unwrap(),
        VersionCheck::Stale { current: 3 },
        "a duplicate inside the same transaction"
    );
    assert_eq!(
        versioned.advance(&mut *tx, "order-1", 2).await.unwrap(),
        VersionCheck::Stale { current: 3 }
    );
    assert_eq!(
        versioned.advance(&mut *tx, "order-1", 5).await.unwrap(),
        VersionCheck::Gap { current: 3 }
    );
    assert_eq!(
        versioned.advance(&mut *tx, "order-new", 1).await.unwrap(),
        VersionCheck::Apply,
        "a new aggregate is at version 0"
    );
    assert_eq!(
        versioned.advance(&mut *tx, "order-new", 2).await.unwrap(),
        VersionCheck::Gap { current: 0 }
    );
    drop(tx);
    assert_eq!(
        version_of(&pool, &table, "order-1").await,
        Some(2),
        "rolled back"
    );
    assert!(matches!(
        versioned
            .advance(&mut *pool.acquire().await.unwrap(), "order-1", 0)
            .await,
        Err(idem_core::StoreError::InvalidInput(_))
    ));
}

/// Two handlers of one event race: the update serialises them, and the
/// second, once the first commits, reads the committed version (not its
/// statement's older snapshot) and finds the event stale.
#[tokio::test]
async fn racing_handlers_of_one_event_apply_it_once() {
    let pool = common::pool().await;
    let (table, versioned) = orders(&pool, 1).await;
    let versioned = Arc::new(versioned);
    let mut first = pool.begin().await.unwrap();
    assert_eq!(
        versioned.advance(&mut *first, "order-1", 2).await.unwrap(),
        VersionCheck::Apply
    );
    let started = Arc::new(Barrier::new(2));
    let second = tokio::spawn({
        let (pool, versioned, started) = (pool.clone(), versioned.clone(), started.clone());
        async move {
            let mut tx = pool.begin().await.unwrap();
            started.wait().await;
            // Blocks on the row the first holds until it commits.
            let check = versioned.advance(&mut *tx, "order-1", 2).await.unwrap();
            tx.commit().await.unwrap();
            check
        }
    });
    started.wait().await;
    // The second is waiting on the row lock before the first commits.
    wait_for_lock_waiter(&pool, &table).await;
    sqlx::query(AssertSqlSafe(format!(
        "UPDATE {table} SET total = total + 10 WHERE id = 'order-1'"
    )))
    .execute(&mut *first)
    .await
    .unwrap();
    first.commit().await.unwrap();
    assert_eq!(second.await.unwrap(), VersionCheck::Stale { current: 2 });
    let total: i64 = sqlx::query_scalar(AssertSqlSafe(format!("SELECT total FROM {table}")))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        (version_of(&pool, &table, "order-1").await, total),
        (Some(2), 10)
    );
}

/// The race two pullers of one stream make: event 3's update looks at the
/// row while event 2's transaction, which moved it to 2, is committing.
/// The update skips the row (the version it sees is 1) and moves nothing;
/// by the time the version is read, 2 has committed. A trigger holds the
/// checking statement between the two until the predecessor has
/// committed, so the race happens every time. The event must apply with
/// its version moved in its own transaction, never be answered `Apply`
/// over a version still at 2.
#[tokio::test]
async fn an_event_whose_predecessor_commits_while_it_is_checked_moves_the_version() {
    let pool = common::pool().await;
    let (table, versioned) = orders(&pool, 1).await;
    let gate: i64 = rand_key();
    // Every UPDATE statement of the table, even one that moves no row,
    // waits on the test's advisory lock in a session that asks for it.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE FUNCTION {table}_hold() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           IF current_setting('idem_test.hold', true) = 'on' THEN PERFORM pg_advisory_xact_lock({gate}); END IF; \
           RETURN NULL; END $$; \
         CREATE TRIGGER {table}_hold AFTER UPDATE ON {table} FOR EACH STATEMENT EXECUTE FUNCTION {table}_hold()"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let mut holder = pool.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(gate)
        .execute(&mut *holder)
        .await
        .unwrap();

    let mut predecessor = pool.begin().await.unwrap();
    assert_eq!(
        versioned
            .advance(&mut *predecessor, "order-1", 2)
            .await
            .unwrap(),
        VersionCheck::Apply
    );
    let checked = tokio::spawn({
        let (pool, table, versioned) = (pool.clone(), table.clone(), versioned.clone());
        async move {
            let mut tx = pool.begin().await.unwrap();
            sqlx::query("SELECT set_config('idem_test.hold', 'on', true)")
                .execute(&mut *tx)
                .await
                .unwrap();
            let check = versioned.advance(&mut *tx, "order-1", 3).await.unwrap();
            let seen: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT version FROM {table} WHERE id = 'order-1'"
            )))
            .fetch_one(&mut *tx)
            .await
            .unwrap();
            tx.commit().await.unwrap();
            (check, seen)
        }
    });
    // Event 3's update has looked at the row (and moved nothing): its
    // statement trigger waits on the gate.
    wait_for_lock_waiter(&pool, &table).await;
    predecessor.commit().await.unwrap();
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(gate)
        .execute(&mut *holder)
        .await
        .unwrap();
    let (check, seen) = checked.await.unwrap();
    assert_eq!(
        (check, seen),
        (VersionCheck::Apply, 3),
        "applied means the version moved inside the event's transaction"
    );
    assert_eq!(version_of(&pool, &table, "order-1").await, Some(3));
}

/// An advisory lock key of this test's own.
fn rand_key() -> i64 {
    let bytes = uuid::Uuid::new_v4().as_u64_pair().0;
    i64::from_ne_bytes(bytes.to_ne_bytes())
}

#[tokio::test]
async fn an_id_of_another_type_is_cast() {
    let pool = common::pool().await;
    let table = format!("vu_{}", uuid::Uuid::new_v4().simple());
    let id = uuid::Uuid::new_v4();
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {table} (id uuid PRIMARY KEY, version bigint NOT NULL); \
         INSERT INTO {table} VALUES ('{id}', 1)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let versioned = VersionedTable::typed(&table, "id", "uuid", "version").unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let check = versioned
        .advance(&mut conn, &id.to_string(), 2)
        .await
        .unwrap();
    assert_eq!(check, VersionCheck::Apply);
}

/// Waits until a session is blocked on a lock in a statement on `table`.
async fn wait_for_lock_waiter(pool: &PgPool, table: &str) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE wait_event_type = 'Lock' AND position($1 in query) > 0",
        )
        .bind(table)
        .fetch_one(pool)
        .await
        .unwrap();
        if waiting > 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nobody waited on {table}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
