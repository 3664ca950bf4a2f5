//! DynamoDB-specific behaviour: transact completion, the item size limit,
//! lingering items past retention, and one request per operation, counted by
//! the server on a table of each test's own.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::time::Duration;

use idem_conformance::support::cost_of_each_operation;
use idem_core::{
    Checkpoint, ClaimOutcome, ClaimRequest, Fingerprint, IdempotencyStore, ManualClock, Scope,
    StoreError, StoredResponse, Timestamp,
};
use idem_dynamo::aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use idem_dynamo::{DynamoStore, TransactError};

fn request(scope: &Scope, body: &str, lease_ms: u64) -> ClaimRequest {
    ClaimRequest::new(scope.clone(), Fingerprint::of_bytes(body))
        .with_lease_ttl(Duration::from_millis(lease_ms))
        .unwrap()
}

fn fresh(key: &str) -> Scope {
    Scope::parse(&format!("dynamo-{}", uuid::Uuid::new_v4()), key).unwrap()
}

async fn claimed(store: &DynamoStore, request: &ClaimRequest) -> idem_core::Lease {
    match store.claim(request).await.unwrap() {
        ClaimOutcome::Claimed { lease, .. } => lease,
        other => panic!("expected Claimed, got {other:?}"),
    }
}

/// A business item for the caller's side of a transaction.
fn order(table: &str, id: &str) -> TransactWriteItem {
    TransactWriteItem::builder()
        .put(
            Put::builder()
                .table_name(table)
                .item("pk", AttributeValue::S(format!("order#{id}")))
                .item("total", AttributeValue::N("42".into()))
                .condition_expression("attribute_not_exists(pk)")
                .build()
                .unwrap(),
        )
        .build()
}

async fn order_exists(store: &DynamoStore, id: &str) -> bool {
    store
        .client()
        .get_item()
        .table_name(store.table().as_str())
        .key("pk", AttributeValue::S(format!("order#{id}")))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item()
        .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transact_completion_lands_with_the_business_items() {
    let store = common::own_store("tx").await;
    let table = store.table().as_str().to_string();
    let scope = fresh("order-1");
    let lease = claimed(&store, &request(&scope, "a", 30_000)).await;
    store
        .complete_with(
            &lease,
            &StoredResponse::new(201, "placed"),
            vec![order(&table, "1"), order(&table, "1b")],
        )
        .await
        .unwrap();
    assert!(order_exists(&store, "1").await && order_exists(&store, "1b").await);
    assert_eq!(
        store.claim(&request(&scope, "a", 30_000)).await.unwrap(),
        ClaimOutcome::Completed(StoredResponse::new(201, "placed"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_lease_cancels_the_transaction_and_leaves_no_business_item() {
    let store = common::own_store("tx").await;
    let table = store.table().as_str().to_string();
    let scope = fresh("order-2");
    let stale = claimed(&store, &request(&scope, "a", 100)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fresh_owner = claimed(&store, &request(&scope, "a", 30_000)).await;
    assert_eq!(fresh_owner.attempt(), 2);
    let err = store
        .complete_with(
            &stale,
            &StoredResponse::new(201, "stale"),
            vec![order(&table, "2")],
        )
        .await
        .unwrap_err();
    assert!(err.is_lost_lease(), "{err:?}");
    assert!(
        !order_exists(&store, "2").await,
        "a business item landed under a lost lease"
    );
    assert!(store.get(&scope).await.unwrap().unwrap().is_in_flight());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_business_items_are_named_and_nothing_is_written() {
    let store = common::own_store("tx").await;
    let table = store.table().as_str().to_string();
    let scope = fresh("order-3");
    let lease = claimed(&store, &request(&scope, "a", 30_000)).await;
    // Order 3 exists already, so its conditional put cancels the transaction.
    let setup = claimed(&store, &request(&fresh("setup"), "a", 30_000)).await;
    store
        .complete_with(
            &setup,
            &StoredResponse::new(200, ""),
            vec![order(&table, "3")],
        )
        .await
        .unwrap();
    let err = store
        .complete_with(
            &lease,
            &StoredResponse::new(201, "placed"),
            vec![order(&table, "3-new"), order(&table, "3")],
        )
        .await
        .unwrap_err();
    match err {
        TransactError::ItemsRejected(items) => {
            assert_eq!(items.len(), 1, "{items:?}");
            assert_eq!(items[0].index, 1);
            assert_eq!(items[0].code, "ConditionalCheckFailed");
        }
        other => panic!("expected ItemsRejected, got {other:?}"),
    }
    assert!(!order_exists(&store, "3-new").await);
    assert!(
        store.get(&scope).await.unwrap().unwrap().is_in_flight(),
        "the lease still holds"
    );
    store
        .complete(&lease, &StoredResponse::new(201, "later"))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_too_large_for_an_item_is_refused_before_any_request() {
    let store = common::own_store("size").await;
    let table = store.table().as_str().to_string();
    let scope = fresh("big");
    let lease = claimed(&store, &request(&scope, "a", 30_000)).await;
    let max = store.capabilities().max_response_bytes;
    let before = common::requests(&table).await;
    let too_big = StoredResponse::new(200, vec![7u8; max + 1]);
    assert!(matches!(
        store.complete(&lease, &too_big).await,
        Err(StoreError::TooLarge { .. })
    ));
    assert!(matches!(
        store
            .complete_with(&lease, &too_big, vec![order(&table, "big")])
            .await,
        Err(TransactError::Store(StoreError::TooLarge { .. }))
    ));
    assert!(store.complete_item(&lease, &too_big).is_err());
    assert_eq!(common::requests(&table).await, before, "a request was sent");
    assert!(store.get(&scope).await.unwrap().unwrap().is_in_flight());
}

#[tokio::test]
async fn default_limit_fits_a_real_dynamodb_item_and_many_headers_count() {
    let store = DynamoStore::new(common::client(), "no-requests-sent").unwrap();
    let max = store.capabilities().max_response_bytes;
    assert!(max > 400_000 && max < idem_dynamo::ITEM_LIMIT, "{max}");
    let lease = idem_core::Lease::issued(
        Scope::parse(&"t".repeat(255), &"k".repeat(255)).unwrap(),
        idem_core::OwnerToken::generate(),
        1,
        Timestamp::from_unix_millis(0),
        Duration::from_secs(1),
    );
    let at_max = StoredResponse::new(200, vec![0u8; max - 10]).with_header("x-h", "1234567");
    assert!(store.complete_item(&lease, &at_max).is_ok());
    // Under the response limit, but 8 bytes of framing per header overflow the item.
    let mut many = StoredResponse::new(200, vec![0u8; max - 20_000]);
    for _ in 0..5_000 {
        many = many.with_header("", "ab");
    }
    assert!(many.size() <= max);
    assert!(matches!(
        store.complete_item(&lease, &many),
        Err(StoreError::TooLarge { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lingering_item_past_retention_is_claimed_afresh_without_its_checkpoint() {
    // A manual clock stands in for an item that TTL has not deleted yet.
    let clock = ManualClock::new(Timestamp::from_unix_millis(1_000_000_000));
    let store = common::own_store("ttl").await.with_clock(clock.clone());
    let scope = fresh("abandoned");
    let old = request(&scope, "a", 1_000)
        .with_retention(Duration::from_secs(60))
        .unwrap();
    let lease = claimed(&store, &old).await;
    store
        .checkpoint(&lease, &Checkpoint::new("half", &1).unwrap())
        .await
        .unwrap();
    clock.advance(Duration::from_secs(61));
    assert_eq!(
        store.get(&scope).await.unwrap(),
        None,
        "past retention counts as absent"
    );
    let ClaimOutcome::Claimed { lease, checkpoint } = store
        .claim(&request(&scope, "other", 30_000))
        .await
        .unwrap()
    else {
        panic!("past retention must be claimable with any fingerprint");
    };
    assert_eq!((lease.attempt(), checkpoint), (1, None));
    let record = store.get(&scope).await.unwrap().unwrap();
    assert_eq!((record.attempt, record.checkpoint), (1, None));
    assert_eq!(store.purge_expired().await.unwrap(), 0);
    clock.advance(Duration::from_secs(3600 * 25));
    assert_eq!(store.purge_expired().await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_and_claim_outcome_is_one_request() {
    let store = common::own_store("rt").await;
    let table = store.table().as_str().to_string();
    let mut costs = cost_of_each_operation(&store, || common::requests(&table)).await;
    let lease = claimed(&store, &request(&fresh("t"), "a", 60_000)).await;
    let before = common::requests(&table).await;
    store
        .complete_with(
            &lease,
            &StoredResponse::new(200, ""),
            vec![order(&table, "rt")],
        )
        .await
        .unwrap();
    costs.push(("complete_with", common::requests(&table).await - before));
    for (what, n) in &costs {
        assert_eq!(*n, 1, "{what} took {n} requests: {costs:?}");
    }
}
