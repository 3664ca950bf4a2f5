//! What idem reports while it runs: `tracing` spans, and metrics through the
//! [`metrics`](https://docs.rs/metrics) facade (cargo feature `metrics`).
//!
//! **The key is never reported.** Idempotency keys are often personal data
//! (or secrets some clients put in them), so spans carry only
//! [`IdempotencyKey::redacted`](crate::IdempotencyKey::redacted), a short
//! SHA-256 of the key, as `key_hash`, and metrics carry no key at all. The
//! tenant is reported as it is.
//!
//! # Spans
//!
//! | span | level | fields |
//! |---|---|---|
//! | `idem.run` ([`RUN_SPAN`]): one [`Idempotency::run`](crate::Idempotency::run) or [`run_in`](crate::Idempotency::run_in) | INFO | `store`, `tenant`, `key_hash`, `transactional`, `attempt` (once claimed), `outcome` |
//! | `idem.store` ([`STORE_SPAN`]): each store operation, whoever calls it (inside the run when the runner does) | DEBUG | `operation`, `store`, `tenant` and `key_hash` (for an operation on one scope), `attempt`, `outcome`, `error` (on failure) |
//!
//! A run's `outcome` is `executed`, `replayed`, `in_progress`, `mismatch`,
//! `lost_lease`, `not_started`, `failed` (the handler failed after its work
//! may have started) or `error` (the store failed). A claim's is `claimed`
//! (attempt 1), `takeover` (a later attempt), `replayed`, `in_progress`,
//! `mismatch` or `error`; every other operation's `ok`, `lost_lease` or
//! `error`. `operation` is [`Operation::as_str`](crate::Operation::as_str):
//! `claim`, `complete`, `renew`, `release`, `checkpoint`, `get`, `delete`,
//! `now`, `purge`, or `transaction` (opening and committing a transaction).
//! Every store of the idem crates reports them through its
//! [`OperationLayer`](crate::store::OperationLayer); a store of your own gets
//! them by wrapping itself in [`Layered`](crate::store::Layered). `store` is
//! [`Capabilities::store`](crate::store::Capabilities::store): `memory`,
//! `postgres`, `redis`, `dynamodb`.
//!
//! # Metrics
//!
//! With the `metrics` feature, the stores' layers, the runner and the replay
//! cache of `idem-cache` record these through whatever recorder the service
//! installed (a Prometheus exporter, say); [`describe_metrics`] registers
//! their descriptions and units. Durations are histograms in seconds.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `idem_claims_total` ([`CLAIMS`]) | counter | `outcome`, `store` | claims made, by outcome as on the claim's span (a takeover is `outcome="takeover"`) |
//! | `idem_lost_leases_total` ([`LOST_LEASES`]) | counter | `operation`, `store` | fenced operations answered `LostLease`: another owner took the key over |
//! | `idem_releases_total` ([`RELEASES`]) | counter | `store` | claims released (by the runner: nothing started, or a transaction rolled back) |
//! | `idem_store_operation_duration_seconds` ([`STORE_OPERATION_DURATION`]) | histogram | `operation`, `store` | each store operation, whatever its answer |
//! | `idem_handler_duration_seconds` ([`HANDLER_DURATION`]) | histogram | `store` | each handler the runner ran, to its response or error |
//! | `idem_cache_hits_total` ([`CACHE_HITS`]) | counter | `store` | claims a replay cache answered with no round trip |
//! | `idem_cache_misses_total` ([`CACHE_MISSES`]) | counter | `store` | claims a replay cache sent on to its store |
//!
//! ```
//! // A service installs its recorder (here none), then describes idem's metrics once.
//! idem_core::observability::describe_metrics();
//! assert_eq!(idem_core::observability::CLAIMS, "idem_claims_total");
//! ```

use crate::plumbing::error::{Operation, StoreError};
use crate::plumbing::scope::{IdempotencyKey, Scope};
use std::fmt;
use std::future::Future;
#[cfg(feature = "metrics")]
use std::time::Instant;
use tracing::field::Empty;
use tracing::{Instrument, Span};

/// The span of one run.
pub const RUN_SPAN: &str = "idem.run";
/// The span of one store operation.
pub const STORE_SPAN: &str = "idem.store";

/// Counter: claims, by `outcome` and `store`.
pub const CLAIMS: &str = "idem_claims_total";
/// Counter: `LostLease` answers, by `operation` and `store`.
pub const LOST_LEASES: &str = "idem_lost_leases_total";
/// Counter: claims released, by `store`.
pub const RELEASES: &str = "idem_releases_total";
/// Histogram, seconds: store operations, by `operation` and `store`.
pub const STORE_OPERATION_DURATION: &str = "idem_store_operation_duration_seconds";
/// Histogram, seconds: handlers, by `store`.
pub const HANDLER_DURATION: &str = "idem_handler_duration_seconds";
/// Counter: claims a replay cache answered itself, by `store`.
pub const CACHE_HITS: &str = "idem_cache_hits_total";
/// Counter: claims a replay cache sent on to its store, by `store`.
pub const CACHE_MISSES: &str = "idem_cache_misses_total";

/// Registers the description and unit of every metric idem records with
/// the installed recorder; call it once after installing yours. Without the
/// `metrics` feature it does nothing.
pub fn describe_metrics() {
    #[cfg(feature = "metrics")]
    describe();
}

#[cfg(feature = "metrics")]
fn describe() {
    use metrics::{Unit, describe_counter, describe_histogram};
    describe_counter!(
        CLAIMS,
        Unit::Count,
        "Claims made on an idempotency store, by outcome"
    );
    describe_counter!(
        LOST_LEASES,
        Unit::Count,
        "Fenced operations answered LostLease: another owner took the key over"
    );
    describe_counter!(
        RELEASES,
        Unit::Count,
        "Claims released because nothing started"
    );
    describe_histogram!(
        STORE_OPERATION_DURATION,
        Unit::Seconds,
        "Duration of each idempotency store operation"
    );
    describe_histogram!(
        HANDLER_DURATION,
        Unit::Seconds,
        "Duration of each handler the idempotency runner ran"
    );
    describe_counter!(
        CACHE_HITS,
        Unit::Count,
        "Claims a replay cache answered itself"
    );
    describe_counter!(
        CACHE_MISSES,
        Unit::Count,
        "Claims a replay cache sent on to its store"
    );
}

/// Counts one lookup of a replay cache in front of `store`: a hit answered
/// with no round trip, or a miss sent on. For cache stores such as
/// `idem-cache`; without the `metrics` feature it does nothing.
///
/// ```
/// idem_core::observability::record_cache_lookup("redis", true);
/// ```
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub fn record_cache_lookup(store: &'static str, hit: bool) {
    #[cfg(feature = "metrics")]
    metrics::counter!(if hit { CACHE_HITS } else { CACHE_MISSES }, "store" => store).increment(1);
}

/// The key's hash, computed only when a subscriber records it: spans are
/// built (and their fields evaluated) even when nobody listens, wherever
/// `tracing` forwards to `log`.
struct KeyHash<'a>(&'a IdempotencyKey);

impl fmt::Display for KeyHash<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.redacted())
    }
}

/// The span of a run over `store` on `scope`.
pub(crate) fn run_span(store: &'static str, scope: &Scope, transactional: bool) -> Span {
    tracing::info_span!(
        RUN_SPAN,
        store,
        tenant = %scope.tenant(),
        key_hash = %KeyHash(scope.key()),
        transactional,
        attempt = Empty,
        outcome = Empty,
    )
}

/// One store operation: its span, its duration and its counters. `attempt`
/// is the lease's, for operations under one; `answer` reads the span's
/// outcome (and the attempt, for a claim) from a success.
pub(crate) async fn store_call<T>(
    operation: Operation,
    store: &'static str,
    scope: Option<&Scope>,
    attempt: Option<u32>,
    answer: impl FnOnce(&T) -> (&'static str, Option<u32>),
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let span = tracing::debug_span!(
        STORE_SPAN,
        operation = operation.as_str(),
        store,
        tenant = scope.map(|s| tracing::field::display(s.tenant())),
        key_hash = scope.map(|s| tracing::field::display(KeyHash(s.key()))),
        attempt,
        outcome = Empty,
        error = Empty,
    );
    #[cfg(feature = "metrics")]
    let started = Instant::now();
    let result = call.instrument(span.clone()).await;
    let outcome = match &result {
        Ok(value) => {
            let (outcome, attempt) = answer(value);
            if let Some(attempt) = attempt {
                span.record("attempt", attempt);
            }
            outcome
        }
        Err(StoreError::LostLease) => "lost_lease",
        Err(error) => {
            span.record("error", tracing::field::display(error));
            "error"
        }
    };
    span.record("outcome", outcome);
    #[cfg(feature = "metrics")]
    {
        let operation = operation.as_str();
        metrics::histogram!(STORE_OPERATION_DURATION, "operation" => operation, "store" => store)
            .record(started.elapsed().as_secs_f64());
        match (operation, outcome) {
            ("claim", _) => {
                metrics::counter!(CLAIMS, "outcome" => outcome, "store" => store).increment(1);
            }
            ("release", "ok") => metrics::counter!(RELEASES, "store" => store).increment(1),
            (_, "lost_lease") => {
                metrics::counter!(LOST_LEASES, "operation" => operation, "store" => store)
                    .increment(1);
            }
            _ => {}
        }
    }
    result
}

/// Runs a handler's work, measuring it.
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) async fn handler<T>(store: &'static str, work: impl Future<Output = T>) -> T {
    #[cfg(feature = "metrics")]
    let started = Instant::now();
    let result = work.await;
    #[cfg(feature = "metrics")]
    metrics::histogram!(HANDLER_DURATION, "store" => store).record(started.elapsed().as_secs_f64());
    result
}
