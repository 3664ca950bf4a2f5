//! `RedisJournal`: the outbound operation journal's store, one hash per
//! operation and one listing index per namespace and state, each operation
//! one Lua script (`lua/journal_*.lua`), on one node or a cluster.
//!
//! The hash of an operation holds one field per part of its record, each
//! written by the scripts alone:
//!
//! | field | holds |
//! |---|---|
//! | `namespace`, `subject`, `effect` | its key |
//! | `request` | the caller's JSON, as serialized |
//! | `provider_key` | the provider's idempotency key |
//! | `state` | [`OperationState::as_str`] |
//! | `provider_id`, `detail` | text, absent when none |
//! | `first_sent_at` | unix ms, absent before the first send |
//! | `sends` | the count of sends |
//! | `created_at`, `updated_at` | unix ms |
//! | `lease_owner` | the owner token, UUID text, absent until leased |
//! | `lease_until`, `search_until` | unix ms, absent when none |

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use idem_core::store::{
    Acquired, Capabilities, ClockSource, Durability, Eviction, Finish, Holder, JournalParts,
    JournalRecord, JournalStore, Layered, ListQuery, NewOperation, OperationId, OperationKey,
    OperationLayer, OperationState, OwnerToken, Timestamp, TransactionSharing,
    forward_journal_store, millis, validate_lease, validate_list_limit,
};
use idem_core::{Operation, StoreError, Tenant, async_trait};
use redis::{Script, ScriptInvocation, Value};

use crate::codec::{bytes, int};
use crate::commands::JOURNAL_SCRIPTS;
use crate::error::{STORE, classify, corrupt};
use crate::options::RedisJournalOptions;
use crate::store::RedisConnection;

/// The journal store on Redis, over a [`RedisConnection`]: one server (a
/// [`ConnectionManager`](redis::aio::ConnectionManager)) or a Redis Cluster
/// (a [`ClusterConnection`](redis::cluster_async::ClusterConnection)), with
/// the same behaviour.
///
/// Every operation is one Lua script and one round trip (`EVALSHA`, loading
/// the script only when the server lacks it); leases, the key window and
/// every time in a record are the server's `TIME`, read inside the script.
/// Each operation is a hash, and each namespace keeps one sorted set per
/// state, scored by the time of the last change, for
/// [`list`](JournalStore::list); every key of a namespace shares one hash
/// tag (see [`operation_key`](Self::operation_key)), so each script stays in
/// one cluster slot. Operations never expire: a journal is a record of what
/// was sent.
///
/// Construction reads nothing from the server: capabilities report
/// [`Durability::Unknown`] and [`Eviction::Unknown`]. Run it on a server
/// that neither evicts (`maxmemory-policy noeviction`) nor forgets on a
/// restart (`appendonly yes`), as [`RedisStore`](crate::RedisStore) checks
/// for itself: a forgotten operation is sent again under a new key.
///
/// Every operation goes through the store's [`OperationLayer`]: it is bounded
/// by the [operation timeout](idem_core::StoreOptions::with_operation_timeout)
/// (5 s by default), ends in a retryable [`StoreError::Unavailable`] past
/// it, and gets its span and metrics.
///
/// ```no_run
/// use idem_core::Tenant;
/// use idem_core::store::{JournalStore, NewOperation, OperationId, OperationKey};
/// use idem_redis::{redis, RedisJournal};
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let client = redis::Client::open("redis://127.0.0.1:6379")?;
/// let journal = RedisJournal::new(redis::aio::ConnectionManager::new(client).await?);
/// let key = OperationKey::new(Tenant::new("billing")?, OperationId::new("order-42", "charge")?);
/// let recorded = journal
///     .record(&NewOperation::new(key.clone(), serde_json::json!({"amount": 500})))
///     .await?;
/// assert_eq!(journal.get(&key).await?, Some(recorded));
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RedisJournal {
    operations: Layered<Operations>,
}

forward_journal_store!(RedisJournal => operations);

/// The connection and the prefix, inside the journal's layer.
#[derive(Clone)]
struct Operations {
    conn: RedisConnection,
    prefix: String,
}

impl fmt::Debug for Operations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.conn {
            RedisConnection::Single(_) => "single",
            RedisConnection::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisJournal")
            .field("connection", &kind)
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl RedisJournal {
    /// A journal store over `conn` with the default options: prefix
    /// `idem-journal`, a 5 s operation timeout.
    ///
    /// ```no_run
    /// use idem_redis::{redis, RedisJournal};
    ///
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::cluster::ClusterClient::new(vec!["redis://127.0.0.1:7000"])?;
    /// let journal = RedisJournal::new(client.get_async_connection().await?);
    /// # let _ = journal; Ok(()) }
    /// ```
    pub fn new(conn: impl Into<RedisConnection>) -> Self {
        Self::from_parts(conn.into(), RedisJournalOptions::default())
    }

    /// A journal store over `conn` built from `options`.
    ///
    /// ```no_run
    /// use idem_redis::{redis, RedisJournal, RedisJournalOptions};
    ///
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let journal = RedisJournal::with_options(
    ///     redis::aio::ConnectionManager::new(client).await?,
    ///     RedisJournalOptions::default().prefix("billing-journal"),
    /// )?;
    /// # let _ = journal; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidInput`] if an option breaks its rule (see
    /// [`RedisJournalOptions`]).
    pub fn with_options(
        conn: impl Into<RedisConnection>,
        options: RedisJournalOptions,
    ) -> Result<Self, StoreError> {
        options.validate()?;
        Ok(Self::from_parts(conn.into(), options))
    }

    fn from_parts(conn: RedisConnection, options: RedisJournalOptions) -> Self {
        let layer = OperationLayer::new(STORE, options.store.operation_timeout());
        let operations = Operations {
            conn,
            prefix: options.prefix,
        };
        Self {
            operations: Layered::with_layer(operations, layer),
        }
    }

    /// The Redis key of an operation's hash:
    /// `<prefix>:{<n>:<namespace>}:op:<m>:<subject>:<effect>`, where the
    /// namespace is percent-escaped (`%`, `{`, `}`) and `n` is its escaped
    /// byte length, as
    /// [`storage_key_escaped`](idem_core::store::storage_key_escaped) writes
    /// a tenant, and `m` is the subject's byte length. The length prefixes
    /// make it injective whatever the parts hold; the braces are a hash tag
    /// that holds exactly the namespace, so a namespace's operations and its
    /// listing indexes (`<prefix>:{<n>:<namespace>}:state:<state>`) share
    /// one cluster slot.
    ///
    /// ```
    /// use idem_core::Tenant;
    /// use idem_core::store::{OperationId, OperationKey};
    /// use idem_redis::RedisJournal;
    ///
    /// # fn example(journal: RedisJournal) -> Result<(), idem_core::InvalidInput> {
    /// let key = OperationKey::new(Tenant::new("bill{ing}")?, OperationId::new("order-42", "charge")?);
    /// assert_eq!(
    ///     journal.operation_key(&key),
    ///     "idem-journal:{13:bill%7Bing%7D}:op:8:order-42:charge"
    /// );
    /// # Ok(()) }
    /// ```
    pub fn operation_key(&self, key: &OperationKey) -> String {
        operation_key(&self.operations.get_ref().prefix, key)
    }
}

/// `part` with `%`, `{` and `}` percent-escaped, so it cannot end a hash tag.
fn escaped(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    for c in part.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out
}

/// `<prefix>:{<n>:<namespace>}`: what every key of the namespace starts with.
fn namespace_tag(prefix: &str, namespace: &Tenant) -> String {
    let namespace = escaped(namespace.as_str());
    format!("{prefix}:{{{}:{namespace}}}", namespace.len())
}

/// The key of an operation's hash; see [`RedisJournal::operation_key`].
fn operation_key(prefix: &str, key: &OperationKey) -> String {
    let subject = key.id().subject();
    format!(
        "{}:op:{}:{subject}:{}",
        namespace_tag(prefix, key.namespace()),
        subject.len(),
        key.id().effect()
    )
}

/// The listing index of `state` in the namespace tagged `tag`.
fn index_key(tag: &str, state: OperationState) -> String {
    format!("{tag}:state:{}", state.as_str())
}

impl Operations {
    /// A writing script's invocation: the operation's hash, then its
    /// namespace's index of every state (`lua/journal.lua` tells them
    /// apart by the state their keys name).
    fn invocation<'a>(&self, script: &'a Script, key: &OperationKey) -> ScriptInvocation<'a> {
        let mut invocation = script.key(operation_key(&self.prefix, key));
        let tag = namespace_tag(&self.prefix, key.namespace());
        for state in OperationState::ALL {
            invocation.key(index_key(&tag, state));
        }
        invocation
    }

    /// Runs `invocation`; its reply.
    async fn run(
        &self,
        operation: Operation,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<Value, StoreError> {
        invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| classify(operation, e))
    }
}

/// The items of an array reply.
fn items(value: Value, op: Operation) -> Result<Vec<Value>, StoreError> {
    match value {
        Value::Array(items) => Ok(items),
        _ => Err(corrupt(op, "reply")),
    }
}

/// A text field, or the corrupt-record error naming it.
fn text(value: Vec<u8>, op: Operation, field: &'static str) -> Result<String, StoreError> {
    String::from_utf8(value).map_err(|_| corrupt(op, field))
}

/// The record in a hash's fields and values, in turn; `None` for none.
fn record(reply: Value, op: Operation) -> Result<Option<JournalRecord>, StoreError> {
    let reply = items(reply, op)?;
    if reply.is_empty() {
        return Ok(None);
    }
    let pairs = reply.chunks_exact(2);
    if !pairs.remainder().is_empty() {
        return Err(corrupt(op, "record"));
    }
    let mut fields: HashMap<Vec<u8>, Vec<u8>> = HashMap::with_capacity(reply.len() / 2);
    for pair in pairs {
        if let [name, value] = pair {
            let name = bytes(name).ok_or_else(|| corrupt(op, "field name"))?;
            let value = bytes(value).ok_or_else(|| corrupt(op, "field value"))?;
            fields.insert(name, value);
        }
    }
    let mut take = |field: &'static str| fields.remove(field.as_bytes());
    let optional_text =
        |value: Option<Vec<u8>>, field| value.map(|v| text(v, op, field)).transpose();
    let number = |value: Option<Vec<u8>>, field| {
        value
            .map(|v| int(&Value::BulkString(v)).ok_or_else(|| corrupt(op, field)))
            .transpose()
    };
    let time = |value: Option<Vec<u8>>, field| {
        number(value, field).map(|ms| ms.map(Timestamp::from_unix_millis))
    };
    let required = |value: Option<Vec<u8>>, field| value.ok_or_else(|| corrupt(op, field));

    let namespace = Tenant::new(text(
        required(take("namespace"), "namespace")?,
        op,
        "namespace",
    )?)
    .map_err(|_| corrupt(op, "namespace"))?;
    let id = OperationId::new(
        &text(required(take("subject"), "subject")?, op, "subject")?,
        &text(required(take("effect"), "effect")?, op, "effect")?,
    )
    .map_err(|_| corrupt(op, "operation id"))?;
    let request = serde_json::from_slice(&required(take("request"), "request")?)
        .map_err(|_| corrupt(op, "request"))?;
    let provider_key = text(
        required(take("provider_key"), "provider key")?,
        op,
        "provider key",
    )?;
    let state = OperationState::parse(&text(required(take("state"), "state")?, op, "state")?)
        .ok_or_else(|| corrupt(op, "state"))?;
    let sends = number(take("sends"), "sends")?.ok_or_else(|| corrupt(op, "sends"))?;
    let lease_owner = optional_text(take("lease_owner"), "lease owner")?
        .map(|owner| OwnerToken::parse(&owner).ok_or_else(|| corrupt(op, "lease owner")))
        .transpose()?;
    let parts = JournalParts {
        state,
        provider_id: optional_text(take("provider_id"), "provider id")?,
        detail: optional_text(take("detail"), "detail")?,
        first_sent_at: time(take("first_sent_at"), "first sent at")?,
        sends: u32::try_from(sends).map_err(|_| corrupt(op, "sends"))?,
        created_at: time(take("created_at"), "created at")?
            .ok_or_else(|| corrupt(op, "created at"))?,
        updated_at: time(take("updated_at"), "updated at")?
            .ok_or_else(|| corrupt(op, "updated at"))?,
        lease_owner,
        lease_until: time(take("lease_until"), "lease until")?,
        search_until: time(take("search_until"), "search until")?,
    };
    let operation =
        NewOperation::from_stored(OperationKey::new(namespace, id), request, provider_key);
    Ok(Some(JournalRecord::new(operation, parts)))
}

/// A record that must be there: the hash in `value`.
fn present(value: Option<Value>, op: Operation) -> Result<JournalRecord, StoreError> {
    record(value.ok_or_else(|| corrupt(op, "reply"))?, op)?.ok_or_else(|| corrupt(op, "record"))
}

/// A fenced script's reply, `{'ok', hash}` or `{'lost'}`.
fn fenced(reply: Value, op: Operation) -> Result<JournalRecord, StoreError> {
    let mut reply = items(reply, op)?.into_iter();
    match reply.next().as_ref().and_then(bytes).as_deref() {
        Some(b"ok") => present(reply.next(), op),
        Some(b"lost") => Err(StoreError::LostLease),
        _ => Err(corrupt(op, "outcome")),
    }
}

/// An optional value as the finish script reads it: a presence flag and the value.
fn flagged<'a>(invocation: &mut ScriptInvocation<'a>, value: Option<&[u8]>) {
    match value {
        Some(value) => invocation.arg("1").arg(value),
        None => invocation.arg("0").arg(""),
    };
}

#[async_trait]
impl JournalStore for Operations {
    async fn record(&self, operation: &NewOperation) -> Result<JournalRecord, StoreError> {
        const OP: Operation = Operation::Record;
        let key = operation.key();
        let request = serde_json::to_string(operation.request())
            .map_err(|e| StoreError::backend(STORE, OP, format!("request: {e}")))?;
        let mut invocation = self.invocation(&JOURNAL_SCRIPTS.record, key);
        invocation
            .arg(key.namespace().as_str())
            .arg(key.id().subject())
            .arg(key.id().effect())
            .arg(request)
            .arg(operation.provider_key());
        present(Some(self.run(OP, &invocation).await?), OP)
    }

    async fn get(&self, key: &OperationKey) -> Result<Option<JournalRecord>, StoreError> {
        let invocation = JOURNAL_SCRIPTS.get.key(operation_key(&self.prefix, key));
        record(self.run(Operation::Get, &invocation).await?, Operation::Get)
    }

    async fn acquire(&self, held: Holder<'_>, lease: Duration) -> Result<Acquired, StoreError> {
        let Holder { key, owner, .. } = held;
        const OP: Operation = Operation::Acquire;
        let lease = validate_lease(lease)?;
        let mut invocation = self.invocation(&JOURNAL_SCRIPTS.acquire, key);
        invocation.arg(owner.to_string()).arg(millis(lease));
        let mut reply = items(self.run(OP, &invocation).await?, OP)?.into_iter();
        let outcome = reply.next().as_ref().and_then(bytes);
        let now = reply
            .next()
            .as_ref()
            .and_then(int)
            .map(Timestamp::from_unix_millis)
            .ok_or_else(|| corrupt(OP, "now"))?;
        let answer = outcome.unwrap_or_default();
        Acquired::from_answer(&answer, owner, now, || present(reply.next(), OP))?
            .ok_or_else(|| corrupt(OP, "acquire outcome"))
    }

    async fn mark_sent(&self, held: Holder<'_>, sends: u32) -> Result<JournalRecord, StoreError> {
        let Holder { key, owner, .. } = held;
        let mut invocation = self.invocation(&JOURNAL_SCRIPTS.mark_sent, key);
        invocation
            .arg(owner.to_string())
            .arg(sends)
            .arg(sends.saturating_add(1));
        fenced(
            self.run(Operation::MarkSent, &invocation).await?,
            Operation::MarkSent,
        )
    }

    async fn finish(&self, held: Holder<'_>, finish: &Finish) -> Result<JournalRecord, StoreError> {
        let Holder { key, owner, .. } = held;
        let mut invocation = self.invocation(&JOURNAL_SCRIPTS.finish, key);
        invocation.arg(owner.to_string()).arg(finish.state.as_str());
        let search_until = finish
            .search_until
            .map(|until| until.as_unix_millis().to_string());
        flagged(
            &mut invocation,
            finish.provider_id.as_deref().map(str::as_bytes),
        );
        flagged(&mut invocation, finish.detail.as_deref().map(str::as_bytes));
        flagged(&mut invocation, search_until.as_deref().map(str::as_bytes));
        fenced(
            self.run(Operation::Finish, &invocation).await?,
            Operation::Finish,
        )
    }

    async fn list(&self, query: &ListQuery) -> Result<Vec<JournalRecord>, StoreError> {
        const OP: Operation = Operation::List;
        let limit = validate_list_limit(query.limit)?;
        let tag = namespace_tag(&self.prefix, &query.namespace);
        // None asked, none found.
        let Some((first, rest)) = query.states.split_first() else {
            return Ok(Vec::new());
        };
        let mut invocation = JOURNAL_SCRIPTS.list.key(index_key(&tag, *first));
        for state in rest {
            invocation.key(index_key(&tag, *state));
        }
        invocation.arg(millis(query.older_than)).arg(limit);
        items(self.run(OP, &invocation).await?, OP)?
            .into_iter()
            .map(|hash| record(hash, OP)?.ok_or_else(|| corrupt(OP, "record")))
            .collect()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            STORE,
            TransactionSharing::None,
            Durability::Unknown,
            ClockSource::Server,
            usize::MAX,
        )
        .with_eviction(Eviction::Unknown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(namespace: &str, subject: &str, effect: &str) -> String {
        let key = OperationKey::new(
            Tenant::new(namespace).unwrap(),
            OperationId::new(subject, effect).unwrap(),
        );
        operation_key("j", &key)
    }

    #[test]
    fn separators_cannot_make_two_operations_meet() {
        assert_eq!(key("a", "b", "c"), "j:{1:a}:op:1:b:c");
        assert_ne!(key("a:b", "c", "d"), key("a", "b:c", "d"));
        assert_ne!(key("a", "b:c", "d"), key("a", "b", "c:d"));
        assert_ne!(key("a}", "b", "c"), key("a", "}b", "c"));
        assert_ne!(key("a%7D", "b", "c"), key("a}", "b", "c"));
        assert_eq!(key("{n}", "{s}", "e"), "j:{7:%7Bn%7D}:op:3:{s}:e");
    }

    #[test]
    fn the_hash_tag_is_exactly_the_namespace() {
        let namespace = Tenant::new("t{x}").unwrap();
        let tag = namespace_tag("j", &namespace);
        for stored in [
            key("t{x}", "s}", "{e"),
            index_key(&tag, OperationState::NeedsReview),
        ] {
            let open = stored.find('{').unwrap();
            let close = stored[open..].find('}').unwrap() + open;
            assert_eq!(&stored[open..=close], "{8:t%7Bx%7D}", "{stored}");
        }
    }
}
