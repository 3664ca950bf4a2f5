//! The public journal suite on the in-process journal store.

idem_conformance::journal_suite!(async { idem_memory::MemoryJournal::new() });
