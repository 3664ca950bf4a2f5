//! The whole conformance suite against a DynamoDB-compatible server.

mod common;

idem_conformance::conformance_suite!(common::shared_store());

/// The batch suite against `DynamoTransaction`: claims inside the
/// transaction and savepoints.
mod batches {
    idem_conformance::batch_suite!(async {
        idem_conformance::batches::Batching::new(super::common::shared_store().await, |store| {
            store.begin()
        })
    });
}
