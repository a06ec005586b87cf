//! A charge no order of ours can own: recorded once as an `orphan_charge`
//! incident, then refunded (`ONCEPAY_ORPHAN_POLICY=refund`, with a key
//! derived from the charge, so asking again is safe) or held for a person.

use uuid::Uuid;

use super::outcome::one;
use super::{BooksError, Options, OrphanPolicy};
use crate::commands::AppContext;
use crate::domain::payment::PaymentStatus;
use crate::domain::refund;
use crate::provider::trace::Trace;
use crate::provider::{BookEntry, CallOutcome, PaymentProvider, ProviderObject, RefundRequest};
use crate::store::books::{self as sql, BooksIncident, Counts};

/// The key of the refund of an orphan charge: derived from the charge, so
/// every pass (and every process) asks for the same refund.
fn orphan_refund_id(provider: &str, charge_id: &str) -> Uuid {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("oncepay orphan {provider} {charge_id}"));
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_random_bytes(bytes).into_uuid()
}

/// Deals with the orphan charge `entry` (`why` says why no order owns it)
/// by the run's policy.
pub(super) async fn orphan(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    entry: &BookEntry,
    trace: &Trace,
    why: &str,
    options: Options,
) -> Result<Counts, BooksError> {
    if entry.state.status == PaymentStatus::Pending {
        tracing::warn!(charge = %entry.state.id, %why, "an orphan charge is still pending; a later pass decides");
        return Ok(Counts::default());
    }
    let mut conn = ctx.pool.acquire().await?;
    let seen = sql::orphan_resolution(&mut conn, provider.name(), &entry.state.id).await?;
    drop(conn);
    match seen.as_ref().and_then(Option::as_deref) {
        Some("refunded" | "held" | "refund_failed") => return Ok(one(|c| c.matched += 1)),
        _ if options.dry_run => {
            return Ok(match options.policy {
                OrphanPolicy::Refund => one(|c| c.refunded += 1),
                OrphanPolicy::Hold => one(|c| c.held += 1),
            })
        }
        _ => {}
    }
    if seen.is_none() {
        let mut conn = ctx.pool.acquire().await?;
        let detail = format!("a charge for order {}: {why}", trace.order_id);
        let resolution = match options.policy {
            OrphanPolicy::Refund => "refund_pending",
            OrphanPolicy::Hold => "held",
        };
        sql::record_incident(
            &mut conn,
            &BooksIncident {
                kind: "orphan_charge",
                merchant_id: trace.merchant_id,
                payment_id: None,
                refund_id: None,
                provider: provider.name(),
                provider_object_id: &entry.state.id,
                amount: entry.amount,
                detail: &detail,
                resolution: Some(resolution),
            },
        )
        .await?;
        ctx.metrics
            .incidents
            .with_label_values(&["orphan_charge"])
            .inc();
        tracing::error!(
            provider = provider.name(), charge = %entry.state.id, order_id = %trace.order_id,
            amount = entry.amount, %why, policy = ?options.policy,
            "INCIDENT: the provider holds a charge no order of ours can own"
        );
    }
    if options.policy == OrphanPolicy::Hold {
        return Ok(one(|c| c.held += 1));
    }
    // An authorization no order can own is released, never captured (and
    // so never refunded: no money moved).
    if entry.state.status == PaymentStatus::RequiresCapture {
        let payment_id = trace.payment_id;
        let resolution = match provider.void(payment_id, &entry.state.id).await {
            CallOutcome::Known(ProviderObject {
                status: PaymentStatus::Voided,
                ..
            }) => "voided",
            other => {
                tracing::warn!(charge = %entry.state.id, outcome = ?other, "the void of an orphan authorization is not known yet; the next pass asks again");
                return Ok(Counts::default());
            }
        };
        let mut conn = ctx.pool.acquire().await?;
        sql::resolve_orphan(&mut conn, provider.name(), &entry.state.id, resolution).await?;
        return Ok(one(|c| c.refunded += 1));
    }
    let refund_id = orphan_refund_id(provider.name(), &entry.state.id);
    // What the merchant refunded before the rows were lost stays refunded;
    // the rest goes back.
    let Ok(left) = refund::plan(entry.amount, entry.refunded, 0, None) else {
        let mut conn = ctx.pool.acquire().await?;
        sql::resolve_orphan(&mut conn, provider.name(), &entry.state.id, "refunded").await?;
        return Ok(one(|c| c.matched += 1));
    };
    let request = RefundRequest {
        idempotency_key: refund_id,
        // An orphan's refund has no row to record another key on: its one
        // key, sent again at each pass.
        key_generation: 0,
        charge_id: entry.state.id.clone(),
        amount: left,
        currency: entry.currency.clone(),
        trace: Trace {
            refund_id: Some(refund_id),
            reason: Some("oncepay: orphan charge".into()),
            ..trace.clone()
        },
    };
    let resolution = match provider.refund(&request).await.outcome {
        CallOutcome::Known(ProviderObject {
            status: PaymentStatus::Succeeded,
            ..
        }) => "refunded",
        CallOutcome::Known(ProviderObject {
            status: PaymentStatus::Failed,
            failure_code,
            ..
        }) => {
            tracing::error!(charge = %entry.state.id, ?failure_code, "the refund of an orphan charge failed; a person must look");
            "refund_failed"
        }
        other => {
            tracing::warn!(charge = %entry.state.id, outcome = ?other, "the refund of an orphan charge is not known yet; the next pass asks again");
            return Ok(Counts::default());
        }
    };
    let mut conn = ctx.pool.acquire().await?;
    sql::resolve_orphan(&mut conn, provider.name(), &entry.state.id, resolution).await?;
    Ok(if resolution == "refunded" {
        one(|c| c.refunded += 1)
    } else {
        one(|c| c.mismatched += 1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_orphan_is_refunded_under_one_key() {
        let a = orphan_refund_id("sandbox", "ch_1");
        assert_eq!(a, orphan_refund_id("sandbox", "ch_1"));
        assert_ne!(a, orphan_refund_id("sandbox", "ch_2"));
        assert_ne!(a, orphan_refund_id("stripe", "ch_1"));
    }
}
