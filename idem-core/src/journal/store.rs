//! The journal's store: the operations every journal store offers, and
//! what they take and answer.

use crate::journal::operation::MAX_LIST;
use crate::journal::operation::OperationState;
use crate::journal::operation::{Holder, JournalRecord, NewOperation, OperationKey};
use crate::plumbing::capabilities::Capabilities;
use crate::plumbing::clock::Timestamp;
use crate::plumbing::error::{InvalidInput, Operation, StoreError};
use crate::plumbing::fencing::OwnerToken;
use crate::plumbing::layer::Layered;
use crate::plumbing::scope::{Scope, Tenant};
use async_trait::async_trait;
use std::fmt;
use std::time::Duration;

/// What an executor writes when it lets go of an operation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finish {
    /// The state it leaves.
    pub state: OperationState,
    /// The provider's id, if learnt (`None` keeps the stored one).
    pub provider_id: Option<String>,
    /// The provider's status, or why it could not settle.
    pub detail: Option<String>,
    /// Until when a search that found nothing is made again (`None`: never).
    pub search_until: Option<Timestamp>,
}

/// Provider text as every store can keep it: no NUL (a Postgres `text`
/// refuses one).
fn storable(text: String) -> String {
    if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text
    }
}

impl Finish {
    /// Leaves `state` with `detail` (a NUL in it becomes U+FFFD, so every
    /// store keeps it alike).
    pub fn new(state: OperationState, detail: Option<String>) -> Self {
        Self {
            state,
            provider_id: None,
            detail: detail.map(storable),
            search_until: None,
        }
    }

    /// The same with the provider's id (a NUL in it becomes U+FFFD).
    #[must_use]
    pub fn with_provider_id(mut self, provider_id: Option<String>) -> Self {
        self.provider_id = provider_id.map(storable);
        self
    }

    /// The same, searched again until `until`.
    #[must_use]
    pub fn with_search_until(mut self, until: Option<Timestamp>) -> Self {
        self.search_until = until;
        self
    }
}

/// What [`JournalStore::list`] looks for: the operations of one namespace
/// in some states, unchanged for a while, at most a number of them.
///
/// ```
/// use std::time::Duration;
/// use idem_core::Tenant;
/// use idem_core::store::{ListQuery, OperationState};
///
/// # fn example() -> Result<(), idem_core::InvalidInput> {
/// let stuck = ListQuery::new(Tenant::new("billing")?, &[OperationState::Unknown])
///     .older_than(Duration::from_secs(60))
///     .limit(100);
/// assert_eq!(stuck.limit, 100);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListQuery {
    /// The namespace listed.
    pub namespace: Tenant,
    /// The states listed, each once (none: nothing is found).
    pub states: Vec<OperationState>,
    /// How long an operation has been unchanged, by the store's clock; zero
    /// (the default) lists every age, also an operation changed by a caller
    /// whose clock runs ahead of the store's.
    pub older_than: Duration,
    /// At most this many, 1 to [`MAX_LIST`]: the store refuses others.
    pub limit: usize,
}

impl ListQuery {
    /// The operations of `namespace` in `states`, whatever their age, at
    /// most [`MAX_LIST`].
    pub fn new(namespace: Tenant, states: &[OperationState]) -> Self {
        let mut once = Vec::with_capacity(states.len());
        for state in states {
            if !once.contains(state) {
                once.push(*state);
            }
        }
        Self {
            namespace,
            states: once,
            older_than: Duration::ZERO,
            limit: MAX_LIST,
        }
    }

    /// Whether `record` is one the query asks for at the store's time `now`.
    pub fn matches(&self, record: &JournalRecord, now: Timestamp) -> bool {
        record.key().namespace() == &self.namespace
            && self.states.contains(&record.state())
            && (self.older_than.is_zero() || record.parts().updated_at <= now - self.older_than)
    }

    /// Only those unchanged for `older_than`.
    #[must_use]
    pub fn older_than(mut self, older_than: Duration) -> Self {
        self.older_than = older_than;
        self
    }

    /// At most `limit` (the store refuses one outside 1 to [`MAX_LIST`]).
    #[must_use]
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }
}

/// What [`JournalStore::acquire`] found.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Acquired {
    /// The owner holds the operation now, until the lease's end; `now` is
    /// the store clock's time of the acquisition.
    Held {
        /// The record, leased.
        record: JournalRecord,
        /// The store's time.
        now: Timestamp,
    },
    /// Another owner holds it, for `retry_after` more.
    Busy {
        /// The record as stored.
        record: JournalRecord,
        /// How long the other owner's lease has left.
        retry_after: Duration,
    },
    /// It is settled: nobody takes it again.
    Settled(JournalRecord),
    /// No operation has this key.
    Absent,
}

impl Acquired {
    /// For stores whose server names its answer to an acquisition
    /// (`absent`, `settled`, `busy`, `held`) beside the record and its
    /// time: the answer, reading the record with `record` where there is
    /// one. `None` for an unknown name, or a `busy` record with no live
    /// lease of another owner (the store's reply is then corrupt).
    ///
    /// # Errors
    ///
    /// What `record` fails with.
    pub fn from_answer(
        answer: &[u8],
        owner: OwnerToken,
        now: Timestamp,
        record: impl FnOnce() -> Result<JournalRecord, StoreError>,
    ) -> Result<Option<Self>, StoreError> {
        Ok(match answer {
            b"absent" => Some(Self::Absent),
            b"settled" => Some(Self::Settled(record()?)),
            b"held" => Some(Self::Held {
                record: record()?,
                now,
            }),
            b"busy" => {
                let record = record()?;
                record
                    .held_by_other(owner, now)
                    .map(|retry_after| Self::Busy {
                        record,
                        retry_after,
                    })
            }
            _ => None,
        })
    }
}

/// The storage of an outbound operation journal (`idem-journal`).
///
/// # Contract
///
/// Each sentence is a case of the public journal suite in
/// `idem-conformance`.
///
/// - **Record.** [`record`](Self::record) stores the operation unless its key
///   exists, and returns what is stored: a second record of one key (another
///   request included) returns the first, unchanged. Namespaces never meet.
/// - **Lease.** [`acquire`](Self::acquire) gives an open operation (pending,
///   unknown or needs review) to one owner at a time, until the lease's end
///   by the store's clock: while another owner's lease lives, it answers
///   `Busy` with the time left on that lease (not the whole lease); a
///   lapsed lease is taken over; the owner that holds it gets it again (a
///   second delivery), with its lease moved; a settled operation is never
///   leased again.
/// - **Fencing.** [`mark_sent`](Self::mark_sent) and [`finish`](Self::finish)
///   write only under a live lease of their owner, and are `LostLease`
///   otherwise, writing nothing.
/// - **Sends.** `mark_sent` counts one send after `sends` and starts the key
///   window at the store's time on the first; delivered twice while the
///   lease lives, it counts once and answers as the first (after the lease
///   lapsed it is `LostLease`, as every write under a lapsed lease). A
///   `sends` that is neither the stored count (a new send) nor one below it
///   (that send delivered again) is a stale executor's view: `LostLease`,
///   counting nothing.
/// - **Finish.** `finish` writes the state, the provider's id (a `None`
///   keeps the stored one), the detail and the search deadline, and releases
///   the lease; delivered twice, the second answers as the first. A settled
///   state never changes.
/// - **List.** [`list`](Self::list) returns the operations of one namespace
///   in the given states, last changed at least `older_than` ago by the
///   store's clock, oldest change first (ties in any order), at most `limit`
///   (1 to [`MAX_LIST`]), each as stored when it is read. A store that lists
///   from an eventually consistent index may miss a change of the last
///   moments; a later listing finds it.
/// - **Time.** Leases, the key window and every time in a record are the
///   store's clock's ([`Capabilities::clock`]): the server's where it has
///   one. A record's `updated_at` never moves back, whatever the write and
///   whatever the clock of a writer on a caller-clock store.
///
/// # Errors
///
/// Every operation: [`StoreError::Unavailable`] when the store cannot be
/// reached (the operation may or may not have happened; each is safe to
/// deliver again), [`StoreError::Backend`], [`StoreError::InvalidInput`]
/// for a `limit` outside 1 to [`MAX_LIST`], a lease outside 1 ms to 7 days,
/// or a record larger than the store holds (a DynamoDB item's 400 KB).
#[async_trait]
pub trait JournalStore: Send + Sync + fmt::Debug + 'static {
    /// Stores `operation` unless its key exists; returns what is stored.
    async fn record(&self, operation: &NewOperation) -> Result<JournalRecord, StoreError>;

    /// The operation with `key`, if any.
    async fn get(&self, key: &OperationKey) -> Result<Option<JournalRecord>, StoreError>;

    /// Leases the operation to its holder's owner for `lease` from the
    /// store's now.
    async fn acquire(&self, held: Holder<'_>, lease: Duration) -> Result<Acquired, StoreError>;

    /// Counts a send after `sends` under the owner's lease.
    ///
    /// # Errors
    ///
    /// [`StoreError::LostLease`] unless the owner holds a live lease.
    async fn mark_sent(&self, held: Holder<'_>, sends: u32) -> Result<JournalRecord, StoreError>;

    /// Writes `finish` under the owner's lease and releases it.
    ///
    /// # Errors
    ///
    /// [`StoreError::LostLease`] unless the owner holds a live lease (or
    /// this very finish was written already).
    async fn finish(&self, held: Holder<'_>, finish: &Finish) -> Result<JournalRecord, StoreError>;

    /// The operations `query` asks for, oldest change first.
    async fn list(&self, query: &ListQuery) -> Result<Vec<JournalRecord>, StoreError>;

    /// What the store is: its name and whose clock it keeps.
    fn capabilities(&self) -> Capabilities;
}

/// Checks a [`JournalStore::list`] limit: 1 to [`MAX_LIST`].
///
/// # Errors
///
/// [`InvalidInput::OutOfRange`] outside it.
pub fn validate_list_limit(limit: usize) -> Result<usize, InvalidInput> {
    if (1..=MAX_LIST).contains(&limit) {
        Ok(limit)
    } else {
        Err(InvalidInput::OutOfRange {
            field: "list limit",
            reason: "must be 1 to 1000",
        })
    }
}

#[async_trait]
impl<S: JournalStore> JournalStore for Layered<S> {
    async fn record(&self, operation: &NewOperation) -> Result<JournalRecord, StoreError> {
        let recorded = self.get_ref().record(operation);
        let scope = journal_scope(operation.key());
        self.layer()
            .traced(Operation::Record, scope.as_ref(), None, recorded)
            .await
    }

    async fn get(&self, key: &OperationKey) -> Result<Option<JournalRecord>, StoreError> {
        let read = self.get_ref().get(key);
        let scope = journal_scope(key);
        self.layer()
            .traced(Operation::Get, scope.as_ref(), None, read)
            .await
    }

    async fn acquire(&self, held: Holder<'_>, lease: Duration) -> Result<Acquired, StoreError> {
        let acquired = self.get_ref().acquire(held, lease);
        let scope = journal_scope(held.key);
        self.layer()
            .traced(Operation::Acquire, scope.as_ref(), None, acquired)
            .await
    }

    async fn mark_sent(&self, held: Holder<'_>, sends: u32) -> Result<JournalRecord, StoreError> {
        let sent = self.get_ref().mark_sent(held, sends);
        let scope = journal_scope(held.key);
        self.layer()
            .traced(Operation::MarkSent, scope.as_ref(), None, sent)
            .await
    }

    async fn finish(&self, held: Holder<'_>, finish: &Finish) -> Result<JournalRecord, StoreError> {
        let finished = self.get_ref().finish(held, finish);
        let scope = journal_scope(held.key);
        self.layer()
            .traced(Operation::Finish, scope.as_ref(), None, finished)
            .await
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<JournalRecord>, StoreError> {
        let listed = self.get_ref().list(query);
        self.layer()
            .traced(Operation::List, None, None, listed)
            .await
    }

    fn capabilities(&self) -> Capabilities {
        self.get_ref().capabilities()
    }
}

/// A journal operation's span fields ([`OperationKey::span_scope`]).
fn journal_scope(key: &OperationKey) -> Option<Scope> {
    key.span_scope()
}

/// Implements [`JournalStore`] for a type by forwarding every operation to
/// a field that is a journal store: `forward_journal_store!(MyJournal =>
/// field)`, as [`forward_store!`](crate::store::forward_store) does for
/// [`IdempotencyStore`].
#[macro_export]
#[doc(hidden)]
macro_rules! __forward_journal_store {
    ($ty:ty => $field:ident) => {
        #[$crate::async_trait]
        impl $crate::store::JournalStore for $ty {
            async fn record(
                &self,
                operation: &$crate::store::NewOperation,
            ) -> ::core::result::Result<$crate::store::JournalRecord, $crate::StoreError> {
                self.$field.record(operation).await
            }
            async fn get(
                &self,
                key: &$crate::store::OperationKey,
            ) -> ::core::result::Result<
                ::core::option::Option<$crate::store::JournalRecord>,
                $crate::StoreError,
            > {
                self.$field.get(key).await
            }
            async fn acquire(
                &self,
                held: $crate::store::Holder<'_>,
                lease: ::core::time::Duration,
            ) -> ::core::result::Result<$crate::store::Acquired, $crate::StoreError> {
                self.$field.acquire(held, lease).await
            }
            async fn mark_sent(
                &self,
                held: $crate::store::Holder<'_>,
                sends: u32,
            ) -> ::core::result::Result<$crate::store::JournalRecord, $crate::StoreError> {
                self.$field.mark_sent(held, sends).await
            }
            async fn finish(
                &self,
                held: $crate::store::Holder<'_>,
                finish: &$crate::store::Finish,
            ) -> ::core::result::Result<$crate::store::JournalRecord, $crate::StoreError> {
                self.$field.finish(held, finish).await
            }
            async fn list(
                &self,
                query: &$crate::store::ListQuery,
            ) -> ::core::result::Result<
                ::std::vec::Vec<$crate::store::JournalRecord>,
                $crate::StoreError,
            > {
                self.$field.list(query).await
            }
            fn capabilities(&self) -> $crate::store::Capabilities {
                self.$field.capabilities()
            }
        }
    };
}

/// What a store does with a [`Finish`]: the record it leaves.
impl JournalRecord {
    /// The record with `finish` written and its lease released, at `now`.
    #[must_use]
    pub fn finished(mut self, finish: &Finish, now: Timestamp) -> Self {
        self.parts.state = finish.state;
        if finish.provider_id.is_some() {
            self.parts.provider_id.clone_from(&finish.provider_id);
        }
        self.parts.detail.clone_from(&finish.detail);
        self.parts.search_until = finish.search_until;
        self.parts.lease_until = None;
        self.parts.updated_at = self.parts.updated_at.max(now);
        self
    }

    /// Whether this record is what `finish` by `owner` leaves: a second
    /// delivery of that finish answers as the first did.
    pub fn is_finished_by(&self, owner: OwnerToken, finish: &Finish) -> bool {
        let parts = &self.parts;
        parts.lease_owner == Some(owner)
            && parts.lease_until.is_none()
            && parts.state == finish.state
            && parts.detail == finish.detail
            && parts.search_until == finish.search_until
            && (finish.provider_id.is_none() || parts.provider_id == finish.provider_id)
    }
}
