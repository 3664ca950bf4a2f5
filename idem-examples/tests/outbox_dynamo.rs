//! The relay over a DynamoDB outbox (on moto) to both brokers: four relays
//! sharing eight partitions publish every message once, each aggregate's
//! in sequence, as they do over the memory and Postgres outboxes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

/// A client of the DynamoDB-compatible server, shared with idem-dynamo's
/// own tests.
#[path = "../../idem-dynamo/tests/common/mod.rs"]
mod dynamo;
/// JetStream's test streams, shared with idem-nats's own tests.
#[path = "../../idem-nats/tests/common/mod.rs"]
mod nats;
/// RabbitMQ's test topology, shared with idem-rabbitmq's own tests.
#[path = "../../idem-rabbitmq/tests/common/mod.rs"]
mod rabbit;

use std::sync::Arc;
use std::time::Duration;

use idem_conformance::relays::{Running, check_order, drained, fill, sharing_options};
use idem_core::store::OutboxMessage;
use idem_dynamo::DynamoOutbox;
use idem_nats::{JetStreamOptions, JetStreamPublisher};
use idem_outbox::Publisher;
use idem_rabbitmq::{RabbitOptions, RabbitPublisher};

/// Fewer than the memory outbox's scenarios (moto is one Python process,
/// answering one request at a time): 12 aggregates of 10 messages,
/// interleaved. (400 did not drain within the patience on a machine
/// loaded four burners a core: moto's pace, not the relays'.)
const AGGREGATES: usize = 12;
const PER_AGGREGATE: usize = 10;

/// An outbox of eight partitions on a table of its own, filled.
async fn filled(tag: &str) -> (Arc<DynamoOutbox>, Vec<OutboxMessage>) {
    let outbox = Arc::new(dynamo::own_outbox(tag, 8).await);
    let enqueued = fill(&*outbox, "agg", "order.changed", AGGREGATES, PER_AGGREGATE).await;
    (outbox, enqueued)
}

/// Four relays over `outbox`, two on each publisher, until it is drained.
async fn relay_all(
    outbox: &Arc<DynamoOutbox>,
    first: Arc<dyn Publisher>,
    second: Arc<dyn Publisher>,
) {
    let relays = Running::start(
        outbox,
        vec![first.clone(), second.clone(), first, second],
        sharing_options(),
    );
    drained(&**outbox).await;
    relays.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_jetstream_four_relays_sharing_eight_dynamodb_partitions_publish_every_message_once_in_order()
 {
    let stream = nats::TestStream::new().await;
    let (outbox, enqueued) = filled("relay-nats").await;
    let publisher = || async {
        let options = JetStreamOptions::new(&stream.prefix).unwrap();
        let connected = JetStreamPublisher::connect(&nats::url(), options).await;
        Arc::new(connected.unwrap()) as Arc<dyn Publisher>
    };
    relay_all(&outbox, publisher().await, publisher().await).await;
    let messages = stream
        .read(enqueued.len(), Duration::from_millis(500))
        .await;
    let copies = check_order(&enqueued, &nats::summary(&messages));
    assert!(copies.values().all(|&n| n == 1), "nothing twice");
    assert_eq!(copies.len(), enqueued.len(), "every message");
    stream.delete().await;
    dynamo::delete_table(outbox.table()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_rabbitmq_four_relays_sharing_eight_dynamodb_partitions_publish_every_message_once_in_order()
 {
    let topology = rabbit::Topology::new(true).await;
    let mut consumer = topology.consumer().await;
    let (outbox, enqueued) = filled("relay-rabbit").await;
    let publisher = || async {
        let options = RabbitOptions::new(&topology.exchange).unwrap();
        let connected = RabbitPublisher::connect(&rabbit::url(), options).await;
        Arc::new(connected.unwrap()) as Arc<dyn Publisher>
    };
    relay_all(&outbox, publisher().await, publisher().await).await;
    let deliveries = rabbit::read(&mut consumer, enqueued.len(), Duration::from_millis(500)).await;
    let copies = check_order(&enqueued, &rabbit::summary(&deliveries));
    assert!(copies.values().all(|&n| n == 1), "nothing twice");
    assert_eq!(copies.len(), enqueued.len(), "every message");
    topology.delete().await;
    dynamo::delete_table(outbox.table()).await;
}
