//! Everything the console does with an outbox, and the only module that
//! calls [`OutboxStore`]: its backlog (per partition where the store
//! reports partitions), its parked messages, one message, a retry and a
//! drop. A change of the store's trait is adapted here alone.

use std::sync::Arc;

use idem_core::InvalidInput;
use idem_core::store::{
    Clock, MessageId, MessageState, OutboxMessage, OutboxStore, SystemClock, Timestamp,
};
use serde::Serialize;

use crate::error::AdminError;
use crate::view::{Action, Done, Listing, Page, Payload, millis};

const PART: &str = "outbox";

/// The outbox's backlog at a glance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OutboxSummary {
    /// Messages waiting to be published.
    pub pending: u64,
    /// Messages parked: they wait for an operator, and so does every later
    /// message of their aggregate.
    pub parked: u64,
    /// How long the oldest pending message has waited, by the store's
    /// clock, in milliseconds.
    pub oldest_pending_age_ms: Option<u64>,
    /// The backlog of each partition, where the store reports partitions
    /// (every store of this version does).
    pub partitions: Vec<PartitionBacklog>,
}

/// One partition's backlog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PartitionBacklog {
    /// The partition.
    pub partition: String,
    /// Messages waiting in it.
    pub pending: u64,
    /// How long its oldest pending message has waited, in milliseconds.
    pub oldest_pending_age_ms: Option<u64>,
}

/// An outbox message as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OutboxMessageView {
    /// Its id (the broker message id).
    pub id: String,
    /// The aggregate whose changes it reports.
    pub aggregate: String,
    /// Its place in its aggregate.
    pub sequence: u64,
    /// Its type.
    pub kind: String,
    /// `pending` (in its partition's log), `waiting` (in its retry lane),
    /// `sent`, `parked` or `dropped`.
    pub state: &'static str,
    /// How many publishes failed.
    pub attempts: u32,
    /// The last failure, or the operator's reason to drop it.
    pub last_error: Option<String>,
    /// When it was enqueued (Unix milliseconds, the store's clock).
    pub enqueued_at: Timestamp,
    /// When it was sent or dropped.
    pub sent_at: Option<Timestamp>,
    /// Its headers.
    pub headers: Vec<(String, String)>,
    /// Its payload.
    pub payload: Payload,
}

impl OutboxMessageView {
    fn of(message: &OutboxMessage) -> Self {
        let parts = message.parts();
        let enqueued = message.message();
        Self {
            id: message.id().to_string(),
            aggregate: enqueued.aggregate().to_string(),
            sequence: parts.sequence,
            kind: enqueued.kind().to_string(),
            state: message.state().as_str(),
            attempts: parts.attempts,
            last_error: parts.last_error.clone(),
            enqueued_at: parts.enqueued_at,
            sent_at: parts.sent_at,
            headers: enqueued.headers().to_vec(),
            payload: Payload::of(enqueued.payload()),
        }
    }

    /// How long ago it was enqueued, by this process's clock, in
    /// milliseconds.
    pub fn age_ms(&self) -> u64 {
        millis(
            SystemClock
                .now()
                .saturating_duration_since(self.enqueued_at),
        )
    }
}

/// The outbox part of a console.
#[derive(Debug, Clone)]
pub(crate) struct OutboxPart {
    store: Arc<dyn OutboxStore>,
}

/// An outbox message id from its text.
pub(crate) fn message_id(text: &str) -> Result<MessageId, AdminError> {
    text.trim()
        .parse::<uuid::Uuid>()
        .map(MessageId::from_uuid)
        .map_err(|_| {
            AdminError::InvalidInput(InvalidInput::Malformed {
                field: "outbox message id",
                reason: "not a UUID".into(),
            })
        })
}

impl OutboxPart {
    pub(crate) fn new(store: Arc<dyn OutboxStore>) -> Self {
        Self { store }
    }

    pub(crate) async fn summary(&self) -> Result<OutboxSummary, AdminError> {
        let stats = self.store.stats().await.map_err(AdminError::store(PART))?;
        Ok(OutboxSummary {
            pending: stats.pending,
            parked: stats.parked,
            oldest_pending_age_ms: stats.oldest_pending_age.map(millis),
            partitions: stats
                .partitions
                .iter()
                .map(|p| PartitionBacklog {
                    partition: p.partition.to_string(),
                    pending: p.pending,
                    oldest_pending_age_ms: p.oldest_pending_age.map(millis),
                })
                .collect(),
        })
    }

    pub(crate) async fn parked(
        &self,
        page: Page,
    ) -> Result<Listing<OutboxMessageView>, AdminError> {
        let total = self.summary().await?.parked;
        let listed = self
            .store
            .parked(None, page.reach())
            .await
            .map_err(AdminError::store(PART))?;
        let views = listed.iter().map(OutboxMessageView::of).collect();
        Ok(page.of(views, total))
    }

    pub(crate) async fn message(&self, id: MessageId) -> Result<OutboxMessageView, AdminError> {
        self.stored(id)
            .await
            .map(|message| OutboxMessageView::of(&message))
    }

    async fn stored(&self, id: MessageId) -> Result<OutboxMessage, AdminError> {
        self.store
            .message(id)
            .await
            .map_err(AdminError::store(PART))?
            .ok_or_else(|| AdminError::NotFound {
                what: "outbox message".into(),
            })
    }

    /// Makes a parked message waiting again, due at once; a repeat answers
    /// the state the first left.
    pub(crate) async fn retry(&self, id: MessageId) -> Result<Done, AdminError> {
        if self
            .store
            .retry(id)
            .await
            .map_err(AdminError::store(PART))?
        {
            return Ok(Done::new(Action::OutboxRetry, true, "waiting", None));
        }
        let message = self.stored(id).await?;
        let last = message.parts().last_error.clone();
        match message.state() {
            MessageState::Dropped => Err(AdminError::Conflict(format!(
                "the message was dropped, not retried ({})",
                last.unwrap_or_default()
            ))),
            state => Ok(Done::new(Action::OutboxRetry, false, state.as_str(), last)),
        }
    }

    /// Drops a parked message with `reason`; a repeat answers the drop the
    /// first made.
    pub(crate) async fn drop_message(
        &self,
        id: MessageId,
        reason: &str,
    ) -> Result<Done, AdminError> {
        let dropped = self
            .store
            .drop_message(id, reason)
            .await
            .map_err(AdminError::store(PART))?;
        if dropped {
            return Ok(Done::new(
                Action::OutboxDrop,
                true,
                "dropped",
                Some(reason.to_string()),
            ));
        }
        let message = self.stored(id).await?;
        match message.state() {
            MessageState::Dropped => Ok(Done::new(
                Action::OutboxDrop,
                false,
                "dropped",
                message.parts().last_error.clone(),
            )),
            state => Err(AdminError::Conflict(format!(
                "the message is {}: only a parked message is dropped",
                state.as_str()
            ))),
        }
    }
}
