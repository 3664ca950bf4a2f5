//! Connection to the test database named by `IDEM_POSTGRES_URL`.

#![allow(dead_code, unreachable_pub, clippy::expect_used, clippy::panic)] // each test file uses a part

use std::time::Duration;

use idem_postgres::sqlx::PgPool;
use idem_postgres::sqlx::postgres::PgPoolOptions;
use idem_postgres::{PostgresOptions, PostgresStore};

pub const URL_VAR: &str = "IDEM_POSTGRES_URL";

pub fn url() -> String {
    std::env::var(URL_VAR).unwrap_or_else(|_| {
        panic!("{URL_VAR} is not set: point it at a Postgres database (scripts/test sets it)")
    })
}

/// A pool that fails in seconds when the server is missing, and does not
/// ping before each use (so one operation is one round trip).
pub async fn pool_for(url: &str, max: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(5))
        .test_before_acquire(false)
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {URL_VAR}={url}: {e}"))
}

pub async fn pool() -> PgPool {
    pool_for(&url(), 16).await
}

/// A migrated store on the default table.
pub async fn store() -> PostgresStore {
    let store = PostgresStore::new(pool().await);
    store.migrate().await.expect("migrate");
    store
}

/// A migrated store on a table of its own, for tests that count or sweep rows.
pub async fn store_on_own_table(prefix: &str) -> PostgresStore {
    let table = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
    let table = &table[..table.len().min(idem_postgres::MAX_TABLE_NAME)];
    let store = PostgresStore::with_options(pool().await, PostgresOptions::default().table(table))
        .expect("valid table name");
    store.migrate().await.expect("migrate");
    store
}
