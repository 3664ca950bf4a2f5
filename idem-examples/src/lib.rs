//! # idem-examples
//!
//! idem's parts together over real brokers, at the top of the house: the
//! examples and end-to-end tests that need a broker live here, so every
//! arrow between the crates points down (the outbox and the consumer never
//! depend on the broker adapters built on them).
//!
//! ```sh
//! cargo run -p idem-examples --example service     # a whole service: HTTP, outbox, relay, consumer, console
//! cargo run -p idem-examples --example orders      # the outbox: Postgres and JetStream
//! cargo run -p idem-examples --example shipments   # the consumer: Postgres and JetStream
//! cargo nextest run -p idem-examples               # the end-to-end tests, both brokers
//! ```
