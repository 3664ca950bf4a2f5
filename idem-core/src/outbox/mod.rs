//! The transactional outbox's part: messages written with the business
//! change that causes them, and the store a relay publishes them from.

pub(crate) mod message;
pub(crate) mod store;
