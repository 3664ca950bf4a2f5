//! Completion inside the caller's transaction, through the one runner: the
//! business effect and the completed marker commit or vanish together.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::time::Duration;

use idem_conformance::support::{eventually, fresh_scope, wait_for_claim};

use common::{rows, runner};
use idem_core::store::{ClaimOutcome, ClaimRequest, IdempotencyStore, Transaction};
use idem_core::{HandlerError, Idempotency, RunError, RunOutcome, StoreError, StoredResponse};
use idem_postgres::PostgresStore;
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool};

/// A business table of its own: tenant, key and a note.
async fn business_table(pool: &PgPool) -> String {
    common::business_table(
        pool,
        "tenant text NOT NULL, key text NOT NULL, note text NOT NULL",
    )
    .await
}

async fn drop_table(pool: &PgPool, table: &str) {
    sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(pool)
        .await
        .unwrap();
}

fn request(lease: Duration) -> ClaimRequest {
    idem_conformance::support::request(&fresh_scope(), "order body", lease)
}

fn insert(table: &str, request: &ClaimRequest, note: &str) -> String {
    format!(
        "INSERT INTO {table} VALUES ('{}', '{}', '{note}')",
        request.scope().tenant().as_str(),
        request.scope().key().as_str()
    )
}

/// A transactional run that writes one business row and answers 201 `placed`.
async fn place(
    idem: &Idempotency<dyn IdempotencyStore>,
    store: &PostgresStore,
    table: &str,
    request: &ClaimRequest,
) -> Result<RunOutcome, RunError> {
    let sql = insert(table, request, "placed");
    idem.run_in(
        request.scope().clone(),
        request.fingerprint(),
        store.begin(),
        |ctx, mut tx| async move {
            assert_eq!(ctx.attempt(), 1);
            sqlx::query(AssertSqlSafe(sql)).execute(&mut *tx).await?;
            Ok((tx, StoredResponse::new(201, "placed")))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completed_handler_commits_exactly_one_business_row() {
    let store = common::store().await;
    let idem = runner(&store, Duration::from_secs(30));
    let table = business_table(store.pool()).await;
    let request = request(Duration::from_secs(30));
    for expect_replay in [false, true, true] {
        let outcome = place(&idem, &store, &table, &request).await.unwrap();
        assert_eq!(outcome.is_replay(), expect_replay);
        assert_eq!(outcome.response().body(), b"placed");
    }
    assert_eq!(rows(store.pool(), &table).await, 1);
    drop_table(store.pool(), &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_lease_rolls_back_the_business_rows() {
    let store = common::store().await;
    let idem = runner(&store, Duration::from_millis(200));
    let table = business_table(store.pool()).await;
    let request = request(Duration::from_millis(200));
    let sql = insert(&table, &request, "stale owner");
    let (rival, rival_request) = (store.clone(), request.clone());
    let outcome = idem
        .run_in(
            request.scope().clone(),
            request.fingerprint(),
            store.begin(),
            |_ctx, mut tx| async move {
                sqlx::query(AssertSqlSafe(sql)).execute(&mut *tx).await?;
                // The handler stalls past its lease; a retry takes the key over.
                let (lease, _) = wait_for_claim(&rival, &rival_request).await;
                assert_eq!(lease.attempt(), 2);
                Ok((tx, StoredResponse::new(201, "stale")))
            },
        )
        .await;
    assert!(matches!(outcome, Err(RunError::LostLease)), "{outcome:?}");
    assert_eq!(
        rows(store.pool(), &table).await,
        0,
        "business write survived a lost lease"
    );
    let record = store.get(request.scope()).await.unwrap().unwrap();
    assert!(record.is_in_flight(), "the new owner's claim must stand");
    assert_eq!(record.attempt(), 2);
    drop_table(store.pool(), &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_handler_releases_the_claim_so_a_retry_runs_at_once() {
    let store = common::store().await;
    let idem = runner(&store, Duration::from_secs(30));
    let table = business_table(store.pool()).await;
    let request = request(Duration::from_secs(30));
    let sql = insert(&table, &request, "half done");
    let outcome = idem
        .run_in(
            request.scope().clone(),
            request.fingerprint(),
            store.begin(),
            |ctx, mut tx| async move {
                sqlx::query(AssertSqlSafe(sql)).execute(&mut *tx).await?;
                ctx.checkpoint_in(&mut tx, "written", &1).await?;
                // A second error type through the same `?`.
                let _: u32 = "not a number".parse()?;
                Ok((tx, StoredResponse::new(201, "never")))
            },
        )
        .await;
    assert!(
        matches!(outcome, Err(RunError::NotStarted(_))),
        "{outcome:?}"
    );
    assert_eq!(
        store.get(request.scope()).await.unwrap(),
        None,
        "claim kept"
    );
    assert_eq!(rows(store.pool(), &table).await, 0);
    let retry = place(&idem, &store, &table, &request).await.unwrap();
    assert_eq!(
        retry,
        RunOutcome::Executed(StoredResponse::new(201, "placed"))
    );
    assert_eq!(rows(store.pool(), &table).await, 1);
    drop_table(store.pool(), &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_that_may_have_started_keeps_the_claim() {
    let store = common::store().await;
    let idem = runner(&store, Duration::from_secs(30));
    let request = request(Duration::from_secs(30));
    let outcome = idem
        .run_in(
            request.scope().clone(),
            request.fingerprint(),
            store.begin(),
            |_ctx, _tx| async move {
                Err::<(idem_postgres::PgTransaction, StoredResponse), _>(HandlerError::started(
                    "the provider was called",
                ))
            },
        )
        .await;
    assert!(matches!(outcome, Err(RunError::Failed(_))), "{outcome:?}");
    let record = store.get(request.scope()).await.unwrap().unwrap();
    assert!(record.is_in_flight());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_commits_with_its_phase_and_a_takeover_receives_it() {
    let store = common::store().await;
    let idem = runner(&store, Duration::from_millis(300));
    let table = business_table(store.pool()).await;
    let request = request(Duration::from_millis(300));
    let (phase_store, sql) = (store.clone(), insert(&table, &request, "phase 1"));
    let crashed = idem
        .run_in(
            request.scope().clone(),
            request.fingerprint(),
            store.begin(),
            |ctx, _final_tx| async move {
                // Phase 1 commits its rows and its recovery point together.
                let mut phase = phase_store.begin().await?;
                sqlx::query(AssertSqlSafe(sql)).execute(&mut *phase).await?;
                ctx.checkpoint_in(&mut phase, "phase-1", &"reserved")
                    .await?;
                phase.commit().await?;
                Err::<(idem_postgres::PgTransaction, StoredResponse), _>(HandlerError::started(
                    "crashed during phase 2",
                ))
            },
        )
        .await;
    assert!(matches!(crashed, Err(RunError::Failed(_))), "{crashed:?}");
    assert_eq!(rows(store.pool(), &table).await, 1);
    let record = store.get(request.scope()).await.unwrap().unwrap();
    assert_eq!(record.checkpoint().map(|c| c.name()), Some("phase-1"));
    let resumed = eventually("a takeover after the lease", || async {
        let outcome = idem
            .run_in(
                request.scope().clone(),
                request.fingerprint(),
                store.begin(),
                |ctx, tx| async move {
                    let point = ctx.previous_checkpoint().expect("checkpoint carried");
                    assert_eq!(point.name(), "phase-1");
                    assert_eq!(ctx.attempt(), 2);
                    Ok((tx, StoredResponse::new(201, "resumed")))
                },
            )
            .await;
        match outcome {
            Err(RunError::InProgress { .. }) => None,
            other => Some(other),
        }
    })
    .await;
    assert_eq!(
        resumed.unwrap(),
        RunOutcome::Executed(StoredResponse::new(201, "resumed"))
    );
    drop_table(store.pool(), &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_commit_is_rejected_and_releases_the_claim() {
    let store = common::store().await;
    let idem = runner(&store, Duration::from_secs(30));
    let table = format!("unique_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {table} (id int UNIQUE DEFERRABLE INITIALLY DEFERRED)"
    )))
    .execute(store.pool())
    .await
    .unwrap();
    let request = request(Duration::from_secs(30));
    let sql = format!("INSERT INTO {table} VALUES (1), (1)");
    let outcome = idem
        .run_in(
            request.scope().clone(),
            request.fingerprint(),
            store.begin(),
            |_ctx, mut tx| async move {
                sqlx::query(AssertSqlSafe(sql)).execute(&mut *tx).await?;
                Ok((tx, StoredResponse::new(201, "never stored")))
            },
        )
        .await;
    assert!(
        matches!(outcome, Err(RunError::Store(StoreError::Rejected { .. }))),
        "{outcome:?}"
    );
    assert_eq!(store.get(request.scope()).await.unwrap(), None);
    drop_table(store.pool(), &table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_renewal_holds_the_key_through_a_long_transactional_handler() {
    let store = common::store().await;
    let lease = Duration::from_millis(600);
    let idem = runner(&store, lease)
        .with_max_run_time(Duration::from_secs(30))
        .unwrap();
    let table = business_table(store.pool()).await;
    let request = request(lease);
    let (rival, rival_request) = (store.clone(), request.clone());
    let sql = insert(&table, &request, "long");
    let outcome = idem
        .run_in(
            request.scope().clone(),
            request.fingerprint(),
            store.begin(),
            |_ctx, mut tx| async move {
                sqlx::query(AssertSqlSafe(sql)).execute(&mut *tx).await?;
                let until = tokio::time::Instant::now() + lease * 3;
                while tokio::time::Instant::now() < until {
                    let duplicate = rival.claim(&rival_request).await.unwrap();
                    assert!(
                        matches!(duplicate, ClaimOutcome::InProgress { .. }),
                        "lease lapsed under auto-renewal: {duplicate:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Ok((tx, StoredResponse::new(201, "long job")))
            },
        )
        .await;
    assert_eq!(
        outcome.unwrap(),
        RunOutcome::Executed(StoredResponse::new(201, "long job"))
    );
    assert_eq!(rows(store.pool(), &table).await, 1);
    drop_table(store.pool(), &table).await;
}

/// One delivery of a message, processed in the consumer's own transaction.
async fn deliver(store: &PostgresStore, table: &str, request: &ClaimRequest) -> &'static str {
    let mut tx = store.begin().await.unwrap();
    match store.claim_in(&mut tx, request).await.unwrap() {
        ClaimOutcome::Claimed { lease, .. } => {
            sqlx::query(AssertSqlSafe(insert(table, request, "effect")))
                .execute(&mut *tx)
                .await
                .unwrap();
            // Hold the transaction open so the duplicate arrives meanwhile.
            tokio::time::sleep(Duration::from_millis(200)).await;
            tx.complete(&lease, &StoredResponse::new(200, "processed"))
                .await
                .unwrap();
            tx.commit().await.unwrap();
            "processed"
        }
        ClaimOutcome::Completed(response) => {
            assert_eq!(response.body(), b"processed");
            Transaction::commit(tx).await.unwrap();
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
