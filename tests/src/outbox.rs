//! The outbox store's cases: one `pub async fn` per sentence of
//! [`OutboxStore`]'s contract. A read or an acquire sees the whole outbox,
//! so each case needs a store of its own (an empty table, a fresh process
//! store). Every case holds whatever the store's partition count; the
//! shipped suites run on several partitions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::StoreError;
use idem_core::store::{
    Advance, LogBatch, LogPosition, MAX_OUTBOX_BATCH, MessageId, MessageState, NewMessage,
    OutboxMessage, OutboxStore, OwnerToken, PageAfter, PartitionLease, PublishFailure,
    partition_of,
};

use crate::support::{LONG_LEASE, RACERS, SHORT_LEASE, assert_lost, eventually, outlive};

fn message(aggregate: &str, kind: &str) -> NewMessage {
    NewMessage::new(aggregate, kind, format!("{aggregate}:{kind}").into_bytes())
        .and_then(|m| m.with_header("content-type", "text/plain"))
        .expect("valid message")
}

async fn enqueued<S: OutboxStore + ?Sized>(
    store: &S,
    aggregate: &str,
    kind: &str,
) -> OutboxMessage {
    store
        .enqueue(&message(aggregate, kind))
        .await
        .expect("enqueue")
}

/// How many partitions the store has.
async fn partitions<S: OutboxStore + ?Sized>(store: &S) -> u32 {
    let count = store.stats().await.expect("stats").partitions.len();
    u32::try_from(count).expect("a partition count")
}

/// A lease of `partition` to `owner` for `lease`: the owner takes the lower
/// free partitions on the way (for long, so none lapses meanwhile) and
/// gives them back.
async fn lease_of<S: OutboxStore + ?Sized>(
    store: &S,
    owner: OwnerToken,
    partition: u32,
    lease: Duration,
) -> PartitionLease {
    let acquire = |lease| async move {
        store
            .acquire(owner, lease)
            .await
            .expect("acquire")
            .unwrap_or_else(|| panic!("partition {partition} was never free"))
    };
    let mut passed: Vec<PartitionLease> = Vec::new();
    let mut found = loop {
        let acquired = acquire(LONG_LEASE).await;
        if acquired.partition() == partition {
            break acquired;
        }
        assert!(
            passed.iter().all(|p| p.partition() != acquired.partition()),
            "partition {} leased twice while held",
            acquired.partition()
        );
        passed.push(acquired);
    };
    if lease != LONG_LEASE {
        store.release(&found).await.expect("release");
        found = acquire(lease).await;
        assert_eq!(found.partition(), partition, "the lowest free partition");
    }
    for other in passed {
        store.release(&other).await.expect("release");
    }
    found
}

/// The partition of `message`, leased to a fresh owner for long.
async fn holding<S: OutboxStore + ?Sized>(store: &S, message: &OutboxMessage) -> PartitionLease {
    lease_of(
        store,
        OwnerToken::generate(),
        message.parts().partition,
        LONG_LEASE,
    )
    .await
}

/// The whole log of `partition` after `after`, once it holds `count`
/// messages at least: a store reads a committed message only once nothing
/// still uncommitted could precede it (on a shared database, once older
/// transactions of other clients ended too), so a case waits for what it
/// wrote.
async fn read<S: OutboxStore + ?Sized>(
    store: &S,
    partition: u32,
    after: LogPosition,
    count: usize,
) -> LogBatch {
    let deadline = Instant::now() + READ_PATIENCE;
    loop {
        let batch = store
            .read(partition, after, MAX_OUTBOX_BATCH)
            .await
            .expect("read");
        if batch.messages.len() >= count {
            return batch;
        }
        assert!(
            Instant::now() < deadline,
            "{count} messages were never read: {:?}",
            ids(&batch.messages)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long a case waits for what it enqueued to be read.
const READ_PATIENCE: Duration = Duration::from_secs(60);

async fn advance<S: OutboxStore + ?Sized>(
    store: &S,
    lease: &PartitionLease,
    advance: Advance,
) -> PartitionLease {
    store.advance(lease, &advance).await.expect("advance")
}

async fn state<S: OutboxStore + ?Sized>(store: &S, message: &OutboxMessage) -> OutboxMessage {
    store
        .message(message.id())
        .await
        .expect("message")
        .expect("the message is stored")
}

async fn due<S: OutboxStore + ?Sized>(store: &S, partition: u32) -> Vec<OutboxMessage> {
    store.due(partition, MAX_OUTBOX_BATCH).await.expect("due")
}

fn ids(messages: &[OutboxMessage]) -> Vec<String> {
    messages
        .iter()
        .map(|m| format!("{}/{}", m.message().aggregate(), m.message().kind()))
        .collect()
}

/// A failure of `message` as read, parked at once where `last`.
fn failure(message: &OutboxMessage, last: bool) -> PublishFailure {
    let failure = PublishFailure::new(message.id(), message.parts().attempts, "broker down")
        .retry_after(LONG_LEASE);
    if last {
        failure.max_attempts(message.parts().attempts + 1)
    } else {
        failure
    }
}

/// Two aggregates of one partition: the first found after `order-1` whose
/// partition is the same.
fn same_partition(count: u32) -> (String, String) {
    let first = "order-1".to_string();
    let partition = partition_of(&first, count);
    let second = (2..)
        .map(|i| format!("order-{i}"))
        .find(|other| partition_of(other, count) == partition)
        .expect("another aggregate of the partition");
    (first, second)
}

// ---- Enqueue ---------------------------------------------------------------

/// Enqueue: pending, with its aggregate's next sequence, in its
/// aggregate's partition, at the end of its log.
pub async fn enqueue_stores_a_pending_message_with_its_aggregates_next_sequence<
    S: OutboxStore + ?Sized,
>(
    store: Arc<S>,
) {
    let new = message("order-1", "placed");
    let first = store.enqueue(&new).await.unwrap();
    assert_eq!(first.message(), &new);
    assert_eq!(first.state(), MessageState::Pending);
    assert_eq!((first.parts().sequence, first.parts().attempts), (1, 0));
    let second = enqueued(&*store, "order-1", "paid").await;
    let other = enqueued(&*store, "order-2", "placed").await;
    assert_eq!(second.parts().sequence, 2);
    assert_eq!(other.parts().sequence, 1, "sequences are per aggregate");
    assert!(
        second.parts().position > first.parts().position,
        "a later message stands later in its log"
    );
}

/// Enqueue: a message lands in the partition its aggregate hashes to.
pub async fn a_message_lands_in_its_aggregates_partition<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let count = partitions(&*store).await;
    let mut stored = Vec::new();
    for i in 0..16 {
        let aggregate = format!("order-{i}");
        let message = enqueued(&*store, &aggregate, "placed").await;
        assert_eq!(
            message.parts().partition,
            partition_of(&aggregate, count),
            "{aggregate} of {count} partitions"
        );
        stored.push(message);
    }
    for partition in 0..count {
        let mine: Vec<&OutboxMessage> = stored
            .iter()
            .filter(|m| m.parts().partition == partition)
            .collect();
        let log = read(&*store, partition, LogPosition::START, mine.len()).await;
        for message in mine {
            assert!(
                log.messages.iter().any(|m| m.id() == message.id()),
                "{} not in the log of partition {partition}",
                message.message().aggregate()
            );
        }
    }
}

/// Enqueue: a second enqueue of one id stores nothing more.
pub async fn enqueue_delivered_twice_stores_once<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let new = message("order-1", "placed");
    let first = store.enqueue(&new).await.unwrap();
    let again = store.enqueue(&new).await.unwrap();
    assert_eq!(again, first);
    let next = enqueued(&*store, "order-1", "paid").await;
    assert_eq!(
        next.parts().sequence,
        2,
        "the second enqueue took a sequence"
    );
    assert_eq!(store.stats().await.unwrap().pending, 2);
}

/// Enqueue: an aggregate's sequence keeps counting after its messages were
/// purged.
pub async fn an_aggregates_sequence_keeps_counting_after_a_purge<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let first = enqueued(&*store, "order-1", "placed").await;
    let lease = holding(&*store, &first).await;
    advance(&*store, &lease, Advance::to(first.parts().position)).await;
    assert_eq!(store.purge_sent(Duration::ZERO, 100).await.unwrap(), 1);
    let next = enqueued(&*store, "order-1", "paid").await;
    assert_eq!(
        next.parts().sequence,
        first.parts().sequence + 1,
        "the sequence started again after a purge"
    );
}

// ---- Log -------------------------------------------------------------------

/// Log: a read answers the partition's messages after a position, in log
/// order (each aggregate's in sequence order), up to its limit.
pub async fn a_read_answers_the_log_after_a_position_in_order<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let (a, b) = same_partition(partitions(&*store).await);
    let mut stored = Vec::new();
    for (aggregate, kind) in [(&a, "placed"), (&b, "placed"), (&a, "paid"), (&b, "paid")] {
        stored.push(enqueued(&*store, aggregate, kind).await);
    }
    let partition = stored[0].parts().partition;
    let all = read(&*store, partition, LogPosition::START, 4).await;
    assert_eq!(ids(&all.messages), ids(&stored), "the log's order");
    assert!(
        all.messages
            .windows(2)
            .all(|w| w[0].parts().position < w[1].parts().position)
    );
    let rest = read(&*store, partition, stored[1].parts().position, 2).await;
    assert_eq!(ids(&rest.messages), ids(&stored[2..]), "after a position");
    let limited = store.read(partition, LogPosition::START, 3).await.unwrap();
    assert_eq!(ids(&limited.messages), ids(&stored[..3]), "up to the limit");
    assert_eq!(limited.end(), Some(stored[2].parts().position));
}

/// Log: a read answers the log after the position asked, whatever the
/// partition's cursor: a relay reading again from before its cursor (its
/// last batch's publish lost) gets those messages again.
pub async fn a_read_starts_after_the_position_asked_not_the_cursor<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let (a, b) = same_partition(partitions(&*store).await);
    let first = enqueued(&*store, &a, "placed").await;
    let second = enqueued(&*store, &b, "placed").await;
    let lease = holding(&*store, &first).await;
    advance(&*store, &lease, Advance::to(first.parts().position)).await;
    let again = read(&*store, first.parts().partition, LogPosition::START, 2).await;
    assert_eq!(
        ids(&again.messages),
        ids(&[first, second]),
        "read after the cursor, not the position asked"
    );
}

/// Log: a read never answers a message that something still uncommitted
/// could precede, so a reader going on from the last message it read
/// skips nothing while enqueues race it: every message enqueued is read.
pub async fn a_reader_racing_enqueues_skips_none<S: OutboxStore + ?Sized>(store: Arc<S>) {
    const WRITERS: usize = 4;
    const EACH: usize = 12;
    let count = partitions(&*store).await;
    let partition = partition_of("order-1", count);
    let aggregates: Vec<String> = (1..)
        .map(|i| format!("order-{i}"))
        .filter(|aggregate| partition_of(aggregate, count) == partition)
        .take(WRITERS)
        .collect();
    let writers: Vec<_> = aggregates
        .into_iter()
        .map(|aggregate| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let mut ids = Vec::with_capacity(EACH);
                for at in 0..EACH {
                    ids.push(enqueued(&*store, &aggregate, &format!("e{at}")).await.id());
                }
                ids
            })
        })
        .collect();
    let (mut after, mut seen) = (LogPosition::START, std::collections::HashSet::new());
    let deadline = Instant::now() + READ_PATIENCE;
    while seen.len() < WRITERS * EACH && Instant::now() < deadline {
        let batch = store
            .read(partition, after, MAX_OUTBOX_BATCH)
            .await
            .expect("read");
        for message in &batch.messages {
            assert!(seen.insert(message.id()), "a message read twice");
            after = message.parts().position;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for writer in writers {
        for id in writer.await.expect("a writer") {
            assert!(
                seen.contains(&id),
                "a message enqueued while a reader went on was skipped"
            );
        }
    }
    let rest = store
        .read(partition, after, MAX_OUTBOX_BATCH)
        .await
        .expect("read");
    assert!(
        rest.messages.is_empty(),
        "read again after the last message read: {:?}",
        ids(&rest.messages)
    );
}

/// Log: a parked message blocks its aggregate's later messages in a read
/// (they must not reach the broker before it), until it is dropped, after
/// which the rest of its aggregate flows again.
pub async fn a_parked_message_blocks_its_aggregate_in_a_read_until_dropped<
    S: OutboxStore + ?Sized,
>(
    store: Arc<S>,
) {
    let parked = parked_message(&*store, "order-1").await;
    let later = enqueued(&*store, "order-1", "paid").await;
    let partition = parked.parts().partition;
    let log = read(&*store, partition, parked.parts().position, 1).await;
    assert_eq!(ids(&log.messages), ids(std::slice::from_ref(&later)));
    assert!(
        log.blocked.contains("order-1"),
        "behind a parked message: {:?}",
        log.blocked
    );
    assert!(store.drop_message(parked.id(), "by hand").await.unwrap());
    let log = read(&*store, partition, parked.parts().position, 1).await;
    assert_eq!(ids(&log.messages), ids(&[later]));
    assert!(
        log.blocked.is_empty(),
        "blocked after the drop: {:?}",
        log.blocked
    );
}

/// Log: a read names the aggregates with a message in the retry lane, and
/// messages taken out of the log are not read.
pub async fn a_read_names_the_blocked_aggregates_and_skips_the_lane<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let (a, b) = same_partition(partitions(&*store).await);
    let failed = enqueued(&*store, &a, "placed").await;
    let later = enqueued(&*store, &a, "paid").await;
    let other = enqueued(&*store, &b, "placed").await;
    let lease = holding(&*store, &failed).await;
    advance(
        &*store,
        &lease,
        Advance::to(failed.parts().position).failed(failure(&failed, false)),
    )
    .await;
    let log = read(&*store, failed.parts().partition, LogPosition::START, 2).await;
    assert_eq!(
        ids(&log.messages),
        ids(&[later, other]),
        "a failed message is out of the log"
    );
    assert!(log.blocked.contains(&a), "{:?}", log.blocked);
    assert!(!log.blocked.contains(&b), "{:?}", log.blocked);
}

// ---- Partitions ------------------------------------------------------------

/// Partitions: each acquire takes the lowest-numbered free partition; none
/// once every one is held.
pub async fn acquire_takes_the_lowest_free_partition<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let count = partitions(&*store).await;
    for expected in 0..count {
        let lease = store
            .acquire(OwnerToken::generate(), LONG_LEASE)
            .await
            .unwrap()
            .expect("a free partition");
        assert_eq!(lease.partition(), expected);
        assert_eq!(lease.cursor(), LogPosition::START);
    }
    assert_eq!(
        store
            .acquire(OwnerToken::generate(), LONG_LEASE)
            .await
            .unwrap(),
        None,
        "a held partition was leased again"
    );
}

/// Partitions: a lapsed lease counts as none: another owner acquires the
/// partition, with its cursor where its last holder left it.
pub async fn a_lapsed_partition_is_acquired_again_at_its_cursor<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let placed = enqueued(&*store, "order-1", "placed").await;
    let partition = placed.parts().partition;
    let first = lease_of(&*store, OwnerToken::generate(), partition, LONG_LEASE).await;
    advance(&*store, &first, Advance::to(placed.parts().position)).await;
    store.release(&first).await.unwrap();
    let short = lease_of(&*store, OwnerToken::generate(), partition, SHORT_LEASE).await;
    outlive(SHORT_LEASE).await;
    let taken = lease_of(&*store, OwnerToken::generate(), partition, LONG_LEASE).await;
    assert_ne!(taken.owner(), short.owner());
    assert_eq!(
        taken.cursor(),
        placed.parts().position,
        "the cursor was lost"
    );
}

/// Partitions: a lease under a second lasts its length, not rounded to
/// nothing.
pub async fn a_lease_under_a_second_holds_for_its_length<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let count = partitions(&*store).await;
    let lease = Duration::from_millis(900);
    let leasing = Instant::now();
    let mut held = Vec::new();
    for _ in 0..count {
        let acquired = store.acquire(OwnerToken::generate(), lease).await.unwrap();
        held.push(acquired.expect("a free partition"));
    }
    let rival = store
        .acquire(OwnerToken::generate(), LONG_LEASE)
        .await
        .unwrap();
    let renewed = store.advance(&held[0], &Advance::default()).await;
    // Only a rival and a renewal inside the lease prove anything.
    if leasing.elapsed() < lease {
        assert_eq!(rival, None, "a {lease:?} lease held nothing");
        assert!(
            renewed.is_ok(),
            "a {lease:?} lease lapsed at once: {renewed:?}"
        );
    }
}

/// Partitions: a release frees a partition its owner holds at once, its
/// cursor kept; another owner's release frees nothing.
pub async fn a_release_frees_the_partition_at_once_keeping_its_cursor<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let placed = enqueued(&*store, "order-1", "placed").await;
    let partition = placed.parts().partition;
    let lease = lease_of(&*store, OwnerToken::generate(), partition, LONG_LEASE).await;
    let lease = advance(&*store, &lease, Advance::to(placed.parts().position)).await;
    let forged = PartitionLease::issued(
        partition,
        OwnerToken::generate(),
        LONG_LEASE,
        lease.until(),
        lease.cursor(),
    );
    assert!(!store.release(&forged).await.unwrap(), "another's release");
    assert!(store.release(&lease).await.unwrap());
    assert!(!store.release(&lease).await.unwrap(), "released twice");
    let again = lease_of(&*store, OwnerToken::generate(), partition, LONG_LEASE).await;
    assert_eq!(again.cursor(), placed.parts().position);
}

// ---- Advance ---------------------------------------------------------------

/// Advance: the cursor moves past what was published, which is then sent,
/// and never moves back.
pub async fn an_advance_moves_the_cursor_never_back<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let first = enqueued(&*store, "order-1", "placed").await;
    let second = enqueued(&*store, "order-1", "paid").await;
    let lease = holding(&*store, &first).await;
    let lease = advance(&*store, &lease, Advance::to(second.parts().position)).await;
    assert_eq!(lease.cursor(), second.parts().position);
    assert_eq!(state(&*store, &first).await.state(), MessageState::Sent);
    assert_eq!(state(&*store, &second).await.state(), MessageState::Sent);
    let back = advance(&*store, &lease, Advance::to(first.parts().position)).await;
    assert_eq!(
        back.cursor(),
        second.parts().position,
        "the cursor moved back"
    );
    store.release(&back).await.unwrap();
    let again = holding(&*store, &first).await;
    assert_eq!(again.cursor(), second.parts().position);
    assert_eq!(store.stats().await.unwrap().pending, 0);
}

/// Advance: an owner whose partition was taken over settles nothing.
pub async fn a_taken_over_relay_advances_nothing<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let placed = enqueued(&*store, "order-1", "placed").await;
    let partition = placed.parts().partition;
    let stale = lease_of(&*store, OwnerToken::generate(), partition, SHORT_LEASE).await;
    outlive(SHORT_LEASE).await;
    let fresh = lease_of(&*store, OwnerToken::generate(), partition, LONG_LEASE).await;
    assert_lost(
        "a taken-over advance",
        store
            .advance(
                &stale,
                &Advance::to(placed.parts().position).failed(failure(&placed, false)),
            )
            .await,
    );
    assert_eq!(state(&*store, &placed).await.state(), MessageState::Pending);
    assert_eq!(
        store.stats().await.unwrap().partitions[partition as usize].cursor,
        fresh.cursor()
    );
}

/// Advance: a lease that lapsed holds nothing for its owner, even when
/// nobody acquired the partition since.
pub async fn a_lapsed_owner_advances_nothing_even_unclaimed<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let placed = enqueued(&*store, "order-1", "placed").await;
    let lease = lease_of(
        &*store,
        OwnerToken::generate(),
        placed.parts().partition,
        SHORT_LEASE,
    )
    .await;
    outlive(SHORT_LEASE).await;
    assert_lost(
        "a lapsed owner's advance",
        store
            .advance(&lease, &Advance::to(placed.parts().position))
            .await,
    );
    assert!(!store.release(&lease).await.unwrap());
    assert_eq!(state(&*store, &placed).await.state(), MessageState::Pending);
}

/// Advance: an advance renews the lease for its length.
pub async fn an_advance_renews_the_lease<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let placed = enqueued(&*store, "order-1", "placed").await;
    let partition = placed.parts().partition;
    let lease = lease_of(&*store, OwnerToken::generate(), partition, LONG_LEASE).await;
    // The store's clock moves on, so the renewal ends later.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let renewing = Instant::now();
    let renewed = advance(&*store, &lease, Advance::default()).await;
    assert!(renewed.until() > lease.until(), "an advance did not renew");
    // For its length from the advance: later than before by no more than
    // the time that passed (and a second of the store's precision).
    let later = renewed.until().saturating_duration_since(lease.until());
    let passed = renewing.elapsed() + Duration::from_millis(20) + Duration::from_secs(1);
    assert!(
        later <= passed,
        "renewed {later:?} later after {passed:?}: past its length"
    );
    let kept = store.stats().await.unwrap().partitions[partition as usize];
    assert_eq!(
        kept.held_until,
        Some(renewed.until()),
        "the renewal was answered, not kept"
    );
}

/// Advance: a failed message leaves the log for the retry lane, with its
/// attempt and error, due again only after its back-off.
pub async fn a_failed_message_waits_its_back_off_in_the_lane<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let placed = enqueued(&*store, "order-1", "placed").await;
    let lease = holding(&*store, &placed).await;
    let backoff = Duration::from_millis(800);
    let failing = Instant::now();
    advance(
        &*store,
        &lease,
        Advance::to(placed.parts().position)
            .failed(PublishFailure::new(placed.id(), 0, "broker down").retry_after(backoff)),
    )
    .await;
    let failed = state(&*store, &placed).await;
    assert_eq!(failed.state(), MessageState::Waiting);
    assert_eq!(failed.parts().attempts, 1);
    assert_eq!(failed.parts().last_error.as_deref(), Some("broker down"));
    let early = due(&*store, placed.parts().partition).await;
    if failing.elapsed() < backoff {
        assert!(early.is_empty(), "due before its back-off: {early:?}");
    }
    let partition = placed.parts().partition;
    let again = eventually("the back-off to pass", || {
        let store = Arc::clone(&store);
        async move { Some(due(&*store, partition).await).filter(|d| !d.is_empty()) }
    })
    .await;
    assert_eq!(ids(&again), ids(&[placed]));
    // The store's clock counts whole milliseconds.
    assert!(
        failing.elapsed() + Duration::from_millis(2) >= backoff,
        "due before its back-off"
    );
}

/// Advance: at its last attempt a message is parked, and holds its
/// aggregate's lane; other aggregates flow.
pub async fn the_last_failure_parks_the_message_and_its_aggregate_only<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let (a, b) = same_partition(partitions(&*store).await);
    let parked = enqueued(&*store, &a, "placed").await;
    let behind = enqueued(&*store, &a, "paid").await;
    let other = enqueued(&*store, &b, "placed").await;
    let lease = holding(&*store, &parked).await;
    advance(
        &*store,
        &lease,
        Advance::to(behind.parts().position)
            .failed(failure(&parked, true))
            .held(behind.id()),
    )
    .await;
    assert_eq!(state(&*store, &parked).await.state(), MessageState::Parked);
    assert_eq!(state(&*store, &behind).await.state(), MessageState::Waiting);
    assert!(
        due(&*store, parked.parts().partition).await.is_empty(),
        "a message behind a parked one was due"
    );
    let log = read(&*store, parked.parts().partition, lease.cursor(), 1).await;
    assert_eq!(ids(&log.messages), ids(&[other]), "another aggregate flows");
    assert_eq!(store.stats().await.unwrap().parked, 1);
}

/// Advance: held messages wait in the lane behind their aggregate's first,
/// their attempts unchanged, due once it is sent.
pub async fn held_messages_follow_their_aggregates_first<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let first = enqueued(&*store, "order-1", "placed").await;
    let second = enqueued(&*store, "order-1", "paid").await;
    let lease = holding(&*store, &first).await;
    let failed_first = PublishFailure::new(first.id(), 0, "broker down");
    let lease = advance(
        &*store,
        &lease,
        Advance::to(second.parts().position)
            .failed(failed_first)
            .held(second.id()),
    )
    .await;
    let held = state(&*store, &second).await;
    assert_eq!(held.state(), MessageState::Waiting);
    assert_eq!(held.parts().attempts, 0, "a hold counted an attempt");
    let partition = first.parts().partition;
    let heads = due(&*store, partition).await;
    assert_eq!(
        ids(&heads),
        ids(std::slice::from_ref(&first)),
        "only the first is due"
    );
    advance(&*store, &lease, Advance::default().sent(first.id())).await;
    let sent = state(&*store, &first).await;
    assert_eq!(sent.state(), MessageState::Sent);
    assert!(sent.parts().sent_at.is_some(), "a lane send keeps its time");
    assert_eq!(ids(&due(&*store, partition).await), ids(&[second]));
}

/// Advance: delivered twice, an advance changes nothing more (a failure
/// counts once, a hold and a send apply once).
pub async fn an_advance_delivered_twice_changes_nothing_more<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let first = enqueued(&*store, "order-1", "placed").await;
    let second = enqueued(&*store, "order-1", "paid").await;
    let lease = holding(&*store, &first).await;
    let settled = Advance::to(second.parts().position)
        .failed(PublishFailure::new(first.id(), 0, "broker down"))
        .held(second.id());
    let lease = advance(&*store, &lease, settled.clone()).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let lease = advance(&*store, &lease, settled).await;
    assert_eq!(
        state(&*store, &first).await.parts().attempts,
        1,
        "a failure delivered twice counted twice"
    );
    let sent = Advance::default().sent(first.id());
    let lease = advance(&*store, &lease, sent.clone()).await;
    let sent_at = state(&*store, &first).await.parts().sent_at;
    tokio::time::sleep(Duration::from_millis(5)).await;
    advance(&*store, &lease, sent).await;
    assert_eq!(state(&*store, &first).await.parts().sent_at, sent_at);
    assert_eq!(state(&*store, &second).await.state(), MessageState::Waiting);
}

/// Advance: a hold moves only a message of the log and a send marks only a
/// waiting one, so neither skips a message nor frees a parked one: a hold
/// of a waiting message leaves its back-off, a hold or a send of a parked
/// one leaves it parked, and a send of a log message not yet published
/// leaves it in the log to be read.
pub async fn a_hold_or_a_send_changes_only_a_message_in_its_place<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let (a, b) = same_partition(partitions(&*store).await);
    let waiting = enqueued(&*store, &a, "placed").await;
    let parked = enqueued(&*store, &b, "placed").await;
    let lease = holding(&*store, &waiting).await;
    let partition = waiting.parts().partition;
    let lease = advance(
        &*store,
        &lease,
        Advance::to(parked.parts().position)
            .failed(failure(&waiting, false))
            .failed(failure(&parked, true)),
    )
    .await;
    let waited = state(&*store, &waiting).await;
    assert_eq!(waited.state(), MessageState::Waiting);
    let unpublished = enqueued(&*store, &a, "paid").await;
    let lease = advance(
        &*store,
        &lease,
        Advance::default()
            .held(waiting.id())
            .held(parked.id())
            .sent(parked.id())
            .sent(unpublished.id()),
    )
    .await;
    let still = state(&*store, &waiting).await;
    assert_eq!(
        (
            still.state(),
            still.parts().attempts,
            still.parts().available_at
        ),
        (
            MessageState::Waiting,
            waited.parts().attempts,
            waited.parts().available_at
        ),
        "a hold moved a waiting message"
    );
    let still = state(&*store, &parked).await;
    assert_eq!(
        (still.state(), still.parts().sent_at),
        (MessageState::Parked, None),
        "a hold or a send freed a parked message"
    );
    assert_eq!(
        state(&*store, &unpublished).await.state(),
        MessageState::Pending,
        "a send marked a message never published"
    );
    let log = read(&*store, partition, lease.cursor(), 1).await;
    assert_eq!(ids(&log.messages), ids(&[unpublished]));
}

// ---- Advance and read ------------------------------------------------------

/// Advance and read: the read sees the log as the advance left it: a
/// message the advance took out of the log is not read, its aggregate is
/// blocked, and the lease answered is the renewed one.
pub async fn an_advance_and_read_reads_the_log_as_the_advance_left_it<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let (a, b) = same_partition(partitions(&*store).await);
    let first = enqueued(&*store, &a, "placed").await;
    let other = enqueued(&*store, &b, "placed").await;
    let second = enqueued(&*store, &a, "paid").await;
    let partition = first.parts().partition;
    read(&*store, partition, LogPosition::START, 3).await;
    let lease = holding(&*store, &first).await;
    let answer = store
        .advance_and_read(
            &lease,
            &Advance::to(first.parts().position).failed(failure(&first, false)),
            LogPosition::START,
            MAX_OUTBOX_BATCH,
        )
        .await
        .expect("advance and read");
    assert_eq!(answer.lease.cursor(), first.parts().position);
    assert_eq!(answer.lease.owner(), lease.owner());
    let batch = answer.batch.expect("the read");
    assert_eq!(
        ids(&batch.messages),
        ids(&[other, second]),
        "the read came before the advance"
    );
    assert!(
        batch.blocked.contains(&a),
        "the failed message's aggregate is not blocked: {:?}",
        batch.blocked
    );
    assert_eq!(state(&*store, &first).await.state(), MessageState::Waiting);
}

/// Advance and read: under a lease its owner lost, nothing is settled and
/// nothing read.
pub async fn a_lost_lease_advances_and_reads_nothing<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let placed = enqueued(&*store, "order-1", "placed").await;
    let partition = placed.parts().partition;
    read(&*store, partition, LogPosition::START, 1).await;
    let stale = lease_of(&*store, OwnerToken::generate(), partition, SHORT_LEASE).await;
    outlive(SHORT_LEASE).await;
    let fresh = lease_of(&*store, OwnerToken::generate(), partition, LONG_LEASE).await;
    assert_lost(
        "a taken-over advance and read",
        store
            .advance_and_read(
                &stale,
                &Advance::to(placed.parts().position).failed(failure(&placed, false)),
                LogPosition::START,
                MAX_OUTBOX_BATCH,
            )
            .await,
    );
    assert_eq!(state(&*store, &placed).await.state(), MessageState::Pending);
    assert_eq!(
        store.stats().await.unwrap().partitions[partition as usize].cursor,
        fresh.cursor()
    );
}

// ---- Lane ------------------------------------------------------------------

/// Lane: each aggregate's first waiting message, the oldest enqueued first,
/// up to the limit.
pub async fn due_takes_each_aggregates_first_oldest_first<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let (a, b) = same_partition(partitions(&*store).await);
    // A millisecond apart at least, so enqueue times order them: b's second
    // message is older than a's first, and comes later by sequence.
    let mut stored = Vec::new();
    for (aggregate, kind) in [(&b, "placed"), (&b, "paid"), (&a, "placed"), (&a, "paid")] {
        stored.push(enqueued(&*store, aggregate, kind).await);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let lease = holding(&*store, &stored[0]).await;
    // b's first is sent; the rest fail into the lane.
    let mut settled = Advance::to(stored[3].parts().position);
    for message in &stored[1..] {
        settled = settled.failed(PublishFailure::new(message.id(), 0, "broker down"));
    }
    advance(&*store, &lease, settled).await;
    let partition = stored[0].parts().partition;
    let heads = due(&*store, partition).await;
    assert_eq!(
        ids(&heads),
        ids(&stored[1..3]),
        "each aggregate's first, oldest first"
    );
    let one = store.due(partition, 1).await.unwrap();
    assert_eq!(ids(&one), ids(&stored[1..2]), "the oldest head first");
}

// ---- Operator --------------------------------------------------------------

/// Operator: a retried message is waiting again with its attempts reset.
pub async fn a_retried_message_waits_again_with_no_attempts<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let parked = parked_message(&*store, "order-1").await;
    assert!(store.retry(parked.id()).await.unwrap());
    let retried = state(&*store, &parked).await;
    assert_eq!(retried.state(), MessageState::Waiting);
    assert_eq!(retried.parts().attempts, 0);
    assert!(!store.retry(parked.id()).await.unwrap(), "retried twice");
}

/// Operator: a retried message keeps its place (its sequence), ahead of the
/// later messages of its aggregate.
pub async fn a_retried_message_keeps_its_place_in_its_aggregate<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let parked = parked_message(&*store, "order-1").await;
    let later = enqueued(&*store, "order-1", "paid").await;
    let lease = holding(&*store, &later).await;
    advance(
        &*store,
        &lease,
        Advance::to(later.parts().position).held(later.id()),
    )
    .await;
    store.retry(parked.id()).await.unwrap();
    let retried = state(&*store, &parked).await;
    assert_eq!(retried.parts().sequence, parked.parts().sequence);
    assert_eq!(
        ids(&due(&*store, parked.parts().partition).await),
        ids(&[parked]),
        "a retried message lost its place"
    );
}

/// Operator: a retried message keeps its last error and is due at once,
/// whatever its back-off.
pub async fn a_retried_message_keeps_its_last_error_and_is_due_at_once<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let parked = parked_message(&*store, "order-1").await;
    store.retry(parked.id()).await.unwrap();
    let retried = state(&*store, &parked).await;
    assert_eq!(retried.parts().last_error.as_deref(), Some("broker down"));
    assert_eq!(
        ids(&due(&*store, parked.parts().partition).await),
        ids(&[parked]),
        "a retried message waited out its back-off"
    );
}

/// Operator: a dropped message keeps its reason and its drop's time, and
/// the rest of its aggregate flows again.
pub async fn a_dropped_message_keeps_its_reason_and_frees_its_aggregate<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let parked = parked_message(&*store, "order-1").await;
    let later = enqueued(&*store, "order-1", "paid").await;
    let lease = holding(&*store, &later).await;
    advance(
        &*store,
        &lease,
        Advance::to(later.parts().position).held(later.id()),
    )
    .await;
    assert!(
        store
            .drop_message(parked.id(), "refunded by hand")
            .await
            .unwrap()
    );
    let dropped = state(&*store, &parked).await;
    assert_eq!(dropped.state(), MessageState::Dropped);
    assert_eq!(
        dropped.parts().last_error.as_deref(),
        Some("refunded by hand")
    );
    assert!(dropped.parts().sent_at.is_some(), "the drop's time is kept");
    assert_eq!(
        ids(&due(&*store, parked.parts().partition).await),
        ids(&[later]),
        "the aggregate stayed blocked"
    );
    assert!(!store.drop_message(parked.id(), "again").await.unwrap());
}

/// Operator: only a parked message is retried or dropped; anything else
/// stays as it is.
pub async fn only_a_parked_message_is_retried_or_dropped<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let sent = enqueued(&*store, "order-1", "placed").await;
    let pending = enqueued(&*store, "order-2", "placed").await;
    let lease = holding(&*store, &sent).await;
    advance(&*store, &lease, Advance::to(sent.parts().position)).await;
    for message in [&sent, &pending] {
        let before = state(&*store, message).await;
        assert!(!store.drop_message(message.id(), "no").await.unwrap());
        assert!(!store.retry(message.id()).await.unwrap());
        assert_eq!(state(&*store, message).await, before, "changed: {before:?}");
    }
}

/// Operator: parked messages are listed oldest first, a page after another.
pub async fn parked_messages_are_listed_oldest_first_in_pages<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let mut parked = Vec::new();
    for i in 0..3 {
        parked.push(parked_message(&*store, &format!("order-{i}")).await);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    let first = store.parked(None, 2).await.unwrap();
    assert_eq!(ids(&first), ids(&parked[..2]));
    let last = first.last().expect("a first page");
    let next = store.parked(Some(PageAfter::of(last)), 2).await.unwrap();
    assert_eq!(ids(&next), ids(&parked[2..]));
}

/// Operator: parked messages enqueued at one time are ordered by their id,
/// so a page that ends among them goes on with the rest: after a place at
/// a parked message's enqueue time and a lower id it is listed, after one
/// with a higher id it is not.
pub async fn parked_messages_of_one_enqueue_time_page_by_id<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let parked = parked_message(&*store, "order-1").await;
    let at = parked.parts().enqueued_at;
    let lowest = PageAfter::new(at, MessageId::from_uuid(uuid::Uuid::nil()));
    let highest = PageAfter::new(at, MessageId::from_uuid(uuid::Uuid::max()));
    assert_eq!(
        ids(&store.parked(Some(lowest), 10).await.unwrap()),
        ids(&[parked]),
        "a message enqueued at the page's last time, with a higher id, was skipped"
    );
    assert!(
        store.parked(Some(highest), 10).await.unwrap().is_empty(),
        "a message enqueued at the page's last time, with a lower id, was listed again"
    );
}

/// A message parked at its first failure, with "broker down".
async fn parked_message<S: OutboxStore + ?Sized>(store: &S, aggregate: &str) -> OutboxMessage {
    let placed = enqueued(store, aggregate, "placed").await;
    let partition = placed.parts().partition;
    let owner = OwnerToken::generate();
    let lease = lease_of(store, owner, partition, LONG_LEASE).await;
    let lease = store
        .advance(
            &lease,
            &Advance::to(placed.parts().position).failed(failure(&placed, true)),
        )
        .await
        .expect("advance");
    store.release(&lease).await.expect("release");
    placed
}

// ---- Purge -----------------------------------------------------------------

/// Purge: only sent messages (and dropped ones) at least as old as asked
/// go, never an unsent one.
pub async fn purge_deletes_only_sent_messages_at_least_as_old_as_asked<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    // Parked first: its advance moves its partition's cursor past it.
    let parked = parked_message(&*store, "order-3").await;
    let sent = enqueued(&*store, "order-1", "placed").await;
    let pending = enqueued(&*store, "order-2", "placed").await;
    let lease = holding(&*store, &sent).await;
    advance(&*store, &lease, Advance::to(sent.parts().position)).await;
    assert_eq!(
        store.purge_sent(LONG_LEASE, 100).await.unwrap(),
        0,
        "too young"
    );
    assert_eq!(store.purge_sent(Duration::ZERO, 100).await.unwrap(), 1);
    assert_eq!(store.message(sent.id()).await.unwrap(), None);
    for kept in [&pending, &parked] {
        assert!(
            store.message(kept.id()).await.unwrap().is_some(),
            "purged unsent"
        );
    }
}

/// Purge: at most `limit` messages a call; the rest at the next.
pub async fn purge_deletes_up_to_its_limit<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let mut sent = Vec::new();
    for kind in ["placed", "paid", "shipped"] {
        sent.push(enqueued(&*store, "order-1", kind).await);
    }
    let lease = holding(&*store, &sent[0]).await;
    advance(&*store, &lease, Advance::to(sent[2].parts().position)).await;
    assert_eq!(store.purge_sent(Duration::ZERO, 2).await.unwrap(), 2);
    assert_eq!(store.purge_sent(Duration::ZERO, 2).await.unwrap(), 1);
    assert_eq!(store.purge_sent(Duration::ZERO, 2).await.unwrap(), 0);
}

/// Purge: a dropped message is aged from its drop, not its enqueue.
pub async fn a_dropped_message_is_purged_aged_from_its_drop<S: OutboxStore + ?Sized>(
    store: Arc<S>,
) {
    let parked = parked_message(&*store, "order-1").await;
    let wait = Duration::from_millis(600);
    tokio::time::sleep(wait).await;
    let dropping = Instant::now();
    store.drop_message(parked.id(), "by hand").await.unwrap();
    let purged = store.purge_sent(wait, 100).await.unwrap();
    // Only a purge inside the wait after the drop proves anything.
    if dropping.elapsed() < wait {
        assert_eq!(purged, 0, "a drop aged from its enqueue");
    }
    // On a slow store the drop and this purge can take the whole wait: it
    // was then old enough already, and is gone.
    if purged > 0 {
        assert_eq!(purged, 1);
        return;
    }
    let purged = eventually("the drop to age", || {
        let store = Arc::clone(&store);
        async move {
            match store.purge_sent(wait, 100).await.unwrap() {
                0 => None,
                n => Some(n),
            }
        }
    })
    .await;
    assert_eq!(purged, 1);
}

// ---- Stats -----------------------------------------------------------------

/// Stats: each partition's pending (past the cursor, or waiting) and
/// parked messages, its holder and cursor, and the totals.
pub async fn stats_count_each_partitions_backlog<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let empty = store.stats().await.unwrap();
    assert_eq!(
        (empty.pending, empty.parked, empty.oldest_pending_age),
        (0, 0, None)
    );
    assert_eq!(empty.partitions.len(), partitions(&*store).await as usize);
    let (a, b) = same_partition(partitions(&*store).await);
    // Parked first: its advance moves its partition's cursor past it.
    parked_message(&*store, "order-99").await;
    let sent = enqueued(&*store, &a, "placed").await;
    let waiting = enqueued(&*store, &a, "paid").await;
    enqueued(&*store, &b, "placed").await;
    let lease = holding(&*store, &sent).await;
    let lease = advance(
        &*store,
        &lease,
        Advance::to(waiting.parts().position).failed(failure(&waiting, false)),
    )
    .await;
    let stats = store.stats().await.unwrap();
    assert_eq!((stats.pending, stats.parked), (2, 1), "{stats:?}");
    let mine = stats.partitions[lease.partition() as usize];
    assert_eq!(mine.holder, Some(lease.owner()));
    assert_eq!(mine.cursor, lease.cursor());
    assert!(mine.pending >= 2, "{mine:?}");
}

/// Stats: a partition's holder is the relay holding it while one does;
/// once its lease lapsed (by the store's clock) it has none.
pub async fn a_lapsed_lease_has_no_holder_in_the_stats<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let placed = enqueued(&*store, "order-1", "placed").await;
    let partition = placed.parts().partition;
    lease_of(&*store, OwnerToken::generate(), partition, SHORT_LEASE).await;
    outlive(SHORT_LEASE).await;
    eventually("the lapsed lease's holder to leave the stats", || {
        let store = Arc::clone(&store);
        async move {
            let stats = store.stats().await.unwrap();
            let mine = stats.partitions[partition as usize];
            (mine.holder.is_none() && mine.held_until.is_none()).then_some(())
        }
    })
    .await;
}

/// Stats: only pending messages age the backlog, neither sent nor parked
/// ones.
pub async fn stats_age_only_the_pending_backlog<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let parked = parked_message(&*store, "order-2").await;
    let sent = enqueued(&*store, "order-1", "placed").await;
    let gap = Duration::from_millis(1_200);
    tokio::time::sleep(gap).await;
    let fresh_since = Instant::now();
    enqueued(&*store, "order-3", "placed").await;
    let lease = holding(&*store, &sent).await;
    advance(&*store, &lease, Advance::to(sent.parts().position)).await;
    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.parked),
        (1, 1),
        "{stats:?} {parked:?}"
    );
    let age = stats.oldest_pending_age.expect("a pending message ages");
    // The fresh message is at most this old; the others at least `gap`.
    if fresh_since.elapsed() < gap / 2 {
        assert!(age < gap, "aged from a sent or parked message: {age:?}");
    }
}

// ---- Limits and races ------------------------------------------------------

fn invalid<T>(result: Result<T, StoreError>) -> bool {
    matches!(result, Err(StoreError::InvalidInput(_)))
}

/// Limits: 1 to `MAX_OUTBOX_BATCH` for reads, listings and purges; a lease
/// of 1 ms to 7 days; partitions the store has.
pub async fn limits_out_of_range_are_invalid_input<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let placed = enqueued(&*store, "order-1", "placed").await;
    let partition = placed.parts().partition;
    for limit in [0, MAX_OUTBOX_BATCH + 1] {
        assert!(invalid(
            store
                .read(partition, LogPosition::START, limit)
                .await
                .map(drop)
        ));
        assert!(invalid(store.due(partition, limit).await.map(drop)));
        assert!(invalid(store.parked(None, limit).await.map(drop)));
        assert!(invalid(
            store.purge_sent(Duration::ZERO, limit).await.map(drop)
        ));
    }
    assert!(invalid(
        store
            .acquire(OwnerToken::generate(), Duration::ZERO)
            .await
            .map(drop)
    ));
    let beyond = partitions(&*store).await;
    assert!(invalid(
        store.read(beyond, LogPosition::START, 10).await.map(drop)
    ));
    assert_eq!(
        read(&*store, partition, LogPosition::START, 1)
            .await
            .messages
            .len(),
        1
    );
}

/// Partitions: concurrent acquires never lease one partition twice.
pub async fn concurrent_acquires_never_share_a_partition<S: OutboxStore + ?Sized>(store: Arc<S>) {
    let count = partitions(&*store).await as usize;
    let barrier = Arc::new(tokio::sync::Barrier::new(RACERS));
    let racers: Vec<_> = (0..RACERS)
        .map(|_| {
            let (store, barrier) = (Arc::clone(&store), Arc::clone(&barrier));
            tokio::spawn(async move {
                barrier.wait().await;
                // More than every partition, should a store lease one twice.
                let mut won = Vec::new();
                for _ in 0..=count {
                    let acquired = store
                        .acquire(OwnerToken::generate(), LONG_LEASE)
                        .await
                        .expect("acquire");
                    match acquired {
                        Some(lease) => won.push(lease.partition()),
                        None => break,
                    }
                }
                won
            })
        })
        .collect();
    let mut won = Vec::new();
    for racer in racers {
        won.extend(racer.await.expect("racer"));
    }
    let total = won.len();
    won.sort_unstable();
    won.dedup();
    assert_eq!(won.len(), total, "a partition leased twice: {total} leases");
    assert_eq!(total, count, "every partition leased once");
}
