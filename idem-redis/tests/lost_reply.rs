//! A reply lost after Redis served the request, on one node and on a
//! cluster (whose client resends the request): the store's answer is true to
//! what it stored.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::time::Duration;

use common::PrivateServer;
use idem_conformance::faults::FaultProxy;
use idem_conformance::faults::lost_replies_are_answered_truthfully;
use idem_conformance::support::eventually;
use idem_redis::redis::cluster::ClusterClientBuilder;
use idem_redis::{RedisStore, redis};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_on_one_node_is_answered_truthfully() {
    let server = PrivateServer::start(&[]).await;
    let proxy = FaultProxy::start(format!("127.0.0.1:{}", server.port)).await;
    let conn = common::manager(&format!("redis://{}", proxy.address())).await;
    let store = RedisStore::with_options(conn, common::volatile())
        .await
        .unwrap();
    let answers = lost_replies_are_answered_truthfully(&store, &proxy).await;
    println!("{answers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_on_a_cluster_is_answered_truthfully() {
    // A one-node cluster that announces the proxy, so the client's every
    // connection, after discovery too, goes through it.
    let proxy_port = idem_conformance::faults::free_port();
    let server = PrivateServer::start(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        &format!("idem-lost-reply-{proxy_port}.conf"),
        "--cluster-announce-ip",
        "127.0.0.1",
        "--cluster-announce-port",
        &proxy_port.to_string(),
    ])
    .await;
    let mut admin = common::manager(&server.url()).await;
    let _: () = redis::cmd("CLUSTER")
        .arg("ADDSLOTSRANGE")
        .arg(0)
        .arg(16383)
        .query_async(&mut admin)
        .await
        .unwrap();
    eventually("the one-node cluster to be ready", || {
        let mut admin = admin.clone();
        async move {
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query_async(&mut admin)
                .await
                .ok()?;
            info.contains("cluster_state:ok").then_some(())
        }
    })
    .await;
    let proxy = FaultProxy::start_on(proxy_port, format!("127.0.0.1:{}", server.port)).await;
    let client = ClusterClientBuilder::new(vec![format!("redis://{}", proxy.address())])
        .connection_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let conn = client.get_async_connection().await.unwrap();
    let store = RedisStore::with_options(conn, common::volatile())
        .await
        .unwrap();
    let answers = lost_replies_are_answered_truthfully(&store, &proxy).await;
    println!("{answers:?}");
}
