//! A consumer on DynamoDB over the shared NATS JetStream: the consumer
//! scenarios every backend passes (a duplicate delivery acknowledged with
//! no effect, a consumer killed between its commit and its ack, a poison
//! message parked and replayed), with a `DynamoStore` inbox, `DynamoParking`
//! and a shop whose effect and version check (`VersionedItems`) go through
//! the `DynamoTransaction`; and the inbox claim's completion and the domain
//! write committed in one `TransactWriteItems`, counted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use idem_conformance::consumers::{
    self, Books, ConsumerBackend, ConsumerBroker, Gates, Scenario, Shop, next, publish,
    scenario_options,
};
use idem_conformance::jetstream::JetStream;
use idem_consumer::{Consumer, ConsumerOptions, Delivery, Settled};
use idem_core::store::{NewMessage, ParkingStore, VersionCheck, VersionStore};
use idem_core::{HandlerError, StoreError, async_trait};
use idem_dynamo::aws_sdk_dynamodb::config::interceptors::BeforeTransmitInterceptorContextRef;
use idem_dynamo::aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use idem_dynamo::aws_sdk_dynamodb::error::BoxError;
use idem_dynamo::aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use idem_dynamo::aws_sdk_dynamodb::{Client, Config};
use idem_dynamo::{DynamoOptions, DynamoParking, DynamoStore, DynamoTransaction, VersionedItems};

/// The shop's item that lists every effect, in commit order.
const LEDGER: &str = "ledger";

/// A request: its operation and the tables it names.
type Request = (String, BTreeSet<String>);

/// Each request the client sends.
#[derive(Debug, Clone, Default)]
struct Requests(Arc<Mutex<Vec<Request>>>);

impl Requests {
    fn take(&self) -> Vec<Request> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl Intercept for Requests {
    fn name(&self) -> &'static str {
        "requests"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request();
        let operation = request
            .headers()
            .get("x-amz-target")
            .and_then(|target| target.rsplit('.').next())
            .unwrap_or_default()
            .to_string();
        let body: serde_json::Value =
            serde_json::from_slice(request.body().bytes().unwrap_or(b"{}"))?;
        // As the server counts them: the request's table, or each of a
        // transaction's items'.
        let items = body["TransactItems"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let tables = std::iter::once(&body)
            .chain(
                items
                    .iter()
                    .flat_map(|item| item.as_object().into_iter().flat_map(|o| o.values())),
            )
            .filter_map(|value| value["TableName"].as_str().map(str::to_string))
            .collect();
        self.0.lock().unwrap().push((operation, tables));
        Ok(())
    }
}

/// The shop's books on DynamoDB: a domain table of the test's own holding
/// the ledger and each aggregate's item, written through the inbox's
/// transaction.
#[derive(Clone)]
struct DynamoBooks {
    inbox: DynamoStore,
    domain: String,
    versions: VersionedItems,
    /// Holds the next applying message between its version check and its
    /// commit: notifies the first gate, waits for the second.
    after_check: Arc<Mutex<Option<Gates>>>,
}

#[async_trait]
impl Books for DynamoBooks {
    type Tx = DynamoTransaction;

    async fn begin(&self) -> Result<DynamoTransaction, StoreError> {
        self.inbox.begin().await
    }

    async fn apply(
        &self,
        tx: &mut DynamoTransaction,
        effect: &str,
        version: Option<(&str, u64)>,
    ) -> Result<VersionCheck, HandlerError> {
        if let Some((aggregate, event)) = version {
            let check = self.versions.advance(tx, aggregate, event).await?;
            if check != VersionCheck::Apply {
                return Ok(check);
            }
            let gates = self.after_check.lock().unwrap().take();
            if let Some((checked, go)) = gates {
                checked.notify_one();
                go.notified().await;
            }
        }
        let append = Update::builder()
            .table_name(&self.domain)
            .key("pk", AttributeValue::S(LEDGER.into()))
            .update_expression("SET effects = list_append(if_not_exists(effects, :none), :one)")
            .expression_attribute_values(":none", AttributeValue::L(Vec::new()))
            .expression_attribute_values(
                ":one",
                AttributeValue::L(vec![AttributeValue::S(effect.into())]),
            )
            .build()?;
        tx.push(TransactWriteItem::builder().update(append).build());
        Ok(VersionCheck::Apply)
    }

    async fn effects(&self) -> Vec<String> {
        let ledger = self
            .inbox
            .client()
            .get_item()
            .table_name(&self.domain)
            .key("pk", AttributeValue::S(LEDGER.into()))
            .consistent_read(true)
            .send()
            .await
            .unwrap()
            .item;
        let Some(effects) = ledger.as_ref().and_then(|l| l.get("effects")) else {
            return Vec::new();
        };
        effects
            .as_l()
            .unwrap()
            .iter()
            .map(|e| e.as_s().unwrap().clone())
            .collect()
    }
}

/// Tables of the test's own (the inbox, the parking store, the domain),
/// over a client that records its requests.
struct DynamoBackend {
    inbox: DynamoStore,
    parking: DynamoParking,
    domain: String,
    requests: Requests,
}

impl DynamoBackend {
    async fn new() -> Self {
        let requests = Requests::default();
        let config: Config = common::config_with(&common::endpoint(), common::CONNECT_TIMEOUT)
            .interceptor(requests.clone())
            .build();
        let client = Client::from_conf(config);
        let inbox = common::store_with_client(
            client.clone(),
            DynamoOptions::default().table(&common::own_table("consumer-inbox")),
            common::GENEROUS_OPERATION_TIMEOUT,
        )
        .await;
        let parking = common::parking_on(client, &common::own_table("consumer-parked")).await;
        let domain = common::app_table("consumer-domain", false).await;
        Self {
            inbox,
            parking,
            domain,
            requests,
        }
    }

    async fn delete(self) {
        for table in [self.inbox.table(), self.parking.table(), &self.domain] {
            common::delete_table(table).await;
        }
    }
}

#[async_trait]
impl ConsumerBackend for DynamoBackend {
    type Books = DynamoBooks;

    async fn consumer(&self, options: ConsumerOptions) -> Scenario<DynamoBooks> {
        let versions = VersionedItems::keyed(&self.domain, "version", |aggregate| {
            HashMap::from([(
                "pk".to_string(),
                AttributeValue::S(format!("aggregate#{aggregate}")),
            )])
        })
        .unwrap();
        let shop = Shop::with_books(DynamoBooks {
            inbox: self.inbox.clone(),
            domain: self.domain.clone(),
            versions,
            after_check: Arc::default(),
        });
        let parking = consumers::GatedParking::new(Arc::new(self.parking.clone()));
        let consumer = Consumer::with_options(
            "scenario",
            Arc::new(self.inbox.clone()),
            parking.clone(),
            shop.clone(),
            options,
        )
        .unwrap();
        (consumer, shop, parking)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_delivery_is_acked_without_effect() {
    let (broker, backend) = (JetStream::new().await, DynamoBackend::new().await);
    consumers::a_duplicate_delivery_is_acked_without_effect(&broker, &backend).await;
    broker.delete().await;
    backend.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_commit_and_ack_the_redelivery_has_no_second_effect() {
    let (broker, backend) = (JetStream::new().await, DynamoBackend::new().await);
    consumers::killed_between_commit_and_ack_the_redelivery_has_no_second_effect(&broker, &backend)
        .await;
    broker.delete().await;
    backend.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_is_parked_and_replayed() {
    let (broker, backend) = (JetStream::new().await, DynamoBackend::new().await);
    consumers::a_poison_message_is_parked_and_replayed(&broker, &backend).await;
    broker.delete().await;
    backend.delete().await;
}

/// An applied delivery is the claim, the version check's read, and one
/// `TransactWriteItems` naming the inbox and the domain (the completion,
/// the version's update and the effect); then, acknowledged, one query of
/// the parking store for later versions waiting behind it. The server
/// counts the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_claim_and_the_domain_write_commit_in_one_transact_write_items() {
    let (broker, backend) = (JetStream::new().await, DynamoBackend::new().await);
    let (consumer, shop, _) = backend.consumer(scenario_options(5)).await;
    let mut source = broker.source().await;
    let order = NewMessage::new("order-9", "order.placed", b"order 9".to_vec()).unwrap();
    publish(&*broker.publisher(), &[order]).await;
    let delivery = next(&mut source).await;
    let (inbox, domain) = (backend.inbox.table().to_string(), backend.domain.clone());
    let parked = backend.parking.table().to_string();
    let counted = || async {
        [
            common::requests(&inbox).await,
            common::requests(&domain).await,
            common::requests(&parked).await,
        ]
    };
    let before = counted().await;
    backend.requests.take();
    assert_eq!(consumer.consume(&delivery).await.unwrap(), Settled::Applied);
    let sent = backend.requests.take();
    let after = counted().await;
    let tables = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(
        sent,
        [
            ("UpdateItem".to_string(), tables(&[&inbox])),
            ("GetItem".to_string(), tables(&[&domain])),
            ("TransactWriteItems".to_string(), tables(&[&inbox, &domain])),
            ("Query".to_string(), tables(&[&parked])),
        ],
        "the claim, the version check's read, one commit, what waits behind"
    );
    assert_eq!(
        [0, 1, 2].map(|i| after[i] - before[i]),
        [2, 2, 1],
        "the server's count, by table: inbox, domain, parking"
    );
    assert_eq!(shop.effects().await, ["order 9"]);
    broker.kill(source).await;
    broker.delete().await;
    backend.delete().await;
}

/// Two messages of one event (published twice, under two ids) race: both
/// read version 0 and push their update; the second commits first, so the
/// first's `TransactWriteItems` is cancelled by the version's condition
/// (its effect and inbox record with it) and the consumer asks for it
/// again; delivered again, it finds version 1 committed: stale, one effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_deliveries_of_one_version_apply_it_once_and_the_loser_is_retried_then_stale() {
    let (broker, backend) = (JetStream::new().await, DynamoBackend::new().await);
    let (consumer, shop, parking) = backend.consumer(scenario_options(5)).await;
    let consumer = Arc::new(consumer);
    let mut source = broker.source().await;
    let event = || NewMessage::new("order-7", "order.placed", b"order 7".to_vec()).unwrap();
    // Two outboxes: each gives the event version 1, under an id of its own.
    let first_id = publish(&*broker.publisher(), &[event()]).await[0]
        .id()
        .to_string();
    publish(&*broker.publisher(), &[event()]).await;
    let first = next(&mut source).await;
    let second = next(&mut source).await;
    assert_eq!(first.message().id().as_str(), first_id);
    assert_eq!(
        [first.message().version(), second.message().version()],
        [Some(1), Some(1)]
    );
    let (checked, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    *shop.books.after_check.lock().unwrap() = Some((checked.clone(), go.clone()));
    let loser = tokio::spawn({
        let consumer = consumer.clone();
        async move { consumer.consume(&first).await }
    });
    checked.notified().await;
    assert_eq!(consumer.consume(&second).await.unwrap(), Settled::Applied);
    go.notify_one();
    match loser.await.unwrap().unwrap() {
        Settled::Retried { reason, .. } => {
            assert!(reason.contains("ConditionalCheckFailed"), "{reason}");
        }
        other => panic!("expected a retry, got {other:?}"),
    }
    let again = next(&mut source).await;
    assert_eq!(again.message().id().as_str(), first_id);
    assert_eq!(consumer.consume(&again).await.unwrap(), Settled::Stale);
    assert_eq!(shop.effects().await, ["order 7"]);
    assert_eq!(parking.count(consumer.name()).await.unwrap(), 0);
    broker.kill(source).await;
    broker.delete().await;
    backend.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_parked_while_its_predecessor_is_released_is_released_too() {
    let backend = DynamoBackend::new().await;
    consumers::a_gap_parked_while_its_predecessor_is_released_is_released_too(&backend).await;
    backend.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_aggregate_is_listed_and_released() {
    let backend = DynamoBackend::new().await;
    consumers::a_stuck_aggregate_is_listed_and_released(&backend).await;
    backend.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_parked_after_its_predecessors_release_releases_itself() {
    let backend = DynamoBackend::new().await;
    consumers::a_gap_parked_after_its_predecessors_release_releases_itself(&backend).await;
    backend.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gap_parked_by_a_batch_after_its_predecessors_release_releases_itself() {
    let backend = DynamoBackend::new().await;
    consumers::a_gap_parked_by_a_batch_after_its_predecessors_release_releases_itself(&backend)
        .await;
    backend.delete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_releases_what_its_first_apply_did_not() {
    let backend = DynamoBackend::new().await;
    consumers::a_duplicate_releases_what_its_first_apply_did_not(&backend).await;
    backend.delete().await;
}
