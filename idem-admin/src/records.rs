//! Idempotency records by tenant and key: read one, delete one.

use std::fmt;
use std::sync::Arc;

use idem_core::store::{IdempotencyStore, Record};
use idem_core::{Idempotency, InvalidInput, Scope, StoreError, async_trait};
use serde::Deserialize;

use crate::error::AdminError;
use crate::view::{Action, Done};

const PART: &str = "records";

/// What the console needs of an `Idempotency`, whatever its store.
#[async_trait]
pub(crate) trait Records: Send + Sync + fmt::Debug + 'static {
    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError>;
    async fn delete(&self, scope: &Scope) -> Result<bool, StoreError>;
}

#[async_trait]
impl<S: IdempotencyStore + ?Sized> Records for Idempotency<S> {
    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        Idempotency::get(self, scope).await
    }

    async fn delete(&self, scope: &Scope) -> Result<bool, StoreError> {
        Idempotency::delete(self, scope).await
    }
}

/// A record's tenant and key, as a request body carries them (never a
/// URL, which access logs keep: keys can be personal data).
///
/// ```
/// use idem_admin::RecordRef;
///
/// let record: RecordRef = serde_json::from_str(r#"{"tenant":"acme","key":"pay-1"}"#)?;
/// assert_eq!(record.scope()?.tenant().as_str(), "acme");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct RecordRef {
    /// The tenant.
    pub tenant: String,
    /// The idempotency key.
    pub key: String,
}

impl fmt::Debug for RecordRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecordRef")
            .field("tenant", &self.tenant)
            .field("key_hash", &idem_core::redacted(&self.key))
            .finish()
    }
}

impl RecordRef {
    /// The record of `key` in `tenant`.
    pub fn new(tenant: &str, key: &str) -> Self {
        Self {
            tenant: tenant.to_string(),
            key: key.to_string(),
        }
    }

    /// Its scope.
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] for a bad tenant or key.
    pub fn scope(&self) -> Result<Scope, InvalidInput> {
        Scope::parse(&self.tenant, &self.key)
    }
}

/// The records part of a console.
#[derive(Debug, Clone)]
pub(crate) struct RecordsPart {
    records: Arc<dyn Records>,
}

impl RecordsPart {
    pub(crate) fn new(records: Arc<dyn Records>) -> Self {
        Self { records }
    }

    pub(crate) async fn read(&self, scope: &Scope) -> Result<Record, AdminError> {
        self.records
            .get(scope)
            .await
            .map_err(AdminError::store(PART))?
            .ok_or_else(|| AdminError::NotFound {
                what: "record for this tenant and key".into(),
            })
    }

    /// Deletes a record; a repeat answers that none is there.
    pub(crate) async fn delete(&self, scope: &Scope) -> Result<Done, AdminError> {
        let deleted = self
            .records
            .delete(scope)
            .await
            .map_err(AdminError::store(PART))?;
        let state = if deleted { "deleted" } else { "absent" };
        Ok(Done::new(Action::RecordDelete, deleted, state, None))
    }
}
