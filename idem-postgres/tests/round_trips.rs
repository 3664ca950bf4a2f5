//! Every operation is one round trip for every outcome, counted on the wire.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;
#[path = "common/proxy.rs"]
mod proxy;

use std::time::Duration;

use idem_conformance::support::{cost_of_each_operation, fresh_scope, long};
use idem_core::store::{ClaimOutcome, IdempotencyStore, Transaction};
use idem_core::{StoreError, StoredResponse};
use idem_postgres::PostgresStore;
use idem_postgres::sqlx::{self, Row};
use proxy::CountingProxy;

/// A migrated store over one connection through a counting proxy.
async fn proxied_store() -> (CountingProxy, PostgresStore) {
    let (options, upstream) = common::server();
    let proxy = CountingProxy::start(upstream).await;
    let store = common::store_over_one_connection(common::via_proxy(options, proxy.port)).await;
    (proxy, store)
}

/// Inside an open transaction there is no on-release ping: everything on
/// the wire is the operation's own, and each is exactly one round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_in_and_complete_in_a_transaction_are_one_round_trip_on_the_wire() {
    let (proxy, store) = proxied_store().await;
    let mut conn = store.begin().await.unwrap();
    let wire = |before: u64| proxy.ready() - before;

    // Warm up: prepare both statements on this connection.
    let ClaimOutcome::Claimed { lease, .. } = store
        .claim_in(&mut conn, &long(&fresh_scope(), "a"))
        .await
        .unwrap()
    else {
        panic!("warm-up")
    };
    conn.complete(&lease, &StoredResponse::new(200, "w").with_header("h", "v"))
        .await
        .unwrap();

    let s = fresh_scope();
    let mut report = Vec::new();
    let before = proxy.ready();
    let ClaimOutcome::Claimed { lease, .. } =
        store.claim_in(&mut conn, &long(&s, "a")).await.unwrap()
    else {
        panic!("claim")
    };
    report.push(("claim_in: claimed", wire(before)));
    let before = proxy.ready();
    assert!(matches!(
        store.claim_in(&mut conn, &long(&s, "a")).await.unwrap(),
        ClaimOutcome::InProgress { .. }
    ));
    report.push(("claim_in: in progress", wire(before)));
    let before = proxy.ready();
    conn.complete(&lease, &StoredResponse::new(200, "done"))
        .await
        .unwrap();
    report.push(("complete in a transaction", wire(before)));
    let before = proxy.ready();
    assert!(matches!(
        store.claim_in(&mut conn, &long(&s, "a")).await.unwrap(),
        ClaimOutcome::Completed(_)
    ));
    report.push(("claim_in: replay", wire(before)));
    let before = proxy.ready();
    assert_eq!(
        store.claim_in(&mut conn, &long(&s, "b")).await.unwrap(),
        ClaimOutcome::Mismatch
    );
    report.push(("claim_in: mismatch", wire(before)));
    let before = proxy.ready();
    assert!(matches!(
        conn.complete(&lease, &StoredResponse::new(200, "again"))
            .await,
        Err(StoreError::LostLease)
    ));
    report.push(("complete in a transaction: lost lease", wire(before)));

    // The last response's ReadyForQuery may still be in flight to the proxy.
    tokio::time::sleep(Duration::from_millis(50)).await;
    println!("{report:#?}");
    let total: u64 = report.iter().map(|(_, n)| n).sum();
    assert_eq!(total, report.len() as u64, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_and_claim_outcome_is_one_statement_round_trip() {
    let (proxy, store) = proxied_store().await;
    let costs = cost_of_each_operation(&store, || {
        let statements = proxy.statements();
        async move { statements }
    })
    .await;
    println!("{costs:#?}");
    for (what, n) in costs {
        assert_eq!(n, 1, "{what} took {n} statement round trips");
    }
}

/// Every journal operation, for every outcome, is one statement round trip:
/// each runs the sequence twice over one connection, the first to prepare
/// the statements, and counts the second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_journal_operation_and_outcome_is_one_statement_round_trip() {
    use idem_core::Tenant;
    use idem_core::store::{
        Acquired, Finish, JournalStore, ListQuery, NewOperation, OperationId, OperationKey,
        OperationState, OwnerToken,
    };
    use idem_postgres::PostgresJournal;

    let (options, upstream) = common::server();
    let proxy = CountingProxy::start(upstream).await;
    let pool = idem_postgres::guarded(idem_postgres::sqlx::postgres::PgPoolOptions::new())
        .max_connections(1)
        .connect_with(common::via_proxy(options, proxy.port))
        .await
        .unwrap();
    let journal = PostgresJournal::new(pool);
    journal.migrate().await.unwrap();
    let mut report = Vec::new();
    for _ in 0..2 {
        report.clear();
        macro_rules! cost {
            ($what:expr, $op:expr) => {{
                let before = proxy.statements();
                let value = $op;
                report.push(($what, proxy.statements() - before));
                value
            }};
        }
        let namespace = Tenant::new(format!("rt-{}", uuid::Uuid::new_v4())).unwrap();
        let key = OperationKey::new(
            namespace.clone(),
            OperationId::new("order-1", "charge").unwrap(),
        );
        let new = NewOperation::new(key.clone(), serde_json::json!({"amount": 1}));
        let (owner, other) = (OwnerToken::generate(), OwnerToken::generate());
        let lease = Duration::from_secs(60);
        let finish = Finish::new(OperationState::Succeeded, Some("paid".into()));
        cost!(
            "acquire: absent",
            journal.acquire(key.held_by(owner), lease).await.unwrap()
        );
        cost!("record: new", journal.record(&new).await.unwrap());
        cost!("record: existing", journal.record(&new).await.unwrap());
        cost!("get", journal.get(&key).await.unwrap());
        let held = cost!(
            "acquire: held",
            journal.acquire(key.held_by(owner), lease).await.unwrap()
        );
        assert!(matches!(held, Acquired::Held { .. }), "{held:?}");
        let busy = cost!(
            "acquire: busy",
            journal.acquire(key.held_by(other), lease).await.unwrap()
        );
        assert!(matches!(busy, Acquired::Busy { .. }), "{busy:?}");
        cost!(
            "mark_sent",
            journal.mark_sent(key.held_by(owner), 0).await.unwrap()
        );
        cost!(
            "mark_sent: again",
            journal.mark_sent(key.held_by(owner), 0).await.unwrap()
        );
        cost!(
            "mark_sent: lost lease",
            journal.mark_sent(key.held_by(other), 1).await.unwrap_err()
        );
        cost!(
            "finish",
            journal.finish(key.held_by(owner), &finish).await.unwrap()
        );
        cost!(
            "finish: again",
            journal.finish(key.held_by(owner), &finish).await.unwrap()
        );
        cost!(
            "finish: lost lease",
            journal
                .finish(key.held_by(other), &finish)
                .await
                .unwrap_err()
        );
        let settled = cost!(
            "acquire: settled",
            journal.acquire(key.held_by(owner), lease).await.unwrap()
        );
        assert!(matches!(settled, Acquired::Settled(_)), "{settled:?}");
        cost!(
            "list",
            journal
                .list(&ListQuery::new(namespace.clone(), &OperationState::ALL).limit(10))
                .await
                .unwrap()
        );
    }
    println!("{report:#?}");
    for (what, n) in &report {
        assert_eq!(*n, 1, "{what} took {n} statement round trips: {report:?}");
    }
}

/// A batch's claims and its completions are one statement each, whatever
/// their number and outcomes, counted on the wire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_all_and_complete_all_in_a_transaction_are_one_round_trip_each_on_the_wire() {
    let (proxy, store) = proxied_store().await;
    let mut tx = store.begin().await.unwrap();
    let wire = |before: u64| proxy.ready() - before;
    let claimed = |outcomes: Vec<ClaimOutcome>| -> Vec<idem_core::store::Lease> {
        outcomes
            .into_iter()
            .filter_map(|outcome| match outcome {
                ClaimOutcome::Claimed { lease, .. } => Some(lease),
                _ => None,
            })
            .collect()
    };
    let done = |leases: &[idem_core::store::Lease]| -> Vec<_> {
        leases
            .iter()
            .map(|lease| (lease.clone(), StoredResponse::new(200, "done")))
            .collect()
    };

    // Warm up: prepare both statements on this connection.
    let warm = claimed(tx.claim_all(&[long(&fresh_scope(), "a")]).await.unwrap());
    tx.complete_all(&done(&warm)).await.unwrap();

    let (completed, held) = (fresh_scope(), fresh_scope());
    let first = claimed(
        tx.claim_all(&[long(&completed, "a"), long(&held, "a")])
            .await
            .unwrap(),
    );
    tx.complete_all(&done(&first[..1])).await.unwrap();
    let mut requests: Vec<_> = (0..8).map(|_| long(&fresh_scope(), "a")).collect();
    requests.push(long(&completed, "a"));
    requests.push(long(&held, "a"));
    let mut report = Vec::new();
    let before = proxy.ready();
    let outcomes = tx.claim_all(&requests).await.unwrap();
    report.push((
        "claim_all: 8 claimed, 1 replay, 1 in progress",
        wire(before),
    ));
    assert!(matches!(outcomes[8], ClaimOutcome::Completed(_)));
    assert!(matches!(outcomes[9], ClaimOutcome::InProgress { .. }));
    let leases = claimed(outcomes);
    assert_eq!(leases.len(), 8);
    let before = proxy.ready();
    tx.complete_all(&done(&leases)).await.unwrap();
    report.push(("complete_all: 8 completed", wire(before)));
    let before = proxy.ready();
    assert!(matches!(
        tx.complete_all(&done(&leases)).await,
        Err(StoreError::LostLease)
    ));
    report.push((
        "complete_all: completed already, a lost lease",
        wire(before),
    ));

    // The last response's ReadyForQuery may still be in flight to the proxy.
    tokio::time::sleep(Duration::from_millis(50)).await;
    println!("{report:#?}");
    let total: u64 = report.iter().map(|(_, n)| n).sum();
    assert_eq!(total, report.len() as u64, "{report:?}");
}

/// The inbox's claim of a batch is one round trip for every outcome, and
/// writes each free record once, completed: its inserts, and no update,
/// counted by the server in the transaction (`pg_stat_xact_user_tables`);
/// a batch of free records searches no index before it inserts (each key
/// is checked once, as it is inserted: no `ON CONFLICT` pass).
/// A record found (completed, held, of another fingerprint) is answered
/// in the same round trip, and one whose lease lapsed is taken and
/// completed in it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_completed_all_is_one_round_trip_and_one_write_per_free_record_on_the_wire() {
    let (proxy, store) = proxied_store().await;
    let wire = |before: u64| proxy.ready() - before;
    let consumed = StoredResponse::new(200, "consumed");
    let (completed, held, lapsed) = (fresh_scope(), fresh_scope(), fresh_scope());
    let other = fresh_scope();
    for scope in [&completed, &other] {
        let ClaimOutcome::Claimed { lease, .. } = store.claim(&long(scope, "a")).await.unwrap()
        else {
            panic!("claim")
        };
        store.complete(&lease, &consumed).await.unwrap();
    }
    assert!(matches!(
        store.claim(&long(&held, "a")).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    let short = long(&lapsed, "a")
        .with_lease(Duration::from_millis(100))
        .unwrap();
    assert!(matches!(
        store.claim(&short).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut tx = store.begin().await.unwrap();
    // Warm up: prepare the statement on this connection.
    let warm = tx
        .claim_completed_all(&[long(&fresh_scope(), "a")], &consumed)
        .await
        .unwrap();
    assert!(matches!(warm.as_slice(), [None]));
    let mut report = Vec::new();

    let fresh: Vec<_> = (0..8).map(|_| long(&fresh_scope(), "a")).collect();
    let (inserted, updated, searched) = written_in(&mut tx).await;
    let before = proxy.ready();
    let answers = tx.claim_completed_all(&fresh, &consumed).await.unwrap();
    report.push(("claim_completed_all: 8 free", wire(before)));
    assert!(answers.iter().all(Option::is_none), "{answers:?}");
    let (inserted_after, updated_after, searched_after) = written_in(&mut tx).await;
    assert_eq!(inserted_after - inserted, 8, "one insert per free record");
    assert_eq!(updated_after - updated, 0, "no record written twice");
    assert_eq!(searched_after - searched, 0, "no index searched first");

    let mut mixed: Vec<_> = (0..4).map(|_| long(&fresh_scope(), "a")).collect();
    mixed.push(long(&completed, "a"));
    mixed.push(long(&held, "a"));
    mixed.push(long(&lapsed, "a"));
    mixed.push(long(&other, "another payload"));
    let before = proxy.ready();
    let answers = tx.claim_completed_all(&mixed, &consumed).await.unwrap();
    report.push((
        "claim_completed_all: 4 free, a replay, in progress, a lapsed lease, a mismatch",
        wire(before),
    ));
    assert!(answers[..4].iter().all(Option::is_none), "{answers:?}");
    assert!(matches!(answers[4], Some(ClaimOutcome::Completed(_))));
    assert!(matches!(answers[5], Some(ClaimOutcome::InProgress { .. })));
    assert!(
        answers[6].is_none(),
        "the lapsed lease is taken: {answers:?}"
    );
    assert!(matches!(answers[7], Some(ClaimOutcome::Mismatch)));
    tx.commit().await.unwrap();

    // The last response's ReadyForQuery may still be in flight to the proxy.
    tokio::time::sleep(Duration::from_millis(50)).await;
    println!("{report:#?}");
    for (what, n) in &report {
        assert_eq!(*n, 1, "{what} took {n} round trips: {report:?}");
    }
}

/// The rows of the records table inserted and updated so far in `tx`,
/// and its index scans, as the server counts them.
async fn written_in(tx: &mut idem_postgres::PgTransaction) -> (i64, i64, i64) {
    let row = sqlx::query(
        "SELECT coalesce(sum(n_tup_ins), 0)::int8, coalesce(sum(n_tup_upd), 0)::int8, \
         coalesce(sum(idx_scan), 0)::int8 \
         FROM pg_stat_xact_user_tables WHERE relname = 'idem_records'",
    )
    .fetch_one(&mut **tx)
    .await
    .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

/// A request's store calls on the wire, through a pool of one connection:
/// for a fresh request (claim, complete) and a replay (claim), each call's
/// statements, and the guard's release checks its connection's return
/// took (besides sqlx's ping, which every return sends).
async fn calls_on_the_wire(guarded: bool) -> Vec<(&'static str, u64, u64)> {
    use std::sync::atomic::Ordering::SeqCst;

    let (options, upstream) = common::server();
    let proxy = CountingProxy::start(upstream).await;
    let pool = common::pool_with_guard(1, guarded)
        .connect_with(common::via_proxy(options, proxy.port))
        .await
        .unwrap();
    let store = PostgresStore::new(pool);
    store.migrate().await.unwrap();
    let counts = std::sync::Arc::clone(&proxy.counts);
    let returns = || counts.checks.load(SeqCst);
    let (statements, pings) = (|| proxy.statements(), || proxy.counts.pings.load(SeqCst));
    // A return is over once sqlx's ping is answered and, on a guarded
    // pool, the guard's check: under load the check was seen to come after
    // the ping (counted then in the next call's row: 2, 0, 1).
    let returned = |(_, checks_before, pings_before): (u64, u64, u64)| async move {
        for _ in 0..2000 {
            if pings() > pings_before && (!guarded || returns() > checks_before) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the connection never returned to the pool");
    };
    let mut report = Vec::new();
    // The first round prepares each statement on the connection; the
    // second is counted.
    for _ in 0..2 {
        report.clear();
        let request = long(&fresh_scope(), "a");
        let before = (statements(), returns(), pings());
        let ClaimOutcome::Claimed { lease, .. } = store.claim(&request).await.unwrap() else {
            panic!("claim")
        };
        returned(before).await;
        report.push((
            "fresh: claim",
            statements() - before.0,
            returns() - before.1,
        ));
        let before = (statements(), returns(), pings());
        store
            .complete(&lease, &StoredResponse::new(200, "done"))
            .await
            .unwrap();
        returned(before).await;
        report.push((
            "fresh: complete",
            statements() - before.0,
            returns() - before.1,
        ));
        let before = (statements(), returns(), pings());
        assert!(matches!(
            store.claim(&request).await.unwrap(),
            ClaimOutcome::Completed(_)
        ));
        returned(before).await;
        report.push((
            "replay: claim",
            statements() - before.0,
            returns() - before.1,
        ));
    }
    report
}

/// On a pool that only the store uses (it opens its transactions whole,
/// so the pool needs no guard) every store call of a fresh request and of
/// a replay is one round trip on the wire, its statement, and its
/// connection's return sends nothing but sqlx's ping; on a guarded pool
/// every return sends the guard's check too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_call_is_one_round_trip_and_only_the_guard_adds_one_per_return() {
    let plain = calls_on_the_wire(false).await;
    let guarded = calls_on_the_wire(true).await;
    println!("plain: {plain:#?}\nguarded: {guarded:#?}");
    for (what, statements, checks) in &plain {
        assert_eq!(*statements, 1, "{what}: {plain:?}");
        assert_eq!(*checks, 0, "{what}: no check: {plain:?}");
    }
    for (what, statements, checks) in &guarded {
        assert_eq!(*statements, 1, "{what}: {guarded:?}");
        // One as a rule; under load one call's return was seen to take
        // four round trips of pings and checks instead of two (the pool's
        // own doing), so at least one.
        assert!(*checks >= 1, "{what}: the guard's check: {guarded:?}");
    }
}
