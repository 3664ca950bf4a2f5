//! `idem-bench`: one benchmark run of one backend, workload and concurrency,
//! through idem, through idem with the replay cache (`--cache`), or
//! (`--raw`) through the driver alone.
//!
//! ```text
//! cargo run --release -p idem-bench -- --backend redis --workload replay --concurrency 8 --duration 5 --json
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use idem_bench::{Mix, RunResult, percentile};
use rand::SeedableRng;

mod backend;
mod plan;

use backend::{Backend, BackendKind, BenchError, Mode, Names};
use plan::{Plan, REPLAY_KEYS, Workload};

/// Benchmarks an idem backend against its raw server.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// The store to measure.
    #[arg(long, value_enum)]
    backend: BackendKind,
    /// What the callers do.
    #[arg(long, value_enum, default_value = "fresh")]
    workload: Workload,
    /// Concurrent callers.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// How long to run, in seconds.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Stop after this many operations instead of after `--duration`.
    #[arg(long)]
    requests: Option<u64>,
    /// The same server operations through the driver alone, without idem.
    #[arg(long)]
    raw: bool,
    /// Through idem with the replay cache (`idem-cache`) in front of the store.
    #[arg(long, conflicts_with = "raw")]
    cache: bool,
    /// One JSON line instead of a table.
    #[arg(long)]
    json: bool,
}

impl Args {
    fn mode(&self) -> Mode {
        match (self.raw, self.cache) {
            (true, _) => Mode::Raw,
            (false, true) => Mode::Cached,
            (false, false) => Mode::Lib,
        }
    }
}

/// What one caller saw.
struct CallerReport {
    latencies_us: Vec<u32>,
    mix: Mix,
    errors: u64,
    first_error: Option<String>,
}

async fn caller(
    backend: Arc<Backend>,
    plan: Arc<Plan>,
    caller: usize,
    deadline: Instant,
    quota: Option<u64>,
) -> CallerReport {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(caller as u64 * 7919 + 1);
    let mut report = CallerReport {
        latencies_us: Vec::with_capacity(1 << 16),
        mix: Mix::default(),
        errors: 0,
        first_error: None,
    };
    let mut i = 0;
    loop {
        match quota {
            Some(quota) if i >= quota => break,
            None if Instant::now() >= deadline => break,
            _ => {}
        }
        let op = plan.next(caller, i, &mut rng);
        let start = Instant::now();
        match backend.execute(&op).await {
            Ok(outcome) => {
                report.mix.add(outcome);
                let us = start.elapsed().as_micros();
                report
                    .latencies_us
                    .push(u32::try_from(us).unwrap_or(u32::MAX));
            }
            Err(error) => {
                report.errors += 1;
                report.first_error.get_or_insert_with(|| error.to_string());
            }
        }
        i += 1;
    }
    report
}

async fn run(args: &Args) -> Result<RunResult, BenchError> {
    let concurrency = args.concurrency.max(1);
    let names = Names::fresh();
    let replay = args.workload == Workload::Replay;
    // Networked backends are set up over connections of their own, closed
    // before counting starts, so the server's counters hold only the run.
    let in_process = args.backend == BackendKind::Memory;
    // Records outlive the run by a minute, then expire: nothing piles up.
    let run_for = match args.requests {
        Some(_) => Duration::from_secs(600),
        None => Duration::from_secs_f64(args.duration.clamp(0.0, 86_400.0)),
    };
    let retention = run_for + Duration::from_secs(60);
    if !in_process {
        let setup = Backend::connect(args.backend, Mode::Lib, 1, &names, true, retention).await?;
        if replay {
            setup.prepare_replay(REPLAY_KEYS).await?;
        }
        setup.quiesce().await;
    }
    let backend = Arc::new(
        Backend::connect(
            args.backend,
            args.mode(),
            concurrency,
            &names,
            in_process,
            retention,
        )
        .await?,
    );
    if in_process && replay {
        backend.prepare_replay(REPLAY_KEYS).await?;
    }
    let plan = Arc::new(Plan::new(args.workload));
    let before = backend.round_trips().await?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(args.duration.max(0.0));
    let quota = args
        .requests
        .map(|total| total.div_ceil(concurrency as u64));
    let callers: Vec<_> = (0..concurrency)
        .map(|c| {
            tokio::spawn(caller(
                Arc::clone(&backend),
                Arc::clone(&plan),
                c,
                deadline,
                quota,
            ))
        })
        .collect();
    let mut latencies = Vec::new();
    let (mut mix, mut errors, mut first_error) = (Mix::default(), 0, None);
    for handle in callers {
        let report = handle.await?;
        latencies.extend(report.latencies_us);
        mix.merge(report.mix);
        errors += report.errors;
        first_error = first_error.or(report.first_error);
    }
    let elapsed = started.elapsed().as_secs_f64();
    backend.quiesce().await;
    let after = backend.round_trips().await?;
    if let Some(error) = first_error {
        eprintln!("idem-bench: {errors} operations failed; the first: {error}");
    }
    latencies.sort_unstable();
    let trips = after
        .saturating_sub(before)
        .saturating_sub(backend.counter_overhead());
    let ops = mix.total();
    let per_op = |n: u64| if ops == 0 { 0.0 } else { n as f64 / ops as f64 };
    let result = RunResult {
        backend: args.backend.name().to_string(),
        workload: args.workload.name().to_string(),
        mode: args.mode().name().to_string(),
        concurrency,
        ops,
        ops_per_s: ops as f64 / elapsed.max(f64::EPSILON),
        p50_us: percentile(&latencies, 0.50),
        p99_us: percentile(&latencies, 0.99),
        p999_us: percentile(&latencies, 0.999),
        round_trips_per_op: per_op(trips),
        // Every operation claims; an executed one completes too.
        store_calls_per_op: per_op(ops + mix.executed),
        errors,
        executed: mix.executed,
        replayed: mix.replayed,
        in_progress: mix.in_progress,
        mismatch: mix.mismatch,
    };
    if let Err(error) = backend.clean_up().await {
        eprintln!("idem-bench: clean-up failed: {error}");
    }
    Ok(result)
}

/// The human-readable result: a header line and the run's line, the
/// outcome mix in operations (409 in progress, 422 mismatch).
fn table(r: &RunResult) -> String {
    format!(
        "{:<14} {:<10} {:<4} {:>5} {:>10} {:>12} {:>8} {:>8} {:>9} {:>8} {:>8} {:>6} {:>8} {:>8} {:>6} {:>6}\n\
         {:<14} {:<10} {:<4} {:>5} {:>10} {:>12.0} {:>8} {:>8} {:>9} {:>8.2} {:>8.2} {:>6} {:>8} {:>8} {:>6} {:>6}",
        "backend",
        "workload",
        "mode",
        "conc",
        "ops",
        "ops/s",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "rt/op",
        "calls/op",
        "errors",
        "executed",
        "replayed",
        "409",
        "422",
        r.backend,
        r.workload,
        r.mode,
        r.concurrency,
        r.ops,
        r.ops_per_s,
        r.p50_us,
        r.p99_us,
        r.p999_us,
        r.round_trips_per_op,
        r.store_calls_per_op,
        r.errors,
        r.executed,
        r.replayed,
        r.in_progress,
        r.mismatch,
    )
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let Some(ran) = idem_bench::on_runtime("idem-bench", run(&args)) else {
        return std::process::ExitCode::FAILURE;
    };
    match ran {
        Ok(result) => {
            if args.json {
                match serde_json::to_string(&result) {
                    Ok(line) => println!("{line}"),
                    Err(error) => {
                        eprintln!("idem-bench: {error}");
                        return std::process::ExitCode::FAILURE;
                    }
                }
            } else {
                println!("{}", table(&result));
            }
            if result.errors > 0 || result.ops == 0 {
                return std::process::ExitCode::FAILURE;
            }
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("idem-bench: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_shows_errors_and_the_outcome_mix_under_their_headers() {
        let result = RunResult {
            backend: "redis".into(),
            workload: "mixed".into(),
            mode: "raw".into(),
            concurrency: 4,
            ops: 200,
            ops_per_s: 7000.0,
            p50_us: 500,
            p99_us: 900,
            p999_us: 1300,
            round_trips_per_op: 1.67,
            store_calls_per_op: 1.67,
            errors: 3,
            executed: 134,
            replayed: 55,
            in_progress: 1,
            mismatch: 10,
        };
        let text = table(&result);
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        let [header, row] = lines.as_slice() else {
            panic!("two lines: {text}")
        };
        let column = |name: &str| {
            // "p50 µs" and the like are two words: count from the end.
            let from_end = header.len() - header.iter().position(|h| *h == name).unwrap();
            row[row.len() - from_end]
        };
        assert_eq!(column("errors"), "3");
        assert_eq!(column("executed"), "134");
        assert_eq!(column("replayed"), "55");
        assert_eq!(column("409"), "1");
        assert_eq!(column("422"), "10");
    }
}
