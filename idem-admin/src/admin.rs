//! The console's parts and what an operator does with them, whichever way
//! in: every action checked, traced with the operator and the target's
//! hash, and safe to repeat.

use std::collections::BTreeMap;
use std::sync::Arc;

use idem_core::store::{
    IdempotencyStore, JournalStore, OutboxStore, Record, RecordState, Timestamp,
};
use idem_core::{Idempotency, IdempotencyKey, InvalidInput};
use idem_journal::{Journal, OperationState};
use serde::Serialize;
use tracing::Instrument;

use crate::consumers::{ConsumerParking, ParkedView, StuckView};
use crate::error::AdminError;
use crate::journal::{JournalPart, OperationView, Settlement};
use crate::outbox::{OutboxMessageView, OutboxPart, OutboxSummary, message_id};
use crate::records::{RecordRef, RecordsPart};
use crate::security::Operator;
use crate::view::{Action, Done, Listing, Page};

/// The longest reason or note an operator gives, in bytes.
pub const MAX_REASON_BYTES: usize = 2_000;

/// The operator's console over whichever stores a service has: records,
/// an outbox, consumers' parked messages, journals; each optional, each on
/// any backend through the store traits.
///
/// Its methods are what the JSON API, the page and the `idem` command
/// line do. Its router exists only behind an authorization check of the
/// service's ([`authorize`](Self::authorize)).
///
/// ```
/// use std::sync::Arc;
/// use idem_admin::{Admin, Operator, Page};
/// use idem_core::Idempotency;
/// use idem_journal::Journal;
/// use idem_memory::{MemoryJournal, MemoryOutbox, MemoryStore};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let admin = Admin::new()
///     .records(Idempotency::new(Arc::new(MemoryStore::new())))
///     .outbox(Arc::new(MemoryOutbox::new()))
///     .journal(Journal::new(Arc::new(MemoryJournal::new()), "billing")?);
/// let parked = admin.outbox_parked(Page::default()).await?;
/// assert_eq!(parked.total, 0);
/// let summary = admin.summary().await;
/// assert_eq!(summary.journals[0].namespace, "billing");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone, Default)]
pub struct Admin {
    records: Option<RecordsPart>,
    outbox: Option<OutboxPart>,
    consumers: BTreeMap<String, ConsumerParking>,
    journals: BTreeMap<String, JournalPart>,
}

/// One part's figures, or why they could not be read: a store that is
/// down hides nothing of the others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Reading<T> {
    /// The figures.
    Read(T),
    /// The store's failure.
    Failed {
        /// What failed.
        error: String,
    },
}

impl<T> Reading<T> {
    fn of(result: Result<T, AdminError>) -> Self {
        match result {
            Ok(value) => Self::Read(value),
            Err(error) => Self::Failed {
                error: error.detail(),
            },
        }
    }

    /// The figures, if read.
    pub fn read(&self) -> Option<&T> {
        match self {
            Self::Read(value) => Some(value),
            Self::Failed { .. } => None,
        }
    }
}

/// Everything stuck, at a glance.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Summary {
    /// Whether records can be read and deleted here.
    pub records: bool,
    /// The outbox's backlog, if the console has an outbox.
    pub outbox: Option<Reading<OutboxSummary>>,
    /// Each consumer's parked messages, by name.
    pub consumers: Vec<ConsumerSummary>,
    /// Each journal's operations needing a person, by namespace.
    pub journals: Vec<JournalSummary>,
}

/// One consumer's parked messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ConsumerSummary {
    /// The consumer.
    pub name: String,
    /// Whether replays run here.
    pub replays: bool,
    /// Its figures.
    pub parked: Reading<ParkedFigures>,
}

/// How many messages a consumer has parked, and since when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ParkedFigures {
    /// How many.
    pub count: u64,
    /// When the oldest was parked (Unix milliseconds, the store's clock).
    pub oldest_parked_at: Option<Timestamp>,
}

/// One journal's operations needing a person.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct JournalSummary {
    /// The journal's namespace.
    pub namespace: String,
    /// Its figures.
    pub attention: Reading<AttentionFigures>,
}

/// How many operations of a journal need a person.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct AttentionFigures {
    /// Whose outcome is unknown.
    pub unknown: usize,
    /// Marked for review.
    pub needs_review: usize,
    /// Whether the counts are whole (`false`: they stop at the listing's
    /// 1,000).
    pub complete: bool,
    /// When the oldest of them last changed.
    pub oldest_change: Option<Timestamp>,
}

/// An operator's reason or note: 1 to [`MAX_REASON_BYTES`] bytes of text,
/// lines and tabs allowed, no other control characters.
pub(crate) fn reason(field: &'static str, text: &str) -> Result<String, InvalidInput> {
    let text = text.trim();
    if text.is_empty() {
        return Err(InvalidInput::Empty { field });
    }
    if text.len() > MAX_REASON_BYTES {
        return Err(InvalidInput::TooLong {
            field,
            len: text.len(),
            max: MAX_REASON_BYTES,
        });
    }
    if let Some((position, _)) = text
        .char_indices()
        .find(|(_, c)| c.is_control() && !matches!(c, '\n' | '\r' | '\t'))
    {
        return Err(InvalidInput::ControlCharacter { field, position });
    }
    Ok(text.to_string())
}

/// Runs `action` on `target` (its hash) for `operator`, inside a span of
/// its own, and traces what it did: never the key, always its hash.
async fn traced<T>(
    action: Action,
    operator: &Operator,
    target_hash: &str,
    reason: Option<&str>,
    run: impl Future<Output = Result<T, AdminError>>,
    changed: impl Fn(&T) -> (bool, &str),
) -> Result<T, AdminError> {
    let span = tracing::info_span!(
        "idem.admin",
        action = action.as_str(),
        target_hash,
        operator = operator.as_str(),
    );
    let result = run.instrument(span.clone()).await;
    let _entered = span.enter();
    match &result {
        Ok(value) => {
            let (changed, state) = changed(value);
            tracing::info!(
                target: "idem_admin",
                action = action.as_str(),
                target_hash,
                reason,
                operator = operator.as_str(),
                changed,
                state,
                "operator action"
            );
        }
        Err(error) => tracing::warn!(
            target: "idem_admin",
            action = action.as_str(),
            target_hash,
            reason,
            operator = operator.as_str(),
            error = error.kind(),
            status = error.status().as_u16(),
            "operator action refused"
        ),
    }
    result
}

/// A record's state's name, as its JSON has it.
pub(crate) fn record_state(record: &Record) -> &'static str {
    match record.state() {
        RecordState::InFlight { .. } => "in_flight",
        _ => "completed",
    }
}

fn done(done: &Done) -> (bool, &str) {
    (done.changed, &done.state)
}

impl Admin {
    /// A console with no part yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records, read and deleted through `idem`.
    #[must_use]
    pub fn records<S: IdempotencyStore + ?Sized>(mut self, idem: Idempotency<S>) -> Self {
        self.records = Some(RecordsPart::new(Arc::new(idem)));
        self
    }

    /// The outbox kept in `store`.
    #[must_use]
    pub fn outbox(mut self, store: Arc<dyn OutboxStore>) -> Self {
        self.outbox = Some(OutboxPart::new(store));
        self
    }

    /// A consumer's parked messages (one per consumer name: a second of
    /// one name replaces the first).
    #[must_use]
    pub fn consumer(mut self, parking: ConsumerParking) -> Self {
        self.consumers.insert(parking.name().to_string(), parking);
        self
    }

    /// A journal's operations needing a person (one per namespace).
    #[must_use]
    pub fn journal<S: JournalStore + ?Sized>(mut self, journal: Journal<S>) -> Self {
        let part = JournalPart::new(Arc::new(journal));
        self.journals
            .insert(part.namespace().as_str().to_string(), part);
        self
    }

    /// Whether records can be read here.
    pub fn has_records(&self) -> bool {
        self.records.is_some()
    }

    /// Whether there is an outbox here.
    pub fn has_outbox(&self) -> bool {
        self.outbox.is_some()
    }

    /// The consumers' names.
    pub fn consumers(&self) -> impl Iterator<Item = &str> {
        self.consumers.keys().map(String::as_str)
    }

    /// The journals' namespaces.
    pub fn journals(&self) -> impl Iterator<Item = &str> {
        self.journals.keys().map(String::as_str)
    }

    fn records_part(&self) -> Result<&RecordsPart, AdminError> {
        self.records.as_ref().ok_or_else(|| AdminError::Absent {
            part: "records".into(),
        })
    }

    fn outbox_part(&self) -> Result<&OutboxPart, AdminError> {
        self.outbox.as_ref().ok_or_else(|| AdminError::Absent {
            part: "outbox".into(),
        })
    }

    fn consumer_part(&self, name: &str) -> Result<&ConsumerParking, AdminError> {
        self.consumers.get(name).ok_or_else(|| AdminError::Absent {
            part: format!("consumer {name:?}"),
        })
    }

    fn journal_part(&self, namespace: &str) -> Result<&JournalPart, AdminError> {
        self.journals
            .get(namespace)
            .ok_or_else(|| AdminError::Absent {
                part: format!("journal {namespace:?}"),
            })
    }

    /// Every part's figures; a part whose store fails says so.
    pub async fn summary(&self) -> Summary {
        let outbox = match &self.outbox {
            Some(outbox) => Some(Reading::of(outbox.summary().await)),
            None => None,
        };
        let mut consumers = Vec::with_capacity(self.consumers.len());
        for (name, part) in &self.consumers {
            let figures = async {
                let count = part.count().await?;
                let oldest = part.oldest().await?.map(|view| view.parked_at);
                Ok(ParkedFigures {
                    count,
                    oldest_parked_at: oldest,
                })
            };
            consumers.push(ConsumerSummary {
                name: name.clone(),
                replays: part.replays(),
                parked: Reading::of(figures.await),
            });
        }
        let mut journals = Vec::with_capacity(self.journals.len());
        for (namespace, part) in &self.journals {
            let figures = async {
                let listed = part.attention(idem_core::store::MAX_LIST).await?;
                let count = |state| listed.iter().filter(|op| op.state == state).count();
                Ok(AttentionFigures {
                    unknown: count(OperationState::Unknown),
                    needs_review: count(OperationState::NeedsReview),
                    complete: listed.len() < idem_core::store::MAX_LIST,
                    oldest_change: listed.first().map(|op| op.updated_at),
                })
            };
            journals.push(JournalSummary {
                namespace: namespace.clone(),
                attention: Reading::of(figures.await),
            });
        }
        Summary {
            records: self.records.is_some(),
            outbox,
            consumers,
            journals,
        }
    }

    /// The record of `record`'s tenant and key (traced: keys can be
    /// personal data).
    ///
    /// # Errors
    ///
    /// [`AdminError::NotFound`] when none is live; [`AdminError::Absent`]
    /// without records; bad names; the store's.
    pub async fn read_record(
        &self,
        operator: &Operator,
        record: &RecordRef,
    ) -> Result<Record, AdminError> {
        let hash = idem_core::redacted(&record.key);
        let run = async {
            let scope = record.scope()?;
            self.records_part()?.read(&scope).await
        };
        traced(Action::RecordRead, operator, &hash, None, run, |record| {
            (false, record_state(record))
        })
        .await
    }

    /// Deletes the record of `record`'s tenant and key.
    ///
    /// # Errors
    ///
    /// As [`read_record`](Self::read_record), but none found is an answer
    /// (`changed: false`, `absent`).
    pub async fn delete_record(
        &self,
        operator: &Operator,
        record: &RecordRef,
    ) -> Result<Done, AdminError> {
        let hash = idem_core::redacted(&record.key);
        let run = async {
            let scope = record.scope()?;
            self.records_part()?.delete(&scope).await
        };
        traced(Action::RecordDelete, operator, &hash, None, run, done).await
    }

    /// The outbox's backlog.
    ///
    /// # Errors
    ///
    /// [`AdminError::Absent`] without an outbox; the store's.
    pub async fn outbox_summary(&self) -> Result<OutboxSummary, AdminError> {
        self.outbox_part()?.summary().await
    }

    /// A page of the outbox's parked messages, oldest first.
    ///
    /// # Errors
    ///
    /// As [`outbox_summary`](Self::outbox_summary).
    pub async fn outbox_parked(
        &self,
        page: Page,
    ) -> Result<Listing<OutboxMessageView>, AdminError> {
        self.outbox_part()?.parked(page).await
    }

    /// The outbox message `id`, in any state.
    ///
    /// # Errors
    ///
    /// [`AdminError::NotFound`]; a malformed id; as
    /// [`outbox_summary`](Self::outbox_summary).
    pub async fn outbox_message(&self, id: &str) -> Result<OutboxMessageView, AdminError> {
        self.outbox_part()?.message(message_id(id)?).await
    }

    /// Makes the parked outbox message `id` pending again, in its place.
    ///
    /// # Errors
    ///
    /// [`AdminError::NotFound`]; [`AdminError::Conflict`] for a dropped
    /// message; as [`outbox_summary`](Self::outbox_summary).
    pub async fn retry_outbox(&self, operator: &Operator, id: &str) -> Result<Done, AdminError> {
        let hash = idem_core::redacted(id);
        let run = async { self.outbox_part()?.retry(message_id(id)?).await };
        traced(Action::OutboxRetry, operator, &hash, None, run, done).await
    }

    /// Drops the outbox message `id` with `reason`, so its aggregate flows
    /// again.
    ///
    /// # Errors
    ///
    /// [`AdminError::NotFound`]; [`AdminError::Conflict`] for a sent
    /// message; a missing reason; as [`outbox_summary`](Self::outbox_summary).
    pub async fn drop_outbox(
        &self,
        operator: &Operator,
        id: &str,
        reason: &str,
    ) -> Result<Done, AdminError> {
        let hash = idem_core::redacted(id);
        let run = async {
            let reason = self::reason("reason", reason)?;
            self.outbox_part()?
                .drop_message(message_id(id)?, &reason)
                .await
        };
        traced(Action::OutboxDrop, operator, &hash, Some(reason), run, done).await
    }

    /// A page of `consumer`'s parked messages, oldest first.
    ///
    /// # Errors
    ///
    /// [`AdminError::Absent`] for a consumer not here; the store's.
    pub async fn consumer_parked(
        &self,
        consumer: &str,
        page: Page,
    ) -> Result<Listing<ParkedView>, AdminError> {
        self.consumer_part(consumer)?.parked(page).await
    }

    /// `consumer`'s aggregates stuck behind a version gap: each oldest
    /// parked version waiting for one that no parked message holds (found
    /// among the oldest parked messages the page reaches).
    ///
    /// # Errors
    ///
    /// [`AdminError::Absent`] for a consumer not given; the parking store's.
    pub async fn consumer_stuck(
        &self,
        consumer: &str,
        page: Page,
    ) -> Result<Listing<StuckView>, AdminError> {
        self.consumer_part(consumer)?.stuck(page).await
    }

    /// Replays `consumer`'s parked message `id` through its handler.
    ///
    /// # Errors
    ///
    /// [`AdminError::ReplayNeedsHandler`] where the consumer was not given;
    /// [`AdminError::NotFound`]; [`AdminError::Conflict`] for a dropped
    /// message; [`AdminError::Busy`] while a delivery of it is handled.
    pub async fn replay(
        &self,
        operator: &Operator,
        consumer: &str,
        id: &str,
    ) -> Result<Done, AdminError> {
        let hash = idem_core::redacted(id);
        let run = async {
            let id = IdempotencyKey::new(id)?;
            self.consumer_part(consumer)?.replay(&id).await
        };
        traced(Action::ConsumerReplay, operator, &hash, None, run, done).await
    }

    /// Drops `consumer`'s parked message `id` with `reason`.
    ///
    /// # Errors
    ///
    /// [`AdminError::NotFound`]; [`AdminError::Conflict`] for a replayed
    /// message; a missing reason; the store's.
    pub async fn drop_parked(
        &self,
        operator: &Operator,
        consumer: &str,
        id: &str,
        reason: &str,
    ) -> Result<Done, AdminError> {
        let hash = idem_core::redacted(id);
        let run = async {
            let reason = self::reason("reason", reason)?;
            let id = IdempotencyKey::new(id)?;
            self.consumer_part(consumer)?
                .drop_parked(&id, &reason)
                .await
        };
        traced(
            Action::ConsumerDrop,
            operator,
            &hash,
            Some(reason),
            run,
            done,
        )
        .await
    }

    /// The operations of the journal `namespace` whose outcome is unknown
    /// or that need review, oldest change first, at most `limit` (1 to
    /// 1,000).
    ///
    /// # Errors
    ///
    /// [`AdminError::Absent`] for a journal not here; the store's.
    pub async fn attention(
        &self,
        namespace: &str,
        limit: usize,
    ) -> Result<Vec<OperationView>, AdminError> {
        self.journal_part(namespace)?.attention(limit).await
    }

    /// Settles an operation of the journal `namespace` with the provider's
    /// answer. Repeated with the same answer, it answers what the first
    /// did; refused while an executor holds the operation.
    ///
    /// # Errors
    ///
    /// [`AdminError::NotFound`]; [`AdminError::Conflict`] for one settled
    /// otherwise; [`AdminError::Busy`] while an executor holds it; a
    /// missing note.
    pub async fn settle(
        &self,
        operator: &Operator,
        namespace: &str,
        settlement: &Settlement,
    ) -> Result<Done, AdminError> {
        let hash = idem_core::redacted(&format!("{}/{}", settlement.subject, settlement.effect));
        let run = async {
            let note = self::reason("note", &settlement.note)?;
            let settlement = Settlement {
                note,
                ..settlement.clone()
            };
            self.journal_part(namespace)?.settle(&settlement).await
        };
        let note = Some(settlement.note.as_str());
        traced(Action::JournalSettle, operator, &hash, note, run, done).await
    }
}
