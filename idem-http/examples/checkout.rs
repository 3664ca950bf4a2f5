//! A checkout service behind the idempotency layer, and a client that meets
//! everything a client can: a first request, a retry, a duplicate that
//! arrives while the first still runs (and again after the first's lease
//! would have run out), and a key reused for another order, even one that
//! differs only past a double's precision.
//!
//! Run with `cargo run -p idem-http --example checkout`. The store is the
//! in-memory one, or Postgres / Redis when `IDEM_POSTGRES_URL` /
//! `IDEM_REDIS_URL` is set.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Extension, Router};
use idem_core::store::IdempotencyStore;
use idem_core::{Idempotency, RunContext};
use idem_http::IdempotencyLayer;

/// Charges the card once per key and answers with an order number.
async fn checkout(
    State(charges): State<Arc<AtomicU32>>,
    Extension(ctx): Extension<RunContext<dyn IdempotencyStore>>,
    body: String,
) -> (StatusCode, String) {
    // The payment provider gets a key that is the same on every attempt.
    let _provider_key = ctx.downstream_key("charge");
    if body.contains("slow") {
        // Longer than the lease: the layer renews it while this runs.
        tokio::time::sleep(Duration::from_millis(2_000)).await;
    }
    let order = charges.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::CREATED, format!("order #{order} placed"))
}

async fn store() -> Result<(&'static str, Arc<dyn IdempotencyStore>), Box<dyn std::error::Error>> {
    if let Ok(url) = std::env::var("IDEM_POSTGRES_URL") {
        let pool = idem_postgres::guarded(idem_postgres::sqlx::postgres::PgPoolOptions::new())
            .acquire_timeout(Duration::from_secs(5))
            .connect(&url)
            .await?;
        let store = idem_postgres::PostgresStore::new(pool);
        store.migrate().await?;
        return Ok(("postgres", Arc::new(store)));
    }
    if let Ok(url) = std::env::var("IDEM_REDIS_URL") {
        let client = idem_redis::redis::Client::open(url)?;
        let conn = idem_redis::redis::aio::ConnectionManager::new(client).await?;
        // A development Redis often keeps nothing on disk; in production,
        // run it with `appendonly yes` and drop this opt-in.
        let options = idem_redis::RedisOptions::default().accept_volatility();
        let store = idem_redis::RedisStore::with_options(conn, options).await?;
        return Ok(("redis", Arc::new(store)));
    }
    Ok(("memory", Arc::new(idem_memory::MemoryStore::new())))
}

/// What a client saw: status, body or problem title, and the replay mark.
async fn show(response: reqwest::Response) -> String {
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotent-replayed");
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(|v| format!(", Retry-After: {v}s"))
        .unwrap_or_default();
    let body = response.text().await.unwrap_or_default();
    let text = serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|problem| problem["title"].as_str().map(str::to_string))
        .unwrap_or(body);
    let mark = if replayed {
        " (Idempotent-Replayed)"
    } else {
        ""
    };
    format!("{status} {text}{mark}{retry_after}")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (name, store) = store().await?;
    let charges = Arc::new(AtomicU32::new(0));
    let app = Router::new()
        .route("/checkout", post(checkout))
        .layer(
            // A 1 s lease, so that the example need not wait 30 s to show
            // a handler outliving it.
            IdempotencyLayer::new(Idempotency::new(store).with_lease(Duration::from_secs(1))?)
                .require_key()
                // Problems link to the rules, with the draft's titles.
                .problem_documentation("https://docs.example.com/idempotency"),
        )
        .with_state(Arc::clone(&charges));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/checkout", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });

    let client = reqwest::Client::new();
    // Keys are per run, so the example starts afresh on a shared store too.
    let run = std::process::id();
    let send = |key: String, body: &'static str| {
        let request = client
            .post(&url)
            .header("idempotency-key", format!("\"{key}\""))
            .header("content-type", "application/json")
            .body(body);
        async move { request.send().await }
    };
    let cart = r#"{"cart": ["book", "lamp"], "total": 59.9}"#;
    println!("store:                {name}");
    println!(
        "first attempt:        {}",
        show(send(format!("a1b2-{run}"), cart).await?).await
    );
    // The client timed out and retries, its JSON serialised another way.
    let same_cart = r#"{ "total": 59.90, "cart": ["book", "lamp"] }"#;
    println!(
        "retry:                {}",
        show(send(format!("a1b2-{run}"), same_cart).await?).await
    );

    // A double click: the second request arrives while the first still runs.
    let slow_cart = r#"{"cart": ["slow boat"], "total": 10}"#;
    let slow = tokio::spawn(send(format!("c3d4-{run}"), slow_cart));
    tokio::time::sleep(Duration::from_millis(150)).await;
    println!(
        "concurrent duplicate: {}",
        show(send(format!("c3d4-{run}"), slow_cart).await?).await
    );
    // Past the lease the slow one was claimed with: still its key.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    println!(
        "after its lease:      {}",
        show(send(format!("c3d4-{run}"), slow_cart).await?).await
    );
    println!("  (the slow one:      {})", show(slow.await??).await);

    let other_cart = r#"{"cart": ["sofa"], "total": 899}"#;
    println!(
        "key reused:           {}",
        show(send(format!("a1b2-{run}"), other_cart).await?).await
    );
    // Two totals a double cannot tell apart are two orders.
    let huge = r#"{"cart": ["island"], "total": 9007199254740993}"#;
    let huge_less_one = r#"{"cart": ["island"], "total": 9007199254740992}"#;
    println!(
        "past 2^53:            {}",
        show(send(format!("e5f6-{run}"), huge).await?).await
    );
    println!(
        "  one less, same key: {}",
        show(send(format!("e5f6-{run}"), huge_less_one).await?).await
    );
    println!("cards charged:        {}", charges.load(Ordering::SeqCst));
    Ok(())
}
