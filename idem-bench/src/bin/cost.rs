//! `idem-bench-cost`: what one request costs in process, in instructions
//! (valgrind's callgrind, unmoved by other load on the machine) and in
//! time, side by side in one run:
//!
//! - the request fingerprint of a JSON body (canonical JSON, then SHA-256)
//!   against a plain SHA-256 of the same bytes, at 1 KiB and 64 KiB;
//! - a replay and a fresh key through idem-http's layer called directly
//!   (tower `Service::call`, no HTTP), against the peer middleware
//!   `axum-idempotent` on the same route and runtime (its key-header mode,
//!   which hashes nothing, and its hashing mode).
//!
//! ```text
//! cargo run --release -p idem-bench --bin idem-bench-cost
//! cargo run --release -p idem-bench --bin idem-bench-cost -- --no-callgrind
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a benchmark fails loudly

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use clap::Parser;
use idem_bench::{callgrind, create_order, json_of};
use idem_core::{Fingerprint, Idempotency};
use idem_http::IdempotencyLayer;
use sha2::{Digest, Sha256};
use tower::ServiceExt;

/// In-process costs: the fingerprint, and the HTTP layer called directly.
#[derive(Debug, Parser)]
#[command(about)]
struct Args {
    /// Iterations per case.
    #[arg(long, default_value_t = 2000)]
    iterations: u64,
    /// Only timings, no instruction counts.
    #[arg(long)]
    no_callgrind: bool,
    /// Only the cases whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Runs one case's iterations and nothing else (how the program runs
    /// itself under callgrind).
    #[arg(long, hide = true)]
    case: Option<String>,
    /// Where callgrind writes its counts.
    #[arg(long, default_value = "target/bench/callgrind")]
    callgrind_dir: PathBuf,
}

const CASES: [&str; 10] = [
    "fingerprint/canonical/1024",
    "fingerprint/sha256/1024",
    "fingerprint/canonical/65536",
    "fingerprint/sha256/65536",
    "direct/idem/replay",
    "direct/axum-idempotent/replay",
    "direct/axum-idempotent-hashing/replay",
    "direct/idem/fresh",
    "direct/axum-idempotent/fresh",
    "direct/axum-idempotent-hashing/fresh",
];

const ORDER: &str = r#"{"sku":"A-1","qty":2}"#;

/// One iteration of a case.
type Step = Box<dyn FnMut(u64)>;

fn runtime() -> Arc<tokio::runtime::Runtime> {
    Arc::new(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
    )
}

/// Calls `app` with an order request under `key`, reads the whole
/// response and checks its status.
fn call(runtime: &tokio::runtime::Runtime, app: &Router, key: &str, cookie: Option<&str>) {
    let mut request = Request::post("/orders")
        .header("content-type", "application/json")
        .header("idempotency-key", format!("\"{key}\""));
    if let Some(cookie) = cookie {
        request = request.header("cookie", cookie);
    }
    let request = request.body(Body::from(ORDER)).unwrap();
    runtime.block_on(async {
        let response = app.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
        black_box(
            axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap(),
        );
    });
}

fn idem_app() -> Router {
    let store = Arc::new(idem_memory::MemoryStore::new());
    Router::new()
        .route("/orders", post(create_order))
        .layer(IdempotencyLayer::new(Idempotency::new(store)).require_key())
}

/// axum-idempotent behind the session layer it needs, with a session
/// opened (it stores nothing for a request without one); the cookie to send.
fn peer_app(runtime: &tokio::runtime::Runtime, hashing: bool) -> (Router, String) {
    use axum_idempotent::{IdempotentLayer, IdempotentOptions};
    use ruts::store::Ttl;
    use ruts::store::moka::MokaStore;
    use ruts::{CookieOptions, Session, SessionLayer};

    let store = Arc::new(MokaStore::builder().build());
    let mut options = IdempotentOptions::default().expire_after(3600);
    if !hashing {
        options = options.use_idempotency_key_header(Some("idempotency-key"), true);
    }
    let app = Router::new()
        .route("/orders", post(create_order))
        .layer(IdempotentLayer::<MokaStore>::new(options))
        .route(
            "/login",
            post(|session: Session<MokaStore>| async move {
                session
                    .set(
                        "user",
                        &String::from("alice"),
                        Ttl::new(3600).unwrap(),
                        None,
                    )
                    .await
                    .unwrap();
                "signed in"
            }),
        )
        .layer(
            SessionLayer::new(store).with_cookie_options(
                CookieOptions::build()
                    .name("session")
                    .max_age(3600)
                    .path("/"),
            ),
        )
        .layer(tower_cookies::CookieManagerLayer::new());
    let response = runtime
        .block_on(
            app.clone()
                .oneshot(Request::post("/login").body(Body::empty()).unwrap()),
        )
        .unwrap();
    let cookie = response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("session="))
        .and_then(|v| v.split(';').next())
        .expect("a session cookie")
        .to_string();
    (app, cookie)
}

/// The case's setup (not measured) and its step.
fn setup(case: &str) -> Step {
    let parts: Vec<&str> = case.split('/').collect();
    match parts.as_slice() {
        ["fingerprint", what, size] => {
            let json = json_of(size.parse().unwrap());
            match *what {
                "canonical" => Box::new(move |_| {
                    black_box(Fingerprint::json(black_box(&json)).unwrap());
                }),
                _ => Box::new(move |_| {
                    black_box(Sha256::digest(black_box(json.as_bytes())));
                }),
            }
        }
        ["direct", who, workload] => {
            let runtime = runtime();
            let (app, cookie) = match *who {
                "idem" => (idem_app(), None),
                peer => {
                    let (app, cookie) = peer_app(&runtime, peer.ends_with("hashing"));
                    (app, Some(cookie))
                }
            };
            let fresh = *workload == "fresh";
            // The replayed key is completed before any step.
            call(&runtime, &app, "replayed", cookie.as_deref());
            Box::new(move |i| {
                let key = if fresh {
                    format!("fresh-{i}")
                } else {
                    String::from("replayed")
                };
                // The hashing mode hashes the key header with the rest.
                call(&runtime, &app, &key, cookie.as_deref());
            })
        }
        _ => panic!("unknown case {case}"),
    }
}

/// The only function callgrind counts in: `iterations` steps.
#[inline(never)]
fn measured_region(step: &mut Step, from: u64, iterations: u64) {
    for i in from..from + iterations {
        step(i);
    }
}

/// Nanoseconds per step: the best of five rounds, after a warm-up.
fn time(case: &str, iterations: u64) -> f64 {
    let mut step = setup(case);
    measured_region(&mut step, 0, iterations / 10 + 1);
    let mut next = iterations;
    (0..5)
        .map(|_| {
            let start = Instant::now();
            measured_region(&mut step, next, iterations);
            next += iterations;
            start.elapsed().as_nanos() as f64 / iterations as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() -> Result<(), callgrind::Error> {
    let args = Args::parse();
    let n = args.iterations.max(1);
    if let Some(case) = &args.case {
        // Under callgrind: warm up uncounted, then the counted region.
        let mut step = setup(case);
        for i in 0..n / 10 + 1 {
            step(i);
        }
        measured_region(&mut step, n, n);
        return Ok(());
    }
    println!("{:<40} {:>14} {:>12}", "case", "instr/step", "ns/step");
    for case in CASES {
        if args
            .filter
            .as_ref()
            .is_some_and(|f| !case.contains(f.as_str()))
        {
            continue;
        }
        let ns = time(case, n);
        let instructions = if args.no_callgrind {
            String::from("-")
        } else {
            let counted = callgrind::count_region(
                "measured_region",
                &[
                    "--case".into(),
                    case.into(),
                    "--iterations".into(),
                    n.to_string(),
                ],
                &args.callgrind_dir,
            )?;
            format!("{:.0}", counted as f64 / n as f64)
        };
        println!("{case:<40} {instructions:>14} {ns:>12.0}");
    }
    Ok(())
}
