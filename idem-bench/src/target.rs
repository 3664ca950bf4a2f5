//! What an operation runs against: idem (runner and store) or the same
//! server operations through the driver alone, and the server-side counters
//! of round trips.

use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum;
use idem_core::store::{
    ClaimOutcome, ClaimRequest, Clock, IdempotencyStore, SystemClock, encode_headers, storage_key,
};
use idem_core::{Fingerprint, Idempotency, RunError, RunOutcome, Scope, StoredResponse};
use idem_dynamo::DynamoStore;
use idem_dynamo::aws_sdk_dynamodb::types::{
    AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure,
};
use idem_dynamo::aws_sdk_dynamodb::{self, Client as DynamoClient};
use idem_memory::MemoryStore;
use idem_postgres::PostgresStore;
use idem_postgres::sqlx::postgres::PgPoolOptions;
use idem_postgres::sqlx::{self, Connection, PgConnection, PgPool, Row};
use idem_redis::{RedisStore, redis};
use moka::ops::compute::Op as MokaOp;
use moka::sync::Cache;

use crate::plan::Op;

/// The backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BackendKind {
    Memory,
    Postgres,
    Redis,
    RedisCluster,
    Dynamo,
}

impl BackendKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Postgres => "postgres",
            Self::Redis => "redis",
            Self::RedisCluster => "redis-cluster",
            Self::Dynamo => "dynamo",
        }
    }
}

pub(crate) type BenchError = Box<dyn std::error::Error + Send + Sync>;

const LEASE_MS: i64 = 30_000;

fn env(name: &str) -> Result<String, BenchError> {
    std::env::var(name).map_err(|_| format!("{name} is not set (scripts/bench sets it)").into())
}

/// The response every operation stores: a small JSON body and one header.
pub(crate) fn response() -> StoredResponse {
    StoredResponse::new(
        201,
        br#"{"order":"A-1","status":"placed","total":42}"#.to_vec(),
    )
    .with_header("content-type", "application/json")
}

/// The same server operations without idem.
pub(crate) enum Raw {
    Memory(Cache<String, Arc<RawRecord>>),
    Postgres {
        pool: PgPool,
        claim_sql: Arc<str>,
        complete_sql: Arc<str>,
    },
    Redis(idem_redis::RedisConnection, RedisStore),
    Dynamo {
        client: DynamoClient,
        table: String,
    },
}

/// What the raw memory baseline keeps: the decision's inputs, nothing more.
#[derive(Clone)]
pub(crate) struct RawRecord {
    fingerprint: [u8; 32],
    owner: u64,
    done: bool,
    lease_until: std::time::Instant,
    body: Vec<u8>,
}

/// Expires each raw record at its retention, like the store's per-entry expiry.
pub(crate) struct RawExpiry(Duration);

impl moka::Expiry<String, Arc<RawRecord>> for RawExpiry {
    fn expire_after_create(
        &self,
        _key: &String,
        _value: &Arc<RawRecord>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(self.0)
    }

    fn expire_after_update(
        &self,
        _key: &String,
        _value: &Arc<RawRecord>,
        _updated_at: std::time::Instant,
        _remaining: Option<Duration>,
    ) -> Option<Duration> {
        Some(self.0)
    }
}

/// What an operation runs against.
pub(crate) enum Target {
    Lib(Idempotency<dyn IdempotencyStore>),
    Raw(Raw),
}

/// Everything one run needs, and what it counts round trips with.
pub(crate) struct Backend {
    /// Records outlive the run by a minute, then expire, so nothing piles up.
    retention_ms: i64,
    pub(crate) tenant: String,
    pub(crate) store: Arc<dyn IdempotencyStore>,
    pub(crate) target: Target,
    counter: Counter,
}

enum Counter {
    None,
    Postgres {
        url: String,
        pool: PgPool,
    },
    Redis(Vec<String>),
    Dynamo {
        endpoint: String,
        table: String,
        client: DynamoClient,
    },
}

async fn dynamo_client(endpoint: &str) -> DynamoClient {
    use aws_sdk_dynamodb::config::{Credentials, Region};
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version_latest()
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("bench", "bench", None, None, "idem-bench"))
        .build();
    DynamoClient::from_conf(config)
}

async fn redis_manager(url: &str) -> Result<redis::aio::ConnectionManager, BenchError> {
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(5)));
    Ok(redis::aio::ConnectionManager::new_with_config(redis::Client::open(url)?, config).await?)
}

/// The names one run writes under: a tenant of its own, and for DynamoDB a table.
pub(crate) struct Names {
    tenant: String,
    table: String,
}

impl Names {
    pub(crate) fn fresh() -> Self {
        let id = uuid::Uuid::new_v4().simple();
        Self {
            tenant: format!("bench-{id}"),
            table: format!("bench-{id}"),
        }
    }
}

impl Backend {
    /// Connects; with `setup`, also creates the table (migration, DynamoDB table).
    pub(crate) async fn connect(
        kind: BackendKind,
        raw: bool,
        concurrency: usize,
        names: &Names,
        setup: bool,
        retention: Duration,
    ) -> Result<Self, BenchError> {
        let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let tenant = names.tenant.clone();
        let (store, raw_target, counter): (Arc<dyn IdempotencyStore>, Raw, Counter) = match kind {
            BackendKind::Memory => (
                Arc::new(MemoryStore::new()),
                // Per-entry expiry, as the store configures moka.
                Raw::Memory(Cache::builder().expire_after(RawExpiry(retention)).build()),
                Counter::None,
            ),
            BackendKind::Postgres => {
                let url = env("IDEM_POSTGRES_URL")?;
                let pool = PgPoolOptions::new()
                    .max_connections(u32::try_from(concurrency.max(1)).unwrap_or(u32::MAX))
                    .test_before_acquire(false)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect(&url)
                    .await?;
                let store = PostgresStore::new(pool.clone());
                if setup {
                    store.migrate().await?;
                }
                let raw = Raw::Postgres {
                    pool: pool.clone(),
                    claim_sql: store.claim_sql().into(),
                    complete_sql: store.complete_sql().into(),
                };
                (Arc::new(store), raw, Counter::Postgres { url, pool })
            }
            BackendKind::Redis => {
                let url = env("IDEM_REDIS_URL")?;
                let conn = redis_manager(&url).await?;
                let store = RedisStore::new(conn.clone()).await?;
                (
                    Arc::new(store.clone()),
                    Raw::Redis(conn.into(), store),
                    Counter::Redis(vec![url]),
                )
            }
            BackendKind::RedisCluster => {
                let urls: Vec<String> = env("IDEM_REDIS_CLUSTER_URLS")?
                    .split(',')
                    .map(|u| u.trim().to_string())
                    .collect();
                let client = redis::cluster::ClusterClientBuilder::new(urls.clone())
                    .connection_timeout(Duration::from_secs(2))
                    .response_timeout(Duration::from_secs(5))
                    .build()?;
                let conn = client.get_async_connection().await?;
                let store = RedisStore::new(conn.clone()).await?;
                (
                    Arc::new(store.clone()),
                    Raw::Redis(conn.into(), store),
                    Counter::Redis(urls),
                )
            }
            BackendKind::Dynamo => {
                let endpoint = env("IDEM_DYNAMO_ENDPOINT")?;
                let table = names.table.clone();
                let client = dynamo_client(&endpoint).await;
                let store = DynamoStore::with_options(
                    client.clone(),
                    idem_dynamo::DynamoOptions::default().table(&table),
                )?;
                if setup {
                    store.create_table().await?;
                }
                let raw = Raw::Dynamo {
                    client: client.clone(),
                    table: table.clone(),
                };
                (
                    Arc::new(store),
                    raw,
                    Counter::Dynamo {
                        endpoint,
                        table,
                        client,
                    },
                )
            }
        };
        let target = if raw {
            Target::Raw(raw_target)
        } else {
            Target::Lib(
                Idempotency::new(Arc::clone(&store))
                    .with_lease(Duration::from_millis(LEASE_MS as u64))?
                    .with_retention(retention)?,
            )
        };
        Ok(Self {
            retention_ms,
            tenant,
            store,
            target,
            counter,
        })
    }

    /// Round trips the server has seen so far, by its own count.
    pub(crate) async fn round_trips(&self) -> Result<u64, BenchError> {
        match &self.counter {
            Counter::None => Ok(0),
            Counter::Postgres { url, .. } => {
                // A connection of its own, closed after: its one transaction is
                // counted in the next reading, which subtracts it.
                let mut conn = PgConnection::connect(url).await?;
                let row = sqlx::query(
                    "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database \
                     WHERE datname = current_database()",
                )
                .fetch_one(&mut conn)
                .await?;
                conn.close().await?;
                Ok(u64::try_from(row.try_get::<i64, _>(0)?)?)
            }
            Counter::Redis(urls) => {
                let mut total = 0;
                for url in urls {
                    let mut conn = redis_manager(url).await?;
                    let info: String = redis::cmd("INFO")
                        .arg("commandstats")
                        .query_async(&mut conn)
                        .await?;
                    total += info
                        .lines()
                        .filter_map(|line| {
                            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                            // What clients send; scripts' inner calls are counted apart.
                            matches!(name, "evalsha" | "eval" | "script").then_some(())?;
                            rest.split(',')
                                .find_map(|kv| kv.strip_prefix("calls="))?
                                .parse::<u64>()
                                .ok()
                        })
                        .sum::<u64>();
                }
                Ok(total)
            }
            Counter::Dynamo {
                endpoint, table, ..
            } => dynamo_requests(endpoint, table).await,
        }
    }

    /// Ends the run's connections, so the server's statistics are complete.
    pub(crate) async fn quiesce(&self) {
        if let Counter::Postgres { pool, .. } = &self.counter {
            // Backends flush their statistics as they exit.
            pool.close().await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// Round trips that reading the counter itself added between two readings.
    pub(crate) fn counter_overhead(&self) -> u64 {
        match self.counter {
            Counter::Postgres { .. } => 1,
            _ => 0,
        }
    }

    /// Removes what the run wrote, where it would otherwise pile up.
    pub(crate) async fn clean_up(&self) -> Result<(), BenchError> {
        if let Counter::Postgres { url, .. } = &self.counter {
            let mut conn = PgConnection::connect(url).await?;
            sqlx::query("DELETE FROM idem_records WHERE tenant = $1")
                .bind(&self.tenant)
                .execute(&mut conn)
                .await?;
        }
        if let Counter::Dynamo { client, table, .. } = &self.counter {
            client.delete_table().table_name(table).send().await?;
        }
        Ok(())
    }

    /// Runs one operation; `Ok(true)` if it completed a claim (a store call more).
    pub(crate) async fn execute(&self, op: &Op) -> Result<bool, BenchError> {
        match &self.target {
            Target::Lib(idem) => {
                let scope = Scope::parse(&self.tenant, &op.key)?;
                let fingerprint = Fingerprint::from_digest(op.fingerprint);
                let outcome = idem
                    .run(scope, fingerprint, |_ctx| async { Ok(response()) })
                    .await;
                match outcome {
                    Ok(RunOutcome::Executed(_)) => Ok(true),
                    Ok(RunOutcome::Replayed(_))
                    | Err(RunError::InProgress { .. } | RunError::Mismatch) => Ok(false),
                    Err(other) => Err(other.to_string().into()),
                }
            }
            Target::Raw(raw) => raw.execute(&self.tenant, op, self.retention_ms).await,
        }
    }
}

async fn dynamo_requests(endpoint: &str, table: &str) -> Result<u64, BenchError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let mut stream = tokio::net::TcpStream::connect(&addr).await?;
    stream
        .write_all(
            format!("GET /__idem/requests?table={table} HTTP/1.0\r\nHost: {addr}\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await?;
    let body = reply
        .split("\r\n\r\n")
        .nth(1)
        .ok_or("no body from the request counter")?;
    let value: serde_json::Value = serde_json::from_str(body)?;
    value["requests"].as_u64().ok_or_else(|| {
        "the DynamoDB endpoint does not count requests (use scripts/moto_server.py)".into()
    })
}

fn now_ms() -> i64 {
    // The raw baselines read the clock as the stores do.
    SystemClock.now().as_unix_millis()
}

impl Raw {
    async fn execute(&self, tenant: &str, op: &Op, retention_ms: i64) -> Result<bool, BenchError> {
        let body = response();
        match self {
            Raw::Memory(cache) => {
                let now = std::time::Instant::now();
                let owner = rand::random::<u64>();
                let mut claimed = false;
                let key = format!("{}:{tenant}:{}", tenant.len(), op.key);
                cache
                    .entry(key.clone())
                    .and_compute_with(|entry| match entry {
                        Some(e) => {
                            let r = e.value();
                            if r.fingerprint == op.fingerprint && r.done {
                                // A replay hands the stored body back, as the store does.
                                std::hint::black_box(r.body.clone());
                                MokaOp::Nop
                            } else if r.fingerprint != op.fingerprint
                                || r.done
                                || r.lease_until > now
                            {
                                MokaOp::Nop
                            } else {
                                claimed = true;
                                MokaOp::Put(Arc::new(RawRecord {
                                    owner,
                                    lease_until: now + Duration::from_secs(30),
                                    ..(**r).clone()
                                }))
                            }
                        }
                        None => {
                            claimed = true;
                            MokaOp::Put(Arc::new(RawRecord {
                                fingerprint: op.fingerprint,
                                owner,
                                done: false,
                                lease_until: now + Duration::from_secs(30),
                                body: Vec::new(),
                            }))
                        }
                    });
                if claimed {
                    cache.entry(key).and_compute_with(|entry| match entry {
                        Some(e) if e.value().owner == owner && !e.value().done => {
                            MokaOp::Put(Arc::new(RawRecord {
                                done: true,
                                body: body.body().to_vec(),
                                ..(**e.value()).clone()
                            }))
                        }
                        _ => MokaOp::Nop,
                    });
                }
                Ok(claimed)
            }
            Raw::Postgres {
                pool,
                claim_sql,
                complete_sql,
            } => {
                let owner = uuid::Uuid::new_v4();
                let row = sqlx::query(sqlx::AssertSqlSafe(claim_sql.clone()))
                    .bind(tenant)
                    .bind(&op.key)
                    .bind(op.fingerprint.as_slice())
                    .bind(owner)
                    .bind(LEASE_MS)
                    .bind(retention_ms)
                    .fetch_one(pool)
                    .await?;
                let outcome: String = row.try_get("o_outcome")?;
                if outcome == "completed" {
                    let _body: Option<Vec<u8>> = row.try_get("o_response_body")?;
                }
                if outcome != "claimed" {
                    return Ok(false);
                }
                let names: Vec<&[u8]> = body.headers().iter().map(|(n, _)| n.as_bytes()).collect();
                let values: Vec<&[u8]> = body.headers().iter().map(|(_, v)| v.as_slice()).collect();
                sqlx::query(sqlx::AssertSqlSafe(complete_sql.clone()))
                    .bind(tenant)
                    .bind(&op.key)
                    .bind(owner)
                    .bind(retention_ms)
                    .bind(i32::from(body.status()))
                    .bind(names)
                    .bind(values)
                    .bind(body.body())
                    .execute(pool)
                    .await?;
                Ok(true)
            }
            Raw::Redis(conn, store) => {
                let key = store.record_key(&Scope::parse(tenant, &op.key)?);
                let owner = uuid::Uuid::new_v4().to_string();
                let reply: Vec<redis::Value> = idem_redis::scripts::claim()
                    .key(&key)
                    .arg(op.fingerprint.as_slice())
                    .arg(&owner)
                    .arg(LEASE_MS)
                    .arg(retention_ms)
                    .invoke_async(&mut conn.clone())
                    .await?;
                if !matches!(reply.first(), Some(redis::Value::BulkString(b)) if b == b"claimed") {
                    return Ok(false);
                }
                let _: i64 = idem_redis::scripts::complete()
                    .key(&key)
                    .arg(&owner)
                    .arg(retention_ms)
                    .arg(body.status())
                    .arg(encode_headers(&body))
                    .arg(body.body())
                    .invoke_async(&mut conn.clone())
                    .await?;
                Ok(true)
            }
            Raw::Dynamo { client, table } => {
                use idem_dynamo::expressions::{
                    CLAIM_CONDITION, CLAIM_UPDATE, COMPLETE_UPDATE, FENCE,
                };
                let s = |v: &str| AttributeValue::S(v.to_string());
                let n = |v: i64| AttributeValue::N(v.to_string());
                let pk = storage_key(&Scope::parse(tenant, &op.key)?);
                let owner = uuid::Uuid::new_v4().to_string();
                let now = now_ms();
                let exp = now + retention_ms;
                let claimed = client
                    .update_item()
                    .table_name(table)
                    .key("pk", s(&pk))
                    .update_expression(CLAIM_UPDATE)
                    .condition_expression(CLAIM_CONDITION)
                    .expression_attribute_names("#exp", "exp")
                    .expression_attribute_names("#ttl", "ttl")
                    .expression_attribute_values(
                        ":fp",
                        AttributeValue::B(op.fingerprint.to_vec().into()),
                    )
                    .expression_attribute_values(":own", s(&owner))
                    .expression_attribute_values(":f", s("f"))
                    .expression_attribute_values(":lease", n(now + LEASE_MS))
                    .expression_attribute_values(":exp", n(exp))
                    .expression_attribute_values(
                        ":ttl",
                        n(idem_core::store::Timestamp::from_unix_millis(exp).as_unix_secs_ceil()),
                    )
                    .expression_attribute_values(":zero", n(0))
                    .expression_attribute_values(":one", n(1))
                    .expression_attribute_values(":now", n(now))
                    .expression_attribute_values(":tenant", s(tenant))
                    .expression_attribute_values(":k", s(&op.key))
                    .return_values(ReturnValue::AllOld)
                    .return_values_on_condition_check_failure(
                        ReturnValuesOnConditionCheckFailure::AllOld,
                    )
                    .send()
                    .await;
                match claimed {
                    Ok(_) => {}
                    Err(e)
                        if e.as_service_error()
                            .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
                    {
                        return Ok(false);
                    }
                    Err(e) => return Err(e.into()),
                }
                client
                    .update_item()
                    .table_name(table)
                    .key("pk", s(&pk))
                    .update_expression(COMPLETE_UPDATE)
                    .condition_expression(FENCE)
                    .expression_attribute_names("#exp", "exp")
                    .expression_attribute_names("#ttl", "ttl")
                    .expression_attribute_values(":own", s(&owner))
                    .expression_attribute_values(":f", s("f"))
                    .expression_attribute_values(":now", n(now))
                    .expression_attribute_values(":c", s("c"))
                    .expression_attribute_values(":rs", n(i64::from(body.status())))
                    .expression_attribute_values(
                        ":rh",
                        AttributeValue::B(encode_headers(&body).into()),
                    )
                    .expression_attribute_values(
                        ":rb",
                        AttributeValue::B(body.body().to_vec().into()),
                    )
                    .expression_attribute_values(":exp", n(exp))
                    .expression_attribute_values(
                        ":ttl",
                        n(idem_core::store::Timestamp::from_unix_millis(exp).as_unix_secs_ceil()),
                    )
                    .expression_attribute_values(":att", n(1))
                    .send()
                    .await?;
                Ok(true)
            }
        }
    }
}

/// Completes `count` replay keys through the store, before a replay run.
pub(crate) async fn prepare_replay(backend: &Backend, count: u64) -> Result<(), BenchError> {
    for k in 0..count {
        let scope = Scope::parse(&backend.tenant, &format!("r-{k}"))?;
        let request = ClaimRequest::new(
            scope,
            Fingerprint::from_digest(crate::plan::fingerprint(k, 0)),
        )
        .with_retention(Duration::from_millis(
            u64::try_from(backend.retention_ms).unwrap_or(u64::MAX),
        ))?;
        if let ClaimOutcome::Claimed { lease, .. } = backend.store.claim(&request).await? {
            backend.store.complete(&lease, &response()).await?;
        }
    }
    Ok(())
}
