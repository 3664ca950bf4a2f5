//! The whole conformance suite against a real Postgres.

mod common;

idem_conformance::conformance_suite!(common::store());

/// The batch suite against `PgTransaction`: claims inside the transaction
/// and savepoints.
mod batches {
    idem_conformance::batch_suite!(async {
        idem_conformance::batches::Batching::new(super::common::store().await, |store| {
            let store = store.clone();
            async move { store.begin().await }
        })
    });
}
