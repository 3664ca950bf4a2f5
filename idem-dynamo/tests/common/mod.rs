//! A client for the DynamoDB-compatible server named by `IDEM_DYNAMO_ENDPOINT`.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::expect_used,
    clippy::panic,
    clippy::unwrap_used
)]

use std::collections::HashMap;
use std::time::Duration;

use idem_conformance::faults::FaultProxy;
use idem_core::StoreOptions;
use idem_dynamo::aws_sdk_dynamodb::config::{Credentials, Region, timeout::TimeoutConfig};
use idem_dynamo::aws_sdk_dynamodb::types::AttributeValue;
use idem_dynamo::aws_sdk_dynamodb::{Client, Config};
use idem_dynamo::{
    DynamoJournal, DynamoJournalOptions, DynamoOptions, DynamoParking, DynamoParkingOptions,
    DynamoStore,
};

pub const ENDPOINT_VAR: &str = "IDEM_DYNAMO_ENDPOINT";

/// The server of this test (`idem_conformance::support::dynamo_endpoint`:
/// where several are listed, the one of the test's slot).
pub fn endpoint() -> String {
    idem_conformance::support::dynamo_endpoint().unwrap_or_else(|| {
        panic!("{ENDPOINT_VAR} is not set: point it at a DynamoDB-compatible server (scripts/test starts moto and sets it)")
    })
}

/// Dummy credentials and a short timeout: a missing server fails in seconds.
pub fn client() -> Client {
    client_at(&endpoint())
}

/// How long the tests' clients wait for a connection, unless a test says.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// [`client`] for another endpoint (a proxy in front of the server).
pub fn client_at(endpoint: &str) -> Client {
    client_with(endpoint, CONNECT_TIMEOUT)
}

/// A client of `endpoint` that gives up on a connection after `connect`,
/// and on an operation (its retries included) after 30 s: far longer than
/// any store's operation timeout in the tests, so the store's is what fires.
pub fn client_with(endpoint: &str, connect: Duration) -> Client {
    Client::from_conf(config_with(endpoint, connect).build())
}

/// The configuration of [`client_with`], for a test to add to (an
/// interceptor that records requests).
pub fn config_with(
    endpoint: &str,
    connect: Duration,
) -> idem_dynamo::aws_sdk_dynamodb::config::Builder {
    Config::builder()
        .behavior_version_latest()
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("test", "test", None, None, "idem-tests"))
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(connect)
                .operation_timeout(Duration::from_secs(30))
                .build(),
        )
}

/// A fault proxy in front of the server at `IDEM_DYNAMO_ENDPOINT`.
pub async fn proxy() -> FaultProxy {
    FaultProxy::start(
        endpoint()
            .trim_start_matches("http://")
            .trim_end_matches('/'),
    )
    .await
}

/// A store through `proxy` with `options` and the operation timeout
/// `limit` (the moto response limit added), its table created; its client
/// gives up on a connection after `connect` (see [`client_with`]).
pub async fn store_through(
    proxy: &FaultProxy,
    connect: Duration,
    options: DynamoOptions,
    limit: Duration,
) -> DynamoStore {
    let client = client_with(&format!("http://{}", proxy.address()), connect);
    store_with_client(client, options, limit).await
}

/// A store on a table of the test's own, for counting its requests.
pub async fn own_store(prefix: &str) -> DynamoStore {
    store_on(&own_table(prefix)).await
}

/// moto counts a binary attribute written by UpdateItem by its base64 text
/// (a third larger than DynamoDB's count of raw bytes), so its items fill up
/// near 290 KB of body; the tests advertise a limit that moto can honour.
pub const MOTO_MAX_RESPONSE_BYTES: usize = 256 * 1024;

/// The operation timeout of the tests' stores where no timeout is under
/// test: moto, one Python process, queues the requests of every test at
/// once, and on a loaded machine one can wait seconds behind a race storm's
/// (below the client's 30 s, so the store's limit is still what fires).
pub const GENEROUS_OPERATION_TIMEOUT: Duration = Duration::from_secs(20);

/// A store on `table`, with [`GENEROUS_OPERATION_TIMEOUT`].
pub async fn store_on(table: &str) -> DynamoStore {
    store_with(DynamoOptions::default().table(table)).await
}

/// A store with `options` and [`GENEROUS_OPERATION_TIMEOUT`] (the moto
/// response limit added), its table created.
pub async fn store_with(options: DynamoOptions) -> DynamoStore {
    store_with_client(client(), options, GENEROUS_OPERATION_TIMEOUT).await
}

/// A store over `client` with `options` and the operation timeout `limit`
/// (the moto response limit added), its table created.
pub async fn store_with_client(
    client: Client,
    options: DynamoOptions,
    limit: Duration,
) -> DynamoStore {
    let shared = StoreOptions::default()
        .with_operation_timeout(limit)
        .with_max_response_bytes(MOTO_MAX_RESPONSE_BYTES);
    let store =
        DynamoStore::with_options(client, options.store_options(shared)).expect("valid options");
    store.create_table().await.unwrap_or_else(|e| {
        panic!(
            "cannot create table {} at {ENDPOINT_VAR}={}: {e:?}",
            store.table(),
            endpoint()
        )
    });
    store
}

/// The business item `order#{id}` in `store`'s table, read consistently.
pub async fn order_item(store: &DynamoStore, id: &str) -> Option<HashMap<String, AttributeValue>> {
    store
        .client()
        .get_item()
        .table_name(store.table())
        .key("pk", AttributeValue::S(format!("order#{id}")))
        .consistent_read(true)
        .send()
        .await
        .expect("get the order item")
        .item
}

/// A journal on the shared journal table (cases use namespaces of their own).
pub async fn shared_journal() -> DynamoJournal {
    journal_with(DynamoJournalOptions::default().table("idem-journal-conformance")).await
}

/// A journal on a table of the test's own, for counting its requests.
pub async fn own_journal(prefix: &str) -> DynamoJournal {
    journal_with(DynamoJournalOptions::default().table(&own_table(prefix))).await
}

/// A journal with `options` and [`GENEROUS_OPERATION_TIMEOUT`], its table
/// (and list index) created.
pub async fn journal_with(options: DynamoJournalOptions) -> DynamoJournal {
    let shared = StoreOptions::default().with_operation_timeout(GENEROUS_OPERATION_TIMEOUT);
    let journal = DynamoJournal::with_options(client(), options.store_options(shared))
        .expect("valid options");
    journal.create_table().await.unwrap_or_else(|e| {
        panic!(
            "cannot create table {} at {ENDPOINT_VAR}={}: {e:?}",
            journal.table(),
            endpoint()
        )
    });
    journal
}

/// A parking store on a table of the test's own (a purge sees the whole
/// table), its table and indexes created.
pub async fn own_parking(prefix: &str) -> DynamoParking {
    parking_on(client(), &own_table(prefix)).await
}

/// A parking store over `client` on `table`, with
/// [`GENEROUS_OPERATION_TIMEOUT`], its table and indexes created.
pub async fn parking_on(client: Client, table: &str) -> DynamoParking {
    let shared = StoreOptions::default().with_operation_timeout(GENEROUS_OPERATION_TIMEOUT);
    let options = DynamoParkingOptions::default()
        .table(table)
        .store_options(shared);
    let parking = DynamoParking::with_options(client, options).expect("valid options");
    parking.create_table().await.unwrap_or_else(|e| {
        panic!(
            "cannot create table {} at {ENDPOINT_VAR}={}: {e:?}",
            parking.table(),
            endpoint()
        )
    });
    parking
}

/// A table of the test's own in the shape of an application's: string
/// partition key `pk`, and string sort key `sk` if `sorted`.
pub async fn app_table(prefix: &str, sorted: bool) -> String {
    use idem_dynamo::aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    let table = own_table(prefix);
    let keys: &[(&str, KeyType)] = if sorted {
        &[("pk", KeyType::Hash), ("sk", KeyType::Range)]
    } else {
        &[("pk", KeyType::Hash)]
    };
    let mut create = client()
        .create_table()
        .table_name(&table)
        .billing_mode(BillingMode::PayPerRequest);
    for (name, kind) in keys {
        create = create
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(*name)
                    .attribute_type(ScalarAttributeType::S)
                    .build()
                    .unwrap(),
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name(*name)
                    .key_type(kind.clone())
                    .build()
                    .unwrap(),
            );
    }
    create
        .send()
        .await
        .unwrap_or_else(|e| panic!("cannot create table {table}: {e:?}"));
    table
}

/// Every item of `table`, read consistently, page after page.
pub async fn scan(table: &str) -> Vec<HashMap<String, AttributeValue>> {
    let mut items = Vec::new();
    let mut from = None;
    loop {
        let page = client()
            .scan()
            .table_name(table)
            .consistent_read(true)
            .set_exclusive_start_key(from)
            .send()
            .await
            .unwrap_or_else(|e| panic!("cannot scan table {table}: {e:?}"));
        items.extend(page.items.unwrap_or_default());
        from = page.last_evaluated_key;
        if from.is_none() {
            return items;
        }
    }
}

/// Deletes a table of the test's own.
pub async fn delete_table(table: &str) {
    client()
        .delete_table()
        .table_name(table)
        .send()
        .await
        .unwrap_or_else(|e| panic!("cannot delete table {table}: {e:?}"));
}

/// A fresh table name for a test of its own.
pub fn own_table(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// Requests the server has served that named `table` (the test launcher counts them).
pub async fn requests(table: &str) -> u64 {
    let url = format!("{}/__idem/requests?table={table}", endpoint());
    let addr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .expect("endpoint host")
        .to_string();
    let path = format!("/__idem/requests?table={table}");
    // A plain HTTP/1.0 GET: no client crate needed for one counter.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect to the counter");
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    let body = reply.split("\r\n\r\n").nth(1).expect("counter reply body");
    body.trim()
        .trim_start_matches("{\"requests\":")
        .trim_end_matches('}')
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("the server at {ENDPOINT_VAR} does not count requests (start it with scripts/moto_server.py): {body}"))
}

/// An outbox of `partitions` on a table of the test's own (a read or an
/// acquire sees the whole table), with [`GENEROUS_OPERATION_TIMEOUT`], its
/// table and lane index created.
pub async fn own_outbox(prefix: &str, partitions: u32) -> idem_dynamo::DynamoOutbox {
    outbox_with(
        idem_dynamo::DynamoOutboxOptions::default()
            .table(&own_table(prefix))
            .partitions(partitions),
    )
    .await
}

/// An outbox with `options` and [`GENEROUS_OPERATION_TIMEOUT`], its table
/// and lane index created.
pub async fn outbox_with(options: idem_dynamo::DynamoOutboxOptions) -> idem_dynamo::DynamoOutbox {
    let shared = StoreOptions::default().with_operation_timeout(GENEROUS_OPERATION_TIMEOUT);
    let outbox = idem_dynamo::DynamoOutbox::with_options(client(), options.store_options(shared))
        .expect("valid options");
    outbox.create_table().await.unwrap_or_else(|e| {
        panic!(
            "cannot create table {} at {ENDPOINT_VAR}={}: {e:?}",
            outbox.table(),
            endpoint()
        )
    });
    outbox
}
