//! A journal's operations that need a person: those whose outcome is
//! unknown and those marked for review, listed oldest change first and
//! settled with the provider's answer.

use std::fmt;
use std::sync::Arc;

use idem_core::store::{JournalStore, ListQuery, MAX_LIST, Timestamp};
use idem_core::{InvalidInput, Tenant, async_trait};
use idem_journal::{Journal, JournalError, JournalRecord, OperationId, OperationState};
use serde::{Deserialize, Serialize};

use crate::error::AdminError;
use crate::view::{Action, Done};

const PART: &str = "journal";

/// The states an operator looks at: the outcome is unknown, or the
/// journal could not settle it.
pub(crate) const ATTENTION: [OperationState; 2] =
    [OperationState::Unknown, OperationState::NeedsReview];

/// What the console needs of an `idem_journal::Journal`, whatever its store.
#[async_trait]
pub(crate) trait Operations: Send + Sync + fmt::Debug + 'static {
    fn namespace(&self) -> &Tenant;
    async fn get(&self, id: &OperationId) -> Result<Option<JournalRecord>, JournalError>;
    async fn list(&self, query: &ListQuery) -> Result<Vec<JournalRecord>, JournalError>;
    async fn settle(
        &self,
        id: &OperationId,
        state: OperationState,
        provider_id: Option<String>,
        note: &str,
    ) -> Result<JournalRecord, JournalError>;
}

#[async_trait]
impl<S: JournalStore + ?Sized> Operations for Journal<S> {
    fn namespace(&self) -> &Tenant {
        Journal::namespace(self)
    }

    async fn get(&self, id: &OperationId) -> Result<Option<JournalRecord>, JournalError> {
        Journal::get(self, id).await
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<JournalRecord>, JournalError> {
        self.store().list(query).await.map_err(JournalError::Store)
    }

    async fn settle(
        &self,
        id: &OperationId,
        state: OperationState,
        provider_id: Option<String>,
        note: &str,
    ) -> Result<JournalRecord, JournalError> {
        Journal::settle(self, id, state, provider_id, note).await
    }
}

/// An operation as an operator sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct OperationView {
    /// The journal's namespace.
    pub namespace: String,
    /// What it is for (`order-42`).
    pub subject: String,
    /// Which effect (`charge`).
    pub effect: String,
    /// `pending`, `unknown`, `succeeded`, `failed` or `needs_review`.
    pub state: OperationState,
    /// The provider's last status, or why it could not settle.
    pub detail: Option<String>,
    /// The provider's id for the effect, once known.
    pub provider_id: Option<String>,
    /// The idempotency key the provider got with every send: search the
    /// provider's dashboard by it.
    pub provider_key: String,
    /// How many times it was sent.
    pub sends: u32,
    /// What was asked of the provider.
    pub request: serde_json::Value,
    /// When it was recorded (Unix milliseconds, the store's clock).
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
    /// Until when an executor holds it, while one does.
    pub held_until: Option<Timestamp>,
}

impl OperationView {
    pub(crate) fn of(record: &JournalRecord) -> Self {
        let parts = record.parts();
        Self {
            namespace: record.key().namespace().as_str().to_string(),
            subject: record.id().subject().to_string(),
            effect: record.id().effect().to_string(),
            state: record.state(),
            detail: parts.detail.clone(),
            provider_id: parts.provider_id.clone(),
            provider_key: record.provider_key().to_string(),
            sends: parts.sends,
            request: record.request().clone(),
            created_at: parts.created_at,
            updated_at: parts.updated_at,
            held_until: parts.lease_until,
        }
    }
}

/// The provider's answer an operator settles an operation with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The provider acted: it succeeded.
    Succeeded,
    /// The provider refused: nothing happened.
    Failed,
}

impl Outcome {
    /// The journal's state for it.
    pub fn state(self) -> OperationState {
        match self {
            Self::Succeeded => OperationState::Succeeded,
            Self::Failed => OperationState::Failed,
        }
    }

    /// The outcome named `name` (`succeeded`, `failed`).
    ///
    /// ```
    /// use idem_admin::Outcome;
    ///
    /// assert_eq!(Outcome::parse("failed"), Some(Outcome::Failed));
    /// assert_eq!(Outcome::parse("unknown"), None);
    /// ```
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "succeeded" => Some(Self::Succeeded),
            "failed" => Some(Self::Failed),
            _ => None,
        }
    }
}

/// An operator's settlement of one operation.
///
/// ```
/// use idem_admin::{Outcome, Settlement};
///
/// let settle: Settlement = serde_json::from_str(
///     r#"{"subject":"order-42","effect":"charge","outcome":"succeeded","provider_id":"ch_1","note":"seen in the dashboard"}"#,
/// )?;
/// assert_eq!(settle.outcome, Outcome::Succeeded);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct Settlement {
    /// What the operation is for.
    pub subject: String,
    /// Which effect.
    pub effect: String,
    /// The provider's answer.
    pub outcome: Outcome,
    /// The provider's id for the effect, if it has one.
    #[serde(default)]
    pub provider_id: Option<String>,
    /// Why (what the operator saw): kept in the operation's detail.
    pub note: String,
}

impl Settlement {
    /// `outcome` of the operation `subject`/`effect`, with `note`.
    pub fn new(subject: &str, effect: &str, outcome: Outcome, note: &str) -> Self {
        Self {
            subject: subject.to_string(),
            effect: effect.to_string(),
            outcome,
            provider_id: None,
            note: note.to_string(),
        }
    }

    /// The same with the provider's id.
    #[must_use]
    pub fn with_provider_id(mut self, provider_id: Option<String>) -> Self {
        self.provider_id = provider_id.filter(|id| !id.is_empty());
        self
    }

    /// The operation's id.
    pub(crate) fn id(&self) -> Result<OperationId, InvalidInput> {
        OperationId::new(&self.subject, &self.effect)
    }
}

/// A journal part of a console.
#[derive(Debug, Clone)]
pub(crate) struct JournalPart {
    journal: Arc<dyn Operations>,
}

impl JournalPart {
    pub(crate) fn new(journal: Arc<dyn Operations>) -> Self {
        Self { journal }
    }

    pub(crate) fn namespace(&self) -> &Tenant {
        self.journal.namespace()
    }

    /// Operations needing a person, oldest change first, at most `limit`
    /// (1 to 1,000).
    pub(crate) async fn attention(&self, limit: usize) -> Result<Vec<OperationView>, AdminError> {
        if !(1..=MAX_LIST).contains(&limit) {
            return Err(AdminError::InvalidInput(InvalidInput::OutOfRange {
                field: "limit",
                reason: "must be 1 to 1000",
            }));
        }
        let query = ListQuery::new(self.namespace().clone(), &ATTENTION).limit(limit);
        let listed = self.journal.list(&query).await.map_err(journal_error)?;
        Ok(listed.iter().map(OperationView::of).collect())
    }

    /// Settles an operation; a repeat with the same answer answers what
    /// the first did.
    pub(crate) async fn settle(&self, settlement: &Settlement) -> Result<Done, AdminError> {
        let id = settlement.id()?;
        let wanted = settlement.outcome.state();
        let settled = self
            .journal
            .settle(
                &id,
                wanted,
                settlement.provider_id.clone(),
                &settlement.note,
            )
            .await;
        match settled {
            Ok(record) => Ok(Done::new(
                Action::JournalSettle,
                true,
                record.state().as_str(),
                record.parts().detail.clone(),
            )),
            Err(JournalError::Settled { state, .. }) if state == wanted => {
                let record = self.journal.get(&id).await.map_err(journal_error)?;
                let detail = record.and_then(|record| record.parts().detail.clone());
                Ok(Done::new(
                    Action::JournalSettle,
                    false,
                    state.as_str(),
                    detail,
                ))
            }
            Err(error) => Err(journal_error(error)),
        }
    }
}

fn journal_error(error: JournalError) -> AdminError {
    match error {
        JournalError::NotFound(_) => AdminError::NotFound {
            what: "operation".into(),
        },
        JournalError::Settled { state, .. } => AdminError::Conflict(format!(
            "the operation is settled as {} already",
            state.as_str()
        )),
        JournalError::Busy { retry_after, .. } => AdminError::Busy {
            detail: "an executor holds the operation (a send may be in flight)".into(),
            retry_after,
        },
        JournalError::InvalidInput(input) => AdminError::InvalidInput(input),
        JournalError::Store(source) => AdminError::store(PART)(source),
        other => AdminError::Internal {
            part: PART,
            source: other.into(),
        },
    }
}
