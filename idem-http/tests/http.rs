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
use idem_conformance::support::{LEAKY_SECRET, LeakyStore};
use idem_core::Idempotency;
use idem_core::store::IdempotencyStore;
use idem_http::{IdempotencyLayer, TenantSource};
use reqwest::Client;
use tokio::sync::Notify;

/// What the routes did, for the tests to count, and a gate that holds a
/// gated handler until the test opens it (so a race a test needs is made
/// to happen, not hoped for).
#[derive(Clone, Default)]
struct Counters {
    orders: Arc<AtomicUsize>,
    failures: Arc<AtomicUsize>,
    started: Arc<Notify>,
    gate: Arc<Notify>,
}

impl Counters {
    /// Waits until a gated handler is running.
    async fn handler_started(&self) {
        tokio::time::timeout(Duration::from_secs(20), self.started.notified())
            .await
            .expect("the gated handler never started");
    }

    /// Lets the gated handler finish.
    fn open_gate(&self) {
        self.gate.notify_one();
    }
}

#[derive(serde::Deserialize)]
struct Delay {
    delay_ms: Option<u64>,
    gated: Option<bool>,
}

async fn create_order(
    State(counters): State<Counters>,
    Query(delay): Query<Delay>,
    body: String,
) -> impl IntoResponse {
    if let Some(ms) = delay.delay_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if delay.gated == Some(true) {
        counters.started.notify_one();
        counters.gate.notified().await;
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

/// Answers with a field its `Connection` header names as hop-by-hop.
async fn hop(State(counters): State<Counters>) -> impl IntoResponse {
    counters.orders.fetch_add(1, Ordering::SeqCst);
    let mut headers = HeaderMap::new();
    headers.insert("connection", HeaderValue::from_static("x-hop, keep-alive"));
    headers.insert("x-hop", HeaderValue::from_static("secret"));
    headers.insert("x-kept", HeaderValue::from_static("kept"));
    (StatusCode::CREATED, headers, "hop")
}

async fn list_orders() -> &'static str {
    "all orders"
}

/// Where the problems' types point in these tests.
const DOCS: &str = "https://docs.example.com/idempotency";

type Layer = IdempotencyLayer<dyn IdempotencyStore>;

/// Serves the routes behind `layer` on a loopback port; returns the base URL.
async fn serve(
    store: Arc<dyn IdempotencyStore>,
    configure: impl FnOnce(Layer) -> Layer,
) -> (String, Counters) {
    let idem = Idempotency::new(store)
        .with_lease(Duration::from_secs(30))
        .unwrap();
    serve_runner(idem, |l| configure(l.problem_documentation(DOCS))).await
}

/// The same with a runner of the test's own and the problems' defaults.
async fn serve_runner(
    idem: Idempotency<dyn IdempotencyStore>,
    configure: impl FnOnce(Layer) -> Layer,
) -> (String, Counters) {
    let counters = Counters::default();
    let layer = configure(
        IdempotencyLayer::new(idem)
            // Any case names a header.
            .tenant(TenantSource::header("X-Tenant").unwrap())
            .max_request_bytes(16 * 1024),
    );
    let app = Router::new()
        .route("/orders", post(create_order).get(list_orders))
        .route("/payments", post(create_payment))
        .route("/flaky", post(flaky))
        .route("/big", post(big))
        .route("/hop", post(hop))
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

/// A request to `/orders` with a tenant and no key.
async fn unkeyed(client: &Client, base: &str, tenant: &str) -> reqwest::Response {
    client
        .post(format!("{base}/orders"))
        .header("x-tenant", tenant)
        .body("{}")
        .send()
        .await
        .unwrap()
}

/// `keyed` sent from a task of its own, to race with what the test does next.
fn in_background(
    client: &Client,
    base: &str,
    path: &str,
    tenant: &str,
    key: &str,
) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
    tokio::spawn(keyed(client, base, path, tenant, key).send())
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
        let plain = unkeyed(&client, &base, &tenant).await;
        assert_eq!(plain.status(), StatusCode::CREATED);
    }
    assert_eq!(counters.orders.load(Ordering::SeqCst), 2);
    // A method the layer does not cover passes through too.
    let list = client.get(format!("{base}/orders")).send().await.unwrap();
    assert_eq!(list.text().await.unwrap(), "all orders");
}

/// With bare keys taken, `Idempotency-Key: 8e03978e-40d5` (Stripe's form)
/// is a key, the same key as its quoted form (the retry in the other form
/// replays); what is neither a token nor a string is still 400. Without the
/// option the bare form is 400 (above).
async fn where_bare_keys_are_taken_a_token_is_the_same_key_as_its_quoted_form(
    store: Arc<dyn IdempotencyStore>,
) {
    let (base, counters) = serve(store, |l| l.accept_bare_keys()).await;
    let (client, tenant) = (client(), tenant());
    let key = format!("8e03978e-{}", uuid::Uuid::new_v4().simple());
    let send = |value: String| {
        client
            .post(format!("{base}/orders"))
            .header("x-tenant", &tenant)
            .header("idempotency-key", value)
            .body("{}")
            .send()
    };
    let first = send(key.clone()).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let body = first.text().await.unwrap();
    let retry = send(quoted(&key)).await.unwrap();
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(retry.text().await.unwrap(), body);
    assert_eq!(counters.orders.load(Ordering::SeqCst), 1);
    for bad in ["a b", "a/b", "\"open", "a, b"] {
        let refused = send(bad.to_string()).await.unwrap();
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST, "{bad:?}");
    }
    assert_eq!(counters.orders.load(Ordering::SeqCst), 1);
}

async fn a_required_key_that_is_missing_is_400_as_the_draft_says(store: Arc<dyn IdempotencyStore>) {
    let (base, counters) = serve(store, |l| l.require_key()).await;
    let response = unkeyed(&client(), &base, &tenant()).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(response.headers()["content-language"], "en");
    let json = problem_json(response).await;
    assert_eq!(json["title"], "Idempotency-Key is missing");
    assert_eq!(json["status"], 400);
    assert_eq!(json["type"], format!("{DOCS}#idempotency-key-missing"));
    assert!(json["detail"].as_str().unwrap().contains("Idempotency Key"));
    assert_eq!(counters.orders.load(Ordering::SeqCst), 0);
}

async fn a_duplicate_in_flight_is_409_with_retry_after(store: Arc<dyn IdempotencyStore>) {
    let (base, counters) = serve(store, |l| l).await;
    let (client, tenant) = (client(), tenant());
    let slow = in_background(&client, &base, "/orders?gated=true", &tenant, "in-flight");
    counters.handler_started().await;
    let duplicate = keyed(&client, &base, "/orders?gated=true", &tenant, "in-flight")
        .send()
        .await
        .unwrap();
    counters.open_gate();
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
    assert_eq!(slow.await.unwrap().unwrap().status(), StatusCode::CREATED);
}

async fn a_duplicate_can_wait_for_the_result_instead(store: Arc<dyn IdempotencyStore>) {
    let (base, counters) = serve(store, |l| l.wait_for_result(Duration::from_secs(20))).await;
    let (client, tenant) = (client(), tenant());
    let first = in_background(&client, &base, "/orders?gated=true", &tenant, "waits");
    counters.handler_started().await;
    let waiting = in_background(&client, &base, "/orders?gated=true", &tenant, "waits");
    // The duplicate is waiting (it cannot have run: the gate holds the key's
    // only run) when the first finishes.
    tokio::time::sleep(Duration::from_millis(100)).await;
    counters.open_gate();
    let waiting = waiting.await.unwrap().unwrap();
    assert_eq!(waiting.status(), StatusCode::CREATED);
    assert_eq!(waiting.headers()["idempotent-replayed"], "true");
    let first = first.await.unwrap().unwrap().text().await.unwrap();
    assert_eq!(waiting.text().await.unwrap(), first);
    assert_eq!(counters.orders.load(Ordering::SeqCst), 1);
}

async fn a_client_that_hangs_up_mid_handler_still_gets_its_replay(
    store: Arc<dyn IdempotencyStore>,
) {
    let (base, counters) = serve(store, |l| l).await;
    let (client, tenant) = (client(), tenant());
    let gone = in_background(&client, &base, "/orders?gated=true", &tenant, "hang-up");
    counters.handler_started().await;
    // The client hangs up mid-handler: its connection closes.
    gone.abort();
    assert!(gone.await.unwrap_err().is_cancelled());
    counters.open_gate();
    // The handler runs on and its response is stored; the retry replays it.
    let retry = idem_conformance::support::eventually("the replay after a hang-up", || async {
        let response = keyed(&client, &base, "/orders?gated=true", &tenant, "hang-up")
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

async fn numbers_past_a_doubles_precision_are_another_payload(store: Arc<dyn IdempotencyStore>) {
    let (base, counters) = serve(store, |l| l).await;
    let (client, tenant) = (client(), tenant());
    for (key, first, other) in [
        (
            "past-2-53",
            r#"{"amount":9007199254740993}"#,
            r#"{"amount":9007199254740992}"#,
        ),
        (
            "past-u64",
            r#"{"id":12345678901234567890}"#,
            r#"{"id":12345678901234567891}"#,
        ),
        (
            "thirtieth-digit",
            r#"{"rate":0.100000000000000000000000000001}"#,
            r#"{"rate":0.100000000000000000000000000002}"#,
        ),
    ] {
        let placed = post_order(&client, &base, &tenant, key, first).await;
        assert_eq!(placed.status(), StatusCode::CREATED, "{first}");
        let reused = post_order(&client, &base, &tenant, key, other).await;
        assert_eq!(
            reused.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "{other} was taken for {first}"
        );
    }
    // The same decimal value, spelled another way, is the same payload.
    post_order(&client, &base, &tenant, "decimal", r#"{"amount":59.9}"#).await;
    let same = post_order(&client, &base, &tenant, "decimal", r#"{"amount":5.990e1}"#).await;
    assert_eq!(same.headers()["idempotent-replayed"], "true");
    assert_eq!(counters.orders.load(Ordering::SeqCst), 4);
}

async fn a_handler_that_outlives_its_lease_runs_once_and_its_client_gets_its_own_response(
    store: Arc<dyn IdempotencyStore>,
) {
    // The runner as a user builds it: nothing about renewal configured.
    let lease = Duration::from_secs(3);
    let idem = Idempotency::new(store).with_lease(lease).unwrap();
    let (base, counters) = serve_runner(idem, |l| l).await;
    let (client, tenant) = (client(), tenant());
    let first = in_background(&client, &base, "/orders?gated=true", &tenant, "outlives");
    counters.handler_started().await;
    // Past the lease the handler was claimed with: only renewal holds it.
    tokio::time::sleep(lease + lease / 4).await;
    let retry = keyed(&client, &base, "/orders?gated=true", &tenant, "outlives")
        .send()
        .await
        .unwrap();
    assert_eq!(
        retry.status(),
        StatusCode::CONFLICT,
        "a retry took over a running handler"
    );
    counters.open_gate();
    let first = first.await.unwrap().unwrap();
    assert_eq!(
        first.status(),
        StatusCode::CREATED,
        "the first client lost its response"
    );
    assert!(!first.headers().contains_key("idempotent-replayed"));
    let body = first.bytes().await.unwrap();
    let after = keyed(&client, &base, "/orders?gated=true", &tenant, "outlives")
        .send()
        .await
        .unwrap();
    assert_eq!(after.headers()["idempotent-replayed"], "true");
    assert_eq!(after.bytes().await.unwrap(), body);
    assert_eq!(
        counters.orders.load(Ordering::SeqCst),
        1,
        "the handler ran twice"
    );
}

async fn problems_default_to_about_blank_titled_with_the_status_phrase(
    store: Arc<dyn IdempotencyStore>,
) {
    let (base, _) = serve_runner(Idempotency::new(store), |l| l.require_key()).await;
    let (client, tenant) = (client(), tenant());
    let missing = unkeyed(&client, &base, &tenant).await;
    let json = problem_json(missing).await;
    assert_eq!(json["type"], "about:blank");
    assert_eq!(json["title"], "Bad Request");
    post_order(&client, &base, &tenant, "phrase", r#"{"qty":1}"#).await;
    let reused = post_order(&client, &base, &tenant, "phrase", r#"{"qty":2}"#).await;
    let json = problem_json(reused).await;
    assert_eq!(json["type"], "about:blank");
    assert_eq!(json["title"], "Unprocessable Content", "RFC 9110's phrase");
    assert_eq!(json["status"], 422);
    let huge = client
        .post(format!("{base}/orders"))
        .header("x-tenant", &tenant)
        .header("idempotency-key", quoted("phrase-huge"))
        .body("x".repeat(32 * 1024))
        .send()
        .await
        .unwrap();
    assert_eq!(huge.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let json = problem_json(huge).await;
    assert_eq!(json["type"], "about:blank");
    assert_eq!(json["title"], "Content Too Large", "RFC 9110's phrase");
    assert_eq!(json["status"], 413);
}

/// Sends `request` on a connection of its own and reads until the server
/// closes it or `until` has been read.
async fn raw(base: &str, request: &[u8], until: Option<&str>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = base.trim_start_matches("http://");
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    socket.write_all(request).await.unwrap();
    let mut read = Vec::new();
    let mut buffer = [0u8; 4096];
    let reading = async {
        loop {
            let n = socket.read(&mut buffer).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            read.extend_from_slice(&buffer[..n]);
            if until.is_some_and(|end| String::from_utf8_lossy(&read).contains(end)) {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), reading)
        .await
        .expect("the server neither answered nor closed");
    String::from_utf8_lossy(&read).to_ascii_lowercase()
}

fn raw_post(path: &str, tenant: &str, key: &str, extra: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\nx-tenant: {tenant}\r\nidempotency-key: \"{key}\"\r\n{extra}\r\n{body}"
    )
    .into_bytes()
}

async fn fields_named_by_connection_are_never_replayed(store: Arc<dyn IdempotencyStore>) {
    let (base, counters) = serve(store, |l| l).await;
    let tenant = tenant();
    let request = raw_post(
        "/hop",
        &tenant,
        "hop",
        "content-length: 0\r\nconnection: close\r\n",
        "",
    );
    let first = raw(&base, &request, None).await;
    assert!(first.starts_with("http/1.1 201"), "{first}");
    let replay = raw(&base, &request, None).await;
    assert!(replay.starts_with("http/1.1 201"), "{replay}");
    assert!(replay.contains("idempotent-replayed: true"), "{replay}");
    assert!(replay.contains("x-kept: kept"), "{replay}");
    assert!(
        !replay.contains("x-hop"),
        "a hop-by-hop field was replayed: {replay}"
    );
    assert_eq!(counters.orders.load(Ordering::SeqCst), 1);
}

async fn a_declared_body_over_the_limit_is_413_without_100_continue(
    store: Arc<dyn IdempotencyStore>,
) {
    let (base, counters) = serve(store, |l| l).await;
    let request = raw_post(
        "/orders",
        &tenant(),
        "expects",
        "content-type: application/json\r\ncontent-length: 52428800\r\nexpect: 100-continue\r\n",
        "",
    );
    // No body follows: an answer at all shows none was waited for.
    let answer = raw(&base, &request, Some("\r\n\r\n")).await;
    assert!(
        answer.starts_with("http/1.1 413"),
        "expected an immediate 413, got {answer}"
    );
    assert_eq!(counters.orders.load(Ordering::SeqCst), 0);
}

async fn a_body_cut_short_claims_nothing(store: Arc<dyn IdempotencyStore>) {
    use tokio::io::AsyncWriteExt;
    let (base, counters) = serve(store, |l| l).await;
    let tenant = tenant();
    let address = base.trim_start_matches("http://").to_string();
    let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
    let head = raw_post(
        "/orders",
        &tenant,
        "cut-short",
        "content-type: application/json\r\ncontent-length: 100\r\n",
        r#"{"qty":"#,
    );
    socket.write_all(&head).await.unwrap();
    socket.shutdown().await.unwrap();
    drop(socket);
    // The whole request under the same key runs at once, as a first attempt.
    let client = client();
    let response = idem_conformance::support::eventually("the full request", || async {
        let response = post_order(&client, &base, &tenant, "cut-short", r#"{"qty":1}"#).await;
        (response.status() != StatusCode::CONFLICT).then_some(response)
    })
    .await;
    assert_eq!(response.status(), StatusCode::CREATED);
    assert!(!response.headers().contains_key("idempotent-replayed"));
    assert_eq!(counters.orders.load(Ordering::SeqCst), 1);
}

/// A store whose responses are limited to 1 KiB, against `/big`'s 64 KiB.
async fn a_response_too_large_to_store_runs_once_and_retries_replay_its_fallback(
    store: Arc<dyn IdempotencyStore>,
) {
    assert_eq!(store.capabilities().max_response_bytes, 1024);
    let (base, counters) = serve(store, |l| l).await;
    let (client, tenant) = (client(), tenant());
    let send = || keyed(&client, &base, "/big", &tenant, "big").send();
    let first = send().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert!(!first.headers().contains_key("idempotent-replayed"));
    assert_eq!(first.bytes().await.unwrap().len(), 64 * 1024);
    // Every retry gets the small stored answer at once, marked as a replay.
    for _ in 0..2 {
        let retry = send().await.unwrap();
        assert_eq!(retry.status(), StatusCode::OK);
        assert_eq!(retry.headers()["idempotent-replayed"], "true");
        let json = problem_json(retry).await;
        assert!(
            json["detail"]
                .as_str()
                .unwrap()
                .contains("larger than the idempotency store keeps"),
            "{json}"
        );
    }
    assert_eq!(
        counters.orders.load(Ordering::SeqCst),
        1,
        "the handler ran twice"
    );
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
            where_bare_keys_are_taken_a_token_is_the_same_key_as_its_quoted_form,
            a_required_key_that_is_missing_is_400_as_the_draft_says,
            a_duplicate_in_flight_is_409_with_retry_after,
            a_duplicate_can_wait_for_the_result_instead,
            a_client_that_hangs_up_mid_handler_still_gets_its_replay,
            a_5xx_releases_the_key_and_the_retry_runs_again,
            a_body_over_the_limit_is_413_before_any_claim,
            numbers_past_a_doubles_precision_are_another_payload,
            a_handler_that_outlives_its_lease_runs_once_and_its_client_gets_its_own_response,
            problems_default_to_about_blank_titled_with_the_status_phrase,
            fields_named_by_connection_are_never_replayed,
            a_declared_body_over_the_limit_is_413_without_100_continue,
            a_body_cut_short_claims_nothing,
        ]);
    };
    ($name:ident, $make:expr, [$($case:ident),* $(,)?]) => {
        mod $name {
            use super::*;

            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case($make(None).await).await;
                }
            )*

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_response_too_large_to_store_runs_once_and_retries_replay_its_fallback() {
                super::a_response_too_large_to_store_runs_once_and_retries_replay_its_fallback(
                    $make(Some(1024)).await,
                )
                .await;
            }
        }
    };
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set (scripts/test sets it)"))
}

/// Each store, with its default response limit or `max`.
async fn memory(max: Option<usize>) -> Arc<dyn IdempotencyStore> {
    let mut options = idem_memory::MemoryOptions::default();
    if let Some(max) = max {
        options = options.max_response_bytes(max);
    }
    Arc::new(idem_memory::MemoryStore::with_options(options).unwrap())
}

async fn postgres(max: Option<usize>) -> Arc<dyn IdempotencyStore> {
    let pool = idem_postgres::guarded(idem_postgres::sqlx::postgres::PgPoolOptions::new())
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(5))
        .connect(&env("IDEM_POSTGRES_URL"))
        .await
        .expect("connect to IDEM_POSTGRES_URL");
    let mut options = idem_postgres::PostgresOptions::default();
    if let Some(max) = max {
        options =
            options.store_options(idem_core::StoreOptions::default().with_max_response_bytes(max));
    }
    let store = idem_postgres::PostgresStore::with_options(pool, options).unwrap();
    store.migrate().await.unwrap();
    Arc::new(store)
}

async fn redis(max: Option<usize>) -> Arc<dyn IdempotencyStore> {
    let client = idem_redis::redis::Client::open(env("IDEM_REDIS_URL")).unwrap();
    let conn = idem_redis::redis::aio::ConnectionManager::new(client)
        .await
        .expect("connect to IDEM_REDIS_URL");
    // The test server keeps nothing on disk.
    let mut options = idem_redis::RedisOptions::default().accept_volatility();
    if let Some(max) = max {
        options =
            options.store_options(idem_core::StoreOptions::default().with_max_response_bytes(max));
    }
    Arc::new(
        idem_redis::RedisStore::with_options(conn, options)
            .await
            .unwrap(),
    )
}

for_store!(memory, memory);
for_store!(postgres, postgres);
for_store!(redis, redis);

/// The service without the layer, as tower-http's services are built.
#[tokio::test]
async fn the_service_built_directly_replays_as_the_layer_does() {
    use tower::ServiceExt;
    let counters = Counters::default();
    let route = Router::new()
        .route("/payments", post(create_payment))
        .with_state(counters.clone());
    let idem = Idempotency::new(Arc::new(idem_memory::MemoryStore::new()));
    let service = idem_http::IdempotencyService::new(route, idem);
    let request = || {
        axum::http::Request::post("/payments")
            .header("idempotency-key", "\"direct\"")
            .body(axum::body::Body::from("{}"))
            .unwrap()
    };
    let first = service.clone().oneshot(request()).await.unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let retry = service.oneshot(request()).await.unwrap();
    assert_eq!(retry.headers()["idempotent-replayed"], "true");
    assert_eq!(counters.orders.load(Ordering::SeqCst), 1);
}

/// The inner service's own error reaches the caller as itself (no 500, no
/// downcast), and the key is kept: the call may have done its work.
#[tokio::test]
async fn an_inner_error_reaches_the_caller_as_itself_and_keeps_the_key() {
    use tower::ServiceExt;

    #[derive(Debug, PartialEq)]
    struct Refused(&'static str);

    let calls = Arc::new(AtomicUsize::new(0));
    let inner = tower::service_fn({
        let calls = Arc::clone(&calls);
        move |_: axum::http::Request<axum::body::Body>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err::<axum::http::Response<axum::body::Body>, _>(Refused("upstream down")) }
        }
    });
    let idem = Idempotency::new(Arc::new(idem_memory::MemoryStore::new()));
    let service = idem_http::IdempotencyService::new(inner, idem);
    let request = || {
        axum::http::Request::post("/payments")
            .header("idempotency-key", "\"inner-error\"")
            .body(axum::body::Body::from("{}"))
            .unwrap()
    };
    let failed = service.clone().oneshot(request()).await;
    assert_eq!(failed.unwrap_err(), Refused("upstream down"));
    let retry = service.oneshot(request()).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CONFLICT);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// The transactional mode on Postgres: the handler's rows and the stored
/// response commit together; a response the policy does not store rolls
/// the rows back and frees the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transactional_route_commits_its_rows_with_the_stored_response() {
    use axum::Extension;
    use idem_http::IdempotencyTransaction;
    use idem_postgres::sqlx::{self, AssertSqlSafe};
    use idem_postgres::{PgTransaction, PostgresStore};

    let pool = idem_postgres::guarded(idem_postgres::sqlx::postgres::PgPoolOptions::new())
        .max_connections(8)
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
    let handler = move |Extension(tx): Extension<IdempotencyTransaction<PgTransaction>>,
                        Extension(ctx): Extension<idem_core::RunContext<dyn IdempotencyStore>>,
                        body: String| {
        let insert = insert.clone();
        async move {
            let mut tx = tx.lock().await.unwrap();
            sqlx::query(AssertSqlSafe(insert))
                .bind(&body)
                .execute(tx.conn())
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
    // Over the concrete store, as a user writes it next to `begin`: the
    // handler still finds `RunContext<dyn IdempotencyStore>` (it found
    // none, and axum answered 500, when the context kept the store's type).
    let layer = IdempotencyLayer::new(Idempotency::new(Arc::new(store.clone()))).in_transaction({
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

/// A store failure is a 500 whose detail is fixed and names an incident,
/// never the error's text: what the store said stays on the server.
#[tokio::test]
async fn a_failure_answers_500_with_a_fixed_detail_never_the_errors_text() {
    let (base, counters) = serve(Arc::new(LeakyStore), |l| l).await;
    let response = keyed(&client(), &base, "/orders", &tenant(), "leaky")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let body = response.text().await.unwrap();
    assert!(!body.contains("jane@example.com"), "{body}");
    assert!(!body.contains("already exists"), "{body}");
    assert!(!body.contains(LEAKY_SECRET), "{body}");
    let problem: serde_json::Value = serde_json::from_str(&body).unwrap();
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("incident"), "{detail}");
    assert_eq!(counters.orders.load(Ordering::SeqCst), 0);
}
