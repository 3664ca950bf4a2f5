//! What an operation runs against: idem (runner and store) or the same
//! server operations through the driver alone, and the server's own count of
//! round trips.
//!
//! One module per backend, each with the same parts: `connect` (the store,
//! the [`RawBaseline`] and the [`ServerCounter`]), the raw baseline's
//! execution of one operation, the counter's reading and the clean-up. This
//! module holds what they share and dispatches to them.

mod dynamo;
mod memory;
mod postgres;
mod redis;

use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum;
use idem_bench::Outcome;
use idem_cache::CachedStore;
use idem_core::store::{Clock, IdempotencyStore, SystemClock, Timestamp};
use idem_core::{Fingerprint, Idempotency, RunError, RunOutcome, Scope, StoredResponse};

use crate::plan::Op;

/// The backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BackendKind {
    Memory,
    Postgres,
    Redis,
    RedisCluster,
    Dynamo,
}

impl BackendKind {
    /// The name results carry.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Postgres => "postgres",
            Self::Redis => "redis",
            Self::RedisCluster => "redis-cluster",
            Self::Dynamo => "dynamo",
        }
    }
}

/// What a run's operations go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// idem: the runner over the store.
    Lib,
    /// idem with the replay cache (`idem-cache`) in front of the store.
    Cached,
    /// The store's server operations through the driver alone.
    Raw,
}

impl Mode {
    /// The name results carry.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Lib => "lib",
            Self::Cached => "cache",
            Self::Raw => "raw",
        }
    }
}

/// Any failure of a run.
pub(crate) type BenchError = Box<dyn std::error::Error + Send + Sync>;

/// The lease of every claim, through idem and raw: long enough that no
/// operation of a run outlives it, so no run measures a takeover.
const LEASE: Duration = Duration::from_secs(30);

/// The value of an environment variable that `scripts/bench` sets.
fn env(name: &str) -> Result<String, BenchError> {
    std::env::var(name).map_err(|_| format!("{name} is not set (scripts/bench sets it)").into())
}

/// The time a raw baseline judges by, read as the stores without a clock of
/// their own read it.
fn now() -> Timestamp {
    SystemClock.now()
}

/// The response every operation stores: a small JSON body and one header.
fn response() -> StoredResponse {
    StoredResponse::new(
        201,
        br#"{"order":"A-1","status":"placed","total":42}"#.to_vec(),
    )
    .with_header("content-type", "application/json")
}

/// The outcome a claim reply names: the word the Postgres claim function
/// returns in `o_outcome` and the Redis claim script first in its reply.
/// `claimed` is [`Outcome::Executed`] once the caller completes it.
fn claim_reply(word: &[u8]) -> Result<Outcome, BenchError> {
    match word {
        b"claimed" => Ok(Outcome::Executed),
        b"completed" => Ok(Outcome::Replayed),
        b"in_progress" => Ok(Outcome::InProgress),
        b"mismatch" => Ok(Outcome::Mismatch),
        other => Err(format!("unknown claim reply {:?}", String::from_utf8_lossy(other)).into()),
    }
}

/// The outcome of a won claim once its completion, fenced on the claim's
/// owner, has run: [`Outcome::Executed`] if the completion `landed`, else an
/// error of the run (the lease was lost).
fn completion(landed: bool) -> Result<Outcome, BenchError> {
    if landed {
        Ok(Outcome::Executed)
    } else {
        Err("the lease was lost before completion".into())
    }
}

/// What idem answered, as an outcome; a failure other than the two
/// refusals (409, 422) is an error of the run.
fn lib_outcome(run: Result<RunOutcome, RunError>) -> Result<Outcome, BenchError> {
    match run {
        Ok(RunOutcome::Executed(_)) => Ok(Outcome::Executed),
        Ok(RunOutcome::Replayed(_)) => Ok(Outcome::Replayed),
        Err(RunError::InProgress { .. }) => Ok(Outcome::InProgress),
        Err(RunError::Mismatch) => Ok(Outcome::Mismatch),
        Err(other) => Err(other.into()),
    }
}

/// The names one run writes under: a tenant of its own, and for DynamoDB a table.
pub(crate) struct Names {
    tenant: String,
    table: String,
}

impl Names {
    /// Names no other run uses.
    pub(crate) fn fresh() -> Self {
        let id = uuid::Uuid::new_v4().simple();
        Self {
            tenant: format!("bench-{id}"),
            table: format!("bench-{id}"),
        }
    }
}

/// What a backend module needs to connect.
struct Settings<'a> {
    /// Concurrent callers, which size connection pools.
    concurrency: usize,
    /// The DynamoDB table of the run.
    table: &'a str,
    /// Whether to create what the store needs (migration, table).
    setup: bool,
    /// How long records are kept.
    retention: Duration,
}

/// What a backend module's `connect` hands back.
struct Parts<R, C> {
    store: Arc<dyn IdempotencyStore>,
    raw: R,
    counter: C,
}

impl<R, C> Parts<R, C> {
    /// The same parts, the backend's own types wrapped for dispatch.
    fn wrap(
        self,
        raw: impl FnOnce(R) -> Raw,
        counter: impl FnOnce(C) -> Counter,
    ) -> Parts<Raw, Counter> {
        Parts {
            store: self.store,
            raw: raw(self.raw),
            counter: counter(self.counter),
        }
    }
}

/// One operation as a raw baseline sends it.
struct Call<'a> {
    /// The run's tenant.
    tenant: &'a str,
    /// The operation: its key and fingerprint.
    op: &'a Op,
    /// How long a completed record is kept.
    retention: Duration,
    /// What a won claim is completed with: [`response`], as through idem.
    response: StoredResponse,
}

/// A backend's raw baseline: the requests its store sends, through the
/// driver alone.
trait RawBaseline {
    /// Claims the call's operation in its tenant and completes the claim
    /// if it was won, as the store would; the outcome comes from the
    /// server's reply.
    async fn execute(&self, call: &Call<'_>) -> Result<Outcome, BenchError>;
}

/// A backend's count of round trips, kept by its server, and what a run
/// leaves behind there.
trait ServerCounter {
    /// Round trips the server has seen so far.
    async fn round_trips(&self) -> Result<u64, BenchError>;

    /// Round trips that reading the counter itself added between two readings.
    fn overhead(&self) -> u64 {
        0
    }

    /// Ends the run's connections, so the server's statistics are complete.
    async fn quiesce(&self) {}

    /// Removes what `tenant`'s run wrote, where it would otherwise pile up.
    async fn clean_up(&self, _tenant: &str) -> Result<(), BenchError> {
        Ok(())
    }
}

/// The raw baselines, dispatched by backend.
enum Raw {
    Memory(memory::Raw),
    Postgres(postgres::Raw),
    Redis(redis::Raw),
    Dynamo(dynamo::Raw),
}

impl Raw {
    async fn execute(&self, call: &Call<'_>) -> Result<Outcome, BenchError> {
        match self {
            Self::Memory(raw) => raw.execute(call).await,
            Self::Postgres(raw) => raw.execute(call).await,
            Self::Redis(raw) => raw.execute(call).await,
            Self::Dynamo(raw) => raw.execute(call).await,
        }
    }
}

/// The round-trip counters, dispatched by backend.
enum Counter {
    Memory(memory::Counter),
    Postgres(postgres::Counter),
    Redis(redis::Counter),
    Dynamo(dynamo::Counter),
}

impl Counter {
    async fn round_trips(&self) -> Result<u64, BenchError> {
        match self {
            Self::Memory(c) => c.round_trips().await,
            Self::Postgres(c) => c.round_trips().await,
            Self::Redis(c) => c.round_trips().await,
            Self::Dynamo(c) => c.round_trips().await,
        }
    }

    fn overhead(&self) -> u64 {
        match self {
            Self::Memory(c) => c.overhead(),
            Self::Postgres(c) => c.overhead(),
            Self::Redis(c) => c.overhead(),
            Self::Dynamo(c) => c.overhead(),
        }
    }

    async fn quiesce(&self) {
        match self {
            Self::Memory(c) => c.quiesce().await,
            Self::Postgres(c) => c.quiesce().await,
            Self::Redis(c) => c.quiesce().await,
            Self::Dynamo(c) => c.quiesce().await,
        }
    }

    async fn clean_up(&self, tenant: &str) -> Result<(), BenchError> {
        match self {
            Self::Memory(c) => c.clean_up(tenant).await,
            Self::Postgres(c) => c.clean_up(tenant).await,
            Self::Redis(c) => c.clean_up(tenant).await,
            Self::Dynamo(c) => c.clean_up(tenant).await,
        }
    }
}

/// What an operation runs against.
enum Target {
    /// Through idem: the runner over the store.
    Lib(Idempotency<dyn IdempotencyStore>),
    /// The store's server operations, through the driver alone.
    Raw(Raw),
}

/// Everything one run needs, and what it counts round trips with.
pub(crate) struct Backend {
    retention: Duration,
    tenant: String,
    target: Target,
    counter: Counter,
}

impl Backend {
    /// Connects, through idem (with or without the replay cache) or the
    /// driver alone; with `setup`, also creates what the store needs
    /// (migration, DynamoDB table).
    pub(crate) async fn connect(
        kind: BackendKind,
        mode: Mode,
        concurrency: usize,
        names: &Names,
        setup: bool,
        retention: Duration,
    ) -> Result<Self, BenchError> {
        let settings = Settings {
            concurrency,
            table: &names.table,
            setup,
            retention,
        };
        let parts = match kind {
            BackendKind::Memory => memory::connect(&settings)
                .await?
                .wrap(Raw::Memory, Counter::Memory),
            BackendKind::Postgres => postgres::connect(&settings)
                .await?
                .wrap(Raw::Postgres, Counter::Postgres),
            BackendKind::Redis => redis::connect(&settings)
                .await?
                .wrap(Raw::Redis, Counter::Redis),
            BackendKind::RedisCluster => redis::connect_cluster(&settings)
                .await?
                .wrap(Raw::Redis, Counter::Redis),
            BackendKind::Dynamo => dynamo::connect(&settings)
                .await?
                .wrap(Raw::Dynamo, Counter::Dynamo),
        };
        let store = match mode {
            Mode::Raw => None,
            Mode::Lib => Some(parts.store),
            Mode::Cached => {
                Some(Arc::new(CachedStore::new(parts.store)) as Arc<dyn IdempotencyStore>)
            }
        };
        let target = match store {
            None => Target::Raw(parts.raw),
            Some(store) => Target::Lib(
                Idempotency::new(store)
                    .with_lease(LEASE)?
                    .with_retention(retention)?,
            ),
        };
        Ok(Self {
            retention,
            tenant: names.tenant.clone(),
            target,
            counter: parts.counter,
        })
    }

    /// Round trips the server has seen so far, by its own count.
    pub(crate) async fn round_trips(&self) -> Result<u64, BenchError> {
        self.counter.round_trips().await
    }

    /// Ends the run's connections, so the server's statistics are complete.
    pub(crate) async fn quiesce(&self) {
        self.counter.quiesce().await;
    }

    /// Round trips that reading the counter itself added between two readings.
    pub(crate) fn counter_overhead(&self) -> u64 {
        self.counter.overhead()
    }

    /// Removes what the run wrote, where it would otherwise pile up.
    pub(crate) async fn clean_up(&self) -> Result<(), BenchError> {
        self.counter.clean_up(&self.tenant).await
    }

    /// Runs one operation and says what it got.
    pub(crate) async fn execute(&self, op: &Op) -> Result<Outcome, BenchError> {
        match &self.target {
            Target::Lib(idem) => {
                let scope = Scope::parse(&self.tenant, &op.key)?;
                let fingerprint = Fingerprint::from_digest(op.fingerprint);
                lib_outcome(
                    idem.run(scope, fingerprint, |_ctx| async { Ok(response()) })
                        .await,
                )
            }
            Target::Raw(raw) => {
                let call = Call {
                    tenant: &self.tenant,
                    op,
                    retention: self.retention,
                    response: response(),
                };
                raw.execute(&call).await
            }
        }
    }

    /// Completes `count` replay keys before a replay run, through the
    /// backend's own target: the raw memory baseline keeps its records apart
    /// from the store, so keys completed through the store would be fresh to it.
    pub(crate) async fn prepare_replay(&self, count: u64) -> Result<(), BenchError> {
        for k in 0..count {
            let op = Op::replay(k);
            match self.execute(&op).await? {
                Outcome::Executed | Outcome::Replayed => {}
                refused => {
                    return Err(format!("preparing {} was refused: {refused:?}", op.key).into());
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_replies_name_their_outcome_and_unknown_words_are_errors() {
        assert_eq!(claim_reply(b"claimed").unwrap(), Outcome::Executed);
        assert_eq!(claim_reply(b"completed").unwrap(), Outcome::Replayed);
        assert_eq!(claim_reply(b"in_progress").unwrap(), Outcome::InProgress);
        assert_eq!(claim_reply(b"mismatch").unwrap(), Outcome::Mismatch);
        assert!(claim_reply(b"taken").is_err());
    }

    #[test]
    fn a_completion_that_landed_executed_and_one_that_did_not_is_an_error() {
        assert_eq!(completion(true).unwrap(), Outcome::Executed);
        assert!(completion(false).is_err());
    }

    #[test]
    fn idem_answers_count_as_outcomes_and_other_failures_as_errors() {
        let executed = lib_outcome(Ok(RunOutcome::Executed(response())));
        assert_eq!(executed.unwrap(), Outcome::Executed);
        let replayed = lib_outcome(Ok(RunOutcome::Replayed(response())));
        assert_eq!(replayed.unwrap(), Outcome::Replayed);
        let held = lib_outcome(Err(RunError::InProgress {
            retry_after: Duration::from_millis(5),
        }));
        assert_eq!(held.unwrap(), Outcome::InProgress);
        assert_eq!(
            lib_outcome(Err(RunError::Mismatch)).unwrap(),
            Outcome::Mismatch
        );
        assert!(lib_outcome(Err(RunError::LostLease)).is_err());
    }
}
