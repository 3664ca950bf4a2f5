//! JetStreamSource on the real server, through the consumer scenarios
//! every broker adapter passes: a duplicate delivery acknowledged with no
//! effect, a consumer killed between its commit and its ack, a poison
//! message parked and replayed; the horizon read from the server; and
//! an attach and settlements over a stalled network that give up.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::time::Duration;

use async_nats::jetstream;
use idem_conformance::consumers::{self, ConsumerBroker, MemoryBackend};
use idem_conformance::faults::FaultProxy;
use idem_conformance::jetstream::{ACK_WAIT, JetStream, WINDOW};
use idem_consumer::{Delivery, Source};
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
