//! A transaction of the tests' own over the memory store: the completion
//! it was given lands in the store when it commits.

#![allow(dead_code, unreachable_pub)] // each test file uses a part

use idem_core::store::{IdempotencyStore, Lease, Transaction};
use idem_core::{Checkpoint, StoreError, StoredResponse, async_trait};
use idem_memory::MemoryStore;

/// Completes into `store` at commit; checks the response against `limit`
/// as a store's transaction would; with `hang_after_commit`, never answers
/// its commit once it has landed (a reply lost in flight).
pub struct Ledger {
    pub store: MemoryStore,
    pub completion: Option<(Lease, StoredResponse)>,
    pub limit: Option<usize>,
    pub hang_after_commit: bool,
}

impl Ledger {
    pub fn new(store: MemoryStore) -> Self {
        Self {
            store,
            completion: None,
            limit: None,
            hang_after_commit: false,
        }
    }
}

#[async_trait]
impl Transaction for Ledger {
    async fn complete(
        &mut self,
        lease: &Lease,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        if let Some(limit) = self.limit {
            idem_core::store::check_response_size(response, limit)?;
        }
        self.completion = Some((lease.clone(), response.clone()));
        Ok(())
    }

    async fn checkpoint(&mut self, _: &Lease, _: &Checkpoint) -> Result<(), StoreError> {
        Ok(())
    }

    async fn commit(self) -> Result<(), StoreError> {
        if let Some((lease, response)) = &self.completion {
            self.store.complete(lease, response).await?;
        }
        if self.hang_after_commit {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}
