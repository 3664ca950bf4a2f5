//! Connection to the test database named by `IDEM_POSTGRES_URL`.

#![allow(dead_code, unreachable_pub, clippy::expect_used, clippy::panic)] // each test file uses a part

use std::str::FromStr;
use std::time::Duration;

use idem_conformance::faults::FaultProxy;
use idem_conformance::support;
use idem_core::Idempotency;
use idem_core::store::IdempotencyStore;
use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool};
use idem_postgres::{PostgresOptions, PostgresStore};

pub const URL_VAR: &str = "IDEM_POSTGRES_URL";

pub fn url() -> String {
    std::env::var(URL_VAR).unwrap_or_else(|_| {
        panic!("{URL_VAR} is not set: point it at a Postgres database (scripts/test sets it)")
    })
}

/// A pool of `max` connections that fails in seconds when the server is
/// missing, and does not ping before each use (so one operation is one
/// round trip).
fn pool_options(max: u32) -> PgPoolOptions {
    idem_postgres::guarded(PgPoolOptions::new())
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(5))
}

/// Options of a pool of `max` connections with no ping before each use,
/// with the guard's release check or without it.
pub fn pool_with_guard(max: u32, guarded: bool) -> PgPoolOptions {
    let base = PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .test_before_acquire(false);
    if guarded {
        idem_postgres::guarded(base)
    } else {
        base
    }
}

/// A pool of `max` connections to `url` (see [`pool_options`]).
pub async fn pool_for(url: &str, max: u32) -> PgPool {
    pool_options(max)
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

/// The options for the server at `IDEM_POSTGRES_URL`, and its `host:port`
/// for a proxy to forward to.
pub fn server() -> (PgConnectOptions, String) {
    let options = PgConnectOptions::from_str(&url()).expect("IDEM_POSTGRES_URL parses");
    let upstream = format!("{}:{}", options.get_host(), options.get_port());
    (options, upstream)
}

/// `options` aimed at a proxy on the loopback `port` instead (no TLS
/// through a proxy).
pub fn via_proxy(options: PgConnectOptions, port: u16) -> PgConnectOptions {
    options
        .host("127.0.0.1")
        .port(port)
        .ssl_mode(PgSslMode::Disable)
}

/// The runner every service holds, over `store` behind `dyn`, with `lease`
/// and without renewal: these tests let leases lapse mid-handler.
pub fn runner(store: &PostgresStore, lease: Duration) -> Idempotency<dyn IdempotencyStore> {
    support::runner(store)
        .with_lease(lease)
        .expect("a valid lease")
        .without_auto_renew()
}

/// A fault proxy in front of the server at `IDEM_POSTGRES_URL`, and the
/// options that reach that server through it.
pub async fn through_proxy() -> (FaultProxy, PgConnectOptions) {
    let (options, upstream) = server();
    let proxy = FaultProxy::start(upstream).await;
    let options = via_proxy(options, proxy.port);
    (proxy, options)
}

/// A migrated store over a pool of one connection made with `options` (a
/// proxy's: every statement crosses the one connection; see
/// [`pool_options`]).
pub async fn store_over_one_connection(options: PgConnectOptions) -> PostgresStore {
    let pool = pool_options(1)
        .connect_with(options)
        .await
        .expect("connect through the proxy");
    let store = PostgresStore::new(pool);
    store.migrate().await.expect("migrate");
    store
}

/// A business table of its own with `columns`, and no unique constraint:
/// nothing but idem stands between a duplicate and a second row.
pub async fn business_table(pool: &PgPool, columns: &str) -> String {
    let name = format!("orders_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(AssertSqlSafe(format!("CREATE TABLE {name} ({columns})")))
        .execute(pool)
        .await
        .expect("create the business table");
    name
}

/// The rows of `table`.
pub async fn rows(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .expect("count the rows")
}
