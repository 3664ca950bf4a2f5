//! The whole conformance suite against the memory store, directly and through
//! `Arc<dyn IdempotencyStore>` (the trait object path every swappable service uses).

mod direct {
    idem_conformance::conformance_suite!(async { idem_memory::MemoryStore::new() });
}

mod through_dyn {
    use std::sync::Arc;

    use idem_core::store::IdempotencyStore;

    idem_conformance::conformance_suite!(async {
        Arc::new(idem_memory::MemoryStore::new()) as Arc<dyn IdempotencyStore>
    });
}

/// The batch suite against `MemoryTransaction`: claims inside the
/// transaction and savepoints.
mod batches {
    idem_conformance::batch_suite!(async {
        idem_conformance::batches::Batching::new(idem_memory::MemoryStore::new(), |store| {
            let tx = store.begin();
            async move { Ok(tx) }
        })
    });
}
