//! Deliveries in flight: at most a number handled at once, never two of one
//! aggregate, each aggregate's in version order (those without a version
//! first), else in the order they were received.

use std::collections::{HashMap, HashSet, VecDeque};

use tokio::sync::mpsc;
use tokio::task::{Id, JoinError, JoinSet};

/// Which received deliveries may start, and which wait: at most `slots`
/// handled at once, and behind an aggregate being handled, its other
/// deliveries, the lowest version first (one without a version before any
/// with one), then in the order received (a delivery without an aggregate
/// waits only for a slot). Versions go first so that a predecessor
/// received after its successors (a redelivery, another process's copy)
/// is not made to wait behind the gaps they are.
#[derive(Debug)]
pub(crate) struct Lanes<D> {
    slots: usize,
    max_waiting: usize,
    running: usize,
    /// Each aggregate with a delivery started or ready, and those received
    /// behind it, each with its version.
    busy: HashMap<String, VecDeque<(Option<u64>, D)>>,
    /// Deliveries free to start, waiting for a slot, oldest first.
    ready: VecDeque<(Option<String>, D)>,
    /// Deliveries received and not started: in `busy`'s queues or `ready`.
    waiting: usize,
}

impl<D> Lanes<D> {
    /// Lanes of `slots` at once, taking more deliveries only while fewer
    /// than `max_waiting` wait.
    pub(crate) fn new(slots: usize, max_waiting: usize) -> Self {
        Self {
            slots: slots.max(1),
            max_waiting,
            running: 0,
            busy: HashMap::new(),
            ready: VecDeque::new(),
            waiting: 0,
        }
    }

    /// Whether another delivery may be received: a slot is free and few
    /// enough wait behind their aggregates.
    pub(crate) fn has_room(&self) -> bool {
        self.running < self.slots && self.waiting < self.max_waiting
    }

    /// Whether nothing is handled and nothing waits.
    pub(crate) fn is_idle(&self) -> bool {
        self.running == 0 && self.waiting == 0
    }

    /// The deliveries received and not started: behind their aggregates,
    /// or ready for a slot.
    pub(crate) fn held(&self) -> impl Iterator<Item = &D> {
        self.busy
            .values()
            .flatten()
            .map(|(_, delivery)| delivery)
            .chain(self.ready.iter().map(|(_, delivery)| delivery))
    }

    /// Takes a received `delivery` of `aggregate` at `version`; it is
    /// returned when it may start now, kept to start later otherwise.
    pub(crate) fn admit(
        &mut self,
        aggregate: Option<String>,
        version: Option<u64>,
        delivery: D,
    ) -> Option<D> {
        if let Some(name) = &aggregate {
            if let Some(behind) = self.busy.get_mut(name) {
                behind.push_back((version, delivery));
                self.waiting += 1;
                return None;
            }
            self.busy.insert(name.clone(), VecDeque::new());
        }
        if self.running < self.slots {
            self.running += 1;
            return Some(delivery);
        }
        self.ready.push_back((aggregate, delivery));
        self.waiting += 1;
        None
    }

    /// A delivery of `aggregate` was handled: the deliveries to start now,
    /// each with its aggregate.
    pub(crate) fn finished(&mut self, aggregate: Option<&str>) -> Vec<(Option<String>, D)> {
        self.running = self.running.saturating_sub(1);
        if let Some(name) = aggregate {
            match self.busy.get_mut(name).and_then(lowest) {
                Some(next) => self.ready.push_back((Some(name.to_string()), next)),
                None => {
                    self.busy.remove(name);
                }
            }
        }
        let mut start = Vec::new();
        while self.running < self.slots {
            let Some(next) = self.ready.pop_front() else {
                break;
            };
            self.waiting -= 1;
            self.running += 1;
            start.push(next);
        }
        start
    }
}

/// The next of an aggregate's waiting deliveries: the lowest version
/// (none lowest of all), the first received among equals.
fn lowest<D>(behind: &mut VecDeque<(Option<u64>, D)>) -> Option<D> {
    let at = behind
        .iter()
        .enumerate()
        .min_by_key(|(at, (version, _))| (*version, *at))
        .map(|(at, _)| at)?;
    behind.remove(at).map(|(_, delivery)| delivery)
}

/// The tasks handling batches of deliveries (each ending in a `T`), each
/// known by its deliveries' aggregates. A task may say, before it ends,
/// that some of its deliveries are committed ([`Committed::say`]): their
/// aggregates go on while it settles them, and it counts as settling, no
/// longer as handling. Dropped (as `run` is), it lets them finish: a
/// batch is never cut between its statements.
pub(crate) struct Tasks<T: 'static> {
    set: JoinSet<T>,
    /// By task, its deliveries' aggregates in the batch's order; `None`
    /// for one already said handled.
    aggregates: HashMap<Id, Vec<Option<Option<String>>>>,
    /// The tasks that said so, settling.
    settling: HashSet<Id>,
    said: mpsc::UnboundedSender<(Id, Vec<usize>)>,
    heard: mpsc::UnboundedReceiver<(Id, Vec<usize>)>,
}

impl<T: 'static> Default for Tasks<T> {
    fn default() -> Self {
        let (said, heard) = mpsc::unbounded_channel();
        Self {
            set: JoinSet::new(),
            aggregates: HashMap::new(),
            settling: HashSet::new(),
            said,
            heard,
        }
    }
}

/// A handled batch's aggregates and how its task ended.
pub(crate) type Joined<T> = (Vec<Option<String>>, Result<T, JoinError>);

/// How a task says which of its deliveries its commit took.
pub(crate) struct Committed(mpsc::UnboundedSender<(Id, Vec<usize>)>);

impl Committed {
    /// The deliveries at `positions` of the task's batch are handled
    /// (committed): their aggregates may go on. Said from inside the task,
    /// once.
    pub(crate) fn say(self, positions: Vec<usize>) {
        // Outside a task there is no one to tell; the join says it all.
        if let Some(id) = tokio::task::try_id()
            && !positions.is_empty()
        {
            // Gone only with the `Tasks`, when nothing is listening.
            let _ = self.0.send((id, positions));
        }
    }
}

impl<T: Send + 'static> Tasks<T> {
    /// Handles a batch of deliveries of `aggregates` in a task of its own.
    pub(crate) fn spawn<F>(
        &mut self,
        aggregates: Vec<Option<String>>,
        handling: impl FnOnce(Committed) -> F,
    ) where
        F: Future<Output = T> + Send + 'static,
    {
        let id = self.set.spawn(handling(Committed(self.said.clone()))).id();
        self.aggregates
            .insert(id, aggregates.into_iter().map(Some).collect());
    }

    /// Whether no task is left, handling or settling.
    pub(crate) fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Whether another batch may start under `concurrency`: fewer being
    /// handled, and the settling ones bounded too (as many again).
    pub(crate) fn has_room(&self, concurrency: usize) -> bool {
        self.set.len().saturating_sub(self.settling.len()) < concurrency
            && self.set.len() < concurrency.saturating_mul(2)
    }

    /// What happens next: a task ends, with its deliveries' aggregates not
    /// said handled before, or says deliveries handled, with theirs. `None`
    /// when no task is left. What a task said after it was joined answers
    /// nothing: its aggregates went on at the join.
    pub(crate) async fn next(&mut self) -> Option<Next<T>> {
        loop {
            if self.set.is_empty() {
                return None;
            }
            let heard = tokio::select! {
                biased;
                ended = self.set.join_next_with_id() => {
                    let (id, ended) = match ended? {
                        Ok((id, handled)) => (id, Ok(handled)),
                        Err(error) => (error.id(), Err(error)),
                    };
                    self.settling.remove(&id);
                    let left = self.aggregates.remove(&id).unwrap_or_default();
                    return Some(Next::Joined((left.into_iter().flatten().collect(), ended)));
                }
                heard = self.heard.recv() => heard,
            };
            // The `Tasks` holds a sender: the channel never closes.
            let (id, positions) = heard?;
            let Some(aggregates) = self.aggregates.get_mut(&id) else {
                continue;
            };
            self.settling.insert(id);
            return Some(Next::Committed(
                positions
                    .into_iter()
                    .filter_map(|at| aggregates.get_mut(at).and_then(Option::take))
                    .collect(),
            ));
        }
    }
}

/// What [`Tasks::next`] found.
pub(crate) enum Next<T> {
    /// A task ended.
    Joined(Joined<T>),
    /// A task said deliveries of these aggregates committed.
    Committed(Vec<Option<String>>),
}

impl<T: 'static> Drop for Tasks<T> {
    fn drop(&mut self) {
        self.set.detach_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(name: &str) -> Option<String> {
        Some(name.to_string())
    }

    #[test]
    fn an_aggregates_deliveries_start_one_at_a_time_in_order() {
        let mut lanes = Lanes::new(4, 100);
        assert_eq!(lanes.admit(a("x"), None, 1), Some(1));
        assert_eq!(lanes.admit(a("x"), None, 2), None);
        assert_eq!(lanes.admit(a("y"), None, 3), Some(3));
        assert_eq!(lanes.admit(a("x"), None, 4), None);
        assert_eq!(lanes.finished(Some("y")), vec![]);
        assert_eq!(lanes.finished(Some("x")), vec![(a("x"), 2)]);
        assert_eq!(lanes.finished(Some("x")), vec![(a("x"), 4)]);
        assert_eq!(lanes.finished(Some("x")), vec![]);
        assert!(lanes.is_idle());
    }

    #[test]
    fn the_held_deliveries_are_those_waiting_behind_an_aggregate_or_for_a_slot() {
        let mut lanes = Lanes::new(1, 100);
        assert_eq!(lanes.admit(a("x"), None, 1), Some(1));
        assert_eq!(lanes.admit(a("x"), None, 2), None);
        assert_eq!(lanes.admit(a("y"), None, 3), None);
        let mut held: Vec<i32> = lanes.held().copied().collect();
        held.sort_unstable();
        assert_eq!(held, [2, 3]);
    }

    #[test]
    fn deliveries_beyond_the_slots_wait_for_one_and_room_follows() {
        let mut lanes = Lanes::new(2, 2);
        assert_eq!(lanes.admit(None, None, 1), Some(1));
        assert!(lanes.has_room());
        assert_eq!(lanes.admit(a("x"), None, 2), Some(2));
        assert!(!lanes.has_room(), "both slots are taken");
        assert_eq!(lanes.admit(a("y"), None, 3), None);
        assert_eq!(lanes.admit(a("x"), None, 4), None);
        assert_eq!(lanes.finished(None), vec![(a("y"), 3)]);
        assert!(!lanes.has_room());
        assert_eq!(lanes.finished(Some("y")), vec![]);
        assert!(lanes.has_room(), "a slot is free and one waits");
        assert_eq!(lanes.finished(Some("x")), vec![(a("x"), 4)]);
        assert_eq!(lanes.finished(Some("x")), vec![]);
        assert!(lanes.is_idle());
    }

    #[test]
    fn an_aggregates_waiting_deliveries_start_lowest_version_first() {
        let mut lanes = Lanes::new(4, 100);
        assert_eq!(lanes.admit(a("x"), Some(12), 12), Some(12));
        for version in [14, 13, 11] {
            assert_eq!(lanes.admit(a("x"), Some(version), version), None);
        }
        assert_eq!(lanes.admit(a("x"), None, 0), None);
        assert_eq!(lanes.admit(a("x"), Some(13), 113), None);
        let mut order = Vec::new();
        while let Some((_, next)) = lanes.finished(Some("x")).pop() {
            order.push(next);
        }
        assert_eq!(
            order,
            [0, 11, 13, 113, 14],
            "a copy after the first received"
        );
        assert!(lanes.is_idle());
    }

    #[tokio::test]
    async fn deliveries_said_handled_go_on_before_their_task_ends_and_only_once() {
        let mut tasks: Tasks<()> = Tasks::default();
        let leave = std::sync::Arc::new(tokio::sync::Notify::new());
        let left = leave.clone();
        tasks.spawn(vec![a("x"), a("y"), None], |committed| async move {
            committed.say(vec![0, 2]);
            left.notified().await;
        });
        assert!(!tasks.has_room(1), "one batch is handled");
        let Some(Next::Committed(went_on)) = tasks.next().await else {
            panic!("the task said its deliveries handled before it ended");
        };
        assert_eq!(went_on, [a("x"), None]);
        assert!(tasks.has_room(1), "a settling batch is not handled");
        assert!(!tasks.has_room(0));
        leave.notify_one();
        let Some(Next::Joined((left, ended))) = tasks.next().await else {
            panic!("the task ended");
        };
        assert!(ended.is_ok());
        assert_eq!(left, [a("y")], "what it said handled went on once");
        assert!(tasks.next().await.is_none());
        assert!(tasks.has_room(1));
    }

    #[tokio::test]
    async fn settling_batches_are_bounded_as_many_again_as_the_concurrency() {
        let mut tasks: Tasks<()> = Tasks::default();
        let leave = std::sync::Arc::new(tokio::sync::Notify::new());
        for name in ["x", "y"] {
            let left = leave.clone();
            tasks.spawn(vec![a(name)], |committed| async move {
                committed.say(vec![0]);
                left.notified().await;
            });
            assert!(matches!(tasks.next().await, Some(Next::Committed(_))));
        }
        assert!(
            !tasks.has_room(1),
            "two batches settle under a concurrency of one"
        );
        assert!(tasks.has_room(2));
        leave.notify_waiters();
    }

    #[test]
    fn a_held_aggregate_keeps_no_other_from_its_slots() {
        let mut lanes = Lanes::new(2, 8);
        assert_eq!(lanes.admit(a("slow"), None, 0), Some(0));
        for n in 1..4 {
            assert_eq!(lanes.admit(a("slow"), None, n), None);
        }
        for n in 10..14 {
            assert_eq!(lanes.admit(a(&format!("fast-{n}")), None, n), Some(n));
            assert_eq!(lanes.finished(a(&format!("fast-{n}")).as_deref()), vec![]);
        }
    }
}
