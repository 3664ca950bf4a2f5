//! The public journal suite against one Redis server and against a
//! three-master Redis Cluster, and what only the Redis journal does: its
//! keys, its slots, one script per operation.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::time::Duration;

use idem_core::Tenant;
use idem_core::store::{
    Acquired, ClockSource, Finish, JournalStore, ListQuery, NewOperation, OperationId,
    OperationKey, OperationState, OwnerToken,
};
use idem_core::{StoreError, StoreOptions};
use idem_redis::{RedisJournal, RedisJournalOptions, redis};
use serde_json::json;

async fn single() -> RedisJournal {
    RedisJournal::new(common::manager(&common::url()).await)
}

async fn cluster() -> RedisJournal {
    RedisJournal::new(common::cluster_connection().await)
}

mod single_suite {
    idem_conformance::journal_suite!(super::single());
}

mod cluster_suite {
    idem_conformance::journal_suite!(super::cluster());
}

fn fresh_key(subject: &str) -> OperationKey {
    let namespace = Tenant::new(format!("redis-journal-{}", uuid::Uuid::new_v4())).unwrap();
    OperationKey::new(namespace, OperationId::new(subject, "charge").unwrap())
}

/// A whole life of one operation: record, lease, send, settle, list.
async fn life(journal: &RedisJournal, key: &OperationKey) {
    let recorded = journal
        .record(&NewOperation::new(key.clone(), json!({"amount": 7})))
        .await
        .unwrap();
    let owner = OwnerToken::generate();
    let Acquired::Held { .. } = journal
        .acquire(key.held_by(owner), Duration::from_secs(30))
        .await
        .unwrap()
    else {
        panic!("expected the lease")
    };
    journal.mark_sent(key.held_by(owner), 0).await.unwrap();
    let done = journal
        .finish(
            key.held_by(owner),
            &Finish::new(OperationState::Succeeded, Some("paid".into())),
        )
        .await
        .unwrap();
    assert_eq!(done.provider_key(), recorded.provider_key());
    let listed = journal
        .list(
            &ListQuery::new(
                key.namespace().clone(),
                &[OperationState::Succeeded, OperationState::Succeeded],
            )
            .limit(10),
        )
        .await
        .unwrap();
    assert_eq!(listed, [done]);
    let pending = journal
        .list(&ListQuery::new(key.namespace().clone(), &[OperationState::Pending]).limit(10))
        .await
        .unwrap();
    assert!(
        pending.is_empty(),
        "settled, it left the pending index: {pending:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_with_hash_tag_characters_stay_in_one_slot_of_the_cluster() {
    let journal = cluster().await;
    // Braces and percent signs in the namespace and the subject: the
    // escaped namespace alone decides the slot, and every script stays in it.
    for namespace in ["a{b}c", "}x{", "50%", "{}"] {
        let namespace = Tenant::new(format!("{namespace}-{}", uuid::Uuid::new_v4())).unwrap();
        let key = OperationKey::new(namespace, OperationId::new("o{r}der", "ch}arge").unwrap());
        life(&journal, &key).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_prefix_leads_every_stored_key() {
    let mut conn = common::manager(&common::url()).await;
    let prefix = format!("jt-{}", uuid::Uuid::new_v4().simple());
    let journal =
        RedisJournal::with_options(conn.clone(), RedisJournalOptions::default().prefix(&prefix))
            .unwrap();
    let key = fresh_key("order-1");
    life(&journal, &key).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut keys = keys;
    keys.sort();
    let tag = format!(
        "{prefix}:{{{}:{}}}",
        key.namespace().as_str().len(),
        key.namespace()
    );
    // The emptied pending index is gone; the settled one holds the operation.
    let mut expected = [
        journal.operation_key(&key),
        format!("{tag}:state:succeeded"),
    ];
    expected.sort();
    assert_eq!(keys, expected);
    let fields: Vec<String> = redis::cmd("HKEYS")
        .arg(journal.operation_key(&key))
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut fields = fields;
    fields.sort();
    assert_eq!(
        fields,
        [
            "created_at",
            "detail",
            "effect",
            "first_sent_at",
            "lease_owner",
            "namespace",
            "provider_key",
            "request",
            "sends",
            "state",
            "subject",
            "updated_at",
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_come_back_exactly_as_recorded() {
    let journal = single().await;
    let key = fresh_key("order-1");
    let request =
        json!({"z": "nul \u{0} here", "a": 1.0, "big": 12345678901234567890u64, "f": 0.1});
    let recorded = journal
        .record(&NewOperation::new(key.clone(), request.clone()))
        .await
        .unwrap();
    assert_eq!(recorded.request(), &request);
    assert_eq!(
        journal.get(&key).await.unwrap().unwrap().request(),
        &request
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_options_are_refused_at_construction() {
    let conn = common::manager(&common::url()).await;
    for bad in ["", "a:b", "a{b", "a}b"] {
        let refused =
            RedisJournal::with_options(conn.clone(), RedisJournalOptions::default().prefix(bad));
        assert!(
            matches!(refused, Err(StoreError::InvalidInput(_))),
            "{bad:?}: {refused:?}"
        );
    }
    let zero = StoreOptions::default().with_operation_timeout(Duration::ZERO);
    let refused = RedisJournal::with_options(
        conn.clone(),
        RedisJournalOptions::default().store_options(zero),
    );
    assert!(
        matches!(refused, Err(StoreError::InvalidInput(_))),
        "{refused:?}"
    );
    let caps = RedisJournal::new(conn).capabilities();
    assert_eq!(caps.store, "redis");
    assert_eq!(caps.clock, ClockSource::Server);
}

/// What a client has sent a server: EVALSHA, and EVAL or SCRIPT when the
/// server lacked a script (commandstats also counts the commands a script
/// calls, which are not round trips).
async fn client_commands(mut conn: redis::aio::ConnectionManager) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            if !matches!(
                name,
                "evalsha" | "eval" | "script" | "evalsha_ro" | "eval_ro"
            ) {
                return None;
            }
            rest.split(',')
                .find_map(|kv| kv.strip_prefix("calls="))?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_journal_operation_and_outcome_is_one_evalsha() {
    let server = common::PrivateServer::start(&[]).await;
    let journal = RedisJournal::new(common::manager(&server.url()).await);
    let stats = common::manager(&server.url()).await;
    let mut report = Vec::new();
    // Twice: the first run loads the scripts, the second is measured.
    for _ in 0..2 {
        report.clear();
        macro_rules! cost {
            ($what:expr, $op:expr) => {{
                let before = client_commands(stats.clone()).await;
                let value = $op;
                report.push(($what, client_commands(stats.clone()).await - before));
                value
            }};
        }
        let key = fresh_key("order-1");
        let new = NewOperation::new(key.clone(), json!({"amount": 1}));
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
                .list(&ListQuery::new(key.namespace().clone(), &OperationState::ALL).limit(10))
                .await
                .unwrap()
        );
    }
    for (what, n) in &report {
        assert_eq!(*n, 1, "{what} sent {n} commands: {report:?}");
    }
}
