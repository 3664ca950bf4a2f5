//! RabbitPublisher on the real broker: confirms, returns, the relay end to
//! end (order per aggregate across four relays, a crash between confirm
//! and cursor move, a poison message, the broker cut off and back).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::outbox::{
    HoldAfterPublish, LEASE, PATIENCE, Refusing, Running, check_order, drained, fill, logged,
    partitioned, relay_options, sharing_options, wait_until,
};
use common::{Topology, header, read, summary, text};
use idem_conformance::faults::FaultProxy;
use idem_core::ManualClock;
use idem_core::store::{NewMessage, OutboxStore, Timestamp};
use idem_memory::MemoryOutbox;
use idem_outbox::{Published, Publisher, Relay};
use idem_rabbitmq::{RabbitError, RabbitOptions, RabbitPublisher};
use lapin::types::AMQPValue;

async fn publisher(topology: &Topology) -> RabbitPublisher {
    RabbitPublisher::connect(
        &common::url(),
        RabbitOptions::new(&topology.exchange).unwrap(),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_confirmed_and_consumed_with_its_id_type_headers_and_payload() {
    let topology = Topology::new(true).await;
    let mut consumer = topology.consumer().await;
    let options = RabbitOptions::new(&topology.exchange)
        .unwrap()
        .with_routing_key_prefix("shop.")
        .unwrap();
    let publisher = RabbitPublisher::connect(&common::url(), options)
        .await
        .unwrap();
    let outbox = MemoryOutbox::new();
    for n in 0..5 {
        let message = NewMessage::new(
            &format!("order-{n}"),
            "order.placed",
            format!("{{\"n\":{n}}}").into_bytes(),
        )
        .unwrap()
        .with_header("content-type", "application/json")
        .unwrap()
        .with_header("tag", "first")
        .unwrap()
        .with_header("tag", "second")
        .unwrap();
        outbox.enqueue(&message).await.unwrap();
    }
    let batch = logged(&outbox).await;
    assert_eq!(batch.len(), 5);

    let results = publisher.publish(&batch).await;
    assert_eq!(results.len(), 5);
    for result in &results {
        assert_eq!(result, &Ok(Published::stored()));
    }

    let deliveries = read(&mut consumer, 5, Duration::from_millis(300)).await;
    assert_eq!(deliveries.len(), 5, "each message once");
    for message in &batch {
        let id = message.id().to_string();
        let delivery = deliveries
            .iter()
            .find(|d| d.properties.message_id().as_ref().map(|m| m.as_str()) == Some(id.as_str()))
            .unwrap_or_else(|| panic!("{id} delivered"));
        assert_eq!(delivery.data, message.message().payload());
        assert_eq!(delivery.routing_key.as_str(), "shop.order.placed");
        assert_eq!(
            delivery.properties.kind().as_ref().unwrap().as_str(),
            "order.placed"
        );
        assert_eq!(*delivery.properties.delivery_mode(), Some(2));
        assert_eq!(text(header(delivery, "content-type")), "application/json");
        match header(delivery, "tag") {
            Some(AMQPValue::FieldArray(values)) => {
                let values: Vec<String> = values.as_slice().iter().map(|v| text(Some(v))).collect();
                assert_eq!(values, ["first", "second"]);
            }
            other => panic!("a repeated header is an array: {other:?}"),
        }
        assert_eq!(
            text(header(delivery, idem_rabbitmq::AGGREGATE_HEADER)),
            message.message().aggregate()
        );
        assert_eq!(
            header(delivery, idem_rabbitmq::SEQUENCE_HEADER),
            Some(&AMQPValue::LongLongInt(1))
        );
    }
    topology.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unroutable_message_is_an_error_and_the_channel_goes_on() {
    let topology = Topology::new(false).await;
    let publisher = publisher(&topology).await;
    let outbox = MemoryOutbox::new();
    outbox
        .enqueue(&NewMessage::new("order-1", "order.placed", b"{}".to_vec()).unwrap())
        .await
        .unwrap();
    let batch = logged(&outbox).await;

    let results = publisher.publish(&batch).await;
    let error = results[0]
        .as_ref()
        .expect_err("no queue is bound: returned");
    assert_eq!(error.broker, "rabbitmq");
    assert!(error.message.contains("NO_ROUTE"), "{error}");

    // The same publisher, once a queue is bound, delivers.
    let queue = common::fresh("late-queue");
    topology
        .channel
        .queue_declare(
            queue.as_str().into(),
            lapin::options::QueueDeclareOptions {
                exclusive: true,
                ..Default::default()
            },
            Default::default(),
        )
        .await
        .unwrap();
    topology
        .channel
        .queue_bind(
            queue.as_str().into(),
            topology.exchange.as_str().into(),
            "#".into(),
            Default::default(),
            Default::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        publisher.publish(&batch).await,
        vec![Ok(Published::stored())]
    );
    topology.delete().await;
}

/// One call declares what a publisher and a source need: a publisher to
/// the new exchange is made (its exchange exists), what it publishes
/// lands in the queue, and declaring again changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declare_makes_the_exchange_and_a_bound_queue_in_one_call() {
    use idem_rabbitmq::lapin::options::{
        BasicGetOptions, ExchangeDeleteOptions, QueueDeleteOptions,
    };
    use idem_rabbitmq::lapin::types::FieldTable;
    use idem_rabbitmq::lapin::{Connection, ConnectionProperties};

    let connection = Connection::connect(&common::url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let (exchange, queue) = (common::fresh("exchange"), common::fresh("queue"));
    for _ in 0..2 {
        idem_rabbitmq::declare(&channel, &exchange, &queue, FieldTable::default())
            .await
            .unwrap();
    }
    let publisher =
        RabbitPublisher::connect(&common::url(), RabbitOptions::new(&exchange).unwrap())
            .await
            .unwrap();
    let outbox = MemoryOutbox::new();
    let placed = outbox
        .enqueue(&NewMessage::new("order-1", "order.placed", b"{}".to_vec()).unwrap())
        .await
        .unwrap();
    let published = publisher.publish(std::slice::from_ref(&placed)).await;
    assert!(published.iter().all(Result::is_ok), "{published:?}");
    let got = channel
        .basic_get(queue.as_str().into(), BasicGetOptions { no_ack: true })
        .await
        .unwrap()
        .expect("the message in the declared queue");
    assert_eq!(got.delivery.data, b"{}");
    let _ = channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    let _ = channel
        .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
        .await;
    let _ = connection.close(200, "done".into()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_exchange_is_refused_when_the_publisher_is_made() {
    let missing = common::fresh("missing");
    let made =
        RabbitPublisher::connect(&common::url(), RabbitOptions::new(&missing).unwrap()).await;
    assert!(
        matches!(made, Err(RabbitError::Exchange { .. })),
        "{made:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_relays_sharing_eight_partitions_publish_every_message_once_in_order() {
    let topology = Topology::new(true).await;
    let mut consumer = topology.consumer().await;
    let outbox = Arc::new(partitioned());
    let enqueued = fill(&*outbox, "agg", "order.changed", 100, 100).await;
    // Two connections, each shared by two relays.
    let first: Arc<dyn Publisher> = Arc::new(publisher(&topology).await);
    let second: Arc<dyn Publisher> = Arc::new(publisher(&topology).await);
    let relays = Running::start(
        &outbox,
        vec![first.clone(), second.clone(), first, second],
        sharing_options(),
    );
    drained(&*outbox).await;
    relays.stop().await;
    let deliveries = read(&mut consumer, enqueued.len(), Duration::from_millis(500)).await;
    let copies = check_order(&enqueued, &summary(&deliveries));
    assert!(copies.values().all(|&n| n == 1), "nothing twice");
    topology.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_confirm_and_cursor_move_delivers_a_copy_with_the_same_message_id() {
    let topology = Topology::new(true).await;
    let mut consumer = topology.consumer().await;
    let clock = ManualClock::new(Timestamp::from_unix_millis(1_700_000_000_000));
    let outbox = Arc::new(MemoryOutbox::with_clock(clock.clone()));
    let enqueued = fill(&*outbox, "crash", "order.changed", 10, 1).await;
    let stalling = Arc::new(HoldAfterPublish::new(publisher(&topology).await));
    let first: Relay<MemoryOutbox, HoldAfterPublish<RabbitPublisher>> =
        Relay::new(Arc::clone(&outbox), Arc::clone(&stalling), relay_options());
    let second = Relay::new(
        Arc::clone(&outbox),
        Arc::new(publisher(&topology).await),
        relay_options(),
    );

    // The first relay publishes, RabbitMQ confirms, and it stalls before
    // moving its cursor, until its lease lapsed and the second relay took over.
    let stalled = tokio::spawn(async move { first.relay_once().await.unwrap() });
    tokio::time::timeout(PATIENCE, stalling.published.notified())
        .await
        .expect("the first relay published");
    clock.advance(LEASE + Duration::from_secs(1));
    let took_over = second.relay_once().await.unwrap();
    assert_eq!(took_over.published, 10);
    stalling.release.notify_one();
    let crashed = stalled.await.unwrap();
    assert_eq!((crashed.published, crashed.lost), (0, 10));

    let deliveries = read(&mut consumer, 20, Duration::from_millis(500)).await;
    let copies = check_order(&enqueued, &summary(&deliveries));
    assert!(
        copies.values().all(|&n| n == 2),
        "each message twice, with its id: {copies:?}"
    );
    assert_eq!(outbox.stats().await.unwrap().pending, 0);
    topology.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_parks_its_aggregate_while_the_others_flow() {
    let topology = Topology::new(true).await;
    let mut consumer = topology.consumer().await;
    let outbox = Arc::new(MemoryOutbox::new());
    let enqueued = fill(&*outbox, "poison", "order.changed", 10, 20).await;
    let refusing: Arc<dyn Publisher> = Arc::new(Refusing {
        inner: publisher(&topology).await,
        aggregate: "poison-3".to_string(),
    });
    let options = relay_options()
        .with_retries(3, Duration::from_millis(10), Duration::from_millis(20))
        .unwrap();
    let relays = Running::start(&outbox, vec![refusing.clone(), refusing], options);
    wait_until("the others drained and the poison parked", || async {
        let stats = outbox.stats().await.unwrap();
        stats.parked == 1 && stats.pending == 19
    })
    .await;
    relays.stop().await;
    let parked = outbox.parked(None, 10).await.unwrap();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0].message().aggregate(), "poison-3");
    assert_eq!(parked[0].parts().sequence, 1);

    let flowing: Vec<_> = enqueued
        .iter()
        .filter(|m| m.message().aggregate() != "poison-3")
        .cloned()
        .collect();
    let deliveries = read(&mut consumer, flowing.len(), Duration::from_millis(500)).await;
    let copies = check_order(&flowing, &summary(&deliveries));
    assert!(copies.values().all(|&n| n == 1));
    topology.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_cut_off_for_two_seconds_then_back_loses_nothing() {
    let topology = Topology::new(true).await;
    let mut consumer = topology.consumer().await;
    let proxy = FaultProxy::start(common::address()).await;
    let options = RabbitOptions::new(&topology.exchange)
        .unwrap()
        .with_timeout(Duration::from_secs(2))
        .unwrap();
    let through_proxy: Arc<dyn Publisher> = Arc::new(
        RabbitPublisher::connect(&common::url_via(&proxy.address()), options)
            .await
            .unwrap(),
    );
    let outbox = Arc::new(MemoryOutbox::new());
    let enqueued = fill(&*outbox, "cut", "order.changed", 20, 100).await;
    let relays = Running::start(
        &outbox,
        vec![through_proxy.clone(), through_proxy],
        relay_options(),
    );
    wait_until("some messages are out", || async {
        outbox.stats().await.unwrap().pending < 2_000 - 100
    })
    .await;
    proxy.stall();
    proxy.cut_all();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stranded = outbox.stats().await.unwrap().pending;
    assert!(stranded > 0, "the cut came while a backlog was left");
    proxy.resume();
    drained(&*outbox).await;
    relays.stop().await;

    let deliveries = read(&mut consumer, enqueued.len(), Duration::from_millis(500)).await;
    // Confirms lost with the connection make copies, with their ids.
    check_order(&enqueued, &summary(&deliveries));
    topology.delete().await;
}
