//! Redis-specific behaviour: the options and eviction checks at
//! construction, the key encoding, surviving a server restart, and one round
//! trip per operation, counted by the server.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use common::PrivateServer;
use idem_conformance::support::cost_of_each_operation;
use idem_conformance::support::{eventually, fresh_scope, long};
use idem_core::store::{ClaimOutcome, Durability, Eviction, IdempotencyStore};
use idem_core::{Scope, StoreError};
use idem_redis::{MAX_RESPONSE_BYTES_LIMIT, RedisOptions, RedisStore, redis};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicting_policies_are_refused_unless_the_risk_is_accepted() {
    for policy in ["allkeys-lru", "volatile-ttl", "allkeys-random"] {
        let server = PrivateServer::start(&["--maxmemory-policy", policy]).await;
        let refused = RedisStore::new(common::manager(&server.url()).await).await;
        match refused {
            Err(StoreError::Misconfigured {
                store: "redis",
                message,
            }) => {
                assert!(message.contains(policy), "{message}");
                assert!(message.contains("noeviction"), "{message}");
            }
            other => panic!("{policy} was not refused: {other:?}"),
        }
        let accepted = RedisStore::with_options(
            common::manager(&server.url()).await,
            common::volatile().accept_eviction_risk(),
        )
        .await
        .expect("opt-in lets an evicting server through");
        assert_eq!(accepted.capabilities().eviction, Eviction::Possible);
    }
    let safe = PrivateServer::start(&["--maxmemory-policy", "noeviction"]).await;
    let store = RedisStore::with_options(common::manager(&safe.url()).await, common::volatile())
        .await
        .unwrap();
    assert_eq!(store.capabilities().eviction, Eviction::Never);
    assert_eq!(store.capabilities().durability, Durability::Volatile);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_without_an_append_only_file_are_refused_unless_accepted() {
    let server = PrivateServer::start(&[]).await;
    match RedisStore::new(common::manager(&server.url()).await).await {
        Err(StoreError::Misconfigured {
            store: "redis",
            message,
        }) => {
            assert!(message.contains("appendonly"), "{message}");
            assert!(message.contains("accept_volatility"), "{message}");
        }
        other => panic!("a server without persistence was not refused: {other:?}"),
    }
    let accepted =
        RedisStore::with_options(common::manager(&server.url()).await, common::volatile())
            .await
            .expect("opt-in lets a volatile server through");
    assert_eq!(accepted.capabilities().durability, Durability::Volatile);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_options_are_refused_at_construction() {
    let invalid = [
        (RedisOptions::default().prefix(""), "key prefix"),
        (RedisOptions::default().prefix("bad{prefix}"), "key prefix"),
        (RedisOptions::default().prefix("a:b"), "key prefix"),
        (
            RedisOptions::default().store_options(
                idem_core::StoreOptions::default()
                    .with_max_response_bytes(MAX_RESPONSE_BYTES_LIMIT + 1),
            ),
            "max response bytes",
        ),
    ];
    for (options, field) in invalid {
        let refused = RedisStore::with_options(
            common::manager(&common::url()).await,
            options.accept_volatility(),
        )
        .await;
        match refused {
            Err(StoreError::InvalidInput(input)) => {
                assert!(input.to_string().starts_with(field), "{input}");
            }
            other => panic!("invalid {field} was not refused: {other:?}"),
        }
    }
    assert!(matches!(
        RedisStore::with_options(
            common::manager(&common::url()).await,
            common::volatile()
                .store_options(idem_core::StoreOptions::default().with_max_response_bytes(1 << 20)),
        )
        .await
        .map(|store| store.capabilities().max_response_bytes),
        Ok(1_048_576)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_prefix_leads_every_stored_key() {
    let prefix = format!("idem-test-{}", uuid::Uuid::new_v4().simple());
    let store = RedisStore::with_options(
        common::manager(&common::url()).await,
        common::volatile().prefix(&prefix),
    )
    .await
    .unwrap();
    let scope = fresh_scope();
    let expected = format!(
        "{prefix}:{{{}:{}:{}}}",
        scope.tenant().as_str().len(),
        scope.tenant().as_str(),
        scope.key().as_str()
    );
    assert_eq!(store.record_key(&scope), expected);
    store.claim(&long(&scope, "x")).await.unwrap();
    let mut conn = common::manager(&common::url()).await;
    let exists: bool = redis::cmd("EXISTS")
        .arg(&expected)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(exists, "no record under {expected}");
    let claimed = store
        .get(&scope)
        .await
        .unwrap()
        .expect("the claimed record");
    assert!(claimed.is_in_flight());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_only_servers_are_reported_durable() {
    let server =
        PrivateServer::start(&["--appendonly", "yes", "--appendfilename", "idem-test.aof"]).await;
    let store = RedisStore::new(common::manager(&server.url()).await)
        .await
        .unwrap();
    assert_eq!(store.capabilities().durability, Durability::Durable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hidden_config_is_reported_unknown_and_still_works() {
    // Managed Redis disables CONFIG; renaming it away does the same here.
    let server = PrivateServer::start(&["--enable-debug-command", "no"]).await;
    let mut admin = common::manager(&server.url()).await;
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("-config")
        .query_async(&mut admin)
        .await
        .unwrap();
    let store = RedisStore::new(common::manager(&server.url()).await)
        .await
        .unwrap();
    assert_eq!(store.capabilities().eviction, Eviction::Unknown);
    assert_eq!(store.capabilities().durability, Durability::Unknown);
    let scope = fresh_scope();
    assert!(matches!(
        store.claim(&long(&scope, "a")).await.unwrap(),
        ClaimOutcome::Claimed { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_key_names_encode_scopes_injectively() {
    let store = common::single_store().await;
    let mut conn = common::manager(&common::url()).await;
    let base = format!("keys-{}", uuid::Uuid::new_v4().simple());
    let cases = [
        (
            format!("{base}:a"),
            "b",
            format!("idem:{{{}:{base}:a:b}}", base.len() + 2),
        ),
        (
            base.clone(),
            "a:b",
            format!("idem:{{{}:{base}:a:b}}", base.len()),
        ),
        (
            format!("{base}{{x}}"),
            "}",
            format!("idem:{{{}:{base}%7Bx%7D:%7D}}", base.len() + 7),
        ),
        (
            format!("{base}/ü"),
            "%",
            format!("idem:{{{}:{base}/ü:%25}}", base.len() + 3),
        ),
    ];
    for (tenant, key, expected) in &cases {
        let scope = Scope::parse(tenant, key).unwrap();
        assert_eq!(&store.record_key(&scope), expected);
        store.claim(&long(&scope, "x")).await.unwrap();
        let exists: bool = redis::cmd("EXISTS")
            .arg(expected)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(exists, "no record under {expected}");
    }
    let pattern = format!("idem:{{*{base}*");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(&pattern)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys.len(), cases.len(), "{keys:?}");
    // Retention is the key's own expiry.
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&cases[0].2)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(ttl > 0 && ttl <= 24 * 3600 * 1000, "{ttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_succeed_again_after_the_server_restarts() {
    let mut server = PrivateServer::start(&[]).await;
    let store = RedisStore::with_options(common::manager(&server.url()).await, common::volatile())
        .await
        .unwrap();
    let tenant = format!("restart-{}", uuid::Uuid::new_v4());
    let claim = |i: u32| {
        let store = store.clone();
        let scope = Scope::parse(&tenant, &format!("k{i}")).unwrap();
        async move { store.claim(&long(&scope, "a")).await }
    };
    for i in 0..20 {
        assert!(matches!(
            claim(i).await.unwrap(),
            ClaimOutcome::Claimed { .. }
        ));
    }
    server.stop().await;
    for i in 20..25 {
        match claim(i).await {
            Err(e) => assert!(
                e.is_retryable(),
                "a dead server must be a retryable error: {e:?}"
            ),
            Ok(outcome) => panic!("claim answered with no server: {outcome:?}"),
        }
    }
    server.restart().await;
    // The manager reconnects by itself; the server lost its scripts too.
    let next = std::sync::atomic::AtomicU32::new(100);
    eventually("a claim after the restart", || async {
        match claim(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)).await {
            Ok(ClaimOutcome::Claimed { .. }) => Some(()),
            Ok(other) => panic!("unexpected {other:?}"),
            Err(e) => {
                assert!(e.is_retryable(), "{e:?}");
                None
            }
        }
    })
    .await;
    for i in 200..220 {
        assert!(matches!(
            claim(i).await.unwrap(),
            ClaimOutcome::Claimed { .. }
        ));
    }
}

/// What a client has sent a server: EVALSHA, and EVAL or SCRIPT when the
/// server lacked a script. (Commandstats also counts the commands a script
/// calls, such as HSET; those are not round trips.)
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
async fn every_operation_and_claim_outcome_is_one_evalsha() {
    let server = PrivateServer::start(&[]).await;
    let store = RedisStore::with_options(common::manager(&server.url()).await, common::volatile())
        .await
        .unwrap();
    let stats = common::manager(&server.url()).await;
    let costs = cost_of_each_operation(&store, || client_commands(stats.clone())).await;
    for (what, n) in &costs {
        assert_eq!(*n, 1, "{what} sent {n} commands: {costs:?}");
    }
}
