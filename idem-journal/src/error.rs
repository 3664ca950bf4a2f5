//! Why a journal call failed.

use std::time::Duration;

use idem_core::store::{OperationId, OperationState};
use idem_core::{InvalidInput, StoreError};

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
    /// Another executor (or an operator) holds the operation.
    #[error("operation {id} is being executed elsewhere; retry in {retry_after:?}")]
    Busy {
        /// Which operation.
        id: OperationId,
        /// What the holder's lease has left.
        retry_after: Duration,
    },
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
    /// The store failed (it names itself and the operation); retrying is
    /// safe.
    #[error(transparent)]
    Store(StoreError),
}

impl JournalError {
    /// `error` from the store, about the operation `id`.
    pub(crate) fn from_store(id: &OperationId, error: StoreError) -> Self {
        match error {
            StoreError::LostLease => Self::LostLease(id.clone()),
            StoreError::InvalidInput(input) => Self::InvalidInput(input),
            other => Self::Store(other),
        }
    }
}
