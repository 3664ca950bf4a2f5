//! The console served on loopback behind a test's authorization check, a
//! real HTTP client for it, and the stores of each backend.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

pub mod stuck;

use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use idem_admin::{Admin, Operator, Refusal};

/// The bearer token the test's check accepts, naming [`OPERATOR`].
pub const TOKEN: &str = "test-ops-token";
/// The operator the token names.
pub const OPERATOR: &str = "ops@test";
/// The cookie a browser carries, naming [`BROWSER_OPERATOR`].
pub const COOKIE: &str = "idem_ops=browser-secret";
/// The operator the cookie names.
pub const BROWSER_OPERATOR: &str = "ops@browser";

/// The service's check in these tests: a bearer token, or a session
/// cookie; a wrong token is forbidden, none is unauthenticated.
pub fn check(request: &Parts) -> Result<Operator, Refusal> {
    let cookie = request
        .headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|cookies| cookies.split(';').any(|c| c.trim() == COOKIE));
    if cookie {
        return Operator::new(BROWSER_OPERATOR).map_err(|_| Refusal::Forbidden);
    }
    match request.headers.get(http::header::AUTHORIZATION) {
        Some(value) if value.as_bytes() == format!("Bearer {TOKEN}").as_bytes() => {
            Operator::new(OPERATOR).map_err(|_| Refusal::Forbidden)
        }
        Some(_) => Err(Refusal::Forbidden),
        None => Err(Refusal::unauthenticated(Some(
            http::HeaderValue::from_static("Bearer"),
        ))),
    }
}

/// The console of `admin`, mounted under `/admin` of a service on a
/// loopback port; its base URL (`http://127.0.0.1:port/admin`).
pub async fn serve(admin: Admin) -> String {
    let console = admin.authorize(check).router();
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "the service" }))
        // The service's own sign-in, as a browser meets it: a session cookie.
        .route(
            "/sign-in",
            axum::routing::get(|| async {
                (
                    [(
                        http::header::SET_COOKIE,
                        format!("{COOKIE}; Path=/; HttpOnly; SameSite=Strict"),
                    )],
                    "signed in",
                )
            }),
        )
        .nest("/admin", console);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}/admin")
}

/// A client of the console that sends the operator's token.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    pub client: reqwest::Client,
}

/// An answer: its status, content type and JSON.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub content_type: String,
    pub json: serde_json::Value,
}

impl Answer {
    /// The answer is `status` as a problem of kind `error`.
    #[track_caller]
    pub fn assert_problem(&self, status: u16, error: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.content_type, "application/problem+json", "{self:?}");
        assert_eq!(self.json["status"], status, "{self:?}");
        assert_eq!(self.json["error"], error, "{self:?}");
    }

    /// The answer is 200 with an action's outcome: `changed`, `state`.
    #[track_caller]
    pub fn assert_done(&self, changed: bool, state: &str) {
        assert_eq!(self.status, 200, "{self:?}");
        assert_eq!(self.json["changed"], changed, "{self:?}");
        assert_eq!(self.json["state"], state, "{self:?}");
    }
}

impl Api {
    pub fn new(base: String) -> Self {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        Self { base, client }
    }

    async fn answer(request: reqwest::RequestBuilder) -> Answer {
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let text = response.text().await.unwrap();
        let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        Answer {
            status,
            content_type,
            json,
        }
    }

    pub async fn get(&self, path: &str) -> Answer {
        let request = self
            .client
            .get(format!("{}{path}", self.base))
            .bearer_auth(TOKEN);
        Self::answer(request).await
    }

    pub async fn post(&self, path: &str, body: serde_json::Value) -> Answer {
        let request = self
            .client
            .post(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .body(body.to_string());
        Self::answer(request).await
    }
}

/// A fresh name for a test's own tenant, consumer, namespace or table.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run ./scripts/test, which starts the services and sets it")
    })
}

/// The stores of one backend; a part it does not have is `None`.
pub struct Stores {
    pub records: Option<Arc<dyn idem_core::store::IdempotencyStore>>,
    pub outbox: Option<Arc<dyn idem_core::store::OutboxStore>>,
    pub parking: Option<Arc<dyn idem_core::store::ParkingStore>>,
    pub journal: Option<Arc<dyn idem_core::store::JournalStore>>,
}

pub fn memory() -> Stores {
    Stores {
        records: Some(Arc::new(idem_memory::MemoryStore::new())),
        outbox: Some(Arc::new(idem_memory::MemoryOutbox::new())),
        parking: Some(Arc::new(idem_memory::MemoryParking::new())),
        journal: Some(Arc::new(idem_memory::MemoryJournal::new())),
    }
}

pub async fn postgres_pool() -> idem_postgres::sqlx::PgPool {
    idem_postgres::guarded(idem_postgres::sqlx::postgres::PgPoolOptions::new().max_connections(4))
        .connect(&env("IDEM_POSTGRES_URL"))
        .await
        .expect("connect to IDEM_POSTGRES_URL")
}

/// Postgres stores, each on a table of the test's own.
pub async fn postgres() -> Stores {
    use idem_postgres::*;
    let pool = postgres_pool().await;
    let records = PostgresStore::with_options(
        pool.clone(),
        PostgresOptions::default().table(&unique("admin_records")),
    )
    .unwrap();
    records.migrate().await.unwrap();
    let outbox = PostgresOutbox::with_options(
        pool.clone(),
        PostgresOutboxOptions::default().table(&unique("admin_outbox")),
    )
    .unwrap();
    outbox.migrate().await.unwrap();
    let parking = PostgresParking::with_options(
        pool.clone(),
        PostgresParkingOptions::default().table(&unique("admin_parked")),
    )
    .unwrap();
    parking.migrate().await.unwrap();
    let journal = PostgresJournal::with_options(
        pool,
        PostgresJournalOptions::default().table(&unique("admin_journal")),
    )
    .unwrap();
    journal.migrate().await.unwrap();
    Stores {
        records: Some(Arc::new(records)),
        outbox: Some(Arc::new(outbox)),
        parking: Some(Arc::new(parking)),
        journal: Some(Arc::new(journal)),
    }
}

pub async fn redis_connection() -> idem_redis::redis::aio::ConnectionManager {
    let client = idem_redis::redis::Client::open(env("IDEM_REDIS_URL")).unwrap();
    idem_redis::redis::aio::ConnectionManager::new(client)
        .await
        .expect("connect to IDEM_REDIS_URL")
}

/// Redis stores (records and journal), under prefixes of the test's own.
pub async fn redis() -> Stores {
    use idem_redis::*;
    let conn = redis_connection().await;
    // The shared test server keeps nothing on disk: the tests accept it.
    let options = RedisOptions::default()
        .prefix(&unique("admin"))
        .accept_volatility()
        .accept_eviction_risk();
    let records = RedisStore::with_options(conn.clone(), options)
        .await
        .unwrap();
    let journal = RedisJournal::with_options(
        conn,
        RedisJournalOptions::default().prefix(&unique("adminj")),
    )
    .unwrap();
    Stores {
        records: Some(Arc::new(records)),
        outbox: None,
        parking: None,
        journal: Some(Arc::new(journal)),
    }
}

/// A client of the test's DynamoDB emulator
/// (`idem_conformance::support::dynamo_endpoint`).
pub fn dynamo_client() -> idem_dynamo::aws_sdk_dynamodb::Client {
    use idem_dynamo::aws_sdk_dynamodb::config::{Credentials, Region};
    let endpoint = idem_conformance::support::dynamo_endpoint()
        .unwrap_or_else(|| panic!("IDEM_DYNAMO_ENDPOINT is not set (scripts/test sets it)"));
    let config = idem_dynamo::aws_sdk_dynamodb::Config::builder()
        .behavior_version_latest()
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "idem-tests"))
        .build();
    idem_dynamo::aws_sdk_dynamodb::Client::from_conf(config)
}

/// The emulator serves one request at a time: a generous limit.
pub fn dynamo_options() -> idem_core::StoreOptions {
    idem_core::StoreOptions::default().with_operation_timeout(Duration::from_secs(20))
}

/// DynamoDB stores (records, parking, journal), each on a table of the
/// test's own.
pub async fn dynamo() -> Stores {
    use idem_dynamo::*;
    let client = dynamo_client();
    let records = DynamoStore::with_options(
        client.clone(),
        DynamoOptions::default()
            .table(&unique("admin-records"))
            // The emulator counts binary attributes by their base64 text.
            .store_options(dynamo_options().with_max_response_bytes(256 * 1024)),
    )
    .unwrap();
    records.create_table().await.unwrap();
    let parking = DynamoParking::with_options(
        client.clone(),
        DynamoParkingOptions::default()
            .table(&unique("admin-parked"))
            .store_options(dynamo_options()),
    )
    .unwrap();
    parking.create_table().await.unwrap();
    let journal = DynamoJournal::with_options(
        client,
        DynamoJournalOptions::default()
            .table(&unique("admin-journal"))
            .store_options(dynamo_options()),
    )
    .unwrap();
    journal.create_table().await.unwrap();
    Stores {
        records: Some(Arc::new(records)),
        outbox: None,
        parking: Some(Arc::new(parking)),
        journal: Some(Arc::new(journal)),
    }
}
