//! A race storm on the transactional path: every key raced by several
//! deliveries through `run_in` counts its business effect exactly once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::time::Duration;

use idem_conformance::support::{executed_runs, fresh_tenant, key, long, runner};
use idem_core::{Scope, StoredResponse};
use idem_dynamo::aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};

const KEYS: usize = 40;
const DUPLICATES: usize = 4;

/// Adds one to the order's counter: a second execution would make it two.
fn count_once(table: &str, order: &str) -> TransactWriteItem {
    TransactWriteItem::builder()
        .update(
            Update::builder()
                .table_name(table)
                .key("pk", AttributeValue::S(format!("order#{order}")))
                .update_expression("ADD executions :one")
                .expression_attribute_values(":one", AttributeValue::N("1".into()))
                .build()
                .unwrap(),
        )
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn transact_items_race_storm_counts_each_business_effect_once() {
    let store = common::own_store("storm").await;
    // Every run's requests queue at moto at once: on a loaded machine the
    // last wait many seconds, so the lease is generous beside the whole
    // storm's length and only the count is judged.
    let idem = runner(&store).with_lease(Duration::from_secs(600)).unwrap();
    let tenant = fresh_tenant();
    let mut tasks = Vec::new();
    for k in 0..KEYS {
        let request = long(&Scope::new(tenant.clone(), key(&format!("o-{k}"))), "order");
        for _ in 0..DUPLICATES {
            let (idem, store, request) = (idem.clone(), store.clone(), request.clone());
            let item = count_once(store.table(), &k.to_string());
            tasks.push(tokio::spawn(async move {
                idem.run_in(
                    request.scope().clone(),
                    request.fingerprint(),
                    store.begin(),
                    |_ctx, mut tx| async move {
                        tx.push(item);
                        Ok((tx, StoredResponse::new(201, "placed")))
                    },
                )
                .await
            }));
        }
    }
    assert_eq!(executed_runs(tasks).await, KEYS);
    for k in 0..KEYS {
        let item = common::order_item(&store, &k.to_string()).await;
        let count = item
            .as_ref()
            .and_then(|i| i.get("executions"))
            .and_then(|v| v.as_n().ok())
            .cloned();
        assert_eq!(count.as_deref(), Some("1"), "order {k}");
    }
}
