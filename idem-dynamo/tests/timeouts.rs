//! A stalled network fails every call within the operation timeout, as a
//! retryable `Unavailable`, and a retry with the same request or lease gets
//! the true answer once the network is back. A fault proxy sits between the
//! SDK client and the server named by `IDEM_DYNAMO_ENDPOINT`. The scenarios
//! are the suite's (`idem_conformance::faults`); the purge and the
//! transaction's commit are DynamoDB's own.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::time::Duration;

use idem_conformance::faults::{self, FaultProxy, StallBounds};
use idem_conformance::support::{fresh_scope, long, response};
use idem_core::Operation;
use idem_core::store::{IdempotencyStore, Transaction};
use idem_dynamo::{DynamoOptions, DynamoStore};

/// The store's operation timeout in these tests: moto serves a request in
/// tens of milliseconds on a quiet machine but past 300 ms on a loaded one,
/// so only a stall may make a call outlast the limit.
const LIMIT: Duration = Duration::from_secs(1);
/// What a stalled call must keep to.
const BOUNDS: StallBounds = StallBounds::new("dynamodb", LIMIT);

/// A store on the shared conformance table through a fresh proxy, with the
/// test's operation timeout. Its client's own operation timeout is far
/// longer than the store's (and there is no per-attempt timeout), so the
/// store's limit is what fires under a stall; the SDK's default retries
/// stay on.
async fn proxied_store() -> (FaultProxy, DynamoStore) {
    let proxy = common::proxy().await;
    let store = common::store_through(
        &proxy,
        Duration::from_secs(10),
        DynamoOptions::default().table("idem-conformance"),
        LIMIT,
    )
    .await;
    (proxy, store)
}

// The claim and the completion on a stalled network, as the suite words
// them: a test each, named after its scenario.
idem_conformance::stall_tests!(proxied_store(), BOUNDS);

/// Every other operation, the purge and the transaction's commit included,
/// is bounded as well, and each retry gets its answer; the transaction path
/// then works again on a fresh transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_other_operation_on_a_stalled_network_times_out_and_its_retry_succeeds() {
    let (proxy, store) = proxied_store().await;
    faults::every_other_operation_on_a_stalled_network_times_out_and_its_retry_succeeds(
        &store,
        &proxy,
        &BOUNDS,
        async |lease, point| {
            let purge = BOUNDS
                .times_out(Operation::Purge, store.purge_expired())
                .await;
            // A transaction sends nothing before its commit.
            let mut tx = store.begin().await.unwrap();
            tx.checkpoint(lease, point).await.unwrap();
            purge.max(BOUNDS.times_out(Operation::Transaction, tx.commit()).await)
        },
    )
    .await;

    // The transaction path works again on a fresh transaction: each try on
    // a key of its own, so one that outlasted the limit on a slow server
    // leaves nothing the next must answer for.
    let (scope, done) = BOUNDS
        .retried("a transaction", || async {
            let scope = fresh_scope();
            let lease = BOUNDS.claimed(&store, &long(&scope, "c")).await;
            let mut tx = store.begin().await?;
            tx.complete(&lease, &response("in tx")).await?;
            tx.commit().await?;
            Ok((scope, response("in tx")))
        })
        .await
        .unwrap();
    let record = BOUNDS
        .retried("get", || store.get(&scope))
        .await
        .unwrap()
        .expect("the record");
    assert_eq!(record.response(), Some(&done));
}
