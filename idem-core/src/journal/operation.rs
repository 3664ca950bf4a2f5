//! One outbound operation as the journal keeps it: its identity, its key
//! for the provider, its state and what is known of its sends.

use crate::plumbing::clock::Timestamp;
use crate::plumbing::error::InvalidInput;
use crate::plumbing::fencing::OwnerToken;
use crate::plumbing::scope::{Tenant, check_name};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::time::Duration;

/// The most operations one [`JournalStore::list`](crate::store::JournalStore::list) returns.
pub const MAX_LIST: usize = 1_000;

/// The business identity of an operation: what it is for (`order-42`) and
/// which effect (`charge`). Unique within a journal's namespace: asking for
/// it twice gives the same operation.
///
/// ```
/// use idem_core::store::OperationId;
///
/// let id = OperationId::new("order-42", "charge")?;
/// assert_eq!(id.to_string(), "order-42/charge");
/// assert!(OperationId::new("", "charge").is_err());
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OperationId {
    subject: String,
    effect: String,
}

impl OperationId {
    /// The operation of `effect` for `subject`; both follow idem's name rules
    /// (1 to 255 bytes, no control characters).
    ///
    /// # Errors
    ///
    /// [`InvalidInput`] naming the rule that broke.
    pub fn new(subject: &str, effect: &str) -> Result<Self, InvalidInput> {
        check_name("operation subject", subject)?;
        check_name("operation effect", effect)?;
        Ok(Self {
            subject: subject.to_string(),
            effect: effect.to_string(),
        })
    }

    /// What the operation is for.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// Which effect.
    pub fn effect(&self) -> &str {
        &self.effect
    }
}

impl fmt::Display for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.subject, self.effect)
    }
}

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum OperationState {
    /// Recorded; the provider has not (knowingly) been reached.
    Pending,
    /// The provider may or may not have acted: find out, never assume.
    Unknown,
    /// Settled: the provider acted and reported a final success.
    Succeeded,
    /// Settled: the provider refused (declined), nothing happened.
    Failed,
    /// The journal could not settle it (no match, several, a key the
    /// provider refused as reused): a person must look.
    NeedsReview,
}

impl OperationState {
    /// Whether the state is final: nothing overwrites it, and the provider
    /// is never called for it again.
    pub fn is_settled(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }

    /// The state's name, as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Unknown => "unknown",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::NeedsReview => "needs_review",
        }
    }

    /// The state named `name` (as [`as_str`](Self::as_str) writes it).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == name)
    }

    /// Every state, for listings.
    pub const ALL: [Self; 5] = [
        Self::Pending,
        Self::Unknown,
        Self::Succeeded,
        Self::Failed,
        Self::NeedsReview,
    ];
}

/// Where an operation is kept: a journal's namespace and the operation's
/// identity. Two journals with two namespaces never share an operation, nor
/// a provider key.
///
/// ```
/// use idem_core::Tenant;
/// use idem_core::store::{OperationId, OperationKey};
///
/// let key = OperationKey::new(Tenant::new("billing")?, OperationId::new("order-42", "charge")?);
/// assert_eq!(key.to_string(), "billing:order-42/charge");
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OperationKey {
    namespace: Tenant,
    id: OperationId,
}

impl OperationKey {
    /// The operation `id` in `namespace`.
    pub fn new(namespace: Tenant, id: OperationId) -> Self {
        Self { namespace, id }
    }

    /// The key as `owner` names it to the fenced writes.
    pub fn held_by(&self, owner: OwnerToken) -> Holder<'_> {
        Holder { key: self, owner }
    }

    /// The journal's namespace.
    pub fn namespace(&self) -> &Tenant {
        &self.namespace
    }

    /// The operation's identity.
    pub fn id(&self) -> &OperationId {
        &self.id
    }

    /// The operation as a span names it: the namespace as the tenant, the
    /// identity as the key (so spans carry its hash, never the identity,
    /// which can be personal data). `None` for an identity over 255 bytes.
    pub fn span_scope(&self) -> Option<crate::plumbing::scope::Scope> {
        let id = crate::plumbing::scope::IdempotencyKey::new(self.id.to_string()).ok()?;
        Some(crate::plumbing::scope::Scope::new(
            self.namespace.clone(),
            id,
        ))
    }

    /// The parts as one unambiguous string, for a store's key or row: each
    /// part length-prefixed, so no two keys meet whatever they hold.
    pub fn storage_key(&self) -> String {
        let mut out = String::new();
        for part in [self.namespace.as_str(), self.id.subject(), self.id.effect()] {
            out.push_str(&part.len().to_string());
            out.push(':');
            out.push_str(part);
        }
        out
    }
}

/// An operation as the owner of its lease names it to the fenced writes
/// ([`JournalStore::acquire`](crate::store::JournalStore::acquire), [`mark_sent`](crate::store::JournalStore::mark_sent) and
/// [`finish`](crate::store::JournalStore::finish)).
///
/// ```
/// use idem_core::Tenant;
/// use idem_core::store::{OperationId, OperationKey, OwnerToken};
///
/// # fn example() -> Result<(), idem_core::InvalidInput> {
/// let key = OperationKey::new(Tenant::new("billing")?, OperationId::new("order-42", "charge")?);
/// let owner = OwnerToken::generate();
/// let held = key.held_by(owner);
/// assert_eq!((held.key, held.owner), (&key, owner));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder<'a> {
    /// The operation.
    pub key: &'a OperationKey,
    /// Who holds (or asks for) its lease.
    pub owner: OwnerToken,
}

impl fmt::Display for OperationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.namespace, self.id)
    }
}

/// An operation to record: its key, what to ask the provider, and the
/// idempotency key the provider will get with every send.
#[derive(Debug, Clone, PartialEq)]
pub struct NewOperation {
    key: OperationKey,
    request: serde_json::Value,
    provider_key: String,
}

impl NewOperation {
    /// An operation with a provider key derived from its namespace, its
    /// identity and a random part drawn now: recorded before the first send,
    /// the key is then the same for every send, on every executor, after
    /// any crash, and no other journal, namespace or recreated store ever
    /// derives it.
    pub fn new(key: OperationKey, request: serde_json::Value) -> Self {
        let mut hasher = Sha256::new();
        for part in [
            key.namespace.as_str().as_bytes(),
            key.id.subject().as_bytes(),
            key.id.effect().as_bytes(),
            uuid::Uuid::new_v4().as_bytes(),
        ] {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        let digest = hasher.finalize();
        let provider_key = format!("idem-op-{}", hex::encode(&digest[..16]));
        Self {
            key,
            request,
            provider_key,
        }
    }

    /// Where it is kept.
    pub fn key(&self) -> &OperationKey {
        &self.key
    }

    /// What to ask the provider.
    pub fn request(&self) -> &serde_json::Value {
        &self.request
    }

    /// The provider's idempotency key.
    pub fn provider_key(&self) -> &str {
        &self.provider_key
    }

    /// An operation as a store read it back, with the provider key it was
    /// recorded with.
    pub fn from_stored(
        key: OperationKey,
        request: serde_json::Value,
        provider_key: String,
    ) -> Self {
        Self {
            key,
            request,
            provider_key,
        }
    }

    /// The record a store makes of it, at `now` by the store's clock.
    pub fn into_record(self, now: Timestamp) -> JournalRecord {
        JournalRecord::new(self, JournalParts::new(now))
    }
}

/// What changes in a journal record, apart: for stores that keep each field
/// in a column, a hash field or an attribute of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalParts {
    /// Where it stands.
    pub state: OperationState,
    /// The provider's id for the effect, once known.
    pub provider_id: Option<String>,
    /// The provider's last status, or why it could not settle.
    pub detail: Option<String>,
    /// When it was first sent: the start of the provider's key window.
    pub first_sent_at: Option<Timestamp>,
    /// How many times it was sent.
    pub sends: u32,
    /// When it was recorded.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
    /// The executor (or operator) that holds or last held it.
    pub lease_owner: Option<OwnerToken>,
    /// Until when it is held, while it is: `None` once released.
    pub lease_until: Option<Timestamp>,
    /// Until when a search that found nothing is made again.
    pub search_until: Option<Timestamp>,
}

impl JournalParts {
    /// A fresh record's: pending, never sent, recorded at `now`.
    pub fn new(now: Timestamp) -> Self {
        Self {
            state: OperationState::Pending,
            provider_id: None,
            detail: None,
            first_sent_at: None,
            sends: 0,
            created_at: now,
            updated_at: now,
            lease_owner: None,
            lease_until: None,
            search_until: None,
        }
    }
}

/// An operation as a journal store keeps it: what was recorded, and its
/// [`JournalParts`]. Every time in it is the store's clock's.
#[derive(Debug, Clone, PartialEq)]
pub struct JournalRecord {
    pub(crate) operation: NewOperation,
    pub(crate) parts: JournalParts,
}

impl JournalRecord {
    /// The record of `operation` with `parts`, as a store reads it back.
    pub fn new(operation: NewOperation, parts: JournalParts) -> Self {
        Self { operation, parts }
    }

    /// Where it is kept.
    pub fn key(&self) -> &OperationKey {
        &self.operation.key
    }

    /// The operation's identity.
    pub fn id(&self) -> &OperationId {
        &self.operation.key.id
    }

    /// What to ask the provider (the caller's JSON).
    pub fn request(&self) -> &serde_json::Value {
        &self.operation.request
    }

    /// The idempotency key sent to the provider with every send.
    pub fn provider_key(&self) -> &str {
        &self.operation.provider_key
    }

    /// What changes.
    pub fn parts(&self) -> &JournalParts {
        &self.parts
    }

    /// Where it stands.
    pub fn state(&self) -> OperationState {
        self.parts.state
    }

    /// Whether `owner` holds it at `now`.
    pub fn is_held_by(&self, owner: OwnerToken, now: Timestamp) -> bool {
        self.parts.lease_owner == Some(owner)
            && self.parts.lease_until.is_some_and(|until| until > now)
    }

    /// How long someone other than `owner` still holds it at `now`, if anyone does.
    pub fn held_by_other(&self, owner: OwnerToken, now: Timestamp) -> Option<Duration> {
        match (self.parts.lease_owner, self.parts.lease_until) {
            (Some(holder), Some(until)) if holder != owner && until > now => {
                Some(until.saturating_duration_since(now))
            }
            _ => None,
        }
    }

    /// The record taken by `owner` until `until`, at `now`.
    #[must_use]
    pub fn acquired(mut self, owner: OwnerToken, until: Timestamp, now: Timestamp) -> Self {
        self.parts.lease_owner = Some(owner);
        self.parts.lease_until = Some(until);
        self.parts.updated_at = self.parts.updated_at.max(now);
        self
    }

    /// The record with one more send, the first one starting the key window
    /// at `now`.
    #[must_use]
    pub fn sent(mut self, now: Timestamp) -> Self {
        self.parts.first_sent_at.get_or_insert(now);
        self.parts.sends = self.parts.sends.saturating_add(1);
        self.parts.updated_at = self.parts.updated_at.max(now);
        self
    }
}
