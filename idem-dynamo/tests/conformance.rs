//! The whole conformance suite against a DynamoDB-compatible server.

mod common;

idem_conformance::conformance_suite!(common::shared_store());

/// The batch suite against `DynamoTransaction`: claims inside the
/// transaction and savepoints. On tables of their own: moto copies each
/// table a transaction names, whole, before it writes.
mod batches {
    idem_conformance::batch_suite!(async {
        idem_conformance::batches::Batching::new(
            super::common::own_store("batches").await,
            |store| store.begin(),
        )
    });
}
