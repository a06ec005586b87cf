//! `oncepay sandbox`: a stand-alone payment provider for development, demos
//! and tests (contract section 7), reached only over HTTP through the same
//! client a real provider would use. State is in memory.
//!
//! It charges once per provider idempotency key (a repeat returns the first
//! charge), sends Standard-Webhooks-signed events with retries, injects
//! faults chosen per request (token suffixes) or at start (rates), and keeps
//! a ledger of requests and effects per key so tests can prove that nothing
//! happened twice.
//!
//! Tokens: `tok_visa` succeeds, `tok_declined` fails with `card_declined`,
//! `tok_async` stays pending and succeeds after `ONCEPAY_SANDBOX_ASYNC_DELAY`
//! (`tok_async_declined` fails then). Suffixes, e.g. `tok_visa+drop+dup`:
//! - `+error[=N]`: answer `500` without charging, for the key's first N requests;
//! - `+drop[=N]`: charge, then drop the connection without answering (first N);
//! - `+delay=MS`: charge, then answer only after MS milliseconds (first request);
//! - `+dup`: deliver each webhook of the charge three times;
//! - `+reorder`: deliver the charge's webhooks in reverse order (a final
//!   event before the `pending` one).
//!
//! An unknown suffix (or an unreadable value) is answered `400
//! unknown_fault` naming it: a misspelt fault never silently does nothing.

mod faults;
mod server;
mod state;

pub use faults::TokenFaults;
pub use server::{run, start, Sandbox};
