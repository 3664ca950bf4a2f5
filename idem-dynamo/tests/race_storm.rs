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
/// Keys raced at once. Each key's deliveries race one another; the keys
/// go in waves so that moto, one Python process shared with the other
/// tests, never queues more than a wave's requests: a queue of every run
/// at once waited past any limit on a loaded machine, this storm's and
/// its neighbours' alike.
const WAVE: usize = 8;

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
    // Generous beside a wave's length on a loaded machine: only the count
    // is judged.
    let idem = runner(&store).with_lease(Duration::from_secs(600)).unwrap();
    let tenant = fresh_tenant();
    let mut executed = 0;
    for wave in (0..KEYS).collect::<Vec<_>>().chunks(WAVE) {
        let mut tasks = Vec::new();
        for &k in wave {
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
        executed += executed_runs(tasks).await;
    }
    assert_eq!(executed, KEYS);
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
