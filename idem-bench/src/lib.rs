//! # idem-bench
//!
//! Every idem backend measured against its raw server, side by side. The
//! `idem-bench` binary runs one configuration (`--backend`, `--workload`,
//! `--concurrency`, `--duration` or `--requests`, `--raw`, `--json`);
//! `scripts/bench` runs the whole matrix and `idem-bench-report` turns its
//! JSON lines into a markdown table and a PNG chart.

use serde::{Deserialize, Serialize};

/// One run's result: one JSON line with `--json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// memory, postgres, redis, redis-cluster or dynamo.
    pub backend: String,
    /// fresh, replay, contended or mixed.
    pub workload: String,
    /// lib (through idem) or raw (the same server operations, driver only).
    pub mode: String,
    /// Concurrent callers.
    pub concurrency: usize,
    /// Operations completed (one request through idem each).
    pub ops: u64,
    /// Operations per second.
    pub ops_per_s: f64,
    /// Median latency of one operation, microseconds.
    pub p50_us: u64,
    /// 99th percentile, microseconds.
    pub p99_us: u64,
    /// 99.9th percentile, microseconds.
    pub p999_us: u64,
    /// Server round trips per operation, counted at the server (0 in process).
    pub round_trips_per_op: f64,
    /// Store calls (claims plus completions) per operation: a fresh
    /// operation is a claim and a completion, a replay one claim.
    pub store_calls_per_op: f64,
    /// Operations that failed with an unexpected error.
    pub errors: u64,
}

/// The value at quantile `q` of sorted latencies (0 if empty).
pub fn percentile(sorted: &[u32], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    u64::from(sorted[rank.min(sorted.len() - 1)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_pick_the_ranked_value() {
        let data: Vec<u32> = (1..=1000).collect();
        assert_eq!(percentile(&data, 0.5), 501);
        assert_eq!(percentile(&data, 0.99), 990);
        assert_eq!(percentile(&data, 0.999), 999);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    #[test]
    fn results_round_trip_as_json_lines() {
        let result = RunResult {
            backend: "redis".into(),
            workload: "fresh".into(),
            mode: "lib".into(),
            concurrency: 8,
            ops: 10,
            ops_per_s: 5.0,
            p50_us: 1,
            p99_us: 2,
            p999_us: 3,
            round_trips_per_op: 2.0,
            store_calls_per_op: 2.0,
            errors: 0,
        };
        let line = serde_json::to_string(&result).unwrap();
        assert!(!line.contains('\n'));
        assert_eq!(serde_json::from_str::<RunResult>(&line).unwrap(), result);
    }
}
