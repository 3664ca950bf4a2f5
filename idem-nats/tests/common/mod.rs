//! JetStream for the tests: the server's URL, a private stream per test
//! (random name and subjects, in memory, gone afterwards), and a reader.

#![allow(dead_code, unreachable_pub)]

pub use idem_conformance::relays as outbox;

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, pull};
use async_nats::jetstream::{self, Context};
use futures_util::StreamExt;
use tokio::time::Instant;

/// The server scripts/test ensures (the same default without it: a server
/// that is not there fails the tests).
pub use idem_conformance::jetstream::url;

/// `host:port` of the server.
pub fn address() -> String {
    idem_conformance::faults::authority(&url()).to_string()
}

/// The server's URL with `address` in place of its own.
pub fn url_via(address: &str) -> String {
    idem_conformance::faults::url_via(&url(), address)
}

/// A stream of the test's own on `<prefix>.>`, with a two-minute duplicate
/// window; it ages out in ten minutes should the test fail before
/// [`TestStream::delete`].
pub struct TestStream {
    pub context: Context,
    pub name: String,
    pub prefix: String,
}

impl TestStream {
    pub async fn new() -> Self {
        let client = async_nats::connect(url())
            .await
            .expect("connect to NATS (run through scripts/test)");
        let context = jetstream::new(client);
        let id = uuid::Uuid::new_v4().simple().to_string();
        let name = format!("IDEM_TEST_{id}");
        let prefix = format!("idem-test-{id}");
        context
            .create_stream(jetstream::stream::Config {
                name: name.clone(),
                subjects: vec![format!("{prefix}.>")],
                storage: jetstream::stream::StorageType::Memory,
                duplicate_window: Duration::from_secs(120),
                max_age: Duration::from_secs(600),
                ..Default::default()
            })
            .await
            .expect("create a stream");
        Self {
            context,
            name,
            prefix,
        }
    }

    /// How many messages the stream holds.
    pub async fn stored(&self) -> u64 {
        let stream = self.context.get_stream(&self.name).await.unwrap();
        stream.get_info().await.unwrap().state.messages
    }

    /// Reads the stream from its start: at least `count` messages (panics
    /// after the tests' patience), then any more within `settle`.
    pub async fn read(&self, count: usize, settle: Duration) -> Vec<jetstream::Message> {
        let stream = self.context.get_stream(&self.name).await.unwrap();
        let consumer: pull::Stream = stream
            .create_consumer(pull::Config {
                deliver_policy: DeliverPolicy::All,
                ack_policy: AckPolicy::None,
                inactive_threshold: Duration::from_secs(60),
                ..Default::default()
            })
            .await
            .unwrap()
            .messages()
            .await
            .unwrap();
        let mut consumer = consumer;
        let deadline = Instant::now() + outbox::PATIENCE;
        let mut messages = Vec::with_capacity(count);
        while messages.len() < count {
            let next = tokio::time::timeout_at(deadline, consumer.next())
                .await
                .unwrap_or_else(|_| panic!("only {} of {count} messages arrived", messages.len()));
            messages.push(next.expect("the consumer goes on").expect("a message"));
        }
        while let Ok(Some(next)) = tokio::time::timeout(settle, consumer.next()).await {
            messages.push(next.expect("a message"));
        }
        messages
    }

    pub async fn delete(self) {
        let _ = self.context.delete_stream(&self.name).await;
    }
}

/// A header's value.
pub fn header<'a>(message: &'a jetstream::Message, name: &str) -> Option<&'a str> {
    message
        .headers
        .as_ref()
        .and_then(|headers| headers.get(name))
        .map(|value| value.as_str())
}

/// `(message id, aggregate, sequence, payload)` of each message.
pub fn summary(messages: &[jetstream::Message]) -> Vec<(String, String, u64, Vec<u8>)> {
    messages
        .iter()
        .map(|m| {
            (
                header(m, "Nats-Msg-Id").expect("a message id").to_string(),
                header(m, idem_nats::AGGREGATE_HEADER)
                    .expect("an aggregate")
                    .to_string(),
                header(m, idem_nats::SEQUENCE_HEADER)
                    .expect("a sequence")
                    .parse()
                    .unwrap(),
                m.payload.to_vec(),
            )
        })
        .collect()
}
