//! `oncepay-client`: the client half of "one intent, one effect".
//!
//! The service guarantees one effect per idempotency key; whether a user is
//! charged once still depends on the client sending one key per business
//! intent, and the same key on every retry, even across a crash. This crate
//! does that:
//!
//! - **Intents.** [`Client::intent`] names one business intent ("pay order
//!   123"). Its key is made once and stored in an [`IntentStore`] **before**
//!   the first request leaves; every retry, and every later resumption by a
//!   restarted process ([`Client::open_intents`], [`Client::resume`]), sends
//!   that key. A new key only ever comes with a new intent.
//! - **Safe retries only** ([`retry`]): connection errors, timeouts, `5xx`,
//!   `409 idempotency_key_in_flight` and `429`, with the same key, honouring
//!   `Retry-After`, otherwise exponential backoff with full jitter, within a
//!   per-try timeout and a total deadline. Every other `4xx` is final.
//! - **Pending is not failed.** A `202 pending` payment or refund is polled
//!   with `GET` until final or the deadline; still pending then, it is
//!   returned pending.
//! - **Unknown is not failed.** No final answer by the deadline is
//!   [`Error::OutcomeUnknown`]: the intent stays open; resume it later.
//! - **Not sent is not unknown.** A try that failed while connecting (the
//!   connection refused, the TLS handshake failed) sent nothing of the
//!   request. When no try got further, the call ends in [`Error::NotSent`],
//!   saying why: the intent stays open and is safe to send again with its
//!   key. A failed TLS handshake (`https://` to a server that does not
//!   speak TLS, a certificate not trusted) ends it at once: another try
//!   would fail the same way.
//!
//! ```no_run
//! use oncepay_client::{Client, FileStore, Error};
//! # async fn demo(order_id: uuid::Uuid) -> Result<(), Error> {
//! let client = Client::builder("http://127.0.0.1:8080", "opk_…")
//!     .store(FileStore::open("./intents")?)
//!     .build()?;
//! // After a restart: finish what the last process started, same keys.
//! for open in client.open_intents()? {
//!     let _ = client.resume(&open).await;
//! }
//! match client.intent(&format!("pay order {order_id}")).pay(order_id, "tok_visa").await {
//!     Ok(payment) => println!("{:?}", payment.status), // succeeded, failed (declined) or pending
//!     Err(e) if !e.outcome_known() => println!("unknown: resume later ({e})"),
//!     Err(e) if e.not_sent() => println!("not sent: fix the cause, send the intent again ({e})"),
//!     Err(e) => println!("refused: {e}"),
//! }
//! # Ok(()) }
//! ```

// Every public item says why it exists.
#![warn(missing_docs)]

mod client;
mod error;
mod model;
pub mod retry;
mod store;
pub mod webhooks;

pub use client::{AttemptReport, Client, ClientBuilder, Intent};
pub use error::{ApiError, Error};
pub use model::{
    ApiKeyInfo, BalanceFigures, BalanceHold, BalanceTransaction, CheckoutOptions, CheckoutSession,
    CustomerBalance, EventRecord, LineItem, ListQuery, NewOrder, NextAction, Order, Page, Payment,
    Refund, Status, WebhookEndpoint,
};
pub use retry::RetryPolicy;
pub use store::{
    Closed, Command, FileStore, IntentRecord, IntentStore, MemoryStore, StoreError, StoredRequest,
};
/// The `uuid` crate this API's ids are typed with, so a caller names them
/// without depending on a matching version of its own.
pub use uuid;
