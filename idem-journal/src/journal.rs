//! The journal: records an operation before its side effect, drives it to a
//! settled state through the provider, and reconciles what stayed unknown.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{Clock, SystemClock, Timestamp};

use crate::error::JournalError;
use crate::operation::{Operation, OperationId, OperationState};
use crate::provider::{Provider, ProviderOutcome};
use crate::store::{JournalStore, Versioned};

/// How many times a write is retried when a concurrent write got there first.
const CAS_LAPS: usize = 32;

/// The operation journal over a store.
///
/// ```
/// use std::sync::Arc;
/// use idem_core::async_trait;
/// use idem_journal::{Journal, Match, MemoryJournal, OperationId, OperationState, Provider, ProviderOutcome};
///
/// struct Approves;
///
/// #[async_trait]
/// impl Provider for Approves {
///     async fn send(&self, key: &str, _: &serde_json::Value) -> ProviderOutcome {
///         ProviderOutcome::Succeeded { provider_id: format!("ch_{key}"), status: "succeeded".into() }
///     }
///     async fn retrieve(&self, id: &str) -> ProviderOutcome {
///         ProviderOutcome::Succeeded { provider_id: id.into(), status: "succeeded".into() }
///     }
///     async fn find(&self, _: &OperationId, _: &str) -> Result<Vec<Match>, String> {
///         Ok(Vec::new())
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let journal = Journal::new(Arc::new(MemoryJournal::new()));
/// let id = OperationId::new("order-42", "charge")?;
/// // Recorded before the side effect; asking twice gives the same operation.
/// journal.record(&id, serde_json::json!({"amount": 1000})).await?;
/// let charged = journal.execute(&id, &Approves).await?;
/// assert_eq!(charged.state, OperationState::Succeeded);
/// // Settled: never sent again.
/// assert_eq!(journal.execute(&id, &Approves).await?.sends, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct Journal<S: ?Sized> {
    store: Arc<S>,
    clock: Arc<dyn Clock>,
    lease: Duration,
}

impl<S: ?Sized> Clone for Journal<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            clock: Arc::clone(&self.clock),
            lease: self.lease,
        }
    }
}

impl<S: JournalStore + ?Sized> fmt::Debug for Journal<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Journal")
            .field("store", &self.store)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// What one reconciliation pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reconciled {
    /// Operations looked at.
    pub examined: usize,
    /// Of those, settled now.
    pub settled: usize,
    /// Of those, marked for review.
    pub needs_review: usize,
    /// Of those, still unknown or pending (a later pass tries again).
    pub open: usize,
    /// Of those, held by another executor and left alone.
    pub busy: usize,
}

impl<S: JournalStore + ?Sized> Journal<S> {
    /// A journal on `store`, with the system clock and a 30 s executor lease.
    pub fn new(store: Arc<S>) -> Self {
        Self {
            store,
            clock: Arc::new(SystemClock),
            lease: Duration::from_secs(30),
        }
    }

    /// Judges leases and key windows by `clock` (tests inject a manual one).
    #[must_use]
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// How long an executor holds an operation; a crashed executor's
    /// operation is taken over once it has passed (default 30 s).
    #[must_use]
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    pub(crate) fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Records the operation `id` with `request`, before any side effect.
    /// Asking twice gives the same operation.
    ///
    /// # Errors
    ///
    /// [`JournalError::Mismatch`] if `id` exists with another request;
    /// [`JournalError::Store`] when the store fails.
    pub async fn record(
        &self,
        id: &OperationId,
        request: serde_json::Value,
    ) -> Result<Operation, JournalError> {
        let fresh = Operation::new(id.clone(), request, self.now());
        let stored = self.store.insert_if_absent(&fresh).await?.operation;
        if stored.request != fresh.request {
            return Err(JournalError::Mismatch(id.clone()));
        }
        Ok(stored)
    }

    /// The operation `id`, if recorded.
    ///
    /// # Errors
    ///
    /// [`JournalError::Store`] when the store fails.
    pub async fn get(&self, id: &OperationId) -> Result<Option<Operation>, JournalError> {
        Ok(self.store.get(id).await?.map(|v| v.operation))
    }

    /// Applies `change` to the stored operation and writes it back, again
    /// from a fresh read whenever a concurrent write got there first.
    async fn update(
        &self,
        id: &OperationId,
        mut change: impl FnMut(&mut Operation) -> Result<(), JournalError>,
    ) -> Result<Operation, JournalError> {
        for _ in 0..CAS_LAPS {
            let Versioned {
                mut operation,
                version,
            } = self
                .store
                .get(id)
                .await?
                .ok_or_else(|| JournalError::NotFound(id.clone()))?;
            change(&mut operation)?;
            operation.updated_at_ms = self.now().as_unix_millis().max(operation.updated_at_ms);
            if self.store.compare_and_set(version, &operation).await? {
                return Ok(operation);
            }
        }
        Err(JournalError::store(
            "journal",
            format!("operation {id} kept changing under {CAS_LAPS} attempts to write it"),
        ))
    }

    /// Drives the operation `id` one step toward a settled state, calling
    /// the provider at most once, under an executor lease so that one
    /// executor sends at a time:
    ///
    /// - settled (or waiting for review): returned as it is, no call;
    /// - the provider's id known: retrieved, never sent again;
    /// - within the provider's key window (from the first send, which is
    ///   recorded before it happens): sent, with the same key every time;
    /// - past the window: never sent; `find` settles it, and no match or
    ///   several mark it for review.
    ///
    /// # Errors
    ///
    /// [`JournalError::NotFound`]; [`JournalError::Busy`] if another
    /// executor holds it; [`JournalError::LostLease`] if one took it over
    /// meanwhile; [`JournalError::Store`] when the store fails.
    pub async fn execute(
        &self,
        id: &OperationId,
        provider: &(impl Provider + ?Sized),
    ) -> Result<Operation, JournalError> {
        let me = uuid::Uuid::new_v4();
        let now = self.now();
        let until = (now + self.lease).as_unix_millis();
        let done =
            |op: &Operation| op.state.is_settled() || op.state == OperationState::NeedsReview;
        let current = self
            .get(id)
            .await?
            .ok_or_else(|| JournalError::NotFound(id.clone()))?;
        // Settled, or waiting for a person: nothing to send, nothing to write.
        if done(&current) {
            return Ok(current);
        }
        let mut finished = None;
        let held = self
            .update(id, |op| {
                if done(op) {
                    finished = Some(op.clone());
                    return Err(JournalError::Busy(id.clone()));
                }
                match op.lease {
                    Some((owner, expires)) if owner != me && expires > now.as_unix_millis() => {
                        Err(JournalError::Busy(id.clone()))
                    }
                    _ => {
                        op.lease = Some((me, until));
                        Ok(())
                    }
                }
            })
            .await;
        let held = match (held, finished) {
            // Settled by another executor since the read above.
            (_, Some(finished)) => return Ok(finished),
            (held, None) => held?,
        };
        let key = held.provider_key();
        let window = provider.key_window();
        let outcome = if let Some(provider_id) = &held.provider_id {
            provider.retrieve(provider_id).await
        } else if held
            .first_sent_at_ms
            .is_none_or(|first| now < Timestamp::from_unix_millis(first) + window)
        {
            // The attempt is recorded before the side effect: a crash after
            // it leaves a record that the next executor resends, same key.
            let sending = self
                .update(id, |op| {
                    owned(op, me)?;
                    op.first_sent_at_ms.get_or_insert(now.as_unix_millis());
                    op.sends += 1;
                    Ok(())
                })
                .await?;
            provider.send(&key, &sending.request).await
        } else {
            return self.reconcile_past_window(id, me, &key, provider).await;
        };
        self.settle_with(id, me, outcome).await
    }

    /// Past the key window a send could repeat the effect: find it instead.
    async fn reconcile_past_window(
        &self,
        id: &OperationId,
        me: uuid::Uuid,
        key: &str,
        provider: &(impl Provider + ?Sized),
    ) -> Result<Operation, JournalError> {
        match provider.find(id, key).await {
            Ok(matches) if matches.len() == 1 => {
                let found = matches.into_iter().next().map(|m| match m.outcome {
                    // The effect exists: an unfinished one is still unknown,
                    // now with an id to retrieve.
                    ProviderOutcome::NotExecuted { reason } => ProviderOutcome::Ambiguous {
                        provider_id: Some(m.provider_id),
                        reason,
                    },
                    outcome => outcome,
                });
                match found {
                    Some(outcome) => self.settle_with(id, me, outcome).await,
                    None => {
                        self.review(id, me, "no effect found past the key window".into())
                            .await
                    }
                }
            }
            Ok(matches) if matches.is_empty() => {
                self.review(id, me, "no effect found past the key window".into())
                    .await
            }
            Ok(matches) => {
                let ids: Vec<&str> = matches.iter().map(|m| m.provider_id.as_str()).collect();
                self.review(
                    id,
                    me,
                    format!("{} effects found: {}", ids.len(), ids.join(", ")),
                )
                .await
            }
            Err(reason) => {
                self.update(id, |op| {
                    owned(op, me)?;
                    op.lease = None;
                    op.detail = Some(format!("search failed: {reason}"));
                    Ok(())
                })
                .await
            }
        }
    }

    async fn review(
        &self,
        id: &OperationId,
        me: uuid::Uuid,
        why: String,
    ) -> Result<Operation, JournalError> {
        self.update(id, |op| {
            owned(op, me)?;
            op.state = OperationState::NeedsReview;
            op.detail = Some(why.clone());
            op.lease = None;
            Ok(())
        })
        .await
    }

    /// Records what the provider said and frees the operation.
    async fn settle_with(
        &self,
        id: &OperationId,
        me: uuid::Uuid,
        outcome: ProviderOutcome,
    ) -> Result<Operation, JournalError> {
        self.update(id, |op| {
            owned(op, me)?;
            op.lease = None;
            match &outcome {
                ProviderOutcome::Succeeded {
                    provider_id,
                    status,
                } => {
                    op.state = OperationState::Succeeded;
                    op.provider_id = Some(provider_id.clone());
                    op.detail = Some(status.clone());
                }
                ProviderOutcome::Failed {
                    provider_id,
                    reason,
                } => {
                    op.state = OperationState::Failed;
                    if provider_id.is_some() {
                        op.provider_id.clone_from(provider_id);
                    }
                    op.detail = Some(reason.clone());
                }
                // Nothing happened: the state stays, the same key goes later.
                ProviderOutcome::NotExecuted { reason } => {
                    op.detail = Some(reason.clone());
                }
                // Never rounded to failure: find out.
                ProviderOutcome::Ambiguous {
                    provider_id,
                    reason,
                } => {
                    op.state = OperationState::Unknown;
                    if provider_id.is_some() {
                        op.provider_id.clone_from(provider_id);
                    }
                    op.detail = Some(reason.clone());
                }
            }
            Ok(())
        })
        .await
    }

    /// Drives up to `batch` operations that stayed pending or unknown for
    /// longer than `older_than`, oldest first, waiting `pace` between them
    /// (the provider's rate), each toward a settled state or review.
    ///
    /// # Errors
    ///
    /// [`JournalError::Store`] when the store fails.
    pub async fn reconcile(
        &self,
        provider: &(impl Provider + ?Sized),
        older_than: Duration,
        batch: usize,
        pace: Duration,
    ) -> Result<Reconciled, JournalError> {
        let cutoff = (self.now() - older_than).as_unix_millis();
        let open = self
            .store
            .list(
                &[OperationState::Pending, OperationState::Unknown],
                cutoff,
                batch,
            )
            .await?;
        let mut report = Reconciled::default();
        for (i, op) in open.iter().enumerate() {
            if i > 0 && !pace.is_zero() {
                tokio::time::sleep(pace).await;
            }
            report.examined += 1;
            match self.execute(&op.id, provider).await {
                Ok(done) if done.state.is_settled() => report.settled += 1,
                Ok(done) if done.state == OperationState::NeedsReview => report.needs_review += 1,
                Ok(_) => report.open += 1,
                Err(JournalError::Busy(_) | JournalError::LostLease(_)) => report.busy += 1,
                Err(error) => return Err(error),
            }
        }
        Ok(report)
    }

    /// Operations waiting for a person, oldest first.
    ///
    /// # Errors
    ///
    /// [`JournalError::Store`] when the store fails.
    pub async fn needs_review(&self, limit: usize) -> Result<Vec<Operation>, JournalError> {
        self.store
            .list(&[OperationState::NeedsReview], i64::MAX, limit)
            .await
    }

    /// Settles an operation by hand (an operator who checked the provider's
    /// dashboard): `Succeeded` or `Failed`, with a note and the provider's id
    /// if there is one.
    ///
    /// # Errors
    ///
    /// [`JournalError::InvalidInput`] for a state that is not settled;
    /// [`JournalError::Settled`] if it is settled already.
    pub async fn settle(
        &self,
        id: &OperationId,
        state: OperationState,
        provider_id: Option<String>,
        note: &str,
    ) -> Result<Operation, JournalError> {
        if !state.is_settled() {
            return Err(JournalError::InvalidInput(
                idem_core::InvalidInput::OutOfRange {
                    field: "state",
                    reason: "an operator settles an operation as succeeded or failed",
                },
            ));
        }
        self.update(id, |op| {
            if op.state.is_settled() {
                return Err(JournalError::Settled {
                    id: id.clone(),
                    state: op.state,
                });
            }
            op.state = state;
            if provider_id.is_some() {
                op.provider_id.clone_from(&provider_id);
            }
            op.detail = Some(format!("settled by hand: {note}"));
            op.lease = None;
            Ok(())
        })
        .await
    }
}

/// The operation is still this executor's, and not settled (nothing
/// overwrites a settled state).
fn owned(op: &Operation, me: uuid::Uuid) -> Result<(), JournalError> {
    if op.state.is_settled() {
        return Err(JournalError::Settled {
            id: op.id.clone(),
            state: op.state,
        });
    }
    match op.lease {
        Some((owner, _)) if owner == me => Ok(()),
        _ => Err(JournalError::LostLease(op.id.clone())),
    }
}
