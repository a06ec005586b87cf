//! What oncepay's tests, `oncepay-bench` and `oncepay-chaos` share, so that
//! "start a stack and wait until it is ready" is written once:
//!
//! - [`ports`]: free loopback ports;
//! - [`ready`]: waiting for an HTTP endpoint or a condition, with a bound;
//! - [`processes`]: `oncepay` child processes and a private PostgreSQL
//!   cluster that a harness may crash and restart;
//! - [`fault_proxy`]: the provider faults the sandbox cannot make;
//! - [`lossy_tcp`]: answers lost between a client and the service;
//! - [`patroni`]: PostgreSQL under Patroni, etcd and HAProxy, for failovers;
//! - [`pitr`]: a private PostgreSQL with WAL archiving and point-in-time
//!   restore, for the disaster drill;
//! - [`ledger`]: the sandbox's books, where charges are counted;
//! - [`browser`]: a real headless Chromium over WebDriver;
//! - [`receiver`]: a merchant's webhook receiver that records what it gets;
//! - [`localstripe`]: a fake Stripe nobody here wrote, on loopback;
//! - [`stripe_layer`]: Stripe's idempotency, declines and faults in front
//!   of it;
//! - [`test_db`]: the names of the tests' databases, which carry the test
//!   run's id so that a run drops only its own.
//!
//! It depends on no oncepay crate: it drives the `oncepay` binary and HTTP.

// Every public item says why it exists.
#![warn(missing_docs)]

pub mod browser;
pub mod fault_proxy;
pub mod ledger;
pub mod localstripe;
pub mod loopback_http;
pub mod lossy_tcp;
pub mod patroni;
pub mod pitr;
pub mod ports;
pub mod processes;
pub mod ready;
pub mod receiver;
pub mod stripe_layer;
pub mod test_db;
pub mod tls;
