//! The whole conformance suite against a real Postgres.

mod common;

idem_conformance::conformance_suite!(common::store());
