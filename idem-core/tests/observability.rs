//! What the runner reports: a test subscriber sees its spans and a test
//! recorder its metrics, for every outcome of a run, and neither ever sees
//! the key.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::ManualClock;
use idem_core::observability::{
    CLAIMS, HANDLER_DURATION, LOST_LEASES, RELEASES, RUN_SPAN, STORE_OPERATION_DURATION, STORE_SPAN,
};
use idem_core::store::{
    ClaimOutcome, ClaimRequest, IdempotencyStore, OperationLayer, Timestamp, Transaction,
};
use idem_core::{
    Checkpoint, Fingerprint, HandlerError, Idempotency, Operation, RunError, Scope, StoreError,
    StoredResponse,
};
use idem_memory::{MemoryOptions, MemoryStore};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Subscriber, subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::{LookupSpan, Registry};

/// A span as it closed: its name, its fields and its parent's name.
#[derive(Debug, Clone, Default)]
struct Seen {
    name: &'static str,
    parent: Option<&'static str>,
    fields: BTreeMap<String, String>,
}

impl Seen {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

impl Visit for Seen {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.fields
            .insert(field.name().to_string(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.fields
            .insert(field.name().to_string(), value.to_string());
    }
}

/// Keeps every span that closes.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Seen>>>);

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut seen = Seen {
            name: attrs.metadata().name(),
            parent: span.parent().map(|p| p.name()),
            ..Seen::default()
        };
        attrs.record(&mut seen);
        span.extensions_mut().insert(seen);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(seen) = span.extensions_mut().get_mut::<Seen>()
        {
            values.record(seen);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id)
            && let Some(seen) = span.extensions().get::<Seen>()
        {
            self.0.lock().unwrap().push(seen.clone());
        }
    }
}

/// What a recorder saw of one metric: a counter's count, or a histogram's
/// number of observations.
type Metrics = BTreeMap<(String, Vec<(String, String)>), u64>;

/// What one scenario reported.
struct Reported {
    spans: Vec<Seen>,
    metrics: Metrics,
}

impl Reported {
    fn runs(&self) -> Vec<&Seen> {
        self.spans.iter().filter(|s| s.name == RUN_SPAN).collect()
    }

    /// The store spans of `operation`, in the order they closed.
    fn operations(&self, operation: Operation) -> Vec<&Seen> {
        self.spans
            .iter()
            .filter(|s| s.name == STORE_SPAN && s.field("operation") == Some(operation.as_str()))
            .collect()
    }

    /// The store spans of `operation` made inside a run (directly or by
    /// its handler), in the order they closed.
    fn in_runs(&self, operation: Operation) -> Vec<&Seen> {
        self.operations(operation)
            .into_iter()
            .filter(|s| s.parent == Some(RUN_SPAN))
            .collect()
    }

    fn metric(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let mut labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        labels.sort();
        self.metrics
            .get(&(name.to_string(), labels))
            .copied()
            .unwrap_or(0)
    }
}

/// Runs `scenario` on a memory store on a manual clock, under a capturing
/// subscriber and a debugging recorder.
fn observe<F, Fut>(scenario: F) -> Reported
where
    F: FnOnce(Arc<MemoryStore>, ManualClock) -> Fut,
    Fut: Future<Output = ()>,
{
    let capture = Capture::default();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let subscriber = Registry::default().with(capture.clone());
    subscriber::with_default(subscriber, || {
        metrics::with_local_recorder(&recorder, || {
            let clock = ManualClock::new(Timestamp::from_unix_millis(1_700_000_000_000));
            let store = Arc::new(
                MemoryStore::with_options(MemoryOptions::default().clock(clock.clone())).unwrap(),
            );
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(scenario(store, clock));
        })
    });
    let mut metrics = Metrics::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let mut labels: Vec<(String, String)> = key
            .key()
            .labels()
            .map(|l| (l.key().to_string(), l.value().to_string()))
            .collect();
        labels.sort();
        let count = match value {
            DebugValue::Counter(n) => n,
            DebugValue::Histogram(values) => values.len() as u64,
            DebugValue::Gauge(_) => continue,
        };
        metrics.insert((key.key().name().to_string(), labels), count);
    }
    let spans = capture.0.lock().unwrap().clone();
    Reported { spans, metrics }
}

const SECRET_KEY: &str = "customer-42@example.com";

fn scope() -> Scope {
    Scope::parse("acme", SECRET_KEY).unwrap()
}

fn ok(text: &str) -> Result<StoredResponse, HandlerError> {
    Ok(StoredResponse::new(200, text))
}

fn runner(store: &Arc<MemoryStore>) -> Idempotency<MemoryStore> {
    Idempotency::new(Arc::clone(store))
        .with_lease(Duration::from_secs(10))
        .unwrap()
}

#[test]
fn a_fresh_run_reports_a_claimed_and_a_completed_operation_in_its_span() {
    let reported = observe(|store, _| async move {
        runner(&store)
            .run(scope(), Fingerprint::of_bytes("a"), |_| async {
                ok("done")
            })
            .await
            .unwrap();
    });
    let [run] = reported.runs()[..] else {
        panic!("{:?}", reported.spans)
    };
    assert_eq!(run.field("outcome"), Some("executed"));
    assert_eq!(run.field("attempt"), Some("1"));
    assert_eq!(run.field("store"), Some("memory"));
    assert_eq!(run.field("tenant"), Some("acme"));
    assert_eq!(run.field("transactional"), Some("false"));
    let [claim] = reported.operations(Operation::Claim)[..] else {
        panic!("{:?}", reported.spans)
    };
    assert_eq!(claim.field("outcome"), Some("claimed"));
    assert_eq!(claim.field("attempt"), Some("1"));
    assert_eq!(claim.parent, Some(RUN_SPAN));
    let [complete] = reported.operations(Operation::Complete)[..] else {
        panic!("{:?}", reported.spans)
    };
    assert_eq!(complete.field("outcome"), Some("ok"));
    assert_eq!(complete.parent, Some(RUN_SPAN));

    let store = [("store", "memory")];
    let claimed = [("outcome", "claimed"), ("store", "memory")];
    assert_eq!(reported.metric(CLAIMS, &claimed), 1);
    for operation in ["claim", "complete"] {
        let labels = [("operation", operation), ("store", "memory")];
        assert_eq!(reported.metric(STORE_OPERATION_DURATION, &labels), 1);
    }
    assert_eq!(reported.metric(HANDLER_DURATION, &store), 1);
}

#[test]
fn a_replay_a_duplicate_and_a_reused_key_report_their_outcomes() {
    let reported = observe(|store, _| async move {
        let idem = runner(&store);
        let done = Fingerprint::of_bytes("a");
        idem.run(scope(), done, |_| async { ok("done") })
            .await
            .unwrap();
        assert!(
            idem.run(scope(), done, |_| async { ok("again") })
                .await
                .unwrap()
                .is_replay()
        );
        let reused = idem
            .run(scope(), Fingerprint::of_bytes("b"), |_| async { ok("b") })
            .await;
        assert!(matches!(reused, Err(RunError::Mismatch)));
        let busy = Scope::parse("acme", "busy").unwrap();
        let held = ClaimRequest::new(busy.clone(), done);
        store.claim(&held).await.unwrap();
        let duplicate = idem.run(busy, done, |_| async { ok("dup") }).await;
        assert!(matches!(duplicate, Err(RunError::InProgress { .. })));
    });
    let outcomes: Vec<_> = reported.runs().iter().map(|r| r.field("outcome")).collect();
    assert_eq!(
        outcomes,
        [
            Some("executed"),
            Some("replayed"),
            Some("mismatch"),
            Some("in_progress")
        ]
    );
    let claims: Vec<_> = reported
        .in_runs(Operation::Claim)
        .iter()
        .map(|c| c.field("outcome"))
        .collect();
    assert_eq!(
        claims,
        [
            Some("claimed"),
            Some("replayed"),
            Some("mismatch"),
            Some("in_progress")
        ]
    );
    // The claim made on the store directly has its span too, outside any run.
    let all = reported.operations(Operation::Claim);
    assert_eq!(all.len(), 5);
    assert_eq!(all[3].parent, None);
    assert_eq!(all[3].field("outcome"), Some("claimed"));
    // Refused runs name no attempt: nobody holds a lease for them.
    assert_eq!(reported.runs()[1].field("attempt"), None);
    for (outcome, count) in [
        ("claimed", 2),
        ("replayed", 1),
        ("mismatch", 1),
        ("in_progress", 1),
    ] {
        let labels = [("outcome", outcome), ("store", "memory")];
        assert_eq!(reported.metric(CLAIMS, &labels), count, "{outcome}");
    }
    let claims = [("operation", "claim"), ("store", "memory")];
    assert_eq!(reported.metric(STORE_OPERATION_DURATION, &claims), 5);
}

#[test]
fn a_takeover_reports_its_attempt_and_is_counted() {
    let reported = observe(|store, clock| async move {
        let fingerprint = Fingerprint::of_bytes("a");
        let first = ClaimRequest::new(scope(), fingerprint)
            .with_lease(Duration::from_secs(10))
            .unwrap();
        store.claim(&first).await.unwrap();
        clock.advance(Duration::from_secs(11));
        let outcome = runner(&store)
            .run(scope(), fingerprint, |ctx| async move {
                ok(&format!("attempt {}", ctx.attempt()))
            })
            .await
            .unwrap();
        assert_eq!(outcome.response().body(), b"attempt 2");
    });
    let [run] = reported.runs()[..] else {
        panic!("{:?}", reported.spans)
    };
    assert_eq!(run.field("attempt"), Some("2"));
    assert_eq!(run.field("outcome"), Some("executed"));
    let [claim] = reported.in_runs(Operation::Claim)[..] else {
        panic!("{:?}", reported.spans)
    };
    assert_eq!(claim.field("outcome"), Some("takeover"));
    assert_eq!(claim.field("attempt"), Some("2"));
    let takeover = [("outcome", "takeover"), ("store", "memory")];
    assert_eq!(reported.metric(CLAIMS, &takeover), 1);
}

#[test]
fn a_lost_lease_is_reported_on_the_completion_and_the_run_and_counted() {
    let reported = observe(|store, clock| async move {
        let fingerprint = Fingerprint::of_bytes("a");
        let taken = Arc::clone(&store);
        let outcome = runner(&store)
            .run(scope(), fingerprint, |_| async move {
                // Meanwhile the lease runs out and another owner finishes.
                clock.advance(Duration::from_secs(11));
                let retry = ClaimRequest::new(scope(), fingerprint);
                let ClaimOutcome::Claimed { lease, .. } = taken.claim(&retry).await.unwrap() else {
                    panic!("no takeover")
                };
                taken
                    .complete(&lease, &StoredResponse::new(200, "theirs"))
                    .await
                    .unwrap();
                ok("mine")
            })
            .await;
        assert!(matches!(outcome, Err(RunError::LostLease)));
    });
    let [run] = reported.runs()[..] else {
        panic!("{:?}", reported.spans)
    };
    assert_eq!(run.field("outcome"), Some("lost_lease"));
    // The other owner's completion (made inside the handler), then the run's.
    let [theirs, complete] = reported.in_runs(Operation::Complete)[..] else {
        panic!("{:?}", reported.spans)
    };
    assert_eq!(theirs.field("outcome"), Some("ok"));
    assert_eq!(theirs.field("attempt"), Some("2"));
    assert_eq!(complete.field("outcome"), Some("lost_lease"));
    assert_eq!(complete.field("attempt"), Some("1"));
    let lost = [("operation", "complete"), ("store", "memory")];
    assert_eq!(reported.metric(LOST_LEASES, &lost), 1);
}

#[test]
fn a_handler_that_did_not_start_releases_and_one_that_failed_keeps_the_claim() {
    let reported = observe(|store, _| async move {
        let idem = runner(&store);
        let rejected = idem
            .run(scope(), Fingerprint::of_bytes("a"), |_| async {
                Err::<StoredResponse, _>(HandlerError::not_started("invalid"))
            })
            .await;
        assert!(matches!(rejected, Err(RunError::NotStarted(_))));
        let failed = idem
            .run(scope(), Fingerprint::of_bytes("a"), |ctx| async move {
                ctx.checkpoint("charged", &1).await?;
                Err::<StoredResponse, _>("crashed".into())
            })
            .await;
        assert!(matches!(failed, Err(RunError::Failed(_))));
    });
    let outcomes: Vec<_> = reported.runs().iter().map(|r| r.field("outcome")).collect();
    assert_eq!(outcomes, [Some("not_started"), Some("failed")]);
    let [release] = reported.operations(Operation::Release)[..] else {
        panic!("{:?}", reported.spans)
    };
    assert_eq!(release.field("outcome"), Some("ok"));
    let [checkpoint] = reported.operations(Operation::Checkpoint)[..] else {
        panic!("{:?}", reported.spans)
    };
    assert_eq!(checkpoint.field("outcome"), Some("ok"));
    assert_eq!(checkpoint.parent, Some(RUN_SPAN));
    assert_eq!(reported.metric(RELEASES, &[("store", "memory")]), 1);
    assert_eq!(reported.metric(HANDLER_DURATION, &[("store", "memory")]), 2);
}

/// A transaction whose store cannot be reached, reporting through its
/// layer as a backend's transaction does.
struct Unreachable(OperationLayer);

#[idem_core::async_trait]
impl Transaction for Unreachable {
    async fn complete(
        &mut self,
        _: &idem_core::store::Lease,
        _: &StoredResponse,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    async fn checkpoint(
        &mut self,
        _: &idem_core::store::Lease,
        _: &Checkpoint,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    async fn commit(self) -> Result<(), StoreError> {
        let refused = async {
            Err(StoreError::unavailable(
                "memory",
                Operation::Transaction,
                "connection reset",
            ))
        };
        self.0.call(Operation::Transaction, None, refused).await
    }
}

#[test]
fn a_transactional_run_whose_commit_fails_reports_an_error_and_releases() {
    let reported = observe(|store, _| async move {
        let outcome = runner(&store)
            .run_in(
                scope(),
                Fingerprint::of_bytes("a"),
                async {
                    let layer = OperationLayer::unlimited("memory");
                    let opened = layer.call(Operation::Transaction, None, async { Ok(()) });
                    opened.await.map(|()| Unreachable(layer))
                },
                |_, tx| async move { Ok((tx, StoredResponse::new(201, "placed"))) },
            )
            .await;
        assert!(matches!(outcome, Err(RunError::Store(_))), "{outcome:?}");
    });
    let [run] = reported.runs()[..] else {
        panic!("{:?}", reported.spans)
    };
    assert_eq!(run.field("transactional"), Some("true"));
    assert_eq!(run.field("outcome"), Some("error"));
    let transaction: Vec<_> = reported
        .operations(Operation::Transaction)
        .iter()
        .map(|t| (t.field("outcome"), t.field("error").is_some()))
        .collect();
    // Opened, then the commit failed.
    assert_eq!(transaction, [(Some("ok"), false), (Some("error"), true)]);
    assert_eq!(reported.metric(RELEASES, &[("store", "memory")]), 1);
}

#[test]
fn spans_carry_the_key_hash_and_never_the_key() {
    let reported = observe(|store, _| async move {
        let idem = runner(&store);
        for body in ["a", "a", "b"] {
            let _ = idem
                .run(scope(), Fingerprint::of_bytes(body), |_| async {
                    ok("done")
                })
                .await;
        }
    });
    assert!(reported.spans.len() >= 7, "{:?}", reported.spans);
    let hash = scope().key().redacted();
    for span in &reported.spans {
        assert_eq!(span.field("key_hash"), Some(hash.as_str()), "{span:?}");
        for (name, value) in &span.fields {
            assert!(
                !value.contains(SECRET_KEY),
                "{} {name} = {value}",
                span.name
            );
        }
    }
    for (name, labels) in reported.metrics.keys() {
        assert!(
            labels.iter().all(|(_, v)| !v.contains(SECRET_KEY)),
            "{name} {labels:?}"
        );
    }
}
