//! The whole conformance suite against a store written from the store module's docs alone.

idem_conformance::conformance_suite!(async { idem_own_store::OwnStore::new() });
