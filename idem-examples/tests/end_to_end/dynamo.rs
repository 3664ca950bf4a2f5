//! The services on DynamoDB (moto): HTTP records, orders and the outbox
//! written in one `TransactWriteItems` per request, and the shipping
//! service's inbox, parking, and its domain table (each order's shipment
//! item with its version, and a ledger item listing every effect in commit
//! order), on tables of the run's own.

use std::collections::HashMap;
use std::sync::Arc;

use axum::routing::post;
use axum::{Extension, Router};
use http::StatusCode;
use idem_consumer::{Consumer, ConsumerOptions, Handled, Handler, async_trait};
use idem_core::store::{IdempotencyStore, InboundMessage, NewMessage, VersionCheck};
use idem_core::{HandlerError, Idempotency, StoreError};
use idem_dynamo::aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem, Update};
use idem_dynamo::{
    DynamoOptions, DynamoOutbox, DynamoParking, DynamoStore, DynamoTransaction, VersionedItems,
};
use idem_http::{IdempotencyLayer, IdempotencyTransaction};

use super::dynamo_common as common;
use super::{Backend, CONSUMER, Effect, serve};

/// The domain table's item that lists every effect, in commit order.
const LEDGER: &str = "ledger";
/// The prefix of a shipment item's key.
const SHIPMENT: &str = "shipment#";

/// The consumer's side: the order's shipment item at the event's version
/// (the version check's own update sets its status), and the effect
/// appended to the ledger, so a second effect would show.
pub(crate) struct Shipping {
    inbox: DynamoStore,
    shipments: VersionedItems,
    domain: String,
}

#[async_trait]
impl Handler for Shipping {
    type Tx = DynamoTransaction;

    async fn begin(&self) -> Result<DynamoTransaction, StoreError> {
        self.inbox.begin().await
    }

    async fn handle(
        &self,
        message: &InboundMessage,
        mut tx: DynamoTransaction,
    ) -> Result<(DynamoTransaction, Handled), HandlerError> {
        let order = message.aggregate().ok_or("no order")?;
        let version = message.version().ok_or("no version")?;
        let status = std::str::from_utf8(message.payload())?.to_string();
        let status = [("status", AttributeValue::S(status))];
        let check = self
            .shipments
            .advance_setting(&mut tx, order, version, &status)
            .await?;
        if check == VersionCheck::Apply {
            let append = Update::builder()
                .table_name(&self.domain)
                .key("pk", AttributeValue::S(LEDGER.into()))
                .update_expression("SET effects = list_append(if_not_exists(effects, :none), :one)")
                .expression_attribute_values(":none", AttributeValue::L(Vec::new()))
                .expression_attribute_values(
                    ":one",
                    AttributeValue::L(vec![AttributeValue::S(format!("{order} {version}"))]),
                )
                .build()?;
            tx.push(TransactWriteItem::builder().update(append).build());
        }
        Ok((tx, check.into()))
    }
}

/// The run's tables, created as the services start.
pub(crate) struct Dynamo {
    records: DynamoStore,
    orders: String,
    outbox: Arc<DynamoOutbox>,
    inbox: DynamoStore,
    parking: DynamoParking,
    domain: String,
}

impl Dynamo {
    /// Every item of the shipping service's domain table.
    async fn domain_items(&self) -> Vec<HashMap<String, AttributeValue>> {
        common::scan(&self.domain).await
    }
}

fn text(item: &HashMap<String, AttributeValue>, name: &str) -> String {
    item[name].as_s().unwrap().clone()
}

#[async_trait]
impl Backend for Dynamo {
    const NAME: &'static str = "dynamodb";
    type Outbox = DynamoOutbox;
    type Shipping = Shipping;

    async fn new(run: &str) -> Self {
        let store = |name: &str| {
            common::store_with_client(
                common::client(),
                DynamoOptions::default().table(&format!("e2e-{name}-{run}")),
                common::GENEROUS_OPERATION_TIMEOUT,
            )
        };
        Self {
            records: store("records").await,
            orders: common::app_table("e2e-orders", false).await,
            // A few partitions, so the killed relay holds some and the
            // second relay publishes others meanwhile.
            outbox: Arc::new(common::own_outbox("e2e-outbox", 4).await),
            inbox: store("inbox").await,
            parking: common::own_parking("e2e-parked").await,
            domain: common::app_table("e2e-shipping", false).await,
        }
    }

    async fn order_service(&self) -> (Arc<DynamoOutbox>, String) {
        let (orders, route_outbox) = (self.orders.clone(), self.outbox.clone());
        let handler = move |Extension(tx): Extension<IdempotencyTransaction<DynamoTransaction>>,
                            body: String| {
            let (orders, outbox) = (orders.clone(), route_outbox.clone());
            async move {
                let (order, status) = body.split_once(' ').unwrap();
                let mut tx = tx.lock().await.unwrap();
                let put = Put::builder()
                    .table_name(orders)
                    .item("pk", AttributeValue::S(order.into()))
                    .item("status", AttributeValue::S(status.into()))
                    .build()
                    .unwrap();
                tx.push(TransactWriteItem::builder().put(put).build());
                let event =
                    NewMessage::new(order, "order.changed", status.as_bytes().to_vec()).unwrap();
                outbox.enqueue_in(&mut tx, &event).await.unwrap();
                (StatusCode::CREATED, format!("{order} {status}"))
            }
        };
        let records = self.records.clone();
        let any: Arc<dyn IdempotencyStore> = Arc::new(records.clone());
        let layer =
            IdempotencyLayer::new(Idempotency::new(any)).in_transaction(move || records.begin());
        let app = Router::new().route("/orders", post(handler)).layer(layer);
        (self.outbox.clone(), serve(app).await)
    }

    async fn shipping_service(&self, options: ConsumerOptions) -> Consumer<Shipping> {
        let shipments = VersionedItems::keyed(&self.domain, "version", |order| {
            HashMap::from([(
                "pk".to_string(),
                AttributeValue::S(format!("{SHIPMENT}{order}")),
            )])
        })
        .unwrap();
        let shipping = Shipping {
            inbox: self.inbox.clone(),
            shipments,
            domain: self.domain.clone(),
        };
        Consumer::with_options(
            CONSUMER,
            Arc::new(self.inbox.clone()),
            Arc::new(self.parking.clone()),
            shipping,
            options,
        )
        .unwrap()
    }

    async fn effects(&self) -> Vec<Effect> {
        let items = self.domain_items().await;
        let Some(ledger) = items.iter().find(|item| text(item, "pk") == LEDGER) else {
            return Vec::new();
        };
        ledger["effects"]
            .as_l()
            .unwrap()
            .iter()
            .map(|effect| {
                let (order, version) = effect.as_s().unwrap().split_once(' ').unwrap();
                Effect {
                    order: order.to_string(),
                    version: version.parse().unwrap(),
                }
            })
            .collect()
    }

    async fn shipments(&self) -> HashMap<String, (u64, String)> {
        self.domain_items()
            .await
            .iter()
            .filter_map(|item| {
                let order = text(item, "pk").strip_prefix(SHIPMENT)?.to_string();
                let version = item["version"].as_n().unwrap().parse().unwrap();
                Some((order, (version, text(item, "status"))))
            })
            .collect()
    }

    async fn delete(&self) {
        for table in [
            self.records.table(),
            &self.orders,
            self.outbox.table(),
            self.inbox.table(),
            self.parking.table(),
            &self.domain,
        ] {
            common::delete_table(table).await;
        }
    }
}
