//! The outbound operation journal's part: what `idem-journal` keeps of
//! each call to a provider, and the store that keeps it.

pub(crate) mod operation;
pub(crate) mod store;
