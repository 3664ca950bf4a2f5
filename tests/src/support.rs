//! Helpers shared by the cases: random tenants, requests, polling to a deadline.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{
    ClaimOutcome, ClaimRequest, Clock, IdempotencyStore, Lease, Record, SystemClock, Timestamp,
};
use idem_core::{
    Checkpoint, ConsumerName, Fingerprint, Idempotency, IdempotencyKey, RunError, RunOutcome,
    Scope, StoreError, StoredResponse, Tenant,
};

/// A lease short enough that cases can wait it out.
pub const SHORT_LEASE: Duration = Duration::from_millis(250);
/// A lease no case outlives.
pub const LONG_LEASE: Duration = Duration::from_secs(60);
/// A retention short enough that cases can wait it out.
pub const SHORT_RETENTION: Duration = Duration::from_millis(400);
/// How long a case polls for something the store must do eventually.
pub const DEADLINE: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(25);
/// How many claims race for one key in a round.
pub const RACERS: usize = 8;
/// The fewest rounds of racing claims a race case runs, each on a fresh key.
pub const MIN_RACE_ROUNDS: usize = 8;
/// How long a race case keeps starting rounds after the first few: fast
/// stores run thousands of rounds, slow ones a few.
pub const RACE_TIME: Duration = Duration::from_millis(1_500);
/// The response size that stands in for "the maximum" on a store with no limit.
pub const UNLIMITED_STAND_IN: usize = 4 << 20;

/// The DynamoDB-compatible server a test talks to: `IDEM_DYNAMO_ENDPOINT`,
/// unless `IDEM_DYNAMO_ENDPOINTS` lists several (`scripts/services.sh`
/// starts one moto per slot of the suite's `dynamodb` test group) and the
/// test runs in a slot of that group (`NEXTEST_TEST_GROUP_SLOT`): then the
/// one of its slot. Two DynamoDB tests running at once never queue behind
/// each other on one emulator that serves one request at a time (on a
/// loaded machine, one test's sixteen batches at once held another's
/// single call past its 20 s).
///
/// ```
/// // Outside nextest's group, the one endpoint named, if any.
/// let _ = idem_conformance::support::dynamo_endpoint();
/// ```
pub fn dynamo_endpoint() -> Option<String> {
    let slot = std::env::var("NEXTEST_TEST_GROUP_SLOT")
        .ok()
        .and_then(|slot| slot.parse::<usize>().ok());
    let listed = std::env::var("IDEM_DYNAMO_ENDPOINTS").unwrap_or_default();
    let endpoints: Vec<&str> = listed.split(',').filter(|e| !e.is_empty()).collect();
    match slot {
        Some(slot) if !endpoints.is_empty() => Some(endpoints[slot % endpoints.len()].to_string()),
        _ => std::env::var("IDEM_DYNAMO_ENDPOINT").ok(),
    }
}

/// The system clock moved by a fixed amount: a store's own clock far from
/// the process's, for running a suite against a store whose time is not the
/// caller's (every case must pass on it as on the true time).
///
/// ```
/// use std::time::Duration;
/// use idem_conformance::support::SkewedClock;
///
/// let store_clock = SkewedClock::ahead(Duration::from_secs(3 * 3600));
/// # let _ = store_clock;
/// ```
#[derive(Debug, Clone, Copy)]
pub struct SkewedClock {
    ahead: bool,
    by: Duration,
}

impl SkewedClock {
    /// A clock `by` ahead of the system's.
    pub fn ahead(by: Duration) -> Self {
        Self { ahead: true, by }
    }

    /// A clock `by` behind the system's.
    pub fn behind(by: Duration) -> Self {
        Self { ahead: false, by }
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> Timestamp {
        let now = SystemClock.now();
        if self.ahead {
            now + self.by
        } else {
            now - self.by
        }
    }
}

/// How far [`SkewedClock`] moves a store's clock in the suites' own runs:
/// hours, so no lease, back-off or age of a case can hide it.
pub const SKEW: Duration = Duration::from_secs(3 * 3600);

/// A tenant no other case uses.
pub fn fresh_tenant() -> Tenant {
    Tenant::new(format!("conformance-{}", uuid::Uuid::new_v4())).expect("valid tenant")
}

/// A consumer name no other test uses.
pub fn fresh_consumer() -> ConsumerName {
    ConsumerName::new(format!("conformance-{}", uuid::Uuid::new_v4())).expect("valid consumer name")
}

/// A scope in a fresh tenant.
pub fn fresh_scope() -> Scope {
    Scope::new(fresh_tenant(), key("key-1"))
}

/// A key from text known to be valid.
pub fn key(text: &str) -> IdempotencyKey {
    IdempotencyKey::new(text).expect("valid key")
}

/// A claim of `scope` for the request `body`, with `lease` and a long retention.
pub fn request(scope: &Scope, body: &str, lease: Duration) -> ClaimRequest {
    ClaimRequest::new(scope.clone(), Fingerprint::of_bytes(body))
        .with_lease(lease)
        .expect("valid lease")
}

/// A claim that holds for the whole case.
pub fn long(scope: &Scope, body: &str) -> ClaimRequest {
    request(scope, body, LONG_LEASE)
}

/// A claim whose lease the case will wait out.
pub fn short(scope: &Scope, body: &str) -> ClaimRequest {
    request(scope, body, SHORT_LEASE)
}

/// The same claim with a short retention. (A claim of a long lease
/// retains for the lease, and its completion for the short retention from
/// completion: a case that completes waits out only the latter, however
/// slow the store.)
pub fn brief(request: ClaimRequest) -> ClaimRequest {
    request
        .with_retention(SHORT_RETENTION)
        .expect("valid retention")
}

/// Claims as a new caller (a new owner: see [`ClaimRequest::with_new_owner`]),
/// and fails the case unless the outcome is `Claimed`.
pub async fn must_claim<S: IdempotencyStore + ?Sized>(
    store: &S,
    request: &ClaimRequest,
) -> (Lease, Option<Checkpoint>) {
    match store.claim(&request.clone().with_new_owner()).await {
        Ok(ClaimOutcome::Claimed { lease, checkpoint }) => (lease, checkpoint),
        other => panic!("expected Claimed, got {other:?}"),
    }
}

/// Claims as a new caller and returns the outcome, failing the case on a
/// store error. (The same request sent twice is one claim delivered twice,
/// which the redelivery cases send with `store.claim` itself.)
pub async fn claim<S: IdempotencyStore + ?Sized>(
    store: &S,
    request: &ClaimRequest,
) -> ClaimOutcome {
    match store.claim(&request.clone().with_new_owner()).await {
        Ok(outcome) => outcome,
        Err(e) => panic!("claim failed: {e:?}"),
    }
}

/// Fails the case unless `result` is `LostLease`.
pub fn assert_lost<T: std::fmt::Debug>(what: &str, result: Result<T, StoreError>) {
    assert!(
        matches!(result, Err(StoreError::LostLease)),
        "{what}: expected LostLease, got {result:?}"
    );
}

/// Polls `check` until it yields a value, or fails once [`DEADLINE`] has
/// passed and twenty of the slowest check so far too: the patience follows
/// the store's measured latency (an emulator answering in a second under a
/// loaded run gets twenty of its answers), while a fast store that never
/// gets there fails after [`DEADLINE`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = tokio::time::Instant::now();
    let mut slowest = Duration::ZERO;
    loop {
        let asked = tokio::time::Instant::now();
        if let Some(value) = check().await {
            return value;
        }
        slowest = slowest.max(asked.elapsed());
        let patience = DEADLINE.max(slowest * 20);
        assert!(
            started.elapsed() < patience,
            "{what}: not within {patience:?} (its slowest check took {slowest:?})"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Claims `request` until the store grants it (after an expiry), failing on
/// any outcome other than `InProgress` in the meantime.
pub async fn wait_for_claim<S: IdempotencyStore + ?Sized>(
    store: &S,
    request: &ClaimRequest,
) -> (Lease, Option<Checkpoint>) {
    eventually("claim after the lease expires", || async {
        match claim(store, request).await {
            ClaimOutcome::Claimed { lease, checkpoint } => Some((lease, checkpoint)),
            ClaimOutcome::InProgress { .. } => None,
            other => panic!("while waiting for the lease to expire: {other:?}"),
        }
    })
    .await
}

/// Waits until `get` reports no record for `scope`.
pub async fn wait_until_absent<S: IdempotencyStore + ?Sized>(store: &S, scope: &Scope) {
    eventually("record past retention to count as absent", || async {
        match store.get(scope).await {
            Ok(None) => Some(()),
            Ok(Some(_)) => None,
            Err(e) => panic!("get failed: {e:?}"),
        }
    })
    .await;
}

/// Waits until the clock that judges `scope`'s record reads `at` or later:
/// a case that needs a lease expired, or the store's time moved on, waits
/// for exactly that, not for a guess of wall time.
pub async fn wait_for_the_store_clock<S: IdempotencyStore + ?Sized>(
    store: &S,
    scope: &Scope,
    at: Timestamp,
) {
    eventually("the store's clock to reach the moment awaited", || async {
        let now = store.now(scope).await.expect("the store's clock");
        (now >= at).then_some(())
    })
    .await;
}

/// Waits until the clock that judges `scope`'s record has moved on by `by`
/// from what it reads now: two deliveries this far apart are not in one
/// millisecond, so a store that writes on the second one shows it.
pub async fn let_the_store_clock_pass<S: IdempotencyStore + ?Sized>(
    store: &S,
    scope: &Scope,
    by: Duration,
) {
    let from = store.now(scope).await.expect("the store's clock");
    wait_for_the_store_clock(store, scope, from + by).await;
}

/// Fails the case unless `record` is retained for exactly `retention` from
/// a moment within `around`: the store's clock read just before and just
/// after the write that set its retention.
pub fn assert_retained_from(
    what: &str,
    record: &Record,
    around: (Timestamp, Timestamp),
    retention: Duration,
) {
    let (before, after) = around;
    let until = record.retained_until();
    assert!(
        until >= before + retention && until <= after + retention,
        "{what}: retained until {until:?}, not {retention:?} from between {before:?} and {after:?}"
    );
}

/// Sleeps until a lease claimed `lease` ago has certainly run out.
pub async fn outlive(lease: Duration) {
    tokio::time::sleep(lease + Duration::from_millis(150)).await;
}

/// A small response.
pub fn response(text: &str) -> StoredResponse {
    StoredResponse::new(200, text.as_bytes().to_vec()).with_header("content-type", "text/plain")
}

/// Claims `request` and completes it with `response`.
pub async fn claim_and_complete<S: IdempotencyStore + ?Sized>(
    store: &S,
    request: &ClaimRequest,
    response: &StoredResponse,
) -> Lease {
    let (lease, _) = must_claim(store, request).await;
    store
        .complete(&lease, response)
        .await
        .expect("complete under a held lease");
    lease
}

/// Runs `count` copies of `task` at once, each on its own tokio task.
pub async fn concurrently<S, F, Fut, T>(store: &Arc<S>, count: usize, task: F) -> Vec<T>
where
    S: IdempotencyStore + ?Sized,
    F: Fn(Arc<S>) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let barrier = Arc::new(tokio::sync::Barrier::new(count));
    let handles: Vec<_> = (0..count)
        .map(|_| {
            let work = task(Arc::clone(store));
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                barrier.wait().await;
                work.await
            })
        })
        .collect();
    let mut results = Vec::with_capacity(count);
    for handle in handles {
        results.push(handle.await.expect("concurrent task panicked"));
    }
    results
}

/// A runner over a clone of `store` behind `dyn`, as services hold it.
pub fn runner<S: IdempotencyStore + Clone>(store: &S) -> Idempotency<dyn IdempotencyStore> {
    let shared: Arc<dyn IdempotencyStore> = Arc::new(store.clone());
    Idempotency::new(shared)
}

/// Awaits runs that raced for the same keys and counts those that
/// executed, failing the case on any answer but `Executed`, `Replayed` or
/// `InProgress` (a duplicate that met the winner's claim): a race storm
/// expects one execution per key.
pub async fn executed_runs(
    runs: Vec<tokio::task::JoinHandle<Result<RunOutcome, RunError>>>,
) -> usize {
    let mut executed = 0;
    for run in runs {
        match run.await.expect("a raced run panicked") {
            Ok(RunOutcome::Executed(_)) => executed += 1,
            Ok(RunOutcome::Replayed(_)) | Err(RunError::InProgress { .. }) => {}
            Err(other) => panic!("a raced run failed: {other:?}"),
        }
    }
    executed
}

/// Runs every operation, and a claim of every outcome, on scopes of its own,
/// and returns what `counter` (a server-side count of round trips, requests
/// or commands) says each one cost. The whole sequence runs twice and only
/// the second pass is reported, so per-connection set-up (prepared
/// statements, loaded scripts) is not counted.
pub async fn cost_of_each_operation<S, C, Fut>(
    store: &S,
    mut counter: C,
) -> Vec<(&'static str, u64)>
where
    S: IdempotencyStore + ?Sized,
    C: FnMut() -> Fut,
    Fut: Future<Output = u64>,
{
    let mut report = Vec::new();
    for measured in [false, true] {
        report.clear();
        macro_rules! cost {
            ($what:expr, $op:expr) => {{
                let before = counter().await;
                let value = $op;
                report.push(($what, counter().await - before));
                value
            }};
        }
        // A long lease, so the duplicates meet it valid however slow the
        // server; the renewal then ends it, so the takeover finds it
        // expired, both by construction rather than by timing.
        let scope = fresh_scope();
        let (first, _) = cost!(
            "claim: claimed",
            must_claim(store, &long(&scope, "a")).await
        );
        let busy = cost!("claim: in progress", claim(store, &long(&scope, "a")).await);
        assert!(matches!(busy, ClaimOutcome::InProgress { .. }), "{busy:?}");
        let other = cost!(
            "claim: mismatch in flight",
            claim(store, &long(&scope, "b")).await
        );
        assert_eq!(other, ClaimOutcome::Mismatch);
        let point = Checkpoint::new("p", &1).expect("valid checkpoint");
        cost!(
            "checkpoint",
            store.checkpoint(&first, &point).await.expect("checkpoint")
        );
        let ending = cost!(
            "renew",
            store
                .renew(&first, Duration::from_millis(1))
                .await
                .expect("renew")
        );
        wait_for_the_store_clock(store, &scope, ending.expires_at()).await;
        let (second, carried) = cost!(
            "claim: takeover",
            must_claim(store, &long(&scope, "a")).await
        );
        assert_eq!((second.attempt(), carried), (2, Some(point)));
        let stale = cost!(
            "complete: lost lease",
            store.complete(&first, &response("stale")).await
        );
        assert_lost("stale complete", stale);
        cost!(
            "complete",
            store
                .complete(&second, &response("done"))
                .await
                .expect("complete")
        );
        let replay = cost!("claim: replay", claim(store, &long(&scope, "a")).await);
        assert_eq!(replay, ClaimOutcome::Completed(response("done")));
        let other = cost!(
            "claim: mismatch completed",
            claim(store, &long(&scope, "b")).await
        );
        assert_eq!(other, ClaimOutcome::Mismatch);
        cost!(
            "get",
            store.get(&scope).await.expect("get").expect("record")
        );

        let released = fresh_scope();
        let (lease, _) = must_claim(store, &long(&released, "a")).await;
        cost!("release", store.release(&lease).await.expect("release"));

        let retained = fresh_scope();
        claim_and_complete(store, &brief(long(&retained, "a")), &response("old")).await;
        wait_until_absent(store, &retained).await;
        let (lease, _) = cost!(
            "claim: past retention",
            must_claim(store, &long(&retained, "b")).await
        );
        assert_eq!(lease.attempt(), 1);
        if measured {
            break;
        }
    }
    report
}

/// A record store that fails every call for good, with a text that holds
/// what an error must never carry to a client (a Postgres message names a
/// row's values so): for tests that an answer built from an error keeps
/// its text on the server.
#[derive(Debug)]
pub struct LeakyStore;

/// What [`LeakyStore`]'s errors say.
pub const LEAKY_SECRET: &str = "Key (email)=(jane@example.com) already exists";

fn leaky(operation: idem_core::Operation) -> idem_core::StoreError {
    idem_core::StoreError::backend("leaky", operation, LEAKY_SECRET)
}

#[idem_core::async_trait]
impl idem_core::store::IdempotencyStore for LeakyStore {
    async fn claim(
        &self,
        _: &idem_core::store::ClaimRequest,
    ) -> Result<idem_core::store::ClaimOutcome, idem_core::StoreError> {
        Err(leaky(idem_core::Operation::Claim))
    }
    async fn complete(
        &self,
        _: &idem_core::store::Lease,
        _: &idem_core::StoredResponse,
    ) -> Result<(), idem_core::StoreError> {
        Err(leaky(idem_core::Operation::Complete))
    }
    async fn renew(
        &self,
        _: &idem_core::store::Lease,
        _: Duration,
    ) -> Result<idem_core::store::Lease, idem_core::StoreError> {
        Err(leaky(idem_core::Operation::Renew))
    }
    async fn release(&self, _: &idem_core::store::Lease) -> Result<(), idem_core::StoreError> {
        Err(leaky(idem_core::Operation::Release))
    }
    async fn checkpoint(
        &self,
        _: &idem_core::store::Lease,
        _: &idem_core::Checkpoint,
    ) -> Result<(), idem_core::StoreError> {
        Err(leaky(idem_core::Operation::Checkpoint))
    }
    async fn get(
        &self,
        _: &idem_core::Scope,
    ) -> Result<Option<idem_core::store::Record>, idem_core::StoreError> {
        Err(leaky(idem_core::Operation::Get))
    }
    async fn purge_expired(&self) -> Result<u64, idem_core::StoreError> {
        Err(leaky(idem_core::Operation::Purge))
    }
    async fn delete(&self, _: &idem_core::Scope) -> Result<bool, idem_core::StoreError> {
        Err(leaky(idem_core::Operation::Delete))
    }
    async fn now(
        &self,
        _: &idem_core::Scope,
    ) -> Result<idem_core::store::Timestamp, idem_core::StoreError> {
        Err(leaky(idem_core::Operation::Now))
    }
    fn capabilities(&self) -> idem_core::store::Capabilities {
        idem_core::store::Capabilities::new(
            "leaky",
            idem_core::store::TransactionSharing::None,
            idem_core::store::Durability::Volatile,
            idem_core::store::ClockSource::Caller,
            usize::MAX,
        )
    }
}
