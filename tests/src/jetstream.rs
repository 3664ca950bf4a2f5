//! NATS JetStream as a [`ConsumerBroker`] (the `nats` feature): a stream of
//! the test's own with a short duplicate window and one durable consumer
//! on it, for the consumer scenarios on any backend (`idem-nats` runs them
//! on the memory stores, `idem-dynamo` on DynamoDB's).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use idem_consumer::async_trait;
use idem_nats::{JetStreamOptions, JetStreamPublisher, JetStreamSource};
use idem_outbox::Publisher;

use crate::consumers::ConsumerBroker;

/// Short, so a consumer killed before its ack is redelivered soon; long
/// enough that a loaded machine acks every delivery it handles in time.
pub const ACK_WAIT: Duration = Duration::from_secs(3);
/// Short, so a second publish of one message can be made to get through.
pub const WINDOW: Duration = Duration::from_millis(200);

/// The server `IDEM_NATS_URL` names (scripts/test ensures one), or the
/// local default: a server that is not there fails the tests.
pub fn url() -> String {
    std::env::var("IDEM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_string())
}

/// A stream of the test's own (random name and subjects, in memory, aged
/// out in ten minutes should the test fail before [`delete`](Self::delete))
/// and one durable consumer on it.
pub struct JetStream {
    context: jetstream::Context,
    stream: String,
    durable: String,
    prefix: String,
    publisher: Arc<JetStreamPublisher>,
}

impl JetStream {
    /// Creates the stream.
    pub async fn new() -> Self {
        let client = async_nats::connect(url()).await.unwrap();
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
            JetStreamPublisher::connect(&url(), JetStreamOptions::new(&prefix).unwrap())
                .await
                .unwrap();
        Self {
            context,
            stream,
            durable: format!("consumer-{id}"),
            prefix,
            publisher: Arc::new(publisher),
        }
    }

    /// Deletes the stream.
    pub async fn delete(self) {
        let _ = self.context.delete_stream(&self.stream).await;
    }
}

#[async_trait]
impl ConsumerBroker for JetStream {
    type Source = JetStreamSource;

    fn publisher(&self) -> Arc<dyn Publisher> {
        self.publisher.clone()
    }

    async fn source(&self) -> JetStreamSource {
        // A connection of its own, so killing it leaves the others be.
        let client = async_nats::connect(url()).await.unwrap();
        let config = JetStreamSource::durable(&self.durable, ACK_WAIT);
        JetStreamSource::attach(&jetstream::new(client), &self.stream, config)
            .await
            .unwrap()
    }

    async fn kill(&self, source: JetStreamSource) {
        drop(source);
    }

    async fn publish_raw(&self, id: &str, aggregate: &str, version: &str) {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", id);
        headers.insert(idem_nats::AGGREGATE_HEADER, aggregate);
        headers.insert(idem_nats::SEQUENCE_HEADER, version);
        let subject = format!("{}.order.placed", self.prefix);
        self.context
            .publish_with_headers(subject, headers, "{}".into())
            .await
            .unwrap()
            .await
            .unwrap();
    }

    fn duplicate_window(&self) -> Duration {
        WINDOW * 2
    }
}
