//! The provider: what the journal calls, and how its answers are read.

use std::time::Duration;

use idem_core::async_trait;

use crate::operation::OperationId;

/// What the provider said, classified by whether the outcome is settled.
/// Ambiguity is never rounded to failure.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProviderOutcome {
    /// A final success, with the provider's id and status. Only a final
    /// status counts: "processing" is [`Ambiguous`](Self::Ambiguous).
    Succeeded {
        /// The provider's id for the effect.
        provider_id: String,
        /// Its final status.
        status: String,
    },
    /// A final refusal (declined): nothing happened, nothing will.
    Failed {
        /// The provider's id, if it gave one.
        provider_id: Option<String>,
        /// Why.
        reason: String,
    },
    /// The provider did not act (rate limited): try again later, with the
    /// same key.
    NotExecuted {
        /// Why.
        reason: String,
    },
    /// The effect may or may not have happened (a timeout, a lost
    /// connection, a 5xx, or a status that is not final yet).
    Ambiguous {
        /// The provider's id, if the answer carried one.
        provider_id: Option<String>,
        /// Why.
        reason: String,
    },
}

/// A provider's record that may be this operation's effect, from
/// [`Provider::find`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Match {
    /// The provider's id.
    pub provider_id: String,
    /// What it says of that effect.
    pub outcome: ProviderOutcome,
}

/// The provider the journal drives, implemented by the caller.
///
/// ```
/// use idem_core::async_trait;
/// use idem_journal::{Match, OperationId, Provider, ProviderOutcome};
///
/// struct Payments;
///
/// #[async_trait]
/// impl Provider for Payments {
///     async fn send(&self, key: &str, request: &serde_json::Value) -> ProviderOutcome {
///         // POST /charges with `Idempotency-Key: key`; map the answer.
///         ProviderOutcome::Succeeded { provider_id: format!("ch_{key}"), status: "succeeded".into() }
///     }
///     async fn retrieve(&self, provider_id: &str) -> ProviderOutcome {
///         ProviderOutcome::Ambiguous { provider_id: Some(provider_id.into()), reason: "processing".into() }
///     }
///     async fn find(&self, operation: &OperationId, key: &str) -> Result<Vec<Match>, String> {
///         // Search by the metadata the request carried (our operation id).
///         Ok(Vec::new())
///     }
/// }
/// ```
#[async_trait]
pub trait Provider: Send + Sync {
    /// Sends the request with the operation's idempotency key.
    async fn send(&self, key: &str, request: &serde_json::Value) -> ProviderOutcome;

    /// Asks for the effect by the provider's id, once known.
    async fn retrieve(&self, provider_id: &str) -> ProviderOutcome;

    /// Looks for effects made for this operation (by our id, which the
    /// request carried), for reconciliation once the key may be forgotten.
    ///
    /// # Errors
    ///
    /// The search could not be made (an answer of none is `Ok(vec![])`).
    async fn find(&self, operation: &OperationId, key: &str) -> Result<Vec<Match>, String>;

    /// How long the provider keeps idempotency keys, measured from the first
    /// send. Within it an unknown operation is sent again with the same
    /// key; past it, never. Stripe may prune keys after 24 h: the default is
    /// 23 h.
    fn key_window(&self) -> Duration {
        Duration::from_secs(23 * 3600)
    }
}
