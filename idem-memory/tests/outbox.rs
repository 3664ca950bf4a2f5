//! The public outbox suite on the in-process outbox store, with four
//! partitions (every case holds whatever the count; more than one shows
//! that messages land in their aggregates' partitions).

idem_conformance::outbox_suite!(async {
    idem_memory::MemoryOutbox::with_partitions(4, idem_core::store::SystemClock)
        .expect("a valid partition count")
});

/// One partition, the default.
mod on_one_partition {
    idem_conformance::outbox_suite!(async { idem_memory::MemoryOutbox::new() });
}

/// The same suite with the store's clock hours ahead of the process's: the
/// store judges every lease, back-off and age by its own clock alone.
mod on_a_clock_far_from_the_process {
    use idem_conformance::support::{SKEW, SkewedClock};

    idem_conformance::outbox_suite!(async {
        idem_memory::MemoryOutbox::with_partitions(4, SkewedClock::ahead(SKEW))
            .expect("a valid partition count")
    });
}
