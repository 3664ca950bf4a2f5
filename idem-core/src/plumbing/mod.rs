//! The store plumbing every part is built on: errors, clocks, validated
//! names, fencing tokens, options, capabilities and the operation layer.

pub(crate) mod capabilities;
pub(crate) mod clock;
pub(crate) mod error;
#[cfg(feature = "moka")]
pub(crate) mod expiry;
pub(crate) mod fencing;
pub(crate) mod layer;
pub(crate) mod limits;
pub(crate) mod options;
pub(crate) mod scope;
pub(crate) mod service;
