//! A reply lost after Postgres served the request: the store's answer is
//! true to what it stored.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::str::FromStr;
use std::time::Duration;

use idem_conformance::faults::FaultProxy;
use idem_conformance::support::lost_replies_are_answered_truthfully;
use idem_postgres::PostgresStore;
use idem_postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions, PgSslMode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_answered_truthfully() {
    let options = PgConnectOptions::from_str(&common::url()).expect("IDEM_POSTGRES_URL parses");
    let proxy = FaultProxy::start(format!("{}:{}", options.get_host(), options.get_port())).await;
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(
            options
                .host("127.0.0.1")
                .port(proxy.port)
                .ssl_mode(PgSslMode::Disable),
        )
        .await
        .expect("connect through the proxy");
    let store = PostgresStore::new(pool);
    store.migrate().await.unwrap();
    let answers = lost_replies_are_answered_truthfully(&store, &proxy).await;
    println!("{answers:?}");
}
