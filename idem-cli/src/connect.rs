//! A store by URL: `postgres://…`, `redis://…`, `dynamodb://TABLE?…`, made
//! into a console with the one part a command needs.

use std::sync::Arc;
#[cfg(any(feature = "postgres", feature = "redis"))]
use std::time::Duration;

use idem_admin::{Admin, ConsumerParking};
use idem_core::Idempotency;
use idem_journal::Journal;

/// Which part of a store a command works on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part {
    Records,
    Outbox,
    Consumer(String),
    Journal(String),
}

impl Part {
    fn name(&self) -> &'static str {
        match self {
            Self::Records => "records",
            Self::Outbox => "outbox",
            Self::Consumer(_) => "parked messages",
            Self::Journal(_) => "journal",
        }
    }
}

/// Why a store could not be had.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    /// The URL (or what goes with it) is wrong: a usage error.
    #[error("{0}")]
    Usage(String),
    /// The store did not answer.
    // A DynamoDB client connects at its first call: with DynamoDB alone
    // built in, connecting never fails this way.
    #[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
    #[error("{0}")]
    Unavailable(String),
}

/// How long the command line waits to connect to a store.
#[cfg(any(feature = "postgres", feature = "redis"))]
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The console of the store at `url` with `part`; `table` names the
/// part's table (Postgres) or key prefix (Redis) where not the default.
pub(crate) async fn console(
    url: &str,
    table: Option<&str>,
    part: &Part,
) -> Result<Admin, ConnectError> {
    #[cfg(not(any(feature = "postgres", feature = "redis")))]
    let _ = table;
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    match scheme {
        #[cfg(feature = "postgres")]
        Some("postgres" | "postgresql") => postgres(url, table, part).await,
        #[cfg(feature = "redis")]
        Some("redis" | "rediss") => redis(url, table, part).await,
        #[cfg(feature = "dynamodb")]
        Some("dynamodb") => dynamo(url, part).await,
        #[cfg(not(feature = "postgres"))]
        Some("postgres" | "postgresql") => Err(built_without("postgres")),
        #[cfg(not(feature = "redis"))]
        Some("redis" | "rediss") => Err(built_without("redis")),
        #[cfg(not(feature = "dynamodb"))]
        Some("dynamodb") => Err(built_without("dynamodb")),
        _ if url.starts_with("memory") => Err(ConnectError::Usage(
            "an in-memory store lives inside its process: use the service's admin route".into(),
        )),
        _ => Err(ConnectError::Usage(format!(
            "not a store URL: {url:?} (postgres://…, redis://…, dynamodb://TABLE?endpoint=…&region=…)"
        ))),
    }
}

/// A store of a backend this build left out.
#[cfg(not(all(feature = "postgres", feature = "redis", feature = "dynamodb")))]
fn built_without(feature: &str) -> ConnectError {
    ConnectError::Usage(format!(
        "this idem was built without the {feature} backend: \
         cargo install idem-cli --features {feature}"
    ))
}

fn usage(error: impl std::fmt::Display) -> ConnectError {
    ConnectError::Usage(error.to_string())
}

fn absent(backend: &str, part: &Part) -> ConnectError {
    ConnectError::Usage(format!("{backend} keeps no {}", part.name()))
}

/// The console with `part` on these stores.
fn with_part(
    part: &Part,
    records: Option<Arc<dyn idem_core::store::IdempotencyStore>>,
    outbox: Option<Arc<dyn idem_core::store::OutboxStore>>,
    parking: Option<Arc<dyn idem_core::store::ParkingStore>>,
    journal: Option<Arc<dyn idem_core::store::JournalStore>>,
    backend: &str,
) -> Result<Admin, ConnectError> {
    let admin = Admin::new();
    match part {
        Part::Records => records.map(|store| admin.records(Idempotency::new(store))),
        Part::Outbox => outbox.map(|store| admin.outbox(store)),
        Part::Consumer(name) => match parking {
            Some(store) => Some(admin.consumer(ConsumerParking::new(name, store).map_err(usage)?)),
            None => None,
        },
        Part::Journal(namespace) => match journal {
            Some(store) => Some(admin.journal(Journal::new(store, namespace).map_err(usage)?)),
            None => None,
        },
    }
    .ok_or_else(|| absent(backend, part))
}

#[cfg(feature = "postgres")]
async fn postgres(url: &str, table: Option<&str>, part: &Part) -> Result<Admin, ConnectError> {
    use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    use idem_postgres::*;
    let options: PgConnectOptions = url.parse().map_err(usage)?;
    let pool = guarded(
        PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(CONNECT_TIMEOUT),
    )
    .connect_with(options)
    .await
    .map_err(|e| ConnectError::Unavailable(format!("postgres: {e}")))?;
    let (mut records, mut outbox, mut parking, mut journal) = (None, None, None, None);
    match part {
        Part::Records => {
            let options = PostgresOptions::default().table(table.unwrap_or(DEFAULT_TABLE));
            let store = PostgresStore::with_options(pool, options).map_err(usage)?;
            records = Some(Arc::new(store) as Arc<dyn idem_core::store::IdempotencyStore>);
        }
        Part::Outbox => {
            let options =
                PostgresOutboxOptions::default().table(table.unwrap_or(DEFAULT_OUTBOX_TABLE));
            let store = PostgresOutbox::with_options(pool, options).map_err(usage)?;
            outbox = Some(Arc::new(store) as Arc<dyn idem_core::store::OutboxStore>);
        }
        Part::Consumer(_) => {
            let options =
                PostgresParkingOptions::default().table(table.unwrap_or(DEFAULT_PARKING_TABLE));
            let store = PostgresParking::with_options(pool, options).map_err(usage)?;
            parking = Some(Arc::new(store) as Arc<dyn idem_core::store::ParkingStore>);
        }
        Part::Journal(_) => {
            let options =
                PostgresJournalOptions::default().table(table.unwrap_or(DEFAULT_JOURNAL_TABLE));
            let store = PostgresJournal::with_options(pool, options).map_err(usage)?;
            journal = Some(Arc::new(store) as Arc<dyn idem_core::store::JournalStore>);
        }
    }
    with_part(part, records, outbox, parking, journal, "postgres")
}

#[cfg(feature = "redis")]
async fn redis(url: &str, prefix: Option<&str>, part: &Part) -> Result<Admin, ConnectError> {
    use idem_redis::*;
    let client = redis::Client::open(url).map_err(usage)?;
    let connecting = redis::aio::ConnectionManager::new(client);
    let conn = tokio::time::timeout(CONNECT_TIMEOUT, connecting)
        .await
        .map_err(|_| ConnectError::Unavailable("redis: no answer within 10 s".into()))?
        .map_err(|e| ConnectError::Unavailable(format!("redis: {e}")))?;
    let (mut records, mut journal) = (None, None);
    match part {
        Part::Records => {
            // An operator reads and deletes records: the server's eviction
            // and persistence settings, which a service must refuse to run
            // on, do not change what these calls do.
            let options = RedisOptions::default()
                .prefix(prefix.unwrap_or(DEFAULT_PREFIX))
                .accept_eviction_risk()
                .accept_volatility();
            let store = RedisStore::with_options(conn, options)
                .await
                .map_err(|e| ConnectError::Unavailable(e.to_string()))?;
            records = Some(Arc::new(store) as Arc<dyn idem_core::store::IdempotencyStore>);
        }
        Part::Journal(_) => {
            let options =
                RedisJournalOptions::default().prefix(prefix.unwrap_or(DEFAULT_JOURNAL_PREFIX));
            let store = RedisJournal::with_options(conn, options).map_err(usage)?;
            journal = Some(Arc::new(store) as Arc<dyn idem_core::store::JournalStore>);
        }
        _ => {}
    }
    with_part(part, records, None, None, journal, "redis")
}

#[cfg(feature = "dynamodb")]
/// `dynamodb://TABLE?endpoint=URL&region=NAME`: the table is the part's;
/// the endpoint is optional (AWS's by default), the region is the URL's or
/// `AWS_REGION`'s; credentials come from `AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN`.
async fn dynamo(url: &str, part: &Part) -> Result<Admin, ConnectError> {
    use idem_dynamo::aws_sdk_dynamodb::config::{Credentials, Region};
    use idem_dynamo::*;
    let rest = url.trim_start_matches("dynamodb://");
    let (table, query) = rest.split_once('?').unwrap_or((rest, ""));
    let table = table.trim_end_matches('/');
    if table.is_empty() {
        return Err(usage(
            "a DynamoDB URL names its table: dynamodb://TABLE?endpoint=…&region=…",
        ));
    }
    let (mut endpoint, mut region) = (None, None);
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("endpoint", value)) if !value.is_empty() => endpoint = Some(value.to_string()),
            Some(("region", value)) if !value.is_empty() => region = Some(value.to_string()),
            _ => {
                return Err(usage(format!(
                    "unknown DynamoDB URL parameter {pair:?} (endpoint, region)"
                )));
            }
        }
    }
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let region = region
        .or_else(|| env("AWS_REGION"))
        .or_else(|| env("AWS_DEFAULT_REGION"))
        .ok_or_else(|| usage("no region: add region=… to the URL or set AWS_REGION"))?;
    let (Some(key), Some(secret)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) else {
        return Err(usage(
            "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
        ));
    };
    let credentials = Credentials::new(key, secret, env("AWS_SESSION_TOKEN"), None, "environment");
    let mut config = aws_sdk_dynamodb::Config::builder()
        .behavior_version_latest()
        .region(Region::new(region))
        .credentials_provider(credentials);
    if let Some(endpoint) = endpoint {
        config = config.endpoint_url(endpoint);
    }
    let client = aws_sdk_dynamodb::Client::from_conf(config.build());
    let (mut records, mut parking, mut journal) = (None, None, None);
    match part {
        Part::Records => {
            let store = DynamoStore::with_options(client, DynamoOptions::default().table(table))
                .map_err(usage)?;
            records = Some(Arc::new(store) as Arc<dyn idem_core::store::IdempotencyStore>);
        }
        Part::Consumer(_) => {
            let options = DynamoParkingOptions::default().table(table);
            let store = DynamoParking::with_options(client, options).map_err(usage)?;
            parking = Some(Arc::new(store) as Arc<dyn idem_core::store::ParkingStore>);
        }
        Part::Journal(_) => {
            let options = DynamoJournalOptions::default().table(table);
            let store = DynamoJournal::with_options(client, options).map_err(usage)?;
            journal = Some(Arc::new(store) as Arc<dyn idem_core::store::JournalStore>);
        }
        Part::Outbox => {}
    }
    with_part(part, records, None, parking, journal, "dynamodb")
}

#[cfg(all(test, not(feature = "redis")))]
mod tests {
    use super::*;

    /// A URL of a backend this build left out is a usage error naming the
    /// feature to build with (not "not a store URL").
    #[tokio::test]
    async fn a_url_of_a_backend_left_out_names_its_feature() {
        let refused = console("redis://127.0.0.1:6379", None, &Part::Records).await;
        match refused {
            Err(ConnectError::Usage(message)) => {
                assert!(message.contains("--features redis"), "{message}");
            }
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("a console over a backend left out"),
        }
    }
}
