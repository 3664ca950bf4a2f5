//! A reply lost after the DynamoDB server served the request (the SDK sends
//! it again): the store's answer is true to what it stored.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use idem_conformance::faults::lost_replies_are_answered_truthfully;
use idem_dynamo::DynamoOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_answered_truthfully() {
    let proxy = common::proxy().await;
    let store = common::store_through(
        &proxy,
        common::CONNECT_TIMEOUT,
        DynamoOptions::default().table(&common::own_table("lost-reply")),
        common::GENEROUS_OPERATION_TIMEOUT,
    )
    .await;
    let answers = lost_replies_are_answered_truthfully(&store, &proxy).await;
    println!("{answers:?}");
    // The SDK resends after a lost reply: the store's own answer is the true one.
    assert_eq!(answers.claim, "Claimed");
    assert_eq!(answers.complete, "Ok");
}
