//! The public outbox suite against a DynamoDB-compatible server, each case
//! on a table of its own (a read or an acquire sees the whole table); the
//! requests each operation costs, counted by the server; and enqueues
//! inside the caller's transaction, racing writers of one aggregate
//! included.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use idem_dynamo::DynamoOutbox;

async fn partitioned(partitions: u32) -> DynamoOutbox {
    common::own_outbox("outbox", partitions).await
}

mod suite {
    idem_conformance::outbox_suite!(super::partitioned(4));
}

mod suite_on_one_partition {
    idem_conformance::outbox_suite!(super::partitioned(1));
}

use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_dynamo::DynamoOutboxOptions;
use idem_dynamo::aws_sdk_dynamodb::Client;
use idem_dynamo::aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use idem_dynamo::aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use idem_dynamo::aws_sdk_dynamodb::error::BoxError;

use idem_core::StoreError;
use idem_core::store::{
    Advance, LogPosition, NewMessage, OutboxStore, OwnerToken, PublishFailure, Transaction,
};
use idem_dynamo::aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};

fn message(aggregate: &str, kind: &str) -> NewMessage {
    NewMessage::new(aggregate, kind, format!("{aggregate}:{kind}").into_bytes()).unwrap()
}

/// The requests a client sends to the table (the service clock's
/// `ListTables` aside), by their operation: the server's own counter reads
/// only `TableName`, and a `BatchGetItem` names its tables otherwise.
#[derive(Debug, Clone, Default)]
struct Requests(Arc<Mutex<Vec<String>>>);

impl Requests {
    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

impl Intercept for Requests {
    fn name(&self) -> &'static str {
        "requests"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let operation = context
            .request()
            .headers()
            .get("x-amz-target")
            .and_then(|target| target.rsplit('.').next())
            .unwrap_or_default()
            .to_string();
        if operation != "ListTables" {
            self.0.lock().unwrap().push(operation);
        }
        Ok(())
    }
}

/// Each operation's requests, counted as the client sends them: the
/// numbers the type's documentation states.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_operation_costs_the_requests_it_documents() {
    let requests = Requests::default();
    let client = Client::from_conf(
        common::config_with(&common::endpoint(), common::CONNECT_TIMEOUT)
            .interceptor(requests.clone())
            .build(),
    );
    let table = common::own_outbox("outbox-rt", 1).await.table().to_string();
    let outbox =
        DynamoOutbox::with_options(client, DynamoOutboxOptions::default().table(&table)).unwrap();
    let mut costs = Vec::new();
    macro_rules! cost {
        ($what:expr, $expected:expr, $op:expr) => {{
            let before = requests.count();
            let value = $op;
            costs.push(($what, requests.count() - before, $expected));
            value
        }};
    }
    let placed = message("order-1", "placed");
    let first = cost!("enqueue", 2, outbox.enqueue(&placed).await.unwrap());
    cost!(
        "enqueue of a stored id",
        2,
        outbox.enqueue(&placed).await.unwrap()
    );
    let second = cost!(
        "enqueue",
        2,
        outbox.enqueue(&message("order-1", "paid")).await.unwrap()
    );
    let owner = OwnerToken::generate();
    let lease = cost!(
        "acquire",
        2,
        outbox
            .acquire(owner, Duration::from_secs(60))
            .await
            .unwrap()
            .unwrap()
    );
    cost!(
        "acquire with every partition held",
        1,
        outbox
            .acquire(OwnerToken::generate(), Duration::from_secs(60))
            .await
            .unwrap()
    );
    let batch = cost!(
        "read (the log and the lane, at once)",
        2,
        outbox.read(0, LogPosition::START, 100).await.unwrap()
    );
    assert_eq!(batch.messages.len(), 2);
    let lease = cost!(
        "advance of the cursor",
        1,
        outbox
            .advance(&lease, &Advance::to(first.parts().position))
            .await
            .unwrap()
    );
    let failed = PublishFailure::new(second.id(), 0, "broker down").max_attempts(1);
    let lease = cost!(
        "advance naming messages",
        2,
        outbox
            .advance(&lease, &Advance::to(second.parts().position).failed(failed))
            .await
            .unwrap()
    );
    cost!("due", 1, outbox.due(0, 100).await.unwrap());
    cost!(
        "parked (one partition)",
        1,
        outbox.parked(None, 100).await.unwrap()
    );
    cost!(
        "message",
        2,
        outbox.message(second.id()).await.unwrap().unwrap()
    );
    assert!(cost!("retry", 2, outbox.retry(second.id()).await.unwrap()));
    assert!(!cost!(
        "retry of a waiting message",
        2,
        outbox.retry(second.id()).await.unwrap()
    ));
    cost!("stats (one partition)", 1, outbox.stats().await.unwrap());
    assert!(cost!("release", 1, outbox.release(&lease).await.unwrap()));
    assert_eq!(
        cost!(
            "purge of one message (the query, then one batch of deletes)",
            2,
            outbox.purge_sent(Duration::ZERO, 100).await.unwrap()
        ),
        1
    );
    for (what, n, expected) in &costs {
        assert_eq!(n, expected, "{what} took {n} requests: {costs:?}");
    }
    common::delete_table(&table).await;
}

/// An order item and its message in one transaction of the outbox's.
async fn order_with_message(
    outbox: &DynamoOutbox,
    orders: &str,
    id: &str,
    message: &NewMessage,
) -> (
    idem_dynamo::DynamoTransaction,
    idem_core::store::OutboxMessage,
) {
    let mut tx = outbox.begin();
    let order = Put::builder()
        .table_name(orders)
        .item("pk", AttributeValue::S(format!("order#{id}")))
        .build()
        .unwrap();
    tx.push(TransactWriteItem::builder().put(order).build());
    let stored = outbox.enqueue_in(&mut tx, message).await.unwrap();
    (tx, stored)
}

/// Inside the caller's transaction: nothing until it commits, then the
/// message and the business item together; a rolled-back one leaves
/// neither, and takes no number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_in_a_transaction_exists_exactly_when_it_commits() {
    let outbox = common::own_outbox("outbox-tx", 1).await;
    let orders = common::app_table("orders", false).await;
    let dropped = message("order-1", "placed");
    let (tx, _) = order_with_message(&outbox, &orders, "1", &dropped).await;
    drop(tx);
    assert_eq!(outbox.message(dropped.id()).await.unwrap(), None);
    let placed = message("order-1", "placed");
    let (tx, stored) = order_with_message(&outbox, &orders, "1", &placed).await;
    assert_eq!(outbox.message(placed.id()).await.unwrap(), None);
    tx.commit().await.unwrap();
    assert_eq!(
        outbox.message(placed.id()).await.unwrap(),
        Some(stored.clone())
    );
    assert_eq!(
        stored.parts().sequence,
        1,
        "a rolled-back enqueue took a number"
    );
    let read = outbox.read(0, LogPosition::START, 10).await.unwrap();
    assert_eq!(read.messages, vec![stored]);
    // Two messages of one aggregate in one transaction: consecutive.
    let mut tx = outbox.begin();
    let paid = outbox
        .enqueue_in(&mut tx, &message("order-1", "paid"))
        .await
        .unwrap();
    let shipped = outbox
        .enqueue_in(&mut tx, &message("order-1", "shipped"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!((paid.parts().sequence, shipped.parts().sequence), (2, 3));
    let read = outbox.read(0, LogPosition::START, 10).await.unwrap();
    assert_eq!(read.messages.len(), 3);
    assert_eq!(read.messages[2].id(), shipped.id());
    common::delete_table(&orders).await;
    common::delete_table(outbox.table()).await;
}

/// Two writers of one aggregate, each reading the counters before either
/// commits: one commits, the other is cancelled with a retryable error
/// and, run again, takes the next sequence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_of_one_aggregate_never_share_a_sequence() {
    let outbox = Arc::new(common::own_outbox("outbox-race", 1).await);
    let orders = Arc::new(common::app_table("orders", false).await);
    // Both have read the counters before either commits: the race is made,
    // not hoped for.
    let read = Arc::new(tokio::sync::Barrier::new(2));
    let writers: Vec<_> = (0..2)
        .map(|i| {
            let (outbox, orders, read) = (outbox.clone(), orders.clone(), read.clone());
            tokio::spawn(async move {
                let message = message("order-1", &format!("edit-{i}"));
                let (tx, first) =
                    order_with_message(&outbox, &orders, &i.to_string(), &message).await;
                read.wait().await;
                match tx.commit().await {
                    Ok(()) => (first, false),
                    Err(error) => {
                        assert!(
                            matches!(error, StoreError::Unavailable { .. }),
                            "a lost race is retryable: {error:?}"
                        );
                        let (tx, again) =
                            order_with_message(&outbox, &orders, &i.to_string(), &message).await;
                        tx.commit().await.unwrap();
                        (again, true)
                    }
                }
            })
        })
        .collect();
    let mut results = Vec::new();
    for writer in writers {
        results.push(writer.await.unwrap());
    }
    let mut sequences: Vec<u64> = results.iter().map(|(m, _)| m.parts().sequence).collect();
    sequences.sort_unstable();
    assert_eq!(sequences, vec![1, 2], "{results:?}");
    assert_eq!(
        results.iter().filter(|(_, retried)| *retried).count(),
        1,
        "exactly one writer was cancelled and retried"
    );
    let log = outbox.read(0, LogPosition::START, 10).await.unwrap();
    assert_eq!(log.messages.len(), 2);
    assert!(log.messages[0].parts().sequence < log.messages[1].parts().sequence);
    common::delete_table(&orders).await;
    common::delete_table(outbox.table()).await;
}

/// A transaction over DynamoDB's 100 items is refused when the enqueue
/// would cross it, with nothing added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_past_the_transactions_limits_is_invalid_input() {
    let outbox = common::own_outbox("outbox-limit", 1).await;
    let mut tx = outbox.begin();
    for i in 0..97 {
        let item = Put::builder()
            .table_name("orders")
            .item("pk", AttributeValue::S(format!("order#{i}")))
            .build()
            .unwrap();
        tx.push(TransactWriteItem::builder().put(item).build());
    }
    let refused = outbox
        .enqueue_in(&mut tx, &message("order-1", "placed"))
        .await;
    assert!(
        matches!(refused, Err(StoreError::InvalidInput(_))),
        "{refused:?}"
    );
    assert_eq!(tx.items().len(), 97);
    common::delete_table(outbox.table()).await;
}

/// Late commits: a read answers only the unbroken run of positions after
/// its start, so a message whose commit a query did not see (taken away
/// here, as a query reading past it while it commits would miss it) is
/// never stepped over; once it is there, it and what follows are read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_never_steps_over_a_position_it_does_not_see() {
    let outbox = common::own_outbox("outbox-late", 1).await;
    let mut stored = Vec::new();
    for kind in ["placed", "paid", "shipped"] {
        stored.push(outbox.enqueue(&message("order-1", kind)).await.unwrap());
    }
    let key = |position: u64| {
        std::collections::HashMap::from([
            ("pk".to_string(), AttributeValue::S("p#0".into())),
            ("sk".to_string(), AttributeValue::N(position.to_string())),
        ])
    };
    let middle = stored[1].parts().position.major();
    let taken = outbox
        .client()
        .delete_item()
        .table_name(outbox.table())
        .set_key(Some(key(middle)))
        .return_values(idem_dynamo::aws_sdk_dynamodb::types::ReturnValue::AllOld)
        .send()
        .await
        .unwrap()
        .attributes
        .expect("the middle message's item");
    let read = outbox.read(0, LogPosition::START, 10).await.unwrap();
    assert_eq!(read.messages, stored[..1], "read past a missing position");
    outbox
        .client()
        .put_item()
        .table_name(outbox.table())
        .set_item(Some(taken))
        .send()
        .await
        .unwrap();
    let read = outbox
        .read(0, stored[0].parts().position, 10)
        .await
        .unwrap();
    assert_eq!(read.messages, stored[1..]);
    common::delete_table(outbox.table()).await;
}

/// Enqueues racing on one partition (each reads the counters, one commits,
/// the others count again): every message lands, no two at one position,
/// each aggregate's in sequence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_enqueues_of_one_partition_all_land_at_distinct_positions() {
    let outbox = Arc::new(common::own_outbox("outbox-storm", 1).await);
    let tasks: Vec<_> = (0..4)
        .map(|task| {
            let outbox = outbox.clone();
            tokio::spawn(async move {
                let mut stored = Vec::new();
                for i in 0..10 {
                    let message = message(&format!("order-{task}"), &format!("edit-{i}"));
                    stored.push(outbox.enqueue(&message).await.unwrap());
                }
                stored
            })
        })
        .collect();
    let mut positions = Vec::new();
    for task in tasks {
        let stored = task.await.unwrap();
        let sequences: Vec<u64> = stored.iter().map(|m| m.parts().sequence).collect();
        assert_eq!(sequences, (1..=10).collect::<Vec<u64>>());
        positions.extend(stored.iter().map(|m| m.parts().position));
    }
    positions.sort_unstable();
    positions.dedup();
    assert_eq!(positions.len(), 40, "two messages at one position");
    let log = outbox.read(0, LogPosition::START, 100).await.unwrap();
    assert_eq!(log.messages.len(), 40);
    common::delete_table(outbox.table()).await;
}
