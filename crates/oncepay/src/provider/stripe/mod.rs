//! Stripe, through its PaymentIntents API: what its answers prove
//! ([`classify`]) and how its webhooks are verified ([`signature`]). Pure
//! code, tested by tables; the HTTP client that uses it, and its place in
//! the provider registry, come with the rest of the providers issue.
//!
//! The protocol this adapter is built for (a careful payments engineer's):
//! the PaymentIntent is created **unconfirmed**, with an `Idempotency-Key`
//! derived from our attempt id and `metadata[oncepay_attempt_id]`; its id is
//! recorded as a recovery point; then it is confirmed by id with a key of
//! its own. Only the confirm moves money, and an intent succeeds at most
//! once, so once its id is recorded no retry, crash or expired Stripe key
//! can charge twice. Resuming and reconciling read the intent by id.
//!
//! Tested against localstripe through `oncepay_testkit::stripe_layer`,
//! which adds the Stripe semantics localstripe lacks
//! (`docs/providers/localstripe.md`).

pub mod classify;
pub mod signature;
