//! What every Postgres store has alike, written once: the table it keeps
//! its rows in, the pool, the migration of that table; and the
//! constructors of the stores whose options are a table and the shared
//! [`StoreOptions`](idem_core::StoreOptions) alone (the journal, the outbox).
//!
//! Each store's inner part (inside its `Layered`) has the fields `pool` and
//! `table`, and each store a `parts()` that reaches it.

/// `table()`, `pool()`, `migration_sql()` and `migrate()` of `$ty`, whose
/// migration is `TableName::$migration` under the advisory lock `$lock`,
/// the SQL of `$file`.
macro_rules! table_accessors {
    ($ty:ident, $default:literal, $file:literal, $migration:ident, $lock:ident) => {
        $crate::part::table_accessors!($ty, $default, $file, |parts| parts.table.$migration(), $lock);
    };
    ($ty:ident, $default:literal, $file:literal, |$parts:ident| $migration:expr, $lock:ident) => {
        impl $ty {
            /// The table.
            ///
            /// ```no_run
            /// # fn example(pool: idem_postgres::sqlx::PgPool) {
            #[doc = concat!("let store = idem_postgres::", stringify!($ty), "::new(pool);")]
            #[doc = concat!("assert_eq!(store.table().to_string(), \"", $default, "\");")]
            /// # }
            /// ```
            pub fn table(&self) -> &$crate::TableName {
                &self.parts().table
            }

            /// The pool.
            ///
            /// ```no_run
            /// # fn example(pool: idem_postgres::sqlx::PgPool) {
            #[doc = concat!("let store = idem_postgres::", stringify!($ty), "::new(pool);")]
            /// let _pool = store.pool().clone();
            /// # }
            /// ```
            pub fn pool(&self) -> &::sqlx::PgPool {
                &self.parts().pool
            }

            #[doc = concat!("The SQL that [`migrate`](Self::migrate) runs, for your own migration tool: `migrations/", $file, "` with the table's name (and the names made from it: indexes, functions) in place of `", $default, "`.")]
            ///
            /// ```no_run
            /// # fn example(pool: idem_postgres::sqlx::PgPool) {
            #[doc = concat!("let store = idem_postgres::", stringify!($ty), "::new(pool);")]
            #[doc = concat!("assert!(store.migration_sql().contains(\"CREATE TABLE IF NOT EXISTS ", $default, " (\"));")]
            /// # }
            /// ```
            pub fn migration_sql(&self) -> String {
                let $parts = self.parts();
                $migration
            }

            /// Creates what the migration creates where it is missing (the
            /// schema of a qualified table must exist) and replaces the
            /// functions with this version's, under an advisory lock of its
            /// own: safe to run concurrently.
            ///
            /// ```no_run
            #[doc = concat!("# async fn example(store: idem_postgres::", stringify!($ty), ") -> Result<(), idem_core::StoreError> {")]
            /// store.migrate().await?;
            /// # Ok(()) }
            /// ```
            ///
            /// # Errors
            ///
            /// [`StoreError::Unavailable`](idem_core::StoreError::Unavailable)
            /// or [`StoreError::Backend`](idem_core::StoreError::Backend) from
            /// the database.
            pub async fn migrate(&self) -> Result<(), idem_core::StoreError> {
                $crate::migrate::migrate(self.pool(), $lock, self.migration_sql()).await
            }

            /// The SQL that [`uninstall`](Self::uninstall) runs, for your
            /// own migration tool: it drops every table and function
            /// [`migration_sql`](Self::migration_sql) creates (functions of
            /// every signature an upgrade left), and what hangs on the
            /// tables (indexes, sequences), and nothing else.
            ///
            /// ```no_run
            /// # fn example(pool: idem_postgres::sqlx::PgPool) {
            #[doc = concat!("let store = idem_postgres::", stringify!($ty), "::new(pool);")]
            #[doc = concat!("assert!(store.uninstall_sql().contains(\"DROP TABLE IF EXISTS ", $default, " CASCADE;\"));")]
            /// # }
            /// ```
            pub fn uninstall_sql(&self) -> String {
                $crate::migrate::uninstall_sql(&self.migration_sql())
            }

            /// Drops what [`migrate`](Self::migrate) created, its rows with
            /// it (a test's or an example's tables when done, or a store
            /// taken out of service), under the migration's advisory lock.
            /// Running it again drops nothing more.
            ///
            /// ```no_run
            #[doc = concat!("# async fn example(store: idem_postgres::", stringify!($ty), ") -> Result<(), idem_core::StoreError> {")]
            /// store.migrate().await?;
            /// // ... the run ...
            /// store.uninstall().await?;
            /// # Ok(()) }
            /// ```
            ///
            /// # Errors
            ///
            /// [`StoreError::Unavailable`](idem_core::StoreError::Unavailable)
            /// or [`StoreError::Backend`](idem_core::StoreError::Backend) from
            /// the database.
            pub async fn uninstall(&self) -> Result<(), idem_core::StoreError> {
                $crate::migrate::migrate(self.pool(), $lock, self.uninstall_sql()).await
            }
        }
    };
}

/// `new`, `with_options` and `parts` of `$ty`, and its inner part `$inner`:
/// its pool, its table and its `Statements`, built from
/// `$options` (a `part_options!` type), on the table `$default` by default.
macro_rules! part_constructors {
    ($ty:ident => $field:ident: $inner:ident, $options:ident, $default:expr, $what:literal, $example:literal) => {
        /// The pool, the table and its statements, inside the store's layer.
        #[derive(Clone)]
        struct $inner {
            pool: ::sqlx::PgPool,
            table: $crate::TableName,
            sql: ::std::sync::Arc<Statements>,
        }

        impl ::std::fmt::Debug for $inner {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("table", &self.table)
                    .field("pool_size", &self.pool.size())
                    .finish_non_exhaustive()
            }
        }

        impl $ty {
            #[doc = concat!("A ", $what, " with the default options (see [`", stringify!($options), "`]): its default table, a 5 s operation timeout. Run [`migrate`](Self::migrate) once (or apply [`migration_sql`](Self::migration_sql) with your own tool).")]
            ///
            /// ```no_run
            #[doc = concat!("# async fn example(pool: idem_postgres::sqlx::PgPool) -> Result<(), idem_core::StoreError> {")]
            #[doc = concat!("let store = idem_postgres::", stringify!($ty), "::new(pool);")]
            /// store.migrate().await?;
            /// # Ok(()) }
            /// ```
            pub fn new(pool: ::sqlx::PgPool) -> Self {
                Self::from_parts(pool, $default, &$options::default())
            }

            #[doc = concat!("A ", $what, " built from `options`.")]
            ///
            /// ```no_run
            #[doc = concat!("use idem_postgres::{", stringify!($ty), ", ", stringify!($options), "};")]
            ///
            /// # async fn example(pool: idem_postgres::sqlx::PgPool) -> Result<(), idem_core::StoreError> {
            #[doc = concat!("let store = ", stringify!($ty), "::with_options(pool, ", stringify!($options), "::default().table(\"", $example, "\"))?;")]
            /// store.migrate().await?;
            /// # Ok(()) }
            /// ```
            ///
            /// # Errors
            ///
            /// [`StoreError::InvalidInput`](idem_core::StoreError::InvalidInput)
            /// if the table is not a lowercase identifier (optionally
            /// schema-qualified) or the operation timeout is zero.
            pub fn with_options(
                pool: ::sqlx::PgPool,
                options: $options,
            ) -> Result<Self, idem_core::StoreError> {
                let table = options.validate()?;
                Ok(Self::from_parts(pool, table, &options))
            }

            fn from_parts(pool: ::sqlx::PgPool, table: $crate::TableName, options: &$options) -> Self {
                let layer = idem_core::store::OperationLayer::new(
                    $crate::error::STORE,
                    options.store.operation_timeout(),
                );
                let inner = $inner {
                    sql: ::std::sync::Arc::new(Statements::new(&table, options)),
                    pool,
                    table,
                };
                Self {
                    $field: idem_core::store::Layered::with_layer(inner, layer),
                }
            }

            fn parts(&self) -> &$inner {
                self.$field.get_ref()
            }
        }
    };
}

pub(crate) use {part_constructors, table_accessors};

/// What every Postgres store is: durable, sharing the business data's
/// transactions, on the server's clock.
pub(crate) fn capabilities(max_response_bytes: usize) -> idem_core::store::Capabilities {
    use idem_core::store::{Capabilities, ClockSource, Durability, TransactionSharing};
    Capabilities::new(
        crate::error::STORE,
        TransactionSharing::SameDatabase,
        Durability::Durable,
        ClockSource::Server,
        max_response_bytes,
    )
}

/// `columns`, each read from `of` (a row alias and a dot, or a composite's
/// `(x).`) under its own name: the select list of a statement that returns
/// whole rows.
pub(crate) fn aliased(columns: &[&str], of: &str) -> String {
    columns
        .iter()
        .map(|name| format!("{of}{name} AS {name}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs a purge statement (`$1` the age in milliseconds, `$2` the batch):
/// how many rows it deleted.
pub(crate) async fn purge(
    pool: &::sqlx::PgPool,
    sql: &std::sync::Arc<str>,
    older_than: std::time::Duration,
    limit: usize,
) -> Result<u64, idem_core::StoreError> {
    let done = ::sqlx::query(::sqlx::AssertSqlSafe(sql.clone()))
        .bind(idem_core::store::millis(older_than))
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .execute(pool)
        .await
        .map_err(|e| crate::error::classify(idem_core::Operation::Purge, e))?;
    Ok(done.rows_affected())
}
