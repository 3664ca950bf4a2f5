//! `idem-bench-http`: the idempotency layer's cost per request, measured in
//! one run against the same axum app without it, over real HTTP on loopback.
//!
//! ```text
//! cargo run --release -p idem-bench --bin idem-bench-http -- --backend memory --concurrency 8 --duration 3
//! ```
//!
//! Workloads: `fresh` (a new key per request: claim, handler, completion)
//! and `replay` (one key per caller, completed before the run: claim and
//! replay only). `bare` is the app without the layer, the same requests.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use clap::{Parser, ValueEnum};
use idem_bench::percentile;
use idem_core::Idempotency;
use idem_core::store::IdempotencyStore;
use idem_http::IdempotencyLayer;

type BenchError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Backend {
    Memory,
    Postgres,
}

/// The idempotency layer against the bare app.
#[derive(Debug, Parser)]
#[command(about)]
struct Args {
    /// The store behind the layer.
    #[arg(long, value_enum, default_value = "memory")]
    backend: Backend,
    /// Concurrent clients.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
}

/// The handler both apps serve: a small JSON order.
async fn create_order(body: String) -> (StatusCode, String) {
    (
        StatusCode::CREATED,
        format!(
            r#"{{"order":"A-1","status":"placed","bytes":{}}}"#,
            body.len()
        ),
    )
}

async fn store(backend: Backend) -> Result<Arc<dyn IdempotencyStore>, BenchError> {
    Ok(match backend {
        Backend::Memory => Arc::new(idem_memory::MemoryStore::new()),
        Backend::Postgres => {
            let url = std::env::var("IDEM_POSTGRES_URL")
                .map_err(|_| "IDEM_POSTGRES_URL is not set (scripts/bench sets it)")?;
            let pool = idem_postgres::sqlx::postgres::PgPoolOptions::new()
                .max_connections(16)
                .test_before_acquire(false)
                .acquire_timeout(Duration::from_secs(10))
                .connect(&url)
                .await?;
            let store = idem_postgres::PostgresStore::new(pool);
            store.migrate().await?;
            Arc::new(store)
        }
    })
}

/// Serves `app` on a loopback port; returns the order URL.
async fn serve(app: Router) -> Result<String, BenchError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/orders", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

struct Measured {
    ops_per_s: f64,
    p50_us: u64,
    p99_us: u64,
    errors: u64,
}

/// Drives `url` with `concurrency` clients for `duration`; `key` names the
/// key a client sends on its `i`th request (`None`: no key).
async fn drive(
    url: &str,
    concurrency: usize,
    duration: Duration,
    key: fn(usize, u64, &str) -> Option<String>,
    run: &str,
) -> Result<Measured, BenchError> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()?;
    let deadline = Instant::now() + duration;
    let started = Instant::now();
    let callers: Vec<_> = (0..concurrency)
        .map(|caller| {
            let (client, url, run) = (client.clone(), url.to_string(), run.to_string());
            tokio::spawn(async move {
                let (mut latencies, mut errors, mut i) = (Vec::new(), 0u64, 0u64);
                while Instant::now() < deadline {
                    let mut request = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(r#"{"sku":"A-1","qty":2}"#);
                    if let Some(key) = key(caller, i, &run) {
                        request = request.header("idempotency-key", format!("\"{key}\""));
                    }
                    let start = Instant::now();
                    match request.send().await {
                        Ok(response) if response.status() == StatusCode::CREATED => {
                            let _ = response.bytes().await;
                            latencies.push(
                                u32::try_from(start.elapsed().as_micros()).unwrap_or(u32::MAX),
                            );
                        }
                        _ => errors += 1,
                    }
                    i += 1;
                }
                (latencies, errors)
            })
        })
        .collect();
    let (mut latencies, mut errors) = (Vec::new(), 0);
    for caller in callers {
        let (l, e) = caller.await?;
        latencies.extend(l);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    Ok(Measured {
        ops_per_s: latencies.len() as f64 / elapsed.max(f64::EPSILON),
        p50_us: percentile(&latencies, 0.5),
        p99_us: percentile(&latencies, 0.99),
        errors,
    })
}

fn fresh_key(caller: usize, i: u64, run: &str) -> Option<String> {
    Some(format!("{run}-f-{caller}-{i}"))
}

fn replay_key(caller: usize, _: u64, run: &str) -> Option<String> {
    Some(format!("{run}-r-{caller}"))
}

fn no_key(_: usize, _: u64, _: &str) -> Option<String> {
    None
}

#[tokio::main]
async fn main() -> Result<(), BenchError> {
    let args = Args::parse();
    let duration = Duration::from_secs_f64(args.duration.clamp(0.1, 3600.0));
    let store = store(args.backend).await?;
    let bare = serve(Router::new().route("/orders", post(create_order))).await?;
    let layered = serve(
        Router::new()
            .route("/orders", post(create_order))
            .layer(IdempotencyLayer::new(Idempotency::new(store)).require_key()),
    )
    .await?;
    let run = uuid::Uuid::new_v4().simple().to_string();
    // Each replay key completed once before the replay run.
    drive(
        &layered,
        args.concurrency,
        Duration::from_millis(1),
        replay_key,
        &run,
    )
    .await?;

    let backend = format!("{:?}", args.backend).to_lowercase();
    println!(
        "{:<9} {:<8} {:>5} {:>11} {:>11} {:>9} {:>9} {:>9} {:>13} {:>7}",
        "backend",
        "workload",
        "conc",
        "bare ops/s",
        "idem ops/s",
        "bare p50",
        "idem p50",
        "idem p99",
        "overhead µs",
        "errors"
    );
    let base = drive(&bare, args.concurrency, duration, no_key, &run).await?;
    for (workload, key) in [
        ("fresh", fresh_key as fn(usize, u64, &str) -> Option<String>),
        ("replay", replay_key),
    ] {
        let with = drive(&layered, args.concurrency, duration, key, &run).await?;
        // Per request, at this concurrency: the extra time each one takes.
        let overhead =
            args.concurrency as f64 * 1e6 * (1.0 / with.ops_per_s - 1.0 / base.ops_per_s);
        println!(
            "{:<9} {:<8} {:>5} {:>11.0} {:>11.0} {:>9} {:>9} {:>9} {:>13.1} {:>7}",
            backend,
            workload,
            args.concurrency,
            base.ops_per_s,
            with.ops_per_s,
            base.p50_us,
            with.p50_us,
            with.p99_us,
            overhead,
            base.errors + with.errors
        );
    }
    Ok(())
}
