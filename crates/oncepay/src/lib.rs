//! oncepay: a payments microservice whose one promise is *one intent, one
//! effect*. See docs/architecture.md for the map of modules; in short:
//!
//! - [`http`] — routes and thin handlers;
//! - [`commands`] — money commands as recorded steps, run through
//! - [`idempotency`] — the engine that claims keys, replays and resumes;
//! - [`domain`] — business rules and state machines, free of I/O;
//! - [`store`] — all SQL;
//! - [`provider`] — the payment provider trait and its HTTP client;
//! - [`sandbox`] — the stand-alone sandbox provider;
//! - [`workers`] — the reconciler and the sweeper;
//! - [`outbox`] — events written with the changes they report, for merchants;
//! - [`provider_events`] — inbound provider webhook events;
//! - [`books`] — reconciliation against the providers' books, and the
//!   restore guard.

// Every public item says why it exists.
#![warn(missing_docs)]

pub mod api_keys;
pub mod audit;
pub mod books;
pub mod cli;
pub mod commands;
pub mod config;
pub mod domain;
pub mod http;
pub mod idempotency;
pub mod input;
pub mod metrics;
pub mod outbound;
pub mod outbox;
pub mod problem;
pub mod process_metrics;
pub mod provider;
pub mod provider_events;
pub mod rate_limit;
pub mod sandbox;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod webhooks;
pub mod workers;
