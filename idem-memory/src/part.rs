//! What every memory part has alike, written once: its name, its layer
//! (no timer: nothing here waits on a network), its capabilities and its
//! constructors on a clock.

use idem_core::store::{
    Capabilities, ClockSource, Durability, Layered, OperationLayer, TransactionSharing,
};

/// The constructors of a memory part that keeps nothing but its state and
/// its clock: `$inner::on(clock)` builds the part's rules over empty state.
macro_rules! clocked_part {
    ($ty:ident => $field:ident: $inner:ident, $what:literal) => {
        impl Default for $ty {
            fn default() -> Self {
                Self::new()
            }
        }

        impl $ty {
            #[doc = concat!("An empty ", $what, " on the system clock.")]
            pub fn new() -> Self {
                Self::with_clock(idem_core::store::SystemClock)
            }

            #[doc = concat!("An empty ", $what, " on `clock`.")]
            pub fn with_clock(clock: impl idem_core::store::Clock) -> Self {
                Self {
                    $field: crate::part::layered($inner::on(std::sync::Arc::new(clock))),
                }
            }
        }
    };
}

pub(crate) use clocked_part;

/// The store's name in errors.
pub(crate) const STORE: &str = "memory";

/// Every memory part inside its layer: spans and metrics, and no timer, as
/// nothing here waits on a network (a runtime without one works).
pub(crate) fn layered<T>(inner: T) -> Layered<T> {
    Layered::with_layer(inner, OperationLayer::unlimited(STORE))
}

/// What every memory part is: volatile, on the caller's clock.
pub(crate) fn capabilities(max_response_bytes: usize) -> Capabilities {
    Capabilities::new(
        STORE,
        TransactionSharing::None,
        Durability::Volatile,
        ClockSource::Caller,
        max_response_bytes,
    )
}
