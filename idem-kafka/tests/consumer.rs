//! KafkaSource on a real Kafka-protocol broker, through the consumer
//! scenarios every broker adapter passes, and what Kafka asks of its own:
//! commits that never pass an unsettled message, a rebalance while
//! deliveries are held, a configuration that would commit by itself.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use std::time::Duration;

use idem_conformance::consumers::{self, ConsumerBroker, MemoryBackend};
use idem_conformance::kafka::Kafka;
use idem_consumer::{Delivery, Settled, Source};
use idem_core::store::NewMessage;
use idem_kafka::{KafkaSetupError, KafkaSource};

fn order(n: &str) -> NewMessage {
    NewMessage::new(
        &format!("order-{n}"),
        "order.placed",
        format!("order {n}").into_bytes(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_delivery_is_acked_without_effect() {
    let broker = Kafka::new().await;
    consumers::a_duplicate_delivery_is_acked_without_effect(&broker, &MemoryBackend).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_commit_and_ack_the_redelivery_has_no_second_effect() {
    let broker = Kafka::new().await;
    consumers::killed_between_commit_and_ack_the_redelivery_has_no_second_effect(
        &broker,
        &MemoryBackend,
    )
    .await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_no_handler_can_read_is_parked_at_once() {
    let broker = Kafka::new().await;
    consumers::a_message_no_handler_can_read_is_parked_at_once(&broker, &MemoryBackend).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_is_parked_and_replayed() {
    let broker = Kafka::new().await;
    consumers::a_poison_message_is_parked_and_replayed(&broker, &MemoryBackend).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_no_consumer_settled_is_delivered_again_and_never_counted() {
    let broker = Kafka::new().await;
    consumers::a_delivery_no_consumer_settled_is_delivered_again_and_never_counted(
        &broker,
        &MemoryBackend,
    )
    .await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deliveries_apply_every_aggregate_in_order() {
    let broker = Kafka::new().await;
    consumers::concurrent_deliveries_apply_every_aggregate_in_order(&broker, &MemoryBackend).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_aggregate_holds_up_only_its_own() {
    let broker = Kafka::new().await;
    consumers::a_slow_aggregate_holds_up_only_its_own(&broker, &MemoryBackend).await;
    broker.delete().await;
}

/// Kafka commits an offset, not a message: acknowledging every delivery
/// of a partition but its first commits nothing, so all of them come back
/// to the next member (as duplicates, for the inbox); once the first is
/// acknowledged too, none does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acking_past_an_unsettled_delivery_commits_nothing_past_it() {
    let broker = Kafka::new().await;
    // One aggregate: one partition, in order.
    let messages: Vec<NewMessage> = (0..6).map(|_| order("one")).collect();
    let sent = consumers::publish(&*broker.publisher(), &messages).await;
    let ids: Vec<String> = sent.iter().map(|m| m.id().to_string()).collect();
    let mut source = broker.source().await;
    let mut received = Vec::new();
    for _ in 0..sent.len() {
        received.push(consumers::next(&mut source).await);
    }
    let got: Vec<&str> = received.iter().map(|d| d.message().id().as_str()).collect();
    assert_eq!(got, ids, "one partition, in order");
    let past_the_first: Vec<&_> = received[1..].iter().collect();
    idem_kafka::KafkaDelivery::ack_all(&past_the_first)
        .await
        .unwrap();
    drop(received);
    broker.kill(source).await;

    let mut source = broker.source().await;
    let mut again = Vec::new();
    for _ in 0..sent.len() {
        again.push(consumers::next(&mut source).await);
    }
    let got: Vec<&str> = again.iter().map(|d| d.message().id().as_str()).collect();
    assert_eq!(got, ids, "nothing was committed past the first");
    let all: Vec<&_> = again.iter().collect();
    idem_kafka::KafkaDelivery::ack_all(&all).await.unwrap();
    drop(again);
    broker.kill(source).await;

    let marker = consumers::publish(&*broker.publisher(), &[order("one")]).await;
    let mut source = broker.source().await;
    let next = consumers::next(&mut source).await;
    assert_eq!(
        next.message().id().as_str(),
        marker[0].id().to_string(),
        "all six were committed"
    );
    drop(next);
    broker.kill(source).await;
    broker.delete().await;
}

/// A retried delivery comes back from the source after its delay, counted
/// one more, while the partition's later messages flow meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_is_delivered_again_after_its_delay_while_the_partition_flows() {
    let broker = Kafka::new().await;
    let sent = consumers::publish(&*broker.publisher(), &[order("r"), order("r")]).await;
    let mut source = broker.source().await;
    let first = consumers::next(&mut source).await;
    assert_eq!(first.message().id().as_str(), sent[0].id().to_string());
    assert_eq!(first.deliveries(), 1);
    // Long beside the later message's delivery, fetched with the first.
    let delay = Duration::from_secs(1);
    let asked = tokio::time::Instant::now();
    first.retry(delay).await.unwrap();
    let second = consumers::next(&mut source).await;
    assert_eq!(
        second.message().id().as_str(),
        sent[1].id().to_string(),
        "the later message is not held behind the retry"
    );
    let again = consumers::next(&mut source).await;
    assert!(asked.elapsed() >= delay, "delivered again before its delay");
    assert_eq!(again.message().id().as_str(), sent[0].id().to_string());
    assert_eq!(again.deliveries(), 2);
    second.ack().await.unwrap();
    again.ack().await.unwrap();
    broker.kill(source).await;
    broker.delete().await;
}

/// Two members of one group, the second joining while the first holds
/// deliveries of every partition: the first's held deliveries settle
/// nothing once their partitions moved, and every message is applied once
/// by the pair.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_while_deliveries_are_held_loses_nothing_and_applies_once() {
    let broker = Kafka::new().await;
    let (consumer, shop, _) = consumers::consumer(5);
    let messages: Vec<NewMessage> = (0..40).map(|n| order(&format!("{n}"))).collect();
    let sent = consumers::publish(&*broker.publisher(), &messages).await;
    let mut first = broker.source().await;
    let mut held = Vec::new();
    for _ in 0..10 {
        held.push(consumers::next(&mut first).await);
    }
    // The second member joins; the first goes on asking for messages, in
    // which the rebalance is served.
    let second = broker.source().await;
    let stop = std::sync::Arc::new(tokio::sync::Notify::new());
    let runs = [(first, "first"), (second, "second")].map(|(mut source, _)| {
        let (consumer, stop) = (consumer.clone(), stop.clone());
        tokio::spawn(async move {
            let ran = consumer
                .run(&mut source, async move { stop.notified().await })
                .await;
            (ran, source)
        })
    });
    // What the first held before the rebalance is applied now: its acks
    // settle nothing in its old assignment.
    for delivery in &held {
        let consumed = consumer.consume(delivery).await.unwrap();
        assert!(
            matches!(consumed, Settled::Applied | Settled::Duplicate),
            "{consumed:?}"
        );
    }
    drop(held);
    idem_conformance::relays::wait_until("every message applied", || async {
        shop.effects().await.len() >= sent.len()
    })
    .await;
    stop.notify_waiters();
    for run in runs {
        let (ran, source) = run.await.unwrap();
        ran.unwrap();
        broker.kill(source).await;
    }
    let mut effects = shop.effects().await;
    effects.sort();
    let mut expected: Vec<String> = (0..40).map(|n| format!("order {n}")).collect();
    expected.sort();
    assert_eq!(effects, expected, "each applied once");
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_horizon_is_the_members_poll_interval_with_no_limit() {
    let broker = Kafka::new().await;
    let config = KafkaSource::config(&idem_conformance::kafka::brokers(), "polled");
    let source = KafkaSource::subscribe(&config, &[&broker.topic]).unwrap();
    let horizon = source.horizon();
    assert_eq!(horizon.broker, "kafka");
    assert_eq!(
        horizon.ack_wait,
        Duration::from_secs(300),
        "librdkafka's default"
    );
    assert_eq!(horizon.max_deliveries, None, "only the consumer decides");
    assert_eq!(
        horizon.duplicate_window, None,
        "Kafka drops no second record"
    );
    let (consumer, _, _) = consumers::consumer(4);
    consumer.check(&horizon).unwrap();
    broker.kill(source).await;

    // The tests' members: ten seconds.
    let source = broker.source().await;
    assert_eq!(source.horizon().ack_wait, Duration::from_secs(10));
    broker.kill(source).await;
    broker.delete().await;
}

/// librdkafka committing by itself would commit past messages no one
/// settled: such a configuration is refused before anything is read.
#[test]
fn a_member_that_would_commit_by_itself_is_refused() {
    for value in ["true", "TRUE"] {
        let mut config = KafkaSource::config("127.0.0.1:9092", "auto");
        config.set("enable.auto.commit", value);
        let refused = KafkaSource::subscribe(&config, &["orders"]);
        assert!(
            matches!(
                refused,
                Err(KafkaSetupError::Refused {
                    setting: "enable.auto.commit",
                    ..
                })
            ),
            "{refused:?}"
        );
    }
    let mut config = KafkaSource::config("127.0.0.1:9092", "auto");
    config.remove("enable.auto.commit");
    assert!(
        KafkaSource::subscribe(&config, &["orders"]).is_err(),
        "librdkafka's default commits"
    );
}

/// librdkafka's close and a commit waiting for its answer block for as long
/// as the broker does not answer: a source whose broker is gone for good
/// (removed while its members still held settled offsets to commit)
/// neither holds its `close` past the session timeout and 5 s, nor, dropped,
/// the runtime's shutdown (which waits for every blocking task it started).
#[test]
fn a_source_whose_broker_is_gone_holds_up_neither_its_close_nor_the_runtime() {
    // The session timeout of the members Kafka::source makes.
    let session = idem_conformance::kafka::member_config("", "")
        .get("session.timeout.ms")
        .and_then(|ms| ms.parse().ok())
        .map(Duration::from_millis)
        .unwrap();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let closed_in = runtime.block_on(async {
            let broker = idem_conformance::kafka::PrivateTansu::start().await;
            let kafka = Kafka::on(&broker.brokers()).await;
            let messages: Vec<NewMessage> = ["a", "b", "c", "d"].map(order).to_vec();
            consumers::publish(&*kafka.publisher(), &messages).await;
            // Two members, each settling what it was handed: each holds an
            // offset it asked to commit, which its close commits again and
            // waits for.
            let (mut dropped, mut closed) = (kafka.source().await, kafka.source().await);
            let (mut settled, mut turn) = (0, 0);
            while settled < messages.len() {
                turn += 1;
                let source = if turn % 2 == 0 {
                    &mut dropped
                } else {
                    &mut closed
                };
                let wait = Duration::from_millis(500);
                if let Ok(next) = tokio::time::timeout(wait, source.next()).await {
                    next.unwrap().unwrap().ack().await.unwrap();
                    settled += 1;
                }
            }
            broker.kill().await;
            drop(dropped);
            let started = std::time::Instant::now();
            closed.close().await;
            started.elapsed()
        });
        drop(runtime);
        let _ = done.send(closed_in);
    });
    let closed_in = finished
        .recv_timeout(Duration::from_secs(240))
        .expect("the runtime shut down");
    assert!(
        closed_in <= session + Duration::from_secs(5) + Duration::from_secs(5),
        "closed in {closed_in:?}"
    );
}
