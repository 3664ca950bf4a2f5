//! The whole conformance suite against the replay cache in front of the
//! memory store, directly and behind `Arc<dyn IdempotencyStore>`.

mod direct {
    use std::sync::Arc;

    idem_conformance::conformance_suite!(async {
        idem_cache::CachedStore::new(Arc::new(idem_memory::MemoryStore::new()))
    });
}

mod through_dyn {
    use std::sync::Arc;

    use idem_core::store::IdempotencyStore;

    idem_conformance::conformance_suite!(async {
        let inner: Arc<dyn IdempotencyStore> = Arc::new(idem_memory::MemoryStore::new());
        idem_cache::CachedStore::new(inner)
    });
}
