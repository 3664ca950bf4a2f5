//! The layer over real HTTP: an axum server on a loopback port, a real
//! client, and the memory, Postgres and Redis stores.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use idem_core::Idempotency;
use idem_core::store::IdempotencyStore;
use idem_http::{IdempotencyLayer, TenantSource};
use reqwest::Client;

/// What the routes did, for the tests to count.
#[derive(Clone, Default)]
struct Counters {
    orders: Arc<AtomicUsize>,
    failures: Arc<AtomicUsize>,
}

#[derive(serde::Deserialize)]
struct Delay {
    delay_ms: Option<u64>,
}

async fn create_order(
    State(counters): State<Counters>,
    Query(delay): Query<Delay>,
    body: String,
) -> impl IntoResponse {
    if let Some(ms) = delay.delay_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let n = counters.orders.fetch_add(1, Ordering::SeqCst) + 1;
    let mut headers = HeaderMap::new();
    headers.insert("x-order-id", HeaderValue::from(n));
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    headers.insert("set-cookie", HeaderValue::from_static("session=secret"));
    (
        StatusCode::CREATED,
        headers,
        format!(
            r#"{{"order":{n},"for":{}}}"#,
            serde_json::Value::String(body)
        ),
    )
}

async fn create_payment(State(counters): State<Counters>) -> impl IntoResponse {
    counters.orders.fetch_add(1, Ordering::SeqCst);
    (StatusCode::CREATED, "payment")
}

/// Fails with 500 the first time, then succeeds.
async fn flaky(State(counters): State<Counters>) -> impl IntoResponse {
    if counters.failures.fetch_add(1, Ordering::SeqCst) == 0 {
        (StatusCode::INTERNAL_SERVER_ERROR, "try again")
    } else {
        (StatusCode::CREATED, "done")
    }
}

async fn big(State(counters): State<Counters>) -> impl IntoResponse {
    counters.orders.fetch_add(1, Ordering::SeqCst);
    (StatusCode::OK, "x".repeat(64 * 1024))
}

async fn list_orders() -> &'static str {
    "all orders"
}

/// Serves the routes behind `layer` on a loopback port; returns the base URL.
async fn serve(
    store: Arc<dyn IdempotencyStore>,
    configure: impl FnOnce(
        IdempotencyLayer<dyn IdempotencyStore>,
    ) -> IdempotencyLayer<dyn IdempotencyStore>,
) -> (String, Counters) {
    let counters = Counters::default();
    let idem = Idempotency::new(store)
        .with_lease(Duration::from_secs(30))
        .unwrap();
    let layer = configure(
        IdempotencyLayer::new(idem)
            .tenant(TenantSource::header("x-tenant"))
            .max_request_bytes(16 * 1024),
    );
    let app = Router::new()
        .route("/orders", post(create_order).get(list_orders))
        .route("/payments", post(create_payment))
        .route("/flaky", post(flaky))
        .route("/big", post(big))
        .layer(layer)
        .with_state(counters.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{address}"), counters)
}

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// A tenant of the test's own: cases share stores and never meet.
fn tenant() -> String {
    format!("http-{}", uuid::Uuid::new_v4())
}

fn quoted(key: &str) -> String {
    format!("\"{key}\"")
}

/// A request with a tenant, a key and an empty JSON object for a body.
fn keyed(
    client: &Client,
    base: &str,
    path: &str,
    tenant: &str,
    key: &str,
) -> reqwest::RequestBuilder {
    client
        .post(format!("{base}{path}"))
        .header("x-tenant", tenant)
        .header("idempotency-key", quoted(key))
        .body("{}")
}

async fn post_order(
    client: &Client,
    base: &str,
    tenant: &str,
    key: &str,
    body: &str,
) -> reqwest::Response {
    client
        .post(format!("{base}/orders"))
        .header("x-tenant", tenant)
        .header("idempotency-key", quoted(key))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

async fn problem_json(response: reqwest::Response) -> serde_json::Value {
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
}

// ---- the cases, each run against every store --------------------------------

async fn twenty_concurrent_duplicates_execute_once(store: Arc<dyn IdempotencyStore>) {
    let (base, counters) = serve(store, |l| l).await;
    let (client, tenant) = (client(), tenant());
    let requests = (0..20).map(|_| {
        let (client, base, tenant) = (client.clone(), base.clone(), tenant.clone());
        tokio::spawn(async move {
            let response = keyed(&client, &base, "/orders?delay_ms=300", &tenant, "dup-20")
                .send()
                .await
                .unwrap();
            let replayed = response.headers().contains_key("idempotent-replayed");
            let status = response.status();
            (status, replayed, response.bytes().await.unwrap())
        })
    });
    let mut executed = Vec::new();
    let (mut replayed, mut conflicts) = (0, 0);
    for request in requests.collect::<Vec<_>>() {
        match request.await.unwrap() {
            (StatusCode::CREATED, false, body) => executed.push(body),
            (StatusCode::CREATED, true, body) => {
                replayed += 1;
                executed.push(body);
            }
            (StatusCode::CONFLICT, _, _) => conflicts += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(
        counters.orders.load(Ordering::SeqCst),
        1,
        "the handler ran more than once"
    );
    assert_eq!(executed.len() - replayed, 1);
    assert_eq!(executed.len() + conflicts, 20);
    assert!(executed.windows(2).all(|w| w[0] == w[1]), "replays differ");
}

async fn a_retry_replays_status_headers_and_body_byte_for_byte(store: Arc<dyn IdempotencyStore>) {
    let (base, counters) = serve(store, |l| l).await;
    let (client, tenant) = (client(), tenant());
    let first = post_order(
        &client,
        &base,
        &tenant,
        "replay-1",
        r#"{"sku":"A","qty":2}"#,
    )
    .await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(!first.headers().contains_key("idempotent-replayed"));
    let first_id = first.headers()["x-order-id"].clone();
    assert!(first.headers().contains_key("set-cookie"));
    let first_body = first.bytes().await.unwrap();
    // The same request from another serialiser: the same fingerprint.
    let retry = post_order(
        &client,
        &base,
        &tenant,
        "replay-1",
        r#"{ "qty": 2, "sku": "A" }"#,
    )
    .await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.headers()["x-order-id"], first_id);
    assert_eq!(retry.headers()["content-type"], "application/json");
    assert!(
        !retry.headers().contains_key("set-cookie"),
        "set-cookie replayed"
    );
    assert_eq!(retry.bytes().await.unwrap(), first_body);
    assert_eq!(counters.orders.load(Ordering::SeqCst), 1);
}

async fn a_key_reused_for_another_request_or_route_is_422(store: Arc<dyn IdempotencyStore>) {
    let (base, _) = serve(store, |l| l).await;
    let (client, tenant) = (client(), tenant());
    post_order(&client, &base, &tenant, "reuse-1", r#"{"qty":1}"#).await;
    let other = post_order(&client, &base, &tenant, "reuse-1", r#"{"qty":2}"#).await;
    assert_eq!(other.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let json = problem_json(other).await;
    assert_eq!(json["title"], "Idempotency-Key is already used");
    assert_eq!(json["status"], 422);
    let other_route = client
        .post(format!("{base}/payments"))
        .header("x-tenant", &tenant)
        .header("idempotency-key", quoted("reuse-1"))
        .header("content-type", "application/json")
        .body(r#"{"qty":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(other_route.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

async fn one_tenants_key_never_replays_anothers_response(store: Arc<dyn IdempotencyStore>) {
    let (base, counters) = serve(store, |l| l).await;
    let client = client();
    let (a, b) = (tenant(), tenant());
    post_order(&client, &base, &a, "shared-key", "{}").await;
    let response = post_order(&client, &base, &b, "shared-key", "{}").await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert!(!response.headers().contains_key("idempotent-replayed"));
    assert_eq!(counters.orders.load(Ordering::SeqCst), 2);
}

async fn bad_keys_are_400_and_a_missing_optional_key_passes_through(
    store: Arc<dyn IdempotencyStore>,
) {
    let (base, counters) = serve(store, |l| l).await;
    let (client, tenant) = (client(), tenant());
    let long = format!("\"{}\"", "k".repeat(256));
    let bad: [&[u8]; 6] = [
        b"unquoted",
        b"\"\"",
        long.as_bytes(),
        b"\"open",
        b"\"a\", \"b\"",
        "\"clé\"".as_bytes(),
    ];
    for value in bad {
        let response = client
            .post(format!("{base}/orders"))
            .header("x-tenant", &tenant)
            .header("idempotency-key", HeaderValue::from_bytes(value).unwrap())
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{value:?}");
        let json = problem_json(response).await;
        assert_eq!(json["title"], "Idempotency-Key is invalid");
    }
    let repeated = client
        .post(format!("{base}/orders"))
        .header("x-tenant", &tenant)
        .header("idempotency-key", "\"a\"")
        .header("idempotency-key", "\"a\"")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(repeated.status(), StatusCode::BAD_REQUEST);
    assert_eq!(counters.orders.load(Ordering::SeqCst), 0);
    // No key, and the key is optional: the handler runs as if there were no layer.
    for _ in 0..2 {
        let plain = client
            .post(format!("{base}/orders"))
            .header("x-tenant", &tenant)
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(plain.status(), StatusCode::CREATED);
    }
    assert_eq!(counters.orders.load(Ordering::SeqCst), 2);
    // A method the layer does not cover passes through too.
    let list = client.get(format!("{base}/orders")).send().await.unwrap();
    assert_eq!(list.text().await.unwrap(), "all orders");
}

async fn a_required_key_that_is_missing_is_400_as_the_draft_says(store: Arc<dyn IdempotencyStore>) {
    let (base, counters) = serve(store, |l| l.require_key()).await;
    let response = client()
        .post(format!("{base}/orders"))
        .header("x-tenant", tenant())
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(response.headers()["content-language"], "en");
    let json = problem_json(response).await;
    assert_eq!(json["title"], "Idempotency-Key is missing");
    assert_eq!(json["status"], 400);
    assert_eq!(json["type"], "about:blank");
    assert!(json["detail"].as_str().unwrap().contains("Idempotency Key"));
    assert_eq!(counters.orders.load(Ordering::SeqCst), 0);
}

async fn a_duplicate_in_flight_is_409_with_retry_after(store: Arc<dyn IdempotencyStore>) {
    let (base, _) = serve(store, |l| l).await;
    let (client, tenant) = (client(), tenant());
    let slow = {
        let (client, base, tenant) = (client.clone(), base.clone(), tenant.clone());
        tokio::spawn(async move {
            keyed(&client, &base, "/orders?delay_ms=800", &tenant, "in-flight")
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let duplicate = keyed(&client, &base, "/orders?delay_ms=800", &tenant, "in-flight")
        .send()
        .await
        .unwrap();
    assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    let wait: u64 = duplicate.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=30).contains(&wait), "{wait}");
    let json = problem_json(duplicate).await;
    assert_eq!(
        json["title"],
        "A request is outstanding for this Idempotency-Key"
    );
    assert_eq!(slow.await.unwrap(), StatusCode::CREATED);
}

async fn a_duplicate_can_wait_for_the_result_instead(store: Arc<dyn IdempotencyStore>) {
    let (base, counters) = serve(store, |l| l.wait_for_result(Duration::from_secs(5))).await;
    let (client, tenant) = (client(), tenant());
    let first = {
        let (client, base, tenant) = (client.clone(), base.clone(), tenant.clone());
        tokio::spawn(async move {
            keyed(&client, &base, "/orders?delay_ms=600", &tenant, "waits")
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let waiting = keyed(&client, &base, "/orders?delay_ms=600", &tenant, "waits")
        .send()
        .await
        .unwrap();
    assert_eq!(waiting.status(), StatusCode::CREATED);
    assert_eq!(waiting.headers()["idempotent-replayed"], "true");
    assert_eq!(waiting.text().await.unwrap(), first.await.unwrap());
    assert_eq!(counters.orders.load(Ordering::SeqCst), 1);
}

async fn a_client_that_hangs_up_mid_handler_still_gets_its_replay(
    store: Arc<dyn IdempotencyStore>,
) {
    let (base, counters) = serve(store, |l| l).await;
    let tenant = tenant();
    let impatient = Client::builder()
        .timeout(Duration::from_millis(150))
        .build()
        .unwrap();
    let gone = keyed(
        &impatient,
        &base,
        "/orders?delay_ms=600",
        &tenant,
        "hang-up",
    )
    .send()
    .await;
    assert!(gone.is_err(), "the client should have hung up");
    // The handler runs on and its response is stored; the retry replays it.
    let client = client();
    let retry = idem_conformance::support::eventually("the replay after a hang-up", || async {
        let response = keyed(&client, &base, "/orders?delay_ms=600", &tenant, "hang-up")
            .send()
            .await
            .unwrap();
        (response.status() != StatusCode::CONFLICT).then_some(response)
    })
    .await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(
        counters.orders.load(Ordering::SeqCst),
        1,
        "the handler ran twice"
    );
}

async fn a_5xx_releases_the_key_and_the_retry_runs_again(store: Arc<dyn IdempotencyStore>) {
    let (base, counters) = serve(store, |l| l).await;
    let (client, tenant) = (client(), tenant());
    let send = || keyed(&client, &base, "/flaky", &tenant, "flaky").send();
    let failed = send().await.unwrap();
    assert_eq!(failed.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(failed.text().await.unwrap(), "try again");
    let retried = send().await.unwrap();
    assert_eq!(retried.status(), StatusCode::CREATED);
    assert!(!retried.headers().contains_key("idempotent-replayed"));
    let replayed = send().await.unwrap();
    assert_eq!(replayed.headers()["idempotent-replayed"], "true");
    assert_eq!(counters.failures.load(Ordering::SeqCst), 2);
}

async fn a_body_over_the_limit_is_413_before_any_claim(store: Arc<dyn IdempotencyStore>) {
    let (base, counters) = serve(store, |l| l).await;
    let response = client()
        .post(format!("{base}/orders"))
        .header("x-tenant", tenant())
        .header("idempotency-key", quoted("huge"))
        .body("x".repeat(32 * 1024))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(counters.orders.load(Ordering::SeqCst), 0);
}

/// One test per case for a store: `$make` builds it inside the test.
macro_rules! for_store {
    ($name:ident, $make:expr) => {
        for_store!($name, $make, [
            twenty_concurrent_duplicates_execute_once,
            a_retry_replays_status_headers_and_body_byte_for_byte,
            a_key_reused_for_another_request_or_route_is_422,
            one_tenants_key_never_replays_anothers_response,
            bad_keys_are_400_and_a_missing_optional_key_passes_through,
            a_required_key_that_is_missing_is_400_as_the_draft_says,
            a_duplicate_in_flight_is_409_with_retry_after,
            a_duplicate_can_wait_for_the_result_instead,
            a_client_that_hangs_up_mid_handler_still_gets_its_replay,
            a_5xx_releases_the_key_and_the_retry_runs_again,
            a_body_over_the_limit_is_413_before_any_claim,
        ]);
    };
    ($name:ident, $make:expr, [$($case:ident),* $(,)?]) => {
        mod $name {
            use super::*;

            async fn store() -> Arc<dyn IdempotencyStore> {
                $make
            }

            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(store().await).await;
                }
            )*
        }
    };
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set (scripts/test sets it)"))
}

for_store!(memory, Arc::new(idem_memory::MemoryStore::new()));

for_store!(postgres, {
    let pool = idem_postgres::sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&env("IDEM_POSTGRES_URL"))
        .await
        .expect("connect to IDEM_POSTGRES_URL");
    let store = idem_postgres::PostgresStore::new(pool);
    store.migrate().await.unwrap();
    Arc::new(store)
});

for_store!(redis, {
    let client = idem_redis::redis::Client::open(env("IDEM_REDIS_URL")).unwrap();
    let conn = idem_redis::redis::aio::ConnectionManager::new(client)
        .await
        .expect("connect to IDEM_REDIS_URL");
    // The test server keeps nothing on disk.
    let options = idem_redis::RedisOptions::default().accept_volatility();
    Arc::new(
        idem_redis::RedisStore::with_options(conn, options)
            .await
            .unwrap(),
    )
});

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_too_large_for_the_store_reaches_the_client_and_nothing_is_stored() {
    let store = idem_memory::MemoryStore::with_options(
        idem_memory::MemoryOptions::default().max_response_bytes(1024),
    );
    let any: Arc<dyn IdempotencyStore> = Arc::new(store.clone());
    let (base, counters) = serve(any, |l| l).await;
    let (client, tenant) = (client(), tenant());
    let send = || keyed(&client, &base, "/big", &tenant, "big").send();
    let first = send().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.bytes().await.unwrap().len(), 64 * 1024);
    // The work happened but could not be stored: the key is held to its
    // lease (no half-stored record, no second run at once).
    let scope = idem_core::Scope::parse(&tenant, "big").unwrap();
    let record = store.get(&scope).await.unwrap().expect("the claim is kept");
    assert!(record.is_in_flight());
    assert_eq!(send().await.unwrap().status(), StatusCode::CONFLICT);
    assert_eq!(counters.orders.load(Ordering::SeqCst), 1);
}

/// The transactional mode on Postgres: the handler's rows and the stored
/// response commit together; a response the policy does not store rolls
/// the rows back and frees the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_route_commits_its_rows_with_the_stored_response() {
    use axum::Extension;
    use idem_http::IdemTransaction;
    use idem_postgres::sqlx::{self, AssertSqlSafe};
    use idem_postgres::{PgTransaction, PostgresStore};

    let pool = idem_postgres::sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&env("IDEM_POSTGRES_URL"))
        .await
        .expect("connect to IDEM_POSTGRES_URL");
    let store = PostgresStore::new(pool.clone());
    store.migrate().await.unwrap();
    let table = format!("http_orders_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {table} (note text NOT NULL)"
    )))
    .execute(&pool)
    .await
    .unwrap();

    let insert = format!("INSERT INTO {table} VALUES ($1)");
    let handler = move |Extension(tx): Extension<IdemTransaction<PgTransaction>>,
                        Extension(ctx): Extension<idem_core::Context<dyn IdempotencyStore>>,
                        body: String| {
        let insert = insert.clone();
        async move {
            let mut tx = tx.lock().await.unwrap();
            sqlx::query(AssertSqlSafe(insert))
                .bind(&body)
                .execute(&mut **tx)
                .await
                .unwrap();
            // The run's context: a downstream key stable across retries.
            let charge_key = ctx.downstream_key("charge");
            let status = if body == "fail" {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::CREATED
            };
            (status, charge_key.as_str().to_string())
        }
    };
    let any: Arc<dyn IdempotencyStore> = Arc::new(store.clone());
    let layer = IdempotencyLayer::new(Idempotency::new(any)).in_transaction({
        let store = store.clone();
        move || store.begin()
    });
    let app = Router::new().route("/orders", post(handler)).layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let rows = |note: &'static str| {
        let (pool, table) = (pool.clone(), table.clone());
        async move {
            sqlx::query_scalar::<_, i64>(AssertSqlSafe(format!(
                "SELECT count(*) FROM {table} WHERE note = $1"
            )))
            .bind(note)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let client = client();
    // The layer's default tenant is shared: keys of this run's own.
    let run = uuid::Uuid::new_v4();
    let send = |key: &'static str, body: &'static str| {
        client
            .post(format!("{base}/orders"))
            .header("idempotency-key", quoted(&format!("{key}-{run}")))
            .body(body)
            .send()
    };
    let first = send("tx-1", "placed").await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let charge_key = first.text().await.unwrap();
    let retry = send("tx-1", "placed").await.unwrap();
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.text().await.unwrap(), charge_key);
    assert_eq!(rows("placed").await, 1);

    let failed = send("tx-2", "fail").await.unwrap();
    assert_eq!(failed.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        rows("fail").await,
        0,
        "an unstored response's rows survived"
    );
    let again = send("tx-2", "fail").await.unwrap();
    assert!(
        !again.headers().contains_key("idempotent-replayed"),
        "the key was not freed"
    );
    sqlx::query(AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(&pool)
        .await
        .unwrap();
}
