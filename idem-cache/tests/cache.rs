//! What the cache adds to a store: replays without the inner store, never
//! past the inner store's retention, within its bounds, and counted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use idem_cache::{CacheOptions, CachedStore};
use idem_conformance::support::{claim, claim_and_complete, fresh_scope, must_claim, response};
use idem_core::ManualClock;
use idem_core::store::{ClaimOutcome, ClaimRequest, IdempotencyStore, Timestamp};
use idem_core::{Fingerprint, InvalidInput, Scope, StoreError, StoredResponse};
use idem_memory::{MemoryOptions, MemoryStore};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A memory store on a manual clock, and the cache in front of it.
fn on_manual_clock(
    options: CacheOptions,
) -> (ManualClock, Arc<MemoryStore>, CachedStore<MemoryStore>) {
    let clock = ManualClock::new(Timestamp::from_unix_millis(1_700_000_000_000));
    let inner =
        Arc::new(MemoryStore::with_options(MemoryOptions::default().clock(clock.clone())).unwrap());
    let cache = CachedStore::with_options(Arc::clone(&inner), options).unwrap();
    (clock, inner, cache)
}

fn request(scope: &Scope, body: &str, retention: Duration) -> ClaimRequest {
    ClaimRequest::new(scope.clone(), Fingerprint::of_bytes(body))
        .with_retention(retention)
        .unwrap()
}

const MINUTE: Duration = Duration::from_secs(60);

#[test]
fn a_completed_record_replays_and_mismatches_without_the_inner_store() {
    runtime().block_on(async {
        let (_, inner, cache) = on_manual_clock(CacheOptions::default());
        let scope = fresh_scope();
        claim_and_complete(&cache, &request(&scope, "a", MINUTE), &response("done")).await;
        // Gone from the inner store: only the cache can still answer.
        assert!(inner.delete(&scope).await.unwrap());
        assert_eq!(
            claim(&cache, &request(&scope, "a", MINUTE)).await,
            ClaimOutcome::Completed(response("done"))
        );
        assert_eq!(
            claim(&cache, &request(&scope, "b", MINUTE)).await,
            ClaimOutcome::Mismatch
        );
    });
}

#[test]
fn a_completed_claim_from_the_inner_store_is_cached() {
    runtime().block_on(async {
        let (_, inner, cache) = on_manual_clock(CacheOptions::default());
        let scope = fresh_scope();
        claim_and_complete(&*inner, &request(&scope, "a", MINUTE), &response("done")).await;
        assert_eq!(cache.cached_records(), 0);
        assert_eq!(
            claim(&cache, &request(&scope, "a", MINUTE)).await,
            ClaimOutcome::Completed(response("done"))
        );
        assert_eq!(cache.cached_records(), 1);
        inner.delete(&scope).await.unwrap();
        assert_eq!(
            claim(&cache, &request(&scope, "a", MINUTE)).await,
            ClaimOutcome::Completed(response("done"))
        );
    });
}

#[test]
fn a_cached_completion_ends_with_the_inner_retention() {
    runtime().block_on(async {
        let (clock, _, cache) = on_manual_clock(CacheOptions::default());
        let scope = fresh_scope();
        let first = request(&scope, "a", MINUTE);
        claim_and_complete(&cache, &first, &response("done")).await;
        clock.advance(MINUTE - Duration::from_millis(1));
        assert!(matches!(
            claim(&cache, &first).await,
            ClaimOutcome::Completed(_)
        ));
        clock.advance(Duration::from_millis(1));
        let (lease, _) = must_claim(&cache, &request(&scope, "b", MINUTE)).await;
        assert_eq!(lease.attempt(), 1);
    });
}

#[test]
fn a_filled_replay_ends_with_the_retention_the_record_has_left() {
    runtime().block_on(async {
        let (clock, inner, cache) = on_manual_clock(CacheOptions::default());
        let scope = fresh_scope();
        let first = request(&scope, "a", MINUTE);
        claim_and_complete(&*inner, &first, &response("done")).await;
        clock.advance(Duration::from_secs(50));
        assert!(matches!(
            claim(&cache, &first).await,
            ClaimOutcome::Completed(_)
        ));
        clock.advance(Duration::from_secs(10));
        assert!(matches!(
            claim(&cache, &first).await,
            ClaimOutcome::Claimed { .. }
        ));
    });
}

#[test]
fn a_completion_delivered_again_keeps_the_first_deliverys_deadline() {
    runtime().block_on(async {
        let (clock, _, cache) = on_manual_clock(CacheOptions::default());
        let scope = fresh_scope();
        let first = request(&scope, "a", MINUTE);
        let lease = claim_and_complete(&cache, &first, &response("done")).await;
        clock.advance(Duration::from_secs(30));
        cache.complete(&lease, &response("done")).await.unwrap();
        // Retained from the first completion: a minute after it, not after the second.
        clock.advance(Duration::from_secs(30));
        assert!(matches!(
            claim(&cache, &first).await,
            ClaimOutcome::Claimed { .. }
        ));
    });
}

#[test]
fn time_to_live_ends_a_replay_before_its_retention() {
    runtime().block_on(async {
        let options = CacheOptions::default().time_to_live(Duration::from_secs(5));
        let (clock, inner, cache) = on_manual_clock(options);
        let scope = fresh_scope();
        let first = request(&scope, "a", MINUTE);
        claim_and_complete(&cache, &first, &response("done")).await;
        inner.delete(&scope).await.unwrap();
        clock.advance(Duration::from_secs(5));
        assert!(matches!(
            claim(&cache, &first).await,
            ClaimOutcome::Claimed { .. }
        ));
    });
}

#[test]
fn delete_evicts_the_cached_replay() {
    runtime().block_on(async {
        let (_, _, cache) = on_manual_clock(CacheOptions::default());
        let scope = fresh_scope();
        let first = request(&scope, "a", MINUTE);
        claim_and_complete(&cache, &first, &response("done")).await;
        assert!(cache.delete(&scope).await.unwrap());
        assert!(matches!(
            claim(&cache, &first).await,
            ClaimOutcome::Claimed { .. }
        ));
    });
}

#[test]
fn the_cache_keeps_within_its_entry_and_byte_bounds() {
    runtime().block_on(async {
        let (_, _, by_entries) = on_manual_clock(CacheOptions::default().max_entries(10));
        for i in 0..100 {
            let scope = Scope::parse("t", &format!("k-{i}")).unwrap();
            claim_and_complete(&by_entries, &request(&scope, "a", MINUTE), &response("x")).await;
        }
        let kept = by_entries.cached_records();
        assert!((1..=10).contains(&kept), "{kept} entries kept");

        let (_, inner, by_bytes) = on_manual_clock(CacheOptions::default().max_bytes(4096));
        let scope = fresh_scope();
        let big = StoredResponse::new(200, vec![7u8; 8192]);
        let first = request(&scope, "a", MINUTE);
        claim_and_complete(&by_bytes, &first, &big).await;
        assert_eq!(
            by_bytes.cached_records(),
            0,
            "a response over max_bytes was cached"
        );
        inner.delete(&scope).await.unwrap();
        assert!(matches!(
            claim(&by_bytes, &first).await,
            ClaimOutcome::Claimed { .. }
        ));
    });
}

#[test]
fn the_cache_reports_the_inner_stores_capabilities() {
    let inner = Arc::new(MemoryStore::new());
    let cache = CachedStore::new(Arc::clone(&inner));
    assert_eq!(cache.capabilities(), inner.capabilities());
    assert_eq!(cache.capabilities().store, "memory");
}

#[test]
fn options_are_validated_once() {
    let inner = Arc::new(MemoryStore::new());
    for (options, field) in [
        (CacheOptions::default().max_entries(0), "cache max_entries"),
        (CacheOptions::default().max_bytes(0), "cache max_bytes"),
        (
            CacheOptions::default().time_to_live(Duration::ZERO),
            "cache time_to_live",
        ),
    ] {
        match CachedStore::with_options(Arc::clone(&inner), options) {
            Err(StoreError::InvalidInput(InvalidInput::OutOfRange { field: got, .. })) => {
                assert_eq!(got, field)
            }
            other => panic!("{field}: {other:?}"),
        }
    }
}

#[test]
fn hits_and_misses_are_counted_by_store() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        runtime().block_on(async {
            let (_, _, cache) = on_manual_clock(CacheOptions::default());
            let scope = fresh_scope();
            let first = request(&scope, "a", MINUTE);
            claim_and_complete(&cache, &first, &response("done")).await; // a miss
            for _ in 0..3 {
                claim(&cache, &first).await; // hits
            }
            claim(&cache, &request(&scope, "b", MINUTE)).await; // a hit: a mismatch
        })
    });
    let counters: Vec<(String, Vec<String>, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) => Some((
                key.key().name().to_string(),
                key.key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect(),
                n,
            )),
            _ => None,
        })
        .collect();
    let store = vec!["store=memory".to_string()];
    assert!(
        counters.contains(&("idem_cache_hits_total".into(), store.clone(), 4)),
        "{counters:?}"
    );
    assert!(
        counters.contains(&("idem_cache_misses_total".into(), store, 1)),
        "{counters:?}"
    );
}
