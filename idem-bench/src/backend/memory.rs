//! The in-process store, and its raw baseline: the same decision on a moka
//! cache with per-entry expiry, as the store configures moka, keeping only
//! the decision's inputs. Nothing crosses a network, so nothing is counted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_bench::Outcome;
use idem_core::Scope;
use idem_core::store::storage_key;
use idem_memory::MemoryStore;
use moka::ops::compute::Op as MokaOp;
use moka::sync::Cache;

use super::{BenchError, Call, LEASE, Parts, RawBaseline, ServerCounter, Settings, completion};

/// Connects: a fresh store, and a fresh cache for the raw baseline.
pub(super) async fn connect(settings: &Settings<'_>) -> Result<Parts<Raw, Counter>, BenchError> {
    Ok(Parts {
        store: Arc::new(MemoryStore::new()),
        raw: Raw {
            cache: Cache::builder()
                .expire_after(RawExpiry(settings.retention))
                .build(),
        },
        counter: Counter,
    })
}

/// The raw baseline: records in a moka cache, decided in its `compute`.
pub(super) struct Raw {
    cache: Cache<String, Arc<RawRecord>>,
}

/// What the raw baseline keeps: the decision's inputs, nothing more.
#[derive(Clone)]
struct RawRecord {
    fingerprint: [u8; 32],
    owner: u64,
    done: bool,
    lease_until: Instant,
    body: Vec<u8>,
}

/// Expires each raw record at its retention, like the store's per-entry expiry.
struct RawExpiry(Duration);

impl moka::Expiry<String, Arc<RawRecord>> for RawExpiry {
    fn expire_after_create(
        &self,
        _key: &String,
        _value: &Arc<RawRecord>,
        _created_at: Instant,
    ) -> Option<Duration> {
        Some(self.0)
    }

    fn expire_after_update(
        &self,
        _key: &String,
        _value: &Arc<RawRecord>,
        _updated_at: Instant,
        _remaining: Option<Duration>,
    ) -> Option<Duration> {
        Some(self.0)
    }
}

impl RawBaseline for Raw {
    async fn execute(&self, call: &Call<'_>) -> Result<Outcome, BenchError> {
        let (tenant, op, body) = (call.tenant, call.op, &call.response);
        let now = Instant::now();
        let owner = rand::random::<u64>();
        let key = storage_key(&Scope::parse(tenant, &op.key)?);
        let mut outcome = Outcome::Executed;
        self.cache
            .entry(key.clone())
            .and_compute_with(|entry| match entry {
                Some(e) => {
                    let r = e.value();
                    if r.fingerprint != op.fingerprint {
                        outcome = Outcome::Mismatch;
                        MokaOp::Nop
                    } else if r.done {
                        // A replay hands the stored body back, as the store does.
                        std::hint::black_box(r.body.clone());
                        outcome = Outcome::Replayed;
                        MokaOp::Nop
                    } else if r.lease_until > now {
                        outcome = Outcome::InProgress;
                        MokaOp::Nop
                    } else {
                        MokaOp::Put(Arc::new(RawRecord {
                            owner,
                            lease_until: now + LEASE,
                            ..(**r).clone()
                        }))
                    }
                }
                None => MokaOp::Put(Arc::new(RawRecord {
                    fingerprint: op.fingerprint,
                    owner,
                    done: false,
                    lease_until: now + LEASE,
                    body: Vec::new(),
                })),
            });
        if outcome != Outcome::Executed {
            return Ok(outcome);
        }
        let mut completed = false;
        self.cache.entry(key).and_compute_with(|entry| match entry {
            Some(e) if e.value().owner == owner && !e.value().done => {
                completed = true;
                MokaOp::Put(Arc::new(RawRecord {
                    done: true,
                    body: body.body().to_vec(),
                    ..(**e.value()).clone()
                }))
            }
            _ => MokaOp::Nop,
        });
        completion(completed)
    }
}

/// No server, no round trips.
pub(super) struct Counter;

impl ServerCounter for Counter {
    async fn round_trips(&self) -> Result<u64, BenchError> {
        Ok(0)
    }
}
