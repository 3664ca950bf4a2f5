//! Micro-benchmarks: the price of canonical JSON over plain SHA-256, the
//! decision function, a claim plus completion on the memory store, and a
//! replay with and without the replay cache.

#![allow(clippy::unwrap_used)] // a benchmark fails loudly on a broken setup

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use idem_bench::json_of;
use idem_cache::CachedStore;
use idem_core::store::{ClaimOutcome, ClaimRequest, IdempotencyStore, Timestamp, decide};
use idem_core::{Fingerprint, Idempotency, Scope, StoredResponse};
use idem_memory::MemoryStore;
use sha2::{Digest, Sha256};

fn fingerprints(c: &mut Criterion) {
    let mut group = c.benchmark_group("fingerprint");
    for size in [1024, 64 * 1024] {
        let json = json_of(size);
        group.throughput(Throughput::Bytes(json.len() as u64));
        group.bench_with_input(
            BenchmarkId::new("canonical_json", size),
            &json,
            |b, json| b.iter(|| Fingerprint::json(black_box(json))),
        );
        group.bench_with_input(BenchmarkId::new("plain_sha256", size), &json, |b, json| {
            b.iter(|| Sha256::digest(black_box(json.as_bytes())))
        });
    }
    group.finish();
}

fn decision(c: &mut Criterion) {
    let request = ClaimRequest::new(
        Scope::parse("tenant", "key").unwrap(),
        Fingerprint::of_bytes("a"),
    );
    let now = Timestamp::from_unix_millis(1_000_000);
    let record = decide(None, &request, now).write.unwrap();
    c.bench_function("decide/absent", |b| {
        b.iter(|| decide(black_box(None), black_box(&request), now))
    });
    let duplicate = request.clone().with_new_owner();
    c.bench_function("decide/in_progress", |b| {
        b.iter(|| decide(black_box(Some(&record)), black_box(&duplicate), now))
    });
}

fn memory_store(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let store = MemoryStore::new();
    let response = StoredResponse::new(201, br#"{"order":"A-1","status":"placed"}"#.to_vec())
        .with_header("content-type", "application/json");
    let fingerprint = Fingerprint::of_bytes("order");
    let mut i = 0u64;
    c.bench_function("memory/claim_and_complete", |b| {
        b.iter(|| {
            i += 1;
            let scope = Scope::parse("bench", &format!("k-{i}")).unwrap();
            let request = ClaimRequest::new(scope, fingerprint)
                .with_retention(Duration::from_secs(60))
                .unwrap();
            runtime.block_on(async {
                let ClaimOutcome::Claimed { lease, .. } = store.claim(&request).await.unwrap()
                else {
                    unreachable!("fresh keys are claimed")
                };
                store.complete(&lease, &response).await.unwrap();
            })
        })
    });
}

/// Runs a future that needs no I/O to its end: a replay from memory
/// finishes on its first poll, so no runtime's overhead is measured.
fn ready<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => unreachable!("a replay from memory waits for nothing"),
    }
}

/// One replay of a completed key, as a store's claim and through the runner,
/// on the memory store with and without the replay cache in front of it.
fn replays(c: &mut Criterion) {
    let response = StoredResponse::new(201, br#"{"order":"A-1","status":"placed"}"#.to_vec())
        .with_header("content-type", "application/json");
    let scope = Scope::parse("bench", "replayed").unwrap();
    let fingerprint = Fingerprint::of_bytes("order");
    let memory: Arc<dyn IdempotencyStore> = Arc::new(MemoryStore::new());
    let cached: Arc<dyn IdempotencyStore> =
        Arc::new(CachedStore::new(Arc::new(MemoryStore::new())));
    let mut group = c.benchmark_group("replay");
    group.throughput(Throughput::Elements(1));
    for (name, store) in [("memory", memory), ("cache_over_memory", cached)] {
        let request = ClaimRequest::new(scope.clone(), fingerprint);
        ready(async {
            let ClaimOutcome::Claimed { lease, .. } = store.claim(&request).await.unwrap() else {
                unreachable!("a fresh key is claimed")
            };
            store.complete(&lease, &response).await.unwrap();
            // The cache fills on the first replay it sees, or here from the completion.
            store.claim(&request).await.unwrap();
        });
        group.bench_function(BenchmarkId::new("claim", name), |b| {
            b.iter(|| ready(store.claim(black_box(&request))).unwrap())
        });
        let idem = Idempotency::new(Arc::clone(&store));
        group.bench_function(BenchmarkId::new("run", name), |b| {
            b.iter(|| {
                ready(idem.run(scope.clone(), fingerprint, |_| async {
                    unreachable!("a completed key never runs") as Result<StoredResponse, _>
                }))
                .unwrap()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, fingerprints, decision, memory_store, replays);
criterion_main!(benches);
