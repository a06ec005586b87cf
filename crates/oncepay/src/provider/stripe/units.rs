//! Stripe's currency units, which are not always ISO 4217's. oncepay keeps
//! every amount in ISO 4217 minor units (`domain::money`); Stripe's API
//! counts some currencies in other units, so each amount is converted on
//! the way out (a PaymentIntent, a Refund) and back (reads, events, the
//! books), exactly or not at all:
//!
//! - **Zero-decimal at Stripe** (stripe.com/docs/currencies#zero-decimal):
//!   BIF, CLP, DJF, GNF, JPY, KMF, KRW, MGA, PYG, RWF, UGX, VND, VUV, XAF,
//!   XOF, XPF. ISO agrees for all but **MGA**, whose ISO exponent is 2: an
//!   MGA amount must be whole ariary (a multiple of 100 minor units) and
//!   goes to Stripe divided by 100.
//! - **ISK** is exponent 0 in ISO but "will remain a two-decimal currency
//!   in the Stripe API, and an ISK amount of `100` will continue to
//!   represent 1 króna"; Stripe refuses amounts that are not multiples of
//!   100 (support.stripe.com/questions/deprecation-of-fractional-isk-charges-and-refunds):
//!   ISK goes to Stripe multiplied by 100, which is always exact.
//! - **HUF and TWD** are two-decimal in both; Stripe's special rules for
//!   them concern payouts, not charges, so they pass unchanged.
//! - **Three-decimal** (BHD, JOD, KWD, OMR, TND): Stripe counts thousandths
//!   like ISO but requires "the least-significant (last) digit to be 0".
//!   IQD and LYD (ISO exponent 3) are not Stripe presentment currencies.
//! - **Limits**: at most eight digits in Stripe's unit (99999999: "up to
//!   eight digits", PaymentIntent `amount`), and at least Stripe's minimum
//!   charge amount where Stripe publishes one per currency (docs "Minimum
//!   and maximum charge amounts"; $0.50 or the equivalent elsewhere, which
//!   depends on the exchange rate and is left to Stripe).
//!
//! An amount that cannot be represented exactly or is out of these limits
//! is refused before any call ([`to_stripe`]), never rounded: a rounded
//! charge is a wrong charge.

use crate::domain::money::Currency;
use crate::domain::payment::PaymentStatus;
use crate::provider::{CallOutcome, ProviderObject};

/// Zero-decimal at Stripe.
const ZERO_DECIMAL: &[&str] = &[
    "BIF", "CLP", "DJF", "GNF", "JPY", "KMF", "KRW", "MGA", "PYG", "RWF", "UGX", "VND", "VUV",
    "XAF", "XOF", "XPF",
];
/// Three-decimal at Stripe, the last digit 0.
const THREE_DECIMAL: &[&str] = &["BHD", "JOD", "KWD", "OMR", "TND"];
/// ISO 4217 three-decimal currencies Stripe does not present.
const UNSUPPORTED: &[&str] = &["IQD", "LYD"];
/// The largest amount in Stripe's unit: eight digits.
pub const MAX_STRIPE_AMOUNT: i64 = 99_999_999;

/// Stripe's published minimum charge amounts, in Stripe's unit.
const MINIMUMS: &[(&str, i64)] = &[
    ("USD", 50),
    ("AED", 200),
    ("AUD", 50),
    ("BGN", 100),
    ("BRL", 50),
    ("CAD", 50),
    ("CHF", 50),
    ("CZK", 1500),
    ("DKK", 250),
    ("EUR", 50),
    ("GBP", 30),
    ("HKD", 400),
    ("HUF", 17500),
    ("INR", 50),
    ("JPY", 50),
    ("MXN", 1000),
    ("MYR", 200),
    ("NOK", 300),
    ("NZD", 50),
    ("PLN", 200),
    ("RON", 200),
    ("SEK", 300),
    ("SGD", 50),
    ("THB", 1000),
];

/// How many of Stripe's units make one of oncepay's (ISO) minor units, or
/// how many of oncepay's make one of Stripe's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scale {
    /// The same unit.
    Same,
    /// Stripe's unit is `n` times smaller (ISK: 100).
    Finer(i64),
    /// Stripe's unit is `n` times larger (MGA: 100).
    Coarser(i64),
}

fn scale(currency: &str) -> Scale {
    match currency {
        "ISK" => Scale::Finer(100),
        "MGA" => Scale::Coarser(100),
        _ => Scale::Same,
    }
}

/// Why Stripe cannot take an amount: the rule, for a person.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unrepresentable(pub String);

/// `amount` ISO minor units of `currency` in Stripe's unit, or the rule it
/// breaks.
pub fn to_stripe(amount: i64, currency: &Currency) -> Result<i64, Unrepresentable> {
    let stripe = in_units(amount, currency)?;
    let code = currency.as_str();
    if let Some((_, min)) = MINIMUMS.iter().find(|(c, _)| *c == code) {
        if stripe < *min {
            return Err(Unrepresentable(format!(
                "{code}: Stripe's minimum charge is {}",
                currency.format(from_stripe(*min, currency).unwrap_or(*min))
            )));
        }
    }
    Ok(stripe)
}

/// `amount` in Stripe's unit, exactly and within eight digits.
fn in_units(amount: i64, currency: &Currency) -> Result<i64, Unrepresentable> {
    let code = currency.as_str();
    let refuse = |rule: String| Err(Unrepresentable(format!("{code}: {rule}")));
    if UNSUPPORTED.contains(&code) {
        return refuse("Stripe does not take payments in this currency".into());
    }
    let stripe = match scale(code) {
        Scale::Same => amount,
        Scale::Finer(n) => match amount.checked_mul(n) {
            Some(v) => v,
            None => return refuse("the amount is too large".into()),
        },
        Scale::Coarser(n) if amount % n != 0 => {
            return refuse(format!(
                "Stripe counts {code} in whole units (zero-decimal), so the amount must be a multiple of {n} minor units"
            ))
        }
        Scale::Coarser(n) => amount / n,
    };
    if THREE_DECIMAL.contains(&code) && stripe % 10 != 0 {
        return refuse(
            "Stripe takes three-decimal amounts only with the last digit 0 (a multiple of 10 minor units)".into(),
        );
    }
    if stripe > MAX_STRIPE_AMOUNT {
        return refuse(format!(
            "Stripe takes at most {} ({MAX_STRIPE_AMOUNT} in its unit)",
            currency.format(largest_in_our_units(currency))
        ));
    }
    Ok(stripe)
}

/// [`to_stripe`] for a refund: the unit rules, no minimum (Stripe refunds
/// any part of a charge).
pub fn refund_to_stripe(amount: i64, currency: &Currency) -> Result<i64, Unrepresentable> {
    in_units(amount, currency)
}

/// A request's amount in Stripe's unit by `rule`, or the outcome of a
/// request that is not made: failed, `amount_not_supported_by_provider`
/// (nothing was created, so that is a fact).
pub(crate) fn of_request(
    currency: &str,
    amount: i64,
    rule: fn(i64, &Currency) -> Result<i64, Unrepresentable>,
) -> Result<i64, Box<CallOutcome>> {
    // Boxed: an outcome is large, and this is the rare path.
    let refused = |why: String| {
        Box::new(CallOutcome::Known(ProviderObject {
            id: String::new(),
            status: PaymentStatus::Failed,
            failure_code: Some("amount_not_supported_by_provider".into()),
            failure_message: Some(why),
            next_action: None,
            capture_before: None,
            amount_captured: None,
        }))
    };
    let currency = Currency::try_from(currency)
        .map_err(|_| refused(format!("{currency}: not a currency oncepay knows")))?;
    rule(amount, &currency).map_err(|e| refused(e.to_string()))
}

/// The largest amount Stripe takes, in ISO minor units (ISK: 999,999
/// króna, the largest multiple of 100 under eight digits).
fn largest_in_our_units(currency: &Currency) -> i64 {
    match scale(currency.as_str()) {
        Scale::Same => MAX_STRIPE_AMOUNT,
        Scale::Finer(n) => MAX_STRIPE_AMOUNT / n,
        Scale::Coarser(n) => MAX_STRIPE_AMOUNT.saturating_mul(n),
    }
}

/// An amount Stripe shows (a PaymentIntent's, a Refund's, a charge's
/// refunded total) in ISO minor units. `None`: not a whole number of
/// oncepay's units (an ISK amount Stripe would never hold), or overflow.
pub fn from_stripe(amount: i64, currency: &Currency) -> Option<i64> {
    match scale(currency.as_str()) {
        Scale::Same => Some(amount),
        Scale::Finer(n) => (amount % n == 0).then(|| amount / n),
        Scale::Coarser(n) => amount.checked_mul(n),
    }
}

/// [`from_stripe`] for an amount and a currency as Stripe writes them
/// (lower-case code); an unknown code passes the amount unchanged.
pub fn from_stripe_code(amount: i64, code: &str) -> Option<i64> {
    match Currency::try_from(code.to_ascii_uppercase().as_str()) {
        Ok(currency) => from_stripe(amount, &currency),
        Err(_) => Some(amount),
    }
}

/// Whether Stripe counts `currency` in its ISO minor units (the list is
/// Stripe's; used to check the tables agree with ISO where they should).
pub fn is_zero_decimal(currency: &str) -> bool {
    ZERO_DECIMAL.contains(&currency)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(code: &str) -> Currency {
        Currency::try_from(code).expect("an ISO code")
    }

    #[test]
    fn the_named_cases() {
        // ISK 5000 króna is 500000 at Stripe; JPY is the same.
        assert_eq!(to_stripe(5000, &c("ISK")), Ok(500_000));
        assert_eq!(to_stripe(1000, &c("JPY")), Ok(1000));
        // MGA 5000.00 is 5000 at Stripe; 5000.50 cannot be charged.
        assert_eq!(to_stripe(500_000, &c("MGA")), Ok(5000));
        assert!(to_stripe(500_050, &c("MGA")).is_err());
        // KWD 1.230 passes, 1.234 cannot be charged.
        assert_eq!(to_stripe(1230, &c("KWD")), Ok(1230));
        assert!(to_stripe(1234, &c("KWD")).is_err());
        assert_eq!(from_stripe(500_000, &c("ISK")), Some(5000));
        assert_eq!(from_stripe(5000, &c("MGA")), Some(500_000));
    }

    #[test]
    fn the_limits() {
        assert!(to_stripe(49, &c("EUR")).is_err());
        assert_eq!(to_stripe(50, &c("EUR")), Ok(50));
        assert_eq!(to_stripe(99_999_999, &c("EUR")), Ok(99_999_999));
        let e = to_stripe(100_000_000, &c("EUR")).expect_err("nine digits");
        assert!(e.0.contains("EUR"), "{e}");
        assert!(
            to_stripe(1_000_000, &c("ISK")).is_err(),
            "100000000 at Stripe"
        );
        assert!(to_stripe(1000, &c("IQD")).is_err());
    }

    #[test]
    fn the_zero_decimal_list_agrees_with_iso_but_for_mga() {
        for code in ZERO_DECIMAL {
            let iso = c(code).exponent();
            assert_eq!(iso == 0, *code != "MGA", "{code}");
        }
    }
}
