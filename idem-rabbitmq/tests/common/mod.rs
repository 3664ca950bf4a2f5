//! RabbitMQ for the tests: the broker's URL, a private exchange and queue
//! per test (random names, gone afterwards), and a consumer.

#![allow(dead_code, unreachable_pub)]

pub use idem_conformance::relays as outbox;

use std::time::Duration;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicConsumeOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, Consumer, ExchangeKind};
use tokio::time::Instant;

/// The broker scripts/test ensures (the same default without it: a broker
/// that is not there fails the tests).
pub fn url() -> String {
    std::env::var("IDEM_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_string())
}

/// `host:port` of the broker.
pub fn address() -> String {
    idem_conformance::faults::authority(&url()).to_string()
}

/// The broker's URL with `address` in place of its own.
pub fn url_via(address: &str) -> String {
    idem_conformance::faults::url_via(&url(), address)
}

/// A random name of `kind` for one test.
pub fn fresh(kind: &str) -> String {
    format!("idem-test-{kind}-{}", uuid::Uuid::new_v4().simple())
}

/// A topic exchange of the test's own and, if bound, a queue on it taking
/// every routing key. The queue of [`Topology::new`] is exclusive to this
/// connection, and the exchange deletes itself with its last binding, so
/// both go with the connection even if the test fails; the queue of
/// [`Topology::durable`] outlives it (consumers on other connections), and
/// deletes itself after ten minutes unused. [`Topology::delete`] removes
/// them at once.
pub struct Topology {
    pub connection: Connection,
    pub channel: Channel,
    pub exchange: String,
    pub queue: Option<String>,
}

impl Topology {
    /// A connection to the broker with a topic exchange of its own.
    async fn exchange(auto_delete: bool) -> (Connection, Channel, String) {
        let connection = Connection::connect(&url(), ConnectionProperties::default())
            .await
            .expect("connect to RabbitMQ (run through scripts/test)");
        let channel = connection.create_channel().await.unwrap();
        let exchange = fresh("exchange");
        channel
            .exchange_declare(
                exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    auto_delete,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        (connection, channel, exchange)
    }

    /// A durable queue (`idem_rabbitmq::bound_queue`), a quorum queue (which
    /// counts deliveries, so they survive a consumer) or a classic one.
    pub async fn durable(quorum: bool) -> Self {
        let (connection, channel, exchange) = Self::exchange(true).await;
        let queue = fresh("queue");
        let mut arguments = FieldTable::default();
        if quorum {
            arguments.insert(
                "x-queue-type".into(),
                AMQPValue::LongString("quorum".into()),
            );
        }
        arguments.insert("x-expires".into(), AMQPValue::LongLongInt(600_000));
        idem_rabbitmq::bound_queue(&channel, &exchange, &queue, arguments)
            .await
            .unwrap();
        Self {
            connection,
            channel,
            exchange,
            queue: Some(queue),
        }
    }

    /// The bound queue's name.
    pub fn queue(&self) -> &str {
        self.queue.as_deref().expect("a bound topology")
    }

    pub async fn new(bound: bool) -> Self {
        let (connection, channel, exchange) = Self::exchange(bound).await;
        let queue = if bound {
            let queue = fresh("queue");
            channel
                .queue_declare(
                    queue.as_str().into(),
                    QueueDeclareOptions {
                        exclusive: true,
                        ..QueueDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .unwrap();
            channel
                .queue_bind(
                    queue.as_str().into(),
                    exchange.as_str().into(),
                    "#".into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
            Some(queue)
        } else {
            None
        };
        Self {
            connection,
            channel,
            exchange,
            queue,
        }
    }

    /// A consumer of the queue (deliveries acknowledged on receipt).
    pub async fn consumer(&self) -> Consumer {
        self.channel
            .basic_consume(
                self.queue().into(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap()
    }

    pub async fn delete(&self) {
        if let Some(queue) = &self.queue {
            let _ = self
                .channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        let _ = self
            .channel
            .exchange_delete(
                self.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
        let _ = self.connection.close(200, "done".into()).await;
    }
}

/// Reads at least `count` deliveries (panics after the tests' patience),
/// then any more that come within `settle` of the last.
pub async fn read(consumer: &mut Consumer, count: usize, settle: Duration) -> Vec<Delivery> {
    let deadline = Instant::now() + outbox::PATIENCE;
    let mut deliveries = Vec::with_capacity(count);
    while deliveries.len() < count {
        let next = tokio::time::timeout_at(deadline, consumer.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of {count} deliveries arrived", deliveries.len()));
        deliveries.push(next.expect("the consumer goes on").expect("a delivery"));
    }
    while let Ok(Some(next)) = tokio::time::timeout(settle, consumer.next()).await {
        deliveries.push(next.expect("a delivery"));
    }
    deliveries
}

/// A header's value as text (a long string), or as a number.
pub fn header<'a>(delivery: &'a Delivery, name: &str) -> Option<&'a AMQPValue> {
    delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|headers| headers.inner().get(name))
}

pub fn text(value: Option<&AMQPValue>) -> String {
    match value {
        Some(AMQPValue::LongString(s)) => String::from_utf8(s.as_bytes().to_vec()).unwrap(),
        other => panic!("not a long string: {other:?}"),
    }
}

/// `(message id, aggregate, sequence, payload)` of each delivery.
pub fn summary(deliveries: &[Delivery]) -> Vec<(String, String, u64, Vec<u8>)> {
    deliveries
        .iter()
        .map(|d| {
            let id = d
                .properties
                .message_id()
                .as_ref()
                .expect("a message id")
                .to_string();
            let aggregate = text(header(d, idem_rabbitmq::AGGREGATE_HEADER));
            let sequence = match header(d, idem_rabbitmq::SEQUENCE_HEADER) {
                Some(AMQPValue::LongLongInt(n)) => u64::try_from(*n).unwrap(),
                other => panic!("sequence header: {other:?}"),
            };
            (id, aggregate, sequence, d.data.clone())
        })
        .collect()
}
