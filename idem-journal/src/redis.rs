//! The journal on one Redis node: a hash per operation, and a sorted set
//! per state (scored by the last change) for listings; each write is one
//! script, so the operation and its listing move together.

use idem_core::async_trait;
use idem_redis::redis::aio::ConnectionManager;
use idem_redis::redis::{self, Script};

use crate::error::JournalError;
use crate::operation::{Operation, OperationId, OperationState};
use crate::store::{JournalStore, Versioned};

const STORE: &str = "redis";

/// The journal store on one Redis server (several keys move in one script,
/// so not a cluster), under a key prefix (default `idem-journal`).
#[derive(Clone)]
pub struct RedisJournal {
    conn: ConnectionManager,
    prefix: String,
}

impl std::fmt::Debug for RedisJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisJournal")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

fn failed(error: impl Into<idem_core::BoxError>) -> JournalError {
    JournalError::store(STORE, error)
}

/// KEYS: the operation's hash, its state's set. ARGV: the operation, its
/// member name, its score. Reply: {version, operation} of what is stored.
const INSERT: &str = r"
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'v', 1, 'op', ARGV[1])
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
end
return redis.call('HMGET', KEYS[1], 'v', 'op')";

/// KEYS: the hash, the old state's set, the new state's set. ARGV: the
/// expected version, the operation, the member, the score. Reply: 1 if set.
const CAS: &str = r"
if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'v', tonumber(ARGV[1]) + 1, 'op', ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3])
return 1";

impl RedisJournal {
    /// The journal store over a connection to one server.
    pub fn new(conn: ConnectionManager) -> Self {
        Self::with_prefix(conn, "idem-journal")
    }

    /// The same under another key prefix.
    pub fn with_prefix(conn: ConnectionManager, prefix: &str) -> Self {
        Self {
            conn,
            prefix: prefix.to_string(),
        }
    }

    /// The set member naming an operation: its identity as JSON, whatever
    /// the parts hold.
    fn member(id: &OperationId) -> Result<String, JournalError> {
        serde_json::to_string(id).map_err(failed)
    }

    fn hash(&self, member: &str) -> String {
        format!("{}:op:{member}", self.prefix)
    }

    fn set(&self, state: OperationState) -> String {
        format!("{}:state:{}", self.prefix, state.as_str())
    }

    fn decode(reply: (Option<u64>, Option<String>)) -> Result<Option<Versioned>, JournalError> {
        match reply {
            (Some(version), Some(text)) => Ok(Some(Versioned {
                operation: serde_json::from_str(&text).map_err(failed)?,
                version,
            })),
            _ => Ok(None),
        }
    }
}

#[async_trait]
impl JournalStore for RedisJournal {
    async fn insert_if_absent(&self, operation: &Operation) -> Result<Versioned, JournalError> {
        let member = Self::member(&operation.id)?;
        let reply: (Option<u64>, Option<String>) = Script::new(INSERT)
            .key(self.hash(&member))
            .key(self.set(operation.state))
            .arg(serde_json::to_string(operation).map_err(failed)?)
            .arg(&member)
            .arg(operation.updated_at_ms)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(failed)?;
        Self::decode(reply)?.ok_or_else(|| JournalError::NotFound(operation.id.clone()))
    }

    async fn get(&self, id: &OperationId) -> Result<Option<Versioned>, JournalError> {
        let reply: (Option<u64>, Option<String>) = redis::cmd("HMGET")
            .arg(self.hash(&Self::member(id)?))
            .arg("v")
            .arg("op")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(failed)?;
        Self::decode(reply)
    }

    async fn compare_and_set(
        &self,
        version: u64,
        operation: &Operation,
    ) -> Result<bool, JournalError> {
        let member = Self::member(&operation.id)?;
        let Some(stored) = self.get(&operation.id).await? else {
            return Ok(false);
        };
        let done: i64 = Script::new(CAS)
            .key(self.hash(&member))
            .key(self.set(stored.operation.state))
            .key(self.set(operation.state))
            .arg(version)
            .arg(serde_json::to_string(operation).map_err(failed)?)
            .arg(&member)
            .arg(operation.updated_at_ms)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(failed)?;
        Ok(done == 1)
    }

    async fn list(
        &self,
        states: &[OperationState],
        updated_before_ms: i64,
        limit: usize,
    ) -> Result<Vec<Operation>, JournalError> {
        let mut found = Vec::new();
        for state in states {
            let members: Vec<String> = redis::cmd("ZRANGE")
                .arg(self.set(*state))
                .arg("-inf")
                .arg(format!("({updated_before_ms}"))
                .arg("BYSCORE")
                .arg("LIMIT")
                .arg(0)
                .arg(limit)
                .query_async(&mut self.conn.clone())
                .await
                .map_err(failed)?;
            for member in members {
                let id: OperationId = serde_json::from_str(&member).map_err(failed)?;
                if let Some(stored) = self.get(&id).await? {
                    found.push(stored.operation);
                }
            }
        }
        found.sort_by_key(|op| op.updated_at_ms);
        found.truncate(limit);
        Ok(found)
    }
}
