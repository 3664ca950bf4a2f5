//! `RedisStore`: one script per operation over a single node or a cluster.

use std::fmt;
use std::time::Duration;

use idem_core::store::{
    Capabilities, ClaimOutcome, ClaimRequest, ClockSource, Durability, Eviction, IdempotencyStore,
    Layered, Lease, OperationLayer, Record, Timestamp, TransactionSharing, check_response_size,
    checkpoint_json, encode_headers, forward_store, millis, storage_key_escaped, validate_lease,
};
use idem_core::{Checkpoint, Operation, Scope, StoreError, StoredResponse, async_trait};
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::claim::claim;
use crate::codec::{bytes, record};
use crate::commands::SCRIPTS;
use crate::error::{STORE, classify};
use crate::options::RedisOptions;

/// A connection to one Redis server or to a Redis Cluster.
#[derive(Clone)]
pub enum RedisConnection {
    /// One server, through a manager that reconnects by itself.
    Single(ConnectionManager),
    /// A cluster; each record lives in the slot of its scope.
    Cluster(ClusterConnection),
}

impl From<ConnectionManager> for RedisConnection {
    fn from(conn: ConnectionManager) -> Self {
        Self::Single(conn)
    }
}

impl From<ClusterConnection> for RedisConnection {
    fn from(conn: ClusterConnection) -> Self {
        Self::Cluster(conn)
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// The Redis store.
///
/// Every operation is one Lua script and one round trip (`EVALSHA`, loading
/// the script only when the server lacks it); leases and retention are
/// judged by the server's `TIME` inside the script, and records expire by
/// `PEXPIREAT` at their retention.
///
/// Every operation goes through the store's
/// [`OperationLayer`](idem_core::store::OperationLayer): it is bounded by the
/// [operation timeout](idem_core::StoreOptions::with_operation_timeout) (5 s
/// by default), the driver's reconnects and retries included, ends in a
/// retryable [`StoreError::Unavailable`] past it, and gets its span and
/// metrics whoever calls it.
///
/// Construction reads the server's `maxmemory-policy` and refuses a policy
/// that can evict records (every `allkeys-*` and `volatile-*`), unless
/// [`RedisOptions::accept_eviction_risk`] says otherwise.
///
/// ```no_run
/// use idem_redis::{redis, RedisStore};
///
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// let client = redis::Client::open("redis://127.0.0.1:6379")?;
/// let conn = redis::aio::ConnectionManager::new(client).await?;
/// let store = RedisStore::new(conn).await?;
/// # let _ = store; Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RedisStore {
    records: Layered<Records>,
}

forward_store!(RedisStore => records);

/// The connection and what construction learnt, inside the store's layer.
#[derive(Clone)]
struct Records {
    conn: RedisConnection,
    prefix: String,
    max_response_bytes: usize,
    eviction: Eviction,
    durability: Durability,
}

impl fmt::Debug for Records {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.conn {
            RedisConnection::Single(_) => "single",
            RedisConnection::Cluster(_) => "cluster",
        };
        f.debug_struct("RedisStore")
            .field("connection", &kind)
            .field("prefix", &self.prefix)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("eviction", &self.eviction)
            .field("durability", &self.durability)
            .finish()
    }
}

/// `CONFIG GET name`, or `None` where CONFIG is disabled (managed Redis).
async fn config_get(conn: &RedisConnection, name: &str) -> Option<String> {
    let reply: Value = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async(&mut conn.clone())
        .await
        .ok()?;
    let pairs = match reply {
        Value::Array(items) => items,
        Value::Map(pairs) => pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        _ => return None,
    };
    let value = pairs.get(1).and_then(bytes)?;
    String::from_utf8(value).ok()
}

impl RedisStore {
    /// A store with the default options; see [`with_options`](Self::with_options).
    ///
    /// # Errors
    ///
    /// As [`with_options`](Self::with_options).
    pub async fn new(conn: impl Into<RedisConnection>) -> Result<Self, StoreError> {
        Self::with_options(conn, RedisOptions::default()).await
    }

    /// A store over `conn`, after checking the options and that the server
    /// will neither evict records nor lose them on a restart.
    ///
    /// # Errors
    ///
    /// [`StoreError::InvalidInput`] if an option breaks its rule (see
    /// [`RedisOptions`]); [`StoreError::Misconfigured`] if
    /// `maxmemory-policy` can evict and the options do not accept the risk
    /// ([`RedisOptions::accept_eviction_risk`]), or if the server keeps no
    /// append-only file and the options do not accept that
    /// ([`RedisOptions::accept_volatility`]); [`StoreError::Unavailable`] if
    /// a `CONFIG GET` does not answer within the operation timeout.
    /// Where `CONFIG` is disabled neither can be read: a warning is logged
    /// and capabilities report [`Eviction::Unknown`] and
    /// [`Durability::Unknown`].
    pub async fn with_options(
        conn: impl Into<RedisConnection>,
        options: RedisOptions,
    ) -> Result<Self, StoreError> {
        let max_response_bytes = options.validate()?;
        let layer = OperationLayer::new(STORE, options.store.operation_timeout());
        let conn = conn.into();
        let shared = &conn;
        let config = |name| {
            layer.call(Operation::Setup, None, async move {
                Ok(config_get(shared, name).await)
            })
        };
        let eviction = match config("maxmemory-policy").await? {
            None => {
                tracing::warn!(
                    "cannot read maxmemory-policy (CONFIG disabled?): make sure it is noeviction, \
                     or Redis may evict idempotency records and retries will run twice"
                );
                Eviction::Unknown
            }
            Some(policy) if policy.starts_with("allkeys-") || policy.starts_with("volatile-") => {
                if !options.accept_eviction_risk {
                    return Err(StoreError::Misconfigured {
                        store: STORE,
                        message: format!(
                            "maxmemory-policy is {policy}: Redis may evict idempotency records \
                             under memory pressure, and a retry after an eviction runs the work \
                             again. Set `maxmemory-policy noeviction` (CONFIG SET or redis.conf), \
                             or opt in with RedisOptions::accept_eviction_risk()"
                        ),
                    });
                }
                tracing::warn!(%policy, "accepting a maxmemory-policy that may evict idempotency records");
                Eviction::Possible
            }
            Some(_) => Eviction::Never,
        };
        let durability = match config("appendonly").await?.as_deref() {
            Some("yes") => Durability::Durable,
            // Without the append-only file, writes since the last snapshot are lost.
            Some(_) if !options.accept_volatility => {
                return Err(StoreError::Misconfigured {
                    store: STORE,
                    message: "appendonly is no: Redis loses the records written since its last \
                              snapshot when it restarts, and a retry of a lost key runs the work \
                              again. Set `appendonly yes` (CONFIG SET or redis.conf), or opt in \
                              with RedisOptions::accept_volatility()"
                        .to_string(),
                });
            }
            Some(_) => {
                tracing::warn!(
                    "accepting a Redis without an append-only file: records are lost on restart"
                );
                Durability::Volatile
            }
            None => {
                tracing::warn!(
                    "cannot read appendonly (CONFIG disabled?): make sure the server persists \
                     writes, or a restart forgets idempotency records and retries run twice"
                );
                Durability::Unknown
            }
        };
        let records = Records {
            conn,
            prefix: options.prefix,
            max_response_bytes,
            eviction,
            durability,
        };
        Ok(Self {
            records: Layered::with_layer(records, layer),
        })
    }

    /// The Redis key that holds a scope's record: `<prefix>:{<n>:<tenant>:<key>}`,
    /// where tenant and key are percent-escaped (`%`, `{`, `}`) and `n` is the
    /// escaped tenant's byte length (see
    /// [`storage_key_escaped`](idem_core::store::storage_key_escaped)). The
    /// length prefix makes the encoding injective, whatever separators the
    /// parts hold, and the braces are a hash tag that holds exactly the
    /// scope, so a cluster places each record by its whole scope.
    pub fn record_key(&self, scope: &Scope) -> String {
        record_key(&self.records.get_ref().prefix, scope)
    }
}

impl Records {
    /// Runs a script whose only argument is `scope`'s record key.
    async fn keyed<T: redis::FromRedisValue>(
        &self,
        operation: Operation,
        script: &redis::Script,
        scope: &Scope,
    ) -> Result<T, StoreError> {
        script
            .key(record_key(&self.prefix, scope))
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| classify(operation, e))
    }

    /// Runs one fenced script with the lease's owner and `args`; its reply,
    /// 0 where the lease no longer holds.
    async fn fenced(
        &self,
        operation: Operation,
        script: &redis::Script,
        lease: &Lease,
        args: &[&[u8]],
    ) -> Result<i64, StoreError> {
        let mut invocation = script.key(record_key(&self.prefix, lease.scope()));
        invocation.arg(lease.owner().to_string());
        for arg in args {
            invocation.arg(*arg);
        }
        invocation
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| classify(operation, e))
    }
}

/// The Redis key of `scope` under `prefix`; see [`RedisStore::record_key`].
fn record_key(prefix: &str, scope: &Scope) -> String {
    format!("{prefix}:{{{}}}", storage_key_escaped(scope, &['{', '}']))
}

/// A fenced script's 1 or 0 as success or a lost lease.
fn held(reply: i64) -> Result<(), StoreError> {
    if reply == 1 {
        Ok(())
    } else {
        Err(StoreError::LostLease)
    }
}

#[async_trait]
impl IdempotencyStore for Records {
    async fn claim(&self, request: &ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let key = record_key(&self.prefix, request.scope());
        claim(&mut self.conn.clone(), &key, request).await
    }

    async fn complete(&self, lease: &Lease, response: &StoredResponse) -> Result<(), StoreError> {
        check_response_size(response, self.max_response_bytes)?;
        let retention = millis(lease.retention()).to_string();
        let status = response.status().to_string();
        let headers = encode_headers(response);
        let args: [&[u8]; 4] = [
            retention.as_bytes(),
            status.as_bytes(),
            &headers,
            response.body(),
        ];
        held(
            self.fenced(Operation::Complete, &SCRIPTS.complete, lease, &args)
                .await?,
        )
    }

    async fn renew(&self, lease: &Lease, extend: Duration) -> Result<Lease, StoreError> {
        let extend = millis(validate_lease(extend)?).to_string();
        match self
            .fenced(
                Operation::Renew,
                &SCRIPTS.renew,
                lease,
                &[extend.as_bytes()],
            )
            .await?
        {
            0 => Err(StoreError::LostLease),
            until => Ok(lease.renewed(Timestamp::from_unix_millis(until))),
        }
    }

    async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        held(
            self.fenced(Operation::Release, &SCRIPTS.release, lease, &[])
                .await?,
        )
    }

    async fn checkpoint(&self, lease: &Lease, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        let data = checkpoint_json(checkpoint);
        let args: [&[u8]; 2] = [checkpoint.name().as_bytes(), data.as_bytes()];
        held(
            self.fenced(Operation::Checkpoint, &SCRIPTS.checkpoint, lease, &args)
                .await?,
        )
    }

    async fn get(&self, scope: &Scope) -> Result<Option<Record>, StoreError> {
        let reply: Vec<Value> = self.keyed(Operation::Get, &SCRIPTS.get, scope).await?;
        record(scope, &reply)
    }

    async fn purge_expired(&self) -> Result<u64, StoreError> {
        // PEXPIREAT makes Redis delete every record at its retention: nothing
        // is left, and nothing is sent.
        Ok(0)
    }

    async fn delete(&self, scope: &Scope) -> Result<bool, StoreError> {
        let live: i64 = self
            .keyed(Operation::Delete, &SCRIPTS.delete, scope)
            .await?;
        Ok(live == 1)
    }

    async fn now(&self, scope: &Scope) -> Result<Timestamp, StoreError> {
        let millis: i64 = self.keyed(Operation::Now, &SCRIPTS.now, scope).await?;
        Ok(Timestamp::from_unix_millis(millis))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            STORE,
            TransactionSharing::None,
            self.durability,
            ClockSource::Server,
            self.max_response_bytes,
        )
        .with_eviction(self.eviction)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::StoreOptions;

    fn key(tenant: &str, key: &str) -> String {
        record_key("idem", &Scope::parse(tenant, key).unwrap())
    }

    #[test]
    fn separators_cannot_make_two_scopes_meet() {
        assert_eq!(key("a:b", "c"), "idem:{3:a:b:c}");
        assert_eq!(key("a", "b:c"), "idem:{1:a:b:c}");
        assert_ne!(key("a}", "b"), key("a", "}b"));
        assert_ne!(key("a%7D", "b"), key("a}", "b"));
        assert_eq!(key("{t}", "{k}"), "idem:{7:%7Bt%7D:%7Bk%7D}");
    }

    #[test]
    fn hash_tag_is_the_whole_scope() {
        let k = key("t{x}", "k}");
        let open = k.find('{').unwrap();
        let close = k[open..].find('}').unwrap() + open;
        assert_eq!(close, k.len() - 1, "{k}");
    }

    #[tokio::test]
    async fn a_zero_operation_timeout_is_refused_at_construction() {
        // A lazy manager connects on first use, which never comes: the
        // options are refused before anything is sent.
        let client = redis::Client::open("redis://127.0.0.1:1").expect("a URL that parses");
        let lazy = ConnectionManager::new_lazy_with_config(
            client,
            redis::aio::ConnectionManagerConfig::new(),
        )
        .expect("a lazy manager");
        let refused = RedisStore::with_options(
            lazy,
            RedisOptions::default()
                .store_options(StoreOptions::default().with_operation_timeout(Duration::ZERO)),
        )
        .await;
        // Refused with the shared options' own answer.
        let shared = StoreOptions::default()
            .with_operation_timeout(Duration::ZERO)
            .checked(1, 1, "")
            .expect_err("a zero timeout");
        assert_eq!(
            refused.expect_err("a zero timeout").to_string(),
            StoreError::InvalidInput(shared).to_string()
        );
    }

    #[test]
    fn the_prefix_leads_the_key() {
        let scope = Scope::parse("t", "k").unwrap();
        assert_eq!(record_key("billing", &scope), "billing:{1:t:k}");
    }
}
