//! Why a journal call failed.

use idem_core::{BoxError, InvalidInput};

use crate::operation::{OperationId, OperationState};

/// Why a journal call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// No operation has this id.
    #[error("no operation {0}")]
    NotFound(OperationId),
    /// The id is taken by an operation with another request.
    #[error("operation {0} exists with another request")]
    Mismatch(OperationId),
    /// Another executor holds the operation; try again after its lease.
    #[error("operation {0} is being executed elsewhere")]
    Busy(OperationId),
    /// Another executor took the operation over: nothing of this call was
    /// stored.
    #[error("operation {0} was taken over by another executor")]
    LostLease(OperationId),
    /// The operation is settled: it never changes again.
    #[error("operation {id} is settled as {state:?}")]
    Settled {
        /// Which operation.
        id: OperationId,
        /// Its final state.
        state: OperationState,
    },
    /// Input refused before anything was written.
    #[error("invalid input: {0}")]
    InvalidInput(#[from] InvalidInput),
    /// The store failed; retrying is safe.
    #[error("journal store {store}: {source}")]
    Store {
        /// Which store.
        store: &'static str,
        /// The driver's error.
        #[source]
        source: BoxError,
    },
}

impl JournalError {
    pub(crate) fn store(store: &'static str, source: impl Into<BoxError>) -> Self {
        Self::Store {
            store,
            source: source.into(),
        }
    }
}
