//! Sending again under a new provider key, once the old one is spent
//! (issue 55, item 4; review N4). Stripe saves a `500` under an
//! idempotency key and replays it for a day: a confirm or refund re-sent
//! under that key would stay unknown, its payment `pending`, and then be
//! made a day late. So when a send's answer spends its key
//! ([`crate::provider::Sent::key_spent`]) the row records it, and once a
//! read made after that record proves the send made nothing (the
//! PaymentIntent still unconfirmed; no refund carrying the refund's id),
//! the send is made again under the row's next generation of keys,
//! recorded before it is used (`store::provider_keys`).
//!
//! Why that is safe: a spent key's request had ended when Stripe answered
//! it, and Stripe never runs it again (it replays the answer), so after
//! the proving read nothing under an older key can still make the
//! effect; and of the processes that find a key spent, one moves on. A
//! PaymentIntent succeeds at most once besides. Only Stripe spends keys:
//! the sandbox keeps no error under a key, and the balance has none.

use uuid::Uuid;

use super::AppContext;
use crate::store::provider_keys::{self, KeyState};
use crate::store::queue::Queued;

/// The row's kind, as the reconciler's counter names it.
fn kind<T: Queued>() -> &'static str {
    match T::TABLE.name {
        "refund" => "refund",
        _ => "payment",
    }
}

/// Where the keys of the pending row `id` stand, read before the provider
/// is: a key recorded spent by then was answered before the read. `None`
/// (logged): the row is no longer pending, or the database could not say;
/// nothing is sent.
pub(crate) async fn before_read<T: Queued>(ctx: &AppContext, id: Uuid) -> Option<KeyState> {
    match provider_keys::state::<T>(&ctx.pool, id).await {
        Ok(state) => state,
        Err(e) => {
            tracing::warn!(%id, error = %e, "could not read the row's provider keys; nothing is sent now");
            None
        }
    }
}

/// The generation of keys to send the row `id` under, now that a read made
/// after `keys` were read proved its last send made nothing: the same, or,
/// where the provider spent its key, the next one, recorded first. `None`:
/// send nothing now (another process moved on first and sends, the row
/// settled, or the database could not say).
pub(crate) async fn for_resend<T: Queued>(
    ctx: &AppContext,
    id: Uuid,
    keys: KeyState,
) -> Option<i32> {
    if !keys.spent {
        return Some(keys.generation);
    }
    match provider_keys::next::<T>(&ctx.pool, id, keys.generation).await {
        Ok(Some(next)) => {
            tracing::warn!(
                %id,
                generation = next,
                "the provider replays an error for the last key and nothing was made under it: sending again under a new key"
            );
            ctx.metrics
                .reconciler
                .with_label_values(&[kind::<T>(), "new_provider_key"])
                .inc();
            Some(next)
        }
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(%id, error = %e, "could not record the row's next provider key; nothing is sent now");
            None
        }
    }
}

/// Records that the provider spent the key of `generation` of row `id`,
/// after a send whose answer said so ([`crate::provider::Sent`]). A
/// failure to record is logged: the key is then re-sent as before, and
/// recorded spent by its next replay.
pub(crate) async fn spent<T: Queued>(ctx: &AppContext, id: Uuid, generation: i32) {
    tracing::warn!(
        %id,
        generation,
        "the provider answered with an error it keeps for this key: the send is read back, and made again under a new key if it made nothing"
    );
    if let Err(e) = provider_keys::spend::<T>(&ctx.pool, id, generation).await {
        tracing::warn!(%id, error = %e, "could not record a spent provider key");
    }
}
