//! The whole conformance suite against a DynamoDB-compatible server.

mod common;

// Each case on a table of its own: a purge scans the whole table, and one
// table shared by every case of every run on one emulator grows with each
// run (after four runs on one moto, a purge's scan outlasted the store's
// timeout on a loaded machine).
idem_conformance::conformance_suite!(common::own_store("conformance"));

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
