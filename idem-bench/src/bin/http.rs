//! `idem-bench-http`: the idempotency layer's cost per request, measured in
//! one run against the same axum app without it, over real HTTP on
//! loopback, the server in a process of its own.
//!
//! ```text
//! cargo run --release -p idem-bench --bin idem-bench-http -- --backend memory --concurrency 8 --duration 3
//! cargo run --release -p idem-bench --bin idem-bench-http -- --mode instructions --backend memory
//! ```
//!
//! Workloads: `fresh` (a new key per request: claim, handler, completion)
//! and `replay` (one key per caller, completed before the run: claim and
//! replay only). `bare` is the app without the layer, the same requests,
//! measured again beside each workload.
//!
//! `--mode throughput` (the default) drives the server with concurrent
//! clients and reads the server process's CPU time before and after each
//! run: CPU per request, bare and with the layer, and the layer's share of
//! it. `--mode instructions` runs the server under valgrind's callgrind and
//! counts the instructions of sequential requests, which no other load on
//! the machine changes. `--mode serve` is the server itself.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};
use clap::{Parser, ValueEnum};
use idem_bench::callgrind::Server;
use idem_bench::{create_order, percentile};
use idem_core::Idempotency;
use idem_core::store::IdempotencyStore;
use idem_http::IdempotencyLayer;

type BenchError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Backend {
    Memory,
    Postgres,
    Redis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Concurrent clients; throughput and the server's CPU per request.
    Throughput,
    /// Sequential requests to the server under callgrind; instructions per request.
    Instructions,
    /// The server: prints its addresses, serves until stdin closes.
    Serve,
}

/// The idempotency layer against the bare app.
#[derive(Debug, Parser)]
#[command(about)]
struct Args {
    /// What to measure.
    #[arg(long, value_enum, default_value = "throughput")]
    mode: Mode,
    /// The store behind the layer.
    #[arg(long, value_enum, default_value = "memory")]
    backend: Backend,
    /// Concurrent clients.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3.0)]
    duration: f64,
    /// Requests counted per workload in `instructions` mode.
    #[arg(long, default_value_t = 200)]
    requests: u64,
    /// Worker threads of the server's runtime.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Where callgrind writes its counts.
    #[arg(long, default_value = "target/bench/callgrind")]
    callgrind_dir: PathBuf,
}

async fn store(backend: Backend) -> Result<Arc<dyn IdempotencyStore>, BenchError> {
    let env = |name: &str| {
        std::env::var(name).map_err(|_| format!("{name} is not set (scripts/bench sets it)"))
    };
    Ok(match backend {
        Backend::Memory => Arc::new(idem_memory::MemoryStore::new()),
        Backend::Postgres => {
            let pool = idem_postgres::guarded(idem_postgres::sqlx::postgres::PgPoolOptions::new())
                .max_connections(16)
                .acquire_timeout(Duration::from_secs(10))
                .connect(&env("IDEM_POSTGRES_URL")?)
                .await?;
            let store = idem_postgres::PostgresStore::new(pool);
            store.migrate().await?;
            Arc::new(store)
        }
        Backend::Redis => {
            use idem_redis::redis;
            let config = redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(2)))
                .set_response_timeout(Some(Duration::from_secs(5)));
            let client = redis::Client::open(env("IDEM_REDIS_URL")?)?;
            let conn = redis::aio::ConnectionManager::new_with_config(client, config).await?;
            let options = idem_redis::RedisOptions::default().accept_volatility();
            Arc::new(idem_redis::RedisStore::with_options(conn, options).await?)
        }
    })
}

/// Serves `app` on a loopback port; returns its address.
async fn listen(app: Router) -> Result<String, BenchError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?.to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(address)
}

/// The CPU time this process has used, in nanoseconds: the sum over its
/// threads (`/proc/self/task/*/schedstat`).
fn cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// The server: the bare app, the app behind the layer, and a control app
/// reporting the process's CPU time; one line of their addresses on stdout.
fn serve(args: &Args) -> Result<(), BenchError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.workers.max(1))
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let store = store(args.backend).await?;
        let bare = listen(Router::new().route("/orders", post(create_order))).await?;
        let layered = listen(
            Router::new()
                .route("/orders", post(create_order))
                .layer(IdempotencyLayer::new(Idempotency::new(store)).require_key()),
        )
        .await?;
        let control =
            listen(Router::new().route("/cpu", get(|| async { cpu_ns().to_string() }))).await?;
        let mut stdout = std::io::stdout();
        writeln!(stdout, "{bare} {layered} {control}")?;
        stdout.flush()?;
        // Until the driver closes our standard input.
        tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink()))
            .await??;
        Ok(())
    })
}

/// The server's addresses, from its ready line.
struct Addresses {
    bare: String,
    layered: String,
    control: String,
}

fn start_server(args: &Args, under_callgrind: bool) -> Result<(Server, Addresses), BenchError> {
    let backend = format!("{:?}", args.backend).to_lowercase();
    let server_args: Vec<String> = [
        "--mode",
        "serve",
        "--backend",
        &backend,
        "--workers",
        &args.workers.to_string(),
    ]
    .map(String::from)
    .to_vec();
    let dir = under_callgrind.then_some(args.callgrind_dir.as_path());
    let server = Server::start(&std::env::current_exe()?, &server_args, dir)?;
    let mut parts = server
        .ready_line
        .split_whitespace()
        .map(|a| format!("http://{a}"));
    let (Some(bare), Some(layered), Some(control)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("unexpected ready line {:?}", server.ready_line).into());
    };
    Ok((
        server,
        Addresses {
            bare: format!("{bare}/orders"),
            layered: format!("{layered}/orders"),
            control: format!("{control}/cpu"),
        },
    ))
}

/// The key a client sends on its `i`th request of a workload (`None`: no key).
type KeyFn = fn(usize, u64, &str) -> Option<String>;

fn fresh_key(caller: usize, i: u64, run: &str) -> Option<String> {
    Some(format!("{run}-f-{caller}-{i}"))
}

fn replay_key(caller: usize, _: u64, run: &str) -> Option<String> {
    Some(format!("{run}-r-{caller}"))
}

fn no_key(_: usize, _: u64, _: &str) -> Option<String> {
    None
}

/// One order request, with `key` if any; whether it got its 201.
async fn send(client: &reqwest::Client, url: &str, key: Option<String>) -> bool {
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .body(r#"{"sku":"A-1","qty":2}"#);
    if let Some(key) = key {
        request = request.header("idempotency-key", format!("\"{key}\""));
    }
    match request.send().await {
        Ok(response) if response.status() == StatusCode::CREATED => response.bytes().await.is_ok(),
        _ => false,
    }
}

struct Measured {
    ops_per_s: f64,
    p50_us: u64,
    p99_us: u64,
    errors: u64,
    /// Server CPU per request, microseconds.
    cpu_us: f64,
}

/// Drives `url` with `concurrency` clients for `duration`, reading the
/// server's CPU time at `control` before and after.
async fn drive(
    url: &str,
    control: &str,
    concurrency: usize,
    duration: Duration,
    key: KeyFn,
    run: &str,
) -> Result<Measured, BenchError> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()?;
    let cpu = |client: reqwest::Client| async move {
        let text = client.get(control).send().await?.text().await?;
        Ok::<u64, BenchError>(text.trim().parse()?)
    };
    let cpu_before = cpu(client.clone()).await?;
    let deadline = Instant::now() + duration;
    let started = Instant::now();
    let callers: Vec<_> = (0..concurrency)
        .map(|caller| {
            let (client, url, run) = (client.clone(), url.to_string(), run.to_string());
            tokio::spawn(async move {
                let (mut latencies, mut errors, mut i) = (Vec::new(), 0u64, 0u64);
                while Instant::now() < deadline {
                    let start = Instant::now();
                    if send(&client, &url, key(caller, i, &run)).await {
                        latencies
                            .push(u32::try_from(start.elapsed().as_micros()).unwrap_or(u32::MAX));
                    } else {
                        errors += 1;
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
    let cpu_after = cpu(client).await?;
    latencies.sort_unstable();
    let requests = latencies.len() as u64 + errors;
    Ok(Measured {
        ops_per_s: latencies.len() as f64 / elapsed.max(f64::EPSILON),
        p50_us: percentile(&latencies, 0.5),
        p99_us: percentile(&latencies, 0.99),
        errors,
        cpu_us: cpu_after.saturating_sub(cpu_before) as f64 / 1e3 / requests.max(1) as f64,
    })
}

const WORKLOADS: [(&str, KeyFn); 2] = [("fresh", fresh_key), ("replay", replay_key)];

fn throughput(args: &Args) -> Result<(), BenchError> {
    let (_server, at) = start_server(args, false)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let duration = Duration::from_secs_f64(args.duration.clamp(0.1, 3600.0));
        let run = uuid::Uuid::new_v4().simple().to_string();
        let c = args.concurrency;
        // Each replay key completed once before the replay run.
        drive(&at.layered, &at.control, c, Duration::from_millis(1), replay_key, &run).await?;
        println!(
            "{:<9} {:<8} {:>4} {:>10} {:>10} {:>6} {:>8} {:>8} {:>9} {:>7} {:>8} {:>8} {:>8} {:>6}",
            "backend",
            "workload",
            "conc",
            "bare op/s",
            "idem op/s",
            "ratio",
            "bare µs",
            "idem µs",
            "layer µs",
            "share",
            "bare p50",
            "idem p50",
            "idem p99",
            "errors"
        );
        let backend = format!("{:?}", args.backend).to_lowercase();
        for (workload, key) in WORKLOADS {
            // The bare app beside each workload, so both see the same machine.
            let base = drive(&at.bare, &at.control, c, duration, no_key, &run).await?;
            let with = drive(&at.layered, &at.control, c, duration, key, &run).await?;
            let layer = with.cpu_us - base.cpu_us;
            println!(
                "{:<9} {:<8} {:>4} {:>10.0} {:>10.0} {:>6.2} {:>8.1} {:>8.1} {:>9.1} {:>6.0}% {:>8} {:>8} {:>8} {:>6}",
                backend,
                workload,
                c,
                base.ops_per_s,
                with.ops_per_s,
                with.ops_per_s / base.ops_per_s.max(f64::EPSILON),
                base.cpu_us,
                with.cpu_us,
                layer,
                100.0 * layer / with.cpu_us.max(f64::EPSILON),
                base.p50_us,
                with.p50_us,
                with.p99_us,
                base.errors + with.errors
            );
        }
        Ok(())
    })
}

/// Instructions per request of the server, sequential requests, bare and
/// with the layer.
fn instructions(args: &Args) -> Result<(), BenchError> {
    let (mut server, at) = start_server(args, true)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let client = reqwest::Client::new();
    let n = args.requests.max(1);
    let mut count = |url: &str, key: KeyFn| -> Result<f64, BenchError> {
        runtime.block_on(async {
            // Warm: connections open, the replay key completed.
            for i in 0..20 {
                if !send(&client, url, key(0, i, &run)).await {
                    return Err("a warm-up request failed".into());
                }
            }
            Ok::<(), BenchError>(())
        })?;
        server.zero()?;
        runtime.block_on(async {
            for i in 0..n {
                if !send(&client, url, key(0, 1000 + i, &run)).await {
                    return Err("a counted request failed".into());
                }
            }
            Ok::<(), BenchError>(())
        })?;
        Ok(server.dump()? as f64 / n as f64)
    };
    let bare = count(&at.bare, no_key)?;
    let mut rows = vec![("bare", bare)];
    for (workload, key) in WORKLOADS {
        rows.push((workload, count(&at.layered, key)?));
    }
    let backend = format!("{:?}", args.backend).to_lowercase();
    println!(
        "{:<9} {:<8} {:>14} {:>14}",
        "backend", "workload", "instr/request", "layer instr"
    );
    for (workload, per_request) in rows {
        println!(
            "{:<9} {:<8} {:>14.0} {:>14.0}",
            backend,
            workload,
            per_request,
            per_request - bare
        );
    }
    Ok(())
}

fn main() -> Result<(), BenchError> {
    let args = Args::parse();
    match args.mode {
        Mode::Serve => serve(&args),
        Mode::Throughput => throughput(&args),
        Mode::Instructions => instructions(&args),
    }
}
