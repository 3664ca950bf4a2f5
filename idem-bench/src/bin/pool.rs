//! `idem-bench-pool`: what the pool guard (`idem_postgres::guarded`) costs,
//! beside the same pool without it, in one run.
//!
//! ```text
//! cargo run --release -p idem-bench --bin idem-bench-pool -- --cycles 5000
//! ```
//!
//! Each cycle acquires the pool's one connection, runs one statement
//! (`SELECT 1`) and drops the connection, and the next cycle waits for it
//! back: the whole round of a borrower, with the release's background
//! work (sqlx's ping; with the guard, its probe too) inside the cycle, so
//! nothing the guard adds hides in the background. Plain and guarded
//! pools take turns, 5 rounds each, and each reports its median round.
//! Round trips are counted on the wire by a proxy between the pools and
//! Postgres (every ReadyForQuery is one). Nothing is judged.

use std::time::{Duration, Instant};

use clap::Parser;
use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};
use idem_postgres::sqlx::{self, PgPool};

/// The counting proxy of idem-postgres's round-trip tests, compiled in from
/// there rather than copied.
#[path = "../../../idem-postgres/tests/common/proxy.rs"]
#[allow(dead_code)]
mod proxy;

use proxy::CountingProxy;

type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// Rounds of each pool, taking turns.
const ROUNDS: usize = 5;

/// The pool guard's cost per borrow, against a plain pool.
#[derive(Debug, Parser)]
struct Args {
    /// Cycles per round.
    #[arg(long, default_value_t = 5000)]
    cycles: u32,
}

struct Measured {
    micros_per_cycle: f64,
    round_trips_per_cycle: f64,
}

async fn pool(guarded: bool, options: PgConnectOptions) -> Result<PgPool, BenchError> {
    let base = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(10))
        .test_before_acquire(false);
    let base = if guarded {
        idem_postgres::guarded(base)
    } else {
        base
    };
    Ok(base.connect_with(options).await?)
}

async fn round(pool: &PgPool, proxy: &CountingProxy, cycles: u32) -> Result<Measured, BenchError> {
    let before = proxy.counts.ready.load(std::sync::atomic::Ordering::SeqCst);
    let started = Instant::now();
    for _ in 0..cycles {
        let mut conn = pool.acquire().await?;
        sqlx::query("SELECT 1").execute(&mut *conn).await?;
    }
    // The last release's background work, too.
    drop(pool.acquire().await?);
    let elapsed = started.elapsed();
    let after = proxy.counts.ready.load(std::sync::atomic::Ordering::SeqCst);
    Ok(Measured {
        micros_per_cycle: elapsed.as_secs_f64() * 1e6 / f64::from(cycles),
        round_trips_per_cycle: (after - before) as f64 / f64::from(cycles + 1),
    })
}

fn median(mut runs: Vec<Measured>) -> Measured {
    runs.sort_by(|a, b| a.micros_per_cycle.total_cmp(&b.micros_per_cycle));
    runs.swap_remove(runs.len() / 2)
}

#[tokio::main]
async fn main() -> Result<(), BenchError> {
    let args = Args::parse();
    let url = std::env::var("IDEM_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let server: PgConnectOptions = url.parse()?;
    let upstream = format!("{}:{}", server.get_host(), server.get_port());
    let proxy = CountingProxy::start(upstream).await;
    let options = server
        .host("127.0.0.1")
        .port(proxy.port)
        .ssl_mode(PgSslMode::Disable);
    let plain = pool(false, options.clone()).await?;
    let guarded = pool(true, options).await?;
    // Warm both (statement caches, the first connection).
    round(&plain, &proxy, 100).await?;
    round(&guarded, &proxy, 100).await?;
    let (mut plain_runs, mut guarded_runs) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        plain_runs.push(round(&plain, &proxy, args.cycles).await?);
        guarded_runs.push(round(&guarded, &proxy, args.cycles).await?);
    }
    let (plain, guarded) = (median(plain_runs), median(guarded_runs));
    println!("| pool | µs per borrow (acquire, one statement, release) | round trips per borrow |");
    println!("|---|---:|---:|");
    for (name, m) in [("plain", &plain), ("guarded", &guarded)] {
        println!(
            "| {name} | {:.1} | {:.2} |",
            m.micros_per_cycle, m.round_trips_per_cycle
        );
    }
    println!(
        "\nThe guard adds {:.1} µs and {:.2} round trips per borrow ({} cycles a round, median of {ROUNDS}).",
        guarded.micros_per_cycle - plain.micros_per_cycle,
        guarded.round_trips_per_cycle - plain.round_trips_per_cycle,
        args.cycles
    );
    Ok(())
}
