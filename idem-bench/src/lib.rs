//! # idem-bench
//!
//! Every idem backend measured against its raw server, side by side. The
//! `idem-bench` binary runs one configuration (`--backend`, `--workload`,
//! `--concurrency`, `--duration` or `--requests`, `--raw` or `--cache`, `--json`);
//! `scripts/bench` runs the whole matrix and `idem-bench-report` turns its
//! JSON lines into a markdown table and a PNG chart. `idem-bench-outbox`
//! measures the transactional outbox's relay (Postgres to RabbitMQ and to
//! NATS JetStream) against the raw broker clients: throughput, Postgres
//! round trips per batch, and commit-to-broker latency.
//!
//! Every run reports what its operations got (the [`Mix`] of [`Outcome`]s:
//! executed, replayed, in progress, mismatch) and how many failed, so a
//! throughput is never read without knowing what was measured.

use serde::{Deserialize, Serialize};

pub mod callgrind;
pub mod cpu;

/// The configuration of a client of the DynamoDB-compatible server at
/// `endpoint` (moto in the runs here: dummy credentials, one region), for
/// a binary to add to and build.
pub fn dynamo_config(endpoint: &str) -> idem_dynamo::aws_sdk_dynamodb::config::Builder {
    use idem_dynamo::aws_sdk_dynamodb::config::{Credentials, Region};
    idem_dynamo::aws_sdk_dynamodb::Config::builder()
        .behavior_version_latest()
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("bench", "bench", None, None, "idem-bench"))
}

/// One run's result: one JSON line with `--json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// memory, postgres, redis, redis-cluster or dynamo.
    pub backend: String,
    /// fresh, replay, contended or mixed.
    pub workload: String,
    /// lib (through idem), cache (through idem with the replay cache in
    /// front of the store) or raw (the same server operations, driver only).
    pub mode: String,
    /// Concurrent callers.
    pub concurrency: usize,
    /// Operations answered, one request through idem each: executed,
    /// replayed, in progress and mismatch add up to it.
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
    /// Operations that failed with an unexpected error (not counted in `ops`).
    pub errors: u64,
    /// Operations that ran the handler and stored its response.
    #[serde(default)]
    pub executed: u64,
    /// Operations answered with a stored response.
    #[serde(default)]
    pub replayed: u64,
    /// Operations refused because another caller held the key (HTTP 409).
    #[serde(default)]
    pub in_progress: u64,
    /// Operations refused because the key was used for another payload (HTTP 422).
    #[serde(default)]
    pub mismatch: u64,
}

impl RunResult {
    /// The outcome mix of the run's operations (all zero in results written
    /// before the mix was recorded).
    pub fn mix(&self) -> Mix {
        Mix {
            executed: self.executed,
            replayed: self.replayed,
            in_progress: self.in_progress,
            mismatch: self.mismatch,
        }
    }
}

/// What one operation got, through idem or from the raw server's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Claimed and completed: the handler ran.
    Executed,
    /// A completed record with the same fingerprint: its response came back.
    Replayed,
    /// Another caller holds the key (HTTP 409).
    InProgress,
    /// The key holds another fingerprint (HTTP 422).
    Mismatch,
}

/// How many operations got each [`Outcome`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mix {
    /// [`Outcome::Executed`].
    pub executed: u64,
    /// [`Outcome::Replayed`].
    pub replayed: u64,
    /// [`Outcome::InProgress`].
    pub in_progress: u64,
    /// [`Outcome::Mismatch`].
    pub mismatch: u64,
}

impl Mix {
    /// Counts one operation.
    pub fn add(&mut self, outcome: Outcome) {
        let count = match outcome {
            Outcome::Executed => &mut self.executed,
            Outcome::Replayed => &mut self.replayed,
            Outcome::InProgress => &mut self.in_progress,
            Outcome::Mismatch => &mut self.mismatch,
        };
        *count += 1;
    }

    /// Adds another caller's counts.
    pub fn merge(&mut self, other: Mix) {
        self.executed += other.executed;
        self.replayed += other.replayed;
        self.in_progress += other.in_progress;
        self.mismatch += other.mismatch;
    }

    /// Operations counted.
    pub fn total(&self) -> u64 {
        self.executed + self.replayed + self.in_progress + self.mismatch
    }

    /// Each outcome's share in percent, in the order executed, replayed,
    /// in progress, mismatch; `None` when nothing was counted.
    pub fn percentages(&self) -> Option<[f64; 4]> {
        let total = self.total();
        (total > 0).then(|| {
            [
                self.executed,
                self.replayed,
                self.in_progress,
                self.mismatch,
            ]
            .map(|n| n as f64 * 100.0 / total as f64)
        })
    }
}

/// A JSON order of about `bytes` bytes, with an array of lines: the body
/// the fingerprint benchmarks canonicalise.
pub fn json_of(bytes: usize) -> String {
    let mut out = String::from("{\"customer\":\"c-42\",\"currency\":\"EUR\",\"lines\":[");
    let mut i = 0;
    while out.len() < bytes {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!(
            "{{\"sku\":\"SKU-{i:05}\",\"qty\":{},\"price\":{}.{:02},\"note\":\"gift wrap ü\"}}",
            i % 7 + 1,
            i % 90 + 10,
            i % 100
        ));
        i += 1;
    }
    out.push_str("]}");
    out
}

/// The handler every HTTP benchmark serves: a small JSON order.
pub async fn create_order(body: String) -> (axum::http::StatusCode, String) {
    (
        axum::http::StatusCode::CREATED,
        format!(
            r#"{{"order":"A-1","status":"placed","bytes":{}}}"#,
            body.len()
        ),
    )
}

/// The value at quantile `q` of sorted latencies (0 if empty).
pub fn percentile(sorted: &[u32], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    u64::from(sorted[rank.min(sorted.len() - 1)])
}

/// Runs `work` on a multi-threaded tokio runtime, as every benchmark binary
/// does; `None` (said on stderr, with `name`) when the runtime cannot start.
pub fn on_runtime<F: std::future::Future>(name: &str, work: F) -> Option<F::Output> {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => Some(runtime.block_on(work)),
        Err(error) => {
            eprintln!("{name}: cannot start tokio: {error}");
            None
        }
    }
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
            store_calls_per_op: 1.6,
            errors: 1,
            executed: 6,
            replayed: 2,
            in_progress: 1,
            mismatch: 1,
        };
        let line = serde_json::to_string(&result).unwrap();
        assert!(!line.contains('\n'));
        assert!(line.contains(r#""in_progress":1"#), "{line}");
        assert_eq!(serde_json::from_str::<RunResult>(&line).unwrap(), result);
    }

    #[test]
    fn results_written_before_the_mix_read_as_an_empty_mix() {
        let line = r#"{"backend":"redis","workload":"fresh","mode":"lib","concurrency":8,"ops":10,"ops_per_s":5.0,"p50_us":1,"p99_us":2,"p999_us":3,"round_trips_per_op":2.0,"store_calls_per_op":2.0,"errors":0}"#;
        let result: RunResult = serde_json::from_str(line).unwrap();
        assert_eq!(result.mix(), Mix::default());
        assert_eq!(result.mix().percentages(), None);
    }

    #[test]
    fn the_mix_counts_each_outcome_and_its_share() {
        let mut mix = Mix::default();
        for outcome in [
            Outcome::Executed,
            Outcome::Executed,
            Outcome::Replayed,
            Outcome::Mismatch,
        ] {
            mix.add(outcome);
        }
        let mut other = Mix::default();
        other.add(Outcome::InProgress);
        mix.merge(other);
        assert_eq!(
            mix,
            Mix {
                executed: 2,
                replayed: 1,
                in_progress: 1,
                mismatch: 1
            }
        );
        assert_eq!(mix.total(), 5);
        assert_eq!(mix.percentages(), Some([40.0, 20.0, 20.0, 20.0]));
    }
}
