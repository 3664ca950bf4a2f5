//! JetStreamSource on the real server, through the consumer scenarios
//! every broker adapter passes: a duplicate delivery acknowledged with no
//! effect, a consumer killed between its commit and its ack, a poison
//! message parked and replayed; and the horizon read from the server.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use idem_conformance::consumers::{self, ConsumerBroker, MemoryBackend};
use idem_conformance::jetstream::{ACK_WAIT, JetStream, WINDOW};
use idem_consumer::Source;

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
    let source = broker.source(4).await;
    let horizon = source.horizon();
    assert_eq!(horizon.broker, "nats");
    assert_eq!(horizon.ack_wait, ACK_WAIT);
    assert_eq!(horizon.max_deliveries, Some(4));
    assert_eq!(horizon.duplicate_window, Some(WINDOW));
    let (consumer, _, _) = consumers::consumer(4);
    consumer.check(&horizon).unwrap();
    let (five, _, _) = consumers::consumer(5);
    assert!(
        five.check(&horizon).is_err(),
        "the stream stops before the consumer parks"
    );
    broker.delete().await;
}
