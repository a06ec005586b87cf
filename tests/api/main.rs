//! Black-box tests of oncepay: real PostgreSQL, real sandbox over HTTP, real
//! server over TCP. One binary, one module per concern.

mod chaos;
// The fault harness's proxy, shared until the test kit has a crate of its own.
#[path = "../../src/bin/oncepay-chaos/fault_proxy.rs"]
mod fault_proxy;
mod helpers;
mod idempotency;
mod ops;
mod orders;
mod payments;
mod processes;
mod provider_faults;
mod refunds;
mod schema;
mod security;
mod webhooks;
