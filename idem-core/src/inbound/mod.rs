//! The inbound record machine: a request carrying an idempotency key runs
//! once, and every retry gets the original response.

pub(crate) mod claim;
pub(crate) mod codec;
pub(crate) mod decision;
pub(crate) mod fingerprint;
pub(crate) mod outcome;
pub(crate) mod record;
pub(crate) mod runner;
pub(crate) mod serialize;
pub(crate) mod store;
pub(crate) mod sweeper;
