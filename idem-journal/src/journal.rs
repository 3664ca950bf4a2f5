//! The journal: records an operation before its side effect, drives it to a
//! settled state through the provider, and reconciles what stayed unknown.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{
    Acquired, Finish, JournalRecord, JournalStore, ListQuery, NewOperation, OperationId,
    OperationKey, OperationState, OwnerToken, Timestamp, validate_lease, validate_list_limit,
};
use idem_core::{Operation, StoreError, Tenant};

use crate::error::JournalError;
use crate::provider::{Delivery, Match, Provider, ProviderOutcome};

/// The operation journal over a store, in one namespace.
///
/// ```
/// use std::sync::Arc;
/// use idem_journal::{async_trait, Journal, JournalRecord, Match, OperationId, OperationState, Provider, ProviderOutcome};
/// use idem_memory::MemoryJournal;
///
/// struct Approves;
///
/// #[async_trait]
/// impl Provider for Approves {
///     async fn send(&self, op: &JournalRecord) -> ProviderOutcome {
///         ProviderOutcome::Succeeded { provider_id: format!("ch_{}", op.provider_key()), status: "succeeded".into() }
///     }
///     async fn retrieve(&self, id: &str) -> ProviderOutcome {
///         ProviderOutcome::Succeeded { provider_id: id.into(), status: "succeeded".into() }
///     }
///     async fn find(&self, _: &JournalRecord) -> Result<Vec<Match>, String> {
///         Ok(Vec::new())
///     }
/// }
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let journal = Journal::new(Arc::new(MemoryJournal::new()), "billing")?;
/// let id = OperationId::new("order-42", "charge")?;
/// // Recorded before the side effect; asking twice gives the same operation.
/// journal.record(&id, serde_json::json!({"amount": 1000})).await?;
/// let charged = journal.execute(&id, &Approves).await?;
/// assert_eq!(charged.state(), OperationState::Succeeded);
/// // Settled: never sent again.
/// assert_eq!(journal.execute(&id, &Approves).await?.parts().sends, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct Journal<S: ?Sized = dyn JournalStore> {
    store: Arc<S>,
    namespace: Tenant,
    lease: Duration,
    search_period: Duration,
}

impl<S: ?Sized> Clone for Journal<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            namespace: self.namespace.clone(),
            lease: self.lease,
            search_period: self.search_period,
        }
    }
}

impl<S: JournalStore + ?Sized> fmt::Debug for Journal<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Journal")
            .field("store", &self.store)
            .field("namespace", &self.namespace)
            .field("lease", &self.lease)
            .field("search_period", &self.search_period)
            .finish()
    }
}

/// What a reconciliation pass did with one operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Step {
    /// Settled now (or found settled), in this state.
    Settled(OperationState),
    /// Waiting for a person.
    NeedsReview,
    /// Still open (pending or unknown): a later pass tries again.
    Open(OperationState),
    /// Held by another executor (or an operator), for this much longer.
    Busy {
        /// What its lease has left.
        retry_after: Duration,
    },
    /// Taken over by another executor while this pass drove it.
    TakenOver,
}

/// What one reconciliation pass did: each operation it looked at and the
/// step it took, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reconciled {
    /// Every operation looked at, with what became of it.
    pub steps: Vec<(OperationId, Step)>,
}

impl Reconciled {
    /// How many operations it looked at.
    pub fn examined(&self) -> usize {
        self.steps.len()
    }

    /// How many took a step matching `step`.
    pub fn count(&self, step: impl Fn(&Step) -> bool) -> usize {
        self.steps.iter().filter(|(_, s)| step(s)).count()
    }
}

/// How many operations one reconciliation pass looks at, at most.
pub const MAX_BATCH: usize = idem_core::store::MAX_LIST;

impl<S: JournalStore + ?Sized> Journal<S> {
    /// How long an executor holds an operation by default: 30 s.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
    /// How long a search that found nothing is made again by default: 72 h
    /// (providers' searches lag behind; an operation then rests in review).
    pub const DEFAULT_SEARCH_PERIOD: Duration = Duration::from_secs(72 * 3600);

    /// A journal on `store` in `namespace` (1 to 255 bytes, no control
    /// characters): two journals with two namespaces never share an
    /// operation or a provider key, on one store or two.
    ///
    /// # Errors
    ///
    /// [`JournalError::InvalidInput`] for a bad namespace.
    pub fn new(store: Arc<S>, namespace: &str) -> Result<Self, JournalError> {
        Ok(Self {
            store,
            namespace: Tenant::new(namespace)?,
            lease: Self::DEFAULT_LEASE,
            search_period: Self::DEFAULT_SEARCH_PERIOD,
        })
    }

    /// How long an executor holds an operation; a crashed executor's
    /// operation is taken over once it has passed, by the store's clock.
    ///
    /// # Errors
    ///
    /// [`JournalError::InvalidInput`] outside 1 ms to 7 days.
    pub fn with_lease(mut self, lease: Duration) -> Result<Self, JournalError> {
        self.lease = validate_lease(lease)?;
        Ok(self)
    }

    /// How long after a search first found nothing it is made again (on
    /// each [`reconcile`](Self::reconcile) pass) before the operation rests
    /// in review.
    #[must_use]
    pub fn with_search_period(mut self, period: Duration) -> Self {
        self.search_period = period;
        self
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    /// The namespace.
    pub fn namespace(&self) -> &Tenant {
        &self.namespace
    }

    /// Where the operation `id` is kept.
    pub fn key(&self, id: &OperationId) -> OperationKey {
        OperationKey::new(self.namespace.clone(), id.clone())
    }

    /// The operation to record for `id` with `request`, with a fresh
    /// provider key: for a backend that records inside the caller's
    /// transaction; pass what it stored to [`recorded`](Self::recorded).
    pub fn new_operation(&self, id: &OperationId, request: serde_json::Value) -> NewOperation {
        NewOperation::new(self.key(id), request)
    }

    /// What `stored` (the answer to recording `new`) means: the operation,
    /// or [`JournalError::Mismatch`] if the id was taken with another
    /// request.
    ///
    /// # Errors
    ///
    /// [`JournalError::Mismatch`].
    pub fn recorded(
        &self,
        new: &NewOperation,
        stored: JournalRecord,
    ) -> Result<JournalRecord, JournalError> {
        if stored.request() == new.request() {
            Ok(stored)
        } else {
            Err(JournalError::Mismatch(new.key().id().clone()))
        }
    }

    /// Records the operation `id` with `request`, before any side effect.
    /// Asking twice gives the same operation, with the same provider key.
    ///
    /// # Errors
    ///
    /// [`JournalError::Mismatch`] if `id` exists with another request;
    /// [`JournalError::Store`] when the store fails.
    pub async fn record(
        &self,
        id: &OperationId,
        request: serde_json::Value,
    ) -> Result<JournalRecord, JournalError> {
        let new = self.new_operation(id, request);
        let stored = self
            .store
            .record(&new)
            .await
            .map_err(|e| JournalError::from_store(id, e))?;
        self.recorded(&new, stored)
    }

    /// The operation `id`, if recorded.
    ///
    /// # Errors
    ///
    /// [`JournalError::Store`] when the store fails.
    pub async fn get(&self, id: &OperationId) -> Result<Option<JournalRecord>, JournalError> {
        self.store
            .get(&self.key(id))
            .await
            .map_err(|e| JournalError::from_store(id, e))
    }

    /// Takes the operation `id` for `owner`: the record and the store's time.
    async fn take(
        &self,
        id: &OperationId,
        owner: OwnerToken,
    ) -> Result<Result<(JournalRecord, Timestamp), JournalRecord>, JournalError> {
        let acquired = self
            .store
            .acquire(self.key(id).held_by(owner), self.lease)
            .await
            .map_err(|e| JournalError::from_store(id, e))?;
        match acquired {
            Acquired::Held { record, now } => Ok(Ok((record, now))),
            Acquired::Settled(record) => Ok(Err(record)),
            Acquired::Busy { retry_after, .. } => Err(JournalError::Busy {
                id: id.clone(),
                retry_after,
            }),
            Acquired::Absent => Err(JournalError::NotFound(id.clone())),
            _ => Err(JournalError::Store(StoreError::backend(
                self.store.capabilities().store,
                Operation::Acquire,
                "an acquisition answer this journal does not know",
            ))),
        }
    }

    /// Drives the operation `id` one step toward a settled state, calling
    /// the provider at most once, under a lease so that one executor sends
    /// at a time. The store's clock judges the lease and the key window;
    /// this process's clock is never read.
    ///
    /// - settled: returned as it is, no call;
    /// - the provider's id known: retrieved, never sent again;
    /// - keyed delivery within the window (from the first send, which is
    ///   recorded before it happens): sent, with the same key every time;
    ///   past the window: never sent; [`Provider::find`] settles it, and no
    ///   match or several mark it for review (no match: searched again on
    ///   each reconciliation for the search period);
    /// - at most once: sent once; unknown after that goes to review;
    /// - at least once: sent until an answer settles it;
    /// - waiting for review: searched again while its search period runs,
    ///   else returned as it is.
    ///
    /// # Cancellation
    ///
    /// Each store write is one operation that lands whole or not at all.
    /// Dropped mid-way (an executor that crashes or is cut off), the
    /// operation stays held until its lease lapses (another executor is
    /// told [`JournalError::Busy`] meanwhile), then the next executor takes
    /// it over. A send is recorded before it is made, so a dropped send is
    /// made again with the same key (within the window) or found, never
    /// forgotten: one effect either way.
    ///
    /// # Errors
    ///
    /// [`JournalError::NotFound`]; [`JournalError::Busy`] if another
    /// executor holds it (with its lease's time left);
    /// [`JournalError::LostLease`] if one took it over meanwhile;
    /// [`JournalError::Store`] when the store fails.
    pub async fn execute(
        &self,
        id: &OperationId,
        provider: &(impl Provider + ?Sized),
    ) -> Result<JournalRecord, JournalError> {
        let owner = OwnerToken::generate();
        let (record, now) = match self.take(id, owner).await? {
            Ok(held) => held,
            Err(settled) => return Ok(settled),
        };
        let delivery = provider.delivery();
        let finish = if record.state() == OperationState::NeedsReview {
            if record.parts().search_until.is_some_and(|until| now < until) {
                self.search(&record, now, provider).await
            } else {
                // Resting in review: let go, unchanged.
                unchanged(&record)
            }
        } else if let Some(provider_id) = record.parts().provider_id.clone() {
            let outcome = provider.retrieve(&provider_id).await;
            settle_with(&record, outcome, delivery)
        } else {
            let may_send = match delivery {
                Delivery::Keyed(keys) => record
                    .parts()
                    .first_sent_at
                    .is_none_or(|first| now < first + keys.sends_until()),
                Delivery::AtMostOnce => record.parts().sends == 0,
                _ => true,
            };
            if may_send {
                let sending = self
                    .store
                    .mark_sent(record.key().held_by(owner), record.parts().sends)
                    .await
                    .map_err(|e| JournalError::from_store(id, e))?;
                // The send is recorded before it happens: a crash now leaves
                // a record the next executor resends (same key) or, at most
                // once, hands to a person.
                let outcome = provider.send(&sending).await;
                settle_with(&sending, outcome, delivery)
            } else if delivery == Delivery::AtMostOnce {
                review(
                    "at most once: a send whose outcome is unknown is never repeated".into(),
                    None,
                )
            } else {
                self.search(&record, now, provider).await
            }
        };
        self.store
            .finish(record.key().held_by(owner), &finish)
            .await
            .map_err(|e| JournalError::from_store(id, e))
    }

    /// Past the key window a send could repeat the effect: find it instead.
    async fn search(
        &self,
        record: &JournalRecord,
        now: Timestamp,
        provider: &(impl Provider + ?Sized),
    ) -> Finish {
        let search_until = record
            .parts()
            .search_until
            .or(Some(now + self.search_period));
        let found = match provider.find(record).await {
            Ok(found) => found,
            Err(reason) => {
                return Finish::new(record.state(), Some(format!("search failed: {reason}")))
                    .with_search_until(record.parts().search_until);
            }
        };
        // A match under another key is another operation's effect.
        let mut found: Vec<Match> = found
            .into_iter()
            .filter(|m| {
                m.provider_key
                    .as_deref()
                    .is_none_or(|key| key == record.provider_key())
            })
            .collect();
        match found.len() {
            0 => review("no effect found past the key window".into(), search_until),
            1 => {
                let Some(found) = found.pop() else {
                    return unchanged(record);
                };
                let outcome = match found.outcome {
                    // The effect exists: an unfinished one is still unknown,
                    // now with an id to retrieve.
                    ProviderOutcome::NotExecuted { reason } => ProviderOutcome::Ambiguous {
                        provider_id: Some(found.provider_id),
                        reason,
                    },
                    outcome => outcome,
                };
                settle_with(record, outcome, Delivery::AtLeastOnce)
            }
            n => {
                let ids: Vec<&str> = found.iter().map(|m| m.provider_id.as_str()).collect();
                review(format!("{n} effects found: {}", ids.join(", ")), None)
            }
        }
    }

    /// Drives up to `batch` operations (1 to [`MAX_BATCH`]) that stayed
    /// pending or unknown for longer than `older_than`, oldest first, and
    /// those in review whose search period still runs, waiting `pace`
    /// between them (the provider's rate). Operations settled, held or
    /// taken over meanwhile are reported, never an error.
    ///
    /// # Errors
    ///
    /// [`JournalError::InvalidInput`] for a batch out of range;
    /// [`JournalError::Store`] when the store fails.
    pub async fn reconcile(
        &self,
        provider: &(impl Provider + ?Sized),
        older_than: Duration,
        batch: usize,
        pace: Duration,
    ) -> Result<Reconciled, JournalError> {
        let batch = validate_list_limit(batch)?;
        let listed = |states: &'static [OperationState], limit: usize| async move {
            let query = ListQuery::new(self.namespace.clone(), states)
                .older_than(older_than)
                .limit(limit);
            self.store.list(&query).await.map_err(JournalError::Store)
        };
        let mut due = listed(&[OperationState::Pending, OperationState::Unknown], batch).await?;
        if due.len() < batch {
            let review = listed(&[OperationState::NeedsReview], batch - due.len()).await?;
            // Still searching: its last search came before its deadline.
            due.extend(review.into_iter().filter(|r| {
                r.parts()
                    .search_until
                    .is_some_and(|until| r.parts().updated_at < until)
            }));
        }
        let mut report = Reconciled::default();
        for (i, record) in due.iter().enumerate() {
            if i > 0 && !pace.is_zero() {
                tokio::time::sleep(pace).await;
            }
            let step = match self.execute(record.id(), provider).await {
                Ok(done) => match done.state() {
                    state if state.is_settled() => Step::Settled(state),
                    OperationState::NeedsReview => Step::NeedsReview,
                    state => Step::Open(state),
                },
                Err(JournalError::Busy { retry_after, .. }) => Step::Busy { retry_after },
                Err(JournalError::LostLease(_)) => Step::TakenOver,
                Err(error) => return Err(error),
            };
            report.steps.push((record.id().clone(), step));
        }
        Ok(report)
    }

    /// Operations waiting for a person, oldest first, at most `limit` (1 to
    /// [`MAX_BATCH`]).
    ///
    /// # Errors
    ///
    /// [`JournalError::InvalidInput`] for a limit out of range;
    /// [`JournalError::Store`] when the store fails.
    pub async fn needs_review(&self, limit: usize) -> Result<Vec<JournalRecord>, JournalError> {
        let limit = validate_list_limit(limit)?;
        let query =
            ListQuery::new(self.namespace.clone(), &[OperationState::NeedsReview]).limit(limit);
        self.store.list(&query).await.map_err(JournalError::Store)
    }

    /// Settles an operation by hand (an operator who checked the provider's
    /// dashboard): `Succeeded` or `Failed`, with a note and the provider's id
    /// if there is one. The operator takes the operation's lease to do it,
    /// so it is refused while an executor holds it (a send may be in
    /// flight): try again after `retry_after`.
    ///
    /// # Errors
    ///
    /// [`JournalError::InvalidInput`] for a state that is not settled;
    /// [`JournalError::Busy`] while an executor holds it;
    /// [`JournalError::Settled`] if it is settled already;
    /// [`JournalError::NotFound`].
    pub async fn settle(
        &self,
        id: &OperationId,
        state: OperationState,
        provider_id: Option<String>,
        note: &str,
    ) -> Result<JournalRecord, JournalError> {
        if !state.is_settled() {
            return Err(JournalError::InvalidInput(
                idem_core::InvalidInput::OutOfRange {
                    field: "state",
                    reason: "an operator settles an operation as succeeded or failed",
                },
            ));
        }
        let operator = OwnerToken::generate();
        let record = match self.take(id, operator).await? {
            Ok((record, _)) => record,
            Err(settled) => {
                return Err(JournalError::Settled {
                    id: id.clone(),
                    state: settled.state(),
                });
            }
        };
        let finish = Finish::new(state, Some(format!("settled by hand: {note}")))
            .with_provider_id(provider_id);
        self.store
            .finish(record.key().held_by(operator), &finish)
            .await
            .map_err(|e| JournalError::from_store(id, e))
    }
}

/// Lets go of `record` as it is.
fn unchanged(record: &JournalRecord) -> Finish {
    Finish::new(record.state(), record.parts().detail.clone())
        .with_search_until(record.parts().search_until)
}

fn review(why: String, search_until: Option<Timestamp>) -> Finish {
    Finish::new(OperationState::NeedsReview, Some(why)).with_search_until(search_until)
}

/// What the provider's answer writes.
fn settle_with(record: &JournalRecord, outcome: ProviderOutcome, delivery: Delivery) -> Finish {
    match outcome {
        ProviderOutcome::Succeeded {
            provider_id,
            status,
        } => {
            Finish::new(OperationState::Succeeded, Some(status)).with_provider_id(Some(provider_id))
        }
        ProviderOutcome::Failed {
            provider_id,
            reason,
        } => Finish::new(OperationState::Failed, Some(reason)).with_provider_id(provider_id),
        // Nothing happened: the state stays, the same key goes later.
        ProviderOutcome::NotExecuted { reason } => Finish::new(record.state(), Some(reason)),
        // At most once, with nothing to retrieve: never sent again.
        ProviderOutcome::Ambiguous {
            provider_id: None,
            reason,
        } if delivery == Delivery::AtMostOnce && record.parts().provider_id.is_none() => review(
            format!("at most once: the send's outcome is unknown ({reason})"),
            None,
        ),
        // Never rounded to failure: find out.
        ProviderOutcome::Ambiguous {
            provider_id,
            reason,
        } => Finish::new(OperationState::Unknown, Some(reason)).with_provider_id(provider_id),
        ProviderOutcome::KeyReused { reason } => review(
            format!("the provider refused the key as reused with other parameters: {reason}"),
            None,
        ),
    }
}
