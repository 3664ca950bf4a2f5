//! Running a migration: the one way every store of this crate creates and
//! updates its tables and functions.

use idem_core::{Operation, StoreError};
use sqlx::{AssertSqlSafe, PgPool};

use crate::error::classify;

/// Runs `sql` (a migration built from validated names) in one transaction
/// under the advisory lock `lock`, so concurrent `migrate()` calls of one
/// kind of store wait for each other (`CREATE OR REPLACE FUNCTION` races
/// otherwise).
pub(crate) async fn migrate(pool: &PgPool, lock: i64, sql: String) -> Result<(), StoreError> {
    let fail = |e| classify(Operation::Setup, e);
    let mut tx = crate::pool::begin_whole(pool).await.map_err(fail)?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(lock)
        .execute(&mut *tx)
        .await
        .map_err(fail)?;
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&mut *tx)
        .await
        .map_err(fail)?;
    tx.commit().await.map_err(fail)
}
