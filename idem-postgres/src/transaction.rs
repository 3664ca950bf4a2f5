//! A transaction on the store's database that the completion and
//! checkpoints join: [`idem_core::store::Transaction`] for Postgres.

use std::fmt;
use std::ops::{Deref, DerefMut};

use idem_core::store::{
    ClaimOutcome, ClaimRequest, Lease, Transaction, check_response_size, once_each,
};
use idem_core::{Checkpoint, Operation, StoreError, StoredResponse, async_trait};
use sqlx::{PgConnection, Postgres};

use crate::error::{STORE, classify, classify_commit};
use crate::fenced::Fenced;
use crate::options::TableName;

/// A transaction on the store's database, from [`PostgresStore::begin`](crate::PostgresStore::begin).
///
/// Write your business rows through it ([`conn`](Self::conn), the
/// `PgConnection` sqlx executes on, wherever the transaction is held);
/// the runner completes the record inside it and commits, so the rows and
/// the stored response commit together. Dropping it rolls back.
///
/// The completion, a checkpoint and the commit are each bounded by the
/// store's [operation timeout](idem_core::StoreOptions::with_operation_timeout); a
/// commit that times out has an unknown outcome, as any `Unavailable`.
/// Your own statements through it are yours to bound.
///
/// It batches ([`Transaction::batches`]): a consumer claims each message of
/// a batch in it ([`Transaction::claim`], the claim function on this
/// connection) under a `SAVEPOINT` of the message's own. A second
/// transaction claiming a message this one claimed waits on the record's
/// primary key until this one ends (up to the operation timeout), then
/// finds the record completed, or claims it if this one rolled back: a
/// message claimed in two batches at once applies once. Needs READ
/// COMMITTED, the default isolation.
pub struct PgTransaction {
    fenced: Fenced,
    table: TableName,
    tx: sqlx::Transaction<'static, Postgres>,
    /// A savepoint released and not yet told to the server: the release
    /// rides on the next savepoint statement (one round trip fewer per
    /// message of a batch), and a commit releases it anyway. Until then
    /// what is written lands in it, and is kept or rolled back with the
    /// savepoint around it, as it would be once released.
    release_pending: bool,
    /// A statement of its own failed on the server: the server has
    /// aborted the transaction, and a `COMMIT` would end it as a
    /// rollback that the driver reports as a success.
    failed: bool,
}

impl PgTransaction {
    pub(crate) fn new(
        fenced: Fenced,
        table: TableName,
        tx: sqlx::Transaction<'static, Postgres>,
    ) -> Self {
        Self {
            fenced,
            table,
            tx,
            release_pending: false,
            failed: false,
        }
    }
}

/// One name for every savepoint: Postgres nests savepoints of one name, and
/// a rollback or a release names the latest.
const SAVEPOINT: &str = "SAVEPOINT idem_message";
/// Back to the latest savepoint, and closed, in one round trip.
const ROLLBACK_TO_SAVEPOINT: &str =
    "ROLLBACK TO SAVEPOINT idem_message; RELEASE SAVEPOINT idem_message";
const RELEASE_SAVEPOINT: &str = "RELEASE SAVEPOINT idem_message";
const RELEASE_THEN_SAVEPOINT: &str = "RELEASE SAVEPOINT idem_message; SAVEPOINT idem_message";
const RELEASE_THEN_ROLLBACK_TO_SAVEPOINT: &str = "RELEASE SAVEPOINT idem_message; \
     ROLLBACK TO SAVEPOINT idem_message; RELEASE SAVEPOINT idem_message";

impl PgTransaction {
    /// `result`, the transaction marked failed where the server refused
    /// one of its statements (which aborts the transaction there); what
    /// this side decided alone (a lost lease, a value too large) and a
    /// call given up on (its outcome unknown: the commit says so itself)
    /// leave it as it is.
    fn noted<T>(&mut self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(error) = &result {
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
            while let Some(now) = cause {
                if let Some(sqlx::Error::Database(_)) = now.downcast_ref::<sqlx::Error>() {
                    self.failed = true;
                    break;
                }
                cause = now.source();
            }
        }
        result
    }

    /// Sends `sql` after the pending release, if there is one.
    async fn savepoint_statement(&mut self, sql: &'static str) -> Result<(), StoreError> {
        let sql = match (std::mem::take(&mut self.release_pending), sql) {
            (true, SAVEPOINT) => RELEASE_THEN_SAVEPOINT,
            (true, _) => RELEASE_THEN_ROLLBACK_TO_SAVEPOINT,
            (false, sql) => sql,
        };
        self.send(sql).await
    }

    async fn send(&mut self, sql: &'static str) -> Result<(), StoreError> {
        let tx = &mut *self.tx;
        let sent = self
            .fenced
            .layer
            .call(Operation::Transaction, None, async move {
                sqlx::raw_sql(sql)
                    .execute(tx)
                    .await
                    .map(drop)
                    .map_err(|e| classify(Operation::Transaction, e))
            })
            .await;
        self.noted(sent)
    }
}

impl PgTransaction {
    /// The connection the transaction runs on, for your own statements:
    /// what sqlx executes on. One call, wherever the transaction is held:
    /// owned by a consumer's handler, or behind the guard an HTTP handler
    /// locks (`tx.lock().await?.conn()`), where a dereference would take
    /// two stars.
    ///
    /// ```no_run
    /// # async fn demo(store: idem_postgres::PostgresStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use idem_core::store::Transaction;
    ///
    /// let mut tx = store.begin().await?;
    /// idem_postgres::sqlx::query("INSERT INTO orders (id) VALUES ($1)")
    ///     .bind("order-42")
    ///     .execute(tx.conn())
    ///     .await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub fn conn(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}

impl fmt::Debug for PgTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgTransaction")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl Deref for PgTransaction {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.tx
    }
}

impl DerefMut for PgTransaction {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.tx
    }
}

#[async_trait]
impl Transaction for PgTransaction {
    async fn complete(
        &mut self,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let done = self.fenced.complete_on(&mut *self.tx, lease, response);
        let completed = self
            .fenced
            .layer
            .call_under(Operation::Complete, lease, done)
            .await;
        self.noted(completed)
    }

    async fn checkpoint(
        &mut self,
        lease: &Lease,
        checkpoint: &Checkpoint,
    ) -> Result<(), StoreError> {
        let done = self.fenced.checkpoint_on(&mut *self.tx, lease, checkpoint);
        let written = self
            .fenced
            .layer
            .call_under(Operation::Checkpoint, lease, done)
            .await;
        self.noted(written)
    }

    fn batches(&self) -> bool {
        true
    }

    async fn claim(&mut self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let claim = crate::claim::claim(&self.fenced.sql.claim, &mut *self.tx, request);
        let claimed = self.fenced.layer.claim(request, claim).await;
        self.noted(claimed)
    }

    async fn claim_all(
        &mut self,
        requests: &[ClaimRequest],
    ) -> Result<Vec<ClaimOutcome>, StoreError> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let claims = crate::claim::claim_all(&self.fenced.sql.claim_all, &mut *self.tx, requests);
        let claimed = self.fenced.layer.call(Operation::Claim, None, claims).await;
        self.noted(claimed)
    }

    async fn claim_completed_all(
        &mut self,
        requests: &[ClaimRequest],
        response: &StoredResponse,
    ) -> Result<Vec<Option<ClaimOutcome>>, StoreError> {
        once_each(requests)?;
        check_response_size(response, self.fenced.max_response_bytes())?;
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let sql = &self.fenced.sql.claim_completed_all;
        let recorded = crate::claim::claim_completed_all(sql, &mut *self.tx, requests, response);
        let recorded = self
            .fenced
            .layer
            .call(Operation::Claim, None, recorded)
            .await;
        self.noted(recorded)
    }

    async fn complete_all(
        &mut self,
        completions: &[(Lease, StoredResponse)],
    ) -> Result<(), StoreError> {
        // Headers are arrays of their own per record: those go one by one.
        if completions.is_empty() || completions.iter().any(|(_, r)| !r.headers().is_empty()) {
            for (lease, response) in completions {
                self.complete(lease, response).await?;
            }
            return Ok(());
        }
        let done = self.fenced.complete_all_on(&mut *self.tx, completions);
        let completed = self
            .fenced
            .layer
            .call(Operation::Complete, None, done)
            .await;
        self.noted(completed)
    }

    async fn savepoint(&mut self) -> Result<(), StoreError> {
        self.savepoint_statement(SAVEPOINT).await
    }

    async fn rollback_to_savepoint(&mut self) -> Result<(), StoreError> {
        self.savepoint_statement(ROLLBACK_TO_SAVEPOINT).await
    }

    async fn release_savepoint(&mut self) -> Result<(), StoreError> {
        if std::mem::take(&mut self.release_pending) {
            self.send(RELEASE_SAVEPOINT).await?;
        }
        self.release_pending = true;
        Ok(())
    }

    /// A transaction one of whose own statements failed is rolled back,
    /// and the commit refused: Postgres would end it as a rollback that
    /// the driver reports as a commit.
    async fn commit(self) -> Result<(), StoreError> {
        let Self {
            fenced, tx, failed, ..
        } = self;
        if failed {
            // Dropped, the transaction is rolled back.
            drop(tx);
            return Err(StoreError::Rejected {
                store: STORE,
                operation: Operation::Transaction,
                message: "a statement of the transaction failed before its commit: \
                          nothing was written"
                    .into(),
                source: None,
            });
        }
        fenced
            .layer
            .call(Operation::Transaction, None, async {
                tx.commit().await.map_err(classify_commit)
            })
            .await
    }
}
