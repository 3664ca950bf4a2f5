//! A stalled network fails every call within the operation timeout, as a
//! retryable `Unavailable`, and a retry with the same request or lease gets
//! the true answer once the network is back. A fault proxy sits between the
//! pool and the server named by `IDEM_POSTGRES_URL`. The scenarios are the
//! suite's (`idem_conformance::faults`); the transaction's calls are
//! Postgres's own.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::time::Duration;

use idem_conformance::faults::{self, FaultProxy, StallBounds};
use idem_conformance::support::{fresh_scope, long, response};
use idem_core::Operation;
use idem_core::store::{ClaimOutcome, IdempotencyStore, Transaction};
use idem_postgres::sqlx::postgres::PgPoolOptions;
use idem_postgres::{PostgresOptions, PostgresStore};

/// The store's operation timeout in these tests.
const LIMIT: Duration = Duration::from_millis(300);
/// What a stalled call must keep to.
const BOUNDS: StallBounds = StallBounds::new("postgres", LIMIT);

/// A migrated store whose pool reaches the server through a fault proxy.
/// sqlx's `acquire_timeout` is far longer than the store's limit, so the
/// store's limit is what fires under a stall.
async fn proxied_store() -> (FaultProxy, PostgresStore) {
    let (proxy, options) = common::through_proxy().await;
    let pool = idem_postgres::guarded(PgPoolOptions::new())
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await
        .expect("connect through the proxy");
    let options = PostgresOptions::default()
        .store_options(idem_core::StoreOptions::default().with_operation_timeout(LIMIT));
    let store = PostgresStore::with_options(pool, options).expect("valid options");
    store.migrate().await.expect("migrate through the proxy");
    (proxy, store)
}

// The claim and the completion on a stalled network, as the suite words
// them: a test each, named after its scenario.
idem_conformance::stall_tests!(proxied_store(), BOUNDS);

/// Every other operation, the purge and the transaction's included, is
/// bounded as well, and each retry gets its answer; the transaction path
/// then works again on a fresh transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_other_operation_on_a_stalled_network_times_out_and_its_retry_succeeds() {
    let (proxy, store) = proxied_store().await;
    // Opened before the stall; its every call meets it.
    let mut open = store.begin().await.unwrap();
    faults::every_other_operation_on_a_stalled_network_times_out_and_its_retry_succeeds(
        &store,
        &proxy,
        &BOUNDS,
        async |lease, point| {
            let mut longest = BOUNDS
                .times_out(Operation::Purge, store.purge_expired())
                .await;
            longest = longest.max(
                BOUNDS
                    .times_out(Operation::Transaction, store.begin())
                    .await,
            );
            longest = longest.max(
                BOUNDS
                    .times_out(
                        Operation::Claim,
                        store.claim_in(&mut open, &long(&fresh_scope(), "b")),
                    )
                    .await,
            );
            longest = longest.max(
                BOUNDS
                    .times_out(Operation::Checkpoint, open.checkpoint(lease, point))
                    .await,
            );
            longest = longest.max(
                BOUNDS
                    .times_out(Operation::Complete, open.complete(lease, &response("t")))
                    .await,
            );
            longest.max(
                BOUNDS
                    .times_out(Operation::Transaction, open.commit())
                    .await,
            )
        },
    )
    .await;
    BOUNDS
        .retried("purge", || store.purge_expired())
        .await
        .unwrap();

    // The transaction path works again on a fresh transaction.
    let scope = fresh_scope();
    let mut tx = BOUNDS.retried("begin", || store.begin()).await.unwrap();
    let ClaimOutcome::Claimed { lease, .. } =
        store.claim_in(&mut tx, &long(&scope, "c")).await.unwrap()
    else {
        panic!("claim_in")
    };
    tx.complete(&lease, &response("in tx")).await.unwrap();
    tx.commit().await.unwrap();
    let record = store.get(&scope).await.unwrap().expect("the record");
    assert_eq!(record.response(), Some(&response("in tx")));
}
