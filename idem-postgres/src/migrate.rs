//! Running a migration: the one way every store of this crate creates and
//! updates its tables and functions; and its undoing, derived from the
//! migration itself so that no object it creates is left behind.

use idem_core::{Operation, StoreError};
use sqlx::{AssertSqlSafe, PgPool};

use crate::error::classify;

/// Runs `sql` (a migration built from validated names) in one transaction
/// under the advisory lock `lock`, so concurrent `migrate()` calls of one
/// kind of store wait for each other (`CREATE OR REPLACE FUNCTION` races
/// otherwise).
pub(crate) async fn migrate(pool: &PgPool, lock: i64, sql: String) -> Result<(), StoreError> {
    let fail = |e| classify(Operation::Setup, e);
    let mut tx = crate::pool::begin(pool).await.map_err(fail)?;
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

/// The SQL that drops everything `migration` (a store's renamed migration)
/// creates: each function of every signature it has (an upgrade that
/// changed one leaves the old beside the new), then each table with what
/// hangs on it (indexes, sequences), the last created first. Safe to run
/// again: what is gone is skipped.
pub(crate) fn uninstall_sql(migration: &str) -> String {
    let mut tables = Vec::new();
    let mut functions = Vec::new();
    for line in migration.lines() {
        let line = line.trim_start();
        if let Some(rest) = line.strip_prefix("CREATE TABLE IF NOT EXISTS ") {
            tables.extend(object_name(rest));
        } else if let Some(rest) = line.strip_prefix("CREATE OR REPLACE FUNCTION ") {
            functions.extend(object_name(rest));
        }
    }
    let mut sql = String::new();
    for function in &functions {
        let (schema, name) = match function.split_once('.') {
            Some((schema, name)) => (format!("to_regnamespace('{schema}')"), name),
            None => (
                "current_schema()::regnamespace".to_string(),
                function.as_str(),
            ),
        };
        sql.push_str(&format!(
            "DO $idem$ DECLARE f regprocedure; BEGIN \
             FOR f IN SELECT oid::regprocedure FROM pg_proc WHERE proname = '{name}' \
             AND pronamespace = {schema} LOOP EXECUTE format('DROP FUNCTION %s', f); \
             END LOOP; END $idem$;\n"
        ));
    }
    for table in tables.iter().rev() {
        sql.push_str(&format!("DROP TABLE IF EXISTS {table} CASCADE;\n"));
    }
    sql
}

/// The name an object's `CREATE` statement gives it: up to the first
/// space or parenthesis (a migration's names are validated identifiers).
fn object_name(rest: &str) -> Option<String> {
    let name: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
        .collect();
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uninstall_drops_every_function_and_table_the_migration_creates() {
        let migration = "CREATE TABLE IF NOT EXISTS s.t (\n  id text\n);\n\
            CREATE INDEX IF NOT EXISTS t_idx ON s.t (id);\n\
            CREATE OR REPLACE FUNCTION s.t_claim(p text)\n\
            CREATE TABLE IF NOT EXISTS s.t_aggregates (\n\
            CREATE OR REPLACE FUNCTION s.t_now()\n";
        let sql = uninstall_sql(migration);
        assert!(sql.contains("proname = 't_claim' AND pronamespace = to_regnamespace('s')"));
        assert!(sql.contains("proname = 't_now'"));
        let aggregates = sql
            .find("DROP TABLE IF EXISTS s.t_aggregates CASCADE;")
            .unwrap();
        let table = sql.find("DROP TABLE IF EXISTS s.t CASCADE;").unwrap();
        assert!(aggregates < table, "the last created first: {sql}");
        let plain = uninstall_sql("CREATE OR REPLACE FUNCTION t_claim(\n");
        assert!(plain.contains("pronamespace = current_schema()::regnamespace"));
    }
}
