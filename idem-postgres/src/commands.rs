//! The SQL the store sends, built once per table name from validated names.

use std::sync::Arc;

use crate::options::TableName;

/// Every statement the store runs, built once per table name.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(crate) claim: Arc<str>,
    pub(crate) claim_all: Arc<str>,
    pub(crate) claim_completed_all: Arc<str>,
    pub(crate) complete: Arc<str>,
    pub(crate) complete_all: Arc<str>,
    pub(crate) renew: Arc<str>,
    pub(crate) release: Arc<str>,
    pub(crate) checkpoint: Arc<str>,
    pub(crate) get: Arc<str>,
    pub(crate) purge_batch: Arc<str>,
    pub(crate) delete: Arc<str>,
    pub(crate) now: Arc<str>,
}

/// Millisecond precision keeps every store's timestamps comparable.
const NOW: &str = "(SELECT date_trunc('milliseconds', clock_timestamp()) AS now) AS c";
/// The fence: live, in flight, and owned by the lease's owner ($1, $2, $3).
const FENCE: &str = "r.tenant = $1 AND r.key = $2 AND r.owner = $3 \
                     AND r.status = 'in_flight' AND r.expires_at > c.now";
const MS: &str = "* interval '1 millisecond'";

impl Statements {
    pub(crate) fn new(table: &TableName) -> Self {
        let t = table.derived("");
        let claim_fn = table.derived("_claim");
        Self {
            claim: format!("SELECT * FROM {claim_fn}($1, $2, $3, $4, $5, $6)").into(),
            // The claim function on each row of the arrays, in their order
            // (a key twice: the second call sees the first's row).
            claim_all: format!(
                "SELECT c.* FROM unnest($1::text[], $2::text[], $3::bytea[], $4::uuid[], \
                   $5::int8[], $6::int8[]) WITH ORDINALITY \
                   AS q(tenant, key, fingerprint, owner, lease_ms, retention_ms, n) \
                 CROSS JOIN LATERAL {claim_fn}(q.tenant, q.key, q.fingerprint, q.owner, \
                   q.lease_ms, q.retention_ms) AS c \
                 ORDER BY q.n"
            )
            .into(),
            claim_completed_all: format!(
                "SELECT * FROM {}($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                table.derived("_claim_completed")
            )
            .into(),
            // How many of the records, each live, in flight and its
            // lease's owner's, it completed (responses without headers).
            complete_all: format!(
                "WITH done AS (\
                   UPDATE {t} AS r SET status = 'completed', lease_expires_at = NULL, \
                   expires_at = c.now + q.retention_ms {MS}, response_status = q.status, \
                   response_header_names = '{{}}', response_header_values = '{{}}', \
                   response_body = q.body, checkpoint_name = NULL, checkpoint_data = NULL \
                   FROM unnest($1::text[], $2::text[], $3::uuid[], $4::int8[], $5::int4[], \
                     $6::bytea[]) AS q(tenant, key, owner, retention_ms, status, body), {NOW} \
                   WHERE r.tenant = q.tenant AND r.key = q.key AND r.owner = q.owner \
                   AND r.status = 'in_flight' AND r.expires_at > c.now RETURNING 1\
                 ) SELECT count(*) FROM done"
            )
            .into(),
            // True if this statement completed the record, or if it was
            // completed already by this owner with this response (a second
            // delivery); the outer SELECT sees the row as it was before.
            complete: format!(
                "WITH done AS (\
                   UPDATE {t} AS r SET status = 'completed', lease_expires_at = NULL, \
                   expires_at = c.now + $4 {MS}, response_status = $5, \
                   response_header_names = $6, response_header_values = $7, response_body = $8, \
                   checkpoint_name = NULL, checkpoint_data = NULL \
                   FROM {NOW} WHERE {FENCE} RETURNING 1\
                 ) SELECT EXISTS (SELECT 1 FROM done) OR EXISTS (\
                   SELECT 1 FROM {t} AS r, {NOW} WHERE r.tenant = $1 AND r.key = $2 \
                   AND r.owner = $3 AND r.status = 'completed' AND r.expires_at > c.now \
                   AND r.response_status = $5 AND r.response_header_names = $6 \
                   AND r.response_header_values = $7 AND r.response_body = $8)"
            )
            .into(),
            renew: format!(
                "UPDATE {t} AS r SET lease_expires_at = c.now + $4 {MS}, \
                 expires_at = greatest(r.expires_at, c.now + $4 {MS}) \
                 FROM {NOW} WHERE {FENCE} \
                 RETURNING (extract(epoch FROM r.lease_expires_at) * 1000)::bigint"
            )
            .into(),
            // True if this statement released the record, or if nobody holds
            // it (released already: a second delivery; or past retention).
            release: format!(
                "WITH gone AS (DELETE FROM {t} AS r USING {NOW} WHERE {FENCE} RETURNING 1) \
                 SELECT EXISTS (SELECT 1 FROM gone) OR NOT EXISTS (\
                   SELECT 1 FROM {t} AS r, {NOW} WHERE r.tenant = $1 AND r.key = $2 \
                   AND r.expires_at > c.now)"
            )
            .into(),
            checkpoint: format!(
                "UPDATE {t} AS r SET checkpoint_name = $4, checkpoint_data = $5 \
                 FROM {NOW} WHERE {FENCE}"
            )
            .into(),
            get: format!(
                "SELECT r.fingerprint, r.owner, r.attempt, r.status, \
                 (extract(epoch FROM r.lease_expires_at) * 1000)::bigint AS lease_expires_ms, \
                 (extract(epoch FROM r.expires_at) * 1000)::bigint AS expires_ms, \
                 r.checkpoint_name, r.checkpoint_data, r.response_status, \
                 r.response_header_names, r.response_header_values, r.response_body \
                 FROM {t} AS r, {NOW} WHERE r.tenant = $1 AND r.key = $2 AND r.expires_at > c.now"
            )
            .into(),
            // Bounded, and SKIP LOCKED: a sweep never waits on (or blocks) a live claim.
            purge_batch: format!(
                "DELETE FROM {t} AS r USING (\
                   SELECT tenant, key FROM {t} WHERE expires_at <= now() \
                   ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED\
                 ) AS old WHERE r.tenant = old.tenant AND r.key = old.key"
            )
            .into(),
            // Unfenced, for operators: one row or none, and whether it was live.
            delete: format!(
                "DELETE FROM {t} AS r USING {NOW} WHERE r.tenant = $1 AND r.key = $2 \
                 RETURNING r.expires_at > c.now"
            )
            .into(),
            now: format!("SELECT (extract(epoch FROM c.now) * 1000)::bigint FROM {NOW}").into(),
        }
    }
}
