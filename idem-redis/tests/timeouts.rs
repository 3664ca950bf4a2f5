//! A stalled network fails every call within the operation timeout, as a
//! retryable `Unavailable`, and a retry with the same request or lease gets
//! the true answer once the network is back. A fault proxy sits between the
//! connection manager and the server named by `IDEM_REDIS_URL`. The
//! scenarios are the suite's (`idem_conformance::faults`); construction is
//! Redis's own.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::time::Duration;

use idem_conformance::faults::{FaultProxy, StallBounds};
use idem_core::{Operation, StoreError};
use idem_redis::redis::ConnectionAddr;
use idem_redis::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use idem_redis::{RedisStore, redis};

/// The store's operation timeout in these tests.
const LIMIT: Duration = Duration::from_millis(300);
/// What a stalled call must keep to.
const BOUNDS: StallBounds = StallBounds::new("redis", LIMIT);

/// A proxy in front of the server at `IDEM_REDIS_URL`.
async fn proxy() -> FaultProxy {
    let client = redis::Client::open(common::url()).expect("IDEM_REDIS_URL parses");
    let upstream = match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
        other => panic!("IDEM_REDIS_URL must be plain TCP for the proxy, not {other:?}"),
    };
    FaultProxy::start(upstream).await
}

/// A store through `proxy`, with the test's operation timeout, over a lazy
/// manager whose own limits are far longer than the store's (redis-rs's
/// response timeout is 500 ms by default), so the store's limit is what
/// fires under a stall.
async fn store_through(proxy: &FaultProxy) -> Result<RedisStore, StoreError> {
    let client = redis::Client::open(format!("redis://{}", proxy.address())).unwrap();
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(10)))
        .set_response_timeout(Some(Duration::from_secs(10)))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(200));
    let manager = ConnectionManager::new_lazy_with_config(client, config).expect("a lazy manager");
    RedisStore::with_options(
        manager,
        common::volatile()
            .store_options(idem_core::StoreOptions::default().with_operation_timeout(LIMIT)),
    )
    .await
}

/// A store through a fresh proxy.
async fn proxied_store() -> (FaultProxy, RedisStore) {
    let proxy = proxy().await;
    let store = store_through(&proxy)
        .await
        .expect("store through the proxy");
    (proxy, store)
}

// The claim, the completion, and renew, checkpoint, get and release on a
// stalled network, as the suite words them: a test each, named after its
// scenario. (`purge_expired` sends nothing on Redis.)
idem_conformance::stall_tests!(proxied_store(), BOUNDS, every_other_operation);

/// The `CONFIG GET` reads of construction are bounded too: a stalled server
/// refuses the store as `Unavailable` instead of holding its caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn construction_on_a_stalled_network_times_out() {
    let proxy = proxy().await;
    proxy.stall();
    BOUNDS
        .times_out(Operation::Setup, store_through(&proxy))
        .await;
    proxy.resume();
    store_through(&proxy)
        .await
        .expect("the store once the network is back");
}
