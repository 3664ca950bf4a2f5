//! The whole conformance suite against the replay cache in front of a real
//! Postgres (`IDEM_POSTGRES_URL`), built as the Postgres store's own tests
//! build theirs.

#[path = "../../idem-postgres/tests/common/mod.rs"]
mod common;

idem_conformance::conformance_suite!(async {
    idem_cache::CachedStore::new(std::sync::Arc::new(common::store().await))
});
