//! Postgres: the store over a pool sized to the callers; raw, the store's
//! own claim and completion statements on the same pool. The server counts
//! transactions in `pg_stat_database`.

use std::sync::Arc;
use std::time::Duration;

use idem_bench::Outcome;
use idem_core::store::millis;
use idem_postgres::PostgresStore;
use idem_postgres::sqlx::postgres::PgPoolOptions;
use idem_postgres::sqlx::{self, Connection, PgConnection, PgPool, Row};

use super::{
    BenchError, Call, LEASE, Parts, RawBaseline, ServerCounter, Settings, claim_reply, completion,
    env,
};

/// Connects to `IDEM_POSTGRES_URL`; with `setup`, runs the migration.
pub(super) async fn connect(settings: &Settings<'_>) -> Result<Parts<Raw, Counter>, BenchError> {
    let url = env("IDEM_POSTGRES_URL")?;
    // The store's own pool: its transactions open whole, so it needs no
    // release check (`idem_postgres::guarded`), and a store call is one
    // round trip.
    let pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(u32::try_from(settings.concurrency.max(1)).unwrap_or(u32::MAX))
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await?;
    let store = PostgresStore::new(pool.clone());
    if settings.setup {
        store.migrate().await?;
    }
    let raw = Raw {
        pool: pool.clone(),
        claim_sql: store.claim_sql().into(),
        complete_sql: store.complete_sql().into(),
    };
    // The table name is validated by the store, so it is safe to splice in.
    let clean_up_sql = format!("DELETE FROM {} WHERE tenant = $1", store.table()).into();
    Ok(Parts {
        store: Arc::new(store),
        raw,
        counter: Counter {
            url,
            pool,
            clean_up_sql,
        },
    })
}

/// The raw baseline: the store's statements, bound as the store binds them.
pub(super) struct Raw {
    pool: PgPool,
    claim_sql: Arc<str>,
    complete_sql: Arc<str>,
}

impl RawBaseline for Raw {
    async fn execute(&self, call: &Call<'_>) -> Result<Outcome, BenchError> {
        let (tenant, op, retention, body) = (call.tenant, call.op, call.retention, &call.response);
        let owner = uuid::Uuid::new_v4();
        let row = sqlx::query(sqlx::AssertSqlSafe(self.claim_sql.clone()))
            .bind(tenant)
            .bind(&op.key)
            .bind(op.fingerprint.as_slice())
            .bind(owner)
            .bind(millis(LEASE))
            .bind(millis(retention))
            .fetch_one(&self.pool)
            .await?;
        let outcome: String = row.try_get("o_outcome")?;
        let outcome = claim_reply(outcome.as_bytes())?;
        if outcome == Outcome::Replayed {
            // A replay decodes the stored body, as the store does.
            let _body: Option<Vec<u8>> = row.try_get("o_response_body")?;
        }
        if outcome != Outcome::Executed {
            return Ok(outcome);
        }
        let names: Vec<&[u8]> = body.headers().iter().map(|(n, _)| n.as_bytes()).collect();
        let values: Vec<&[u8]> = body.headers().iter().map(|(_, v)| v.as_slice()).collect();
        let done = sqlx::query(sqlx::AssertSqlSafe(self.complete_sql.clone()))
            .bind(tenant)
            .bind(&op.key)
            .bind(owner)
            .bind(millis(retention))
            .bind(i32::from(body.status()))
            .bind(names)
            .bind(values)
            .bind(body.body())
            .execute(&self.pool)
            .await?;
        // The completion is fenced on the owner: no row, no lease.
        completion(done.rows_affected() > 0)
    }
}

/// Reads `pg_stat_database` over connections of its own.
pub(super) struct Counter {
    url: String,
    /// The run's pool, closed by `quiesce`.
    pool: PgPool,
    /// Deletes one tenant's records from the store's table.
    clean_up_sql: Arc<str>,
}

impl ServerCounter for Counter {
    async fn round_trips(&self) -> Result<u64, BenchError> {
        // A connection of its own, closed after: its one transaction is
        // counted in the next reading, which subtracts it.
        let mut conn = PgConnection::connect(&self.url).await?;
        let row = sqlx::query(
            "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database \
             WHERE datname = current_database()",
        )
        .fetch_one(&mut conn)
        .await?;
        conn.close().await?;
        Ok(u64::try_from(row.try_get::<i64, _>(0)?)?)
    }

    /// The previous reading's own transaction.
    fn overhead(&self) -> u64 {
        1
    }

    async fn quiesce(&self) {
        // Backends flush their statistics as they exit.
        self.pool.close().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    async fn clean_up(&self, tenant: &str) -> Result<(), BenchError> {
        let mut conn = PgConnection::connect(&self.url).await?;
        sqlx::query(sqlx::AssertSqlSafe(self.clean_up_sql.clone()))
            .bind(tenant)
            .execute(&mut conn)
            .await?;
        Ok(())
    }
}
