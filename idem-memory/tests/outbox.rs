//! The public outbox suite on the in-process outbox store.

idem_conformance::outbox_suite!(async { idem_memory::MemoryOutbox::new() });
