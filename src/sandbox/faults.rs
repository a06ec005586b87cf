//! Fault injection: what a request's token asks for, and random faults
//! configured at start.

use std::time::Duration;

/// Faults injected at random into charge and refund requests, set at start.
#[derive(Debug, Clone, Default)]
pub struct FaultRates {
    /// How long a delayed answer waits (`ONCEPAY_SANDBOX_DELAY`).
    pub delay: Duration,
    /// Share of requests answered late (`ONCEPAY_SANDBOX_DELAY_RATE`).
    pub delay_rate: f64,
    /// Share answered `500` before any effect (`ONCEPAY_SANDBOX_ERROR_RATE`).
    pub error_rate: f64,
    /// Share whose effect happens but whose answer is lost (`ONCEPAY_SANDBOX_DROP_RATE`).
    pub drop_rate: f64,
    /// How many times each webhook is delivered (`ONCEPAY_SANDBOX_DUPLICATE_WEBHOOKS`).
    pub duplicate_webhooks: u32,
    /// Deliver each charge's events in reverse order (`ONCEPAY_SANDBOX_REORDER_WEBHOOKS`).
    pub reorder_webhooks: bool,
}

/// A token split into its outcome and the faults its suffixes ask for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TokenFaults {
    /// The token without suffixes (`tok_visa`).
    pub base: String,
    /// Answer `500` before charging for the key's first N requests.
    pub error: u32,
    /// Charge, then drop the connection, for the key's first N requests.
    pub drop: u32,
    /// Charge, then answer after this long (first request only).
    pub delay: Option<Duration>,
    /// Deliver each webhook three times.
    pub duplicate: bool,
    /// Deliver webhooks in reverse order.
    pub reorder: bool,
}

impl TokenFaults {
    /// Parses `tok_visa+drop=2+dup`. Unknown suffixes are ignored (the base
    /// token decides the outcome), so a typo never breaks a test silently
    /// into a 500.
    pub fn parse(token: &str) -> TokenFaults {
        let mut parts = token.split('+');
        let mut faults = TokenFaults {
            base: parts.next().unwrap_or_default().to_string(),
            ..TokenFaults::default()
        };
        for part in parts {
            let (name, value) = match part.split_once('=') {
                Some((n, v)) => (n, v.parse::<u64>().ok()),
                None => (part, None),
            };
            let count = value.map(|v| v.min(100) as u32).unwrap_or(1);
            match name {
                "error" => faults.error = count,
                "drop" => faults.drop = count,
                "delay" => {
                    faults.delay = Some(Duration::from_millis(value.unwrap_or(1000).min(60_000)))
                }
                "dup" => faults.duplicate = true,
                "reorder" => faults.reorder = true,
                _ => {}
            }
        }
        faults
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_parse() {
        let f = TokenFaults::parse("tok_visa+drop=2+delay=1500+dup+reorder+error");
        assert_eq!(f.base, "tok_visa");
        assert_eq!(f.drop, 2);
        assert_eq!(f.error, 1);
        assert_eq!(f.delay, Some(Duration::from_millis(1500)));
        assert!(f.duplicate && f.reorder);
        assert_eq!(
            TokenFaults::parse("tok_visa"),
            TokenFaults {
                base: "tok_visa".into(),
                ..Default::default()
            }
        );
    }
}
