//! The cases of a record store's transactions that batch: one `pub async
//! fn` per sentence of [`Transaction`]'s batch operations
//! ([`claim`](Transaction::claim) inside a transaction, and savepoints), run
//! on a [`BatchingStore`] (the store, and a way to open its transactions).
//! A consumer handles a batch of messages in one such transaction; every
//! case works in a scope of its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use idem_core::store::{
    ClaimOutcome, ClaimRequest, IdempotencyStore, Lease, RecordState, Transaction,
};
use idem_core::{Checkpoint, Fingerprint, Scope, StoreError, StoredResponse};

use crate::support::fresh_scope;

/// A transaction being opened.
pub type Opening<T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send>>;

/// A record store and a way to open its transactions, which batch: what
/// the batch cases run on. [`Batching`] is one for any store.
pub trait BatchingStore: Send + Sync + 'static {
    /// The record store.
    type Store: IdempotencyStore;
    /// Its transaction.
    type Tx: Transaction;

    /// The record store.
    fn store(&self) -> &Self::Store;

    /// Opens a transaction.
    fn begin(&self) -> Opening<Self::Tx>;
}

/// A store and the function that opens its transactions, as a
/// [`BatchingStore`].
///
/// ```
/// use idem_conformance::batches::Batching;
/// use idem_memory::MemoryStore;
///
/// // Your store's `begin`, owning what the transaction needs.
/// let batching = Batching::new(MemoryStore::new(), |store| {
///     let tx = store.begin();
///     async move { Ok(tx) }
/// });
/// # let _ = batching;
/// ```
pub struct Batching<S, T> {
    store: S,
    begin: OpenWith<S, T>,
}

/// How a [`Batching`] opens a transaction of its store.
type OpenWith<S, T> = Box<dyn Fn(&S) -> Opening<T> + Send + Sync>;

impl<S: IdempotencyStore, T: Transaction> Batching<S, T> {
    /// `store`, whose transactions `begin` opens.
    pub fn new<F, Fut>(store: S, begin: F) -> Self
    where
        F: Fn(&S) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        Self {
            store,
            begin: Box::new(move |store| Box::pin(begin(store))),
        }
    }
}

impl<S: IdempotencyStore, T: Transaction> BatchingStore for Batching<S, T> {
    type Store = S;
    type Tx = T;

    fn store(&self) -> &S {
        &self.store
    }

    fn begin(&self) -> Opening<T> {
        (self.begin)(&self.store)
    }
}

/// How long a transaction holding a claim waits for a rival's claim to
/// reach the store before it commits: a store that makes the rival wait
/// holds it this long; one that decides at the commit lets it commit first.
const RIVAL: Duration = Duration::from_millis(300);

fn request(scope: &Scope, payload: &[u8]) -> ClaimRequest {
    ClaimRequest::new(scope.clone(), Fingerprint::of_bytes(payload))
        .with_lease(Duration::from_secs(30))
        .expect("a valid lease")
}

async fn begin<S: BatchingStore>(batching: &S) -> S::Tx {
    let tx = batching.begin().await.expect("begin a transaction");
    assert!(tx.batches(), "the suite runs on transactions that batch");
    tx
}

/// Claims `scope` in `tx`, which must claim it.
async fn claimed<T: Transaction>(tx: &mut T, scope: &Scope) -> Lease {
    match tx.claim(&request(scope, b"x")).await {
        Ok(ClaimOutcome::Claimed { lease, .. }) => lease,
        other => panic!("expected a claim of {scope:?}, got {other:?}"),
    }
}

/// Claims and completes `scope` in `tx` with `body`.
async fn claim_and_complete<T: Transaction>(tx: &mut T, scope: &Scope, body: &str) {
    let lease = claimed(tx, scope).await;
    tx.complete(&lease, &StoredResponse::new(200, body))
        .await
        .expect("complete in the transaction");
}

/// The body `scope`'s record was completed with, `None` while it has no
/// record, panicking on one in flight.
async fn completed_body<S: IdempotencyStore>(store: &S, scope: &Scope) -> Option<Vec<u8>> {
    let record = store.get(scope).await.expect("get")?;
    match record.state() {
        RecordState::Completed { response } => Some(response.body().to_vec()),
        state => panic!("{scope:?} is not completed: {state:?}"),
    }
}

/// Two scopes claimed through the store: the first completed with
/// `201 done`, the second held by its live lease.
async fn completed_and_held<S: IdempotencyStore>(store: &S) -> (Scope, Scope) {
    let (done, held) = (fresh_scope(), fresh_scope());
    let Ok(ClaimOutcome::Claimed { lease, .. }) = store.claim(&request(&done, b"x")).await else {
        panic!("the store claims a fresh scope");
    };
    store
        .complete(&lease, &StoredResponse::new(201, "done"))
        .await
        .unwrap();
    assert!(matches!(
        store.claim(&request(&held, b"x")).await,
        Ok(ClaimOutcome::Claimed { .. })
    ));
    (done, held)
}

/// A transaction's claim is decided as the store's claim decides it: a
/// completed record answers its response, another fingerprint a mismatch,
/// another owner's live lease in progress, and no record a claim.
pub async fn a_claim_in_a_transaction_is_decided_as_the_stores_claim<S: BatchingStore>(
    batching: Arc<S>,
) {
    let (done, held) = completed_and_held(batching.store()).await;
    let free = fresh_scope();
    let mut tx = begin(&*batching).await;
    match tx.claim(&request(&done, b"x")).await {
        Ok(ClaimOutcome::Completed(response)) => assert_eq!(response.body(), b"done"),
        other => panic!("a completed record answers its response: {other:?}"),
    }
    assert_eq!(
        tx.claim(&request(&done, b"other")).await.unwrap(),
        ClaimOutcome::Mismatch
    );
    assert!(
        matches!(
            tx.claim(&request(&held, b"x")).await,
            Ok(ClaimOutcome::InProgress { .. })
        ),
        "another owner's live lease is in progress"
    );
    match tx.claim(&request(&free, b"x")).await {
        Ok(ClaimOutcome::Claimed { lease, checkpoint }) => {
            assert_eq!((lease.attempt(), checkpoint), (1, None));
        }
        other => panic!("no record is a claim: {other:?}"),
    }
}

/// A transaction's claim takes effect only if it commits: nothing shows
/// before the commit, a claim rolled back leaves nothing (the next claim
/// is a first attempt), and a committed one is there with its completion.
pub async fn a_claim_in_a_transaction_takes_effect_only_if_it_commits<S: BatchingStore>(
    batching: Arc<S>,
) {
    let store = batching.store();
    let (kept, dropped) = (fresh_scope(), fresh_scope());
    let mut tx = begin(&*batching).await;
    claim_and_complete(&mut tx, &dropped, "dropped").await;
    drop(tx);
    assert!(
        store.get(&dropped).await.unwrap().is_none(),
        "a rolled back claim leaves nothing"
    );
    match store.claim(&request(&dropped, b"x")).await {
        Ok(ClaimOutcome::Claimed { lease, .. }) => assert_eq!(lease.attempt(), 1),
        other => panic!("the next claim is a first attempt: {other:?}"),
    }
    let mut tx = begin(&*batching).await;
    claim_and_complete(&mut tx, &kept, "kept").await;
    assert!(
        store.get(&kept).await.unwrap().is_none(),
        "nothing shows before the commit"
    );
    tx.commit().await.expect("commit");
    assert_eq!(
        completed_body(store, &kept).await.as_deref(),
        Some(&b"kept"[..])
    );
}

/// Two transactions claiming one scope never both apply: whichever way
/// the store serialises them (the second waits, answers in progress, or
/// has its commit refused), one completion commits and the record holds it.
pub async fn two_transactions_claiming_one_scope_never_both_apply<S: BatchingStore>(
    batching: Arc<S>,
) {
    let scope = fresh_scope();
    let mut first = begin(&*batching).await;
    claim_and_complete(&mut first, &scope, "first").await;
    // The second claims while the first's claim is uncommitted.
    let mut second = tokio::spawn({
        let (batching, scope) = (batching.clone(), scope.clone());
        async move {
            let mut tx = begin(&*batching).await;
            match tx.claim(&request(&scope, b"x")).await {
                Ok(ClaimOutcome::Claimed { lease, .. }) => {
                    tx.complete(&lease, &StoredResponse::new(200, "second"))
                        .await
                        .unwrap();
                    tx.commit().await.is_ok()
                }
                _ => false,
            }
        }
    });
    let second_early = tokio::time::timeout(RIVAL, &mut second).await.ok();
    let first_applied = first.commit().await.is_ok();
    let second_applied = match second_early {
        Some(done) => done.unwrap(),
        None => second.await.unwrap(),
    };
    assert!(
        first_applied != second_applied,
        "exactly one applies: first {first_applied}, second {second_applied}"
    );
    let winner: &[u8] = if first_applied { b"first" } else { b"second" };
    assert_eq!(
        completed_body(batching.store(), &scope).await.as_deref(),
        Some(winner)
    );
}

/// Within one transaction a scope claimed and completed before answers
/// its completion.
pub async fn within_one_transaction_a_scope_claimed_and_completed_answers_completed<
    S: BatchingStore,
>(
    batching: Arc<S>,
) {
    let scope = fresh_scope();
    let mut tx = begin(&*batching).await;
    claim_and_complete(&mut tx, &scope, "once").await;
    match tx.claim(&request(&scope, b"x")).await {
        Ok(ClaimOutcome::Completed(response)) => assert_eq!(response.body(), b"once"),
        other => panic!("claimed again in the transaction: {other:?}"),
    }
    tx.commit().await.expect("commit");
    assert_eq!(
        completed_body(batching.store(), &scope).await.as_deref(),
        Some(&b"once"[..])
    );
}

/// Within one transaction a claim delivered again answers as it did the
/// first time (claimed, the same lease), and another owner's claim of the
/// scope answers in progress while that lease lives; the claim's holder
/// then completes it.
pub async fn within_one_transaction_a_claim_delivered_again_answers_as_the_first<
    S: BatchingStore,
>(
    batching: Arc<S>,
) {
    let scope = fresh_scope();
    let first = request(&scope, b"x");
    let mut tx = begin(&*batching).await;
    let lease = match tx.claim(&first).await {
        Ok(ClaimOutcome::Claimed { lease, .. }) => lease,
        other => panic!("no record is a claim: {other:?}"),
    };
    match tx.claim(&first).await {
        Ok(ClaimOutcome::Claimed { lease: again, .. }) => assert_eq!(
            (again.owner(), again.attempt()),
            (lease.owner(), lease.attempt()),
            "the same claim answers the same lease"
        ),
        other => panic!("a claim delivered again in the transaction: {other:?}"),
    }
    assert!(
        matches!(
            tx.claim(&request(&scope, b"x")).await,
            Ok(ClaimOutcome::InProgress { .. })
        ),
        "another owner's claim while the lease lives"
    );
    tx.complete(&lease, &StoredResponse::new(200, "once"))
        .await
        .expect("the holder completes");
    tx.commit().await.expect("commit");
    assert_eq!(
        completed_body(batching.store(), &scope).await.as_deref(),
        Some(&b"once"[..])
    );
}

/// A rollback to a savepoint undoes what was written since (claims,
/// completed or not, and completions), and what was written before it
/// stays.
pub async fn a_rollback_to_a_savepoint_undoes_only_what_was_written_since<S: BatchingStore>(
    batching: Arc<S>,
) {
    let (before, since, bare) = (fresh_scope(), fresh_scope(), fresh_scope());
    let mut tx = begin(&*batching).await;
    claim_and_complete(&mut tx, &before, "before").await;
    tx.savepoint().await.unwrap();
    claim_and_complete(&mut tx, &since, "since").await;
    // A claim alone, never completed: undone too.
    claimed(&mut tx, &bare).await;
    tx.rollback_to_savepoint().await.unwrap();
    tx.commit().await.expect("commit");
    let store = batching.store();
    assert_eq!(
        completed_body(store, &before).await.as_deref(),
        Some(&b"before"[..])
    );
    assert_eq!(completed_body(store, &since).await, None);
    assert!(
        store.get(&bare).await.expect("get").is_none(),
        "a claim made since the savepoint outlived its rollback"
    );
}

/// Savepoints nest: a rollback and a release name the latest one still
/// open.
pub async fn savepoints_nest_and_each_operation_names_the_latest_open<S: BatchingStore>(
    batching: Arc<S>,
) {
    let (outer, inner) = (fresh_scope(), fresh_scope());
    let mut tx = begin(&*batching).await;
    tx.savepoint().await.unwrap();
    claim_and_complete(&mut tx, &outer, "outer").await;
    tx.savepoint().await.unwrap();
    claim_and_complete(&mut tx, &inner, "inner").await;
    // Back to the inner savepoint only, then the outer one closed.
    tx.rollback_to_savepoint().await.unwrap();
    tx.release_savepoint().await.unwrap();
    tx.commit().await.expect("commit");
    let store = batching.store();
    assert_eq!(
        completed_body(store, &outer).await.as_deref(),
        Some(&b"outer"[..])
    );
    assert_eq!(completed_body(store, &inner).await, None);
}

/// A released savepoint keeps what was written since.
pub async fn a_released_savepoint_keeps_what_was_written_since<S: BatchingStore>(batching: Arc<S>) {
    let scope = fresh_scope();
    let mut tx = begin(&*batching).await;
    tx.savepoint().await.unwrap();
    claim_and_complete(&mut tx, &scope, "kept").await;
    tx.release_savepoint().await.unwrap();
    tx.commit().await.expect("commit");
    assert_eq!(
        completed_body(batching.store(), &scope).await.as_deref(),
        Some(&b"kept"[..])
    );
}

/// A released savepoint is closed: a rollback to it afterwards has no
/// savepoint open, an error (at once, or at the commit where the store
/// defers it), and never undoes what was written.
pub async fn a_released_savepoint_is_closed<S: BatchingStore>(batching: Arc<S>) {
    let scope = fresh_scope();
    let mut tx = begin(&*batching).await;
    tx.savepoint().await.unwrap();
    claim_and_complete(&mut tx, &scope, "kept").await;
    tx.release_savepoint().await.unwrap();
    let rolled_back = tx.rollback_to_savepoint().await;
    let committed = tx.commit().await;
    assert!(
        rolled_back.is_err() || committed.is_err(),
        "a rollback to a released savepoint went through"
    );
    if committed.is_ok() {
        assert_eq!(
            completed_body(batching.store(), &scope).await.as_deref(),
            Some(&b"kept"[..]),
            "a refused rollback undid what was written"
        );
    }
}

/// Claiming many at once answers as claiming each in turn would, in their
/// order: a completed record its response, another owner's live lease in
/// progress, no record a claim, and a scope claimed earlier in the batch
/// in progress.
pub async fn claiming_all_at_once_answers_as_claiming_each_in_turn<S: BatchingStore>(
    batching: Arc<S>,
) {
    let (done, held) = completed_and_held(batching.store()).await;
    let (first, last) = (fresh_scope(), fresh_scope());
    let mut tx = begin(&*batching).await;
    // `first` twice: the second finds the first's claim, as it would in
    // turn (another owner's, in flight in this transaction).
    let requests = [&first, &done, &held, &last, &first].map(|scope| request(scope, b"x"));
    let outcomes = tx.claim_all(&requests).await.expect("claim_all");
    assert_eq!(outcomes.len(), 5, "{outcomes:?}");
    assert!(
        matches!(&outcomes[4], ClaimOutcome::InProgress { .. }),
        "a scope twice in one batch claimed twice: {outcomes:?}"
    );
    assert!(
        matches!(&outcomes[0], ClaimOutcome::Claimed { lease, .. } if lease.scope() == &first),
        "{outcomes:?}"
    );
    assert!(
        matches!(&outcomes[1], ClaimOutcome::Completed(response) if response.body() == b"done"),
        "{outcomes:?}"
    );
    assert!(
        matches!(&outcomes[2], ClaimOutcome::InProgress { .. }),
        "{outcomes:?}"
    );
    assert!(
        matches!(&outcomes[3], ClaimOutcome::Claimed { lease, .. } if lease.scope() == &last),
        "{outcomes:?}"
    );
}

/// Completing many at once completes each with its own response when the
/// transaction commits; a lease that no longer holds among them is a lost
/// lease (at once, or at the commit).
pub async fn completing_all_at_once_completes_each_when_the_transaction_commits<
    S: BatchingStore,
>(
    batching: Arc<S>,
) {
    let scopes = [fresh_scope(), fresh_scope(), fresh_scope()];
    let mut tx = begin(&*batching).await;
    let mut completions = Vec::new();
    for (at, scope) in scopes.iter().enumerate() {
        let lease = claimed(&mut tx, scope).await;
        completions.push((lease, StoredResponse::new(200, format!("body {at}"))));
    }
    tx.complete_all(&completions).await.expect("complete_all");
    tx.commit().await.expect("commit");
    let store = batching.store();
    for (at, scope) in scopes.iter().enumerate() {
        assert_eq!(
            completed_body(store, scope).await,
            Some(format!("body {at}").into_bytes())
        );
    }
    // A lease released before its completion.
    let gone = fresh_scope();
    let Ok(ClaimOutcome::Claimed { lease, .. }) = store.claim(&request(&gone, b"x")).await else {
        panic!("the store claims a fresh scope");
    };
    store.release(&lease).await.unwrap();
    let mut tx = begin(&*batching).await;
    let fresh = claimed(&mut tx, &fresh_scope()).await;
    let both = [
        (fresh, StoredResponse::new(200, "fresh")),
        (lease, StoredResponse::new(200, "gone")),
    ];
    let answered = match tx.complete_all(&both).await {
        Ok(()) => tx.commit().await,
        Err(error) => Err(error),
    };
    assert!(
        matches!(answered, Err(StoreError::LostLease)),
        "a lost lease among them: {answered:?}"
    );
}

/// A lease fences by its owner alone: the holder's own renewal through the
/// store while its completion, or its checkpoint, waits in an open
/// transaction never refuses the commit, and a checkpoint committed so
/// leaves the lease as renewed. The renewal is given 300 ms to land
/// before the commit (a store that locks the record makes it wait for the
/// commit instead, and it lands after).
pub async fn a_holders_own_renewal_while_its_write_waits_in_a_transaction_keeps_the_commit<
    S: BatchingStore,
>(
    batching: Arc<S>,
) {
    let store = batching.store();
    for checkpointing in [false, true] {
        let scope = fresh_scope();
        let Ok(ClaimOutcome::Claimed { lease, .. }) = store.claim(&request(&scope, b"x")).await
        else {
            panic!("the store claims a fresh scope");
        };
        let mut tx = begin(&*batching).await;
        let checkpoint = Checkpoint::new("charged", &"pi_1").expect("a checkpoint");
        let written = match checkpointing {
            true => tx.checkpoint(&lease, &checkpoint).await,
            false => tx.complete(&lease, &StoredResponse::new(200, "done")).await,
        };
        written.expect("the write joins the transaction");
        // Far past the claim's 30 s: a commit that wrote the lease back as
        // it read it would leave it short of this.
        let extend = Duration::from_secs(3_600);
        let renewing = {
            let batching = batching.clone();
            let lease = lease.clone();
            tokio::spawn(async move { batching.store().renew(&lease, extend).await })
        };
        let renewed = tokio::time::timeout(RIVAL, async {
            while !renewing.is_finished() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .is_ok();
        let committed = tx.commit().await;
        assert!(
            committed.is_ok(),
            "the holder's own renewal {} the commit ({}): {committed:?}",
            if renewed { "before" } else { "waiting for" },
            if checkpointing {
                "a checkpoint"
            } else {
                "a completion"
            },
        );
        let renewal = renewing.await.expect("the renewal's task");
        let record = store.get(&scope).await.expect("get").expect("a record");
        if !checkpointing {
            assert_eq!(completed_body(store, &scope).await, Some(b"done".to_vec()));
            continue;
        }
        let renewal = renewal.expect("the holder renews its own lease");
        assert_eq!(record.checkpoint(), Some(&checkpoint));
        assert!(
            record.lease_expires_at() >= Some(renewal.expires_at()),
            "the lease as renewed, never shorter: {:?} < {:?}",
            record.lease_expires_at(),
            renewal.expires_at(),
        );
    }
}

/// A write completed in a transaction is not completed again: a second
/// completion of its lease there (claimed in the transaction or through
/// the store) never replaces the first, which is what commits (or nothing
/// does, the second refused at the commit).
pub async fn a_completion_in_a_transaction_is_never_replaced_by_a_second<S: BatchingStore>(
    batching: Arc<S>,
) {
    let store = batching.store();
    for claimed_in_the_transaction in [true, false] {
        let scope = fresh_scope();
        let mut tx = begin(&*batching).await;
        let lease = if claimed_in_the_transaction {
            claimed(&mut tx, &scope).await
        } else {
            let Ok(ClaimOutcome::Claimed { lease, .. }) = store.claim(&request(&scope, b"x")).await
            else {
                panic!("the store claims a fresh scope");
            };
            lease
        };
        tx.complete(&lease, &StoredResponse::new(200, "first"))
            .await
            .expect("the first completion");
        let second = tx
            .complete(&lease, &StoredResponse::new(200, "second"))
            .await;
        assert!(
            matches!(second, Ok(()) | Err(StoreError::LostLease)),
            "a second completion is a lost lease, or refused at the commit: {second:?}"
        );
        let committed = tx.commit().await;
        if let Ok(()) = committed {
            assert_eq!(
                completed_body(store, &scope).await.as_deref(),
                Some(&b"first"[..]),
                "the second completion replaced the first (claimed in the transaction: \
                 {claimed_in_the_transaction})"
            );
        } else {
            assert!(
                second.is_ok() && matches!(committed, Err(StoreError::LostLease)),
                "a commit refused for a second completion accepted before: {committed:?}"
            );
        }
    }
}

/// A lease that no longer holds at the commit refuses it, and the refused
/// commit wrote nothing: the holder completes its record through the store
/// while its completion waits in a transaction (alone or among others,
/// with `complete_all`), and exactly one of the two applies. The outside
/// completion is given 300 ms to land before the commit (a store that
/// locks the record makes it wait for the commit instead, and then it is
/// the one refused).
pub async fn a_lease_completed_elsewhere_before_the_commit_refuses_the_commit<S: BatchingStore>(
    batching: Arc<S>,
) {
    let store = batching.store();
    for all_at_once in [false, true] {
        let (scope, other) = (fresh_scope(), fresh_scope());
        let Ok(ClaimOutcome::Claimed { lease, .. }) = store.claim(&request(&scope, b"x")).await
        else {
            panic!("the store claims a fresh scope");
        };
        let mut tx = begin(&*batching).await;
        // Another scope of the transaction's own: a refused commit
        // leaves it unwritten too.
        let own = claimed(&mut tx, &other).await;
        let inside = StoredResponse::new(200, "inside");
        if all_at_once {
            tx.complete_all(&[
                (own, StoredResponse::new(200, "other")),
                (lease.clone(), inside),
            ])
            .await
            .expect("complete_all");
        } else {
            tx.complete(&own, &StoredResponse::new(200, "other"))
                .await
                .expect("complete the transaction's own claim");
            tx.complete(&lease, &inside)
                .await
                .expect("complete in the transaction");
        }
        let outside = {
            let batching = batching.clone();
            let lease = lease.clone();
            tokio::spawn(async move {
                batching
                    .store()
                    .complete(&lease, &StoredResponse::new(200, "outside"))
                    .await
            })
        };
        let _ = tokio::time::timeout(RIVAL, async {
            while !outside.is_finished() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        let committed = tx.commit().await;
        let outside = outside.await.expect("the outside completion's task");
        assert!(
            committed.is_ok() != outside.is_ok(),
            "exactly one completion applies (complete_all: {all_at_once}): \
             commit {committed:?}, outside {outside:?}"
        );
        if let Err(error) = committed {
            assert!(
                matches!(error, StoreError::LostLease),
                "a lease that no longer holds is a lost lease: {error:?}"
            );
            assert_eq!(
                completed_body(store, &scope).await.as_deref(),
                Some(&b"outside"[..])
            );
            assert!(
                store.get(&other).await.expect("get").is_none(),
                "a refused commit wrote another scope of its transaction"
            );
        } else {
            assert_eq!(
                completed_body(store, &scope).await.as_deref(),
                Some(&b"inside"[..])
            );
            assert_eq!(
                completed_body(store, &other).await.as_deref(),
                Some(&b"other"[..])
            );
        }
    }
}

/// Claiming many and completing at once what it claims answers one entry
/// per request, in their order: `None` for a free scope and for one whose
/// lease lapsed, each recorded with the given response (after the commit
/// a claim answers it completed), and what the claim answered for the
/// others (a completed record its response, another owner's live lease in
/// progress, another fingerprint a mismatch), leaving those as they were.
pub async fn claiming_and_completing_all_at_once_records_each_free_scope_with_the_response<
    S: BatchingStore,
>(
    batching: Arc<S>,
) {
    let store = batching.store();
    let (done, held) = completed_and_held(store).await;
    let lapsed = fresh_scope();
    let short = request(&lapsed, b"x")
        .with_lease(Duration::from_millis(200))
        .expect("a valid lease");
    assert!(matches!(
        store.claim(&short).await,
        Ok(ClaimOutcome::Claimed { .. })
    ));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (first, last) = (fresh_scope(), fresh_scope());
    let mut tx = begin(&*batching).await;
    let requests = [&first, &done, &held, &lapsed, &last].map(|scope| request(scope, b"x"));
    let other = request(&done, b"another payload");
    let consumed = StoredResponse::new(200, "consumed");
    let answers = tx
        .claim_completed_all(&requests, &consumed)
        .await
        .expect("claim_completed_all");
    assert_eq!(answers.len(), 5, "{answers:?}");
    assert!(
        answers[0].is_none(),
        "a free scope is recorded: {answers:?}"
    );
    assert!(
        matches!(&answers[1], Some(ClaimOutcome::Completed(response)) if response.body() == b"done"),
        "a completed record answers its response: {answers:?}"
    );
    assert!(
        matches!(&answers[2], Some(ClaimOutcome::InProgress { .. })),
        "another owner's live lease: {answers:?}"
    );
    assert!(answers[3].is_none(), "a lapsed lease is taken: {answers:?}");
    assert!(
        answers[4].is_none(),
        "a free scope is recorded: {answers:?}"
    );
    let mismatch = tx
        .claim_completed_all(std::slice::from_ref(&other), &consumed)
        .await
        .expect("claim_completed_all");
    assert!(
        matches!(mismatch.as_slice(), [Some(ClaimOutcome::Mismatch)]),
        "another fingerprint: {mismatch:?}"
    );
    tx.commit().await.expect("commit");
    for scope in [&first, &lapsed, &last] {
        assert_eq!(
            completed_body(store, scope).await,
            Some(b"consumed".to_vec()),
            "{scope:?} recorded with the response"
        );
        assert!(
            matches!(
                store.claim(&request(scope, b"x")).await,
                Ok(ClaimOutcome::Completed(response)) if response.body() == b"consumed"
            ),
            "{scope:?} answers its response after the commit"
        );
    }
    assert_eq!(completed_body(store, &done).await, Some(b"done".to_vec()));
    assert!(matches!(
        store.claim(&request(&held, b"x")).await,
        Ok(ClaimOutcome::InProgress { .. })
    ));
}

/// What claiming and completing at once recorded vanishes with a rollback:
/// the scope is free again.
pub async fn claiming_and_completing_all_at_once_takes_effect_only_if_it_commits<
    S: BatchingStore,
>(
    batching: Arc<S>,
) {
    let scope = fresh_scope();
    let mut tx = begin(&*batching).await;
    let answers = tx
        .claim_completed_all(
            &[request(&scope, b"x")],
            &StoredResponse::new(200, "consumed"),
        )
        .await
        .expect("claim_completed_all");
    assert!(matches!(answers.as_slice(), [None]), "{answers:?}");
    // Dropped without a commit: rolled back.
    drop(tx);
    assert_eq!(completed_body(batching.store(), &scope).await, None);
    assert!(matches!(
        batching.store().claim(&request(&scope, b"x")).await,
        Ok(ClaimOutcome::Claimed { .. })
    ));
}

/// A scope named twice among the requests is refused before anything is
/// written: the transaction commits with neither recorded.
pub async fn claiming_and_completing_all_at_once_refuses_a_scope_twice<S: BatchingStore>(
    batching: Arc<S>,
) {
    let (twice, once) = (fresh_scope(), fresh_scope());
    let mut tx = begin(&*batching).await;
    let requests = [&once, &twice, &twice].map(|scope| request(scope, b"x"));
    let answered = tx
        .claim_completed_all(&requests, &StoredResponse::new(200, "consumed"))
        .await;
    assert!(
        matches!(answered, Err(StoreError::InvalidInput(_))),
        "a scope twice: {answered:?}"
    );
    tx.commit().await.expect("commit");
    for scope in [&once, &twice] {
        assert_eq!(
            completed_body(batching.store(), scope).await,
            None,
            "{scope:?}"
        );
    }
}
