//! `PostgresOutbox`: the transactional outbox's store, one row per message,
//! one counter row per aggregate and one row per partition, each operation
//! one statement (see `migrations/0003_idem_outbox.sql`).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{
    Advance, AdvancedRead, Capabilities, Layered, LogBatch, LogPosition, MessageId, MessageParts,
    MessageState, NewMessage, OutboxMessage, OutboxStats, OutboxStore, OwnerToken, PageAfter,
    PartitionLease, PartitionStats, PublishFailure, Timestamp, forward_outbox_store, millis,
    partition_hash, validate_lease, validate_outbox_batch,
};
use idem_core::{InvalidInput, Operation, StoreError, async_trait};
use sqlx::postgres::{PgListener, PgRow};
use sqlx::{AssertSqlSafe, PgConnection, PgExecutor};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::codec::column;
use crate::error::{classify, corrupt};
use crate::options::{PostgresOutboxOptions, TableName};
use crate::part::aliased;

/// Serialises concurrent `migrate()` calls of outboxes (CREATE OR REPLACE
/// FUNCTION races otherwise); neither the records' lock nor the journal's.
const MIGRATION_LOCK: i64 = 0x1de3_0003;

/// The columns every statement reads back, one per part of a message; with
/// `passed`, whether its partition's cursor passed it. The migration's read
/// function returns them in this order (its columns are renamed to these by
/// position).
const COLUMNS: [&str; 16] = [
    "id",
    "aggregate",
    "sequence",
    "part",
    "okey",
    "pos",
    "kind",
    "header_names",
    "header_values",
    "payload",
    "state",
    "attempts",
    "last_error",
    "enqueued_at",
    "available_at",
    "sent_at",
];

/// The first wait of the listener after its connection failed; it doubles
/// up to [`LISTEN_MAX_BACKOFF`].
const LISTEN_FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait of the listener between two attempts to reconnect.
const LISTEN_MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The outbox store on Postgres, over the caller's `sqlx::PgPool`: one row
/// per message in the table `idem_outbox` (or another, see
/// [`PostgresOutboxOptions`]), one counter row per aggregate in
/// `idem_outbox_aggregates` and one row per partition in
/// `idem_outbox_partitions`, in the same database as the business data, so
/// [`enqueue_in`](Self::enqueue_in) writes a message inside the business
/// transaction that causes it: the message exists exactly when the change
/// committed.
///
/// - **Partitions.** A message goes to its aggregate's partition (a stable
///   hash of the aggregate modulo the count, [`PostgresOutboxOptions::partitions`],
///   1 by default); each partition is a log, read by one relay at a time
///   under a lease, through a cursor that moves once per batch (one row
///   written for a whole batch, the one write a batch costs).
/// - **Order, and late commits.** A message's place in its log is its
///   transaction's id (or its aggregate's previous message's, if higher)
///   and a sequence number; a read takes only messages whose transaction
///   id is below the oldest one still running, so a message that commits
///   late can never land before one already read. An enqueue takes its
///   aggregate's next sequence by updating the aggregate's counter row,
///   whose lock it holds until its transaction ends: a second transaction
///   enqueueing for the same aggregate waits for the first, so sequences
///   and places follow the commit order. One consequence: a transaction
///   that stays open (any write transaction in the cluster, idle in
///   transaction included) holds every relay back until it ends; set
///   `idle_in_transaction_session_timeout`, and keep business transactions
///   short.
/// - **Failures.** A message the broker refused leaves the log for its
///   partition's retry lane, with the later messages of its aggregate; the
///   lane holds few rows, and the log none of their writes.
/// - **One round trip.** Every operation is one statement (after the
///   connection has prepared it once), for every outcome. Leases, back-off
///   and ages are the database server's clock's. Build the pool with
///   [`guarded`](crate::guarded) (no ping before every use, and no
///   connection back in service inside a transaction block).
/// - **Purges.** [`purge_sent`](OutboxStore::purge_sent) deletes one
///   bounded batch of sent and dropped messages: each partition's oldest
///   before its cursor, and what left the retry lane. A message is written
///   once and deleted once, so the table's dead rows are its purges'. The
///   counter rows stay, one small row per aggregate ever seen, so an
///   aggregate's sequences never start again.
/// - **Wake-ups.** An enqueue notifies the table's channel, which Postgres
///   delivers when the transaction commits; [`listen`](Self::listen) turns
///   those notifications into wake-ups of a relay.
///
/// Every operation goes through the store's [`OperationLayer`](idem_core::store::OperationLayer): it is
/// bounded by the [operation timeout](idem_core::StoreOptions::with_operation_timeout)
/// (5 s by default), acquiring its connection included, ends in a
/// retryable [`StoreError::Unavailable`] past it, and gets its span and
/// metrics.
///
/// ```no_run
/// use std::time::Duration;
/// use idem_core::store::{Advance, NewMessage, OutboxStore, OwnerToken};
/// use idem_postgres::PostgresOutbox;
/// use idem_postgres::sqlx::postgres::PgPoolOptions;
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = idem_postgres::guarded(PgPoolOptions::new())
///     .connect("postgres://localhost/app")
///     .await?;
/// let outbox = PostgresOutbox::new(pool);
/// outbox.migrate().await?;
/// let placed = outbox
///     .enqueue(&NewMessage::new("order-42", "order.placed", b"{}".to_vec())?)
///     .await?;
/// assert_eq!(placed.parts().sequence, 1);
/// let lease = outbox.acquire(OwnerToken::generate(), Duration::from_secs(30)).await?.expect("a free partition");
/// let batch = outbox.read(lease.partition(), lease.cursor(), 100).await?;
/// // ... published and confirmed ...
/// if let Some(end) = batch.end() {
///     outbox.advance(&lease, &Advance::to(end)).await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PostgresOutbox {
    messages: Layered<Messages>,
}

forward_outbox_store!(PostgresOutbox => messages);

/// Every statement the outbox runs, built once per table name from a
/// validated name.
#[derive(Debug)]
struct Statements {
    partitions: u32,
    enqueue: Arc<str>,
    acquire: Arc<str>,
    read: Arc<str>,
    advance: Arc<str>,
    advance_read: Arc<str>,
    due: Arc<str>,
    release: Arc<str>,
    parked: Arc<str>,
    retry: Arc<str>,
    drop_message: Arc<str>,
    message: Arc<str>,
    purge: Arc<str>,
    stats: Arc<str>,
}

impl Statements {
    fn new(table: &TableName, options: &PostgresOutboxOptions) -> Self {
        let t = table.derived("");
        let p = table.derived("_partitions");
        let now = table.derived("_now");
        let row = aliased(&COLUMNS, "r.");
        let advance = format!(
            "{}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            table.derived("_advance")
        );
        let lease = "part, lease_until, cursor_key, cursor_pos";
        // Each statement reads the clock once, in a materialized CTE (a
        // scalar subquery per use would read it once per use).
        let clock = format!("WITH c AS MATERIALIZED (SELECT {now}() AS now)");
        // Whether a message in the log is at or before its cursor.
        let passed =
            "(r.state IS NULL AND (r.okey, r.pos) <= (p.cursor_key, p.cursor_pos)) AS passed";
        Self {
            partitions: options.partitions,
            enqueue: format!(
                "SELECT {row}, false AS passed FROM {}($1, $2, $3, $4, $5, $6, $7) AS r",
                table.derived("_enqueue")
            )
            .into(),
            // The lowest free partition, locked before it is taken (a racing
            // acquire skips it), and checked again on its latest version.
            acquire: format!(
                "{clock}, free AS (SELECT f.part FROM {p} AS f, c \
                   WHERE f.owner IS NULL OR f.lease_until IS NULL OR f.lease_until <= c.now \
                   ORDER BY f.part LIMIT 1 FOR UPDATE OF f SKIP LOCKED) \
                 UPDATE {p} AS p SET owner = $1, lease_until = c.now + $2 FROM c, free \
                 WHERE p.part = free.part \
                 RETURNING p.part, p.lease_until, p.cursor_key, p.cursor_pos"
            )
            .into(),
            // The read is a function of the migration, planned once per
            // session (see there); its columns renamed as every statement
            // reads them.
            read: format!(
                "SELECT * FROM {}($1, $2, $3, $4) AS r({}, passed, blocked)",
                table.derived("_read"),
                COLUMNS.join(", ")
            )
            .into(),
            // Functions of the migration, planned once per session: the
            // advance, and the read in LATERAL on its row (so after it, and
            // only under the lease), its columns renamed as the read's are.
            advance: format!("SELECT * FROM {advance} AS a({lease})").into(),
            advance_read: format!(
                "SELECT a.lease_until, a.cursor_key, a.cursor_pos, r.* FROM {advance} AS a({lease}) \
                 LEFT JOIN LATERAL {}(a.part, $13, $14, $15) AS r({}, passed, blocked) ON true",
                table.derived("_read"),
                COLUMNS.join(", ")
            )
            .into(),
            // Each aggregate's first message in the lane (the lane's index
            // in order), then those waiting and due, oldest first.
            due: format!(
                "{clock} SELECT {row}, false AS passed FROM ( \
                   SELECT DISTINCT ON (l.aggregate) l.* FROM {t} AS l \
                   WHERE l.part = $1 AND l.state IN ('waiting', 'parked') \
                   ORDER BY l.aggregate, l.sequence) AS r, c \
                 WHERE r.state = 'waiting' AND r.available_at <= c.now \
                 ORDER BY r.enqueued_at, r.id LIMIT $2"
            )
            .into(),
            release: format!(
                "{clock} UPDATE {p} AS p SET owner = NULL, lease_until = NULL FROM c \
                 WHERE p.part = $1 AND p.owner = $2 AND p.lease_until > c.now"
            )
            .into(),
            parked: format!(
                "SELECT {row}, false AS passed FROM {t} AS r \
                 WHERE r.state = 'parked' AND (r.enqueued_at, r.id) > ($1, $2) \
                 ORDER BY r.enqueued_at, r.id LIMIT $3"
            )
            .into(),
            retry: format!(
                "{clock} UPDATE {t} AS r SET state = 'waiting', attempts = 0, available_at = c.now \
                 FROM c WHERE r.id = $1 AND r.state = 'parked'"
            )
            .into(),
            // The drop's time in sent_at: a purge ages it from there.
            drop_message: format!(
                "{clock} UPDATE {t} AS r SET state = 'dropped', last_error = $2, sent_at = c.now \
                 FROM c WHERE r.id = $1 AND r.state = 'parked'"
            )
            .into(),
            message: format!(
                "SELECT {row}, {passed} FROM {t} AS r LEFT JOIN {p} AS p ON p.part = r.part \
                 WHERE r.id = $1"
            )
            .into(),
            // A bounded batch: each partition's oldest messages before its
            // cursor (a walk of the log's index from its start) that are old
            // enough by their enqueue, and what left the lane, old enough by
            // its sent_at.
            purge: format!(
                "WITH c AS MATERIALIZED (SELECT {now}() - $1 AS cutoff), \
                 logged AS (SELECT v.id FROM {p} AS p CROSS JOIN c CROSS JOIN LATERAL ( \
                     SELECT r.id, r.enqueued_at FROM {t} AS r \
                     WHERE r.part = p.part AND r.state IS NULL \
                       AND (r.part, r.okey, r.pos) <= (p.part, p.cursor_key, p.cursor_pos) \
                     ORDER BY r.okey, r.pos LIMIT $2) AS v \
                   WHERE v.enqueued_at <= c.cutoff), \
                 finished AS (SELECT r.id FROM {t} AS r, c \
                   WHERE r.state IN ('sent', 'dropped') AND r.sent_at <= c.cutoff LIMIT $2) \
                 DELETE FROM {t} AS r WHERE r.id IN ( \
                   SELECT id FROM (SELECT id FROM logged UNION ALL SELECT id FROM finished) AS d \
                   LIMIT $2)"
            )
            .into(),
            // A function of the migration, without JIT (see there).
            stats: format!(
                "SELECT * FROM {}() AS s(part, owner, lease_until, cursor_key, cursor_pos, now, \
                 logged, logged_oldest, waiting, waiting_oldest, parked)",
                table.derived("_stats")
            )
            .into(),
        }
    }
}

crate::part::part_constructors!(PostgresOutbox => messages: Messages, PostgresOutboxOptions, TableName::outbox_default(), "outbox store", "billing.idem_outbox");
crate::part::table_accessors!(
    PostgresOutbox,
    "idem_outbox",
    "0003_idem_outbox.sql",
    |parts| parts.table.outbox_migration_sql(parts.sql.partitions),
    MIGRATION_LOCK
);

impl PostgresOutbox {
    /// The channel an enqueue notifies, on commit: the table's name as
    /// written (`schema.table` when qualified), cut to the 63 bytes
    /// Postgres keeps. For a `LISTEN` of your own, quote it.
    ///
    /// ```no_run
    /// # fn example(pool: idem_postgres::sqlx::PgPool) -> Result<(), idem_core::StoreError> {
    /// use idem_postgres::{PostgresOutbox, PostgresOutboxOptions};
    ///
    /// let outbox = PostgresOutbox::with_options(pool, PostgresOutboxOptions::default().table("app.events"))?;
    /// assert_eq!(outbox.channel(), "app.events");
    /// # Ok(()) }
    /// ```
    pub fn channel(&self) -> String {
        self.parts().table.outbox_channel()
    }
    /// Enqueues `message` inside the caller's transaction: the message and
    /// the business writes that cause it commit together, or vanish
    /// together (a rollback gives its sequence back too). As
    /// [`OutboxStore::enqueue`] otherwise: an id stored already returns
    /// what is stored.
    ///
    /// The transaction holds its aggregate's counter row until it ends: a
    /// racing enqueue for the same aggregate waits for it, so sequences
    /// follow the commit order; keep such transactions short. The wait
    /// counts against the racer's
    /// [operation timeout](idem_core::StoreOptions::with_operation_timeout).
    /// Needs READ COMMITTED, the default isolation (under REPEATABLE READ
    /// or SERIALIZABLE a racing enqueue for one aggregate fails with a
    /// retryable serialization error). The relay's wake-up is sent on
    /// commit.
    ///
    /// ```no_run
    /// use idem_core::store::NewMessage;
    /// use idem_postgres::PostgresOutbox;
    ///
    /// # async fn example(outbox: PostgresOutbox) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = outbox.pool().begin().await?;
    /// sqlx::query("INSERT INTO orders (id) VALUES (42)").execute(&mut *tx).await?;
    /// let placed = NewMessage::new("order-42", "order.placed", br#"{"id":42}"#.to_vec())?;
    /// outbox.enqueue_in(&mut tx, &placed).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Inside [`Idempotency::run_in`](idem_core::Idempotency::run_in), a
    /// [`PgTransaction`](crate::PgTransaction) from
    /// [`PostgresStore::begin`](crate::PostgresStore::begin) derefs to a
    /// `PgConnection`: the business rows, the message and the stored
    /// response commit together.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use idem_core::{Fingerprint, Idempotency, Scope, StoredResponse};
    /// use idem_core::store::{IdempotencyStore, NewMessage};
    /// use idem_postgres::{PostgresOutbox, PostgresStore};
    ///
    /// # async fn example(store: PostgresStore, outbox: PostgresOutbox) -> Result<(), Box<dyn std::error::Error>> {
    /// let idem: Idempotency<dyn IdempotencyStore> = Idempotency::new(Arc::new(store.clone()));
    /// let scope = Scope::parse("acme", "order-9")?;
    /// let outcome = idem
    ///     .run_in(scope, Fingerprint::of_bytes(b"..."), store.begin(), |_ctx, mut tx| async move {
    ///         sqlx::query("INSERT INTO orders (id) VALUES (9)").execute(tx.conn()).await?;
    ///         let placed = NewMessage::new("order-9", "order.placed", b"{}".to_vec())?;
    ///         outbox.enqueue_in(&mut tx, &placed).await?;
    ///         Ok((tx, StoredResponse::new(201, "order 9")))
    ///     })
    ///     .await?;
    /// # let _ = outcome; Ok(()) }
    /// ```
    ///
    /// # Cancellation
    ///
    /// Dropped (or timed out), the statement may still run inside your
    /// transaction: drop the transaction, which rolls the business change
    /// and its message back together. Never commit after an enqueue that
    /// did not answer.
    ///
    /// # Errors
    ///
    /// As [`OutboxStore::enqueue`]. After a timeout the message's fate
    /// within your transaction is unknown: roll the transaction back.
    pub async fn enqueue_in(
        &self,
        conn: &mut PgConnection,
        message: &NewMessage,
    ) -> Result<OutboxMessage, StoreError> {
        let enqueued = self.parts().enqueue_on(conn, message);
        self.messages
            .layer()
            .call(Operation::Enqueue, None, enqueued)
            .await
    }

    /// Wakes `waker` whenever a message commits: a task holding one of the
    /// pool's connections, `LISTEN`ing on the table's
    /// [channel](Self::channel), that notifies `waker` on each notification
    /// (pass an `idem_outbox::Relay`'s `waker()`). The
    /// listener is running when this returns, so a message committed after
    /// it is never missed.
    ///
    /// A lost connection is re-established (by sqlx's `PgListener`, with a
    /// back-off of 100 ms doubling to 5 s while it fails); notifications
    /// sent meanwhile are lost, so each reconnection and each failure wakes
    /// the relay too, to catch up. Wake-ups are a shortcut only: the
    /// relay's poll interval remains the fallback that publishes what a
    /// lost notification would have announced. The task ends when the
    /// returned [`OutboxListener`] is dropped or aborted, or when the pool
    /// closes.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use idem_postgres::PostgresOutbox;
    ///
    /// # async fn example(outbox: PostgresOutbox) -> Result<(), idem_core::StoreError> {
    /// // With idem-outbox: `let waker = relay.waker();`
    /// let waker = Arc::new(tokio::sync::Notify::new());
    /// let listener = outbox.listen(waker.clone()).await?;
    /// waker.notified().await; // a message committed
    /// drop(listener);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Backend`] if the first
    /// connection or the `LISTEN` failed, within the operation timeout.
    pub async fn listen(&self, waker: Arc<Notify>) -> Result<OutboxListener, StoreError> {
        const OP: Operation = Operation::Setup;
        let pool = self.pool().clone();
        let channel = self.channel();
        let listening = async move {
            let mut listener = PgListener::connect_with(&pool)
                .await
                .map_err(|e| classify(OP, e))?;
            listener
                .listen(&channel)
                .await
                .map_err(|e| classify(OP, e))?;
            Ok(listener)
        };
        let listener = self.messages.layer().timed(OP, listening).await?;
        let task = tokio::spawn(forward_notifications(listener, waker));
        Ok(OutboxListener { task })
    }
}

/// The task of [`PostgresOutbox::listen`]: each notification, reconnection
/// or failure wakes `waker`.
async fn forward_notifications(mut listener: PgListener, waker: Arc<Notify>) {
    let mut backoff = LISTEN_FIRST_BACKOFF;
    loop {
        match listener.try_recv().await {
            Ok(Some(_)) => waker.notify_one(),
            // The connection was lost and made again: what was sent between
            // is lost, so the relay looks now.
            Ok(None) => {
                backoff = LISTEN_FIRST_BACKOFF;
                waker.notify_one();
            }
            Err(sqlx::Error::PoolClosed) => return,
            Err(error) => {
                tracing::warn!(
                    %error,
                    retry_in = ?backoff,
                    "the outbox listener lost its connection; the relay polls until it is back"
                );
                waker.notify_one();
                tokio::time::sleep(backoff).await;
                backoff = backoff.saturating_mul(2).min(LISTEN_MAX_BACKOFF);
            }
        }
    }
}

/// A running [`PostgresOutbox::listen`]er: dropping it (or
/// [`abort`](Self::abort)) stops the task and returns its connection to the
/// pool.
///
/// ```no_run
/// # async fn example(outbox: idem_postgres::PostgresOutbox) -> Result<(), idem_core::StoreError> {
/// let listener = outbox.listen(std::sync::Arc::new(tokio::sync::Notify::new())).await?;
/// assert!(!listener.is_finished());
/// listener.abort();
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct OutboxListener {
    task: JoinHandle<()>,
}

impl OutboxListener {
    /// Stops the listener.
    ///
    /// ```no_run
    /// # fn example(listener: idem_postgres::OutboxListener) {
    /// listener.abort();
    /// # }
    /// ```
    pub fn abort(&self) {
        self.task.abort();
    }

    /// Whether the listener has stopped (aborted, or its pool closed).
    ///
    /// ```no_run
    /// # fn example(listener: idem_postgres::OutboxListener) {
    /// if listener.is_finished() {
    ///     // listen again
    /// }
    /// # }
    /// ```
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl Drop for OutboxListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A limit or count as a bigint.
fn bigint(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A position's numbers as bigints (each below 2^63, as the store gives
/// them).
fn position_columns(position: LogPosition) -> (i64, i64) {
    let part = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    (part(position.major()), part(position.minor()))
}

/// The position in `row`'s columns `key` and `pos`.
fn position(row: &PgRow, key: &str, pos: &str, op: Operation) -> Result<LogPosition, StoreError> {
    let number = |name: &str| -> Result<u64, StoreError> {
        let n: i64 = column(row, name, op)?;
        u64::try_from(n).map_err(|_| corrupt(op, "position"))
    };
    Ok(LogPosition::new(number(key)?, number(pos)?))
}

impl Messages {
    /// Enqueues on `executor` (the pool, or the caller's transaction); the
    /// caller's layer bounds it.
    async fn enqueue_on<'e>(
        &self,
        executor: impl PgExecutor<'e>,
        message: &NewMessage,
    ) -> Result<OutboxMessage, StoreError> {
        const OP: Operation = Operation::Enqueue;
        let (names, values): (Vec<&str>, Vec<&str>) = message
            .headers()
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .unzip();
        let hash = i64::try_from(partition_hash(message.aggregate())).unwrap_or(i64::MAX);
        let row = sqlx::query(AssertSqlSafe(self.sql.enqueue.clone()))
            .bind(message.id().as_uuid())
            .bind(message.aggregate())
            .bind(hash)
            .bind(message.kind())
            .bind(names)
            .bind(values)
            .bind(message.payload())
            .fetch_one(executor)
            .await
            .map_err(|e| classify(OP, e))?;
        stored(&row, OP)
    }

    /// The lease in `row` (its `lease_until`, `cursor_key` and
    /// `cursor_pos`) of `partition` to `owner` for `lease`.
    fn lease(
        row: &PgRow,
        partition: u32,
        owner: OwnerToken,
        lease: Duration,
        op: Operation,
    ) -> Result<PartitionLease, StoreError> {
        let until = time(row, "lease_until", op)?.ok_or_else(|| corrupt(op, "lease"))?;
        let cursor = position(row, "cursor_key", "cursor_pos", op)?;
        Ok(PartitionLease::issued(
            partition, owner, lease, until, cursor,
        ))
    }

    /// `sql` (the advance, alone or with a read after it) with the
    /// advance's parameters: `advance` under `lease`.
    fn advance_query<'q>(
        &self,
        sql: &Arc<str>,
        lease: &PartitionLease,
        advance: &'q Advance,
    ) -> Result<sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>, StoreError>
    {
        let part = self.partition(lease.partition())?;
        let to = advance.to.map(position_columns);
        let failed = &advance.failed;
        let column = |f: fn(&PublishFailure) -> i64| failed.iter().map(f).collect::<Vec<_>>();
        Ok(sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(part)
            .bind(lease.owner().as_uuid())
            .bind(millis(lease.lease()))
            .bind(to.map(|(key, _)| key))
            .bind(to.map(|(_, pos)| pos))
            .bind(failed.iter().map(|f| f.id.as_uuid()).collect::<Vec<_>>())
            .bind(column(|f| i64::from(f.attempts)))
            .bind(failed.iter().map(|f| f.error.as_str()).collect::<Vec<_>>())
            .bind(column(|f| millis(f.retry_after)))
            .bind(column(|f| i64::from(f.max_attempts)))
            .bind(uuids(&advance.held))
            .bind(uuids(&advance.sent)))
    }

    /// `lease` as the advance in `row` renewed it.
    fn renewed(
        row: &PgRow,
        lease: &PartitionLease,
        op: Operation,
    ) -> Result<PartitionLease, StoreError> {
        let renewed = Self::lease(row, lease.partition(), lease.owner(), lease.lease(), op)?;
        Ok(lease.renewed(renewed.until(), renewed.cursor()))
    }

    /// `partition` as the bigint the tables keep.
    fn partition(&self, partition: u32) -> Result<i32, StoreError> {
        if partition >= self.sql.partitions {
            return Err(InvalidInput::OutOfRange {
                field: "partition",
                reason: "the outbox has no such partition",
            }
            .into());
        }
        i32::try_from(partition).map_err(|_| corrupt(Operation::Read, "partition"))
    }
}

/// A timestamp column, or none.
fn time(row: &PgRow, name: &str, operation: Operation) -> Result<Option<Timestamp>, StoreError> {
    let millis: Option<i64> = column(row, name, operation)?;
    Ok(millis.map(Timestamp::from_unix_millis))
}

/// The message in `row`, its columns named as [`COLUMNS`] are, with
/// `passed`.
fn stored(row: &PgRow, op: Operation) -> Result<OutboxMessage, StoreError> {
    let text = |name: &str| column::<String>(row, name, op);
    let id: uuid::Uuid = column(row, "id", op)?;
    let names: Vec<String> = column(row, "header_names", op)?;
    let values: Vec<String> = column(row, "header_values", op)?;
    if names.len() != values.len() {
        return Err(corrupt(op, "headers"));
    }
    let passed: Option<bool> = column(row, "passed", op)?;
    let state = match column::<Option<String>>(row, "state", op)? {
        None if passed == Some(true) => MessageState::Sent,
        None => MessageState::Pending,
        Some(name) => MessageState::parse(&name).ok_or_else(|| corrupt(op, "state"))?,
    };
    let sequence: i64 = column(row, "sequence", op)?;
    let attempts: i64 = column(row, "attempts", op)?;
    let part: i32 = column(row, "part", op)?;
    let required = |name: &str, field| time(row, name, op)?.ok_or_else(|| corrupt(op, field));
    let parts = MessageParts {
        sequence: u64::try_from(sequence).map_err(|_| corrupt(op, "sequence"))?,
        partition: u32::try_from(part).map_err(|_| corrupt(op, "partition"))?,
        position: position(row, "okey", "pos", op)?,
        state,
        attempts: u32::try_from(attempts).map_err(|_| corrupt(op, "attempts"))?,
        last_error: column(row, "last_error", op)?,
        enqueued_at: required("enqueued_at", "enqueued at")?,
        available_at: required("available_at", "available at")?,
        sent_at: time(row, "sent_at", op)?,
    };
    let message = NewMessage::from_stored(
        MessageId::from_uuid(id),
        text("aggregate")?,
        text("kind")?,
        names.into_iter().zip(values).collect(),
        column(row, "payload", op)?,
    );
    Ok(OutboxMessage::new(message, parts))
}

/// The batch a read answered in `rows`, each a message with `blocked`; a
/// row with no message (an advance's that read nothing) is skipped.
fn batch(rows: &[PgRow], op: Operation) -> Result<LogBatch, StoreError> {
    let mut blocked = BTreeSet::new();
    let mut messages = Vec::with_capacity(rows.len());
    for row in rows {
        if column::<Option<uuid::Uuid>>(row, "id", op)?.is_none() {
            continue;
        }
        let message = stored(row, op)?;
        if column::<bool>(row, "blocked", op)? {
            blocked.insert(message.message().aggregate().to_string());
        }
        messages.push(message);
    }
    Ok(LogBatch::new(messages, blocked))
}

fn uuids(ids: &[MessageId]) -> Vec<uuid::Uuid> {
    ids.iter().map(MessageId::as_uuid).collect()
}

#[async_trait]
impl OutboxStore for Messages {
    async fn enqueue(&self, message: &NewMessage) -> Result<OutboxMessage, StoreError> {
        self.enqueue_on(&self.pool, message).await
    }

    async fn acquire(
        &self,
        owner: OwnerToken,
        lease: Duration,
    ) -> Result<Option<PartitionLease>, StoreError> {
        const OP: Operation = Operation::Acquire;
        let lease = validate_lease(lease)?;
        let row = sqlx::query(AssertSqlSafe(self.sql.acquire.clone()))
            .bind(owner.as_uuid())
            .bind(millis(lease))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| classify(OP, e))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let part: i32 = column(&row, "part", OP)?;
        let partition = u32::try_from(part).map_err(|_| corrupt(OP, "partition"))?;
        Self::lease(&row, partition, owner, lease, OP).map(Some)
    }

    async fn read(
        &self,
        partition: u32,
        after: LogPosition,
        limit: usize,
    ) -> Result<LogBatch, StoreError> {
        const OP: Operation = Operation::Read;
        let limit = validate_outbox_batch(limit)?;
        let part = self.partition(partition)?;
        let (key, pos) = position_columns(after);
        let rows = sqlx::query(AssertSqlSafe(self.sql.read.clone()))
            .bind(part)
            .bind(key)
            .bind(pos)
            .bind(bigint(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| classify(OP, e))?;
        batch(&rows, OP)
    }

    async fn advance(
        &self,
        lease: &PartitionLease,
        advance: &Advance,
    ) -> Result<PartitionLease, StoreError> {
        const OP: Operation = Operation::Advance;
        let row = self
            .advance_query(&self.sql.advance, lease, advance)?
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| classify(OP, e))?;
        let Some(row) = row else {
            return Err(StoreError::LostLease);
        };
        Self::renewed(&row, lease, OP)
    }

    async fn advance_and_read(
        &self,
        lease: &PartitionLease,
        advance: &Advance,
        after: LogPosition,
        limit: usize,
    ) -> Result<AdvancedRead, StoreError> {
        const OP: Operation = Operation::Advance;
        let limit = validate_outbox_batch(limit)?;
        let (key, pos) = position_columns(after);
        let rows = self
            .advance_query(&self.sql.advance_read, lease, advance)?
            .bind(key)
            .bind(pos)
            .bind(bigint(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| classify(OP, e))?;
        let Some(first) = rows.first() else {
            return Err(StoreError::LostLease);
        };
        let renewed = Self::renewed(first, lease, OP)?;
        Ok(AdvancedRead::new(renewed, batch(&rows, OP)))
    }

    async fn due(&self, partition: u32, limit: usize) -> Result<Vec<OutboxMessage>, StoreError> {
        const OP: Operation = Operation::Read;
        let limit = validate_outbox_batch(limit)?;
        let part = self.partition(partition)?;
        let rows = sqlx::query(AssertSqlSafe(self.sql.due.clone()))
            .bind(part)
            .bind(bigint(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| classify(OP, e))?;
        rows.iter().map(|row| stored(row, OP)).collect()
    }

    async fn release(&self, lease: &PartitionLease) -> Result<bool, StoreError> {
        let part = self.partition(lease.partition())?;
        let done = sqlx::query(AssertSqlSafe(self.sql.release.clone()))
            .bind(part)
            .bind(lease.owner().as_uuid())
            .execute(&self.pool)
            .await
            .map_err(|e| classify(Operation::Release, e))?;
        Ok(done.rows_affected() > 0)
    }

    async fn parked(
        &self,
        after: Option<PageAfter>,
        limit: usize,
    ) -> Result<Vec<OutboxMessage>, StoreError> {
        const OP: Operation = Operation::List;
        let limit = validate_outbox_batch(limit)?;
        let (at, id) = after.map_or((i64::MIN, uuid::Uuid::nil()), |after| {
            (after.enqueued_at.as_unix_millis(), after.id.as_uuid())
        });
        let rows = sqlx::query(AssertSqlSafe(self.sql.parked.clone()))
            .bind(at)
            .bind(id)
            .bind(bigint(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| classify(OP, e))?;
        rows.iter().map(|row| stored(row, OP)).collect()
    }

    async fn retry(&self, id: MessageId) -> Result<bool, StoreError> {
        let done = sqlx::query(AssertSqlSafe(self.sql.retry.clone()))
            .bind(id.as_uuid())
            .execute(&self.pool)
            .await
            .map_err(|e| classify(Operation::Retry, e))?;
        Ok(done.rows_affected() > 0)
    }

    async fn drop_message(&self, id: MessageId, reason: &str) -> Result<bool, StoreError> {
        let done = sqlx::query(AssertSqlSafe(self.sql.drop_message.clone()))
            .bind(id.as_uuid())
            .bind(reason)
            .execute(&self.pool)
            .await
            .map_err(|e| classify(Operation::Drop, e))?;
        Ok(done.rows_affected() > 0)
    }

    async fn message(&self, id: MessageId) -> Result<Option<OutboxMessage>, StoreError> {
        const OP: Operation = Operation::Get;
        let row = sqlx::query(AssertSqlSafe(self.sql.message.clone()))
            .bind(id.as_uuid())
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| classify(OP, e))?;
        row.map(|row| stored(&row, OP)).transpose()
    }

    async fn purge_sent(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        let limit = validate_outbox_batch(limit)?;
        crate::part::purge(&self.pool, &self.sql.purge, older_than, limit).await
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        const OP: Operation = Operation::Stats;
        let rows = sqlx::query(AssertSqlSafe(self.sql.stats.clone()))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| classify(OP, e))?;
        let mut partitions = Vec::with_capacity(rows.len());
        for row in &rows {
            let count = |name: &'static str| -> Result<u64, StoreError> {
                let n: i64 = column(row, name, OP)?;
                u64::try_from(n).map_err(|_| corrupt(OP, name))
            };
            let part: i32 = column(row, "part", OP)?;
            let now = Timestamp::from_unix_millis(column(row, "now", OP)?);
            let mut stats =
                PartitionStats::new(u32::try_from(part).map_err(|_| corrupt(OP, "partition"))?);
            stats.pending = count("logged")? + count("waiting")?;
            stats.parked = count("parked")?;
            let oldest = [
                time(row, "logged_oldest", OP)?,
                time(row, "waiting_oldest", OP)?,
            ]
            .into_iter()
            .flatten()
            .min();
            stats.oldest_pending_age = oldest.map(|at| now.saturating_duration_since(at));
            stats.cursor = position(row, "cursor_key", "cursor_pos", OP)?;
            let until = time(row, "lease_until", OP)?.filter(|until| *until > now);
            if let (Some(owner), Some(until)) =
                (column::<Option<uuid::Uuid>>(row, "owner", OP)?, until)
            {
                stats.holder = Some(OwnerToken::from_uuid(owner));
                stats.held_until = Some(until);
            }
            partitions.push(stats);
        }
        Ok(OutboxStats::of_partitions(partitions))
    }

    fn capabilities(&self) -> Capabilities {
        crate::part::capabilities(usize::MAX)
    }
}
