//! The whole conformance suite against the replay cache in front of a
//! DynamoDB-compatible server (`IDEM_DYNAMO_ENDPOINT`), built as the DynamoDB
//! store's own tests build theirs.

#[path = "../../idem-dynamo/tests/common/mod.rs"]
mod common;

idem_conformance::conformance_suite!(async {
    idem_cache::CachedStore::new(std::sync::Arc::new(
        common::own_store("cache-conformance").await,
    ))
});
