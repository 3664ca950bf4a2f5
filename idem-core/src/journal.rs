//! The outbound operation journal's store: what `idem-journal` keeps of each
//! call to a provider, and the operations every journal store offers.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::backend::Capabilities;
use crate::clock::Timestamp;
use crate::error::{InvalidInput, StoreError};
use crate::record::OwnerToken;
use crate::scope::{Tenant, check_name};

/// The most operations one [`JournalStore::list`] returns.
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
    pub fn span_scope(&self) -> Option<crate::scope::Scope> {
        let id = crate::scope::IdempotencyKey::new(self.id.to_string()).ok()?;
        Some(crate::scope::Scope::new(self.namespace.clone(), id))
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
/// ([`JournalStore::acquire`], [`mark_sent`](JournalStore::mark_sent) and
/// [`finish`](JournalStore::finish)).
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
    operation: NewOperation,
    parts: JournalParts,
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
    /// How long an operation has been unchanged, by the store's clock.
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
            && record.parts().updated_at <= now - self.older_than
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
///   `Busy` with the time left; a lapsed lease is taken over; the owner that
///   holds it gets it again (a second delivery), with its lease moved; a
///   settled operation is never leased again.
/// - **Fencing.** [`mark_sent`](Self::mark_sent) and [`finish`](Self::finish)
///   write only under a live lease of their owner, and are `LostLease`
///   otherwise, writing nothing.
/// - **Sends.** `mark_sent` counts one send after `sends` and starts the key
///   window at the store's time on the first; delivered twice while the
///   lease lives, it counts once and answers as the first (after the lease
///   lapsed it is `LostLease`, as every write under a lapsed lease).
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
///   one. A record's `updated_at` never moves back, whatever the clock of a
///   writer on a caller-clock store.
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
