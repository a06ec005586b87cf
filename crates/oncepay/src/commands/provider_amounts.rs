//! The one rule every path that moves money applies before it writes:
//! the provider must be able to move the amount exactly, in its own units
//! and within its limits (a payment, a checkout page, a capture, a
//! refund).

use crate::problem::{Problem, ProblemCode};
use crate::provider::PaymentProvider;

/// Whether `provider` can move `amount` of `currency` exactly (its own
/// units, its limits; a refund has no minimum): `422
/// amount_not_supported_by_provider` naming the currency and the rule, for
/// a payment, a checkout, a capture and a refund alike, before anything is
/// written.
pub(crate) fn provider_takes(
    provider: &dyn PaymentProvider,
    amount: i64,
    currency: &str,
    movement: Movement,
) -> Result<(), Problem> {
    let Ok(currency) = crate::domain::money::Currency::try_from(currency) else {
        return Ok(());
    };
    let verdict = match movement {
        Movement::Charge | Movement::Capture => provider.check_amount(amount, &currency),
        Movement::Refund => provider.check_refund_amount(amount, &currency),
    };
    verdict.map_err(|rule| {
        let problem = Problem::new(
            ProblemCode::AmountNotSupportedByProvider,
            format!(
                "{} cannot take {}: {rule}",
                provider.name(),
                currency.format(amount)
            ),
        )
        .with_member("currency", serde_json::json!(currency.as_str()))
        .with_member("provider", serde_json::json!(provider.name()));
        match movement {
            Movement::Charge => problem.with_field("order_id"),
            Movement::Capture | Movement::Refund => problem.with_field("amount"),
        }
    })
}

/// Which way money moves, for [`provider_takes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Movement {
    /// A charge: every rule, minimum included.
    Charge,
    /// A capture of part or all of a hold: a charge's rules (what is
    /// captured is what is charged), the amount the request's.
    Capture,
    /// A refund: the unit rules only.
    Refund,
}
