//! The service example runs whole: an order and its retry, the event
//! relayed and applied once, a poison event parked and dropped by the
//! operator, every part stopped together, nothing left behind.

#[path = "../examples/service/main.rs"]
mod service;

#[test]
fn the_service_example_runs_to_its_end_and_stops_as_one() {
    service::main().expect("the service example");
}
