//! `PostgresParking`: a message consumer's parked messages, one row per
//! consumer and message id, each operation one statement (see
//! `migrations/0004_idem_parked.sql`).

use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{
    Capabilities, InboundMessage, Layered, NewParked, ParkedMessage, ParkedQuery, ParkedState,
    ParkingStore, Resolution, Timestamp, forward_parking_store, validate_parking_batch,
};
use idem_core::{ConsumerName, IdempotencyKey, Operation, StoreError, async_trait};
use sqlx::AssertSqlSafe;
use sqlx::postgres::PgRow;

use crate::codec::column;
use crate::error::{classify, corrupt};
use crate::options::{PostgresParkingOptions, TableName};

/// Serialises concurrent `migrate()` calls of parking stores.
const MIGRATION_LOCK: i64 = 0x1de3_0004;

/// The columns every statement reads back.
const COLUMNS: &str = "consumer, id, kind, aggregate, version, header_names, header_values, \
                       payload, reason, deliveries, state, parked_at, resolved_at, resolution";

/// A consumer's parked messages on Postgres, over the caller's
/// `sqlx::PgPool`: one row per consumer and message id in the table
/// `idem_parked` (or another, see [`PostgresParkingOptions`]). Every
/// operation is one statement, on the server's clock; listing walks a
/// partial index of the parked rows, and a purge deletes one bounded
/// batch (`SKIP LOCKED`, so racing purges share the work).
///
/// ```no_run
/// use idem_core::ConsumerName;
/// use idem_core::store::{ParkedQuery, ParkingStore};
/// use idem_postgres::PostgresParking;
///
/// # async fn example(pool: idem_postgres::sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let parking = PostgresParking::new(pool);
/// parking.migrate().await?;
/// for entry in parking.parked(&ParkedQuery::new(ConsumerName::new("billing")?)).await? {
///     println!("{:?}: {}", entry.parked.message, entry.parked.reason);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PostgresParking {
    entries: Layered<Entries>,
}

forward_parking_store!(PostgresParking => entries);

#[derive(Debug)]
struct Statements {
    park: Arc<str>,
    get: Arc<str>,
    parked: Arc<str>,
    parked_aggregate: Arc<str>,
    resolve: Arc<str>,
    purge: Arc<str>,
    count: Arc<str>,
}

impl Statements {
    fn new(table: &TableName, _: &PostgresParkingOptions) -> Self {
        let t = table.derived("");
        let now = table.derived("_now");
        Self {
            park: format!(
                "INSERT INTO {t} AS r ({COLUMNS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'parked', {now}(), NULL, NULL) \
                 ON CONFLICT (consumer, id) DO UPDATE SET kind = excluded.kind, \
                   aggregate = excluded.aggregate, version = excluded.version, \
                   header_names = excluded.header_names, header_values = excluded.header_values, \
                   payload = excluded.payload, reason = excluded.reason, \
                   deliveries = excluded.deliveries, state = 'parked', \
                   parked_at = excluded.parked_at, resolved_at = NULL, resolution = NULL \
                 RETURNING {COLUMNS}"
            )
            .into(),
            get: format!("SELECT {COLUMNS} FROM {t} WHERE consumer = $1 AND id = $2").into(),
            // Ties in time go by id in byte order, whatever the collation.
            parked: format!(
                "SELECT {COLUMNS} FROM {t} WHERE consumer = $1 AND state = 'parked' \
                 ORDER BY parked_at, id COLLATE \"C\" LIMIT $2"
            )
            .into(),
            parked_aggregate: format!(
                "SELECT {COLUMNS} FROM {t} WHERE consumer = $1 AND aggregate = $2 \
                 AND state = 'parked' \
                 ORDER BY version NULLS LAST, parked_at, id COLLATE \"C\" LIMIT $3"
            )
            .into(),
            resolve: format!(
                "UPDATE {t} SET state = $3, resolution = $4, resolved_at = {now}() \
                 WHERE consumer = $1 AND id = $2 AND state = 'parked'"
            )
            .into(),
            purge: format!(
                "DELETE FROM {t} AS r WHERE r.state <> 'parked' AND (r.consumer, r.id) IN ( \
                   SELECT d.consumer, d.id FROM {t} AS d \
                   WHERE d.state <> 'parked' AND d.resolved_at <= {now}() - $1 \
                   LIMIT $2 FOR UPDATE SKIP LOCKED)"
            )
            .into(),
            count: format!("SELECT count(*) FROM {t} WHERE consumer = $1 AND state = 'parked'")
                .into(),
        }
    }
}

crate::part::part_constructors!(PostgresParking => entries: Entries, PostgresParkingOptions, TableName::parking_default(), "parking store", "app.parked");
crate::part::table_accessors!(
    PostgresParking,
    "idem_parked",
    "0004_idem_parked.sql",
    parking_migration_sql,
    MIGRATION_LOCK
);

/// A limit as a bigint.
fn bigint(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The entry in `row`.
fn entry(row: &PgRow, op: Operation) -> Result<ParkedMessage, StoreError> {
    let text = |name: &str| column::<String>(row, name, op);
    let names: Vec<String> = column(row, "header_names", op)?;
    let values: Vec<String> = column(row, "header_values", op)?;
    if names.len() != values.len() {
        return Err(corrupt(op, "headers"));
    }
    let version: Option<i64> = column(row, "version", op)?;
    let version = version
        .map(|v| u64::try_from(v).map_err(|_| corrupt(op, "version")))
        .transpose()?;
    let mut message =
        InboundMessage::new(&text("id")?, &text("kind")?, column(row, "payload", op)?)
            .map_err(|_| corrupt(op, "message"))?;
    if let Some(aggregate) = column::<Option<String>>(row, "aggregate", op)? {
        message = message
            .with_aggregate(&aggregate, version)
            .map_err(|_| corrupt(op, "aggregate"))?;
    }
    for (name, value) in names.iter().zip(&values) {
        message = message
            .with_header(name, value)
            .map_err(|_| corrupt(op, "headers"))?;
    }
    let deliveries: i64 = column(row, "deliveries", op)?;
    let state = ParkedState::parse(&text("state")?).ok_or_else(|| corrupt(op, "state"))?;
    let resolved_at: Option<i64> = column(row, "resolved_at", op)?;
    Ok(ParkedMessage {
        parked: NewParked {
            consumer: ConsumerName::new(text("consumer")?).map_err(|_| corrupt(op, "consumer"))?,
            message,
            reason: text("reason")?,
            deliveries: u32::try_from(deliveries).map_err(|_| corrupt(op, "deliveries"))?,
        },
        state,
        parked_at: Timestamp::from_unix_millis(column(row, "parked_at", op)?),
        resolved_at: resolved_at.map(Timestamp::from_unix_millis),
        resolution: column(row, "resolution", op)?,
    })
}

#[async_trait]
impl ParkingStore for Entries {
    async fn park(&self, parked: &NewParked) -> Result<ParkedMessage, StoreError> {
        const OP: Operation = Operation::Park;
        let message = &parked.message;
        let (names, values): (Vec<&str>, Vec<&str>) = message
            .headers()
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .unzip();
        let version = message
            .version()
            .map(|v| i64::try_from(v).unwrap_or(i64::MAX));
        let row = sqlx::query(AssertSqlSafe(self.sql.park.clone()))
            .bind(parked.consumer.as_str())
            .bind(message.id().as_str())
            .bind(message.kind())
            .bind(message.aggregate())
            .bind(version)
            .bind(names)
            .bind(values)
            .bind(message.payload())
            .bind(&parked.reason)
            .bind(i64::from(parked.deliveries))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| classify(OP, e))?;
        entry(&row, OP)
    }

    async fn get(
        &self,
        consumer: &ConsumerName,
        id: &IdempotencyKey,
    ) -> Result<Option<ParkedMessage>, StoreError> {
        const OP: Operation = Operation::Get;
        let row = sqlx::query(AssertSqlSafe(self.sql.get.clone()))
            .bind(consumer.as_str())
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| classify(OP, e))?;
        row.map(|row| entry(&row, OP)).transpose()
    }

    async fn parked(&self, query: &ParkedQuery) -> Result<Vec<ParkedMessage>, StoreError> {
        let (consumer, aggregate, limit) =
            (&query.consumer, query.aggregate.as_deref(), query.limit);
        const OP: Operation = Operation::List;
        let limit = bigint(validate_parking_batch(limit)?);
        let query = match aggregate {
            None => sqlx::query(AssertSqlSafe(self.sql.parked.clone()))
                .bind(consumer.as_str())
                .bind(limit),
            Some(aggregate) => sqlx::query(AssertSqlSafe(self.sql.parked_aggregate.clone()))
                .bind(consumer.as_str())
                .bind(aggregate)
                .bind(limit),
        };
        let rows = query
            .fetch_all(&self.pool)
            .await
            .map_err(|e| classify(OP, e))?;
        rows.iter().map(|row| entry(row, OP)).collect()
    }

    async fn resolve(
        &self,
        consumer: &ConsumerName,
        id: &IdempotencyKey,
        resolution: &Resolution,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(AssertSqlSafe(self.sql.resolve.clone()))
            .bind(consumer.as_str())
            .bind(id.as_str())
            .bind(resolution.state().as_str())
            .bind(resolution.reason())
            .execute(&self.pool)
            .await
            .map_err(|e| classify(Operation::Resolve, e))?;
        Ok(done.rows_affected() > 0)
    }

    async fn purge_resolved(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        let limit = validate_parking_batch(limit)?;
        crate::part::purge(&self.pool, &self.sql.purge, older_than, limit).await
    }

    async fn count(&self, consumer: &ConsumerName) -> Result<u64, StoreError> {
        const OP: Operation = Operation::Stats;
        let n: i64 = sqlx::query_scalar(AssertSqlSafe(self.sql.count.clone()))
            .bind(consumer.as_str())
            .fetch_one(&self.pool)
            .await
            .map_err(|e| classify(OP, e))?;
        u64::try_from(n).map_err(|_| corrupt(OP, "count"))
    }

    fn capabilities(&self) -> Capabilities {
        crate::part::capabilities(usize::MAX)
    }
}
