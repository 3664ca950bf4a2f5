//! RabbitSource on the real broker, through the consumer scenarios every
//! broker adapter passes: a duplicate delivery acknowledged with no effect,
//! a consumer killed between its commit and its ack, a poison message
//! parked and replayed; on a quorum queue, which counts deliveries, and on
//! a classic queue, which does not; a source that reconnects after the
//! broker cut it off; and calls over a stalled network that give up.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use idem_conformance::consumers::{self, ConsumerBroker, MemoryBackend};
use idem_conformance::faults::FaultProxy;
use idem_consumer::{Delivery, Settled, Source, async_trait};
use idem_core::store::NewMessage;
use idem_outbox::Publisher;
use idem_rabbitmq::{RabbitOptions, RabbitPublisher, RabbitSource, RabbitSourceOptions};
use lapin::BasicProperties;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable};

/// An exchange and a durable queue of the test's own, and a publisher to
/// them.
struct Rabbit {
    topology: common::Topology,
    publisher: Arc<RabbitPublisher>,
}

impl Rabbit {
    async fn new(quorum: bool) -> Self {
        let topology = common::Topology::durable(quorum).await;
        let publisher = RabbitPublisher::connect(
            &common::url(),
            RabbitOptions::new(&topology.exchange).unwrap(),
        )
        .await
        .unwrap();
        Self {
            topology,
            publisher: Arc::new(publisher),
        }
    }

    async fn delete(self) {
        self.topology.delete().await;
    }
}

#[async_trait]
impl ConsumerBroker for Rabbit {
    type Source = RabbitSource;

    fn publisher(&self) -> Arc<dyn Publisher> {
        self.publisher.clone()
    }

    async fn source(&self) -> RabbitSource {
        let options = RabbitSourceOptions::new(self.topology.queue()).unwrap();
        RabbitSource::connect(&common::url(), options)
            .await
            .unwrap()
    }

    async fn kill(&self, source: RabbitSource) {
        source.close().await.unwrap();
    }

    async fn publish_raw(&self, id: &str, aggregate: &str, version: &str) {
        let mut headers = FieldTable::default();
        headers.insert(
            idem_rabbitmq::AGGREGATE_HEADER.into(),
            AMQPValue::LongString(aggregate.into()),
        );
        headers.insert(
            idem_rabbitmq::SEQUENCE_HEADER.into(),
            AMQPValue::LongString(version.into()),
        );
        let properties = BasicProperties::default()
            .with_message_id(id.into())
            .with_type("order.placed".into())
            .with_headers(headers);
        let channel = &self.topology.channel;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        channel
            .basic_publish(
                self.topology.exchange.as_str().into(),
                "order.placed".into(),
                BasicPublishOptions::default(),
                b"{}",
                properties,
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }

    fn duplicate_window(&self) -> Duration {
        Duration::ZERO
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_delivery_is_acked_without_effect() {
    let broker = Rabbit::new(true).await;
    consumers::a_duplicate_delivery_is_acked_without_effect(&broker, &MemoryBackend).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_commit_and_ack_the_redelivery_has_no_second_effect() {
    let broker = Rabbit::new(true).await;
    consumers::killed_between_commit_and_ack_the_redelivery_has_no_second_effect(
        &broker,
        &MemoryBackend,
    )
    .await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_no_handler_can_read_is_parked_at_once() {
    let broker = Rabbit::new(true).await;
    consumers::a_message_no_handler_can_read_is_parked_at_once(&broker, &MemoryBackend).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_is_parked_and_replayed() {
    let broker = Rabbit::new(true).await;
    consumers::a_poison_message_is_parked_and_replayed(&broker, &MemoryBackend).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_classic_queue_a_poison_message_parks_at_the_consumers_own_count() {
    let broker = Rabbit::new(false).await;
    consumers::a_poison_message_is_parked_and_replayed(&broker, &MemoryBackend).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_horizon_is_the_ack_timeout_with_no_delivery_limit() {
    let broker = Rabbit::new(false).await;
    let source = broker.source().await;
    let horizon = source.horizon();
    assert_eq!(horizon.broker, "rabbitmq");
    assert_eq!(horizon.ack_wait, RabbitSourceOptions::DEFAULT_ACK_TIMEOUT);
    assert_eq!(horizon.max_deliveries, None, "only the consumer decides");
    let (consumer, _, _) = consumers::consumer(4);
    consumer.check(&horizon).unwrap();
    broker.kill(source).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_of_its_own_connection_reconnects_after_the_broker_cut_it_off() {
    let broker = Rabbit::new(true).await;
    let proxy = FaultProxy::start(common::address()).await;
    let (consumer, shop, _) = consumers::consumer(5);
    let options = RabbitSourceOptions::new(broker.topology.queue()).unwrap();
    let mut source = RabbitSource::connect(&common::url_via(&proxy.address()), options)
        .await
        .unwrap();
    let order =
        |name: &str| NewMessage::new(name, "order.placed", name.as_bytes().to_vec()).unwrap();
    let before = consumers::publish(&*broker.publisher(), &[order("before")]).await;
    let delivered = consumers::next(&mut source).await;

    // Cut with the delivery unsettled, and nothing forwarded for a second:
    // its commit stands, its ack never reaches the broker.
    proxy.stall();
    proxy.cut_all();
    let unsettled = consumer.consume(&delivered).await;
    assert!(
        matches!(unsettled, Ok(Settled::Applied) | Err(_)),
        "{unsettled:?}"
    );
    let after = consumers::publish(&*broker.publisher(), &[order("after")]).await;
    let back = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        proxy.resume();
        proxy
    });

    let mut outcomes = BTreeMap::new();
    while outcomes.len() < 2 {
        let delivery = consumers::next(&mut source).await;
        let id = delivery.message().id().as_str().to_string();
        outcomes.insert(id, consumer.consume(&delivery).await.unwrap());
    }
    assert_eq!(
        outcomes,
        BTreeMap::from([
            (before[0].id().to_string(), Settled::Duplicate),
            (after[0].id().to_string(), Settled::Applied),
        ])
    );
    assert_eq!(shop.effects().await, ["before", "after"]);
    let proxy = back.await.unwrap();
    broker.kill(source).await;
    drop(proxy);
    broker.delete().await;
}

/// Past this, a call that should have given up on its own is taken for one
/// waiting forever: well over the source's 10 s, so a busy machine is no
/// reason to fail.
const FOREVER: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_and_closing_over_a_stalled_network_end_in_a_retryable_error() {
    let broker = Rabbit::new(true).await;
    let proxy = FaultProxy::start(common::address()).await;
    let url = common::url_via(&proxy.address());
    let options = RabbitSourceOptions::new(broker.topology.queue()).unwrap();

    // The proxy accepts and forwards nothing: the handshake never ends.
    proxy.stall();
    let connected = tokio::time::timeout(FOREVER, RabbitSource::connect(&url, options.clone()))
        .await
        .expect("connecting gives up on its own");
    let error = connected.expect_err("no broker answered");
    assert!(error.is_retryable(), "{error}");

    proxy.resume();
    let source = RabbitSource::connect(&url, options).await.unwrap();
    // The close is sent and its answer never comes back.
    proxy.stall();
    let closed = tokio::time::timeout(FOREVER, source.close())
        .await
        .expect("closing gives up on its own");
    let error = closed.expect_err("no broker answered the close");
    assert!(error.is_retryable(), "{error}");
    drop(proxy);
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deliveries_apply_every_aggregate_in_order() {
    let broker = Rabbit::new(true).await;
    consumers::concurrent_deliveries_apply_every_aggregate_in_order(&broker, &MemoryBackend).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_aggregate_holds_up_only_its_own() {
    let broker = Rabbit::new(true).await;
    consumers::a_slow_aggregate_holds_up_only_its_own(&broker, &MemoryBackend).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acking_a_batch_settles_exactly_its_deliveries() {
    let broker = Rabbit::new(true).await;
    consumers::acking_a_batch_settles_exactly_its_deliveries(&broker).await;
    broker.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_no_consumer_settled_is_delivered_again_and_never_counted() {
    let broker = Rabbit::new(true).await;
    consumers::a_delivery_no_consumer_settled_is_delivered_again_and_never_counted(
        &broker,
        &MemoryBackend,
    )
    .await;
    broker.delete().await;
}
