//! Connections to the DynamoDB server cut at random by a proxy, under a
//! storm of callers. After the fault, no call failed in a way a client
//! cannot retry, no call hung, a call succeeded soon after, and every key a
//! caller was told `Executed` replays its bytes.
//!
//! The test prints one row of the faults table (fault, backend, longest
//! call, errors by type, recovery time, data lost).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::sync::Arc;
use std::time::Duration;

use idem_conformance::faults::{Storm, connections_cut_at_random};
use idem_dynamo::DynamoOptions;

/// Each operation's limit in the store: moto, one Python process, takes
/// past a second per request on a loaded machine, and a call it merely
/// serves late is no fault of the network's.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(3);
/// The harness's bound on one call: above the store's limit, so the store's
/// is what fires.
const CALL_LIMIT: Duration = Duration::from_secs(10);
/// How soon after the fault's end a call must succeed.
const RECOVERY: Duration = Duration::from_secs(10);
/// How long the replay check may take: every key is retried until then, so
/// only a key that never replays fails it, however slow moto is.
const CHECK: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_cut_at_random_lose_nothing() {
    let proxy = common::proxy().await;
    // A client that gives up on a connection in half a second.
    let store = common::store_through(
        &proxy,
        Duration::from_millis(500),
        DynamoOptions::default().table(&common::own_table("faults")),
        OPERATION_TIMEOUT,
    )
    .await;
    Storm {
        call_limit: CALL_LIMIT,
        ..Storm::default()
    }
    .run_and_check("dynamodb (moto)", Arc::new(store), CHECK, || {
        connections_cut_at_random(&proxy)
    })
    .await
    .assert_nothing_lost(RECOVERY);
}
