//! The whole conformance suite against a DynamoDB-compatible server.

mod common;

idem_conformance::conformance_suite!(common::shared_store());
