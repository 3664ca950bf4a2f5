//! The provider: what the journal calls, and how its answers are read.

use std::time::Duration;

use idem_core::store::JournalRecord;
use idem_core::{InvalidInput, async_trait};

/// What the provider said, classified by whether the outcome is settled.
/// Ambiguity is never rounded to failure.
///
/// How common answers map (Stripe's words; other providers have the same):
///
/// | the provider answered | outcome |
/// |---|---|
/// | 2xx with a final status | [`Succeeded`](Self::Succeeded) |
/// | a decline, a validation error (4xx other than those below) | [`Failed`](Self::Failed) |
/// | 429, or an error it documents as "not processed" | [`NotExecuted`](Self::NotExecuted) |
/// | 409 "a request with this key is in progress" | [`Ambiguous`](Self::Ambiguous): the first request may still land; ask again later with the same key |
/// | 400 "keys can only be used with the same parameters" | [`KeyReused`](Self::KeyReused) |
/// | a timeout, a reset connection, a 5xx, "processing" | [`Ambiguous`](Self::Ambiguous) |
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
    /// connection, a 5xx, a 409 "in progress", or a status that is not final
    /// yet).
    Ambiguous {
        /// The provider's id, if the answer carried one.
        provider_id: Option<String>,
        /// Why.
        reason: String,
    },
    /// The provider refused the key as already used with other parameters:
    /// the key met another request (a provider-side mix-up, or a key reused
    /// by hand). Nothing is sent again; a person looks.
    KeyReused {
        /// What the provider said.
        reason: String,
    },
}

/// A provider's record that may be this operation's effect, from
/// [`Provider::find`].
///
/// ```
/// use idem_journal::{Match, ProviderOutcome};
///
/// let found = Match::new("ch_1", ProviderOutcome::Succeeded {
///     provider_id: "ch_1".into(),
///     status: "succeeded".into(),
/// })
/// .with_provider_key("idem-op-3f2a");
/// assert_eq!(found.provider_key.as_deref(), Some("idem-op-3f2a"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Match {
    /// The provider's id.
    pub provider_id: String,
    /// What it says of that effect.
    pub outcome: ProviderOutcome,
    /// The idempotency key the provider recorded for it, where it shows
    /// one: a match under another key is not this operation's, and the
    /// journal drops it.
    pub provider_key: Option<String>,
}

impl Match {
    /// The effect `provider_id`, saying `outcome`.
    pub fn new(provider_id: impl Into<String>, outcome: ProviderOutcome) -> Self {
        Self {
            provider_id: provider_id.into(),
            outcome,
            provider_key: None,
        }
    }

    /// The same, with the idempotency key the provider recorded for it.
    #[must_use]
    pub fn with_provider_key(mut self, key: impl Into<String>) -> Self {
        self.provider_key = Some(key.into());
        self
    }
}

/// How long a provider keeps an idempotency key from its first use, and the
/// margin before then at which the journal stops sending with it.
///
/// The journal measures from the first send by its store's clock. A store
/// clock that steps back (a failover to a replica behind, an NTP step)
/// makes less time seem to have passed: a step back longer than the margin
/// lets the journal send with a key the provider has already forgotten,
/// which is a second effect. The margin is the clock step the journal
/// survives; choose it above the largest you expect. Past `kept - margin`
/// the journal never sends again: [`Provider::find`] settles the operation.
///
/// ```
/// use std::time::Duration;
/// use idem_journal::KeyWindow;
///
/// let hour = Duration::from_secs(3600);
/// let keys = KeyWindow::new(24 * hour, 2 * hour)?;
/// assert_eq!(keys.sends_until(), 22 * hour);
/// assert_eq!(KeyWindow::STRIPE.margin(), hour);
/// // No margin, or none left to send in, is refused.
/// assert!(KeyWindow::new(24 * hour, Duration::ZERO).is_err());
/// assert!(KeyWindow::new(hour, hour).is_err());
/// # Ok::<(), idem_core::InvalidInput>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyWindow {
    kept: Duration,
    margin: Duration,
}

impl KeyWindow {
    /// Stripe's: keys kept 24 hours (it may prune them after that), a
    /// margin of one hour.
    pub const STRIPE: Self = Self {
        kept: Duration::from_secs(24 * 3600),
        margin: Duration::from_secs(3600),
    };

    /// A provider that keeps keys for `kept` from their first use, sent
    /// with only until `margin` before that.
    ///
    /// # Errors
    ///
    /// [`InvalidInput::OutOfRange`] for a margin of zero (any clock step
    /// back would send a second effect) or one that leaves no time to send.
    pub fn new(kept: Duration, margin: Duration) -> Result<Self, InvalidInput> {
        if margin.is_zero() {
            return Err(InvalidInput::OutOfRange {
                field: "key window margin",
                reason: "must be more than zero: a clock step back would send with a forgotten key",
            });
        }
        if margin >= kept {
            return Err(InvalidInput::OutOfRange {
                field: "key window margin",
                reason: "must be less than the time the provider keeps keys",
            });
        }
        Ok(Self { kept, margin })
    }

    /// How long the provider keeps a key from its first use.
    pub fn kept(&self) -> Duration {
        self.kept
    }

    /// The clock step back the journal survives.
    pub fn margin(&self) -> Duration {
        self.margin
    }

    /// How long after the first send the journal may send again with the
    /// key: the time kept, less the margin.
    pub fn sends_until(&self) -> Duration {
        self.kept.saturating_sub(self.margin)
    }
}

/// How an effect may be delivered: what the journal does after a send whose
/// outcome it does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Delivery {
    /// The provider keeps idempotency keys ([`KeyWindow`]): until the
    /// window's margin before it forgets one, an unknown operation is sent
    /// again with the same key; after, never ([`Provider::find`] settles
    /// it).
    Keyed(KeyWindow),
    /// The provider has no keys and the effect must not happen twice: sent
    /// once; a send whose outcome is unknown (and that left no provider id
    /// to retrieve) goes to review, never out again.
    AtMostOnce,
    /// The provider has no keys and the effect may happen twice (it is
    /// harmless or the receiver deduplicates): sent again until an answer
    /// settles it.
    AtLeastOnce,
}

impl Delivery {
    /// Stripe's: keys kept 24 hours, sent with until an hour before
    /// ([`KeyWindow::STRIPE`]).
    pub const STRIPE: Self = Self::Keyed(KeyWindow::STRIPE);
}

/// The provider the journal drives, implemented by the caller.
///
/// ```
/// use idem_journal::{async_trait, JournalRecord, Match, Provider, ProviderOutcome};
///
/// struct Payments;
///
/// #[async_trait]
/// impl Provider for Payments {
///     async fn send(&self, operation: &JournalRecord) -> ProviderOutcome {
///         // POST /charges with `Idempotency-Key: operation.provider_key()` and
///         // the operation's id in its metadata; map the answer.
///         let _ = (operation.id(), operation.request());
///         ProviderOutcome::Succeeded {
///             provider_id: format!("ch_{}", operation.provider_key()),
///             status: "succeeded".into(),
///         }
///     }
///     async fn retrieve(&self, provider_id: &str) -> ProviderOutcome {
///         ProviderOutcome::Ambiguous { provider_id: Some(provider_id.into()), reason: "processing".into() }
///     }
///     async fn find(&self, operation: &JournalRecord) -> Result<Vec<Match>, String> {
///         // Search by the metadata the request carried.
///         let _ = operation.key();
///         Ok(Vec::new())
///     }
/// }
/// ```
#[async_trait]
pub trait Provider: Send + Sync {
    /// Sends the operation's request with its idempotency key
    /// ([`JournalRecord::provider_key`]); its id and namespace are there to
    /// put in the request's metadata, for [`find`](Self::find).
    async fn send(&self, operation: &JournalRecord) -> ProviderOutcome;

    /// Asks for the effect by the provider's id, once known.
    async fn retrieve(&self, provider_id: &str) -> ProviderOutcome;

    /// Looks for effects made for this recorded operation (by the metadata
    /// its sends carried), for reconciliation once the key may be
    /// forgotten.
    ///
    /// # Errors
    ///
    /// The search could not be made (an answer of none is `Ok(vec![])`).
    async fn find(&self, operation: &JournalRecord) -> Result<Vec<Match>, String>;

    /// How this provider's effects are delivered (default:
    /// [`Delivery::STRIPE`], keys kept 24 hours, sent with until an hour
    /// before).
    fn delivery(&self) -> Delivery {
        Delivery::STRIPE
    }
}
