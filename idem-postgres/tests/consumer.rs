//! The consumer scenarios that need no broker on Postgres: the shop's
//! effects and its aggregates' versions in tables of the test's own,
//! written in the inbox's transaction; the parked messages in
//! `PostgresParking`. The version gaps that race a release, forced.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::sync::Arc;

use idem_conformance::consumers::{self, Books, ConsumerBackend, Scenario, Shop};
use idem_consumer::{Consumer, ConsumerOptions};
use idem_core::store::{VersionCheck, VersionStore};
use idem_core::{HandlerError, StoreError, async_trait};
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool};
use idem_postgres::{
    PgTransaction, PostgresOptions, PostgresParking, PostgresParkingOptions, PostgresStore,
    VersionedTable,
};

/// The shop's tables: each aggregate's version, and one row per effect in
/// commit order.
#[derive(Clone)]
struct PostgresBooks {
    inbox: PostgresStore,
    versions: VersionedTable,
    table: String,
    pool: PgPool,
}

#[async_trait]
impl Books for PostgresBooks {
    type Tx = PgTransaction;

    async fn begin(&self) -> Result<PgTransaction, StoreError> {
        self.inbox.begin().await
    }

    async fn apply(
        &self,
        tx: &mut PgTransaction,
        effect: &str,
        version: Option<(&str, u64)>,
    ) -> Result<VersionCheck, HandlerError> {
        if let Some((aggregate, event)) = version {
            let check = self.versions.advance(&mut **tx, aggregate, event).await?;
            if check != VersionCheck::Apply {
                return Ok(check);
            }
            if event == 1 {
                sqlx::query(AssertSqlSafe(format!(
                    "INSERT INTO {} (id, version) VALUES ($1, 1)",
                    self.table
                )))
                .bind(aggregate)
                .execute(&mut **tx)
                .await?;
            }
        }
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {}_effects (effect) VALUES ($1)",
            self.table
        )))
        .bind(effect)
        .execute(&mut **tx)
        .await?;
        Ok(VersionCheck::Apply)
    }

    async fn effects(&self) -> Vec<String> {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT effect FROM {}_effects ORDER BY n",
            self.table
        )))
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }
}

/// An inbox, a parking store and the shop's tables of the test's own.
struct PostgresBackend {
    pool: PgPool,
    table: String,
}

impl PostgresBackend {
    async fn new() -> Self {
        let pool = common::pool().await;
        let table = format!("cs_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE TABLE {table} (id text PRIMARY KEY, version bigint NOT NULL); \
             CREATE TABLE {table}_effects (n bigserial PRIMARY KEY, effect text NOT NULL)"
        )))
        .execute(&pool)
        .await
        .unwrap();
        Self { pool, table }
    }

    async fn delete(self) {
        let table = &self.table;
        sqlx::raw_sql(AssertSqlSafe(format!(
            "DROP TABLE IF EXISTS {table}, {table}_effects, {table}_inbox, {table}_parked"
        )))
        .execute(&self.pool)
        .await
        .unwrap();
    }
}

#[async_trait]
impl ConsumerBackend for PostgresBackend {
    type Books = PostgresBooks;

    async fn consumer(&self, options: ConsumerOptions) -> Scenario<PostgresBooks> {
        let table = &self.table;
        let inbox = PostgresStore::with_options(
            self.pool.clone(),
            PostgresOptions::default().table(&format!("{table}_inbox")),
        )
        .unwrap();
        inbox.migrate().await.unwrap();
        let parking = PostgresParking::with_options(
            self.pool.clone(),
            PostgresParkingOptions::default().table(&format!("{table}_parked")),
        )
        .unwrap();
        parking.migrate().await.unwrap();
        let shop = Shop::with_books(PostgresBooks {
            inbox: inbox.clone(),
            versions: VersionedTable::new(table, "id", "version").unwrap(),
            table: table.clone(),
            pool: self.pool.clone(),
        });
        let parking = consumers::GatedParking::new(Arc::new(parking));
        let consumer = Consumer::with_options(
            "scenario",
            Arc::new(inbox),
            parking.clone(),
            shop.clone(),
            options,
        )
        .unwrap();
        (consumer, shop, parking)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_parked_while_its_predecessor_is_released_is_released_too() {
    let backend = PostgresBackend::new().await;
    consumers::a_gap_parked_while_its_predecessor_is_released_is_released_too(&backend).await;
    backend.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_parked_after_its_predecessors_release_releases_itself() {
    let backend = PostgresBackend::new().await;
    consumers::a_gap_parked_after_its_predecessors_release_releases_itself(&backend).await;
    backend.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_parked_by_a_batch_after_its_predecessors_release_releases_itself() {
    let backend = PostgresBackend::new().await;
    consumers::a_gap_parked_by_a_batch_after_its_predecessors_release_releases_itself(&backend)
        .await;
    backend.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_aggregate_is_listed_and_released() {
    let backend = PostgresBackend::new().await;
    consumers::a_stuck_aggregate_is_listed_and_released(&backend).await;
    backend.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_releases_what_its_first_apply_did_not() {
    let backend = PostgresBackend::new().await;
    consumers::a_duplicate_releases_what_its_first_apply_did_not(&backend).await;
    backend.delete().await;
}
