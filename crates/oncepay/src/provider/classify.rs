//! The rules every adapter's table follows when it decides what one of its
//! provider's answers proves (the tables themselves are the adapters':
//! `sandbox::classify`, `stripe::classify`):
//!
//! - Only an answer that names the object's state is a fact; a decline is
//!   a fact only where money could have moved (a charge, never a read).
//! - "No such object" is a fact only for a read, and only where the
//!   adapter can trust it (it says when in its docs).
//! - Everything else proves nothing: it is *unknown*, never a failure. A
//!   refused credential (`401`, `403`), a WAF page, a redirect, a `409`, an
//!   unreadable body: treating any of them as final would make the order
//!   payable again while the provider may still take the money, which is
//!   how a double charge is born.
//! - A transient answer (`408`, `429`, `5xx`, or the provider's own word)
//!   is retried at once with the same key; past the retry budget it is
//!   unknown.
//! - An answer that says our own request was wrong in a way only a bug of
//!   ours can cause (a key reused with other parameters) is unknown too,
//!   and logged at error and counted ([`Verdict::Bug`]).
//!
//! "Unknown" never settles anything: the payment or refund stays `pending`
//! and the reconciler asks again later.

use super::CallOutcome;

/// Which kind of call an answer belongs to: the tables differ for "not
/// found" (meaningful for a read only) and for declines (meaningful for a
/// write only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// A safe status read.
    Read,
    /// A call that may have an effect (`POST`, with our key).
    Write,
}

/// What one answer means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A fact (an object, a decline, or "no such object") or an unknown
    /// that waiting a few hundred milliseconds will not change.
    Done(CallOutcome),
    /// A transient answer: try again now, with the same key.
    Retry(String),
    /// The provider says our request was wrong in a way only a bug of ours
    /// can cause: unknown for the money, logged at error and counted.
    Bug(String),
}
