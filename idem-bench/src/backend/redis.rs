//! Redis, one server or a cluster: the store over a connection manager or a
//! cluster connection; raw, the store's own claim and completion scripts on
//! the same connection. Each server counts the scripts it ran in
//! `INFO commandstats`.

use std::sync::Arc;
use std::time::Duration;

use idem_bench::Outcome;
use idem_core::Scope;
use idem_core::store::{encode_headers, millis};
use idem_redis::{RedisConnection, RedisStore, redis};

use super::{
    BenchError, Call, LEASE, Parts, RawBaseline, ServerCounter, Settings, claim_reply, completion,
    env,
};

/// Connects to the one server at `IDEM_REDIS_URL`.
pub(super) async fn connect(_settings: &Settings<'_>) -> Result<Parts<Raw, Counter>, BenchError> {
    let url = env("IDEM_REDIS_URL")?;
    let conn = manager(&url).await?;
    parts(conn, vec![url]).await
}

/// Connects to the cluster whose nodes `IDEM_REDIS_CLUSTER_URLS` lists,
/// comma-separated.
pub(super) async fn connect_cluster(
    _settings: &Settings<'_>,
) -> Result<Parts<Raw, Counter>, BenchError> {
    let urls: Vec<String> = env("IDEM_REDIS_CLUSTER_URLS")?
        .split(',')
        .map(|u| u.trim().to_string())
        .collect();
    let client = redis::cluster::ClusterClientBuilder::new(urls.clone())
        .connection_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(5))
        .build()?;
    let conn = client.get_async_connection().await?;
    parts(conn, urls).await
}

/// The store and the raw baseline on one connection; the counter reads
/// every node of `urls`.
async fn parts(
    conn: impl Into<RedisConnection> + Clone,
    urls: Vec<String>,
) -> Result<Parts<Raw, Counter>, BenchError> {
    // The bench measures whatever server it is given, persistent or not.
    let options = idem_redis::RedisOptions::default().accept_volatility();
    let store = RedisStore::with_options(conn.clone(), options).await?;
    Ok(Parts {
        store: Arc::new(store.clone()),
        raw: Raw {
            conn: conn.into(),
            store,
        },
        counter: Counter { urls },
    })
}

/// A connection that reconnects by itself, with the timeouts the store's
/// users are told to set.
async fn manager(url: &str) -> Result<redis::aio::ConnectionManager, BenchError> {
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(5)));
    Ok(redis::aio::ConnectionManager::new_with_config(redis::Client::open(url)?, config).await?)
}

/// The raw baseline: the store's scripts, with the store's record keys.
pub(super) struct Raw {
    conn: RedisConnection,
    /// Names the record keys, so raw and idem write the same keys.
    store: RedisStore,
}

impl RawBaseline for Raw {
    async fn execute(&self, call: &Call<'_>) -> Result<Outcome, BenchError> {
        let (tenant, op, retention, body) = (call.tenant, call.op, call.retention, &call.response);
        let key = self.store.record_key(&Scope::parse(tenant, &op.key)?);
        let owner = uuid::Uuid::new_v4().to_string();
        let reply: Vec<redis::Value> = idem_redis::scripts::claim()
            .key(&key)
            .arg(op.fingerprint.as_slice())
            .arg(&owner)
            .arg(millis(LEASE))
            .arg(millis(retention))
            .invoke_async(&mut self.conn.clone())
            .await?;
        let outcome = match reply.first() {
            Some(redis::Value::BulkString(word)) => claim_reply(word)?,
            Some(redis::Value::SimpleString(word)) => claim_reply(word.as_bytes())?,
            _ => return Err(format!("unexpected claim reply {reply:?}").into()),
        };
        if outcome != Outcome::Executed {
            return Ok(outcome);
        }
        let completed: i64 = idem_redis::scripts::complete()
            .key(&key)
            .arg(&owner)
            .arg(millis(retention))
            .arg(body.status())
            .arg(encode_headers(body))
            .arg(body.body())
            .invoke_async(&mut self.conn.clone())
            .await?;
        // The script replies 0 when another owner holds the record.
        completion(completed != 0)
    }
}

/// Sums the script calls every node has served.
pub(super) struct Counter {
    urls: Vec<String>,
}

impl ServerCounter for Counter {
    async fn round_trips(&self) -> Result<u64, BenchError> {
        let mut total = 0;
        for url in &self.urls {
            let mut conn = manager(url).await?;
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query_async(&mut conn)
                .await?;
            total += script_calls(&info);
        }
        Ok(total)
    }
}

/// The calls of what clients send (`EVALSHA`, `EVAL`, `SCRIPT`) in an
/// `INFO commandstats` reply; the scripts' inner calls are counted apart.
fn script_calls(info: &str) -> u64 {
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            matches!(name, "evalsha" | "eval" | "script").then_some(())?;
            rest.split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_calls_count_what_clients_send_and_not_the_scripts_inner_calls() {
        let info = "# Commandstats\r\n\
            cmdstat_evalsha:calls=120,usec=900,usec_per_call=7.50,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_hset:calls=80,usec=100,usec_per_call=1.25,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_eval:calls=3,usec=30,usec_per_call=10.00\r\n";
        assert_eq!(script_calls(info), 123);
    }
}
