//! The consumer's own count of failed attempts per message: what parks a
//! message, never the broker's delivery counter (which also counts copies
//! no consumer ever settled: one held past the ack wait, one dropped with
//! an aborted task).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use idem_core::IdempotencyKey;

/// How many messages' counts a consumer keeps at most: past it the oldest
/// count is forgotten, so that message is tried a few more times before it
/// parks (never fewer).
pub(crate) const REMEMBERED: usize = 65_536;

/// Failed attempts per message id, shared by a consumer's clones.
#[derive(Debug, Default)]
pub(crate) struct Failures {
    inner: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    counts: HashMap<IdempotencyKey, u32>,
    /// Ids in the order they were first counted; some forgotten since.
    order: VecDeque<IdempotencyKey>,
}

impl Failures {
    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        // A count is a number: a panic elsewhere leaves it whole.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one more failed attempt at `id`; answers the count.
    pub(crate) fn fail(&self, id: &IdempotencyKey) -> u32 {
        let mut counts = self.counts();
        let Counts { counts: map, order } = &mut *counts;
        if let Some(count) = map.get_mut(id) {
            *count = count.saturating_add(1);
            return *count;
        }
        while map.len() >= REMEMBERED {
            match order.pop_front() {
                Some(oldest) => {
                    map.remove(&oldest);
                }
                None => break,
            }
        }
        // Forgotten ids stay in the order until they come up: compacted
        // once they outnumber the counted ones.
        if order.len() >= REMEMBERED.saturating_mul(2) {
            order.retain(|key| map.contains_key(key));
        }
        map.insert(id.clone(), 1);
        order.push_back(id.clone());
        1
    }

    /// The failed attempts counted at `id`.
    pub(crate) fn count(&self, id: &IdempotencyKey) -> u32 {
        self.counts().counts.get(id).copied().unwrap_or(0)
    }

    /// `id` is settled for good (applied, a duplicate, parked): its count
    /// goes.
    pub(crate) fn forget(&self, id: &IdempotencyKey) {
        let mut counts = self.counts();
        if counts.counts.is_empty() {
            return;
        }
        counts.counts.remove(id);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn key(n: usize) -> IdempotencyKey {
        IdempotencyKey::new(format!("m-{n}")).unwrap()
    }

    #[test]
    fn each_failure_counts_once_and_a_settled_message_starts_again() {
        let failures = Failures::default();
        assert_eq!(failures.fail(&key(1)), 1);
        assert_eq!(failures.fail(&key(1)), 2);
        assert_eq!(failures.fail(&key(2)), 1);
        assert_eq!(failures.count(&key(1)), 2);
        failures.forget(&key(1));
        assert_eq!(failures.count(&key(1)), 0);
        assert_eq!(failures.fail(&key(1)), 1);
    }

    #[test]
    fn past_the_most_remembered_the_oldest_count_goes_first() {
        let failures = Failures::default();
        for n in 0..REMEMBERED {
            failures.fail(&key(n));
        }
        failures.fail(&key(0));
        failures.fail(&key(REMEMBERED));
        assert_eq!(failures.count(&key(0)), 0, "the oldest went");
        assert_eq!(failures.count(&key(1)), 1);
        assert_eq!(failures.count(&key(REMEMBERED)), 1);
        assert!(failures.counts().counts.len() <= REMEMBERED);
        // Forgotten and counted again many times: the order stays bounded.
        for round in 0..3 {
            for n in 0..REMEMBERED {
                let id = key(REMEMBERED * (round + 2) + n);
                failures.fail(&id);
                failures.forget(&id);
            }
        }
        assert!(failures.counts().order.len() <= REMEMBERED * 2);
    }
}
