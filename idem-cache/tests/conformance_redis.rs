//! The whole conformance suite against the replay cache in front of one
//! Redis server (`IDEM_REDIS_URL`), built as the Redis store's own tests
//! build theirs.

#[path = "../../idem-redis/tests/common/mod.rs"]
mod common;

idem_conformance::conformance_suite!(async {
    idem_cache::CachedStore::new(std::sync::Arc::new(common::single_store().await))
});
