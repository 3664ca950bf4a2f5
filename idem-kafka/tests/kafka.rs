//! KafkaPublisher on a real Kafka-protocol broker: delivery reports, the
//! record's key and headers, a topic the broker lacks, and the relay end
//! to end (order per aggregate across four relays, a crash between the
//! delivery report and the cursor move, a poison message, the broker cut
//! off and back).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use std::sync::Arc;
use std::time::Duration;

use idem_conformance::consumers;
use idem_conformance::faults::FaultProxy;
use idem_conformance::kafka::{Kafka, PrivateTansu, brokers};
use idem_conformance::relays::{
    HoldAfterPublish, LEASE, PATIENCE, Refusing, Running, check_order, drained, fill, logged,
    partitioned, relay_options, sharing_options, wait_until,
};
use idem_consumer::{Delivery, Settled};
use idem_core::ManualClock;
use idem_core::store::{NewMessage, OutboxStore, Timestamp};
use idem_kafka::{KafkaOptions, KafkaPublisher, KafkaSetupError};
use idem_memory::MemoryOutbox;
use idem_outbox::{Published, Publisher, Relay};

fn publisher(kafka: &Kafka) -> KafkaPublisher {
    KafkaPublisher::new(&brokers(), KafkaOptions::new(&kafka.topic).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_stored_keyed_by_aggregate_with_its_id_headers_and_payload() {
    let kafka = Kafka::new().await;
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
    let results = publisher(&kafka).publish(&batch).await;
    assert_eq!(results, vec![Ok(Published::stored()); 5]);

    let mut source = kafka.other_group();
    let mut read = Vec::new();
    for _ in 0..5 {
        read.push(consumers::next(&mut source).await);
    }
    read.sort_by_key(|d| d.message().aggregate().map(str::to_string));
    for (n, (delivery, sent)) in read.iter().zip(&batch).enumerate() {
        let message = delivery.message();
        assert_eq!(message.id().as_str(), sent.id().to_string());
        assert_eq!(message.kind(), "order.placed");
        assert_eq!(message.aggregate(), Some(format!("order-{n}").as_str()));
        assert_eq!(message.version(), Some(1));
        assert_eq!(message.payload(), format!("{{\"n\":{n}}}").as_bytes());
        let headers: Vec<(&str, &str)> = message
            .headers()
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            headers,
            [
                ("content-type", "application/json"),
                ("tag", "first"),
                ("tag", "second")
            ]
        );
        assert!(delivery.malformed().is_none());
    }
    source.close().await;
    kafka.delete().await;
}

/// The key is the aggregate: every message of one aggregate is stored in
/// one partition, in sequence order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregate_keeps_one_partition_and_its_order() {
    let kafka = Kafka::new().await;
    let outbox = MemoryOutbox::new();
    let enqueued = fill(&outbox, "keyed", "order.changed", 8, 25).await;
    for chunk in enqueued.chunks(50) {
        for result in publisher(&kafka).publish(chunk).await {
            assert_eq!(result, Ok(Published::stored()));
        }
    }
    let mut source = kafka.other_group();
    let mut partitions: std::collections::HashMap<String, std::collections::HashSet<i32>> =
        Default::default();
    let mut read = Vec::new();
    for _ in 0..enqueued.len() {
        let delivery = consumers::next(&mut source).await;
        let aggregate = delivery.message().aggregate().unwrap().to_string();
        partitions
            .entry(aggregate)
            .or_default()
            .insert(delivery.position().0);
        read.push(idem_conformance::kafka::summary(delivery.message()));
    }
    source.close().await;
    let copies = check_order(&enqueued, &read);
    assert!(copies.values().all(|&n| n == 1));
    assert!(partitions.values().all(|p| p.len() == 1), "{partitions:?}");
    let used: std::collections::HashSet<i32> = partitions.values().flatten().copied().collect();
    assert!(
        used.len() > 1,
        "eight aggregates over one partition: {used:?}"
    );
    kafka.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_the_broker_lacks_is_an_error() {
    let options = KafkaOptions::new(&format!("idem-missing-{}", uuid::Uuid::new_v4().simple()))
        .unwrap()
        .with_timeout(Duration::from_secs(3))
        .unwrap();
    let missing = KafkaPublisher::new(&brokers(), options).unwrap();
    let outbox = MemoryOutbox::new();
    fill(&outbox, "lost", "order.placed", 1, 1).await;
    let batch = logged(&outbox).await;
    let started = tokio::time::Instant::now();
    let results = missing.publish(&batch).await;
    let error = results[0].as_ref().expect_err("no topic: an error");
    assert_eq!(error.broker, "kafka");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "ended at its limit"
    );
}

#[test]
fn a_producer_that_could_store_twice_or_lose_is_refused() {
    let options = KafkaOptions::new("orders").unwrap();
    let mut config = options.producer_config("127.0.0.1:9092");
    config.set("enable.idempotence", "false");
    let refused = KafkaPublisher::from_config(&config, options.clone());
    assert!(
        matches!(
            refused,
            Err(KafkaSetupError::Refused {
                setting: "enable.idempotence",
                ..
            })
        ),
        "{refused:?}"
    );
    let mut config = options.producer_config("127.0.0.1:9092");
    config.set("acks", "1");
    let refused = KafkaPublisher::from_config(&config, options.clone());
    assert!(
        matches!(
            refused,
            Err(KafkaSetupError::Refused {
                setting: "acks",
                ..
            })
        ),
        "{refused:?}"
    );
    let mut config = options.producer_config("127.0.0.1:9092");
    config.set("no.such.property", "1");
    let refused = KafkaPublisher::from_config(&config, options);
    assert!(
        matches!(refused, Err(KafkaSetupError::Config(_))),
        "{refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_relays_sharing_eight_partitions_publish_every_message_once_in_order() {
    let kafka = Kafka::new().await;
    let outbox = Arc::new(partitioned());
    let enqueued = fill(&*outbox, "agg", "order.changed", 100, 100).await;
    let first: Arc<dyn Publisher> = Arc::new(publisher(&kafka));
    let second: Arc<dyn Publisher> = Arc::new(publisher(&kafka));
    let relays = Running::start(
        &outbox,
        vec![first.clone(), second.clone(), first, second],
        sharing_options(),
    );
    drained(&*outbox).await;
    relays.stop().await;
    let read = kafka.read(enqueued.len(), Duration::from_millis(500)).await;
    let copies = check_order(&enqueued, &read);
    assert!(copies.values().all(|&n| n == 1), "nothing twice");
    kafka.delete().await;
}

/// Kafka stores the second relay's copies too (it drops no second record
/// of one message): the consumer's inbox applies each message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_report_and_cursor_move_is_applied_once_by_the_consumer() {
    let kafka = Kafka::new().await;
    let clock = ManualClock::new(Timestamp::from_unix_millis(1_700_000_000_000));
    let outbox = Arc::new(MemoryOutbox::with_clock(clock.clone()));
    let enqueued = fill(&*outbox, "crash", "order.changed", 10, 1).await;
    let stalling = Arc::new(HoldAfterPublish::new(publisher(&kafka)));
    let first: Relay<MemoryOutbox, HoldAfterPublish<KafkaPublisher>> =
        Relay::new(Arc::clone(&outbox), Arc::clone(&stalling), relay_options());
    let second = Relay::new(
        Arc::clone(&outbox),
        Arc::new(publisher(&kafka)),
        relay_options(),
    );

    let stalled = tokio::spawn(async move { first.relay_once().await.unwrap() });
    tokio::time::timeout(PATIENCE, stalling.published.notified())
        .await
        .expect("the first relay published");
    clock.advance(LEASE + Duration::from_secs(1));
    let took_over = second.relay_once().await.unwrap();
    assert_eq!((took_over.published, took_over.duplicates), (10, 0));
    stalling.release.notify_one();
    let crashed = stalled.await.unwrap();
    assert_eq!((crashed.published, crashed.lost), (0, 10));

    let (consumer, shop, _) = consumers::consumer(5);
    let mut source = kafka.other_group();
    let mut outcomes = Vec::new();
    for _ in 0..20 {
        let delivery = consumers::next(&mut source).await;
        outcomes.push(consumer.consume(&delivery).await.unwrap());
    }
    let applied = outcomes
        .iter()
        .filter(|c| matches!(c, Settled::Applied))
        .count();
    let duplicates = outcomes
        .iter()
        .filter(|c| matches!(c, Settled::Duplicate))
        .count();
    assert_eq!((applied, duplicates), (10, 10), "{outcomes:?}");
    assert_eq!(shop.effects().await.len(), 10);
    source.close().await;
    drop((enqueued, stalling, second));
    kafka.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_parks_its_aggregate_while_the_others_flow() {
    let kafka = Kafka::new().await;
    let outbox = Arc::new(MemoryOutbox::new());
    let enqueued = fill(&*outbox, "poison", "order.changed", 10, 20).await;
    let refusing: Arc<dyn Publisher> = Arc::new(Refusing {
        inner: publisher(&kafka),
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
    let read = kafka.read(flowing.len(), Duration::from_millis(500)).await;
    let copies = check_order(&flowing, &read);
    assert!(copies.values().all(|&n| n == 1));
    kafka.delete().await;
}

/// A private broker behind a proxy (its advertised address, so every
/// connection of the client goes through it) cut off for two seconds
/// while relays publish a backlog: nothing is lost, each aggregate stays
/// in order, and what a lost report made the relay publish again is
/// delivered as a copy, which the consumer's inbox makes a duplicate.
/// (tansu ends the producer's idempotent session across the cut: every
/// later record of it is refused as fenced, so the publisher goes on with a
/// new producer.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_cut_off_for_two_seconds_then_back_loses_nothing() {
    let port = idem_conformance::faults::free_port();
    let proxy = FaultProxy::start(format!("127.0.0.1:{port}")).await;
    let broker = PrivateTansu::start_on(port, proxy.address()).await;
    let kafka = Kafka::on(&broker.brokers()).await;
    let options = KafkaOptions::new(&kafka.topic)
        .unwrap()
        .with_timeout(Duration::from_secs(2))
        .unwrap();
    let through_proxy: Arc<dyn Publisher> =
        Arc::new(KafkaPublisher::new(&broker.brokers(), options).unwrap());
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

    let read = kafka.read(enqueued.len(), Duration::from_millis(500)).await;
    let copies = check_order(&enqueued, &read);
    assert!(copies.values().all(|&n| n >= 1));
    kafka.delete().await;
}
