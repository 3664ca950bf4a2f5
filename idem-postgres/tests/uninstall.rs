//! Each store's uninstall drops everything its migration created, and
//! nothing else: run in a schema of the test's own, which must be empty
//! after it (and is then dropped with `RESTRICT`, which refuses a schema
//! that still holds anything).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use idem_core::store::OutboxStore;
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool};
use idem_postgres::{
    PostgresJournal, PostgresJournalOptions, PostgresOptions, PostgresOutbox,
    PostgresOutboxOptions, PostgresParking, PostgresParkingOptions, PostgresStore,
};

/// A schema of the test's own.
async fn schema(pool: &PgPool) -> String {
    let schema = format!("uninstall_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(pool)
        .await
        .unwrap();
    schema
}

/// The tables (and indexes, sequences) and the functions in `schema`.
async fn objects(pool: &PgPool, schema: &str) -> (i64, i64) {
    let relations: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_class WHERE relnamespace = to_regnamespace($1)",
    )
    .bind(schema)
    .fetch_one(pool)
    .await
    .unwrap();
    let functions: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_proc WHERE pronamespace = to_regnamespace($1)")
            .bind(schema)
            .fetch_one(pool)
            .await
            .unwrap();
    (relations, functions)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stores_uninstall_leaves_nothing_of_its_migration() {
    let pool = common::pool().await;
    let schema = schema(&pool).await;
    let name = |part: &str| format!("{schema}.{part}");
    let records = PostgresStore::with_options(
        pool.clone(),
        PostgresOptions::default().table(&name("records")),
    )
    .unwrap();
    let journal = PostgresJournal::with_options(
        pool.clone(),
        PostgresJournalOptions::default().table(&name("journal")),
    )
    .unwrap();
    let outbox = PostgresOutbox::with_options(
        pool.clone(),
        PostgresOutboxOptions::default().table(&name("outbox")),
    )
    .unwrap();
    let parking = PostgresParking::with_options(
        pool.clone(),
        PostgresParkingOptions::default().table(&name("parked")),
    )
    .unwrap();
    records.migrate().await.unwrap();
    journal.migrate().await.unwrap();
    outbox.migrate().await.unwrap();
    parking.migrate().await.unwrap();
    // What an upgrade that changed a function's signature leaves: the old
    // one beside the new.
    sqlx::query(AssertSqlSafe(format!(
        "CREATE FUNCTION {schema}.records_claim(integer) RETURNS integer \
         LANGUAGE sql AS 'SELECT 1'"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let (relations, functions) = objects(&pool, &schema).await;
    assert!(
        relations >= 10 && functions >= 10,
        "{relations} relations, {functions} functions"
    );

    records.uninstall().await.unwrap();
    journal.uninstall().await.unwrap();
    outbox.uninstall().await.unwrap();
    parking.uninstall().await.unwrap();
    assert_eq!(objects(&pool, &schema).await, (0, 0), "left in {schema}");
    // Again: nothing more to drop, and no error.
    records.uninstall().await.unwrap();
    outbox.uninstall().await.unwrap();
    sqlx::query(AssertSqlSafe(format!("DROP SCHEMA {schema} RESTRICT")))
        .execute(&pool)
        .await
        .unwrap();
}

/// One store's uninstall drops its own objects only: another store's of
/// the same kind in the same schema stays whole and works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uninstall_drops_its_own_store_only() {
    let pool = common::pool().await;
    let schema = schema(&pool).await;
    let outbox = |table: &str| {
        PostgresOutbox::with_options(
            pool.clone(),
            PostgresOutboxOptions::default().table(&format!("{schema}.{table}")),
        )
        .unwrap()
    };
    let (gone, kept) = (outbox("gone"), outbox("kept"));
    gone.migrate().await.unwrap();
    kept.migrate().await.unwrap();
    let both = objects(&pool, &schema).await;
    gone.uninstall().await.unwrap();
    let left = objects(&pool, &schema).await;
    assert_eq!((left.0 * 2, left.1 * 2), both, "half of it left");
    kept.stats().await.unwrap();
    kept.uninstall().await.unwrap();
    assert_eq!(objects(&pool, &schema).await, (0, 0));
    sqlx::query(AssertSqlSafe(format!("DROP SCHEMA {schema} RESTRICT")))
        .execute(&pool)
        .await
        .unwrap();
}
