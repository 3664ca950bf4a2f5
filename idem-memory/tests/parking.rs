//! The public parking suite on the in-process parking store.

idem_conformance::parking_suite!(async { idem_memory::MemoryParking::new() });
