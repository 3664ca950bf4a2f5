//! The public parking suite against a DynamoDB-compatible server, each case
//! on a table of its own (a purge sees the whole table); and one request
//! per operation, counted by the server.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code fails loudly

mod common;

use std::time::Duration;

use idem_conformance::parking::inbound;
use idem_conformance::support::fresh_consumer;
use idem_core::IdempotencyKey;
use idem_core::store::{NewParked, ParkedQuery, ParkingStore, Resolution};

mod suite {
    idem_conformance::parking_suite!(super::common::own_parking("parking"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_parking_operation_is_one_request_and_a_purge_one_more_per_entry() {
    let parking = common::own_parking("parking-rt").await;
    let table = parking.table().to_string();
    let consumer = fresh_consumer();
    let id = IdempotencyKey::new("m-1").unwrap();
    let mut costs = Vec::new();
    macro_rules! cost {
        ($what:expr, $op:expr) => {{
            let before = common::requests(&table).await;
            let value = $op;
            costs.push(($what, common::requests(&table).await - before));
            value
        }};
    }
    let parked = NewParked {
        consumer: consumer.clone(),
        message: inbound("m-1", "order-1", Some(2)),
        reason: "bad total".into(),
        deliveries: 5,
    };
    cost!("park", parking.park(&parked).await.unwrap());
    cost!("park again", parking.park(&parked).await.unwrap());
    let read = cost!("get", parking.get(&consumer, &id).await.unwrap());
    assert!(read.is_some());
    let query = ParkedQuery::new(consumer.clone());
    let listed = cost!("list", parking.parked(&query).await.unwrap());
    let of_aggregate = query.clone().of_aggregate("order-1");
    let by_version = cost!(
        "list of an aggregate",
        parking.parked(&of_aggregate).await.unwrap()
    );
    assert_eq!((listed.len(), by_version.len()), (1, 1));
    assert_eq!(cost!("count", parking.count(&consumer).await.unwrap()), 1);
    let resolved = cost!(
        "resolve",
        parking
            .resolve(&consumer, &id, &Resolution::Replayed)
            .await
            .unwrap()
    );
    let refused = cost!(
        "resolve of a resolved entry",
        parking
            .resolve(&consumer, &id, &Resolution::Replayed)
            .await
            .unwrap()
    );
    assert!(resolved && !refused);
    for (what, n) in &costs {
        assert_eq!(*n, 1, "{what} took {n} requests: {costs:?}");
    }
    let before = common::requests(&table).await;
    assert_eq!(parking.purge_resolved(Duration::ZERO, 10).await.unwrap(), 1);
    assert_eq!(
        common::requests(&table).await - before,
        2,
        "a purge of one entry: the query and the delete"
    );
    common::delete_table(&table).await;
}
