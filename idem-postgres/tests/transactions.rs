//! Completion inside the caller's transaction: the business effect and the
//! completed marker commit or vanish together.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::time::Duration;

use idem_core::{
    ClaimOutcome, ClaimRequest, Fingerprint, HandlerError, IdempotencyStore, RunError, RunOutcome,
    Scope, StoreError, StoredResponse,
};
use idem_postgres::PostgresStore;
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool};

/// A business table of its own, with no unique constraint: nothing but idem
/// stands between a duplicate and a second row.
async fn business_table(pool: &PgPool) -> String {
    let name = format!("orders_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {name} (tenant text NOT NULL, key text NOT NULL, note text NOT NULL)"
    )))
    .execute(pool)
    .await
    .unwrap();
    name
}

async fn rows(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn drop_table(pool: &PgPool, table: &str) {
    sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(pool)
        .await
        .unwrap();
}

fn request(lease: Duration) -> ClaimRequest {
    ClaimRequest::new(
        Scope::parse(&format!("tx-{}", uuid::Uuid::new_v4()), "order-1").unwrap(),
        Fingerprint::of_bytes("order body"),
    )
    .with_lease_ttl(lease)
    .unwrap()
}

fn insert(table: &str, request: &ClaimRequest, note: &str) -> String {
    format!(
        "INSERT INTO {table} VALUES ('{}', '{}', '{note}')",
        request.scope().tenant().as_str(),
        request.scope().key().as_str()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_handler_commits_exactly_one_business_row() {
    let store = common::store().await;
    let table = business_table(store.pool()).await;
    let request = request(Duration::from_secs(30));
    for expect_replay in [false, true, true] {
        let sql = insert(&table, &request, "placed");
        let outcome = store
            .run_in_transaction(&request, move |tx, claim| {
                Box::pin(async move {
                    assert_eq!(claim.lease.attempt(), 1);
                    sqlx::query(AssertSqlSafe(sql)).execute(&mut *tx).await?;
                    Ok::<_, HandlerError<sqlx::Error>>(StoredResponse::new(201, "placed"))
                })
            })
            .await
            .unwrap();
        assert_eq!(outcome.is_replay(), expect_replay);
        assert_eq!(outcome.response().body(), b"placed");
    }
    assert_eq!(rows(store.pool(), &table).await, 1);
    drop_table(store.pool(), &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_lease_rolls_back_the_business_rows() {
    let store = common::store().await;
    let table = business_table(store.pool()).await;
    let request = request(Duration::from_millis(200));
    let sql = insert(&table, &request, "stale owner");
    let (rival, rival_request) = (store.clone(), request.clone());
    let outcome = store
        .run_in_transaction(&request, move |tx, _claim| {
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(sql)).execute(&mut *tx).await?;
                // The handler stalls past its lease; a retry takes the key over.
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                loop {
                    match rival.claim(&rival_request).await.unwrap() {
                        ClaimOutcome::Claimed { lease, .. } => {
                            assert_eq!(lease.attempt(), 2);
                            break;
                        }
                        ClaimOutcome::InProgress { .. } => {}
                        other => panic!("unexpected {other:?}"),
                    }
                    assert!(tokio::time::Instant::now() < deadline, "no takeover");
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                Ok::<_, HandlerError<sqlx::Error>>(StoredResponse::new(201, "stale"))
            })
        })
        .await;
    assert!(
        matches!(outcome, Err(RunError::Store(StoreError::LostLease))),
        "{outcome:?}"
    );
    assert_eq!(
        rows(store.pool(), &table).await,
        0,
        "business write survived a lost lease"
    );
    let record = store.get(request.scope()).await.unwrap().unwrap();
    assert!(record.is_in_flight(), "the new owner's claim must stand");
    assert_eq!(record.attempt, 2);
    drop_table(store.pool(), &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_handler_rolls_back_and_keeps_the_claim_while_not_started_releases_it() {
    let store = common::store().await;
    let table = business_table(store.pool()).await;

    let failing = request(Duration::from_secs(30));
    let sql = insert(&table, &failing, "half done");
    let outcome: Result<RunOutcome, RunError<String>> = store
        .run_in_transaction(&failing, move |tx, _| {
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(sql))
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                Err(HandlerError::Failed("payment declined".to_string()))
            })
        })
        .await;
    assert!(matches!(outcome, Err(RunError::Failed(_))));
    assert!(
        store
            .get(failing.scope())
            .await
            .unwrap()
            .unwrap()
            .is_in_flight()
    );

    let invalid = request(Duration::from_secs(30));
    let sql = insert(&table, &invalid, "never");
    let outcome: Result<RunOutcome, RunError<String>> = store
        .run_in_transaction(&invalid, move |tx, _| {
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(sql))
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                Err(HandlerError::NotStarted("bad input".to_string()))
            })
        })
        .await;
    assert!(matches!(outcome, Err(RunError::Rejected(_))));
    assert_eq!(store.get(invalid.scope()).await.unwrap(), None);
    assert_eq!(rows(store.pool(), &table).await, 0);
    drop_table(store.pool(), &table).await;
}

/// One delivery of a message, processed in the consumer's own transaction.
async fn deliver(store: &PostgresStore, table: &str, request: &ClaimRequest) -> &'static str {
    let mut tx = store.pool().begin().await.unwrap();
    match store.claim_in(&mut tx, request).await.unwrap() {
        ClaimOutcome::Claimed { lease, .. } => {
            sqlx::query(AssertSqlSafe(insert(table, request, "effect")))
                .execute(&mut *tx)
                .await
                .unwrap();
            // Hold the transaction open so the duplicate arrives meanwhile.
            tokio::time::sleep(Duration::from_millis(200)).await;
            store
                .complete_in(&mut tx, &lease, &StoredResponse::new(200, "processed"))
                .await
                .unwrap();
            tx.commit().await.unwrap();
            "processed"
        }
        ClaimOutcome::Completed(response) => {
            assert_eq!(response.body(), b"processed");
            tx.commit().await.unwrap();
            "duplicate"
        }
        other => panic!("a duplicate delivery should wait, then replay: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inbox_mode_two_concurrent_deliveries_make_one_domain_row() {
    let store = common::store().await;
    let table = business_table(store.pool()).await;
    for _ in 0..3 {
        let request = request(Duration::from_secs(30));
        let (a, b) = tokio::join!(
            deliver(&store, &table, &request),
            deliver(&store, &table, &request)
        );
        let mut outcomes = [a, b];
        outcomes.sort_unstable();
        assert_eq!(outcomes, ["duplicate", "processed"]);
    }
    assert_eq!(rows(store.pool(), &table).await, 3);
    drop_table(store.pool(), &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inbox_claim_rolled_back_lets_the_redelivery_claim() {
    let store = common::store().await;
    let request = request(Duration::from_secs(30));
    let mut tx = store.pool().begin().await.unwrap();
    assert!(matches!(
        store.claim_in(&mut tx, &request).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    tx.rollback().await.unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    let ClaimOutcome::Claimed { lease, .. } = store.claim_in(&mut tx, &request).await.unwrap()
    else {
        panic!("the rolled-back claim left a record behind");
    };
    assert_eq!(lease.attempt(), 1);
    tx.commit().await.unwrap();
}
