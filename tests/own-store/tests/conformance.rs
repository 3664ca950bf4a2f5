//! The whole conformance suite against a store written from the store module's docs alone.

idem_conformance::conformance_suite!(async { idem_own_store::OwnStore::new() });

/// The parking suite against a parking store written the same way.
mod parking {
    idem_conformance::parking_suite!(async { idem_own_store::OwnParking::new() });
}

/// The batch suite against the store's own transactions.
mod batches {
    idem_conformance::batch_suite!(async {
        idem_conformance::batches::Batching::new(idem_own_store::OwnStore::new(), |store| {
            let tx = store.begin();
            async move { Ok(tx) }
        })
    });
}
