//! What each operation of a workload asks for: a key and a fingerprint.

use std::sync::atomic::{AtomicU64, Ordering};

use clap::ValueEnum;
use rand::Rng;
use rand_distr::{Distribution, Zipf};

/// The workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Workload {
    /// Claim then complete, on new keys.
    Fresh,
    /// Claim on completed keys.
    Replay,
    /// Every caller on the same key at once; one wins, the rest wait or replay.
    Contended,
    /// Keys from a Zipf distribution over 10,000 keys: about 30% duplicates
    /// and 5% mismatched payloads.
    Mixed,
}

impl Workload {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Fresh => "fresh",
            Self::Replay => "replay",
            Self::Contended => "contended",
            Self::Mixed => "mixed",
        }
    }
}

/// How many completed keys the replay workload draws from.
pub(crate) const REPLAY_KEYS: u64 = 1_000;
const ZIPF_KEYS: u64 = 10_000;

/// One operation: the key, and the 32-byte fingerprint of its payload.
#[derive(Debug, Clone)]
pub(crate) struct Op {
    pub(crate) key: String,
    pub(crate) fingerprint: [u8; 32],
}

impl Op {
    /// The `k`-th key of the replay workload, which a replay run completes first.
    pub(crate) fn replay(k: u64) -> Self {
        Self {
            key: format!("r-{k}"),
            fingerprint: fingerprint(k, 0),
        }
    }
}

/// A payload's fingerprint: opaque bytes, so a cheap derivation will do
/// (both modes send the same bytes; hashing is not what is measured here).
fn fingerprint(key_index: u64, variant: u8) -> [u8; 32] {
    let mut fp = [0u8; 32];
    fp[..8].copy_from_slice(&key_index.to_le_bytes());
    fp[8] = variant;
    fp[31] = 0x1d;
    fp
}

/// Generates operations; shared by all callers of one run.
pub(crate) struct Plan {
    workload: Workload,
    issued: AtomicU64,
    zipf: Zipf<f64>,
}

impl Plan {
    pub(crate) fn new(workload: Workload) -> Self {
        Self {
            workload,
            issued: AtomicU64::new(0),
            // Zipf over ranks 1..=10,000; exponent 1 (the classic shape).
            zipf: Zipf::new(ZIPF_KEYS as f64, 1.0).unwrap_or_else(|_| unreachable_zipf()),
        }
    }

    /// The `i`-th operation of caller `caller`.
    pub(crate) fn next(&self, caller: usize, i: u64, rng: &mut impl Rng) -> Op {
        match self.workload {
            Workload::Fresh => Op {
                key: format!("f-{caller}-{i}"),
                fingerprint: fingerprint(0, 0),
            },
            Workload::Replay => Op::replay(rng.random_range(0..REPLAY_KEYS)),
            Workload::Contended => Op {
                key: format!("c-{i}"),
                fingerprint: fingerprint(i, 0),
            },
            Workload::Mixed => {
                let issued = self.issued.load(Ordering::Relaxed);
                let roll: f64 = rng.random();
                if issued > 0 && roll < 0.35 {
                    // A retry of a recent key, the most recent the likeliest.
                    let rank = (self.zipf.sample(rng) as u64).clamp(1, issued.min(ZIPF_KEYS));
                    let k = issued - rank;
                    let variant = u8::from(roll < 0.05); // 5% carry another payload
                    Op {
                        key: format!("m-{k}"),
                        fingerprint: fingerprint(k, variant),
                    }
                } else {
                    let k = self.issued.fetch_add(1, Ordering::Relaxed);
                    Op {
                        key: format!("m-{k}"),
                        fingerprint: fingerprint(k, 0),
                    }
                }
            }
        }
    }
}

#[allow(clippy::panic)] // Zipf::new fails only for n < 1 or s < 0, constants here
fn unreachable_zipf() -> Zipf<f64> {
    panic!("Zipf parameters are constants")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use std::collections::HashMap;

    #[test]
    fn mixed_has_about_30_percent_duplicates_and_5_percent_mismatches() {
        let plan = Plan::new(Workload::Mixed);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut seen: HashMap<String, [u8; 32]> = HashMap::new();
        let (mut duplicates, mut mismatches, total) = (0, 0, 100_000);
        for i in 0..total {
            let op = plan.next(0, i, &mut rng);
            match seen.get(&op.key) {
                Some(fp) if *fp == op.fingerprint => duplicates += 1,
                Some(_) => mismatches += 1,
                None => {
                    seen.insert(op.key, op.fingerprint);
                }
            }
        }
        let share = |n: i32| f64::from(n) / total as f64;
        assert!(
            (0.27..0.33).contains(&share(duplicates)),
            "{}",
            share(duplicates)
        );
        assert!(
            (0.04..0.06).contains(&share(mismatches)),
            "{}",
            share(mismatches)
        );
    }

    #[test]
    fn contended_callers_share_keys_and_fresh_ones_never_do() {
        let plan = Plan::new(Workload::Contended);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        assert_eq!(plan.next(0, 5, &mut rng).key, plan.next(3, 5, &mut rng).key);
        let plan = Plan::new(Workload::Fresh);
        assert_ne!(plan.next(0, 5, &mut rng).key, plan.next(3, 5, &mut rng).key);
    }
}
