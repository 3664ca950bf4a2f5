//! A reply lost after Postgres served the request: the store's answer is
//! true to what it stored.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use idem_conformance::faults::lost_replies_are_answered_truthfully;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_answered_truthfully() {
    let (proxy, options) = common::through_proxy().await;
    let store = common::store_over_one_connection(options).await;
    let answers = lost_replies_are_answered_truthfully(&store, &proxy).await;
    println!("{answers:?}");
}
