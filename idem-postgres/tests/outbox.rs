//! The public outbox suite against a real Postgres, and what only the
//! Postgres outbox does: enqueueing inside the caller's transaction, late
//! commits, wake-ups on commit, racing relays.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;
#[path = "common/proxy.rs"]
#[allow(dead_code)] // the round-trip counts only
mod proxy;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::store::{
    Advance, LogBatch, LogPosition, MessageId, MessageState, NewMessage, OutboxMessage,
    OutboxStats, OutboxStore, OwnerToken, PageAfter, PartitionLease, PublishFailure,
};
use idem_core::{StoreError, async_trait};
use idem_outbox::{PublishError, Published, Publisher, Relay, RelayOptions};
use idem_postgres::sqlx::{self, AssertSqlSafe, PgPool};
use idem_postgres::{PostgresOutbox, PostgresOutboxOptions};
use proxy::CountingProxy;
use tokio::sync::{Notify, watch};

/// Generous: the machine running these is busy.
const DEADLINE: Duration = Duration::from_secs(30);
const LONG_LEASE: Duration = Duration::from_secs(60);

/// A table name of its own: a read sees the whole table.
fn fresh_table() -> String {
    format!("ob_{}", uuid::Uuid::new_v4().simple())
}

/// A migrated outbox on a fresh table of its own, over `pool`.
async fn outbox_on(pool: PgPool, table: &str) -> PostgresOutbox {
    let outbox =
        PostgresOutbox::with_options(pool, PostgresOutboxOptions::default().table(table)).unwrap();
    outbox.migrate().await.expect("migrate");
    outbox
}

/// A migrated outbox on a fresh table of its own.
async fn outbox() -> PostgresOutbox {
    outbox_on(common::pool().await, &fresh_table()).await
}

/// A migrated outbox of `partitions` on a fresh table of its own.
async fn partitioned(partitions: u32) -> PostgresOutbox {
    let options = PostgresOutboxOptions::default()
        .table(&fresh_table())
        .partitions(partitions);
    let outbox = PostgresOutbox::with_options(common::pool().await, options).unwrap();
    outbox.migrate().await.expect("migrate");
    outbox
}

mod suite {
    idem_conformance::outbox_suite!(super::partitioned(4));
}

mod suite_on_one_partition {
    idem_conformance::outbox_suite!(super::outbox());
}

fn message(aggregate: &str, kind: &str) -> NewMessage {
    NewMessage::new(aggregate, kind, format!("{aggregate}:{kind}").into_bytes()).unwrap()
}

/// Polls `check` until it yields a value, failing after `within`.
async fn until<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A broker that accepts everything and remembers it, in publish order.
#[derive(Default)]
struct Recorder {
    got: Mutex<Vec<OutboxMessage>>,
}

impl Recorder {
    fn got(&self) -> Vec<OutboxMessage> {
        self.got.lock().unwrap().clone()
    }

    fn kinds(&self) -> Vec<String> {
        self.got()
            .iter()
            .map(|m| format!("{}/{}", m.message().aggregate(), m.message().kind()))
            .collect()
    }

    /// Waits until it holds `n` messages.
    async fn wait_for(&self, n: usize, within: Duration) -> Vec<OutboxMessage> {
        until(&format!("{n} messages published"), within, || async {
            let got = self.got();
            (got.len() >= n).then_some(got)
        })
        .await
    }
}

#[async_trait]
impl Publisher for Recorder {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>> {
        self.got.lock().unwrap().extend(batch.iter().cloned());
        batch.iter().map(|_| Ok(Published::stored())).collect()
    }
}

fn relay_options(poll: Duration) -> RelayOptions {
    RelayOptions::default()
        .with_lease(LONG_LEASE)
        .unwrap()
        .with_poll_interval(poll)
        .unwrap()
}

/// Runs `relay` until the returned sender is dropped or sent to.
fn spawn_relay<S: OutboxStore + ?Sized, P: Publisher + ?Sized + 'static>(
    relay: Relay<S, P>,
) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let (stop, mut stopped) = watch::channel(false);
    let task = tokio::spawn(async move {
        relay
            .run(async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            })
            .await;
    });
    (stop, task)
}

async fn state_of(outbox: &PostgresOutbox, id: MessageId) -> Option<MessageState> {
    outbox.message(id).await.unwrap().map(|m| m.state())
}

async fn stats(outbox: &PostgresOutbox) -> OutboxStats {
    outbox.stats().await.unwrap()
}

/// The whole of partition 0's log (the only one of a default outbox), once
/// it holds `count` messages: a message is read only once no older
/// transaction on the server (another test's included) is still running.
async fn log(outbox: &PostgresOutbox, count: usize) -> LogBatch {
    until(&format!("{count} messages read"), DEADLINE, || async {
        let batch = outbox.read(0, LogPosition::START, 1000).await.unwrap();
        (batch.messages.len() >= count).then_some(batch)
    })
    .await
}

/// Partition 0, leased to a fresh owner.
async fn lease(outbox: &PostgresOutbox) -> PartitionLease {
    outbox
        .acquire(OwnerToken::generate(), LONG_LEASE)
        .await
        .unwrap()
        .expect("a free partition")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_transaction_enqueues_nothing_and_keeps_no_sequence() {
    let outbox = outbox().await;
    let mut tx = outbox.pool().begin().await.unwrap();
    let inside = outbox
        .enqueue_in(&mut tx, &message("order-1", "placed"))
        .await
        .unwrap();
    assert_eq!(inside.parts().sequence, 1);
    tx.rollback().await.unwrap();
    assert_eq!(stats(&outbox).await.pending, 0);
    assert_eq!(state_of(&outbox, inside.id()).await, None);
    assert!(log(&outbox, 0).await.messages.is_empty());
    let after = outbox
        .enqueue(&message("order-1", "placed-again"))
        .await
        .unwrap();
    assert_eq!(
        after.parts().sequence,
        1,
        "the rollback kept its sequence taken"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_in_a_transaction_commits_with_it_and_returns_the_first_when_repeated() {
    let outbox = outbox().await;
    let placed = message("order-1", "placed");
    let mut tx = outbox.pool().begin().await.unwrap();
    let first = outbox.enqueue_in(&mut tx, &placed).await.unwrap();
    // Invisible to everyone else until the commit.
    assert_eq!(stats(&outbox).await.pending, 0);
    let again = outbox.enqueue_in(&mut tx, &placed).await.unwrap();
    assert_eq!(again, first);
    tx.commit().await.unwrap();
    assert_eq!(outbox.enqueue(&placed).await.unwrap(), first);
    assert_eq!(stats(&outbox).await.pending, 1);
    let headers = message("order-1", "paid")
        .with_header("content-type", "application/json")
        .unwrap()
        .with_header("x-trace", "")
        .unwrap();
    let stored = outbox.enqueue(&headers).await.unwrap();
    assert_eq!(stored.message(), &headers);
    assert_eq!(stored.parts().sequence, 2);
}

/// T1 enqueues first and commits last; T2, for another aggregate, commits
/// first. While T1 is open nothing past it is read (it could still land
/// before T2's message); once T1 commits, both are published, T1's first:
/// nothing is skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_commits_late_is_never_skipped() {
    let outbox = outbox().await;
    let recorder = Arc::new(Recorder::default());
    let mut t1 = outbox.pool().begin().await.unwrap();
    let late = outbox
        .enqueue_in(&mut t1, &message("order-1", "placed"))
        .await
        .unwrap();
    let mut t2 = outbox.pool().begin().await.unwrap();
    let early = outbox
        .enqueue_in(&mut t2, &message("order-2", "placed"))
        .await
        .unwrap();
    t2.commit().await.unwrap();
    assert!(late.parts().position < early.parts().position);

    let relay = Relay::new(
        Arc::new(outbox.clone()),
        Arc::clone(&recorder),
        relay_options(Duration::from_millis(50)),
    );
    let (stop, task) = spawn_relay(relay);
    // Several polls while T1 is open: T2's message waits behind it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(recorder.kinds(), Vec::<String>::new());
    assert_eq!(stats(&outbox).await.pending, 1);

    t1.commit().await.unwrap();
    let got = recorder.wait_for(2, DEADLINE).await;
    assert_eq!(
        got.iter().map(OutboxMessage::id).collect::<Vec<_>>(),
        [late.id(), early.id()]
    );
    let _ = stop.send(true);
    task.await.unwrap();
    assert_eq!(recorder.got().len(), 2, "{:?}", recorder.kinds());
    assert_eq!(state_of(&outbox, late.id()).await, Some(MessageState::Sent));
}

/// T2 took its transaction id before T1, then enqueues for T1's aggregate
/// and waits for T1's counter row: its message takes T1's place in the log
/// (never one before it), so the relay publishes the aggregate in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregates_later_message_follows_it_in_the_log_whatever_its_transactions_id() {
    let outbox = outbox().await;
    let mut t2 = outbox.pool().begin().await.unwrap();
    let pid = backend_pid(&mut t2).await;
    // An id of its own first: lower than T1's.
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *t2)
        .await
        .unwrap();
    let mut t1 = outbox.pool().begin().await.unwrap();
    let first = outbox
        .enqueue_in(&mut t1, &message("order-1", "placed"))
        .await
        .unwrap();
    let racer = enqueue_behind(&outbox, t2, pid).await;
    t1.commit().await.unwrap();
    let (t2, second) = racer.await.unwrap();
    let second = second.unwrap();
    t2.commit().await.unwrap();
    assert_eq!((first.parts().sequence, second.parts().sequence), (1, 2));
    assert!(
        second.parts().position > first.parts().position,
        "{:?} before {:?}",
        second.parts().position,
        first.parts().position
    );
    let read = log(&outbox, 2).await;
    assert_eq!(
        read.messages
            .iter()
            .map(OutboxMessage::id)
            .collect::<Vec<_>>(),
        [first.id(), second.id()]
    );
}

/// The process id of the connection under `tx`.
async fn backend_pid(tx: &mut sqlx::Transaction<'static, sqlx::Postgres>) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut **tx)
        .await
        .unwrap()
}

/// Enqueues order-1's "paid" in `t2` (the backend `pid`) in a task of its
/// own, once that enqueue waits for the aggregate's counter row another
/// transaction holds; the task answers `t2` and the enqueue.
async fn enqueue_behind(
    outbox: &PostgresOutbox,
    mut t2: sqlx::Transaction<'static, sqlx::Postgres>,
    pid: i32,
) -> tokio::task::JoinHandle<(
    sqlx::Transaction<'static, sqlx::Postgres>,
    Result<OutboxMessage, StoreError>,
)> {
    let racer = {
        let outbox = outbox.clone();
        tokio::spawn(async move {
            let second = outbox
                .enqueue_in(&mut t2, &message("order-1", "paid"))
                .await;
            (t2, second)
        })
    };
    wait_until_blocked(outbox.pool(), pid).await;
    racer
}

/// Waits until the backend `pid` waits for a lock.
async fn wait_until_blocked(pool: &PgPool, pid: i32) {
    until(
        "the second enqueue to wait for a lock",
        DEADLINE,
        || async {
            let waiting: Option<String> =
                sqlx::query_scalar("SELECT wait_event_type FROM pg_stat_activity WHERE pid = $1")
                    .bind(pid)
                    .fetch_optional(pool)
                    .await
                    .unwrap()
                    .flatten();
            (waiting.as_deref() == Some("Lock")).then_some(())
        },
    )
    .await;
}

/// T1 and T2 on one aggregate: T2 waits for T1's counter row, so its
/// sequence follows T1's commit, and the relay publishes them in that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueues_of_one_aggregate_take_sequences_in_commit_order() {
    let outbox = outbox().await;
    let mut t1 = outbox.pool().begin().await.unwrap();
    let first = outbox
        .enqueue_in(&mut t1, &message("order-1", "placed"))
        .await
        .unwrap();
    let mut t2 = outbox.pool().begin().await.unwrap();
    let pid = backend_pid(&mut t2).await;
    let racer = enqueue_behind(&outbox, t2, pid).await;
    assert!(!racer.is_finished(), "T2 did not wait for T1");
    t1.commit().await.unwrap();
    let (t2, second) = racer.await.unwrap();
    let second = second.unwrap();
    t2.commit().await.unwrap();
    assert_eq!((first.parts().sequence, second.parts().sequence), (1, 2));
    assert!(second.parts().enqueued_at >= first.parts().enqueued_at);

    let recorder = Arc::new(Recorder::default());
    let relay = Relay::new(
        Arc::new(outbox.clone()),
        Arc::clone(&recorder),
        relay_options(Duration::from_millis(50)),
    );
    let (stop, task) = spawn_relay(relay);
    recorder.wait_for(2, DEADLINE).await;
    let _ = stop.send(true);
    task.await.unwrap();
    assert_eq!(recorder.kinds(), ["order-1/placed", "order-1/paid"]);
}

/// T2 waits for T1's counter row; T1 rolls back; T2 takes sequence 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_enqueue_takes_the_sequence_a_rollback_gave_back() {
    let outbox = outbox().await;
    let mut t1 = outbox.pool().begin().await.unwrap();
    outbox
        .enqueue_in(&mut t1, &message("order-1", "placed"))
        .await
        .unwrap();
    let mut t2 = outbox.pool().begin().await.unwrap();
    let pid = backend_pid(&mut t2).await;
    let racer = enqueue_behind(&outbox, t2, pid).await;
    t1.rollback().await.unwrap();
    let (t2, second) = racer.await.unwrap();
    t2.commit().await.unwrap();
    assert_eq!(second.unwrap().parts().sequence, 1);
}

/// The listener survives the loss of its connection: after its backend is
/// terminated it listens again, and wakes the relay for the next commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_listens_again_after_losing_its_connection() {
    let outbox = outbox().await;
    let waker = Arc::new(Notify::new());
    let listener = outbox.listen(Arc::clone(&waker)).await.unwrap();
    let channel = outbox.channel();
    let listening = || async {
        sqlx::query_scalar::<_, i32>(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE $1 AND datname = current_database()",
        )
        // `LISTEN "channel"`, or `LISTEN "channel";` once sqlx listens again.
        .bind(format!(r#"LISTEN "{channel}"%"#))
        .fetch_all(outbox.pool())
        .await
        .unwrap()
    };
    let pids = until("the listener's backend", DEADLINE, || async {
        let pids = listening().await;
        (!pids.is_empty()).then_some(pids)
    })
    .await;
    for pid in &pids {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(outbox.pool())
            .await
            .unwrap();
    }
    // The reconnection itself wakes the relay (what was sent meanwhile is lost).
    tokio::time::timeout(DEADLINE, waker.notified())
        .await
        .expect("a wake-up on reconnection");
    until("the listener to listen again", DEADLINE, || async {
        let again = listening().await;
        (!again.is_empty() && again.iter().all(|pid| !pids.contains(pid))).then_some(())
    })
    .await;
    outbox.enqueue(&message("order-1", "placed")).await.unwrap();
    tokio::time::timeout(DEADLINE, waker.notified())
        .await
        .expect("a wake-up after the reconnection");
    assert!(!listener.is_finished());
}

/// A broker that holds its first batch until released.
struct Stalled {
    entered: Notify,
    release: Notify,
}

#[async_trait]
impl Publisher for Stalled {
    async fn publish(&self, batch: &[OutboxMessage]) -> Vec<Result<Published, PublishError>> {
        self.entered.notify_one();
        self.release.notified().await;
        batch.iter().map(|_| Ok(Published::stored())).collect()
    }
}

/// An outbox store that counts the reads it answered.
#[derive(Debug)]
struct Counted {
    inner: PostgresOutbox,
    reads: watch::Sender<u64>,
}

#[async_trait]
impl OutboxStore for Counted {
    async fn enqueue(&self, message: &NewMessage) -> Result<OutboxMessage, StoreError> {
        self.inner.enqueue(message).await
    }

    async fn acquire(
        &self,
        owner: OwnerToken,
        lease: Duration,
    ) -> Result<Option<PartitionLease>, StoreError> {
        self.inner.acquire(owner, lease).await
    }

    async fn read(
        &self,
        partition: u32,
        after: LogPosition,
        limit: usize,
    ) -> Result<LogBatch, StoreError> {
        let read = self.inner.read(partition, after, limit).await;
        self.reads.send_modify(|n| *n += 1);
        read
    }

    async fn advance(
        &self,
        lease: &PartitionLease,
        advance: &Advance,
    ) -> Result<PartitionLease, StoreError> {
        self.inner.advance(lease, advance).await
    }

    async fn due(&self, partition: u32, limit: usize) -> Result<Vec<OutboxMessage>, StoreError> {
        self.inner.due(partition, limit).await
    }

    async fn release(&self, lease: &PartitionLease) -> Result<bool, StoreError> {
        self.inner.release(lease).await
    }

    async fn parked(
        &self,
        after: Option<PageAfter>,
        limit: usize,
    ) -> Result<Vec<OutboxMessage>, StoreError> {
        self.inner.parked(after, limit).await
    }

    async fn retry(&self, id: MessageId) -> Result<bool, StoreError> {
        self.inner.retry(id).await
    }

    async fn drop_message(&self, id: MessageId, reason: &str) -> Result<bool, StoreError> {
        self.inner.drop_message(id, reason).await
    }

    async fn message(&self, id: MessageId) -> Result<Option<OutboxMessage>, StoreError> {
        self.inner.message(id).await
    }

    async fn purge_sent(&self, older_than: Duration, limit: usize) -> Result<u64, StoreError> {
        self.inner.purge_sent(older_than, limit).await
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        self.inner.stats().await
    }

    fn capabilities(&self) -> idem_core::store::Capabilities {
        self.inner.capabilities()
    }
}

/// A relay polling once a minute over `outbox`, its listener, and its
/// reads counted, once its first pass found nothing: it now sleeps for a
/// minute unless something wakes it.
async fn listening_relay(
    outbox: &PostgresOutbox,
) -> (
    Arc<Recorder>,
    watch::Receiver<u64>,
    idem_postgres::OutboxListener,
    watch::Sender<bool>,
    tokio::task::JoinHandle<()>,
) {
    let (reads, read) = watch::channel(0u64);
    let store = Arc::new(Counted {
        inner: outbox.clone(),
        reads,
    });
    let recorder = Arc::new(Recorder::default());
    let relay = Relay::new(
        store,
        Arc::clone(&recorder),
        relay_options(Duration::from_secs(60)),
    );
    let listener = outbox.listen(relay.waker()).await.unwrap();
    let (stop, task) = spawn_relay(relay);
    let mut first = read.clone();
    tokio::time::timeout(DEADLINE, first.wait_for(|n| *n >= 1))
        .await
        .expect("the relay's first pass")
        .unwrap();
    (recorder, read, listener, stop, task)
}

/// A relay polling once a minute publishes a committed message within
/// seconds: the listener woke it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_wakes_a_relay_when_a_message_commits() {
    let outbox = outbox().await;
    let (recorder, _read, listener, stop, task) = listening_relay(&outbox).await;

    let mut tx = outbox.pool().begin().await.unwrap();
    let placed = outbox
        .enqueue_in(&mut tx, &message("order-1", "placed"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let got = recorder.wait_for(1, Duration::from_secs(10)).await;
    assert_eq!(got[0].id(), placed.id());
    assert!(!listener.is_finished());

    let _ = stop.send(true);
    task.await.unwrap();
    drop(listener);
}

/// A wake-up whose message an older transaction still holds back (the
/// read stops below the oldest running transaction) is looked at again:
/// the relay polling once a minute publishes it soon after that
/// transaction ends, with no second notification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_up_held_back_by_an_older_transaction_is_looked_at_again() {
    let outbox = outbox().await;
    let (recorder, mut read, listener, stop, task) = listening_relay(&outbox).await;

    // An older transaction with an id of its own, running across the
    // message's commit.
    let mut older = outbox.pool().begin().await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *older)
        .await
        .unwrap();
    let before = *read.borrow();
    let mut tx = outbox.pool().begin().await.unwrap();
    let placed = outbox
        .enqueue_in(&mut tx, &message("order-1", "placed"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // The wake-up's pass ran, and read nothing: the message is held back.
    tokio::time::timeout(DEADLINE, read.wait_for(|n| *n > before))
        .await
        .expect("the wake-up's pass")
        .unwrap();
    assert!(recorder.got().is_empty());

    older.commit().await.unwrap();
    let got = recorder.wait_for(1, Duration::from_secs(10)).await;
    assert_eq!(got[0].id(), placed.id());

    let _ = stop.send(true);
    task.await.unwrap();
    drop(listener);
}

/// A relay whose lease lapsed while it published moves no cursor: the
/// relay that took the partition over publishes again, and settles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_relay_cannot_move_the_cursor() {
    let outbox = Arc::new(outbox().await);
    let placed = outbox.enqueue(&message("order-1", "placed")).await.unwrap();
    let stalled = Arc::new(Stalled {
        entered: Notify::new(),
        release: Notify::new(),
    });
    let short = RelayOptions::default()
        .with_lease(Duration::from_millis(300))
        .unwrap();
    let stale = Relay::new(Arc::clone(&outbox), Arc::clone(&stalled), short);
    // A pass reads only what no running transaction can still precede: on
    // a server other tests share, one may read nothing yet, and the relay
    // passes again (keeping its partition) until it reads the message.
    let stale_pass = tokio::spawn(async move {
        loop {
            let pass = stale.relay_once().await?;
            if pass.read > 0 {
                return Ok::<_, idem_outbox::RelayError>(pass);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    tokio::time::timeout(DEADLINE, stalled.entered.notified())
        .await
        .expect("the stale relay to publish");

    let recorder = Arc::new(Recorder::default());
    let fresh = Relay::new(
        Arc::clone(&outbox),
        Arc::clone(&recorder),
        relay_options(Duration::from_secs(60)),
    );
    until(
        "the fresh relay to take the partition over",
        DEADLINE,
        || async {
            let pass = fresh.relay_once().await.unwrap();
            (pass.published == 1).then_some(())
        },
    )
    .await;

    stalled.release.notify_one();
    let pass = stale_pass.await.unwrap().unwrap();
    assert_eq!((pass.read, pass.published, pass.lost), (1, 0, 1));
    assert_eq!(recorder.got()[0].id(), placed.id());
    assert_eq!(
        state_of(&outbox, placed.id()).await,
        Some(MessageState::Sent)
    );
    assert_eq!(stats(&outbox).await.pending, 0);
}

/// Only sent and dropped messages are purged, in bounded batches; pending,
/// waiting and parked ones stay, and a purged aggregate counts on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purge_never_deletes_an_unsent_message() {
    let outbox = outbox().await;
    let sent = outbox.enqueue(&message("sent", "m")).await.unwrap();
    let parked = outbox.enqueue(&message("parked", "m")).await.unwrap();
    let waiting = outbox.enqueue(&message("waiting", "m")).await.unwrap();
    let dropped = outbox.enqueue(&message("dropped", "m")).await.unwrap();
    let lease = lease(&outbox).await;
    let refused = |m: &OutboxMessage, max| {
        PublishFailure::new(m.id(), 0, "refused")
            .retry_after(LONG_LEASE)
            .max_attempts(max)
    };
    outbox
        .advance(
            &lease,
            &Advance::to(dropped.parts().position)
                .failed(refused(&parked, 1))
                .failed(refused(&waiting, 5))
                .failed(refused(&dropped, 1)),
        )
        .await
        .unwrap();
    assert!(outbox.drop_message(dropped.id(), "obsolete").await.unwrap());
    let pending = outbox.enqueue(&message("pending", "m")).await.unwrap();
    let later = outbox.enqueue(&message("sent", "later")).await.unwrap();

    assert_eq!(
        outbox
            .purge_sent(Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        0
    );
    assert_eq!(outbox.purge_sent(Duration::ZERO, 1).await.unwrap(), 1);
    assert_eq!(outbox.purge_sent(Duration::ZERO, 100).await.unwrap(), 1);
    assert_eq!(outbox.purge_sent(Duration::ZERO, 100).await.unwrap(), 0);
    for (m, state) in [
        (&parked, Some(MessageState::Parked)),
        (&waiting, Some(MessageState::Waiting)),
        (&pending, Some(MessageState::Pending)),
        (&later, Some(MessageState::Pending)),
        (&sent, None),
        (&dropped, None),
    ] {
        assert_eq!(
            state_of(&outbox, m.id()).await,
            state,
            "{}",
            m.message().aggregate()
        );
    }
    assert_eq!(later.parts().sequence, 2, "the purged aggregate counts on");
    let stats = stats(&outbox).await;
    assert_eq!((stats.pending, stats.parked), (3, 1));
}

/// Every operation, for every outcome, is one statement round trip: the
/// sequence runs twice over one connection, the first to prepare the
/// statements, and the second is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_outbox_operation_and_outcome_is_one_statement_round_trip() {
    let (options, upstream) = common::server();
    let proxy = CountingProxy::start(upstream).await;
    let pool = idem_postgres::guarded(sqlx::postgres::PgPoolOptions::new())
        .max_connections(1)
        .connect_with(common::via_proxy(options, proxy.port))
        .await
        .unwrap();
    let outbox = outbox_on(pool, &fresh_table()).await;
    let mut report = Vec::new();
    for lap in 0..2 {
        report.clear();
        macro_rules! cost {
            ($what:expr, $op:expr) => {{
                let before = proxy.statements();
                let value = $op;
                report.push(($what, proxy.statements() - before));
                value
            }};
        }
        let aggregate = format!("order-{lap}");
        let owner = OwnerToken::generate();
        let a = message(&aggregate, "a");
        let stored = cost!("enqueue: new", outbox.enqueue(&a).await.unwrap());
        cost!("enqueue: existing", outbox.enqueue(&a).await.unwrap());
        let lease = cost!(
            "acquire",
            outbox.acquire(owner, LONG_LEASE).await.unwrap().unwrap()
        );
        cost!(
            "acquire: none free",
            assert_eq!(
                outbox
                    .acquire(OwnerToken::generate(), LONG_LEASE)
                    .await
                    .unwrap(),
                None
            )
        );
        // Readable once older transactions on the server ended.
        until("the message to be read", DEADLINE, || async {
            let batch = outbox.read(0, lease.cursor(), 10).await.unwrap();
            (!batch.messages.is_empty()).then_some(())
        })
        .await;
        let read = cost!("read", outbox.read(0, lease.cursor(), 10).await.unwrap());
        assert_eq!(read.messages.len(), 1);
        cost!(
            "read: nothing",
            outbox.read(0, stored.parts().position, 10).await.unwrap()
        );
        let lease = cost!(
            "advance",
            outbox
                .advance(&lease, &Advance::to(stored.parts().position))
                .await
                .unwrap()
        );
        let b = outbox.enqueue(&message(&aggregate, "b")).await.unwrap();
        let c = outbox.enqueue(&message(&aggregate, "c")).await.unwrap();
        let lease = cost!(
            "advance: failed and held",
            outbox
                .advance(
                    &lease,
                    &Advance::to(c.parts().position)
                        .failed(PublishFailure::new(b.id(), 0, "x").max_attempts(5))
                        .held(c.id()),
                )
                .await
                .unwrap()
        );
        let due = cost!("due", outbox.due(0, 10).await.unwrap());
        assert_eq!(due.len(), 1);
        let lease = cost!(
            "advance: sent and parked",
            outbox
                .advance(
                    &lease,
                    &Advance::default()
                        .sent(b.id())
                        .failed(PublishFailure::new(c.id(), 0, "x").max_attempts(1)),
                )
                .await
                .unwrap()
        );
        cost!(
            "due: nothing",
            assert!(outbox.due(0, 10).await.unwrap().is_empty())
        );
        let forged = PartitionLease::issued(
            0,
            OwnerToken::generate(),
            LONG_LEASE,
            lease.until(),
            lease.cursor(),
        );
        cost!(
            "advance: lost lease",
            assert!(matches!(
                outbox.advance(&forged, &Advance::default()).await,
                Err(StoreError::LostLease)
            ))
        );
        cost!(
            "advance_and_read: lost lease",
            assert!(matches!(
                outbox
                    .advance_and_read(&forged, &Advance::default(), LogPosition::START, 10)
                    .await,
                Err(StoreError::LostLease)
            ))
        );
        let answer = cost!(
            "advance_and_read",
            outbox
                .advance_and_read(
                    &lease,
                    &Advance::to(stored.parts().position),
                    LogPosition::START,
                    10
                )
                .await
                .unwrap()
        );
        let read: Vec<MessageId> = answer
            .batch
            .unwrap()
            .messages
            .iter()
            .map(|m| m.id())
            .collect();
        assert_eq!(read, [stored.id()]);
        // The settlement of the lane above, delivered again: it changes
        // nothing, and costs what any advance does.
        let answer = cost!(
            "advance_and_read: sent and failed",
            outbox
                .advance_and_read(
                    &lease,
                    &Advance::default()
                        .sent(b.id())
                        .failed(PublishFailure::new(c.id(), 0, "x").max_attempts(1)),
                    LogPosition::START,
                    10
                )
                .await
                .unwrap()
        );
        assert_eq!(answer.batch.unwrap().messages.len(), 1);
        let answer = cost!(
            "advance_and_read: nothing read",
            outbox
                .advance_and_read(&lease, &Advance::default(), stored.parts().position, 10)
                .await
                .unwrap()
        );
        assert!(answer.batch.unwrap().messages.is_empty());
        let lease = answer.lease;
        cost!("parked", outbox.parked(None, 10).await.unwrap());
        cost!("retry", assert!(outbox.retry(c.id()).await.unwrap()));
        cost!("retry: not parked", outbox.retry(c.id()).await.unwrap());
        outbox
            .advance(
                &lease,
                &Advance::default().failed(PublishFailure::new(c.id(), 0, "x").max_attempts(1)),
            )
            .await
            .unwrap();
        cost!(
            "drop_message",
            assert!(outbox.drop_message(c.id(), "r").await.unwrap())
        );
        cost!(
            "drop_message: not parked",
            outbox.drop_message(c.id(), "r").await.unwrap()
        );
        let read = cost!("message", outbox.message(c.id()).await.unwrap());
        assert_eq!(read.map(|m| m.state()), Some(MessageState::Dropped));
        cost!(
            "message: missing",
            assert!(
                outbox
                    .message(MessageId::generate())
                    .await
                    .unwrap()
                    .is_none()
            )
        );
        // The sent (a from the log, b from the lane) and dropped (c)
        // messages of this lap.
        let purged = cost!(
            "purge_sent",
            outbox.purge_sent(Duration::ZERO, 100).await.unwrap()
        );
        assert_eq!(purged, 3);
        cost!("stats", outbox.stats().await.unwrap());
        cost!("release", assert!(outbox.release(&lease).await.unwrap()));
        cost!(
            "release: not held",
            assert!(!outbox.release(&lease).await.unwrap())
        );
        let mut tx = outbox.pool().begin().await.unwrap();
        cost!(
            "enqueue_in",
            outbox
                .enqueue_in(&mut tx, &message(&aggregate, "d"))
                .await
                .unwrap()
        );
        tx.rollback().await.unwrap();
    }
    println!("{report:#?}");
    for (what, n) in &report {
        assert_eq!(*n, 1, "{what} took {n} statement round trips: {report:?}");
    }
}

/// Four relays at once over 2,000 messages of 50 aggregates in eight
/// partitions, enqueued while they run: the relays share the partitions,
/// and every message is published once, each aggregate's in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_relays_publish_every_message_once_in_order_per_aggregate() {
    const AGGREGATES: usize = 50;
    const PER_AGGREGATE: usize = 40;
    const ENQUEUERS: usize = 10;
    let outbox = Arc::new(partitioned(8).await);
    let recorder = Arc::new(Recorder::default());
    let options = relay_options(Duration::from_millis(50))
        .with_batch(25)
        .unwrap()
        .with_max_partitions(3)
        .unwrap();
    let mut relays = Vec::new();
    let mut listeners = Vec::new();
    for i in 0..4 {
        let relay = Relay::new(Arc::clone(&outbox), Arc::clone(&recorder), options);
        if i < 2 {
            listeners.push(outbox.listen(relay.waker()).await.unwrap());
        }
        relays.push(spawn_relay(relay));
    }
    let enqueuers: Vec<_> = (0..ENQUEUERS)
        .map(|e| {
            let outbox = Arc::clone(&outbox);
            tokio::spawn(async move {
                for n in 1..=PER_AGGREGATE {
                    for a in (e..AGGREGATES).step_by(ENQUEUERS) {
                        let m = message(&format!("agg-{a}"), &format!("k{n}"));
                        // Every third one inside a transaction of its own.
                        if n % 3 == 0 {
                            let mut tx = outbox.pool().begin().await.unwrap();
                            outbox.enqueue_in(&mut tx, &m).await.unwrap();
                            tx.commit().await.unwrap();
                        } else {
                            outbox.enqueue(&m).await.unwrap();
                        }
                    }
                }
            })
        })
        .collect();
    for enqueuer in enqueuers {
        enqueuer.await.unwrap();
    }
    let total = AGGREGATES * PER_AGGREGATE;
    recorder.wait_for(total, Duration::from_secs(300)).await;
    until("the outbox to drain", DEADLINE, || async {
        (stats(&outbox).await.pending == 0).then_some(())
    })
    .await;
    for (stop, task) in relays {
        let _ = stop.send(true);
        task.await.unwrap();
    }
    drop(listeners);

    let got = recorder.got();
    assert_eq!(got.len(), total, "a message was published twice");
    let ids: HashSet<MessageId> = got.iter().map(OutboxMessage::id).collect();
    assert_eq!(ids.len(), total, "a message was published twice");
    let mut per_aggregate: HashMap<&str, Vec<u64>> = HashMap::new();
    for m in &got {
        let sequence = m.parts().sequence;
        assert_eq!(
            m.message().kind(),
            format!("k{sequence}"),
            "sequence and enqueue order differ"
        );
        per_aggregate
            .entry(m.message().aggregate())
            .or_default()
            .push(sequence);
    }
    assert_eq!(per_aggregate.len(), AGGREGATES);
    let expected: Vec<u64> = (1..=PER_AGGREGATE as u64).collect();
    for (aggregate, sequences) in per_aggregate {
        assert_eq!(sequences, expected, "{aggregate} published out of order");
    }
}

/// A schema-qualified table: every object in the schema, and its channel
/// named after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_qualified_table_migrates_works_and_notifies() {
    let pool = common::pool().await;
    sqlx::query("CREATE SCHEMA IF NOT EXISTS app")
        .execute(&pool)
        .await
        // Racing test binaries may both create it: one of them wins.
        .or_else(|e| match &e {
            sqlx::Error::Database(db) if db.code().as_deref() == Some("23505") => {
                Ok(Default::default())
            }
            _ => Err(e),
        })
        .unwrap();
    let table = fresh_table();
    let qualified = format!("app.{table}");
    let outbox = PostgresOutbox::with_options(
        pool.clone(),
        PostgresOutboxOptions::default().table(&qualified),
    )
    .unwrap();
    assert_eq!(outbox.table().to_string(), qualified);
    assert_eq!(outbox.channel(), qualified);
    outbox.migrate().await.unwrap();
    outbox.migrate().await.unwrap();

    for (kind, name) in [
        ("r", table.clone()),
        ("r", format!("{table}_aggregates")),
        ("r", format!("{table}_partitions")),
        ("i", format!("{table}_log_idx")),
        ("i", format!("{table}_lane_idx")),
        ("i", format!("{table}_parked_idx")),
        ("i", format!("{table}_finished_idx")),
    ] {
        let found: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = 'app' AND c.relname = $1 AND c.relkind::text = $2",
        )
        .bind(&name)
        .bind(kind)
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(found, 1, "app.{name}");
    }
    for function in ["now", "xmin", "enqueue", "set_partitions"] {
        let found: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = 'app' AND p.proname = $1",
        )
        .bind(format!("{table}_{function}"))
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(found, 1, "app.{table}_{function}");
    }

    let waker = Arc::new(Notify::new());
    let _listener = outbox.listen(Arc::clone(&waker)).await.unwrap();
    let placed = outbox.enqueue(&message("order-1", "placed")).await.unwrap();
    tokio::time::timeout(DEADLINE, waker.notified())
        .await
        .expect("a notification on the qualified table's channel");
    let lease = outbox
        .acquire(OwnerToken::generate(), LONG_LEASE)
        .await
        .unwrap()
        .unwrap();
    let read = until("the message to be read", DEADLINE, || async {
        let batch = outbox.read(0, lease.cursor(), 10).await.unwrap();
        (!batch.messages.is_empty()).then_some(batch)
    })
    .await;
    assert_eq!(read.messages.len(), 1);
    assert_eq!(read.messages[0].id(), placed.id());
    outbox
        .advance(&lease, &Advance::to(placed.parts().position))
        .await
        .unwrap();
    assert_eq!(
        state_of(&outbox, placed.id()).await,
        Some(MessageState::Sent)
    );
}

#[test]
fn invalid_options_are_refused_at_construction() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let pool = sqlx::postgres::PgPoolOptions::new().connect_lazy_with(common::server().0);
        for bad in ["Outbox", "a.b.c", "x; drop table y", ""] {
            assert!(
                matches!(
                    PostgresOutbox::with_options(
                        pool.clone(),
                        PostgresOutboxOptions::default().table(bad)
                    ),
                    Err(StoreError::InvalidInput(_))
                ),
                "{bad:?}"
            );
        }
        for count in [0, 1025] {
            assert!(matches!(
                PostgresOutbox::with_options(
                    pool.clone(),
                    PostgresOutboxOptions::default().partitions(count)
                ),
                Err(StoreError::InvalidInput(_))
            ));
        }
        let zero = idem_core::StoreOptions::default().with_operation_timeout(Duration::ZERO);
        assert!(matches!(
            PostgresOutbox::with_options(
                pool,
                PostgresOutboxOptions::default().store_options(zero)
            ),
            Err(StoreError::InvalidInput(_))
        ));
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_name_a_durable_store_on_the_servers_clock() {
    use idem_core::store::{ClockSource, Durability, TransactionSharing};
    let outbox = PostgresOutbox::new(
        sqlx::postgres::PgPoolOptions::new().connect_lazy_with(common::server().0),
    );
    let caps = outbox.capabilities();
    assert_eq!(caps.store, "postgres");
    assert_eq!(caps.clock, ClockSource::Server);
    assert_eq!(caps.durability, Durability::Durable);
    assert_eq!(caps.transactions, TransactionSharing::SameDatabase);
}

/// Inside the runner's `run_in`: the handler's event commits with its
/// record, a replay enqueues nothing more, and a handler that fails rolls
/// its event back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_enqueued_inside_run_in_commits_with_the_record_and_only_once() {
    use idem_core::{Fingerprint, HandlerError, RunError, Scope, StoredResponse};
    let store = common::store().await;
    let outbox = Arc::new(outbox_on(store.pool().clone(), &fresh_table()).await);
    let idem = common::runner(&store, Duration::from_secs(30));
    let tenant = format!("outbox-{}", uuid::Uuid::new_v4());
    let scope = Scope::parse(&tenant, "order-42").unwrap();
    for _ in 0..2 {
        let events = Arc::clone(&outbox);
        let outcome = idem
            .run_in(
                scope.clone(),
                Fingerprint::of_bytes("order 42"),
                store.begin(),
                |_, mut tx| async move {
                    events
                        .enqueue_in(&mut tx, &message("order-42", "placed"))
                        .await?;
                    Ok((tx, StoredResponse::new(201, "placed")))
                },
            )
            .await
            .unwrap();
        assert_eq!(outcome.response().status(), 201);
    }
    assert_eq!(stats(&outbox).await.pending, 1, "a replay enqueued again");
    let failed = idem
        .run_in(
            Scope::parse(&tenant, "order-43").unwrap(),
            Fingerprint::of_bytes("order 43"),
            store.begin(),
            |_, mut tx| {
                let events = Arc::clone(&outbox);
                async move {
                    events
                        .enqueue_in(&mut tx, &message("order-43", "placed"))
                        .await?;
                    Err::<(idem_postgres::PgTransaction, StoredResponse), _>(
                        HandlerError::not_started("the order was refused"),
                    )
                }
            },
        )
        .await;
    assert!(matches!(failed, Err(RunError::NotStarted(_))), "{failed:?}");
    assert_eq!(
        stats(&outbox).await.pending,
        1,
        "a rolled-back event survived"
    );
}

/// The partition count is the options', set by `migrate`: messages land in
/// their aggregates' partitions; it grows or shrinks only while nothing is
/// unsent, and a migrate that would move unsent messages is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_partition_count_changes_only_while_nothing_is_unsent() {
    let pool = common::pool().await;
    let table = fresh_table();
    let with = |count| {
        PostgresOutbox::with_options(
            pool.clone(),
            PostgresOutboxOptions::default()
                .table(&table)
                .partitions(count),
        )
        .unwrap()
    };
    let four = with(4);
    four.migrate().await.unwrap();
    assert_eq!(four.stats().await.unwrap().partitions.len(), 4);
    let placed = four.enqueue(&message("order-7", "placed")).await.unwrap();
    assert_eq!(
        placed.parts().partition,
        idem_core::store::partition_of("order-7", 4)
    );
    let error = with(2).migrate().await.unwrap_err();
    assert!(error.to_string().contains("unsent"), "{error}");
    assert_eq!(four.stats().await.unwrap().partitions.len(), 4);
    // Once it is sent, the count changes.
    let owner = OwnerToken::generate();
    let lease = loop {
        let lease = four.acquire(owner, LONG_LEASE).await.unwrap().unwrap();
        if lease.partition() == placed.parts().partition {
            break lease;
        }
    };
    four.advance(&lease, &Advance::to(placed.parts().position))
        .await
        .unwrap();
    let two = with(2);
    two.migrate().await.unwrap();
    assert_eq!(two.stats().await.unwrap().partitions.len(), 2);
    let next = two.enqueue(&message("order-7", "paid")).await.unwrap();
    assert_eq!(
        next.parts().partition,
        idem_core::store::partition_of("order-7", 2)
    );
    assert_eq!(next.parts().sequence, 2);
    // What was sent through a partition that went is purged as sent.
    assert_eq!(state_of(&two, placed.id()).await, Some(MessageState::Sent));
}

/// A table of the earlier design (a lease per message) is replaced by the
/// migration when nothing in it is unsent, and refused, untouched, when
/// something is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_versions_table_is_replaced_only_when_nothing_is_unsent() {
    let pool = common::pool().await;
    let table = fresh_table();
    let create = |state: &'static str| {
        let (pool, table) = (pool.clone(), table.clone());
        async move {
            sqlx::query(AssertSqlSafe(format!(
                "CREATE TABLE {table} (id uuid PRIMARY KEY, aggregate text, sequence bigint, \
                 state text NOT NULL, lease_owner uuid, lease_until bigint)"
            )))
            .execute(&pool)
            .await
            .unwrap();
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {table} VALUES (gen_random_uuid(), 'order-1', 1, '{state}', NULL, NULL)"
            )))
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    create("pending").await;
    let outbox =
        PostgresOutbox::with_options(pool.clone(), PostgresOutboxOptions::default().table(&table))
            .unwrap();
    let error = outbox.migrate().await.unwrap_err();
    assert!(error.to_string().contains("earlier version"), "{error}");
    sqlx::query(AssertSqlSafe(format!("UPDATE {table} SET state = 'sent'")))
        .execute(&pool)
        .await
        .unwrap();
    outbox.migrate().await.unwrap();
    let placed = outbox.enqueue(&message("order-1", "placed")).await.unwrap();
    assert_eq!(log(&outbox, 1).await.messages[0].id(), placed.id());
}

/// Index blocks of `index` that `statement` reads, on `pool`, a pool of
/// one connection that every statement on `index`'s table went through:
/// the server's counts are flushed by that one backend, as it goes idle
/// before it answers, once forced, so nothing it did earlier lands between
/// the two counts.
async fn index_blocks_read(pool: &PgPool, index: &str, statement: &str) -> i64 {
    let blocks = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT (idx_blks_hit + idx_blks_read)::bigint FROM pg_statio_user_indexes \
             WHERE indexrelid = $1::regclass",
        )
        .bind(index)
        .fetch_one(pool)
        .await
        .unwrap()
    };
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(pool)
        .await
        .unwrap();
    let before = blocks().await;
    // One simple query: the statement's counts are flushed once both ran.
    sqlx::raw_sql(AssertSqlSafe(format!(
        "SELECT pg_stat_force_next_flush(); {statement}"
    )))
    .execute(pool)
    .await
    .unwrap();
    blocks().await - before
}

/// A read of 100 from the end of a log of 20,000 already sent, and the
/// stats' count of the 100 past the cursor, walk the log's index from the
/// position: a few blocks, not the 100 or so of the whole log (an equality
/// on the partition beside the row comparison made Postgres start at the
/// partition's first entry). On a new table with no statistics, and on one
/// whose statistics were taken when it was empty.
#[tokio::test]
async fn a_read_and_the_stats_walk_the_log_from_the_position_not_from_its_start() {
    // One connection for every statement: see `index_blocks_read`.
    let pool = common::pool_for(&common::url(), 1).await;
    let fill = |table: String| {
        let pool = pool.clone();
        async move {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {table} (okey, part, id, aggregate, sequence, kind, header_names, \
                 header_values, payload, enqueued_at, available_at) \
                 SELECT 1, 0, gen_random_uuid(), 'order-' || (i % 100), 1 + i / 100, 'order.placed', \
                 '{{}}', '{{}}', '\\x00', i, i FROM generate_series(0, 19999) i"
            )))
            .execute(&pool)
            .await
            .unwrap();
        }
    };
    let no_statistics = fresh_table();
    let fresh = outbox_on(pool.clone(), &no_statistics).await;
    fill(no_statistics.clone()).await;
    let stale = fresh_table();
    let analyzed = outbox_on(pool.clone(), &stale).await;
    sqlx::query(AssertSqlSafe(format!("ANALYZE {stale}")))
        .execute(&pool)
        .await
        .unwrap();
    fill(stale.clone()).await;

    for (table, outbox) in [(no_statistics, fresh), (stale, analyzed)] {
        let (key, pos): (i64, i64) = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT okey, pos FROM {table} ORDER BY okey, pos OFFSET 19899 LIMIT 1"
        )))
        .fetch_one(&pool)
        .await
        .unwrap();
        let index = format!("{table}_log_idx");
        let read = index_blocks_read(
            &pool,
            &index,
            &format!("SELECT count(*) FROM {table}_read(0, {key}, {pos}, 100)"),
        )
        .await;
        assert!(
            read <= 10,
            "{table}: a read of 100 read {read} index blocks"
        );
        sqlx::query(AssertSqlSafe(format!(
            "UPDATE {table}_partitions SET cursor_key = {key}, cursor_pos = {pos} WHERE part = 0"
        )))
        .execute(&pool)
        .await
        .unwrap();
        let counted =
            index_blocks_read(&pool, &index, &format!("SELECT * FROM {table}_stats()")).await;
        assert!(
            counted <= 10,
            "{table}: the stats read {counted} index blocks"
        );
        // The store's own read and stats answer the same batch.
        let position = LogPosition::new(u64::try_from(key).unwrap(), u64::try_from(pos).unwrap());
        let batch = outbox.read(0, position, 1000).await.unwrap();
        assert_eq!(batch.messages.len(), 100);
        assert!(batch.blocked.is_empty());
        assert_eq!(stats(&outbox).await.pending, 100);
    }
}

/// The read, the advance and the stats are functions that Postgres plans
/// once per session (the first two) and never compiles: planning the read
/// anew cost as much as running it, and JIT, which the planner's guess for
/// a large log turns on, hundreds of milliseconds a call.
#[tokio::test]
async fn the_read_and_the_advance_are_planned_once_per_session_and_none_is_compiled() {
    let pool = common::pool().await;
    let table = fresh_table();
    outbox_on(pool.clone(), &table).await;
    for (function, settings) in [
        (
            "read",
            vec!["jit=off", "plan_cache_mode=force_generic_plan"],
        ),
        (
            "advance",
            vec!["jit=off", "plan_cache_mode=force_generic_plan"],
        ),
        ("stats", vec!["jit=off"]),
    ] {
        let config: Vec<String> = sqlx::query_scalar(
            "SELECT coalesce(proconfig, '{}') FROM pg_proc WHERE oid = $1::regproc",
        )
        .bind(format!("{table}_{function}"))
        .fetch_one(&pool)
        .await
        .unwrap();
        for setting in settings {
            assert!(
                config.iter().any(|c| c == setting),
                "{function}: {config:?}"
            );
        }
    }
}
