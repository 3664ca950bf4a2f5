//! The transactional mode: the layer opens a transaction of the store's,
//! hands it to the handler through the request's extensions, and completes
//! the record inside it, so the handler's writes and the stored response
//! commit together.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use idem_core::StoreError;
use tokio::sync::{MappedMutexGuard, Mutex, MutexGuard};

/// The transaction a route's handler writes through, from the request's
/// extensions (with axum: `Extension<IdempotencyTransaction<PgTransaction>>`).
///
/// The layer takes it back when the handler returns, to complete and commit:
/// hold the guard from [`lock`](Self::lock) only while writing.
///
/// ```no_run
/// use axum::Extension;
/// use idem_http::IdempotencyTransaction;
/// use idem_postgres::{PgTransaction, sqlx};
///
/// async fn create_order(Extension(tx): Extension<IdempotencyTransaction<PgTransaction>>) -> &'static str {
///     let Ok(mut tx) = tx.lock().await else { return "no transaction" };
///     let _ = sqlx::query("INSERT INTO orders (id) VALUES (1)").execute(tx.conn()).await;
///     "placed"
/// }
/// ```
pub struct IdempotencyTransaction<T>(Arc<Mutex<Option<T>>>);

impl<T> Clone for IdempotencyTransaction<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<T> fmt::Debug for IdempotencyTransaction<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IdempotencyTransaction(..)")
    }
}

/// The transaction was already taken back by the layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the idempotency transaction is no longer available to the handler")]
pub struct TransactionTaken;

impl<T> IdempotencyTransaction<T> {
    pub(crate) fn new(tx: T) -> Self {
        Self(Arc::new(Mutex::new(Some(tx))))
    }

    /// The transaction, for the handler's writes.
    ///
    /// # Errors
    ///
    /// [`TransactionTaken`] once the layer has taken it back (the handler
    /// returned).
    pub async fn lock(&self) -> Result<MappedMutexGuard<'_, T>, TransactionTaken> {
        MutexGuard::try_map(self.0.lock().await, Option::as_mut).map_err(|_| TransactionTaken)
    }

    /// Takes the transaction back, if nobody holds its guard.
    pub(crate) fn take(&self) -> Option<T> {
        self.0.try_lock().ok().and_then(|mut slot| slot.take())
    }
}

pub(crate) type BeginFuture<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send>>;
/// Opens a transaction for one request.
pub(crate) type Begin<T> = Arc<dyn Fn() -> BeginFuture<T> + Send + Sync>;
