//! Faults between a store and its server, and what callers see through them.
//!
//! - [`FaultProxy`]: a TCP proxy on loopback that loses a reply after the
//!   request was served, stalls the network, or cuts connections. Backend
//!   tests start one in front of their own server ([`authority`] is what it
//!   forwards to, [`url_via`] the URL a client then connects to).
//! - [`Storm`]: many callers running [`Idempotency::run`] on fresh keys (and
//!   retries of earlier ones) while a fault happens, each call bounded; it
//!   reports what the callers saw ([`StormReport`]), and
//!   [`check_replays`] then replays every key a caller was told
//!   `Executed` and compares the bytes. [`table_row`] prints one line of the
//!   faults table: fault, backend, longest call, errors by type, recovery
//!   time, data lost. [`Storm::run_and_check`] does all three at once, and
//!   [`connections_cut_at_random`] is the fault every backend's proxy can
//!   make.
//! - [`StallBounds`] and the stall scenarios
//!   ([`a_claim_on_a_stalled_network_times_out_and_its_retry_gets_the_claim`],
//!   [`a_completion_on_a_stalled_network_times_out_and_its_retry_completes`],
//!   [`every_other_operation_on_a_stalled_network_times_out_and_its_retry_succeeds`]):
//!   on a network stalled by the proxy, every call of a store ends within its
//!   operation timeout as a retryable `Unavailable`, and a retry with the
//!   same request or lease gets the true answer once the network is back.
//!
//! A backend's fault test, in outline (here on the memory store, with a
//! fault that does nothing):
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use idem_conformance::faults::{Storm, check_replays, table_row};
//!
//! # tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap().block_on(async {
//! let store = Arc::new(idem_memory::MemoryStore::new());
//! let storm = Storm { length: Duration::from_millis(300), ..Storm::default() };
//! let report = storm
//!     .run(Arc::clone(&store), || tokio::time::sleep(Duration::from_millis(100)))
//!     .await;
//! assert!(report.unexpected.is_empty(), "{report}");
//! assert!(report.recovery.is_some());
//! let check = check_replays(store, &report, Duration::from_secs(10)).await;
//! assert_eq!(check.lost.len(), 0);
//! assert!(check.unresolved.is_empty());
//! println!("{}", table_row("nothing", "memory", &report, &check));
//! # });
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use idem_core::store::{ClaimOutcome, ClaimRequest, IdempotencyStore, Lease};
use idem_core::{
    Checkpoint, Fingerprint, HandlerError, Idempotency, IdempotencyKey, Operation, RunError,
    RunOutcome, Scope, StoreError, StoredResponse, Tenant,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::support::{claim_and_complete, eventually, fresh_scope, long, response};

/// What the proxy does to traffic now.
#[derive(Debug, Default)]
struct Faults {
    /// Drop the next chunk the server sends and cut that connection: the
    /// request was served, its reply never arrives.
    drop_next_reply: AtomicBool,
    /// Forward nothing in either direction until resumed.
    stalled: AtomicBool,
    /// Bumped to cut every open connection.
    cut_generation: AtomicU64,
    /// Replies dropped so far.
    dropped: AtomicU64,
    changed: Notify,
}

/// A fault-injecting proxy; stops accepting when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    /// The loopback port clients connect to.
    pub port: u16,
    faults: Arc<Faults>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut_all();
    }
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port forwarding to `upstream`
    /// (`host:port`).
    ///
    /// # Panics
    ///
    /// If no loopback port can be bound.
    pub async fn start(upstream: impl Into<String>) -> Self {
        Self::start_on(0, upstream).await
    }

    /// [`start`](Self::start) on a given loopback port (0: any free one), for
    /// servers that must be told the proxy's port before it starts.
    ///
    /// # Panics
    ///
    /// If the port cannot be bound.
    pub async fn start_on(port: u16, upstream: impl Into<String>) -> Self {
        let upstream = upstream.into();
        let listener = TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind a loopback port");
        let port = listener.local_addr().expect("local address").port();
        let faults = Arc::new(Faults::default());
        let accepting = Arc::clone(&faults);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let faults = Arc::clone(&accepting);
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(&upstream).await {
                        relay(client, server, faults).await;
                    }
                });
            }
        });
        Self {
            port,
            faults,
            accept,
        }
    }

    /// `127.0.0.1:<port>`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The next reply from the server is lost, and its connection cut.
    pub fn drop_next_reply(&self) {
        self.faults.drop_next_reply.store(true, Ordering::SeqCst);
    }

    /// How many replies were dropped so far.
    pub fn dropped_replies(&self) -> u64 {
        self.faults.dropped.load(Ordering::SeqCst)
    }

    /// Stops forwarding in both directions, as a network that stalls.
    pub fn stall(&self) {
        self.faults.stalled.store(true, Ordering::SeqCst);
    }

    /// Forwards again after [`stall`](Self::stall).
    pub fn resume(&self) {
        self.faults.stalled.store(false, Ordering::SeqCst);
        self.faults.changed.notify_waiters();
    }

    /// Cuts every open connection (new ones are accepted).
    pub fn cut_all(&self) {
        self.faults.cut_generation.fetch_add(1, Ordering::SeqCst);
        self.faults.changed.notify_waiters();
    }

    /// Cuts every open connection again and again for `span`, each time
    /// after a random pause between `shortest` and `longest`; returns how
    /// many times it cut.
    pub async fn cut_at_random(
        &self,
        shortest: Duration,
        longest: Duration,
        span: Duration,
    ) -> u32 {
        let mut dice = Dice::new();
        let spread = longest.saturating_sub(shortest).as_millis() as usize;
        let end = Instant::now() + span;
        let mut cuts = 0;
        loop {
            let pause = shortest + Duration::from_millis(dice.below(spread + 1) as u64);
            if Instant::now() + pause > end {
                return cuts;
            }
            tokio::time::sleep(pause).await;
            self.cut_all();
            cuts += 1;
        }
    }
}

/// The `host:port` of a server's URL (`amqp://guest:guest@127.0.0.1:5672/%2f`
/// gives `127.0.0.1:5672`): what a [`FaultProxy`] in front of it forwards to.
///
/// ```
/// use idem_conformance::faults::authority;
///
/// assert_eq!(authority("amqp://guest:guest@127.0.0.1:5672/%2f"), "127.0.0.1:5672");
/// assert_eq!(authority("nats://127.0.0.1:4222"), "127.0.0.1:4222");
/// ```
pub fn authority(url: &str) -> &str {
    let after_at = url.rsplit_once('@').map_or(url, |(_, rest)| rest);
    let after_scheme = after_at
        .split_once("://")
        .map_or(after_at, |(_, rest)| rest);
    after_scheme.split('/').next().unwrap_or(after_scheme)
}

/// `url` with `address` (a [`FaultProxy`]'s) in place of its `host:port`,
/// so that a client of it connects through the proxy.
///
/// ```
/// use idem_conformance::faults::url_via;
///
/// assert_eq!(
///     url_via("amqp://guest:guest@127.0.0.1:5672/%2f", "127.0.0.1:40001"),
///     "amqp://guest:guest@127.0.0.1:40001/%2f"
/// );
/// ```
pub fn url_via(url: &str, address: &str) -> String {
    url.replacen(authority(url), address, 1)
}

/// A loopback port free a moment ago, for a private server of a fault test
/// (the shared services keep theirs).
///
/// ```
/// let port = idem_conformance::faults::free_port();
/// assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok());
/// ```
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .unwrap_or_else(|e| panic!("no free loopback port: {e}"))
}

/// A new, empty directory of its own under the system's temporary one,
/// named `<name>-<random>`: a private server's data.
///
/// ```
/// let dir = idem_conformance::faults::private_dir("idem-doc");
/// assert!(dir.is_dir());
/// # std::fs::remove_dir_all(dir).unwrap();
/// ```
pub fn private_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    dir
}

/// Copies both ways until either side closes or a fault cuts the connection.
async fn relay(client: TcpStream, server: TcpStream, faults: Arc<Faults>) {
    let generation = faults.cut_generation.load(Ordering::SeqCst);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = pump(
        &mut client_read,
        &mut server_write,
        &faults,
        generation,
        false,
    );
    let down = pump(
        &mut server_read,
        &mut client_write,
        &faults,
        generation,
        true,
    );
    // Whichever direction ends first ends the connection: both halves drop.
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

async fn pump(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    faults: &Faults,
    generation: u64,
    replies: bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let cut = || faults.cut_generation.load(Ordering::SeqCst) != generation;
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            () = faults.changed.notified() => {
                if cut() { return; }
                continue;
            }
        };
        // A stall holds what was read until resumed (or cut).
        while faults.stalled.load(Ordering::SeqCst) {
            if cut() {
                return;
            }
            tokio::select! {
                () = faults.changed.notified() => {}
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
        if cut() {
            return;
        }
        if replies && faults.drop_next_reply.swap(false, Ordering::SeqCst) {
            faults.dropped.fetch_add(1, Ordering::SeqCst);
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A storm of callers through a fault: `workers` callers run
/// [`Idempotency::run`] over and over, most calls on a fresh key, one in
/// `retry_one_in` on a key used earlier (a client's retry, which must
/// replay), and a caller whose call failed with an error tries the same key
/// again (up to three times) as a client would; a key found in progress is
/// left to its holder (it comes back among the retries of earlier keys, so
/// a caller never sleeps a lease away and the recovery time stays the
/// store's). Meanwhile the fault runs; see [`run`](Self::run).
///
/// Every call is bounded by `call_limit`: a call still running then is cut
/// and counted as a failure, for no call may wait forever.
#[derive(Debug, Clone)]
pub struct Storm {
    /// Callers running at once.
    pub workers: usize,
    /// The shortest time the storm runs, from its start. It goes on after
    /// the fault until a call succeeds, or `recovery_limit` has passed.
    pub length: Duration,
    /// The runner's lease.
    pub lease: Duration,
    /// How long each handler works, between its claim and its completion.
    pub handler_time: Duration,
    /// The harness's bound on one call ("no call waits forever").
    pub call_limit: Duration,
    /// How long after the fault's end the storm waits for a successful call.
    pub recovery_limit: Duration,
    /// One call in this many retries a key used earlier (0: never).
    pub retry_one_in: u32,
    /// How long a caller waits after a failed call before its next one.
    pub backoff: Duration,
}

impl Default for Storm {
    /// Four callers for 3 s, a 1 s lease, handlers of 10 ms, calls cut at
    /// 5 s, recovery within 10 s, one retry in four calls, 50 ms back-off.
    fn default() -> Self {
        Self {
            workers: 4,
            length: Duration::from_secs(3),
            lease: Duration::from_secs(1),
            handler_time: Duration::from_millis(10),
            call_limit: Duration::from_secs(5),
            recovery_limit: Duration::from_secs(10),
            retry_one_in: 4,
            backoff: Duration::from_millis(50),
        }
    }
}

/// A key a caller was told [`RunOutcome::Executed`] about.
#[derive(Debug, Clone)]
pub struct ExecutedKey {
    /// The key's scope.
    pub scope: Scope,
    /// The request's fingerprint.
    pub fingerprint: Fingerprint,
    /// Every response a caller was told was executed and stored, in order:
    /// more than one means the work ran again (a record was lost).
    pub responses: Vec<StoredResponse>,
}

/// What the callers of a [`Storm`] saw.
#[derive(Debug, Clone, Default)]
pub struct StormReport {
    /// Calls made (each call one [`Idempotency::run`]).
    pub calls: u64,
    /// Calls answered [`RunOutcome::Executed`].
    pub executed: u64,
    /// Calls answered [`RunOutcome::Replayed`].
    pub replayed: u64,
    /// The longest call, from its start to its answer (or to `call_limit`).
    pub longest_call: Duration,
    /// Failed calls by type of error: `in progress`, `claim unavailable`,
    /// `complete timed out`, `lost lease`, `harness timeout`, `panic`...
    pub errors: BTreeMap<String, u64>,
    /// Every failure that is neither a retryable store error nor
    /// [`RunError::InProgress`]: non-retryable errors, calls cut by the
    /// harness's `call_limit`, panics. Each as `type: message`.
    pub unexpected: Vec<String>,
    /// Replays whose bytes are none of what a caller was told was executed
    /// for the same key.
    pub wrong_replays: Vec<String>,
    /// From the storm's start to the fault's end (the fault's own wait
    /// before it strikes included).
    pub fault_took: Duration,
    /// From the fault's end to the answer of the first call that started
    /// after it and succeeded; `None` if none did within `recovery_limit`.
    pub recovery: Option<Duration>,
    /// Every key a caller was told was executed, by key.
    pub executed_keys: BTreeMap<String, ExecutedKey>,
}

impl StormReport {
    /// Keys told `Executed` more than once: their work ran again because
    /// the store lost the record.
    pub fn reexecuted_keys(&self) -> BTreeSet<String> {
        self.executed_keys
            .iter()
            .filter(|(_, key)| key.responses.len() > 1)
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// The errors by type on one line: `claim unavailable ×12, in progress ×3`,
    /// or `none`.
    pub fn errors_line(&self) -> String {
        if self.errors.is_empty() {
            return "none".into();
        }
        let mut errors: Vec<_> = self.errors.iter().collect();
        errors.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        errors
            .iter()
            .map(|(kind, count)| format!("{kind} ×{count}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl StormReport {
    /// Fails the test unless the callers came through the fault well: some
    /// call executed, every failure was a retryable store error or
    /// `InProgress` (no other error, no call cut by the harness, no panic),
    /// every replay during the storm matched what its key's caller was told,
    /// and a call that started after the fault succeeded within `within` of
    /// its end.
    ///
    /// # Panics
    ///
    /// When one of these does not hold, with the whole report.
    pub fn assert_came_through(&self, within: Duration) {
        assert!(self.executed > 0, "nothing executed: {self}");
        assert!(
            self.unexpected.is_empty(),
            "errors a caller cannot retry: {self}"
        );
        assert!(self.wrong_replays.is_empty(), "wrong replays: {self}");
        assert!(
            self.recovery.is_some_and(|recovery| recovery <= within),
            "no successful call within {within:?} of the fault's end: {self}"
        );
    }
}

impl fmt::Display for StormReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} calls ({} executed, {} replayed), longest {}, errors: {}, fault took {}, recovery {}",
            self.calls,
            self.executed,
            self.replayed,
            show(self.longest_call),
            self.errors_line(),
            show(self.fault_took),
            self.recovery.map_or_else(|| "none".into(), show),
        )?;
        if !self.unexpected.is_empty() {
            write!(f, "; unexpected: {:?}", self.unexpected)?;
        }
        if !self.wrong_replays.is_empty() {
            write!(f, "; wrong replays: {:?}", self.wrong_replays)?;
        }
        Ok(())
    }
}

/// A duration as the table shows it: `850 ms`, `1.02 s`.
fn show(duration: Duration) -> String {
    if duration < Duration::from_secs(1) {
        format!("{} ms", duration.as_millis())
    } else {
        format!("{:.2} s", duration.as_secs_f64())
    }
}

/// Keeps at most this many descriptions of unexpected errors.
const MAX_DESCRIPTIONS: usize = 20;

/// What the callers share while the storm runs.
#[derive(Default)]
struct Tally {
    report: StormReport,
    /// Every key tried so far, for retries.
    tried: Vec<String>,
    /// When the fault ended.
    fault_end: Option<Instant>,
    /// When the first call that started after the fault's end succeeded.
    recovered_at: Option<Instant>,
    /// Every replay, by key: checked once the storm is over, against every
    /// response a caller was told was executed (the call that executed a
    /// replayed response may report after the replay's).
    replays: Vec<(String, StoredResponse)>,
}

/// What one call ended in.
enum Ended {
    Outcome(RunOutcome),
    Error(RunError),
    CutByHarness,
    Panicked(String),
}

/// The type of a run error, as the report counts it.
fn error_type(error: &RunError) -> String {
    match error {
        RunError::InProgress { .. } => "in progress".into(),
        RunError::Mismatch => "mismatch".into(),
        RunError::LostLease => "lost lease".into(),
        RunError::NotStarted(_) => "not started".into(),
        RunError::Failed(_) => "handler failed".into(),
        RunError::Store(error) => store_error_type(error),
        _ => "other".into(),
    }
}

fn store_error_type(error: &StoreError) -> String {
    let kind = match error {
        StoreError::Unavailable { message, .. } if message.contains("timed out") => "timed out",
        StoreError::Unavailable { .. } => "unavailable",
        StoreError::LostLease => "lost lease",
        StoreError::InvalidInput(_) => "invalid input",
        StoreError::TooLarge { .. } => "too large",
        StoreError::Rejected { .. } => "rejected",
        StoreError::Corrupt { .. } => "corrupt",
        StoreError::Misconfigured { .. } => "misconfigured",
        StoreError::Backend { .. } => "backend error",
        _ => "other store error",
    };
    match error.operation() {
        Some(operation) => format!("{operation} {kind}"),
        None => kind.into(),
    }
}

/// Whether a caller may simply retry after `error`.
fn expected(error: &RunError) -> bool {
    match error {
        RunError::InProgress { .. } => true,
        RunError::Store(error) => error.is_retryable(),
        _ => false,
    }
}

/// A small xorshift generator: callers pick keys to retry at random.
struct Dice(u64);

impl Dice {
    fn new() -> Self {
        Self(uuid::Uuid::new_v4().as_u64_pair().0 | 1)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

fn locked(tally: &Mutex<Tally>) -> MutexGuard<'_, Tally> {
    tally.lock().unwrap_or_else(|e| e.into_inner())
}

impl Storm {
    /// Runs the storm on `store` while `fault` runs, and reports what the
    /// callers saw.
    ///
    /// The callers start first; `fault` is awaited at once beside them (it
    /// sleeps before it strikes, if it wants the storm under way). When it
    /// returns, the fault has ended: the storm goes on until it has run for
    /// `length`, and until a call that started after the fault's end has
    /// succeeded (the recovery) or `recovery_limit` has passed. Then the
    /// callers finish the calls they are in, and the report is returned.
    ///
    /// Every caller works in one fresh tenant, so storms never share a key.
    ///
    /// # Panics
    ///
    /// If a caller's task panics outside a call (a bug of the harness);
    /// panics inside a call are counted as errors of type `panic`.
    pub async fn run<S, F, Fut>(&self, store: Arc<S>, fault: F) -> StormReport
    where
        S: IdempotencyStore + ?Sized,
        F: FnOnce() -> Fut,
        Fut: Future<Output = ()>,
    {
        let idem = Idempotency::new(store)
            .with_lease(self.lease)
            .expect("a valid lease");
        let tenant = crate::support::fresh_tenant();
        let tally = Arc::new(Mutex::new(Tally::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let workers: Vec<_> = (0..self.workers.max(1))
            .map(|worker| {
                let caller = Caller {
                    worker,
                    storm: self.clone(),
                    idem: idem.clone(),
                    tenant: tenant.clone(),
                    tally: Arc::clone(&tally),
                    stop: Arc::clone(&stop),
                };
                tokio::spawn(caller.work())
            })
            .collect();

        let started = Instant::now();
        fault().await;
        let fault_end = Instant::now();
        locked(&tally).fault_end = Some(fault_end);
        loop {
            let now = Instant::now();
            let recovered = locked(&tally).recovered_at.is_some();
            if now >= started + self.length && (recovered || now >= fault_end + self.recovery_limit)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop.store(true, Ordering::SeqCst);
        for worker in workers {
            worker
                .await
                .expect("a storm caller panicked outside a call");
        }

        let mut tally = locked(&tally);
        let recovered_at = tally.recovered_at;
        let replays = std::mem::take(&mut tally.replays);
        let report = &mut tally.report;
        report.fault_took = fault_end - started;
        report.recovery = recovered_at.map(|at| at - fault_end);
        // A replay answers what some call executed and was told: the
        // last told where the record was never lost, an earlier one
        // where a restart forgot it and the key ran again.
        for (key, response) in replays {
            let Some(executed) = report.executed_keys.get(&key) else {
                continue;
            };
            if !executed.responses.contains(&response)
                && report.wrong_replays.len() < MAX_DESCRIPTIONS
            {
                let told = executed.responses.last().map(|told| told.body().to_vec());
                report.wrong_replays.push(format!(
                    "{key}: told executed {:?}, replayed {:?}",
                    String::from_utf8_lossy(&told.unwrap_or_default()),
                    String::from_utf8_lossy(response.body())
                ));
            }
        }
        report.clone()
    }
}

/// One caller of a storm.
struct Caller<S: ?Sized> {
    worker: usize,
    storm: Storm,
    idem: Idempotency<S>,
    tenant: Tenant,
    tally: Arc<Mutex<Tally>>,
    stop: Arc<AtomicBool>,
}

impl<S: IdempotencyStore + ?Sized> Caller<S> {
    async fn work(self) {
        let mut dice = Dice::new();
        let mut fresh = 0u64;
        // The key of a failed call, and how often it was tried again.
        let mut again: Option<(String, u32)> = None;
        while !self.stop.load(Ordering::SeqCst) {
            let (key, tries) = match again.take() {
                Some((key, tries)) => (key, tries),
                None => {
                    let earlier = {
                        let tally = locked(&self.tally);
                        (self.storm.retry_one_in > 0
                            && !tally.tried.is_empty()
                            && dice.below(self.storm.retry_one_in as usize) == 0)
                            .then(|| tally.tried[dice.below(tally.tried.len())].clone())
                    };
                    let key = earlier.unwrap_or_else(|| {
                        fresh += 1;
                        let key = format!("storm-{}-{fresh}", self.worker);
                        locked(&self.tally).tried.push(key.clone());
                        key
                    });
                    (key, 0)
                }
            };
            let started = Instant::now();
            let ended = self.call(&key).await;
            let took = started.elapsed();
            if let Some(same_key) = self.record(&key, started, took, ended) {
                if same_key && tries < 3 {
                    again = Some((key, tries + 1));
                }
                tokio::time::sleep(self.storm.backoff).await;
            }
        }
    }

    /// One bounded call of `key`, on a task of its own so a panic is caught.
    async fn call(&self, key: &str) -> Ended {
        let scope = Scope::new(
            self.tenant.clone(),
            IdempotencyKey::new(key).expect("a valid key"),
        );
        let fingerprint = Fingerprint::of_bytes(key);
        let idem = self.idem.clone();
        let handler_time = self.storm.handler_time;
        let limit = self.storm.call_limit;
        let task = tokio::spawn(async move {
            let run = idem.run(scope, fingerprint, move |ctx| async move {
                tokio::time::sleep(handler_time).await;
                let body = format!(
                    "{} attempt {} {}",
                    ctx.scope().key().as_str(),
                    ctx.attempt(),
                    uuid::Uuid::new_v4()
                );
                Ok(StoredResponse::new(200, body)
                    .with_header("x-attempt", ctx.attempt().to_string()))
            });
            tokio::time::timeout(limit, run).await
        });
        match task.await {
            Ok(Ok(Ok(outcome))) => Ended::Outcome(outcome),
            Ok(Ok(Err(error))) => Ended::Error(error),
            Ok(Err(_elapsed)) => Ended::CutByHarness,
            Err(join) => Ended::Panicked(join.to_string()),
        }
    }

    /// Counts one call; for a failed one, whether to try its key again at
    /// once (after an error; a key in progress is left to its holder, and
    /// comes back among the retries of earlier keys).
    fn record(&self, key: &str, started: Instant, took: Duration, ended: Ended) -> Option<bool> {
        let mut tally = locked(&self.tally);
        let after_fault = tally.fault_end.is_some_and(|end| started >= end);
        let report = &mut tally.report;
        report.calls += 1;
        report.longest_call = report.longest_call.max(took);
        let (kind, description, same_key) = match ended {
            Ended::Outcome(outcome) => {
                match outcome {
                    RunOutcome::Executed(response) => {
                        report.executed += 1;
                        let scope = Scope::new(
                            self.tenant.clone(),
                            IdempotencyKey::new(key).expect("a valid key"),
                        );
                        report
                            .executed_keys
                            .entry(key.to_string())
                            .or_insert_with(|| ExecutedKey {
                                scope,
                                fingerprint: Fingerprint::of_bytes(key),
                                responses: Vec::new(),
                            })
                            .responses
                            .push(response);
                    }
                    RunOutcome::Replayed(response) => {
                        report.replayed += 1;
                        tally.replays.push((key.to_string(), response));
                    }
                }
                if after_fault && tally.recovered_at.is_none() {
                    tally.recovered_at = Some(Instant::now());
                }
                return None;
            }
            Ended::Error(error) => {
                let same_key = !matches!(error, RunError::InProgress { .. });
                let kind = error_type(&error);
                let description = (!expected(&error)).then(|| format!("{kind}: {error}"));
                (kind, description, same_key)
            }
            Ended::CutByHarness => {
                let kind = "harness timeout".to_string();
                let description = format!("{kind}: {key} still running after {took:?}");
                (kind, Some(description), true)
            }
            Ended::Panicked(message) => (
                "panic".to_string(),
                Some(format!("panic: {message}")),
                false,
            ),
        };
        *report.errors.entry(kind).or_default() += 1;
        if let Some(description) = description
            && report.unexpected.len() < MAX_DESCRIPTIONS
        {
            report.unexpected.push(description);
        }
        Some(same_key)
    }
}

/// What replaying every executed key showed; see [`check_replays`].
#[derive(Debug, Clone, Default)]
pub struct ReplayCheck {
    /// Keys checked: every key of [`StormReport::executed_keys`].
    pub checked: usize,
    /// Keys that replayed exactly the bytes their caller was last told.
    pub same: usize,
    /// Keys whose work ran again on the check (the store had lost the
    /// record), each as `key: why`.
    pub ran_again: Vec<String>,
    /// Keys that replayed other bytes, each as `key: what`.
    pub different: Vec<String>,
    /// Keys that no replay answered before the deadline, each as `key: last error`.
    pub unresolved: Vec<String>,
    /// Every key whose stored response was lost: told `Executed` more than
    /// once during the storm, ran again on the check, or replayed other bytes.
    pub lost: BTreeSet<String>,
}

impl ReplayCheck {
    /// `0 of 812` keys lost, as the table shows it.
    pub fn lost_line(&self) -> String {
        format!("{} of {}", self.lost.len(), self.checked)
    }

    /// Fails the test unless every replay answered before the deadline.
    ///
    /// # Panics
    ///
    /// When a key stayed unresolved.
    pub fn assert_resolved(&self) {
        assert!(
            self.unresolved.is_empty(),
            "{} of {} keys not replayed: {:?}",
            self.unresolved.len(),
            self.checked,
            &self.unresolved[..self.unresolved.len().min(MAX_DESCRIPTIONS)]
        );
    }

    /// Fails the test unless every key replayed the bytes its caller was
    /// told: what a durable store must show after any fault.
    ///
    /// # Panics
    ///
    /// When a key stayed unresolved or its response was lost.
    pub fn assert_nothing_lost(&self) {
        self.assert_resolved();
        assert!(
            self.lost.is_empty(),
            "{} of {} executed keys lost; ran again: {:?}; other bytes: {:?}",
            self.lost.len(),
            self.checked,
            &self.ran_again[..self.ran_again.len().min(MAX_DESCRIPTIONS)],
            &self.different[..self.different.len().min(MAX_DESCRIPTIONS)]
        );
    }
}

impl fmt::Display for ReplayCheck {
    /// `812 checked, 812 same, 0 ran again, 0 other bytes, 0 unresolved`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} checked, {} same, {} ran again, {} other bytes, {} unresolved",
            self.checked,
            self.same,
            self.ran_again.len(),
            self.different.len(),
            self.unresolved.len()
        )
    }
}

/// How many keys [`check_replays`] replays at once.
const CHECKERS: usize = 8;

/// Replays every key a storm's caller was told was executed, through the
/// runner as a client's retry would (with a handler that only notes that it
/// ran, and releases the claim), and compares the bytes with what the
/// caller was last told. A key held by a lease, or a store error, is tried
/// again until `deadline` has passed.
///
/// Call it after the fault, on a store that has recovered; on a durable
/// store, [`ReplayCheck::lost`] must be empty.
pub async fn check_replays<S: IdempotencyStore + ?Sized>(
    store: Arc<S>,
    report: &StormReport,
    deadline: Duration,
) -> ReplayCheck {
    let idem = Idempotency::new(store);
    let until = Instant::now() + deadline;
    let keys: Vec<(String, ExecutedKey)> = report
        .executed_keys
        .iter()
        .map(|(name, key)| (name.clone(), key.clone()))
        .collect();
    let keys = Arc::new(Mutex::new(keys));
    let check = Arc::new(Mutex::new(ReplayCheck {
        checked: report.executed_keys.len(),
        lost: report.reexecuted_keys(),
        ..ReplayCheck::default()
    }));
    let checkers: Vec<_> = (0..CHECKERS)
        .map(|_| {
            let idem = idem.clone();
            let keys = Arc::clone(&keys);
            let check = Arc::clone(&check);
            tokio::spawn(async move {
                loop {
                    let next = keys.lock().unwrap_or_else(|e| e.into_inner()).pop();
                    let Some((name, key)) = next else { return };
                    let verdict = replay(&idem, &key, until).await;
                    let mut check = check.lock().unwrap_or_else(|e| e.into_inner());
                    match verdict {
                        Verdict::Same => check.same += 1,
                        Verdict::RanAgain => {
                            check.ran_again.push(format!("{name}: no stored response"));
                            check.lost.insert(name);
                        }
                        Verdict::Different(what) => {
                            check.different.push(format!("{name}: {what}"));
                            check.lost.insert(name);
                        }
                        Verdict::Unresolved(why) => check.unresolved.push(format!("{name}: {why}")),
                    }
                }
            })
        })
        .collect();
    for checker in checkers {
        checker.await.expect("a replay checker panicked");
    }
    check.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

enum Verdict {
    Same,
    RanAgain,
    Different(String),
    Unresolved(String),
}

async fn replay<S: IdempotencyStore + ?Sized>(
    idem: &Idempotency<S>,
    key: &ExecutedKey,
    until: Instant,
) -> Verdict {
    let told = key
        .responses
        .last()
        .expect("an executed key has a response");
    loop {
        let ran = Arc::new(AtomicBool::new(false));
        let noted = Arc::clone(&ran);
        let attempt = idem.run(key.scope.clone(), key.fingerprint, move |_ctx| async move {
            noted.store(true, Ordering::SeqCst);
            Err::<StoredResponse, _>(HandlerError::not_started("a replay check ran the handler"))
        });
        let wait = match tokio::time::timeout(Duration::from_secs(5), attempt).await {
            Ok(Ok(outcome)) if outcome.response() == told => return Verdict::Same,
            Ok(Ok(outcome)) => {
                return Verdict::Different(format!(
                    "told {:?}, replayed {:?}",
                    String::from_utf8_lossy(told.body()),
                    String::from_utf8_lossy(outcome.response().body())
                ));
            }
            Ok(Err(_)) if ran.load(Ordering::SeqCst) => return Verdict::RanAgain,
            Ok(Err(RunError::InProgress { retry_after })) => {
                (retry_after, "in progress".to_string())
            }
            Ok(Err(error)) if expected(&error) => (Duration::from_millis(50), error.to_string()),
            Ok(Err(error)) => return Verdict::Unresolved(error.to_string()),
            Err(_elapsed) => (Duration::ZERO, "a replay took 5 s".to_string()),
        };
        let (pause, why) = wait;
        if Instant::now() + pause > until {
            return Verdict::Unresolved(why);
        }
        tokio::time::sleep(pause.max(Duration::from_millis(10))).await;
    }
}

/// One row of the faults table, in Markdown: fault, backend, longest call,
/// errors by type, recovery time, data lost.
pub fn table_row(fault: &str, backend: &str, report: &StormReport, check: &ReplayCheck) -> String {
    format!(
        "| {fault} | {backend} | {} | {} | {} | {} |",
        show(report.longest_call),
        report.errors_line(),
        report
            .recovery
            .map_or_else(|| "none within the limit".into(), show),
        check.lost_line(),
    )
}

/// When a backend test's fault strikes, once the storm is under way.
pub const STRIKE: Duration = Duration::from_millis(400);

/// What a storm through a fault came to; see [`Storm::run_and_check`].
#[derive(Debug, Clone)]
pub struct FaultRun {
    /// The fault, as the faults table names it.
    pub fault: String,
    /// What the storm's callers saw.
    pub report: StormReport,
    /// What replaying every executed key showed afterwards.
    pub check: ReplayCheck,
}

impl FaultRun {
    /// Fails the test unless the callers came through the fault (see
    /// [`StormReport::assert_came_through`], with a successful call within
    /// `recovery` of its end) and every executed key replayed its bytes
    /// ([`ReplayCheck::assert_nothing_lost`]): what a durable store must
    /// show after any fault.
    ///
    /// # Panics
    ///
    /// When one of these does not hold.
    pub fn assert_nothing_lost(&self, recovery: Duration) {
        self.report.assert_came_through(recovery);
        self.check.assert_nothing_lost();
    }
}

impl Storm {
    /// A backend's fault test in one call: [`run`](Self::run)s the storm on
    /// `store` while `fault` runs, replays every executed key
    /// ([`check_replays`], with `check` as its deadline), prints the faults
    /// table's row for `backend` ([`table_row`]) with the details under it,
    /// and returns what it found. `fault` returns its own name for the
    /// table once it has ended (it may count what it did).
    ///
    /// # Panics
    ///
    /// As [`run`](Self::run) and [`check_replays`].
    pub async fn run_and_check<S, F, Fut>(
        &self,
        backend: &str,
        store: Arc<S>,
        check: Duration,
        fault: F,
    ) -> FaultRun
    where
        S: IdempotencyStore + ?Sized,
        F: FnOnce() -> Fut,
        Fut: Future<Output = String>,
    {
        let mut name = String::new();
        let named = &mut name;
        let report = self
            .run(Arc::clone(&store), move || async move {
                *named = fault().await;
            })
            .await;
        let check = check_replays(store, &report, check).await;
        println!("{}", table_row(&name, backend, &report, &check));
        println!("  {report}");
        println!("  replays: {check}");
        FaultRun {
            fault: name,
            report,
            check,
        }
    }
}

/// The fault every backend's proxy can make: once the storm is under way
/// ([`STRIKE`]), `proxy` cuts every open connection again and again for 2 s,
/// after a random pause of 100 to 400 ms each time. Returns the fault's
/// name for the faults table, with the number of cuts.
pub async fn connections_cut_at_random(proxy: &FaultProxy) -> String {
    tokio::time::sleep(STRIKE).await;
    let cuts = proxy
        .cut_at_random(
            Duration::from_millis(100),
            Duration::from_millis(400),
            Duration::from_secs(2),
        )
        .await;
    format!("connections cut at random ×{cuts} in 2 s")
}

/// What a store promises on a stalled network, and the slack its test
/// allows: each call ends within the store's operation timeout (and
/// `margin`) in a retryable [`StoreError::Unavailable`] that says it timed
/// out, and once the network is back a retry gets its answer within
/// `recovery`. Used by the stall scenarios of this module, and by a
/// backend's own stalled calls ([`times_out`](Self::times_out),
/// [`retried`](Self::retried)).
#[derive(Debug, Clone, Copy)]
pub struct StallBounds {
    /// The store's name in its errors: `postgres`, `redis`, `dynamodb`.
    pub store: &'static str,
    /// The store's operation timeout.
    pub limit: Duration,
    /// How much later than `limit` a stalled call may end: scheduling
    /// slack, never a claim about speed.
    pub margin: Duration,
    /// How long a retry may keep meeting a retryable error once the network
    /// is back (a pool or a connection manager reconnects after a cut).
    pub recovery: Duration,
}

impl StallBounds {
    /// The bounds of the store named `store` whose operation timeout is
    /// `limit`: a margin of 1 s, recovery within 15 s.
    pub const fn new(store: &'static str, limit: Duration) -> Self {
        Self {
            store,
            limit,
            margin: Duration::from_secs(1),
            recovery: Duration::from_secs(15),
        }
    }

    /// Runs `call` on a stalled network: it must end in a retryable
    /// `Unavailable` of this store and of `operation` that says it timed
    /// out, within the limit and the margin. Prints and returns how long it
    /// took.
    ///
    /// # Panics
    ///
    /// When the call ends otherwise, or sooner or later than the bounds.
    pub async fn times_out<T: fmt::Debug>(
        &self,
        operation: Operation,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Duration {
        let started = Instant::now();
        let result = call.await;
        let took = started.elapsed();
        eprintln!("{} {operation} under a stall: {took:?}", self.store);
        match &result {
            Err(
                err @ StoreError::Unavailable {
                    store,
                    operation: failed,
                    message,
                    ..
                },
            ) if *store == self.store && *failed == operation && message.contains("timed out") => {
                assert!(err.is_retryable());
            }
            other => panic!("{operation} under a stall: expected a timeout, got {other:?}"),
        }
        let limit = self.limit;
        assert!(
            took >= limit && took <= limit + self.margin,
            "{operation} under a stall took {took:?}; the limit is {limit:?}"
        );
        took
    }

    /// Retries `call` while it fails with a retryable error, as a caller
    /// would once the network is back, and returns its first other answer.
    ///
    /// # Panics
    ///
    /// When `call` still fails retryably after `recovery`.
    pub async fn retried<T, F, Fut>(&self, what: &str, mut call: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let deadline = Instant::now() + self.recovery;
        loop {
            match call().await {
                Err(err) if err.is_retryable() => {
                    assert!(
                        Instant::now() < deadline,
                        "{what}: still unavailable after {:?}: {err}",
                        self.recovery
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                answer => return answer,
            }
        }
    }

    /// Claims `request` on a network that is not stalled, retrying as a
    /// caller would when a slow server makes the call outlast the limit
    /// (the same request, so a claim that did land is answered as its
    /// own), and returns the lease.
    ///
    /// # Panics
    ///
    /// When the answer is not `Claimed` for this owner.
    pub async fn claimed<S: IdempotencyStore + ?Sized>(
        &self,
        store: &S,
        request: &ClaimRequest,
    ) -> Lease {
        match self.retried("claim", || store.claim(request)).await {
            Ok(ClaimOutcome::Claimed { lease, .. }) if lease.owner() == request.owner() => lease,
            other => panic!("a claim before the stall: expected Claimed, got {other:?}"),
        }
    }
}

/// What a store answered, first, to an operation whose reply was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostReplyAnswers {
    /// The claim's first answer: `Claimed`, or a retryable error.
    pub claim: String,
    /// The completion's first answer: `Ok`, or a retryable error.
    pub complete: String,
}

/// Loses the reply to a claim, then to a completion, through `proxy` (which
/// stands between `store` and its server), and checks that every answer is
/// true to what `get` then shows: `Claimed` or `Ok` for what was done (never
/// `InProgress` about its own claim, never `LostLease` about its own
/// completion), or a retryable error after which the same request, sent
/// again, gets the true answer.
pub async fn lost_replies_are_answered_truthfully<S: IdempotencyStore + ?Sized>(
    store: &S,
    proxy: &FaultProxy,
) -> LostReplyAnswers {
    // Every statement and script once first, so the reply lost is the
    // operation's own and not a connection's set-up.
    let warm = long(&fresh_scope(), "warm");
    claim_and_complete(store, &warm, &response("warm")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let dropped = proxy.dropped_replies();

    let scope = fresh_scope();
    let request = long(&scope, "a");
    proxy.drop_next_reply();
    let first = store.claim(&request).await;
    let claim_answer = match &first {
        Ok(ClaimOutcome::Claimed { .. }) => "Claimed".to_string(),
        Err(e) if e.is_retryable() => format!("retryable: {e}"),
        other => panic!("a claim whose reply was lost answered {other:?}"),
    };
    let lease = match first {
        Ok(ClaimOutcome::Claimed { lease, .. }) => lease,
        _ => {
            eventually("the claim sent again", || async {
                match store.claim(&request).await {
                    Ok(ClaimOutcome::Claimed { lease, .. }) => Some(lease),
                    Err(e) if e.is_retryable() => None,
                    other => panic!("the claim sent again answered {other:?}"),
                }
            })
            .await
        }
    };
    assert_eq!(lease.owner(), request.owner());
    let record = store
        .get(&scope)
        .await
        .unwrap()
        .expect("the claimed record");
    assert!(record.is_in_flight());
    assert_eq!(record.owner(), request.owner());

    let done = response("done");
    // Let a pool's background ping of the connection pass first.
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.drop_next_reply();
    let first = store.complete(&lease, &done).await;
    let complete_answer = match &first {
        Ok(()) => "Ok".to_string(),
        Err(e) if e.is_retryable() => format!("retryable: {e}"),
        Err(e) => panic!("a completion whose reply was lost answered {e:?}"),
    };
    if first.is_err() {
        eventually("the completion sent again", || async {
            match store.complete(&lease, &done).await {
                Ok(()) => Some(()),
                Err(e) if e.is_retryable() => None,
                Err(e) => panic!("the completion sent again answered {e:?}"),
            }
        })
        .await;
    }
    let record = store
        .get(&scope)
        .await
        .unwrap()
        .expect("the completed record");
    assert_eq!(record.response(), Some(&done));
    assert_eq!(
        proxy.dropped_replies() - dropped,
        2,
        "the proxy did not lose both replies"
    );
    LostReplyAnswers {
        claim: claim_answer,
        complete: complete_answer,
    }
}

/// Expands to one `#[test]` per stall scenario that needs nothing of a
/// backend but its store behind a proxy:
/// [`a_claim_on_a_stalled_network_times_out_and_its_retry_gets_the_claim`]
/// and [`a_completion_on_a_stalled_network_times_out_and_its_retry_completes`],
/// each named after its scenario. Each test runs on a fresh multi-threaded
/// runtime with two workers, awaits the given expression for a
/// `(FaultProxy, store)` pair, and holds the store to the given
/// [`StallBounds`].
///
/// The scenario with the backend's own calls,
/// [`every_other_operation_on_a_stalled_network_times_out_and_its_retry_succeeds`],
/// is the backend's to write; a backend with no calls of its own under a
/// stall adds `every_other_operation` and has it as a test too.
///
/// ```ignore
/// // tests/timeouts.rs
/// const BOUNDS: StallBounds = StallBounds::new("mystore", LIMIT);
/// idem_conformance::stall_tests!(proxied_store(), BOUNDS, every_other_operation);
/// ```
#[macro_export]
macro_rules! stall_tests {
    ($proxied:expr, $bounds:expr, every_other_operation $(,)?) => {
        $crate::stall_tests!($proxied, $bounds);

        #[test]
        fn every_other_operation_on_a_stalled_network_times_out_and_its_retry_succeeds() {
            $crate::faults::__run_stalled(async {
                let (proxy, store) = $proxied.await;
                $crate::faults::every_other_operation_on_a_stalled_network_times_out_and_its_retry_succeeds(
                    &store,
                    &proxy,
                    &$bounds,
                    async |_, _| ::std::time::Duration::ZERO,
                )
                .await;
            });
        }
    };
    ($proxied:expr, $bounds:expr $(,)?) => {
        $crate::stall_tests! {@each $proxied, $bounds, [
            a_claim_on_a_stalled_network_times_out_and_its_retry_gets_the_claim,
            a_completion_on_a_stalled_network_times_out_and_its_retry_completes,
        ]}
    };
    (@each $proxied:expr, $bounds:expr, [$($scenario:ident),* $(,)?]) => {
        $(
            #[test]
            fn $scenario() {
                $crate::faults::__run_stalled(async {
                    let (proxy, store) = $proxied.await;
                    $crate::faults::$scenario(&store, &proxy, &$bounds).await;
                });
            }
        )*
    };
}

/// Runs a stall test on a fresh multi-threaded runtime with two workers;
/// what [`stall_tests!`](crate::stall_tests) expands to.
#[doc(hidden)]
pub fn __run_stalled(test: impl Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(test);
}

/// A claim on a network stalled by `proxy` (which stands between `store`
/// and its server) times out ([`StallBounds::times_out`]). It reaches the
/// server once the network resumes, or not: either way its retry, the same
/// request, is answered `Claimed` with this owner's lease at attempt 1, and
/// the record is this owner's, in flight.
///
/// # Panics
///
/// When the store answers otherwise.
pub async fn a_claim_on_a_stalled_network_times_out_and_its_retry_gets_the_claim<S>(
    store: &S,
    proxy: &FaultProxy,
    bounds: &StallBounds,
) where
    S: IdempotencyStore + ?Sized,
{
    // Every statement and script once first, so the stall meets the claim.
    bounds.claimed(store, &long(&fresh_scope(), "warm")).await;

    let scope = fresh_scope();
    let request = long(&scope, "a");
    proxy.stall();
    bounds
        .times_out(Operation::Claim, store.claim(&request))
        .await;
    proxy.resume();

    let retry = bounds
        .retried("claim", || store.claim(&request))
        .await
        .unwrap();
    let ClaimOutcome::Claimed { lease, .. } = retry else {
        panic!("the retry of a claim: expected Claimed, got {retry:?}")
    };
    assert_eq!(lease.owner(), request.owner());
    assert_eq!(lease.attempt(), 1);
    let record = bounds
        .retried("get", || store.get(&scope))
        .await
        .unwrap()
        .expect("the claimed record");
    assert_eq!(record.owner(), request.owner());
    assert!(record.is_in_flight(), "{record:?}");
}

/// A completion on a network stalled by `proxy` times out, and its
/// connections are cut before it reaches the server: the record is still in
/// flight once the network is back, and the retry, the same lease and
/// response, completes it.
///
/// # Panics
///
/// When the store answers otherwise.
pub async fn a_completion_on_a_stalled_network_times_out_and_its_retry_completes<S>(
    store: &S,
    proxy: &FaultProxy,
    bounds: &StallBounds,
) where
    S: IdempotencyStore + ?Sized,
{
    let scope = fresh_scope();
    let lease = bounds.claimed(store, &long(&scope, "a")).await;
    let done = response("done");

    proxy.stall();
    bounds
        .times_out(Operation::Complete, store.complete(&lease, &done))
        .await;
    proxy.cut_all();
    proxy.resume();

    let before = bounds.retried("get", || store.get(&scope)).await.unwrap();
    assert!(
        before.as_ref().is_some_and(|r| r.is_in_flight()),
        "the cut completion was written: {before:?}"
    );
    bounds
        .retried("complete", || store.complete(&lease, &done))
        .await
        .unwrap();
    let record = bounds
        .retried("get", || store.get(&scope))
        .await
        .unwrap()
        .expect("the record");
    assert_eq!(record.response(), Some(&done));
}

/// Renew, checkpoint, get and release on a network stalled by `proxy` each
/// time out, and so does every call of `also`, the backend's own (a purge
/// that sends a request, its transaction's calls), which gets the held
/// lease and a checkpoint and returns the longest time one of its calls
/// took. Then, with the network back and every connection cut, each
/// retry gets its answer: the renewal is this owner's, the checkpoint is
/// kept, the release frees the key.
///
/// # Panics
///
/// When the store answers otherwise.
pub async fn every_other_operation_on_a_stalled_network_times_out_and_its_retry_succeeds<S, F>(
    store: &S,
    proxy: &FaultProxy,
    bounds: &StallBounds,
    also: F,
) where
    S: IdempotencyStore + ?Sized,
    F: AsyncFnOnce(&Lease, &Checkpoint) -> Duration,
{
    let scope = fresh_scope();
    let lease = bounds.claimed(store, &long(&scope, "a")).await;
    let point = Checkpoint::new("charged", &7).unwrap();
    let renewal = Duration::from_secs(90);

    proxy.stall();
    let mut longest = bounds
        .times_out(Operation::Renew, store.renew(&lease, renewal))
        .await;
    longest = longest.max(
        bounds
            .times_out(Operation::Checkpoint, store.checkpoint(&lease, &point))
            .await,
    );
    longest = longest.max(bounds.times_out(Operation::Get, store.get(&scope)).await);
    longest = longest.max(
        bounds
            .times_out(Operation::Release, store.release(&lease))
            .await,
    );
    longest = longest.max(also(&lease, &point).await);
    eprintln!(
        "{}: the longest call under a stall took {longest:?}",
        bounds.store
    );
    proxy.cut_all();
    proxy.resume();

    let renewed = bounds
        .retried("renew", || store.renew(&lease, renewal))
        .await
        .unwrap();
    assert_eq!(renewed.owner(), lease.owner());
    bounds
        .retried("checkpoint", || store.checkpoint(&renewed, &point))
        .await
        .unwrap();
    let record = bounds
        .retried("get", || store.get(&scope))
        .await
        .unwrap()
        .expect("the record");
    assert_eq!(record.checkpoint(), Some(&point));
    bounds
        .retried("release", || store.release(&renewed))
        .await
        .unwrap();
    assert_eq!(
        bounds.retried("get", || store.get(&scope)).await.unwrap(),
        None
    );
}
