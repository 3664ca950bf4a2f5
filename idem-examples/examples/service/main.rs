//! A whole service on Postgres and RabbitMQ (`cargo run -p idem-examples
//! --example service`; `IDEM_POSTGRES_URL`, `IDEM_AMQP_URL` choose them):
//! `POST /orders` behind the idempotency layer, the order, its response and
//! its event committing together; the relay; a consumer applying each event
//! once, in version order, parking one it can never apply; an operator
//! dropping that one through the console. All of it stops as one `Service`.

mod client;

use std::future::IntoFuture;
use std::sync::Arc;

use axum::extract::{Extension, State};
use axum::{Router, http::StatusCode, routing::post};
use idem_admin::{Admin, ConsumerParking, Operator, Refusal};
use idem_consumer::{Consumer, Handled, Handler, Permanent, async_trait};
use idem_core::store::{InboundMessage, NewMessage, VersionCheck, VersionStore};
use idem_core::{HandlerError, Idempotency, Service, StoreError};
use idem_http::{IdempotencyLayer, IdempotencyTransaction};
use idem_outbox::{Relay, RelayOptions};
use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use idem_postgres::sqlx::{self, AssertSqlSafe};
use idem_postgres::{
    PgTransaction, PostgresOutbox, PostgresParking, PostgresStore, VersionedTable, guarded,
};
use idem_rabbitmq::lapin::{Connection, ConnectionProperties, types::FieldTable};
use idem_rabbitmq::{RabbitOptions, RabbitPublisher, RabbitSource, RabbitSourceOptions};

/// An order, as its event carries it.
#[derive(serde::Deserialize)]
struct Order {
    quantity: u32,
}

/// Ships each order once its `order.placed` event arrives: the inbox, and
/// the shipments' versions.
struct Shipping(PostgresStore, VersionedTable);

#[async_trait]
impl Handler for Shipping {
    type Tx = PgTransaction;
    async fn begin(&self) -> Result<PgTransaction, StoreError> {
        self.0.begin().await // the inbox record commits with the shipment
    }
    async fn handle(
        &self,
        event: &InboundMessage,
        mut tx: PgTransaction,
    ) -> Result<(PgTransaction, Handled), HandlerError> {
        // An order no shipment can be made of: parked at once, with the reason.
        let order: Order = event.json().map_err(Permanent::because)?;
        let (Some(id), Some(version)) = (event.aggregate(), event.version()) else {
            return Err(Permanent::new("an order event without its version").into());
        };
        let check = self.1.advance(tx.conn(), id, version).await?;
        if check == VersionCheck::Apply {
            sqlx::query("INSERT INTO shipments VALUES ($1, $2, $3) ON CONFLICT (id) DO UPDATE SET quantity = $3")
                .bind(id)
                .bind(version as i64)
                .bind(i64::from(order.quantity))
                .execute(tx.conn())
                .await?;
        }
        Ok((tx, check.into()))
    }
}

#[tokio::main]
// Visible to tests/service.rs, which runs it.
pub(crate) async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let env = |name, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let url = env(
        "IDEM_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let amqp = env("IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2f");
    // Every table in a schema of this run's own, dropped at the end.
    let schema = format!("service_{}", uuid::Uuid::new_v4().simple());
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&PgPool::connect(&url).await?)
        .await?;
    let options = url
        .parse::<PgConnectOptions>()?
        .options([("search_path", &schema)]);
    let pool = guarded(PgPoolOptions::new()).connect_with(options).await?;

    // The stores: one for the HTTP records and the consumer's inbox (each
    // in tenants of its own), the outbox, the consumer's parked messages.
    let records = PostgresStore::new(pool.clone());
    let outbox = Arc::new(PostgresOutbox::new(pool.clone()));
    let parking = Arc::new(PostgresParking::new(pool.clone()));
    tokio::try_join!(records.migrate(), outbox.migrate(), parking.migrate())?;
    sqlx::raw_sql(
        "CREATE TABLE orders (id text PRIMARY KEY, body text NOT NULL);
         CREATE TABLE shipments (id text PRIMARY KEY, version bigint NOT NULL, quantity bigint NOT NULL)",
    )
    .execute(&pool)
    .await?;

    // The broker: an exchange for the relay, a queue bound to it for the consumer.
    let connection = Connection::connect(&amqp, ConnectionProperties::default()).await?;
    let channel = connection.create_channel().await?;
    idem_rabbitmq::declare(&channel, &schema, &schema, FieldTable::default()).await?;
    let publisher = RabbitPublisher::connect(&amqp, RabbitOptions::new(&schema)?).await?;
    let relay = Relay::new(outbox.clone(), Arc::new(publisher), RelayOptions::default());
    let listening = outbox.listen(relay.waker()).await?; // the relay wakes on commit
    let mut source = RabbitSource::connect(&amqp, RabbitSourceOptions::new(&schema)?).await?;
    let shipments = VersionedTable::new("shipments", "id", "version")?;
    let (inbox, shipping) = (
        Arc::new(records.clone()),
        Shipping(records.clone(), shipments),
    );
    let consumer = Consumer::new("shipping", inbox, parking.clone(), shipping)?;

    // POST /orders behind the layer; the console behind its operator check.
    let idem = Idempotency::new(Arc::new(records.clone()));
    let begin = records.clone();
    let layer = IdempotencyLayer::new(idem.clone()).in_transaction(move || begin.begin());
    let check = |r: &http::request::Parts| match r.headers.get("x-operator").map(|v| v.to_str()) {
        Some(Ok(name)) => Operator::new(name).map_err(|_| Refusal::Forbidden),
        _ => Err(Refusal::unauthenticated(None)),
    };
    let parked = ConsumerParking::with_consumer(&consumer, parking.clone());
    let admin = Admin::new()
        .records(idem)
        .outbox(outbox.clone())
        .consumer(parked);
    let app = Router::new()
        .route("/orders", post(place).layer(layer))
        .with_state(outbox.clone())
        .nest("/admin", admin.authorize(check).router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);

    // Everything long-running, under one shutdown.
    let mut service = Service::new();
    service
        .add("http", |stop| {
            axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .into_future()
        })
        .add("relay", |stop| async move { relay.run(stop).await })
        .add("consumer", move |stop| async move {
            consumer.run(&mut source, stop).await
        });
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(service.run(async move { drop(stopped.await) }));

    // What a client and an operator see (client.rs).
    client::run(&base, &pool).await?;

    let _ = stop.send(());
    running.await??;
    drop(listening);
    // Nothing of the run left behind.
    sqlx::raw_sql(AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&pool)
        .await?;
    let name = || schema.as_str().into();
    channel.queue_delete(name(), Default::default()).await?;
    channel.exchange_delete(name(), Default::default()).await?;
    Ok(())
}

/// `POST /orders`: the order and its event, in the transaction the layer
/// commits with the stored response.
async fn place(
    State(outbox): State<Arc<PostgresOutbox>>,
    Extension(tx): Extension<IdempotencyTransaction<PgTransaction>>,
    body: String,
) -> Result<(StatusCode, String), StatusCode> {
    let id = format!("order-{}", uuid::Uuid::new_v4().simple());
    let event = NewMessage::new(&id, "order.placed", body.clone().into_bytes());
    let event = event.map_err(|_| StatusCode::BAD_REQUEST)?;
    let mut tx = tx.lock().await.map_err(unavailable)?;
    let insert = sqlx::query("INSERT INTO orders VALUES ($1, $2)")
        .bind(&id)
        .bind(body);
    insert.execute(tx.conn()).await.map_err(unavailable)?;
    outbox
        .enqueue_in(&mut tx, &event)
        .await
        .map_err(unavailable)?;
    Ok((StatusCode::CREATED, id))
}

/// A failure whose text stays out of the answer: the service's own log
/// has it, the client a fixed status.
fn unavailable(error: impl std::fmt::Debug) -> StatusCode {
    eprintln!("POST /orders: {error:?}");
    StatusCode::SERVICE_UNAVAILABLE
}
