//! The public journal suite against a real Postgres, and what only the
//! Postgres journal does: a schema-qualified table, recording inside the
//! caller's transaction.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::time::Duration;

use idem_core::Tenant;
use idem_core::store::{
    Acquired, Finish, JournalStore, ListQuery, NewOperation, OperationId, OperationKey,
    OperationState, OwnerToken,
};
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_postgres::{PostgresJournal, PostgresJournalOptions};
use serde_json::json;

/// A migrated journal on the default table.
async fn journal() -> PostgresJournal {
    let journal = PostgresJournal::new(common::pool().await);
    journal.migrate().await.expect("migrate");
    journal
}

mod suite {
    idem_conformance::journal_suite!(super::journal());
}

fn fresh_key() -> OperationKey {
    let namespace = Tenant::new(format!("pg-journal-{}", uuid::Uuid::new_v4())).unwrap();
    OperationKey::new(namespace, OperationId::new("order-7", "charge").unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_qualified_table_migrates_and_works() {
    let pool = common::pool().await;
    sqlx::query("CREATE SCHEMA IF NOT EXISTS app")
        .execute(&pool)
        .await
        // Racing test binaries may both create it: one of them wins.
        .or_else(|e| match &e {
            sqlx::Error::Database(db) if db.code().as_deref() == Some("23505") => {
                Ok(Default::default())
            }
            _ => Err(e),
        })
        .unwrap();
    let options = PostgresJournalOptions::default().table("app.idem_journal");
    let journal = PostgresJournal::with_options(pool.clone(), options).unwrap();
    assert_eq!(journal.table().to_string(), "app.idem_journal");
    journal.migrate().await.unwrap();
    // Twice: every statement of the migration is idempotent.
    journal.migrate().await.unwrap();

    // Every object lives in the schema, the index included.
    let index: Option<String> = sqlx::query_scalar(
        "SELECT schemaname::text FROM pg_indexes WHERE indexname = 'idem_journal_list_idx' \
         AND tablename = 'idem_journal' AND schemaname = 'app'",
    )
    .fetch_optional(&pool)
    .await
    .unwrap();
    assert_eq!(index.as_deref(), Some("app"));
    for function in ["now", "record", "acquire", "mark_sent", "finish"] {
        let found: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = 'app' AND p.proname = 'idem_journal_{function}'"
        )))
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(found, 1, "app.idem_journal_{function}");
    }

    let key = fresh_key();
    let recorded = journal
        .record(&NewOperation::new(key.clone(), json!({"amount": 7})))
        .await
        .unwrap();
    let owner = OwnerToken::generate();
    let Acquired::Held { .. } = journal
        .acquire(key.held_by(owner), Duration::from_secs(30))
        .await
        .unwrap()
    else {
        panic!("expected the lease")
    };
    let sent = journal.mark_sent(key.held_by(owner), 0).await.unwrap();
    assert_eq!(sent.parts().sends, 1);
    let done = journal
        .finish(
            key.held_by(owner),
            &Finish::new(OperationState::Succeeded, Some("paid".into())),
        )
        .await
        .unwrap();
    assert_eq!(done.state(), OperationState::Succeeded);
    assert_eq!(done.provider_key(), recorded.provider_key());
    let listed = journal
        .list(&ListQuery::new(key.namespace().clone(), &[OperationState::Succeeded]).limit(10))
        .await
        .unwrap();
    assert_eq!(listed, [done]);
    let in_public: Option<String> =
        sqlx::query_scalar("SELECT provider_key FROM app.idem_journal WHERE namespace = $1")
            .bind(key.namespace().as_str())
            .fetch_optional(&pool)
            .await
            .unwrap();
    assert_eq!(in_public.as_deref(), Some(recorded.provider_key()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_in_commits_with_the_callers_transaction_and_vanishes_on_rollback() {
    let journal = journal().await;
    let table = common::business_table(journal.pool(), "id text NOT NULL").await;

    // Rolled back: neither the business row nor the operation is there.
    let lost = fresh_key();
    let mut tx = journal.pool().begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} VALUES ('lost')"
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    let inside = journal
        .record_in(&mut tx, &NewOperation::new(lost.clone(), json!({"n": 1})))
        .await
        .unwrap();
    assert_eq!(inside.state(), OperationState::Pending);
    // Not visible outside the transaction until it commits.
    assert_eq!(journal.get(&lost).await.unwrap(), None);
    tx.rollback().await.unwrap();
    assert_eq!(journal.get(&lost).await.unwrap(), None);
    assert_eq!(common::rows(journal.pool(), &table).await, 0);

    // Committed: both are.
    let kept = fresh_key();
    let mut tx = journal.pool().begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} VALUES ('kept')"
    )))
    .execute(&mut *tx)
    .await
    .unwrap();
    let recorded = journal
        .record_in(&mut tx, &NewOperation::new(kept.clone(), json!({"n": 2})))
        .await
        .unwrap();
    // A second record in the same transaction returns the first.
    let again = journal
        .record_in(&mut tx, &NewOperation::new(kept.clone(), json!({"n": 3})))
        .await
        .unwrap();
    assert_eq!(again, recorded);
    tx.commit().await.unwrap();
    assert_eq!(journal.get(&kept).await.unwrap(), Some(recorded));
    assert_eq!(common::rows(journal.pool(), &table).await, 1);
    sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(journal.pool())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_racing_an_open_transaction_gets_what_it_committed() {
    let journal = journal().await;
    let key = fresh_key();
    let mut tx = journal.pool().begin().await.unwrap();
    let inside = journal
        .record_in(
            &mut tx,
            &NewOperation::new(key.clone(), json!({"first": true})),
        )
        .await
        .unwrap();
    // The racing record waits on the row until the transaction ends.
    let racing = {
        let journal = journal.clone();
        let key = key.clone();
        tokio::spawn(async move {
            journal
                .record(&NewOperation::new(key, json!({"first": false})))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!racing.is_finished(), "the racing record did not wait");
    tx.commit().await.unwrap();
    assert_eq!(racing.await.unwrap().unwrap(), inside);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_come_back_exactly_as_recorded() {
    let journal = journal().await;
    let key = fresh_key();
    // What jsonb would rewrite or refuse: a NUL, a float's form, key order.
    let request =
        json!({"z": "nul \u{0} here", "a": 1.0, "big": 12345678901234567890u64, "f": 0.1});
    let recorded = journal
        .record(&NewOperation::new(key.clone(), request.clone()))
        .await
        .unwrap();
    assert_eq!(recorded.request(), &request);
    assert_eq!(
        journal.get(&key).await.unwrap().unwrap().request(),
        &request
    );
}

#[test]
fn invalid_options_are_refused_at_construction() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let _guard = runtime.enter();
    // A lazy pool connects on first use, which never comes.
    let pool = idem_postgres::sqlx::postgres::PgPoolOptions::new()
        .connect_lazy("postgres://127.0.0.1:1/none")
        .unwrap();
    for bad in ["Journal", "a.b.c", "x; DROP TABLE y"] {
        let refused = PostgresJournal::with_options(
            pool.clone(),
            PostgresJournalOptions::default().table(bad),
        );
        assert!(
            matches!(refused, Err(idem_core::StoreError::InvalidInput(_))),
            "{bad}: {refused:?}"
        );
    }
    let caps = PostgresJournal::new(pool).capabilities();
    assert_eq!(caps.store, "postgres");
    assert_eq!(caps.clock, idem_core::store::ClockSource::Server);
    assert_eq!(caps.durability, idem_core::store::Durability::Durable);
    assert_eq!(
        caps.transactions,
        idem_core::store::TransactionSharing::SameDatabase
    );
    assert_eq!(caps.max_response_bytes, usize::MAX);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_records_of_one_key_all_get_the_one_stored() {
    let journal = journal().await;
    for _ in 0..5 {
        let key = fresh_key();
        let racers: Vec<_> = (0..16)
            .map(|i| {
                let journal = journal.clone();
                let key = key.clone();
                tokio::spawn(async move {
                    journal
                        .record(&NewOperation::new(key, json!({ "racer": i })))
                        .await
                })
            })
            .collect();
        let mut recorded = Vec::new();
        for racer in racers {
            recorded.push(racer.await.unwrap().unwrap());
        }
        let stored = journal.get(&key).await.unwrap().unwrap();
        assert!(recorded.iter().all(|r| *r == stored), "{recorded:?}");
    }
}
