//! What examining one provider object comes to: a count for the run's
//! report, our row settled by the provider's state, or, when the
//! provider's books and ours disagree, an incident.

use uuid::Uuid;

use super::{BooksError, Options};
use crate::commands::settle::{self, Cause};
use crate::commands::AppContext;
use crate::domain::adoption::{agreement, refund_agreement, Agreement};
use crate::domain::payment::PaymentStatus;
use crate::provider::{BookEntry, PaymentProvider};
use crate::store::books::{self as sql, BooksIncident, Counts};

/// Whose an incident is: the merchant, and the payment and refund ids
/// where there are some.
pub(super) type Owners = (Uuid, Option<Uuid>, Option<Uuid>);

pub(super) fn one(f: impl FnOnce(&mut Counts)) -> Counts {
    let mut c = Counts::default();
    f(&mut c);
    c
}

/// A `books_mismatch` incident for `entry` (recorded once, however many
/// passes see it).
pub(super) async fn mismatch(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    entry: &BookEntry,
    (merchant_id, payment_id, refund_id): Owners,
    detail: &str,
    options: Options,
) -> Result<Counts, BooksError> {
    if !options.dry_run {
        let mut conn = ctx.pool.acquire().await?;
        let new = sql::record_incident(
            &mut conn,
            &BooksIncident {
                kind: "books_mismatch",
                merchant_id,
                payment_id,
                refund_id,
                provider: provider.name(),
                provider_object_id: &entry.state.id,
                amount: entry.amount,
                detail,
                resolution: None,
            },
        )
        .await?;
        if new {
            ctx.metrics
                .incidents
                .with_label_values(&["books_mismatch"])
                .inc();
            tracing::error!(
                provider = provider.name(), object = %entry.state.id, ?payment_id, ?refund_id,
                %detail, "INCIDENT: the provider's books disagree with ours"
            );
        }
    }
    Ok(one(|c| c.mismatched += 1))
}

/// The row of ours a provider object is compared with, once their amounts
/// and owners agree: what settling it needs, and its status.
pub(super) enum Ours {
    /// A charge's attempt.
    Attempt {
        id: Uuid,
        order_id: Uuid,
        status: PaymentStatus,
    },
    /// A refund.
    Refund { id: Uuid, status: PaymentStatus },
}

/// Our row's status against the provider's: matched, settled by the
/// provider's state, or a mismatch.
pub(super) async fn compare_status(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    entry: &BookEntry,
    ours: Ours,
    ids: Owners,
    options: Options,
) -> Result<Counts, BooksError> {
    let (what, id, status, agreed) = match ours {
        Ours::Attempt { id, status, .. } => {
            ("attempt", id, status, agreement(status, entry.state.status))
        }
        Ours::Refund { id, status } => (
            "refund",
            id,
            status,
            refund_agreement(status, entry.state.status),
        ),
    };
    match agreed {
        Agreement::Agree => Ok(one(|c| c.matched += 1)),
        // A refund paid and returned since (the card was closed): what
        // its webhook would have applied, applied by the same function.
        Agreement::Reverse => {
            if !options.dry_run {
                let mut tx = ctx.pool.begin().await?;
                settle::refund(&mut tx, &ctx.metrics, id, &entry.state, Cause::Reconciler).await?;
                tx.commit().await?;
            }
            Ok(one(|c| c.reversed += 1))
        }
        // Forward from pending, or a charge on a failed attempt (whose
        // money rule records the incident and refunds it): the webhook's
        // rules, applied by the one function that applies them.
        Agreement::Settle { contradicted } => {
            if !options.dry_run {
                let mut tx = ctx.pool.begin().await?;
                let cause = Cause::Reconciler;
                match ours {
                    Ours::Attempt { id, order_id, .. } => {
                        let owners = (id, order_id);
                        settle::payment(&mut tx, &ctx.metrics, owners, &entry.state, cause).await?;
                    }
                    Ours::Refund { id, .. } => {
                        settle::refund(&mut tx, &ctx.metrics, id, &entry.state, cause).await?;
                    }
                }
                tx.commit().await?;
            }
            // A contradiction is an incident the settlement recorded.
            Ok(if contradicted {
                one(|c| c.mismatched += 1)
            } else {
                one(|c| c.matched += 1)
            })
        }
        Agreement::Disagree => {
            let detail = format!(
                "{what} {id} is {} here and {} at the provider",
                status.as_str(),
                entry.state.status.as_str()
            );
            mismatch(ctx, provider, entry, ids, &detail, options).await
        }
    }
}
