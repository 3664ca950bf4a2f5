//! Retention and sweeping on a table of their own, where every row is ours
//! to count; and the replay path, which must not rewrite the row.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::time::Duration;

use std::sync::Arc;

use idem_conformance::support::eventually;
use idem_core::store::{ClaimOutcome, ClaimRequest, IdempotencyStore};
use idem_core::{Fingerprint, Scope, StoredResponse, Sweeper};
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_postgres::{PostgresOptions, PostgresStore};

fn request(tenant: &str, key: &str) -> ClaimRequest {
    ClaimRequest::new(
        Scope::parse(tenant, key).unwrap(),
        Fingerprint::of_bytes("body"),
    )
}

async fn count(store: &PostgresStore, filter: &str) -> i64 {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {} WHERE {filter}",
        store.table()
    )))
    .fetch_one(store.pool())
    .await
    .unwrap()
}

async fn drop_table(store: &PostgresStore) {
    let table = store.table();
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE {table}; DROP FUNCTION {table}_claim"
    )))
    .execute(store.pool())
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sweep_of_100000_expired_rows_runs_beside_live_claims() {
    let own = common::store_on_own_table("sweep").await;
    let store = PostgresStore::with_options(
        own.pool().clone(),
        PostgresOptions::default()
            .table(&own.table().to_string())
            .purge_batch(2_000),
    )
    .unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {} (tenant, key, fingerprint, owner, attempt, status, expires_at) \
         SELECT 'old', 'k' || g, sha256('body'::bytea), gen_random_uuid(), 1, 'completed', \
                now() - interval '1 hour' \
         FROM generate_series(1, 100000) AS g",
        store.table()
    )))
    .execute(store.pool())
    .await
    .unwrap();
    assert_eq!(count(&store, "true").await, 100_000);

    let sweeper = {
        let store = store.clone();
        tokio::spawn(async move { store.purge_expired().await })
    };
    // Live claims beside the sweep: fresh keys, and expired keys claimed afresh.
    let mut claimed = Vec::new();
    for i in 0..300 {
        let request = if i % 3 == 0 {
            request("old", &format!("k{}", 1 + i * 300))
        } else {
            request("live", &format!("k{i}"))
        };
        let outcome = store.claim(&request).await.unwrap();
        let ClaimOutcome::Claimed { lease, .. } = outcome else {
            panic!("live claim during the sweep: {outcome:?}");
        };
        assert_eq!(lease.attempt(), 1);
        if i % 2 == 0 {
            store
                .complete(&lease, &StoredResponse::new(200, "ok"))
                .await
                .unwrap();
        }
        claimed.push(request);
    }
    let purged = sweeper.await.unwrap().unwrap();
    // A second pass finds whatever the first skipped while it was locked.
    let purged = purged + store.purge_expired().await.unwrap();

    assert_eq!(count(&store, "expires_at <= now()").await, 0);
    assert_eq!(
        count(&store, "true").await,
        300,
        "only the live claims remain"
    );
    // An expired key claimed afresh before the sweep reached it is live again;
    // one the sweep deleted first was inserted anew. Either way it stays.
    assert!(
        (100_000 - 100..=100_000).contains(&purged),
        "purged {purged} of 100,000 expired rows"
    );
    for request in &claimed {
        assert!(store.get(request.scope()).await.unwrap().is_some());
    }
    drop_table(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweeper_task_purges_on_its_interval_and_stops() {
    let store = common::store_on_own_table("sweeper").await;
    let short = request("t", "short")
        .with_lease(Duration::from_millis(50))
        .unwrap()
        .with_retention(Duration::from_millis(50))
        .unwrap();
    store.claim(&short).await.unwrap();
    store.claim(&request("t", "long")).await.unwrap();
    let sweeper = Sweeper::spawn(Arc::new(store.clone()), Duration::from_millis(50));
    eventually("the sweeper to purge", || async {
        (count(&store, "true").await == 1).then_some(())
    })
    .await;
    sweeper.stop().await;
    assert_eq!(count(&store, "key = 'long'").await, 1);
    drop_table(&store).await;
}

/// Replays and in-progress answers read the row and write nothing: no new
/// tuple version (xmin stays), no dead tuples, no WAL for the row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_and_in_progress_do_not_rewrite_the_row() {
    let store = common::store_on_own_table("replay").await;
    let xmin = |key: &'static str| {
        let store = store.clone();
        async move {
            sqlx::query_scalar::<_, String>(AssertSqlSafe(format!(
                "SELECT xmin::text FROM {} WHERE key = '{key}'",
                store.table()
            )))
            .fetch_one(store.pool())
            .await
            .unwrap()
        }
    };
    let done = request("t", "done");
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&done).await.unwrap() else {
        panic!()
    };
    store
        .complete(&lease, &StoredResponse::new(200, "ok"))
        .await
        .unwrap();
    let busy = request("t", "busy");
    store.claim(&busy).await.unwrap();
    let (done_before, busy_before) = (xmin("done").await, xmin("busy").await);
    for _ in 0..50 {
        assert!(matches!(
            store.claim(&done).await.unwrap(),
            ClaimOutcome::Completed(_)
        ));
        assert!(matches!(
            store.claim(&busy.clone().with_new_owner()).await.unwrap(),
            ClaimOutcome::InProgress { .. }
        ));
        let other = ClaimRequest::new(done.scope().clone(), Fingerprint::of_bytes("other"));
        assert_eq!(store.claim(&other).await.unwrap(), ClaimOutcome::Mismatch);
    }
    assert_eq!(xmin("done").await, done_before, "a replay rewrote the row");
    assert_eq!(
        xmin("busy").await,
        busy_before,
        "an in-progress answer rewrote the row"
    );
    drop_table(&store).await;
}

#[tokio::test]
async fn table_names_that_are_not_identifiers_are_refused() {
    let pool = common::pool().await;
    for bad in ["idem records", "idem;drop table x", "Idem", "a.b.c", ""] {
        let err = PostgresStore::with_options(pool.clone(), PostgresOptions::default().table(bad))
            .unwrap_err();
        assert!(!err.to_string().is_empty(), "{bad:?}");
    }
    assert!(
        PostgresStore::with_options(pool, PostgresOptions::default().table("public.idem_ok"))
            .is_ok()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_header_bytes_and_escaped_checkpoint_text_are_stored() {
    let store = common::store().await;
    let req = request(&format!("bytes-{}", uuid::Uuid::new_v4()), "k");
    let ClaimOutcome::Claimed { lease, .. } = store.claim(&req).await.unwrap() else {
        panic!()
    };
    // Text columns cannot hold NUL; checkpoint JSON escapes it, and header
    // names are stored as bytes.
    let point = idem_core::Checkpoint::new("nul", &"a\u{0}b").unwrap();
    store.checkpoint(&lease, &point).await.unwrap();
    let record = store.get(req.scope()).await.unwrap().unwrap();
    assert_eq!(record.checkpoint(), Some(&point));
    let response =
        StoredResponse::new(200, vec![0u8; 3]).with_header("x-\u{0}-name", vec![0u8, 255]);
    store.complete(&lease, &response).await.unwrap();
    let record = store.get(req.scope()).await.unwrap().unwrap();
    assert_eq!(record.response(), Some(&response));
}
