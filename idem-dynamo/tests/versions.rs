//! Version checks of `VersionedItems` over a table of the test's own,
//! inside a `DynamoTransaction`: an event applies on its predecessor only
//! (a stale event and a gap push nothing), a new aggregate starts at 0,
//! racing handlers are serialised by the update's condition, and the
//! aggregate's own item takes the effect in the version's update.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::collections::HashMap;

use idem_core::store::{Transaction, VersionCheck, VersionStore};
use idem_core::{Operation, StoreError};
use idem_dynamo::aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use idem_dynamo::{DynamoStore, VersionedItems};

/// The inbox store (whose transactions the checks join) and the
/// application's table, with `order-1` at `version`.
async fn orders(version: u64) -> (DynamoStore, String, VersionedItems) {
    let store = common::own_store("ver-inbox").await;
    let table = common::app_table("ver-orders", false).await;
    store
        .client()
        .put_item()
        .table_name(&table)
        .item("pk", AttributeValue::S("order-1".into()))
        .item("version", AttributeValue::N(version.to_string()))
        .send()
        .await
        .unwrap();
    let versioned = VersionedItems::new(&table, "pk", "version").unwrap();
    (store, table, versioned)
}

async fn item(
    store: &DynamoStore,
    table: &str,
    pk: &str,
) -> Option<HashMap<String, AttributeValue>> {
    store
        .client()
        .get_item()
        .table_name(table)
        .key("pk", AttributeValue::S(pk.into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
}

async fn version_of(store: &DynamoStore, table: &str, pk: &str) -> Option<String> {
    let found = item(store, table, pk).await?;
    Some(found.get("version")?.as_n().unwrap().clone())
}

/// The effect of one handler: an item that must not exist yet.
fn effect(table: &str, id: &str) -> TransactWriteItem {
    let put = Put::builder()
        .table_name(table)
        .item("pk", AttributeValue::S(format!("effect#{id}")))
        .condition_expression("attribute_not_exists(pk)")
        .build()
        .unwrap();
    TransactWriteItem::builder().put(put).build()
}

async fn check(
    store: &DynamoStore,
    versioned: &VersionedItems,
    aggregate: &str,
    version: u64,
) -> (VersionCheck, usize) {
    let mut tx = store.begin().await.unwrap();
    let check = versioned
        .advance(&mut tx, aggregate, version)
        .await
        .unwrap();
    (check, tx.items().len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_applies_on_its_predecessor_only() {
    let (store, table, versioned) = orders(2).await;
    assert_eq!(
        check(&store, &versioned, "order-1", 3).await,
        (VersionCheck::Apply, 1)
    );
    assert_eq!(
        check(&store, &versioned, "order-1", 2).await,
        (VersionCheck::Stale { current: 2 }, 0),
        "a duplicate pushes nothing"
    );
    assert_eq!(
        check(&store, &versioned, "order-1", 1).await,
        (VersionCheck::Stale { current: 2 }, 0)
    );
    assert_eq!(
        check(&store, &versioned, "order-1", 5).await,
        (VersionCheck::Gap { current: 2 }, 0)
    );
    assert_eq!(
        version_of(&store, &table, "order-1").await.as_deref(),
        Some("2"),
        "an uncommitted check writes nothing"
    );
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        versioned.advance(&mut tx, "order-1", 3).await.unwrap(),
        VersionCheck::Apply
    );
    tx.commit().await.unwrap();
    assert_eq!(
        version_of(&store, &table, "order-1").await.as_deref(),
        Some("3")
    );
    assert_eq!(
        check(&store, &versioned, "order-1", 3).await,
        (VersionCheck::Stale { current: 3 }, 0)
    );
    let zero = versioned
        .advance(&mut store.begin().await.unwrap(), "order-1", 0)
        .await;
    assert!(matches!(zero, Err(StoreError::InvalidInput(_))), "{zero:?}");
    common::delete_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_aggregate_is_at_version_zero_and_its_first_event_creates_its_item() {
    let (store, table, versioned) = orders(1).await;
    assert_eq!(
        check(&store, &versioned, "order-new", 2).await,
        (VersionCheck::Gap { current: 0 }, 0)
    );
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        versioned.advance(&mut tx, "order-new", 1).await.unwrap(),
        VersionCheck::Apply
    );
    tx.commit().await.unwrap();
    assert_eq!(
        version_of(&store, &table, "order-new").await.as_deref(),
        Some("1")
    );
    assert_eq!(
        check(&store, &versioned, "order-new", 1).await,
        (VersionCheck::Stale { current: 1 }, 0)
    );
    common::delete_table(&table).await;
}

/// Two handlers of one event both read its predecessor and push their
/// update with their effect; the first commits, the second's commit is
/// cancelled by the condition (nothing of it written), and its retry reads
/// the committed version: stale.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_handlers_of_one_event_apply_it_once() {
    let (store, table, versioned) = orders(1).await;
    let mut first = store.begin().await.unwrap();
    let mut second = store.begin().await.unwrap();
    assert_eq!(
        versioned.advance(&mut first, "order-1", 2).await.unwrap(),
        VersionCheck::Apply
    );
    assert_eq!(
        versioned.advance(&mut second, "order-1", 2).await.unwrap(),
        VersionCheck::Apply
    );
    first.push(effect(&table, "first"));
    second.push(effect(&table, "second"));
    first.commit().await.unwrap();
    match second.commit().await {
        Err(StoreError::Rejected {
            store: "dynamodb",
            operation: Operation::Transaction,
            message,
            ..
        }) => assert!(message.contains("#0 (ConditionalCheckFailed)"), "{message}"),
        other => panic!("expected Rejected, got {other:?}"),
    }
    assert!(item(&store, &table, "effect#first").await.is_some());
    assert!(
        item(&store, &table, "effect#second").await.is_none(),
        "the refused commit wrote its effect"
    );
    assert_eq!(
        version_of(&store, &table, "order-1").await.as_deref(),
        Some("2")
    );
    assert_eq!(
        check(&store, &versioned, "order-1", 2).await,
        (VersionCheck::Stale { current: 2 }, 0)
    );
    common::delete_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_aggregates_own_item_takes_the_effect_in_the_versions_update() {
    let (store, table, versioned) = orders(1).await;
    let status = [("status", AttributeValue::S("shipped".into()))];
    let mut tx = store.begin().await.unwrap();
    let applied = versioned
        .advance_setting(&mut tx, "order-1", 2, &status)
        .await
        .unwrap();
    assert_eq!((applied, tx.items().len()), (VersionCheck::Apply, 1));
    tx.commit().await.unwrap();
    let order = item(&store, &table, "order-1").await.unwrap();
    assert_eq!(order["status"].as_s().unwrap(), "shipped");
    assert_eq!(order["version"].as_n().unwrap(), "2");
    let mut tx = store.begin().await.unwrap();
    let stale = versioned
        .advance_setting(&mut tx, "order-1", 2, &status)
        .await
        .unwrap();
    assert_eq!(
        (stale, tx.items().len()),
        (VersionCheck::Stale { current: 2 }, 0)
    );
    let clash = [("version", AttributeValue::N("9".into()))];
    let refused = versioned
        .advance_setting(&mut tx, "order-1", 3, &clash)
        .await;
    assert!(
        matches!(refused, Err(StoreError::InvalidInput(_))),
        "{refused:?}"
    );
    common::delete_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_item_of_another_key_is_found_by_its_key() {
    let store = common::own_store("ver-inbox").await;
    let table = common::app_table("ver-app", true).await;
    let versioned = VersionedItems::keyed(&table, "version", |account| {
        HashMap::from([
            (
                "pk".to_string(),
                AttributeValue::S(format!("ACCOUNT#{account}")),
            ),
            ("sk".to_string(), AttributeValue::S("META".into())),
        ])
    })
    .unwrap();
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        versioned.advance(&mut tx, "a-1", 1).await.unwrap(),
        VersionCheck::Apply
    );
    tx.commit().await.unwrap();
    assert_eq!(
        check(&store, &versioned, "a-1", 1).await,
        (VersionCheck::Stale { current: 1 }, 0)
    );
    common::delete_table(&table).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_is_one_read_and_its_update_rides_the_commit() {
    let (store, table, versioned) = orders(1).await;
    let before = common::requests(&table).await;
    let mut tx = store.begin().await.unwrap();
    versioned.advance(&mut tx, "order-1", 2).await.unwrap();
    assert_eq!(
        common::requests(&table).await - before,
        1,
        "the check's read"
    );
    tx.push(effect(&table, "e"));
    tx.commit().await.unwrap();
    assert_eq!(
        common::requests(&table).await - before,
        2,
        "the read and one commit"
    );
    common::delete_table(&table).await;
}
