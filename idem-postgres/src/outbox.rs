//! `PostgresOutbox`: the transactional outbox's store, one row per message
//! and one counter row per aggregate, each operation one statement (see
//! `migrations/0003_idem_outbox.sql`).

use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{
    BatchClaim, Capabilities, Layered, MessageId, MessageParts, MessageState, NewMessage,
    OutboxMessage, OutboxStats, OutboxStore, OwnerToken, PublishFailure, Timestamp,
    forward_outbox_store, millis, validate_lease, validate_outbox_batch,
};
use idem_core::{Operation, StoreError, async_trait};
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

/// The columns every statement reads back, one per part of a message.
const COLUMNS: [&str; 15] = [
    "id",
    "aggregate",
    "sequence",
    "kind",
    "header_names",
    "header_values",
    "payload",
    "state",
    "attempts",
    "last_error",
    "enqueued_at",
    "available_at",
    "lease_owner",
    "lease_until",
    "sent_at",
];

/// The first wait of the listener after its connection failed; it doubles
/// up to [`LISTEN_MAX_BACKOFF`].
const LISTEN_FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest wait of the listener between two attempts to reconnect.
const LISTEN_MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The outbox store on Postgres, over the caller's `sqlx::PgPool`: one row
/// per message in the table `idem_outbox` (or another, see
/// [`PostgresOutboxOptions`]) and one counter row per aggregate in
/// `idem_outbox_aggregates`, in the same database as the business data, so
/// [`enqueue_in`](Self::enqueue_in) writes a message inside the business
/// transaction that causes it: the message exists exactly when the change
/// committed.
///
/// - **Order.** An enqueue takes its aggregate's next sequence by updating
///   the aggregate's counter row, whose lock it holds until its transaction
///   ends: a second transaction enqueueing for the same aggregate waits for
///   the first, so sequences follow the commit order. A message not yet
///   committed is always the last of its aggregate, and a claim takes each
///   aggregate's head (its lowest sequence not sent or dropped), so a
///   message that commits late is never skipped.
/// - **Claims.** A claim is one statement: it locks the available heads of
///   aggregates with nothing parked and nothing leased to another relay
///   (and the message after what the claiming relay holds, under its
///   lease), oldest first, with `FOR UPDATE SKIP LOCKED`, and leases them.
///   Racing relays never block each other and never hold two messages of
///   one aggregate: a message a claim locks is re-checked on its latest
///   version, and what is below it changes only by its own relay's doing
///   or for good (sent or dropped). Its cost follows the batch, not the
///   backlog, whatever the table's statistics: a walk down the pending
///   messages' index and one probe per message claimed (the claim
///   function's comment in the migration says how).
/// - **One round trip.** Every operation is one statement (after the
///   connection has prepared it once), for every outcome. Leases, back-off
///   and ages are the database server's clock's. Build the pool with
///   [`guarded`](crate::guarded) (no ping before every use, and no
///   connection back in service inside a transaction block).
/// - **Purges.** [`purge_sent`](OutboxStore::purge_sent) deletes one
///   bounded batch of sent and dropped messages (`SKIP LOCKED`, so racing
///   purges share the work). The counter rows stay, one small row per
///   aggregate ever seen, so an aggregate's sequences never start again.
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
/// use idem_core::store::{BatchClaim, NewMessage, OutboxStore, OwnerToken};
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
/// let owner = OwnerToken::generate();
/// let batch = outbox.claim(&BatchClaim::new(owner, std::time::Duration::from_secs(30), 100)).await?;
/// let ids: Vec<_> = batch.iter().map(|m| m.id()).collect();
/// outbox.mark_sent(owner, &ids).await?;
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
    enqueue: Arc<str>,
    claim: Arc<str>,
    mark_sent: Arc<str>,
    release: Arc<str>,
    mark_failed: Arc<str>,
    parked: Arc<str>,
    retry: Arc<str>,
    drop_message: Arc<str>,
    message: Arc<str>,
    purge: Arc<str>,
    stats: Arc<str>,
}

impl Statements {
    fn new(table: &TableName) -> Self {
        let t = table.derived("");
        let now = table.derived("_now");
        let row = aliased(&COLUMNS, "r.");
        // Each statement reads the clock once, in a materialized CTE (a
        // scalar subquery per use would read it once per use).
        let clock = format!("WITH c AS MATERIALIZED (SELECT {now}() AS now)");
        Self {
            enqueue: format!(
                "SELECT {row} FROM {}($1, $2, $3, $4, $5, $6) AS r",
                table.derived("_enqueue")
            )
            .into(),
            // One call of the claim function (its comment in the
            // migration says how it walks, and why it never sorts).
            claim: format!(
                "SELECT {row} FROM {}($1, $2, $3) AS r ORDER BY r.enqueued_at, r.id",
                table.derived("_claim")
            )
            .into(),
            // Only a pending message holds a lease (a claim leases pending
            // heads, and every way out of pending clears the lease), so a
            // live lease of the owner's is the whole condition. A test of
            // the state here would match the pending index's predicate, and
            // the generic plan of a table without statistics then walks
            // every pending row of that index, checking each against the
            // ids, instead of looking the ids up by key.
            mark_sent: format!(
                "{clock} UPDATE {t} AS r SET state = 'sent', sent_at = c.now, lease_until = NULL \
                 FROM c WHERE r.id = ANY($2) AND r.lease_owner = $1 AND r.lease_until > c.now"
            )
            .into(),
            // As mark_sent: a live lease of the owner's is the whole
            // condition.
            release: format!(
                "{clock} UPDATE {t} AS r SET lease_until = NULL \
                 FROM c WHERE r.id = ANY($2) AND r.lease_owner = $1 AND r.lease_until > c.now"
            )
            .into(),
            // The back-off saturates at the largest time a bigint holds.
            mark_failed: format!(
                "{clock} UPDATE {t} AS r SET attempts = least(r.attempts + 1, 4294967295), \
                 last_error = $3, lease_until = NULL, \
                 available_at = c.now + least($4, 9223372036854775807 - c.now), \
                 state = CASE WHEN least(r.attempts + 1, 4294967295) >= $5 \
                              THEN 'parked' ELSE 'pending' END \
                 FROM c WHERE r.id = $2 AND r.lease_owner = $1 AND r.lease_until > c.now \
                 AND r.state = 'pending' \
                 RETURNING r.state AS state"
            )
            .into(),
            parked: format!(
                "SELECT {row} FROM {t} AS r WHERE r.state = 'parked' \
                 ORDER BY r.enqueued_at, r.id LIMIT $1"
            )
            .into(),
            retry: format!(
                "{clock} UPDATE {t} AS r SET state = 'pending', attempts = 0, available_at = c.now \
                 FROM c WHERE r.id = $1 AND r.state = 'parked'"
            )
            .into(),
            // The drop's time in sent_at: a purge ages it from there.
            drop_message: format!(
                "{clock} UPDATE {t} AS r SET state = 'dropped', last_error = $2, \
                 lease_until = NULL, sent_at = c.now \
                 FROM c WHERE r.id = $1 AND r.state IN ('pending', 'parked')"
            )
            .into(),
            message: format!("SELECT {row} FROM {t} AS r WHERE r.id = $1").into(),
            // A bounded batch, walking the finished index; SKIP LOCKED lets
            // racing purges share the work.
            purge: format!(
                "DELETE FROM {t} AS r WHERE r.state IN ('sent', 'dropped') AND r.id IN ( \
                   SELECT d.id FROM {t} AS d \
                   WHERE d.state IN ('sent', 'dropped') \
                     AND coalesce(d.sent_at, d.enqueued_at) <= (SELECT {now}()) - $1 \
                   LIMIT $2 FOR UPDATE SKIP LOCKED)"
            )
            .into(),
            stats: format!(
                "SELECT count(*) FILTER (WHERE r.state = 'pending') AS pending, \
                 count(*) FILTER (WHERE r.state = 'parked') AS parked, \
                 min(r.enqueued_at) FILTER (WHERE r.state = 'pending') AS oldest, \
                 (SELECT {now}()) AS now \
                 FROM {t} AS r WHERE r.state IN ('pending', 'parked')"
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
    outbox_migration_sql,
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
    ///         sqlx::query("INSERT INTO orders (id) VALUES (9)").execute(&mut *tx).await?;
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

impl Messages {
    /// Runs `sql`, an update of the messages among `ids` that `owner`
    /// holds; how many it changed.
    async fn owned(
        &self,
        sql: &Arc<str>,
        operation: Operation,
        owner: OwnerToken,
        ids: &[MessageId],
    ) -> Result<u64, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let ids: Vec<uuid::Uuid> = ids.iter().map(MessageId::as_uuid).collect();
        let done = sqlx::query(AssertSqlSafe(Arc::clone(sql)))
            .bind(owner.as_uuid())
            .bind(ids)
            .execute(&self.pool)
            .await
            .map_err(|e| classify(operation, e))?;
        Ok(done.rows_affected())
    }

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
        let row = sqlx::query(AssertSqlSafe(self.sql.enqueue.clone()))
            .bind(message.id().as_uuid())
            .bind(message.aggregate())
            .bind(message.kind())
            .bind(names)
            .bind(values)
            .bind(message.payload())
            .fetch_one(executor)
            .await
            .map_err(|e| classify(OP, e))?;
        stored(&row, OP)
    }
}

/// A timestamp column, or none.
fn time(row: &PgRow, name: &str, operation: Operation) -> Result<Option<Timestamp>, StoreError> {
    let millis: Option<i64> = column(row, name, operation)?;
    Ok(millis.map(Timestamp::from_unix_millis))
}

/// The message in `row`, its columns named as [`COLUMNS`] are.
fn stored(row: &PgRow, op: Operation) -> Result<OutboxMessage, StoreError> {
    let text = |name: &str| column::<String>(row, name, op);
    let id: uuid::Uuid = column(row, "id", op)?;
    let names: Vec<String> = column(row, "header_names", op)?;
    let values: Vec<String> = column(row, "header_values", op)?;
    if names.len() != values.len() {
        return Err(corrupt(op, "headers"));
    }
    let state = MessageState::parse(&text("state")?).ok_or_else(|| corrupt(op, "state"))?;
    let sequence: i64 = column(row, "sequence", op)?;
    let attempts: i64 = column(row, "attempts", op)?;
    let required = |name: &str, field| time(row, name, op)?.ok_or_else(|| corrupt(op, field));
    let parts = MessageParts {
        sequence: u64::try_from(sequence).map_err(|_| corrupt(op, "sequence"))?,
        state,
        attempts: u32::try_from(attempts).map_err(|_| corrupt(op, "attempts"))?,
        last_error: column(row, "last_error", op)?,
        enqueued_at: required("enqueued_at", "enqueued at")?,
        available_at: required("available_at", "available at")?,
        lease_owner: column::<Option<uuid::Uuid>>(row, "lease_owner", op)?
            .map(OwnerToken::from_uuid),
        lease_until: time(row, "lease_until", op)?,
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

#[async_trait]
impl OutboxStore for Messages {
    async fn enqueue(&self, message: &NewMessage) -> Result<OutboxMessage, StoreError> {
        self.enqueue_on(&self.pool, message).await
    }

    async fn claim(&self, batch: &BatchClaim) -> Result<Vec<OutboxMessage>, StoreError> {
        let owner = batch.owner;
        const OP: Operation = Operation::Claim;
        let lease = validate_lease(batch.lease)?;
        let limit = validate_outbox_batch(batch.limit)?;
        let rows = sqlx::query(AssertSqlSafe(self.sql.claim.clone()))
            .bind(owner.as_uuid())
            .bind(millis(lease))
            .bind(bigint(limit))
            .fetch_all(&self.pool)
            .await
            .map_err(|e| classify(OP, e))?;
        rows.iter().map(|row| stored(row, OP)).collect()
    }

    async fn mark_sent(&self, owner: OwnerToken, ids: &[MessageId]) -> Result<u64, StoreError> {
        self.owned(&self.sql.mark_sent, Operation::MarkSent, owner, ids)
            .await
    }

    async fn release(&self, owner: OwnerToken, ids: &[MessageId]) -> Result<u64, StoreError> {
        self.owned(&self.sql.release, Operation::Release, owner, ids)
            .await
    }

    async fn mark_failed(&self, failure: &PublishFailure) -> Result<MessageState, StoreError> {
        const OP: Operation = Operation::MarkFailed;
        let row = sqlx::query(AssertSqlSafe(self.sql.mark_failed.clone()))
            .bind(failure.owner.as_uuid())
            .bind(failure.id.as_uuid())
            .bind(failure.error.as_str())
            .bind(millis(failure.retry_after))
            .bind(i64::from(failure.max_attempts))
            .fetch_optional(&self.pool)
            .await
            .map_err(|e| classify(OP, e))?;
        let Some(row) = row else {
            return Err(StoreError::LostLease);
        };
        let state: String = column(&row, "state", OP)?;
        MessageState::parse(&state).ok_or_else(|| corrupt(OP, "state"))
    }

    async fn parked(&self, limit: usize) -> Result<Vec<OutboxMessage>, StoreError> {
        const OP: Operation = Operation::List;
        let limit = validate_outbox_batch(limit)?;
        let rows = sqlx::query(AssertSqlSafe(self.sql.parked.clone()))
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
        let row = sqlx::query(AssertSqlSafe(self.sql.stats.clone()))
            .fetch_one(&self.pool)
            .await
            .map_err(|e| classify(OP, e))?;
        let count = |name: &'static str| -> Result<u64, StoreError> {
            let n: i64 = column(&row, name, OP)?;
            u64::try_from(n).map_err(|_| corrupt(OP, name))
        };
        let now = Timestamp::from_unix_millis(column(&row, "now", OP)?);
        let oldest = time(&row, "oldest", OP)?;
        Ok(OutboxStats::new(
            count("pending")?,
            count("parked")?,
            oldest.map(|at| now.saturating_duration_since(at)),
        ))
    }

    fn capabilities(&self) -> Capabilities {
        crate::part::capabilities(usize::MAX)
    }
}
