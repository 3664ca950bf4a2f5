//! The services on Postgres: HTTP records, orders and the outbox in one
//! database, and the shipping service's inbox, parking, shipments and
//! effects in tables of the run's own.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use axum::{Extension, Router};
use http::StatusCode;
use idem_consumer::{Consumer, ConsumerOptions, Handled, Handler, async_trait};
use idem_core::store::{IdempotencyStore, InboundMessage, NewMessage, VersionCheck, VersionStore};
use idem_core::{HandlerError, Idempotency, StoreError};
use idem_http::{IdempotencyLayer, IdempotencyTransaction};
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool};
use idem_postgres::{
    PgTransaction, PostgresOptions, PostgresOutbox, PostgresOutboxOptions, PostgresParking,
    PostgresParkingOptions, PostgresStore, VersionedTable,
};

use super::{Backend, CONSUMER, Effect, env, serve};

/// The consumer's side: the shipment row at the event's version, and one
/// row per effect, so a second effect would show.
pub(crate) struct Shipping {
    inbox: PostgresStore,
    versions: VersionedTable,
    shipments: String,
    effects: String,
}

#[async_trait]
impl Handler for Shipping {
    type Tx = PgTransaction;

    async fn begin(&self) -> Result<PgTransaction, StoreError> {
        self.inbox.begin().await
    }

    async fn handle(
        &self,
        message: &InboundMessage,
        mut tx: PgTransaction,
    ) -> Result<(PgTransaction, Handled), HandlerError> {
        let order = message.aggregate().ok_or("no order")?;
        let version = message.version().ok_or("no version")?;
        let status = std::str::from_utf8(message.payload())?.to_string();
        if status == super::POISON {
            return Err("a change no shipment can take".into());
        }
        let check = self.versions.advance(&mut *tx, order, version).await?;
        if check == VersionCheck::Apply {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {} (id, version, status) VALUES ($1, $2, $3) \
                 ON CONFLICT (id) DO UPDATE SET status = excluded.status",
                self.shipments
            )))
            .bind(order)
            .bind(i64::try_from(version)?)
            .bind(&status)
            .execute(&mut *tx)
            .await?;
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {} (id, version) VALUES ($1, $2)",
                self.effects
            )))
            .bind(order)
            .bind(i64::try_from(version)?)
            .execute(&mut *tx)
            .await?;
        }
        Ok((tx, check.into()))
    }
}

/// One database, the run's tables in it.
pub(crate) struct Postgres {
    pool: PgPool,
    run: String,
}

impl Postgres {
    /// The stores of a run of its own, on a pool of `connections`.
    pub(crate) async fn with_connections(run: &str, connections: u32) -> Self {
        let pool = idem_postgres::guarded(sqlx::postgres::PgPoolOptions::new())
            .max_connections(connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect(&env(
                "IDEM_POSTGRES_URL",
                "postgres://postgres@127.0.0.1:5432/test",
            ))
            .await
            .expect("connect to IDEM_POSTGRES_URL");
        Self {
            pool,
            run: run.to_string(),
        }
    }

    /// The order service's outbox with `partitions`, and its orders table,
    /// for changes committed straight through SQL ([`change`](Self::change)).
    pub(crate) async fn outbox(&self, partitions: u32) -> Arc<PostgresOutbox> {
        let outbox = PostgresOutbox::with_options(
            self.pool.clone(),
            PostgresOutboxOptions::default()
                .table(&self.table("outbox"))
                .partitions(partitions),
        )
        .unwrap();
        outbox.migrate().await.unwrap();
        self.sql(format!(
            "CREATE TABLE IF NOT EXISTS {} (id text PRIMARY KEY, status text NOT NULL)",
            self.table("orders")
        ))
        .await;
        Arc::new(outbox)
    }

    /// One change of `order` to `status` and its event, in one
    /// transaction held open for `hold` (so later transactions commit
    /// first), then committed or rolled back; answers the event's version
    /// if it committed.
    pub(crate) async fn change(
        &self,
        outbox: &PostgresOutbox,
        order: &str,
        status: &str,
        hold: Duration,
        commit: bool,
    ) -> Result<Option<u64>, String> {
        let mut tx = self.pool.begin().await.map_err(|e| e.to_string())?;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {} (id, status) VALUES ($1, $2) \
             ON CONFLICT (id) DO UPDATE SET status = excluded.status",
            self.table("orders")
        )))
        .bind(order)
        .bind(status)
        .execute(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
        let event = NewMessage::new(order, "order.changed", status.as_bytes().to_vec()).unwrap();
        let stored = outbox
            .enqueue_in(&mut tx, &event)
            .await
            .map_err(|e| e.to_string())?;
        tokio::time::sleep(hold).await;
        if !commit {
            tx.rollback().await.map_err(|e| e.to_string())?;
            return Ok(None);
        }
        // A commit whose answer is lost may have landed: no retry can tell.
        tx.commit().await.expect("the change commits");
        Ok(Some(stored.parts().sequence))
    }

    fn table(&self, name: &str) -> String {
        format!("e2e_{name}_{}", self.run)
    }

    async fn sql(&self, statement: String) {
        sqlx::raw_sql(AssertSqlSafe(statement))
            .execute(&self.pool)
            .await
            .unwrap();
    }
}

#[async_trait]
impl Backend for Postgres {
    const NAME: &'static str = "postgres";
    type Outbox = PostgresOutbox;
    type Shipping = Shipping;

    async fn new(run: &str) -> Self {
        Self::with_connections(run, 8).await
    }

    async fn order_service(&self) -> (Arc<PostgresOutbox>, String) {
        let records = PostgresStore::with_options(
            self.pool.clone(),
            PostgresOptions::default().table(&self.table("records")),
        )
        .unwrap();
        records.migrate().await.unwrap();
        let outbox = Arc::new(
            PostgresOutbox::with_options(
                self.pool.clone(),
                PostgresOutboxOptions::default().table(&self.table("outbox")),
            )
            .unwrap(),
        );
        outbox.migrate().await.unwrap();
        let orders = self.table("orders");
        self.sql(format!(
            "CREATE TABLE {orders} (id text PRIMARY KEY, status text NOT NULL)"
        ))
        .await;

        let upsert = format!(
            "INSERT INTO {orders} (id, status) VALUES ($1, $2) \
             ON CONFLICT (id) DO UPDATE SET status = excluded.status"
        );
        let route_outbox = outbox.clone();
        let handler = move |Extension(tx): Extension<IdempotencyTransaction<PgTransaction>>,
                            body: String| {
            let (upsert, outbox) = (upsert.clone(), route_outbox.clone());
            async move {
                let (order, status) = body.split_once(' ').unwrap();
                let mut tx = tx.lock().await.unwrap();
                sqlx::query(AssertSqlSafe(upsert))
                    .bind(order)
                    .bind(status)
                    .execute(&mut **tx)
                    .await
                    .unwrap();
                let event =
                    NewMessage::new(order, "order.changed", status.as_bytes().to_vec()).unwrap();
                outbox.enqueue_in(&mut tx, &event).await.unwrap();
                (StatusCode::CREATED, format!("{order} {status}"))
            }
        };
        let any: Arc<dyn IdempotencyStore> = Arc::new(records.clone());
        let layer = IdempotencyLayer::new(Idempotency::new(any)).in_transaction({
            let records = records.clone();
            move || records.begin()
        });
        let app = Router::new().route("/orders", post(handler)).layer(layer);
        (outbox, serve(app).await)
    }

    async fn shipping_service(&self, options: ConsumerOptions) -> Consumer<Shipping> {
        let inbox = PostgresStore::with_options(
            self.pool.clone(),
            PostgresOptions::default().table(&self.table("inbox")),
        )
        .unwrap();
        inbox.migrate().await.unwrap();
        let parking = PostgresParking::with_options(
            self.pool.clone(),
            PostgresParkingOptions::default().table(&self.table("parked")),
        )
        .unwrap();
        parking.migrate().await.unwrap();
        let (shipments, effects) = (self.table("shipments"), self.table("effects"));
        self.sql(format!(
            "CREATE TABLE IF NOT EXISTS {shipments} (id text PRIMARY KEY, \
             version bigint NOT NULL, status text NOT NULL)"
        ))
        .await;
        self.sql(format!(
            "CREATE TABLE IF NOT EXISTS {effects} (seq bigserial PRIMARY KEY, \
             id text NOT NULL, version bigint NOT NULL)"
        ))
        .await;
        let shipping = Shipping {
            inbox: inbox.clone(),
            versions: VersionedTable::new(&shipments, "id", "version").unwrap(),
            shipments,
            effects,
        };
        Consumer::with_options(
            CONSUMER,
            Arc::new(inbox),
            Arc::new(parking),
            shipping,
            options,
        )
        .unwrap()
    }

    async fn effects(&self) -> Vec<Effect> {
        let rows: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT id, version FROM {} ORDER BY seq",
            self.table("effects")
        )))
        .fetch_all(&self.pool)
        .await
        .unwrap();
        rows.into_iter()
            .map(|(order, version)| Effect {
                order,
                version: u64::try_from(version).unwrap(),
            })
            .collect()
    }

    async fn shipments(&self) -> HashMap<String, (u64, String)> {
        let rows: Vec<(String, i64, String)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT id, version, status FROM {}",
            self.table("shipments")
        )))
        .fetch_all(&self.pool)
        .await
        .unwrap();
        rows.into_iter()
            .map(|(order, version, status)| (order, (u64::try_from(version).unwrap(), status)))
            .collect()
    }

    async fn delete(&self) {
        // Each store's own uninstall: its tables and functions, nothing left.
        let pool = &self.pool;
        let table = |name: &str| self.table(name);
        let records = PostgresOptions::default().table(&table("records"));
        let inbox = PostgresOptions::default().table(&table("inbox"));
        for store in [records, inbox] {
            let store = PostgresStore::with_options(pool.clone(), store).unwrap();
            store.uninstall().await.unwrap();
        }
        let outbox = PostgresOutboxOptions::default().table(&table("outbox"));
        let outbox = PostgresOutbox::with_options(pool.clone(), outbox).unwrap();
        outbox.uninstall().await.unwrap();
        let parked = PostgresParkingOptions::default().table(&table("parked"));
        let parking = PostgresParking::with_options(pool.clone(), parked).unwrap();
        parking.uninstall().await.unwrap();
        for name in ["orders", "shipments", "effects"] {
            self.sql(format!("DROP TABLE IF EXISTS {}", table(name)))
                .await;
        }
    }
}
