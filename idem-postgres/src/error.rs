//! Maps driver errors onto [`StoreError`] by type and SQLSTATE, never by message text.

use idem_core::{Operation, StoreError};

/// The store's name in errors.
pub(crate) const STORE: &str = "postgres";

/// SQLSTATE classes and codes after which the same call may succeed.
fn retryable_sqlstate(code: &str) -> bool {
    matches!(
        code,
        // serialization failure, deadlock
        "40001" | "40P01"
        // too many connections, out of memory, disk full
        | "53300" | "53200" | "53100"
        // admin or crash shutdown, cannot connect now
        | "57P01" | "57P02" | "57P03"
        // lock not available, query canceled (statement_timeout)
        | "55P03" | "57014"
    ) || code.starts_with("08") // connection exceptions
}

/// Classifies a driver error of `operation`.
pub(crate) fn classify(operation: Operation, error: sqlx::Error) -> StoreError {
    let retryable = match &error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| retryable_sqlstate(&code)),
        _ => false,
    };
    StoreError::from_driver(retryable, STORE, operation, error)
}

/// A failed commit of the caller's transaction: their own constraints
/// (SQLSTATE class 23) refused it, or it failed as any statement can.
pub(crate) fn classify_commit(error: sqlx::Error) -> StoreError {
    let refused = matches!(&error, sqlx::Error::Database(db)
        if db.code().is_some_and(|code| code.starts_with("23")));
    if refused {
        return StoreError::Rejected {
            store: STORE,
            operation: Operation::Transaction,
            message: error.to_string(),
            source: Some(Box::new(error)),
        };
    }
    classify(Operation::Transaction, error)
}

/// A value read back that the schema should have made impossible.
pub(crate) fn corrupt(operation: Operation, field: &'static str) -> StoreError {
    StoreError::corrupt(STORE, operation, field)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_failures_are_retryable_and_bugs_are_not() {
        assert!(classify(Operation::Claim, sqlx::Error::PoolTimedOut).is_retryable());
        assert!(
            classify(
                Operation::Claim,
                sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into())
            )
            .is_retryable()
        );
        assert!(!classify(Operation::Claim, sqlx::Error::RowNotFound).is_retryable());
        assert!(retryable_sqlstate("08006"));
        assert!(retryable_sqlstate("40001"));
        assert!(!retryable_sqlstate("42P01")); // undefined table: run migrate()
    }
}
