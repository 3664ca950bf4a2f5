//! The consuming side's part: messages as a consumer gets them, version
//! checks, and the parking store for what could not be applied.

pub(crate) mod message;
pub(crate) mod store;
pub(crate) mod versions;
