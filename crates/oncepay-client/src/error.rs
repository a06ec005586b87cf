//! What can go wrong, and whether the outcome is known.

use std::time::Duration;

/// A problem answer of the API (RFC 9457): a final answer, never retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// The stable `code` (`order_not_payable`, `payment_in_progress`, …).
    pub code: String,
    /// What went wrong, naming the field when one is at fault.
    pub detail: String,
    /// The `X-Request-Id` of the answer, for support.
    pub request_id: Option<String>,
}

/// Everything a call can end with other than its result.
///
/// ```
/// use oncepay_client::Error;
/// fn explain(e: &Error) -> &'static str {
///     if e.outcome_known() { "nothing happened, or what happened is final" } else { "resume the intent later" }
/// }
/// ```
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API answered with a final problem (a `4xx` other than the
    /// retried ones). The outcome is known: this is the answer.
    #[error("{} {}: {} (request {})", .0.status, .0.code, .0.detail, .0.request_id.as_deref().unwrap_or("-"))]
    Api(ApiError),
    /// No final answer before the deadline (timeouts, lost connections,
    /// `5xx`, still in flight). The outcome is **unknown**: the intent stays
    /// open; resume it later with the same key. Never treat this as failed.
    #[error(
        "outcome unknown after {elapsed:?} for intent {intent:?} (last: {last}); resume it later"
    )]
    OutcomeUnknown {
        /// The intent's name.
        intent: String,
        /// Its idempotency key.
        key: String,
        /// What the last try met.
        last: String,
        /// The `X-Request-Id` of the last answer, if one came.
        request_id: Option<String>,
        /// How long the client tried.
        elapsed: Duration,
    },
    /// Nothing of the request was sent by this call: every try failed
    /// before a byte of it left this process (the connection was refused,
    /// the TLS handshake failed: a server that does not speak TLS, a
    /// certificate not trusted). A failed TLS handshake is not retried:
    /// the same handshake would fail again. The intent stays open with its
    /// key: send it again, as the same intent, once the cause is fixed
    /// (never under a new intent while this one is open).
    #[error("intent {intent:?} not sent: {reason}; no byte of its request left on this call, and the intent stays open: send it again with the same key")]
    NotSent {
        /// The intent's name.
        intent: String,
        /// Its idempotency key.
        key: String,
        /// Why nothing was sent.
        reason: String,
        /// The intent was already in the store when this call began: an
        /// earlier call (this process's, or one before a restart) may have
        /// sent it, so whether it took effect is known only once it is sent
        /// again. False: it was never sent, so nothing happened.
        opened_before: bool,
    },
    /// A read (`GET`) got no answer before the deadline.
    #[error("{path}: no answer before the deadline (last: {last})")]
    Unavailable {
        /// What was read.
        path: String,
        /// What the last try met.
        last: String,
    },
    /// The intent already carries another request: one intent, one
    /// request. Use a new intent name for a new intent.
    #[error("intent {0:?} was made for another request; use a new intent for a new request")]
    IntentReused(String),
    /// The intent store failed; nothing was sent.
    #[error("intent store: {0}")]
    Store(#[from] crate::store::StoreError),
    /// An answer that is not what the API documents.
    #[error("unexpected answer: {0}")]
    Decode(String),
    /// The client could not be built (bad base URL, TLS).
    #[error("client: {0}")]
    Build(String),
}

impl Error {
    /// False only when the effect may or may not have happened
    /// ([`Error::OutcomeUnknown`], and [`Error::NotSent`] for an intent an
    /// earlier call may have sent). A [`Error::NotSent`] intent sent for
    /// the first time is known: nothing happened.
    pub fn outcome_known(&self) -> bool {
        !matches!(
            self,
            Error::OutcomeUnknown { .. }
                | Error::NotSent {
                    opened_before: true,
                    ..
                }
        )
    }

    /// True when this call sent nothing of the request ([`Error::NotSent`]):
    /// the intent is open and safe to send again with the same key.
    pub fn not_sent(&self) -> bool {
        matches!(self, Error::NotSent { .. })
    }

    /// The problem `code`, for an API answer.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api(e) => Some(&e.code),
            _ => None,
        }
    }
}
