//! The pool's guard: no connection goes back into service inside a
//! transaction block it was left in, whoever left it there.

use std::time::Duration;

use sqlx::postgres::{PgConnection, PgPoolOptions};
use sqlx::{Connection, Postgres};

/// How long the release check may take before the connection is closed
/// instead (a stalled network must not hold a pooled connection forever).
const CHECK_LIMIT: Duration = Duration::from_secs(5);

/// A statement that is harmless outside a transaction block, refused inside
/// a failed one, and whose reply carries the session's transaction status.
const PROBE: &str = "SELECT 1 /* idem: released inside a transaction block? */";

/// `options` with a release check that heals a connection left inside a
/// transaction block: the one call that gives a pool of yours the guard
/// the pools of idem's examples and tools have.
///
/// A pool needs it only where code that can be cut off opens transactions
/// with sqlx's own `begin` (a handler under a timeout, a task that may be
/// aborted). idem's stores open every transaction whole ([`begin`]), so a
/// pool that only they, and code opening its transactions with
/// [`begin`], use never lends a connection inside a stale block, and
/// needs no guard: each store call is then its statement's one round
/// trip (and sqlx's own ping on release, which carries no statement).
/// The guard costs every release one more round trip, a read-only
/// transaction of its own: sqlx 0.9 keeps the session's transaction
/// status to itself, so the check cannot be skipped for a connection
/// whose last use ended cleanly.
///
/// A future dropped while it opens a transaction (a task aborted, a
/// timeout) can leave its connection inside a transaction block that the
/// driver does not know of (sqlx 0.9's `Pool::begin` is not cancel-safe),
/// and the next borrower's statements would then run inside it: its
/// "autocommit" writes uncommitted, its transaction someone else's. With
/// the guard, every connection returned to the pool is asked, in one round
/// trip, for the session's transaction status as the server reports it
/// (the protocol's `ReadyForQuery`, not a guess from timestamps): inside a
/// block it is rolled back (a warning is logged), in a failed block or when
/// the check fails or takes over 5 s it is closed, and otherwise it goes
/// back into the pool as it is. The check runs as the connection returns,
/// in sqlx's background task, not on the path of the next caller.
///
/// It also sets `test_before_acquire(false)` (a connection checked on
/// release needs no ping before each use). It replaces an `after_release`
/// hook set before it; to combine it with one of yours, call
/// [`release_check`] from your hook.
///
/// ```no_run
/// use idem_postgres::sqlx::postgres::PgPoolOptions;
///
/// # async fn example() -> Result<(), idem_postgres::sqlx::Error> {
/// let pool = idem_postgres::guarded(PgPoolOptions::new().max_connections(8))
///     .connect("postgres://localhost/app")
///     .await?;
/// # let _ = pool; Ok(()) }
/// ```
#[must_use]
pub fn guarded(options: PgPoolOptions) -> PgPoolOptions {
    options
        .test_before_acquire(false)
        .after_release(|conn, _| Box::pin(release_check(conn)))
}

/// The guard of [`guarded`] for a hook of your own: `Ok(true)` to keep the
/// connection (outside any transaction block, or healed by a rollback),
/// `Ok(false)` to close it (inside a failed block, or no answer within
/// 5 s), an error for a connection that is broken.
///
/// ```no_run
/// use idem_postgres::sqlx::postgres::PgPoolOptions;
///
/// let options = PgPoolOptions::new().after_release(|conn, _meta| {
///     Box::pin(async move {
///         // ... your own checks ...
///         idem_postgres::release_check(conn).await
///     })
/// });
/// # let _ = options;
/// ```
///
/// # Errors
///
/// The driver's, when the connection is broken.
pub async fn release_check(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    match tokio::time::timeout(CHECK_LIMIT, heal(conn)).await {
        Ok(kept) => kept,
        Err(_) => {
            tracing::warn!("a released connection did not answer its check in time; closing it");
            Ok(false)
        }
    }
}

async fn heal(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    if <PgConnection as Connection>::is_in_transaction(conn) {
        // Only a leaked transaction handle leaves the driver's own depth
        // up; nothing about such a session can be trusted.
        return Ok(false);
    }
    // `begin_with` sends the probe, then succeeds only if the server reports
    // the session inside a transaction block: a block the driver did not
    // open, now tracked, so its rollback ends it.
    match conn.begin_with(PROBE).await {
        Err(sqlx::Error::BeginFailed) => Ok(true),
        Ok(stale) => {
            tracing::warn!(
                "a connection came back to the pool inside a transaction block it was left in \
                 (a future dropped mid-BEGIN); rolled back"
            );
            stale.rollback().await?;
            Ok(true)
        }
        // Refused (a failed transaction block) or the reply of a dropped
        // statement read instead of the probe's: close it.
        Err(sqlx::Error::Database(error)) => {
            tracing::warn!(%error, "a released connection failed its check; closing it");
            Ok(false)
        }
        Err(other) => Err(other),
    }
}

/// Opens a transaction on `pool` whole: `BEGIN` runs in a task of its
/// own, so dropping the caller's future (a timeout, an abort) never cuts
/// it off between its request and its reply; the task finishes it, and a
/// transaction nobody waits for any more is dropped and rolled back as
/// the driver tracks it. Outside a Tokio runtime it opens inline.
///
/// Every transaction of idem's stores opens so, which is why a pool that
/// only they use needs no [`guarded`] release check. Open your own
/// transactions with it too, instead of sqlx's `Pool::begin`, and a pool
/// you share with the stores needs none either: no store call then pays
/// the guard's round trip on release.
///
/// ```no_run
/// use idem_postgres::sqlx::{self, PgPool};
///
/// # async fn example(pool: PgPool) -> Result<(), sqlx::Error> {
/// let mut tx = idem_postgres::begin(&pool).await?;
/// sqlx::query("INSERT INTO orders (id) VALUES (1)").execute(&mut *tx).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// The driver's, when no connection can be had or `BEGIN` fails.
pub async fn begin(
    pool: &sqlx::Pool<Postgres>,
) -> Result<sqlx::Transaction<'static, Postgres>, sqlx::Error> {
    if tokio::runtime::Handle::try_current().is_err() {
        return pool.begin().await;
    }
    let pool = pool.clone();
    match tokio::spawn(async move { pool.begin().await }).await {
        Ok(begun) => begun,
        Err(error) => Err(sqlx::Error::Io(std::io::Error::other(error))),
    }
}
