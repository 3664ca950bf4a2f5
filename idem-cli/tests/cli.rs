//! The `idem` command line against real stores: what it prints, its exit
//! codes, and that its actions change the stores.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../idem-admin/tests/common/stuck.rs"]
mod stuck;

use std::sync::Arc;
use std::time::Duration;

use idem_core::Idempotency;
use idem_core::store::{MessageState, OperationState, ParkedState};

/// What a run printed, and its exit code.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `idem --store store args...`.
async fn idem(store: &str, args: &[&str]) -> Run {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("--store")
        .arg(store)
        .args(args)
        .env("IDEM_OPERATOR", "jane")
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env_remove("IDEM_STORE_URL")
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), output)
        .await
        .expect("idem ends")
        .unwrap();
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

impl Run {
    #[track_caller]
    fn ok(&self) -> &Self {
        assert_eq!(self.code, 0, "{self:?}");
        self
    }

    #[track_caller]
    fn failed(&self, code: i32, message: &str) {
        assert_eq!(self.code, code, "{self:?}");
        assert!(self.stderr.contains(message), "{self:?}");
    }

    /// The run succeeded and printed `text`.
    #[track_caller]
    fn says(&self, text: &str) -> &Self {
        assert_eq!(self.code, 0, "{self:?}");
        assert!(self.stdout.contains(text), "{text:?} not in {self:?}");
        self
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }
}

/// Runs `idem --store store table... words...`, the words split at spaces.
async fn said(store: &str, table: &[&str], words: &str) -> Run {
    let mut args = table.to_vec();
    args.extend(words.split(' '));
    idem(store, &args).await
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run ./scripts/test"))
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

async fn records(store: &str, table: &[&str], records: &Idempotency) {
    let tenant = unique("tenant");
    stuck::completed_record(records, &tenant, "pay-1", "order placed").await;
    let args = |words: &[&'static str]| {
        let mut args = table.to_vec();
        args.extend(words);
        args
    };
    let mut get = args(&["records", "get"]);
    get.extend([tenant.as_str(), "pay-1"]);
    let shown = idem(store, &get).await;
    shown.ok();
    assert!(
        shown.stdout.contains("completed") && shown.stdout.contains("pay-1"),
        "{shown:?}"
    );
    assert!(
        shown.stderr.contains("record.read") && shown.stderr.contains("jane"),
        "traced: {shown:?}"
    );
    assert!(
        !shown.stderr.contains("pay-1"),
        "the key is never logged: {shown:?}"
    );
    let mut json = vec!["--json"];
    json.extend(&get);
    assert_eq!(idem(store, &json).await.json()["state"], "completed");
    let mut unknown = args(&["records", "get"]);
    unknown.extend([tenant.as_str(), "never-used"]);
    idem(store, &unknown).await.failed(3, "no such record");
    let mut delete = args(&["records", "delete"]);
    delete.extend([tenant.as_str(), "pay-1"]);
    let deleted = idem(store, &delete).await;
    assert!(
        deleted
            .ok()
            .stdout
            .contains("record.delete: done, now deleted"),
        "{deleted:?}"
    );
    let again = idem(store, &delete).await;
    assert!(
        again
            .ok()
            .stdout
            .contains("nothing changed, it was done before: absent"),
        "{again:?}"
    );
    let scope = idem_core::Scope::parse(&tenant, "pay-1").unwrap();
    assert!(records.get(&scope).await.unwrap().is_none());
}

async fn journal(store: &str, table: &[&str], journal: &dyn idem_core::store::JournalStore) {
    let ns = unique("billing");
    stuck::operation(
        journal,
        &ns,
        "order-1",
        OperationState::Unknown,
        "timed out",
    )
    .await;
    stuck::operation(
        journal,
        &ns,
        "order-2",
        OperationState::NeedsReview,
        "no match",
    )
    .await;
    let mut list = table.to_vec();
    list.extend(["journal", "list", ns.as_str()]);
    let listed = idem(store, &list).await;
    listed.ok();
    assert!(
        listed.stdout.contains("order-1") && listed.stdout.contains("needs_review"),
        "{listed:?}"
    );
    let settle = format!("journal settle {ns} order-1 charge --outcome failed --note declined");
    said(store, table, &settle)
        .await
        .says("journal.settle: done, now failed");
    said(store, table, &settle).await.says("nothing changed");
    let otherwise = format!("journal settle {ns} order-1 charge --outcome succeeded --note x");
    said(store, table, &otherwise)
        .await
        .failed(4, "settled as failed");
    let nobody = format!("journal settle {ns} order-404 charge --outcome failed --note x");
    said(store, table, &nobody)
        .await
        .failed(3, "no such operation");
    let key = idem_core::store::OperationKey::new(
        idem_core::Tenant::new(&ns).unwrap(),
        idem_core::store::OperationId::new("order-1", "charge").unwrap(),
    );
    assert_eq!(
        journal.get(&key).await.unwrap().unwrap().state(),
        OperationState::Failed
    );
}

async fn parking(store: &str, table: &[&str], parking: &dyn idem_core::store::ParkingStore) {
    let name = unique("shipping");
    stuck::parked_message(parking, &name, "m-1", "order-1", "ship").await;
    let mut parked = table.to_vec();
    parked.extend(["consumer", "parked", name.as_str()]);
    let listed = idem(store, &parked).await;
    assert!(
        listed.ok().stdout.contains("m-1") && listed.stdout.contains("no carrier ships"),
        "{listed:?}"
    );
    stuck::parked_gap(parking, &name, "m-7-3", "order-7", (1, 3)).await;
    let mut stuck = table.to_vec();
    stuck.extend(["consumer", "stuck", name.as_str()]);
    let found = idem(store, &stuck).await;
    assert!(
        found.ok().stdout.contains("order-7") && found.stdout.contains("WAITING_FOR"),
        "{found:?}"
    );
    let mut replay = table.to_vec();
    replay.extend(["consumer", "replay", name.as_str(), "m-1"]);
    idem(store, &replay).await.failed(5, "admin route");
    let drop = format!("consumer drop {name} m-1 --reason cancelled");
    said(store, table, &drop)
        .await
        .says("consumer.drop: done, now dropped");
    said(store, table, &drop).await.says("cancelled");
    let entry = parking
        .get(
            &idem_core::ConsumerName::new(&name).unwrap(),
            &idem_core::IdempotencyKey::new("m-1").unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(entry.state, ParkedState::Dropped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_mends_every_part_of_a_postgres_store() {
    use idem_postgres::*;
    let url = env("IDEM_POSTGRES_URL");
    let pool = guarded(sqlx::postgres::PgPoolOptions::new().max_connections(2))
        .connect(&url)
        .await
        .unwrap();
    let tables: Vec<String> = ["cli_records", "cli_outbox", "cli_parked", "cli_journal"]
        .iter()
        .map(|t| unique(t))
        .collect();
    let records_store =
        PostgresStore::with_options(pool.clone(), PostgresOptions::default().table(&tables[0]))
            .unwrap();
    records_store.migrate().await.unwrap();
    let outbox = PostgresOutbox::with_options(
        pool.clone(),
        PostgresOutboxOptions::default().table(&tables[1]),
    )
    .unwrap();
    outbox.migrate().await.unwrap();
    let parked = PostgresParking::with_options(
        pool.clone(),
        PostgresParkingOptions::default().table(&tables[2]),
    )
    .unwrap();
    parked.migrate().await.unwrap();
    let journal_store =
        PostgresJournal::with_options(pool, PostgresJournalOptions::default().table(&tables[3]))
            .unwrap();
    journal_store.migrate().await.unwrap();

    records(
        &url,
        &["--table", &tables[0]],
        &Idempotency::new(Arc::new(records_store)),
    )
    .await;
    journal(&url, &["--table", &tables[3]], &journal_store).await;
    parking(&url, &["--table", &tables[2]], &parked).await;

    let ids = stuck::parked_outbox(&outbox, &["order-1", "order-2"]).await;
    let table = ["--table", tables[1].as_str()];
    let run = |args: Vec<String>| {
        let url = url.clone();
        async move {
            let mut all: Vec<&str> = table.to_vec();
            all.extend(args.iter().map(String::as_str));
            idem(&url, &all).await
        }
    };
    let words = |text: &str| text.split(' ').map(str::to_string).collect::<Vec<_>>();
    let stats = run(words("--json outbox stats")).await;
    assert_eq!(stats.ok().json()["parked"], 2, "{stats:?}");
    let listed = run(words("outbox parked --limit 1")).await;
    assert!(
        listed
            .ok()
            .stdout
            .contains("1 of 2 from 0; next page: --offset 1"),
        "{listed:?}"
    );
    assert!(
        listed.stdout.contains("broker refused: no route"),
        "{listed:?}"
    );
    let (first, second) = (ids[0].to_string(), ids[1].to_string());
    run(words(&format!("outbox retry {first}")))
        .await
        .says("outbox.retry: done, now waiting");
    run(words(&format!("outbox retry {first}")))
        .await
        .says("nothing changed");
    assert_eq!(
        stuck::outbox_state(&outbox, ids[0]).await.0,
        MessageState::Waiting
    );
    let drop = vec![
        "outbox".into(),
        "drop".into(),
        second.clone(),
        "--reason".into(),
        "refunded by hand".into(),
    ];
    run(drop.clone())
        .await
        .says("outbox.drop: done, now dropped");
    let again = run(drop).await;
    assert!(
        again.ok().stdout.contains("nothing changed") && again.stdout.contains("refunded by hand"),
        "{again:?}"
    );
    assert_eq!(
        stuck::outbox_state(&outbox, ids[1]).await,
        (MessageState::Dropped, Some("refunded by hand".into()))
    );
    run(words(&format!("outbox retry {second}")))
        .await
        .failed(4, "dropped, not retried");
    let shown = run(words(&format!("--json outbox show {second}"))).await;
    assert_eq!(shown.ok().json()["state"], "dropped");
    run(words(&format!("outbox show {}", uuid::Uuid::new_v4())))
        .await
        .failed(3, "no such outbox message");
    run(words("outbox show not-a-uuid"))
        .await
        .failed(2, "not a UUID");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_mends_records_and_journals_of_a_redis_store() {
    use idem_redis::*;
    let url = env("IDEM_REDIS_URL");
    let conn = redis::aio::ConnectionManager::new(redis::Client::open(url.as_str()).unwrap())
        .await
        .unwrap();
    let (records_prefix, journal_prefix) = (unique("clir"), unique("clij"));
    let options = RedisOptions::default()
        .prefix(&records_prefix)
        .accept_volatility()
        .accept_eviction_risk();
    let store = RedisStore::with_options(conn.clone(), options)
        .await
        .unwrap();
    records(
        &url,
        &["--table", &records_prefix],
        &Idempotency::new(Arc::new(store)),
    )
    .await;
    let journal_store =
        RedisJournal::with_options(conn, RedisJournalOptions::default().prefix(&journal_prefix))
            .unwrap();
    journal(&url, &["--table", &journal_prefix], &journal_store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_mends_records_parking_and_journals_of_a_dynamodb_table() {
    use idem_dynamo::aws_sdk_dynamodb::config::{Credentials, Region};
    use idem_dynamo::*;
    let endpoint = env("IDEM_DYNAMO_ENDPOINT");
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version_latest()
        .endpoint_url(&endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
        .build();
    let client = aws_sdk_dynamodb::Client::from_conf(config);
    let slow = idem_core::StoreOptions::default().with_operation_timeout(Duration::from_secs(20));
    let url = |table: &str| format!("dynamodb://{table}?endpoint={endpoint}&region=us-east-1");

    let table = unique("cli-records");
    let options = DynamoOptions::default()
        .table(&table)
        .store_options(slow.with_max_response_bytes(256 * 1024));
    let store = DynamoStore::with_options(client.clone(), options).unwrap();
    store.create_table().await.unwrap();
    records(&url(&table), &[], &Idempotency::new(Arc::new(store))).await;

    let table = unique("cli-parked");
    let parked = DynamoParking::with_options(
        client.clone(),
        DynamoParkingOptions::default()
            .table(&table)
            .store_options(slow),
    )
    .unwrap();
    parked.create_table().await.unwrap();
    parking(&url(&table), &[], &parked).await;

    let table = unique("cli-journal");
    let journal_store = DynamoJournal::with_options(
        client,
        DynamoJournalOptions::default()
            .table(&table)
            .store_options(slow),
    )
    .unwrap();
    journal_store.create_table().await.unwrap();
    journal(&url(&table), &[], &journal_store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_url_is_a_usage_error_and_a_silent_store_is_unavailable() {
    let get = ["records", "get", "t", "k"];
    let redis = env("IDEM_REDIS_URL");
    let cases: [(&str, &[&str], i32, &str); 9] = [
        ("mysql://localhost/app", &get, 2, "not a store URL"),
        ("memory:", &get, 2, "inside its process"),
        ("postgres://host:notaport/db", &get, 2, "error"),
        ("redis://:::", &get, 2, "error"),
        ("dynamodb://?region=us-east-1", &get, 2, "names its table"),
        (
            "dynamodb://t?color=blue",
            &get,
            2,
            "unknown DynamoDB URL parameter",
        ),
        (
            &redis,
            &["consumer", "parked", "shipping"],
            2,
            "redis keeps no parked messages",
        ),
        (&redis, &["outbox", "stats"], 2, "redis keeps no outbox"),
        // Nothing listens on port 1.
        ("postgres://postgres@127.0.0.1:1/test", &get, 6, "postgres"),
    ];
    for (url, args, code, message) in cases {
        idem(url, args).await.failed(code, message);
    }
    let run = tokio::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["records", "get", "t", "k"])
        .env_remove("IDEM_STORE_URL")
        .output()
        .await
        .unwrap();
    assert_eq!(run.status.code(), Some(2), "no store given");
}
