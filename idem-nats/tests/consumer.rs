//! JetStreamSource on the real server, through the consumer scenarios
//! every broker adapter passes: a duplicate delivery acknowledged with no
//! effect, a consumer killed between its commit and its ack, a poison
//! message parked and replayed; the horizon read from the server; and
//! an attach and settlements over a stalled network that give up.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream;
use idem_conformance::consumers::{self, ConsumerBroker, MemoryBackend};
use idem_conformance::faults::FaultProxy;
use idem_conformance::jetstream::{ACK_WAIT, JetStream, WINDOW};
use idem_consumer::{Delivery, Source, async_trait};
use idem_core::store::{NewMessage, OutboxStore};
use idem_nats::JetStreamSource;

/// Longer than any call of a source may take (its limit is 10 s): a call
/// still waiting then waits forever.
const FOREVER: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_delivery_is_acked_without_effect() {
    let broker = JetStream::new().await;
    consumers::a_duplicate_delivery_is_acked_without_effect(&broker, &MemoryBackend).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_commit_and_ack_the_redelivery_has_no_second_effect() {
    let broker = JetStream::new().await;
    consumers::killed_between_commit_and_ack_the_redelivery_has_no_second_effect(
        &broker,
        &MemoryBackend,
    )
    .await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_no_handler_can_read_is_parked_at_once() {
    let broker = JetStream::new().await;
    consumers::a_message_no_handler_can_read_is_parked_at_once(&broker, &MemoryBackend).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_is_parked_and_replayed() {
    let broker = JetStream::new().await;
    consumers::a_poison_message_is_parked_and_replayed(&broker, &MemoryBackend).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_horizon_is_the_consumers_and_the_streams_figures() {
    let broker = JetStream::new().await;
    let source = broker.source().await;
    let horizon = source.horizon();
    assert_eq!(horizon.broker, "nats");
    assert_eq!(horizon.ack_wait, ACK_WAIT);
    assert_eq!(horizon.max_deliveries, None, "only the consumer decides");
    assert_eq!(horizon.duplicate_window, Some(WINDOW));
    let (consumer, _, _) = consumers::consumer(4);
    consumer.check(&horizon).unwrap();
    broker.delete().await;
}

/// A durable consumer with a delivery limit is refused at the start, at
/// or above the consumer's own count alike: JetStream counts copies no
/// consumer settled and drops the message at its limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_consumer_with_a_delivery_limit_is_refused() {
    let stream = common::TestStream::new().await;
    let (consumer, _, _) = consumers::consumer(4);
    for limit in [2, 4, 1_000] {
        let mut config = JetStreamSource::durable(&format!("limited-{limit}"), ACK_WAIT);
        config.max_deliver = limit;
        let source = JetStreamSource::attach(&stream.context, &stream.name, config)
            .await
            .unwrap();
        assert_eq!(source.horizon().max_deliveries, Some(limit as u32));
        let refused = consumer.check(&source.horizon());
        assert!(
            matches!(
                refused,
                Err(idem_consumer::ConsumerError::Misconfigured {
                    figure: "max deliveries",
                    ..
                })
            ),
            "{refused:?}"
        );
    }
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settling_over_a_stalled_network_ends_in_a_retryable_error() {
    let stream = common::TestStream::new().await;
    stream
        .context
        .publish(format!("{}.placed", stream.prefix), "order 1".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let proxy = FaultProxy::start(common::address()).await;
    // A short command queue: a stalled connection fills it soon.
    let client = async_nats::ConnectOptions::new()
        .client_capacity(8)
        .connect(common::url_via(&proxy.address()))
        .await
        .unwrap();
    let config = JetStreamSource::durable("stalled", Duration::from_secs(30));
    let mut source = JetStreamSource::attach(&jetstream::new(client.clone()), &stream.name, config)
        .await
        .unwrap();
    let delivery = tokio::time::timeout(FOREVER, source.next())
        .await
        .expect("the message is delivered")
        .unwrap()
        .expect("the source is open");

    proxy.stall();
    // The stalled proxy reads nothing more, so once the socket's buffers
    // are full the connection takes no more commands, for good: publish
    // until one is not taken. An ack that still found room (the queue
    // was not quite full yet) is queued and succeeds: fill again.
    let filler = bytes::Bytes::from(vec![0u8; 512 * 1024]);
    let mut tries = 0;
    let error = loop {
        tries += 1;
        assert!(tries <= 5, "the connection kept taking commands");
        while tokio::time::timeout(
            Duration::from_secs(5),
            client.publish("idem-test-filler", filler.clone()),
        )
        .await
        .is_ok()
        {}
        let acked = tokio::time::timeout(FOREVER, delivery.ack())
            .await
            .expect("an ack gives up on its own");
        if let Err(error) = acked {
            break error;
        }
    };
    assert!(error.is_retryable(), "{error}");
    assert_eq!(error.operation, "ack");

    let retried = tokio::time::timeout(FOREVER, delivery.retry(Duration::from_secs(1)))
        .await
        .expect("a NAK gives up on its own");
    let error = retried.expect_err("the connection takes nothing");
    assert!(error.is_retryable(), "{error}");
    assert_eq!(error.operation, "retry");
    drop(proxy);
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attaching_over_a_stalled_network_ends_in_a_retryable_error() {
    let stream = common::TestStream::new().await;
    let proxy = FaultProxy::start(common::address()).await;
    let client = async_nats::connect(common::url_via(&proxy.address()))
        .await
        .unwrap();
    // The context's own requests would wait longer than the test: only the
    // source's limit can end the attach.
    let patient = jetstream::ContextBuilder::new()
        .timeout(Duration::from_secs(100_000))
        .build(client);
    proxy.stall();
    let config = JetStreamSource::durable("stalled", Duration::from_secs(30));
    let attached = tokio::time::timeout(
        FOREVER,
        JetStreamSource::attach(&patient, &stream.name, config),
    )
    .await
    .expect("attaching gives up on its own");
    let error = attached.expect_err("the server's answers never came");
    assert!(error.is_retryable(), "{error}");
    assert_eq!(error.operation, "setup");
    drop(proxy);
    stream.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deliveries_apply_every_aggregate_in_order() {
    let broker = JetStream::new().await;
    consumers::concurrent_deliveries_apply_every_aggregate_in_order(&broker, &MemoryBackend).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_aggregate_holds_up_only_its_own() {
    let broker = JetStream::new().await;
    consumers::a_slow_aggregate_holds_up_only_its_own(&broker, &MemoryBackend).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acking_a_batch_settles_exactly_its_deliveries() {
    let broker = JetStream::new().await;
    consumers::acking_a_batch_settles_exactly_its_deliveries(&broker).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_no_consumer_settled_is_delivered_again_and_never_counted() {
    let broker = JetStream::new().await;
    consumers::a_delivery_no_consumer_settled_is_delivered_again_and_never_counted(
        &broker,
        &MemoryBackend,
    )
    .await;
    broker.delete().await;
}

/// A source that counts the deliveries of each message id it hands out.
struct Counting {
    source: JetStreamSource,
    seen: Arc<Mutex<HashMap<String, u32>>>,
}

#[async_trait]
impl Source for Counting {
    type Delivery = idem_nats::JetStreamDelivery;

    async fn next(&mut self) -> Result<Option<Self::Delivery>, idem_consumer::BrokerError> {
        let next = self.source.next().await?;
        if let Some(delivery) = &next {
            let id = delivery.message().id().as_str().to_string();
            *self.seen.lock().unwrap().entry(id).or_default() += 1;
        }
        Ok(next)
    }

    fn horizon(&self) -> idem_consumer::RedeliveryHorizon {
        self.source.horizon()
    }
}

/// Deliveries the consumer holds past the ack wait (one being handled,
/// two received and waiting behind it for their aggregate) are said to be
/// in progress, so JetStream sends no copy of any: each is delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_held_past_the_ack_wait_are_not_delivered_again() {
    let broker = JetStream::new().await;
    // Two slots: with the first taken, the consumer still receives the
    // other two, which wait behind their aggregate in its lanes (what sits
    // in the client's pull buffer unreceived is not the consumer's to keep).
    let (consumer, shop, _) = consumers::consumer_with(
        consumers::scenario_options(5)
            .concurrency(2)
            .batch(1, Duration::from_millis(1)),
    );
    let aggregate = format!("held-{}", uuid::Uuid::new_v4().simple());
    let events: Vec<NewMessage> = (1..=3)
        .map(|n| NewMessage::new(&aggregate, "order.changed", format!("{n}").into_bytes()).unwrap())
        .collect();
    let outbox = idem_memory::MemoryOutbox::new();
    let mut stored = Vec::new();
    for event in &events {
        stored.push(outbox.enqueue(event).await.unwrap());
    }
    let (entered, go) = shop.hold(&stored[0].id().to_string());
    let seen = Arc::new(Mutex::new(HashMap::new()));
    let mut source = Counting {
        source: broker.source().await,
        seen: seen.clone(),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn({
        let consumer = consumer.clone();
        async move {
            consumer
                .run(&mut source, async {
                    let _ = stopped.await;
                })
                .await
        }
    });
    for result in broker.publisher().publish(&stored).await {
        assert!(result.is_ok(), "{result:?}");
    }
    tokio::time::timeout(FOREVER, entered.notified())
        .await
        .expect("the first event is handled");
    // Two ack waits and more: without a word from the consumer, JetStream
    // sends each of the three again.
    tokio::time::sleep(ACK_WAIT * 2 + Duration::from_secs(1)).await;
    go.notify_one();
    idem_conformance::relays::wait_until("the three events applied", || async {
        shop.effects().await.len() == 3
    })
    .await;
    // A copy sent meanwhile would come out of the source by now.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert!(seen.values().all(|n| *n == 1), "delivered again: {seen:?}");
    broker.delete().await;
}
