//! The whole conformance suite against one Redis server.

mod common;

idem_conformance::conformance_suite!(common::single_store());
