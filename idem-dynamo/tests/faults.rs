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

/// Each operation's limit in the store.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(1);
/// How soon after the fault's end a call must succeed.
const RECOVERY: Duration = Duration::from_secs(10);
/// How long the replay check may take.
const CHECK: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_cut_at_random_lose_nothing() {
    let proxy = common::proxy().await;
    // A client that gives up on a connection in half a second.
    let store = common::store_through(
        &proxy,
        Duration::from_millis(500),
        DynamoOptions::default()
            .table(&common::own_table("faults"))
            .operation_timeout(OPERATION_TIMEOUT),
    )
    .await;
    Storm::default()
        .run_and_check("dynamodb (moto)", Arc::new(store), CHECK, || {
            connections_cut_at_random(&proxy)
        })
        .await
        .assert_nothing_lost(RECOVERY);
}
