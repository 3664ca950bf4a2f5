//! An operation: a business effect at a provider, its durable identity,
//! and where it stands.

use std::fmt;

use idem_core::store::Timestamp;
use idem_core::{IdempotencyKey, InvalidInput, Tenant};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The business identity of an operation: what it is for (`order-42`) and
/// which effect (`charge`). Unique: asking for it twice gives the same
/// operation.
///
/// ```
/// use idem_journal::OperationId;
///
/// let id = OperationId::new("order-42", "charge")?;
/// // The key sent to the provider is derived from the identity alone: the
/// // same after a crash and a restart, on every executor.
/// assert_eq!(id.provider_key(), OperationId::new("order-42", "charge")?.provider_key());
/// assert_ne!(id.provider_key(), OperationId::new("order-42", "refund")?.provider_key());
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
        Tenant::new(subject)?;
        IdempotencyKey::new(effect)?;
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

    /// The idempotency key sent to the provider with every attempt: a hash
    /// of the identity (length-prefixed parts, so no two identities meet),
    /// never a random value held in memory.
    pub fn provider_key(&self) -> String {
        let mut hasher = Sha256::new();
        for part in [self.subject.as_bytes(), self.effect.as_bytes()] {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        let digest = hasher.finalize();
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        format!("idem-op-{hex}")
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
    /// Reconciliation could not settle it (no match, or several): a person
    /// must look.
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

    /// Every state, for listings.
    pub const ALL: [Self; 5] = [
        Self::Pending,
        Self::Unknown,
        Self::Succeeded,
        Self::Failed,
        Self::NeedsReview,
    ];
}

/// An operation as the journal keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Operation {
    /// Its identity.
    pub id: OperationId,
    /// What to ask the provider (the caller's JSON).
    pub request: serde_json::Value,
    /// Where it stands.
    pub state: OperationState,
    /// The provider's id for it, once known.
    pub provider_id: Option<String>,
    /// The provider's last status, or why it could not settle.
    pub detail: Option<String>,
    /// When it was first sent: the start of the provider's key window,
    /// recorded before the first send.
    pub first_sent_at_ms: Option<i64>,
    /// How many times it was sent.
    pub sends: u32,
    /// When it was recorded.
    pub created_at_ms: i64,
    /// When it last changed.
    pub updated_at_ms: i64,
    /// The executor holding it, and until when (epoch ms).
    pub(crate) lease: Option<(uuid::Uuid, i64)>,
}

impl Operation {
    pub(crate) fn new(id: OperationId, request: serde_json::Value, now: Timestamp) -> Self {
        Self {
            id,
            request,
            state: OperationState::Pending,
            provider_id: None,
            detail: None,
            first_sent_at_ms: None,
            sends: 0,
            created_at_ms: now.as_unix_millis(),
            updated_at_ms: now.as_unix_millis(),
            lease: None,
        }
    }

    /// The key sent to the provider (see [`OperationId::provider_key`]).
    pub fn provider_key(&self) -> String {
        self.id.provider_key()
    }
}
