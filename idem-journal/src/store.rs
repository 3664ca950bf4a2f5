//! Where operations are kept. Every store offers the same four primitives
//! (insert if absent, get, compare-and-set, list by state); the journal's
//! rules (leases, fencing, settled states that never change) are written
//! once, on top of them.

use std::collections::HashMap;
use std::sync::Mutex;

use idem_core::async_trait;

use crate::error::JournalError;
use crate::operation::{Operation, OperationId, OperationState};

/// A stored operation and its version, for compare-and-set.
#[derive(Debug, Clone, PartialEq)]
pub struct Versioned {
    /// The operation.
    pub operation: Operation,
    /// Bumped by every write.
    pub version: u64,
}

/// The storage a [`Journal`](crate::Journal) runs on.
#[async_trait]
pub trait JournalStore: Send + Sync + std::fmt::Debug + 'static {
    /// Stores `operation` unless its id exists; returns what is stored.
    ///
    /// # Errors
    ///
    /// [`JournalError::Store`] when the store fails.
    async fn insert_if_absent(&self, operation: &Operation) -> Result<Versioned, JournalError>;

    /// The operation with `id`, if any.
    ///
    /// # Errors
    ///
    /// [`JournalError::Store`] when the store fails.
    async fn get(&self, id: &OperationId) -> Result<Option<Versioned>, JournalError>;

    /// Replaces the operation if its version is still `version`; returns
    /// whether it did.
    ///
    /// # Errors
    ///
    /// [`JournalError::Store`] when the store fails.
    async fn compare_and_set(
        &self,
        version: u64,
        operation: &Operation,
    ) -> Result<bool, JournalError>;

    /// Up to `limit` operations in `states`, last changed before
    /// `updated_before_ms`, oldest first.
    ///
    /// # Errors
    ///
    /// [`JournalError::Store`] when the store fails.
    async fn list(
        &self,
        states: &[OperationState],
        updated_before_ms: i64,
        limit: usize,
    ) -> Result<Vec<Operation>, JournalError>;
}

/// An in-process journal store: tests and single-process services.
#[derive(Debug, Default)]
pub struct MemoryJournal {
    operations: Mutex<HashMap<OperationId, Versioned>>,
}

impl MemoryJournal {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, HashMap<OperationId, Versioned>> {
        // A panic elsewhere cannot leave an entry half-written: keep using it.
        self.operations.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl JournalStore for MemoryJournal {
    async fn insert_if_absent(&self, operation: &Operation) -> Result<Versioned, JournalError> {
        Ok(self
            .locked()
            .entry(operation.id.clone())
            .or_insert_with(|| Versioned {
                operation: operation.clone(),
                version: 1,
            })
            .clone())
    }

    async fn get(&self, id: &OperationId) -> Result<Option<Versioned>, JournalError> {
        Ok(self.locked().get(id).cloned())
    }

    async fn compare_and_set(
        &self,
        version: u64,
        operation: &Operation,
    ) -> Result<bool, JournalError> {
        let mut operations = self.locked();
        match operations.get_mut(&operation.id) {
            Some(stored) if stored.version == version => {
                *stored = Versioned {
                    operation: operation.clone(),
                    version: version + 1,
                };
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn list(
        &self,
        states: &[OperationState],
        updated_before_ms: i64,
        limit: usize,
    ) -> Result<Vec<Operation>, JournalError> {
        let mut found: Vec<Operation> = self
            .locked()
            .values()
            .map(|v| &v.operation)
            .filter(|op| states.contains(&op.state) && op.updated_at_ms < updated_before_ms)
            .cloned()
            .collect();
        found.sort_by_key(|op| op.updated_at_ms);
        found.truncate(limit);
        Ok(found)
    }
}
