//! JetStreamSource on the real server, through the consumer scenarios
//! every broker adapter passes: a duplicate delivery acknowledged with no
//! effect, a consumer killed between its commit and its ack, a poison
//! message parked and replayed; and the horizon read from the server.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use idem_conformance::consumers::{self, ConsumerBroker};
use idem_consumer::{Source, async_trait};
use idem_nats::{JetStreamOptions, JetStreamPublisher, JetStreamSource};
use idem_outbox::Publisher;

/// Short, so a consumer killed before its ack is redelivered soon; long
/// enough that a loaded machine acks every delivery it handles in time.
const ACK_WAIT: Duration = Duration::from_secs(3);
/// Short, so a second publish of one message can be made to get through.
const WINDOW: Duration = Duration::from_millis(200);

/// A stream of the test's own with a short duplicate window, and one
/// durable consumer on it.
struct JetStream {
    context: jetstream::Context,
    stream: String,
    durable: String,
    publisher: Arc<JetStreamPublisher>,
}

impl JetStream {
    async fn new() -> Self {
        let client = async_nats::connect(common::url()).await.unwrap();
        let context = jetstream::new(client);
        let id = uuid::Uuid::new_v4().simple().to_string();
        let stream = format!("IDEM_CONSUMER_{id}");
        let prefix = format!("idem-consumer-{id}");
        context
            .create_stream(jetstream::stream::Config {
                name: stream.clone(),
                subjects: vec![format!("{prefix}.>")],
                storage: jetstream::stream::StorageType::Memory,
                duplicate_window: WINDOW,
                max_age: Duration::from_secs(600),
                ..Default::default()
            })
            .await
            .unwrap();
        let publisher =
            JetStreamPublisher::connect(&common::url(), JetStreamOptions::new(&prefix).unwrap())
                .await
                .unwrap();
        Self {
            context,
            stream,
            durable: format!("consumer-{id}"),
            publisher: Arc::new(publisher),
        }
    }

    async fn delete(self) {
        let _ = self.context.delete_stream(&self.stream).await;
    }
}

#[async_trait]
impl ConsumerBroker for JetStream {
    type Source = JetStreamSource;

    fn publisher(&self) -> Arc<dyn Publisher> {
        self.publisher.clone()
    }

    async fn source(&self, max_deliveries: u32) -> JetStreamSource {
        // A connection of its own, so killing it leaves the others be.
        let client = async_nats::connect(common::url()).await.unwrap();
        let config = JetStreamSource::durable(&self.durable, max_deliveries, ACK_WAIT);
        JetStreamSource::attach(&jetstream::new(client), &self.stream, config)
            .await
            .unwrap()
    }

    async fn kill(&self, source: JetStreamSource) {
        drop(source);
    }

    fn duplicate_window(&self) -> Duration {
        WINDOW * 2
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_delivery_is_acked_without_effect() {
    let broker = JetStream::new().await;
    consumers::a_duplicate_delivery_is_acked_without_effect(&broker).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_commit_and_ack_the_redelivery_has_no_second_effect() {
    let broker = JetStream::new().await;
    consumers::killed_between_commit_and_ack_the_redelivery_has_no_second_effect(&broker).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_is_parked_and_replayed() {
    let broker = JetStream::new().await;
    consumers::a_poison_message_is_parked_and_replayed(&broker).await;
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
