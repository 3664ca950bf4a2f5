//! The whole conformance suite against a three-master Redis Cluster.

mod common;

idem_conformance::conformance_suite!(common::cluster_store());
