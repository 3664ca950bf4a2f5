//! Race storms on the paths that share the caller's transaction: every key
//! raced by several deliveries leaves exactly one business row, with the
//! inbox mode, with the transactional runner, and with a sweeper running.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{rows, runner};
use idem_conformance::support::{executed_runs, fresh_tenant, key, long};
use idem_core::store::{ClaimOutcome, ClaimRequest, IdempotencyStore, Transaction};
use idem_core::{Scope, StoredResponse, Sweeper};
use idem_postgres::PostgresStore;
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool};

const KEYS: usize = 100;
const DUPLICATES: usize = 4;

/// A business table of its own: tenant and key.
async fn business_table(pool: &PgPool) -> String {
    common::business_table(pool, "tenant text NOT NULL, key text NOT NULL").await
}

/// Keys that appear in `table` other than exactly once.
async fn not_once(pool: &PgPool, table: &str) -> Vec<(String, i64)> {
    sqlx::query_as(AssertSqlSafe(format!(
        "SELECT key, count(*) FROM {table} GROUP BY key HAVING count(*) <> 1"
    )))
    .fetch_all(pool)
    .await
    .unwrap()
}

fn insert(table: &str, request: &ClaimRequest) -> String {
    format!(
        "INSERT INTO {table} VALUES ('{}', '{}')",
        request.scope().tenant().as_str(),
        request.scope().key().as_str()
    )
}

/// Every key of a fresh tenant, each delivered `DUPLICATES` times at once.
fn deliveries() -> Vec<ClaimRequest> {
    let tenant = fresh_tenant();
    (0..KEYS)
        .flat_map(|k| {
            let request = long(&Scope::new(tenant.clone(), key(&format!("m-{k}"))), "msg");
            (0..DUPLICATES).map(move |_| request.clone().with_new_owner())
        })
        .collect()
}

/// One delivery in the consumer's own transaction (the inbox mode): a
/// duplicate waits on the row, then finds the message processed.
async fn deliver(store: PostgresStore, table: String, request: ClaimRequest) -> &'static str {
    let mut tx = store.begin().await.unwrap();
    match store.claim_in(&mut tx, &request).await.unwrap() {
        ClaimOutcome::Claimed { lease, .. } => {
            sqlx::query(AssertSqlSafe(insert(&table, &request)))
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.complete(&lease, &StoredResponse::new(200, "processed"))
                .await
                .unwrap();
            tx.commit().await.unwrap();
            "processed"
        }
        ClaimOutcome::Completed(_) => "duplicate",
        other => panic!("an inbox delivery got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inbox_race_storm_leaves_one_business_row_per_message() {
    let store = common::store().await;
    let table = business_table(store.pool()).await;
    let tasks: Vec<_> = deliveries()
        .into_iter()
        .map(|request| tokio::spawn(deliver(store.clone(), table.clone(), request)))
        .collect();
    let mut processed = 0;
    for task in tasks {
        processed += usize::from(task.await.unwrap() == "processed");
    }
    assert_eq!(processed, KEYS);
    assert_eq!(not_once(store.pool(), &table).await, vec![]);
    assert_eq!(rows(store.pool(), &table).await, KEYS as i64);
}

/// The transactional runner raced by duplicates, optionally beside a sweeper
/// purging a stream of short-lived records on the same table.
async fn runner_storm(store: PostgresStore, with_sweeper: bool) {
    let table = business_table(store.pool()).await;
    let idem = runner(&store, Duration::from_secs(30));
    let sweeper =
        with_sweeper.then(|| Sweeper::spawn(Arc::new(store.clone()), Duration::from_millis(5)));
    // Records that expire while the storm runs, for the sweeper to take.
    let expiring = {
        let store = store.clone();
        tokio::spawn(async move {
            let tenant = fresh_tenant();
            for k in 0..200 {
                let request = long(&Scope::new(tenant.clone(), key(&format!("e-{k}"))), "e")
                    .with_lease(Duration::from_millis(5))
                    .unwrap()
                    .with_retention(Duration::from_millis(5))
                    .unwrap();
                store.claim(&request).await.unwrap();
            }
        })
    };
    let tasks: Vec<_> = deliveries()
        .into_iter()
        .map(|request| {
            let (idem, store, sql) = (idem.clone(), store.clone(), insert(&table, &request));
            tokio::spawn(async move {
                idem.run_in(
                    request.scope().clone(),
                    request.fingerprint(),
                    store.begin(),
                    |_ctx, mut tx| async move {
                        sqlx::query(AssertSqlSafe(sql)).execute(&mut *tx).await?;
                        Ok((tx, StoredResponse::new(201, "placed")))
                    },
                )
                .await
            })
        })
        .collect();
    let executed = executed_runs(tasks).await;
    expiring.await.unwrap();
    if let Some(sweeper) = sweeper {
        sweeper.stop().await;
    }
    assert_eq!(executed, KEYS);
    assert_eq!(not_once(store.pool(), &table).await, vec![]);
    assert_eq!(rows(store.pool(), &table).await, KEYS as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transactional_runner_race_storm_leaves_one_business_row_per_key() {
    runner_storm(common::store().await, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sweeper_running_through_a_race_storm_takes_no_live_record() {
    runner_storm(common::store_on_own_table("storm").await, true).await;
}
